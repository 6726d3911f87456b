//! Standard Webhooks verification: the published vector and every bad-input kind.

use sandbox_core::webhook::{SecretError, VerifyError, WebhookVerifier};

// The published Standard Webhooks test vector (standard-webhooks reference libraries).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS: u64 = 1614265330;
const BODY: &[u8] = br#"{"test": 2432232314}"#;
const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn verifier() -> WebhookVerifier {
    WebhookVerifier::new(SECRET).unwrap()
}

fn verify_sig(sig: &str) -> Result<(), VerifyError> {
    verifier()
        .verify_parts(MSG_ID, &TS.to_string(), sig, BODY, TS)
        .map(|_| ())
}

fn headers<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> Vec<(&'static str, &'a [u8])> {
    vec![
        ("webhook-id", id.as_bytes()),
        ("webhook-timestamp", ts.as_bytes()),
        ("webhook-signature", sig.as_bytes()),
    ]
}

#[test]
fn published_vector_signs_and_verifies() {
    assert_eq!(verifier().sign(MSG_ID, TS, BODY), SIG);
    let ok = verifier()
        .verify(headers(MSG_ID, "1614265330", SIG), BODY, TS)
        .unwrap();
    assert_eq!(ok.webhook_id, MSG_ID);
    assert_eq!(ok.timestamp, TS);
}

#[test]
fn header_names_are_case_insensitive() {
    let hs: Vec<(&str, &[u8])> = vec![
        ("Webhook-Id", MSG_ID.as_bytes()),
        ("WEBHOOK-TIMESTAMP", b"1614265330"),
        ("webhook-Signature", SIG.as_bytes()),
        ("content-type", b"application/json"),
    ];
    assert!(verifier().verify(hs, BODY, TS).is_ok());
}

#[test]
fn tampered_byte_fails() {
    let mut body = BODY.to_vec();
    body[3] ^= 1;
    let r = verifier().verify_parts(MSG_ID, "1614265330", SIG, &body, TS);
    assert_eq!(r, Err(VerifyError::SignatureMismatch));
}

#[test]
fn reserialized_body_fails() {
    // Same JSON value, different bytes: the signature covers bytes, not meaning.
    let r = verifier().verify_parts(MSG_ID, "1614265330", SIG, br#"{"test":2432232314}"#, TS);
    assert_eq!(r, Err(VerifyError::SignatureMismatch));
}

#[test]
fn changed_id_or_timestamp_fails() {
    let v = verifier();
    assert!(
        v.verify_parts("msg_other", "1614265330", SIG, BODY, TS)
            .is_err()
    );
    assert!(v.verify_parts(MSG_ID, "1614265331", SIG, BODY, TS).is_err());
}

#[test]
fn wrong_version_prefix_never_counts() {
    let b64 = SIG.trim_start_matches("v1,");
    for sig in [
        format!("v2,{b64}"),
        format!("v1a,{b64}"),
        format!("V1,{b64}"),
        format!("v1{b64}"),
    ] {
        assert_eq!(verify_sig(&sig), Err(VerifyError::NoV1Signature), "{sig}");
    }
}

#[test]
fn empty_or_truncated_v1_never_passes() {
    assert_eq!(verify_sig("v1,"), Err(VerifyError::SignatureMismatch));
    assert_eq!(verify_sig("v1, v1,"), Err(VerifyError::SignatureMismatch));
    // A prefix of the right signature (common-prefix comparison bug).
    assert_eq!(verify_sig(&SIG[..12]), Err(VerifyError::SignatureMismatch));
    // Not base64 at all.
    assert_eq!(verify_sig("v1,!!!!"), Err(VerifyError::SignatureMismatch));
    // The right signature plus trailing bytes.
    let long = format!("{SIG}AAAA");
    assert_eq!(verify_sig(&long), Err(VerifyError::SignatureMismatch));
}

#[test]
fn valid_entry_first_middle_or_last_passes() {
    let bad = "v1,Zm9vYmFyYmF6Zm9vYmFyYmF6Zm9vYmFyYmF6MTI=";
    for sig in [
        format!("{SIG} {bad} v2,abc"),
        format!("{bad} {SIG} {bad}"),
        format!("v2,abc {bad} {SIG}"),
        format!("  {SIG}  "),
    ] {
        assert_eq!(verify_sig(&sig), Ok(()), "{sig}");
    }
}

#[test]
fn timestamp_within_tolerance_both_directions_passes_and_one_second_beyond_fails() {
    let v = verifier();
    let ts = TS.to_string();
    assert!(v.verify_parts(MSG_ID, &ts, SIG, BODY, TS + 300).is_ok());
    assert!(v.verify_parts(MSG_ID, &ts, SIG, BODY, TS - 300).is_ok());
    assert_eq!(
        v.verify_parts(MSG_ID, &ts, SIG, BODY, TS + 301),
        Err(VerifyError::TimestampTooOld {
            age_secs: 301,
            tolerance_secs: 300
        })
    );
    assert_eq!(
        v.verify_parts(MSG_ID, &ts, SIG, BODY, TS - 301),
        Err(VerifyError::TimestampInFuture {
            ahead_secs: 301,
            tolerance_secs: 300
        })
    );
}

#[test]
fn tolerance_is_configurable() {
    let v = verifier().with_tolerance_secs(10);
    let ts = TS.to_string();
    assert!(v.verify_parts(MSG_ID, &ts, SIG, BODY, TS + 10).is_ok());
    assert!(matches!(
        v.verify_parts(MSG_ID, &ts, SIG, BODY, TS + 11),
        Err(VerifyError::TimestampTooOld { .. })
    ));
}

#[test]
fn malformed_timestamps_are_rejected_without_panic() {
    let v = verifier();
    for ts in [
        "",
        " ",
        "+1614265330",
        "-1614265330",
        "1614265330.0",
        "1.6e9",
        "0x60375d12",
        "１６１４２６５３３０",
        "99999999999999999999999999",
        "18446744073709551616",
    ] {
        assert_eq!(
            v.verify_parts(MSG_ID, ts, SIG, BODY, TS),
            Err(VerifyError::InvalidTimestamp),
            "{ts:?}"
        );
    }
}

#[test]
fn millisecond_and_extreme_timestamps_fail_the_window() {
    let v = verifier();
    let ms = (TS * 1000).to_string();
    assert!(matches!(
        v.verify_parts(MSG_ID, &ms, SIG, BODY, TS),
        Err(VerifyError::TimestampInFuture { .. })
    ));
    assert!(matches!(
        v.verify_parts(MSG_ID, "18446744073709551615", SIG, BODY, TS),
        Err(VerifyError::TimestampInFuture { .. })
    ));
    assert!(matches!(
        v.verify_parts(MSG_ID, "0", SIG, BODY, u64::MAX),
        Err(VerifyError::TimestampTooOld { .. })
    ));
}

#[test]
fn each_missing_header_is_named() {
    let ts = "1614265330";
    let all = headers(MSG_ID, ts, SIG);
    for (i, name) in ["webhook-id", "webhook-timestamp", "webhook-signature"]
        .into_iter()
        .enumerate()
    {
        let mut hs = all.clone();
        hs.remove(i);
        let err = verifier().verify(hs, BODY, TS).unwrap_err();
        assert_eq!(err, VerifyError::MissingHeader(name));
        assert_eq!(err.http_status(), 400);
    }
}

#[test]
fn duplicate_empty_or_binary_headers_are_rejected() {
    let mut hs = headers(MSG_ID, "1614265330", SIG);
    hs.push(("Webhook-Signature", SIG.as_bytes()));
    assert_eq!(
        verifier().verify(hs, BODY, TS),
        Err(VerifyError::DuplicateHeader("webhook-signature"))
    );
    let hs = headers("", "1614265330", SIG);
    assert_eq!(
        verifier().verify(hs, BODY, TS),
        Err(VerifyError::InvalidHeader("webhook-id"))
    );
    let hs: Vec<(&str, &[u8])> = vec![
        ("webhook-id", b"\xff\xfe"),
        ("webhook-timestamp", b"1614265330"),
        ("webhook-signature", SIG.as_bytes()),
    ];
    assert_eq!(
        verifier().verify(hs, BODY, TS),
        Err(VerifyError::InvalidHeader("webhook-id"))
    );
}

#[test]
fn authentication_failures_answer_401() {
    assert_eq!(verify_sig("v1,").unwrap_err().http_status(), 401);
    assert_eq!(VerifyError::InvalidTimestamp.http_status(), 401);
}

#[test]
fn invalid_or_short_secrets_are_refused_at_construction() {
    assert_eq!(WebhookVerifier::new("").unwrap_err(), SecretError::Empty);
    assert_eq!(
        WebhookVerifier::new("whsec_").unwrap_err(),
        SecretError::Empty
    );
    assert_eq!(
        WebhookVerifier::new("whsec_not*base64!").unwrap_err(),
        SecretError::InvalidBase64
    );
    // 8 bytes decoded.
    assert_eq!(
        WebhookVerifier::new("whsec_AAAAAAAAAAA=").unwrap_err(),
        SecretError::TooShort { len: 8 }
    );
    // Unprefixed: raw bytes, 15 < 16.
    assert_eq!(
        WebhookVerifier::new("fifteen-bytes!!").unwrap_err(),
        SecretError::TooShort { len: 15 }
    );
    assert!(WebhookVerifier::new("sixteen-bytes!!!").is_ok());
}

#[test]
fn unprefixed_secret_is_used_as_raw_bytes() {
    // whsec_ + base64("0123456789abcdef") and the raw string "0123456789abcdef" are the
    // same key: the official SDK treats an unprefixed secret as raw bytes.
    let a = WebhookVerifier::new("whsec_MDEyMzQ1Njc4OWFiY2RlZg==").unwrap();
    let b = WebhookVerifier::new("0123456789abcdef").unwrap();
    assert_eq!(a.sign("m", 1, b"x"), b.sign("m", 1, b"x"));
}

#[test]
fn errors_and_debug_never_echo_the_secret_or_signature() {
    let v = verifier();
    let dbg = format!("{v:?}");
    assert!(!dbg.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "{dbg}");
    let err = v
        .verify_parts(MSG_ID, "1614265330", SIG, b"tampered", TS)
        .unwrap_err()
        .to_string();
    assert!(!err.contains("g0hM9SsE"), "{err}");
    let err = WebhookVerifier::new("whsec_c2hvcnQ=")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("c2hvcnQ"), "{err}");
}
