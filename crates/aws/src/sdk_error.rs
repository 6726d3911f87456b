//! Mapping AWS SDK errors to [`PortError`]s: transient (retry later) or permanent.
//!
//! Rules (AWS SDK retry classification and each service's error list):
//! - no response (timeout, connection or I/O failure, an unparseable response) →
//!   transient;
//! - HTTP 5xx or 429, or a throttling / internal-error code (`ThrottlingException`,
//!   `ProvisionedThroughputExceededException`, `RequestLimitExceeded`,
//!   `InternalServerError`, ECS `ServerException`, ...) → transient;
//! - DynamoDB `TransactionConflictException` (the item is in another transaction this
//!   moment) → [`PortError::contended`] (transient; the job ends as "busy");
//! - anything else the service answered (validation, not found, access denied) and a
//!   request the SDK could not build → permanent.
//!
//! Messages carry the service's error code and message, never a request payload (the
//! SDK's error messages hold no credentials and no secret values).

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use sandbox_controller::ports::PortError;

/// Service error codes that mean "try again later", whatever the HTTP status.
const TRANSIENT_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "TransactionConflictException",
    "TransactionInProgressException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "ServerException",
    "KMS.ThrottlingException",
    "AWS.SimpleQueueService.RequestThrottled",
];

/// Whether `code` (an AWS error code) names a transient condition.
pub(crate) fn is_transient_code(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// The error code of a service error, if the service answered one.
pub(crate) fn code<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Option<&str> {
    match err {
        SdkError::ServiceError(_) => err.code(),
        _ => None,
    }
}

/// Converts an SDK error into a [`PortError`] of `dependency` / `operation`.
pub(crate) fn port_error<E>(
    dependency: &'static str,
    operation: &'static str,
    err: &SdkError<E, HttpResponse>,
) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = err.code().unwrap_or("Unknown");
            let message = err.message().unwrap_or("");
            let text = format!("{code} (HTTP {status}): {message}");
            if code == "TransactionConflictException" || code == "TransactionConflict" {
                // Another transaction holds the item this moment: busy, not failed.
                PortError::contended(dependency, operation, text)
            } else if status >= 500 || status == 429 || is_transient_code(code) {
                PortError::transient(dependency, operation, text)
            } else {
                PortError::permanent(dependency, operation, text)
            }
        }
        SdkError::ConstructionFailure(_) => PortError::permanent(
            dependency,
            operation,
            format!("request not built: {}", DisplayErrorContext(err)),
        ),
        SdkError::DispatchFailure(failure) if failure.is_user() => PortError::permanent(
            dependency,
            operation,
            format!("request not sent: {}", DisplayErrorContext(err)),
        ),
        SdkError::TimeoutError(_) => {
            PortError::transient(dependency, operation, "timed out".to_owned())
        }
        _ => PortError::transient(
            dependency,
            operation,
            format!("no usable response: {}", DisplayErrorContext(err)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_internal_codes_are_transient_validation_is_not() {
        assert!(is_transient_code("ThrottlingException"));
        assert!(is_transient_code("ProvisionedThroughputExceededException"));
        assert!(is_transient_code("ServerException"));
        assert!(!is_transient_code("ValidationException"));
        assert!(!is_transient_code("ClientException"));
        assert!(!is_transient_code("ConditionalCheckFailedException"));
    }
}
