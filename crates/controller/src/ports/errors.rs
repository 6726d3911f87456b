//! The error every port returns.

/// A failure of a backend dependency (queue, registry, provider). Carries no secret.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{dependency} {operation} failed: {message}")]
pub struct PortError {
    /// `queue`, `registry`, `compute`, ...
    pub dependency: &'static str,
    /// The operation, e.g. `send`, `put`, `start`.
    pub operation: &'static str,
    /// What went wrong (no secret, no raw payload).
    pub message: String,
    /// Whether retrying later may succeed (throttling, timeouts, 5xx).
    pub retryable: bool,
    /// Whether another writer held the same item at that moment (DynamoDB
    /// `TransactionConflict`, after the adapter's jittered retries): retryable, and a job
    /// that meets it ends as "busy" — a short hand-off, like a held lock — never as a
    /// failed job. Always `false` unless built with [`PortError::contended`].
    pub contended: bool,
}

impl PortError {
    /// A retryable failure.
    pub fn transient(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: true,
            contended: false,
        }
    }
    /// A contended write (see [`PortError::contended`]): retryable, ends a job as busy.
    pub fn contended(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: true,
            contended: true,
        }
    }
    /// A failure retrying will not fix (bad configuration, invalid input).
    pub fn permanent(
        dependency: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            dependency,
            operation,
            message: message.into(),
            retryable: false,
            contended: false,
        }
    }
}
