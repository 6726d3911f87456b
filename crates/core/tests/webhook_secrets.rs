//! Webhook secrets: a list for rotation without downtime, and malformed
//! secrets refused when the verifier is built, naming the mistake and never the value.

use sandbox_core::webhook::{SecretError, VerifyError, WebhookVerifier};

// The published Standard Webhooks test vector (standard-webhooks reference libraries).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS: u64 = 1614265330;
const BODY: &[u8] = br#"{"test": 2432232314}"#;
const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
/// Another valid secret (base64 of 24 bytes).
const OTHER: &str = "whsec_b3RoZXItc2VjcmV0LWZvci1yb3RhdGlvbg==";

fn verify(v: &WebhookVerifier, sig: &str) -> Result<(), VerifyError> {
    v.verify_parts(MSG_ID, &TS.to_string(), sig, BODY, TS)
        .map(|_| ())
}

#[test]
fn delivery_signed_with_the_previous_secret_verifies_during_a_rotation() {
    let v = WebhookVerifier::with_secrets(&[OTHER, SECRET]).unwrap();
    assert_eq!(v.secret_count(), 2);
    assert_eq!(verify(&v, SIG), Ok(()));
}

#[test]
fn delivery_signed_with_the_current_secret_verifies_and_signing_uses_it() {
    let v = WebhookVerifier::with_secrets(&[SECRET, OTHER]).unwrap();
    assert_eq!(v.sign(MSG_ID, TS, BODY), SIG);
    let current_only = WebhookVerifier::new(OTHER).unwrap();
    let sig = current_only.sign(MSG_ID, TS, BODY);
    assert_eq!(verify(&v, &sig), Ok(()));
}

#[test]
fn delivery_signed_with_neither_secret_fails() {
    let v = WebhookVerifier::with_secrets(&[OTHER]).unwrap();
    assert_eq!(verify(&v, SIG), Err(VerifyError::SignatureMismatch));
}

#[test]
fn empty_secret_list_is_refused() {
    assert_eq!(
        WebhookVerifier::with_secrets::<&str>(&[]).unwrap_err(),
        SecretError::NoSecrets
    );
}

#[test]
fn secret_pasted_with_a_v1_prefix_is_refused_naming_the_mistake() {
    for bad in [
        format!("v1,{SECRET}"),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".into(),
    ] {
        let err = WebhookVerifier::new(&bad).unwrap_err();
        assert_eq!(err, SecretError::VersionPrefix);
        let text = err.to_string();
        assert!(text.contains("v1,"), "{text}");
        assert!(
            !text.contains("MfKQ9r8"),
            "the message never holds the secret"
        );
    }
}

#[test]
fn secret_with_whitespace_anywhere_is_refused() {
    for bad in [
        format!("{SECRET}\n"),
        format!(" {SECRET}"),
        "whsec_MfKQ9r8GKYqr TwjUPD8ILPZIo2LaLaSw".to_owned(),
        format!("{SECRET}\t"),
    ] {
        assert_eq!(
            WebhookVerifier::new(&bad).unwrap_err(),
            SecretError::Whitespace,
            "{bad:?}"
        );
    }
}

#[test]
fn quoted_comma_separated_or_non_ascii_secrets_are_refused() {
    assert_eq!(
        WebhookVerifier::new(&format!("\"{SECRET}\"")).unwrap_err(),
        SecretError::Quoted
    );
    assert_eq!(
        WebhookVerifier::new(&format!("{SECRET},{OTHER}")).unwrap_err(),
        SecretError::Comma
    );
    assert_eq!(
        WebhookVerifier::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwé").unwrap_err(),
        SecretError::NotVisibleAscii
    );
}

#[test]
fn malformed_secret_in_a_list_is_named_by_position_never_by_value() {
    let err = WebhookVerifier::with_secrets(&[SECRET, "v1,abc"]).unwrap_err();
    assert_eq!(
        err,
        SecretError::InList {
            position: 2,
            count: 2,
            problem: Box::new(SecretError::VersionPrefix)
        }
    );
    let text = err.to_string();
    assert!(text.starts_with("webhook secret 2 of 2:"), "{text}");
    assert!(!text.contains("abc"));
}

#[test]
fn debug_shows_how_many_secrets_but_no_key() {
    let v = WebhookVerifier::with_secrets(&[SECRET, OTHER]).unwrap();
    let text = format!("{v:?}");
    assert!(text.contains("<2 redacted>"), "{text}");
    assert!(!text.contains("MfKQ"));
}
