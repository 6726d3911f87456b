//! Secrets at cold start: a missing, short or malformed secret fails with one message that
//! names the variable and the ARN and never contains the secret. The Secrets Manager reads
//! go to a fake endpoint on 127.0.0.1 speaking the service's JSON protocol.

use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};
use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use sandbox_lambda::secrets_at_init::{
    SecretInitError, api_key_from, read_api_key, read_webhook_verifier, webhook_verifier_from,
};
use sandbox_lambda::settings::SecretRef;

const ARN: &str = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandbox-webhook-AbCdEf";
const FIXTURE_SECRET: &str = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=";
/// 8 bytes after base64 decoding: below the 16-byte minimum.
const SHORT_SECRET: &str = "whsec_c2hvcnRrZXk=";

fn webhook_ref() -> SecretRef {
    SecretRef {
        var: "WEBHOOK_SECRET_ARN",
        arn: ARN.into(),
    }
}

fn key_ref() -> SecretRef {
    SecretRef {
        var: "OPENAI_API_KEY_SECRET_ARN",
        arn: "arn:aws:secretsmanager:us-east-1:123456789012:secret:openai-key-AbCdEf".into(),
    }
}

fn assert_names_source_not_secret(err: &SecretInitError, source: &SecretRef, secret: &str) {
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{} ({})", source.var, source.arn)),
        "{message}"
    );
    assert!(!message.contains(secret), "{message}");
    assert!(!format!("{err:?}").contains(secret));
}

#[test]
fn fixture_webhook_secret_builds_a_verifier() {
    let verifier = webhook_verifier_from(FIXTURE_SECRET, &webhook_ref()).unwrap();
    assert!(!format!("{verifier:?}").contains("d0jBWkxw8kwXPSTcg"));
}

#[test]
fn webhook_secret_with_a_newline_v1_prefix_or_quotes_fails_naming_the_mistake() {
    for (secret, mistake) in [
        (format!("{FIXTURE_SECRET}\n"), "whitespace"),
        (
            format!("v1,{FIXTURE_SECRET}"),
            "signature version prefix (v1,)",
        ),
        (format!("'{FIXTURE_SECRET}'"), "quote"),
    ] {
        let err = webhook_verifier_from(&secret, &webhook_ref()).unwrap_err();
        assert_names_source_not_secret(&err, &webhook_ref(), "d0jBWkxw8kwXPSTcg");
        assert!(err.to_string().contains(mistake), "{err}");
    }
}

#[test]
fn previous_webhook_secret_is_accepted_alongside_the_current_one_and_named_when_bad() {
    let previous = SecretRef {
        var: "WEBHOOK_PREVIOUS_SECRET_ARN",
        arn: "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandbox-webhook-old".into(),
    };
    let other = "whsec_b3RoZXItc2VjcmV0LWZvci1yb3RhdGlvbg==";
    let v = sandbox_lambda::secrets_at_init::webhook_verifier_from_all(&[
        (FIXTURE_SECRET, &webhook_ref()),
        (other, &previous),
    ])
    .unwrap();
    assert_eq!(v.secret_count(), 2);
    let old_only = sandbox_core::webhook::WebhookVerifier::new(other).unwrap();
    let sig = old_only.sign("msg_1", 1_700_000_000, b"{}");
    assert!(
        v.verify_parts("msg_1", "1700000000", &sig, b"{}", 1_700_000_000)
            .is_ok()
    );
    let err = sandbox_lambda::secrets_at_init::webhook_verifier_from_all(&[
        (FIXTURE_SECRET, &webhook_ref()),
        (SHORT_SECRET, &previous),
    ])
    .unwrap_err();
    assert_names_source_not_secret(&err, &previous, "c2hvcnRrZXk");
}

#[test]
fn short_webhook_secret_fails_naming_the_variable_and_arn_but_not_the_secret() {
    let err = webhook_verifier_from(SHORT_SECRET, &webhook_ref()).unwrap_err();
    assert_names_source_not_secret(&err, &webhook_ref(), "c2hvcnRrZXk");
    assert!(err.to_string().contains("8 bytes; at least 16"), "{err}");
}

#[test]
fn empty_and_json_secrets_are_refused() {
    for secret in [
        "",
        "  \n",
        r#"{"WEBHOOK_SECRET":"whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc="}"#,
    ] {
        let err = webhook_verifier_from(secret, &webhook_ref()).unwrap_err();
        assert_names_source_not_secret(&err, &webhook_ref(), "d0jBWkxw8kwXPSTcg");
    }
    let err = api_key_from(r#"{"OPENAI_API_KEY":"sk-abc"}"#, &key_ref()).unwrap_err();
    assert!(err.to_string().contains("JSON document"), "{err}");
}

#[test]
fn api_key_with_inner_spaces_is_refused_without_echo() {
    let err = api_key_from("sk-proj abc def", &key_ref()).unwrap_err();
    assert_names_source_not_secret(&err, &key_ref(), "sk-proj abc");
    let key = api_key_from(" sk-proj-abcdef\n", &key_ref()).unwrap();
    assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
}

/// A Secrets Manager stand-in: `GetSecretValue` answers `secret` for any id, or
/// `ResourceNotFoundException` when `secret` is `None`.
async fn fake_secrets_manager(secret: Option<&'static str>) -> aws_sdk_secretsmanager::Client {
    let app = Router::new().route(
        "/",
        post(move |headers: HeaderMap| async move {
            let target = headers
                .get("x-amz-target")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            assert_eq!(target, "secretsmanager.GetSecretValue");
            let json = [("content-type", "application/x-amz-json-1.1")];
            match secret {
                Some(s) => (
                    StatusCode::OK,
                    json,
                    serde_json::json!({"ARN": ARN, "Name": "sandbox-webhook", "SecretString": s,
                        "VersionId": "v1", "VersionStages": ["AWSCURRENT"], "CreatedDate": 1764400000})
                    .to_string(),
                )
                    .into_response(),
                None => (
                    StatusCode::BAD_REQUEST,
                    json,
                    r#"{"__type":"ResourceNotFoundException","message":"Secrets Manager can't find the specified secret."}"#,
                )
                    .into_response(),
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let config = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(format!("http://{addr}"))
        .build();
    aws_sdk_secretsmanager::Client::from_conf(config)
}

#[tokio::test]
async fn webhook_secret_read_at_init_verifies_when_long_enough() {
    let client = fake_secrets_manager(Some(FIXTURE_SECRET)).await;
    read_webhook_verifier(&client, &webhook_ref())
        .await
        .unwrap();
}

#[tokio::test]
async fn short_webhook_secret_read_at_init_fails_with_one_clear_message() {
    let client = fake_secrets_manager(Some(SHORT_SECRET)).await;
    let err = read_webhook_verifier(&client, &webhook_ref())
        .await
        .unwrap_err();
    assert!(matches!(err, SecretInitError::Unusable { .. }), "{err:?}");
    assert_names_source_not_secret(&err, &webhook_ref(), "c2hvcnRrZXk");
    assert!(!err.to_string().contains('\n'));
}

#[tokio::test]
async fn missing_secret_fails_naming_the_variable_the_arn_and_the_cause() {
    let client = fake_secrets_manager(None).await;
    let err = read_api_key(&client, &key_ref()).await.unwrap_err();
    assert!(matches!(err, SecretInitError::Unreadable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("OPENAI_API_KEY_SECRET_ARN (arn:aws:secretsmanager:"),
        "{message}"
    );
    assert!(
        message.ends_with("the secret could not be read: secret openai-key not found"),
        "{message}"
    );
}
