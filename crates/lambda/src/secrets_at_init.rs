//! The secrets, read from Secrets Manager once per cold start and checked before the first
//! request: the webhook signing secret (webhook function) and the OpenAI API key (worker,
//! sweeper).
//!
//! Each secret is stored as the plain value in `SecretString` (`whsec_...`, `sk-...`).
//! Surrounding whitespace is ignored in the API key; a webhook secret must be the bare
//! value (whitespace, a `v1,` prefix or another malformed shape is refused, as
//! it would otherwise reject every delivery with 401). The webhook function may read two
//! secrets, the current one (`WEBHOOK_SECRET_ARN`) and, during a rotation, the previous
//! one (`WEBHOOK_PREVIOUS_SECRET_ARN`): a delivery signed with either verifies. A secret
//! that cannot be read, is empty, is a JSON document, is malformed or (webhook) decodes to
//! a key shorter than 16 bytes fails the cold start with one [`SecretInitError`] naming
//! the variable and the ARN, never the value: the function then logs that one line and
//! exits, and Lambda reports the init failure.

use crate::settings::SecretRef;
use sandbox_agents_api::ApiKey;
use sandbox_core::webhook::WebhookVerifier;

/// A secret that cannot be used. The message names the variable and the ARN, never the
/// secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretInitError {
    /// Secrets Manager did not return the secret.
    #[error("{var} ({arn}): the secret could not be read: {cause}")]
    Unreadable {
        /// The variable that names the secret.
        var: &'static str,
        /// The secret's ARN or name.
        arn: String,
        /// The read failure (no secret in it).
        cause: String,
    },
    /// The secret was read but cannot be used.
    #[error("{var} ({arn}): {problem}")]
    Unusable {
        /// The variable that names the secret.
        var: &'static str,
        /// The secret's ARN or name.
        arn: String,
        /// What is wrong with it (a length, never the content).
        problem: String,
    },
}

impl SecretInitError {
    fn unusable(source: &SecretRef, problem: impl Into<String>) -> Self {
        Self::Unusable {
            var: source.var,
            arn: source.arn.clone(),
            problem: problem.into(),
        }
    }
}

/// Checks what every secret needs: present, not blank, not a JSON document.
fn plain_value<'a>(secret: &'a str, source: &SecretRef) -> Result<&'a str, SecretInitError> {
    let value = secret.trim();
    if value.is_empty() {
        return Err(SecretInitError::unusable(source, "the secret is empty"));
    }
    if value.starts_with('{') {
        return Err(SecretInitError::unusable(
            source,
            "the secret is a JSON document; store the plain value as the SecretString",
        ));
    }
    Ok(value)
}

/// The webhook verifier for the secret named by `source` (`WEBHOOK_SECRET_ARN`).
///
/// # Errors
/// [`SecretInitError::Unusable`] for an empty or JSON secret, a malformed one (a `v1,`
/// prefix, whitespace, quotes, a comma), invalid base64 after `whsec_`, or a key shorter
/// than 16 bytes ([`WebhookVerifier::new`](sandbox_core::webhook::WebhookVerifier::new)).
pub fn webhook_verifier_from(
    secret: &str,
    source: &SecretRef,
) -> Result<WebhookVerifier, SecretInitError> {
    webhook_verifier_from_all(&[(secret, source)])
}

/// The webhook verifier for several secrets, the current one first (a rotation: a
/// delivery signed with any of them verifies).
///
/// # Errors
/// As [`webhook_verifier_from`], for the first unusable secret, naming its variable and
/// ARN.
pub fn webhook_verifier_from_all(
    secrets: &[(&str, &SecretRef)],
) -> Result<WebhookVerifier, SecretInitError> {
    let mut values = Vec::with_capacity(secrets.len());
    for (secret, source) in secrets {
        plain_value(secret, source)?;
        // Checked one by one, so the error names the variable of the bad one.
        WebhookVerifier::new(secret)
            .map_err(|e| SecretInitError::unusable(source, e.to_string()))?;
        values.push(*secret);
    }
    WebhookVerifier::with_secrets(&values).map_err(|e| match secrets.first() {
        Some((_, source)) => SecretInitError::unusable(source, e.to_string()),
        None => SecretInitError::Unusable {
            var: "WEBHOOK_SECRET_ARN",
            arn: String::new(),
            problem: e.to_string(),
        },
    })
}

/// The API key for the secret named by `source` (`OPENAI_API_KEY_SECRET_ARN`).
///
/// # Errors
/// [`SecretInitError::Unusable`] for an empty or JSON secret, or one with characters an
/// HTTP header cannot carry (only visible ASCII is accepted).
pub fn api_key_from(secret: &str, source: &SecretRef) -> Result<ApiKey, SecretInitError> {
    let value = plain_value(secret, source)?;
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(SecretInitError::unusable(
            source,
            "the API key must be visible ASCII without spaces",
        ));
    }
    Ok(ApiKey::new(value))
}

/// The read failure and its causes, one line (the SDK nests the useful part).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}

/// Reads the secret named by `source` from Secrets Manager.
async fn read(
    client: &aws_sdk_secretsmanager::Client,
    source: &SecretRef,
) -> Result<sandbox_aws::secrets::SecretString, SecretInitError> {
    sandbox_aws::secrets::read_secret(client, &source.arn)
        .await
        .map_err(|e| SecretInitError::Unreadable {
            var: source.var,
            arn: source.arn.clone(),
            cause: chain(&e),
        })
}

/// Reads and checks the webhook signing secret.
///
/// # Errors
/// [`SecretInitError`]: unreadable, or as [`webhook_verifier_from`].
pub async fn read_webhook_verifier(
    client: &aws_sdk_secretsmanager::Client,
    source: &SecretRef,
) -> Result<WebhookVerifier, SecretInitError> {
    let secret = read(client, source).await?;
    webhook_verifier_from(secret.expose(), source)
}

/// Reads and checks the current webhook signing secret and, when set, the previous one
/// (`WEBHOOK_PREVIOUS_SECRET_ARN`), and builds one verifier accepting both.
///
/// # Errors
/// [`SecretInitError`]: unreadable, or as [`webhook_verifier_from_all`].
pub async fn read_webhook_verifiers(
    client: &aws_sdk_secretsmanager::Client,
    current: &SecretRef,
    previous: Option<&SecretRef>,
) -> Result<WebhookVerifier, SecretInitError> {
    let current_value = read(client, current).await?;
    let previous_value = match previous {
        Some(source) => Some((read(client, source).await?, source)),
        None => None,
    };
    let mut all = vec![(current_value.expose(), current)];
    if let Some((value, source)) = &previous_value {
        all.push((value.expose(), source));
    }
    webhook_verifier_from_all(&all)
}

/// Reads and checks the OpenAI API key.
///
/// # Errors
/// [`SecretInitError`]: unreadable, or as [`api_key_from`].
pub async fn read_api_key(
    client: &aws_sdk_secretsmanager::Client,
    source: &SecretRef,
) -> Result<ApiKey, SecretInitError> {
    let secret = read(client, source).await?;
    api_key_from(secret.expose(), source)
}

/// Reads the operator key (`OPERATOR_KEY_SECRET_ARN`, `sandbox_core::operator_proof`).
///
/// # Errors
/// [`SecretInitError`]: unreadable, or shorter than 32 bytes (unusable).
pub async fn read_operator_key(
    client: &aws_sdk_secretsmanager::Client,
    source: &SecretRef,
) -> Result<sandbox_core::operator_proof::OperatorKey, SecretInitError> {
    let secret = read(client, source).await?;
    sandbox_core::operator_proof::OperatorKey::from_text(secret.expose())
        .map_err(|e| SecretInitError::unusable(source, e.to_string()))
}
