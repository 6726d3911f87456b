//! `sandboxctl preflight` on the local backend, against real parts on 127.0.0.1 only: a
//! TLS server (`openssl s_server`, with a test CA made by the `openssl` command line), a
//! closed port, a name that does not resolve (`.invalid`, RFC 2606), the executor key file
//! and the pinned `codex` answering `--version`. One line (or one JSON entry) per check,
//! exit 1 when any fails, and never the key.

use sandbox_e2e::operator_cli::sandboxctl;
use sandbox_e2e::pinned_codex;
use sandbox_e2e::test_tls::{TlsServer, certificates, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let port = free_port();
    let _server = TlsServer::start(dir.path(), port);
    let closed = free_port();
    let ca = dir.path().join("ca.pem").display().to_string();
    let key = "preflight-secret-key-value";
    let key_file = dir.path().join("executor.key");
    std::fs::write(&key_file, key).unwrap();
    let key_file = key_file.display().to_string();
    let codex = pinned_codex().unwrap().display().to_string();
    let tls_host = format!("127.0.0.1:{port}");
    let closed_host = format!("127.0.0.1:{closed}");
    let data = dir.path().join("data").display().to_string();

    // Everything reachable: exit 0, one ok line per check.
    let good = sandboxctl(
        &[
            "preflight",
            "--data-dir",
            &data,
            "--host",
            &tls_host,
            "--tls-ca-file",
            &ca,
            "--executor-key-file",
            &key_file,
            "--executor",
            &codex,
        ],
        &[],
    )
    .await;
    assert_eq!(good.code, 0, "{good:?}");
    let lines: Vec<&str> = good.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", good.stdout);
    assert!(
        lines.iter().all(|l| l.starts_with("ok ")),
        "{}",
        good.stdout
    );
    assert!(good.stdout.contains("TLS accepted"), "{}", good.stdout);
    assert!(
        good.stdout.contains("0.171.0"),
        "the pinned codex's version: {}",
        good.stdout
    );

    // What is missing is named, one entry each; exit 1; never the key.
    let bad = sandboxctl(
        &[
            "preflight",
            "--json",
            "--data-dir",
            &data,
            "--host",
            &tls_host,
            "--host",
            &closed_host,
            "--host",
            "executor-registration.invalid",
            "--executor-key-env",
            "PREFLIGHT_NO_SUCH_KEY",
            "--executor",
            "/nonexistent/codex",
            "--timeout-secs",
            "3",
        ],
        &[],
    )
    .await;
    assert_eq!(bad.code, 1, "{bad:?}");
    let doc = bad.json();
    let by_name = |n: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("no check {n}: {doc}"))
            .clone()
    };
    // Without the test CA, the server's certificate is not trusted.
    let untrusted = by_name("tls 127.0.0.1");
    assert_eq!(untrusted["ok"], false, "{untrusted}");
    assert_eq!(
        by_name("resolve executor-registration.invalid")["ok"],
        false
    );
    assert_eq!(by_name("tls executor-registration.invalid")["ok"], false);
    let refused = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "tls 127.0.0.1")
        .nth(1)
        .unwrap()
        .clone();
    assert!(
        refused["detail"].as_str().unwrap().contains("refused"),
        "{refused}"
    );
    let missing_key = by_name("executor_key");
    assert_eq!(missing_key["ok"], false);
    assert!(
        missing_key["detail"]
            .as_str()
            .unwrap()
            .contains("PREFLIGHT_NO_SUCH_KEY")
    );
    assert_eq!(by_name("executor_version")["ok"], false);
    assert_eq!(
        doc["problems"].as_array().unwrap().len(),
        6,
        "each failure once: {doc}"
    );
    // The key given by variable is read, never shown.
    let keyed = sandboxctl(
        &[
            "preflight",
            "--data-dir",
            &data,
            "--host",
            &tls_host,
            "--tls-ca-file",
            &ca,
            "--executor",
            &codex,
        ],
        &[("CODEX_API_KEY", key)],
    )
    .await;
    assert_eq!(keyed.code, 0, "{keyed:?}");
    assert!(!keyed.stdout.contains(key) && !keyed.stderr.contains(key));
    assert!(!good.stdout.contains(key) && !bad.stdout.contains(key));
}
