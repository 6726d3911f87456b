//! Reading variables through a lookup (`Vars`): required, optional, lists, seconds, flags,
//! metadata rules, queue URLs and secret references, each failing with the variable's name;
//! and this execution environment's worker id.

use super::{SecretRef, SettingsError};
use sandbox_core::observed::{MetadataRuleError, ProvisionOn, parse_metadata_rule};

/// Reads variables through a lookup, so tests never touch the process environment.
pub(super) struct Vars<F>(pub(super) F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    pub(super) fn optional(&self, var: &'static str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn required(&self, var: &'static str) -> Result<String, SettingsError> {
        self.optional(var).ok_or(SettingsError::Missing { var })
    }

    pub(super) fn list(&self, var: &'static str) -> Result<Vec<String>, SettingsError> {
        let Some(raw) = self.optional(var) else {
            return Ok(Vec::new());
        };
        let items: Vec<String> = raw.split(',').map(|s| s.trim().to_owned()).collect();
        if items.iter().any(String::is_empty) {
            return Err(SettingsError::Invalid {
                var,
                reason: "a comma-separated list without empty entries",
            });
        }
        Ok(items)
    }

    /// Whole seconds, `default` when unset; `positive` refuses 0.
    pub(super) fn secs(
        &self,
        var: &'static str,
        default: u64,
        positive: bool,
    ) -> Result<u64, SettingsError> {
        let Some(raw) = self.optional(var) else {
            return Ok(default);
        };
        let reason = if positive {
            "whole seconds of at least 1"
        } else {
            "whole seconds (a non-negative integer)"
        };
        match raw.parse::<u64>() {
            Ok(v) if v > 0 || !positive => Ok(v),
            _ => Err(SettingsError::Invalid { var, reason }),
        }
    }

    pub(super) fn flag(&self, var: &'static str) -> Result<bool, SettingsError> {
        match self
            .optional(var)
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("false" | "disabled" | "0") => Ok(false),
            Some("true" | "enabled" | "1") => Ok(true),
            Some(_) => Err(SettingsError::Invalid {
                var,
                reason: "true or false",
            }),
        }
    }

    /// `key=value` pairs, comma-separated (`OWNER_METADATA`).
    pub(super) fn metadata_rule(
        &self,
        var: &'static str,
    ) -> Result<std::collections::BTreeMap<String, String>, SettingsError> {
        let items = self.list(var)?;
        parse_metadata_rule(items.iter().map(String::as_str)).map_err(|e| SettingsError::Invalid {
            var,
            reason: match e {
                MetadataRuleError::NotAPair => {
                    "comma-separated key=value pairs with non-empty keys"
                }
                MetadataRuleError::TooLong => {
                    "metadata keys of at most 64 characters and values of at most 512"
                }
                MetadataRuleError::DuplicateKey => "each metadata key once",
                MetadataRuleError::TooMany => "at most 16 metadata pairs",
            },
        })
    }

    /// `PROVISION_ON`, default `connection_request`.
    pub(super) fn provision_on(&self, var: &'static str) -> Result<ProvisionOn, SettingsError> {
        match self.optional(var) {
            None => Ok(ProvisionOn::default()),
            Some(raw) => raw
                .parse()
                .map_err(|reason| SettingsError::Invalid { var, reason }),
        }
    }

    pub(super) fn queue_url(&self, var: &'static str) -> Result<String, SettingsError> {
        let url = self.required(var)?;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(SettingsError::Invalid {
                var,
                reason: "an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)",
            });
        }
        Ok(url)
    }

    pub(super) fn secret_ref(&self, var: &'static str) -> Result<SecretRef, SettingsError> {
        let arn = self.required(var)?;
        // A value that looks like the secret itself would be logged as an id later.
        if arn.starts_with("whsec_") || arn.starts_with("sk-") {
            return Err(SettingsError::Invalid {
                var,
                reason: "the secret's ARN or name, not the secret itself",
            });
        }
        Ok(SecretRef { var, arn })
    }
}

/// The worker id of this execution environment: its log stream name is unique among the
/// function's concurrent instances; off Lambda, the process id and start time.
pub(super) fn worker_id(lookup: &impl Fn(&str) -> Option<String>) -> String {
    let function = lookup("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|| "lambda".into());
    match lookup("AWS_LAMBDA_LOG_STREAM_NAME").filter(|s| !s.is_empty()) {
        Some(stream) => format!("{function}/{stream}"),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("{function}/{}-{nanos:x}", std::process::id())
        }
    }
}
