//! End-to-end tests of the `sandboxctl` binary: exit codes, sign/verify round trips,
//! secret handling, and decoding of every fixture under `events/`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SECRET: &str = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=";

fn events() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../events")
}

fn run(args: &[&str], stdin: &[u8], secret: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxctl"));
    cmd.args(args)
        .env_remove("WEBHOOK_SECRET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(secret) = secret {
        cmd.env("WEBHOOK_SECRET", secret);
    }
    let mut child = cmd.spawn().expect("spawn sandboxctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn sign(body: &[u8], id: &str, ts: u64) -> String {
    let o = run(
        &["sign", "--webhook-id", id, "--timestamp", &ts.to_string()],
        body,
        Some(SECRET),
    );
    assert!(o.status.success(), "{o:?}");
    stdout(&o).trim().to_owned()
}

fn verify(body: &[u8], id: &str, ts: &str, sig: &str, now: u64) -> Output {
    run(
        &[
            "verify",
            "--webhook-id",
            id,
            "--timestamp",
            ts,
            "--signature",
            sig,
            "--now",
            &now.to_string(),
        ],
        body,
        Some(SECRET),
    )
}

#[test]
fn sign_then_verify_round_trips_and_a_flipped_byte_fails() {
    let body =
        br#"{"id":"evt_1","object":"event","type":"agent.session.idle","created_at":1,"data":{}}"#;
    let sig = sign(body, "msg_1", 1_764_400_000);
    assert!(sig.starts_with("v1,"), "{sig}");
    let ok = verify(body, "msg_1", "1764400000", &sig, 1_764_400_100);
    assert_eq!((ok.status.code(), stdout(&ok).as_str()), (Some(0), "ok\n"));

    let mut tampered = body.to_vec();
    tampered[5] ^= 1;
    let bad = verify(&tampered, "msg_1", "1764400000", &sig, 1_764_400_100);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stdout(&bad).starts_with("SignatureMismatch: "), "{bad:?}");
}

#[test]
fn verify_reports_the_typed_error() {
    let body = b"{}";
    let sig = sign(body, "msg_1", 1_764_400_000);
    for (ts, sig, now, want) in [
        (
            "1764400000",
            sig.as_str(),
            1_764_400_301,
            "TimestampTooOld: ",
        ),
        (
            "1764400000",
            sig.as_str(),
            1_764_399_699,
            "TimestampInFuture: ",
        ),
        (
            "+1764400000",
            sig.as_str(),
            1_764_400_000,
            "InvalidTimestamp: ",
        ),
        ("1764400000", "v2,AAAA", 1_764_400_000, "NoV1Signature: "),
        ("1764400000", "v1,", 1_764_400_000, "SignatureMismatch: "),
    ] {
        let o = verify(body, "msg_1", ts, sig, now);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(stdout(&o).starts_with(want), "{want}: {o:?}");
    }
    let o = verify(body, "", "1764400000", &sig, 1_764_400_000);
    assert!(stdout(&o).starts_with("InvalidHeader: "), "{o:?}");
}

#[test]
fn missing_secret_is_a_usage_error_and_the_secret_is_never_printed() {
    let o = run(
        &["sign", "--webhook-id", "m", "--timestamp", "1"],
        b"",
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("WEBHOOK_SECRET is not set"));

    let o = run(
        &["sign", "--webhook-id", "m", "--timestamp", "1"],
        b"",
        Some("whsec_!!notbase64!!"),
    );
    assert_eq!(o.status.code(), Some(2));
    let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(!all.contains("notbase64"), "{all}");
}

#[test]
fn every_fixture_decodes_and_round_trips() {
    let cases = [
        ("webhooks", "event"),
        ("sessions", "session"),
        ("environments", "environment"),
        ("turns", "turn"),
    ];
    let mut seen = 0;
    for (dir, model) in cases {
        for entry in std::fs::read_dir(events().join(dir)).expect("fixture dir") {
            let path = entry.expect("entry").path();
            let model = if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("items."))
            {
                "items"
            } else {
                model
            };
            let raw = std::fs::read(&path).expect("read fixture");
            let o = run(&["decode", model], &raw, None);
            assert!(o.status.success(), "{}: {o:?}", path.display());
            let back: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json out");
            let orig: serde_json::Value = serde_json::from_slice(&raw).expect("json in");
            assert_eq!(back, orig, "{}", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 20, "only {seen} fixtures");
}

#[test]
fn malformed_input_exits_2() {
    for model in ["session", "event", "environment", "turn", "items"] {
        let o = run(&["decode", model], b"{", None);
        assert_eq!(o.status.code(), Some(2), "{model}");
        assert!(o.stdout.is_empty());
        assert!(String::from_utf8_lossy(&o.stderr).contains("malformed"));
    }
}

/// `--backend aws` is compiled only with the `aws` feature. Without it (the default build,
/// what `make run` builds) an AWS command exits 2, changes nothing and names the command
/// that builds the backend; with it (`make test` builds `--features sandboxctl/aws`) the
/// same command gets as far as the deployment's settings and names the missing variable.
#[test]
fn an_aws_command_says_how_to_get_the_aws_backend_when_it_is_not_built() {
    let o = Command::new(env!("CARGO_BIN_EXE_sandboxctl"))
        .args(["status", "--backend", "aws"])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxctl");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    let how = "`cargo build -p sandboxctl --features aws`";
    if cfg!(feature = "aws") {
        assert!(!err.contains(how), "{err}");
        assert!(err.contains("_"), "names the missing variable: {err}");
    } else {
        assert!(
            err.contains("built without the AWS backend") && err.contains(how),
            "{err}"
        );
    }
}
