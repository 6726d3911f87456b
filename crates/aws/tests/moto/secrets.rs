//! read_secret on moto: the value behind a redacted Debug; errors name the secret only.

use crate::support::{sdk, unique};
use aws_sdk_secretsmanager::Client;
use sandbox_aws::{SecretError, read_secret};

#[tokio::test]
async fn read_secret_returns_the_value_behind_a_redacted_debug() {
    let sm = Client::new(&sdk().await);
    let name = format!("sandbox/webhook-{}", unique());
    let value = format!("whsec_{}", unique());
    let arn = sm
        .create_secret()
        .name(&name)
        .secret_string(&value)
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned();
    let secret = read_secret(&sm, &arn).await.unwrap();
    assert_eq!(secret.expose(), value);
    assert!(!format!("{secret:?}").contains(&value));
    // By name too.
    assert_eq!(read_secret(&sm, &name).await.unwrap().expose(), value);
}

#[tokio::test]
async fn a_missing_secret_names_the_secret_not_a_value() {
    let sm = Client::new(&sdk().await);
    let arn = format!(
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandbox/missing-{}-AbC123",
        unique()
    );
    let err = read_secret(&sm, &arn).await.unwrap_err();
    assert!(matches!(err, SecretError::NotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("sandbox/missing-"), "{text}");
    assert!(
        !text.contains("-AbC123"),
        "the random suffix is not part of the name: {text}"
    );
}

#[tokio::test]
async fn a_binary_secret_has_no_string_value() {
    let sm = Client::new(&sdk().await);
    let name = format!("sandbox/binary-{}", unique());
    sm.create_secret()
        .name(&name)
        .secret_binary(aws_sdk_secretsmanager::primitives::Blob::new(vec![
            1u8, 2, 3,
        ]))
        .send()
        .await
        .unwrap();
    let err = read_secret(&sm, &name).await.unwrap_err();
    assert!(matches!(err, SecretError::NoString { .. }), "{err:?}");
}
