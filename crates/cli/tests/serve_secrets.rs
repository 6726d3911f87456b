//! `serve` takes secrets from files only when their owner alone may read
//! them, and names the file and its mode (never the content) otherwise.

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Stdio};

const WHSEC: &str = "whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=";

fn serve(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sandboxctl"))
        .arg("serve")
        .args(args)
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_WEBHOOK_SECRET", WHSEC)
        .env("CODEX_API_KEY", "sk-exec")
        .stdin(Stdio::null())
        .output()
        .expect("sandboxctl runs")
}

#[test]
fn serve_refuses_secret_files_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "sk-file-secret-value\n").unwrap();
    let data = dir.path().join("data");
    for flag in [
        "--executor-key-file",
        "--api-key-file",
        "--webhook-secret-file",
    ] {
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let o = serve(&[
                flag,
                file.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{flag} {mode:o}: {err}");
            assert!(err.contains(&format!("has mode {mode:o}")), "{flag}: {err}");
            assert!(!err.contains("sk-file-secret-value"), "{err}");
        }
    }
    assert!(!data.exists(), "nothing started");
}
