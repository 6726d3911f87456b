//! A TLS server on 127.0.0.1 for the `preflight` tests: `openssl s_server` with a test CA
//! made by the `openssl` command line (so a check trusts it only when given the CA, as an
//! egress proxy's CA would be given), and a free port for a closed one.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs")
        .success();
    assert!(ok, "openssl {args:?}");
}

/// A test CA (`ca.pem`) and a server certificate for IP 127.0.0.1 (`leaf.pem`,
/// `leaf.key`) signed by it, in `dir`.
pub fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=preflight test CA",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "1",
            "-extfile",
            "leaf.ext",
        ],
    );
}

pub use crate::free_port;

/// `openssl s_server` on 127.0.0.1:`port`, answering HTTP (`-www`); ended on drop.
pub struct TlsServer(Child);

impl TlsServer {
    /// Starts it with the certificate [`certificates`] wrote in `dir`; waits until it
    /// listens (at most 10 s).
    pub fn start(dir: &Path, port: u16) -> Self {
        let child = Command::new("openssl")
            .args([
                "s_server",
                "-accept",
                &format!("127.0.0.1:{port}"),
                "-cert",
                "leaf.pem",
                "-key",
                "leaf.key",
                "-www",
                "-quiet",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server starts");
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "s_server never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self(child)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
