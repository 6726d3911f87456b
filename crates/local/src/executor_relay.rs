//! The forwarder-only relay in front of a local listening executor: the executor's
//! WebSocket admits only connections that carry its capability token, and the one process
//! that may hold a connection to it, the forwarder, reaches it through this relay, which
//! admits a TCP connection only when the connecting socket belongs to the forwarder (or
//! one of its descendants) and adds the token on the way.
//!
//! Why a relay: `codex exec-server --listen` takes `--ws-auth capability-token
//! --ws-token-file F` (a client must send `Authorization: Bearer <token>` in its upgrade
//! request, or is answered 401), but `codex exec-server forward --connect` (0.171.0) has no
//! way to present a token (see ../shared/reference/executor-protocol.md, "Command
//! lines"). The relay runs in the forwarder's supervisor ([`crate::supervise`]), so it
//! lives exactly as long as the forwarder, across `serve` restarts.
//!
//! Who is the peer: a loopback TCP connection's client socket is found in
//! `/proc/net/tcp` (or `tcp6`, for v4-mapped addresses) by its local and remote
//! address (proc(5): `local_address rem_address` as hexadecimal `ADDR:PORT`, then the
//! `inode` column); the socket belongs to a process when one of its `/proc/<pid>/fd/*`
//! links reads `socket:[<inode>]`. Only the forwarder's process tree is searched, so the
//! check needs no privilege; another user's process is never the forwarder.
//!
//! What it does not stop: a process of the same user can read the token file (0600 in the
//! data directory) or ptrace the forwarder; docs/SECURITY.md says so.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

/// The most bytes of a WebSocket upgrade request head the relay reads (RFC 6455 §4.1;
/// a forwarder's is a few hundred bytes).
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// How long a client may take to send its upgrade request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What the relay answers a connection that is not the forwarder's.
const FORBIDDEN: &[u8] =
    b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// The token a listener's `--ws-token-file` holds: 64 hexadecimal characters (32 bytes
/// from `/dev/urandom`), written to `path` with mode 0600 (created or truncated).
///
/// # Errors
/// `/dev/urandom` or the file cannot be read or written.
pub fn write_token_file(path: &Path) -> io::Result<()> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    crate::private::create_private_file(path)?;
    std::fs::write(path, token)
}

/// Reads the token of a `--ws-token-file` (surrounding whitespace trimmed, never empty).
///
/// # Errors
/// The file cannot be read or is empty.
pub fn read_token_file(path: &Path) -> io::Result<String> {
    let token = std::fs::read_to_string(path)?.trim().to_owned();
    if token.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(token)
}

/// `host:port` of a `ws://127.0.0.1:PORT` URL (only loopback IPv4 is accepted: the relay
/// and its executor are local).
///
/// # Errors
/// Any other URL.
pub fn loopback_addr(url: &str) -> io::Result<SocketAddr> {
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{url:?} is not ws://127.0.0.1:PORT"),
        )
    };
    let rest = url.strip_prefix("ws://").ok_or_else(invalid)?;
    let rest = rest.trim_end_matches('/');
    let addr: SocketAddr = rest.parse().map_err(|_| invalid())?;
    if addr.ip() != std::net::IpAddr::V4(Ipv4Addr::LOCALHOST) {
        return Err(invalid());
    }
    Ok(addr)
}

/// The relay's configuration: where the executor listens and the token it wants.
#[derive(Clone)]
pub struct Relay {
    /// The executor's listening address (`127.0.0.1:PORT`).
    pub upstream: SocketAddr,
    /// The executor's capability token (never logged).
    pub token: String,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("upstream", &self.upstream)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Relay {
    /// Accepts connections on `listener` until it fails, each on its own thread: a
    /// connection from a socket of `admitted_root`'s process tree is relayed to the
    /// executor with the token added; any other is answered 403 and closed.
    pub fn serve(self, listener: TcpListener, admitted_root: i32) {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let relay = self.clone();
            std::thread::spawn(move || {
                if let Err(e) = relay.handle(conn, admitted_root) {
                    eprintln!("sandboxctl relay: {e}");
                }
            });
        }
    }

    fn handle(&self, mut client: TcpStream, admitted_root: i32) -> io::Result<()> {
        let local = client.local_addr()?;
        let peer = client.peer_addr()?;
        if !peer_is_in_tree(peer, local, admitted_root) {
            eprintln!(
                "sandboxctl relay: refused {peer}: not a socket of the forwarder's process tree"
            );
            client.write_all(FORBIDDEN)?;
            return Ok(());
        }
        client.set_read_timeout(Some(HEAD_TIMEOUT))?;
        let head = read_request_head(&mut client)?;
        client.set_read_timeout(None)?;
        let mut upstream = TcpStream::connect(self.upstream)?;
        upstream.write_all(&with_token(&head, &self.token))?;
        pipe(client, upstream)
    }
}

/// Reads an HTTP request head (through the blank line) of at most [`MAX_REQUEST_HEAD`]
/// bytes, byte by byte so that nothing after it is consumed.
fn read_request_head(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head over 16 KiB",
            ));
        }
        if client.read(&mut byte)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    Ok(head)
}

/// The request head with every `Authorization` header removed and `Authorization: Bearer
/// <token>` added before the blank line.
fn with_token(head: &[u8], token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + token.len() + 32);
    for line in BufReader::new(head).split(b'\n') {
        let Ok(line) = line else { break };
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        if text.is_empty() {
            break;
        }
        if text
            .split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
        {
            continue;
        }
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Authorization: Bearer {token}\r\n\r\n").as_bytes());
    out
}

/// Copies both directions until either side closes, then shuts both down.
fn pipe(client: TcpStream, upstream: TcpStream) -> io::Result<()> {
    let (mut c_read, mut u_write) = (client.try_clone()?, upstream.try_clone()?);
    let forward = std::thread::spawn(move || {
        let _ = io::copy(&mut c_read, &mut u_write);
        let _ = u_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut u_read, mut c_write) = (upstream, client);
    let _ = io::copy(&mut u_read, &mut c_write);
    let _ = c_write.shutdown(std::net::Shutdown::Both);
    let _ = u_read.shutdown(std::net::Shutdown::Both);
    let _ = forward.join();
    Ok(())
}

/// Whether the client socket of the connection `peer` → `local` belongs to `root` or one
/// of its descendants (see the module docs).
pub fn peer_is_in_tree(peer: SocketAddr, local: SocketAddr, root: i32) -> bool {
    let Some(inode) = socket_inode(peer, local) else {
        return false;
    };
    let link = format!("socket:[{inode}]");
    std::iter::once(root)
        .chain(crate::proc_tree::descendants(root))
        .any(|pid| holds_link(pid, &link))
}

/// The inode of the TCP socket whose local address is `socket` and remote address
/// `remote`, from `/proc/net/tcp` and `/proc/net/tcp6`.
fn socket_inode(socket: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (SocketAddr::V4(s), SocketAddr::V4(r)) = (socket, remote) else {
        return None;
    };
    let v4 = |a: &std::net::SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(a.ip().octets()),
            a.port()
        )
    };
    // A v4-mapped address in tcp6: ::ffff:a.b.c.d, as four little-endian 32-bit words.
    let v6 = |a: &std::net::SocketAddrV4| {
        format!(
            "0000000000000000FFFF0000{:08X}:{:04X}",
            u32::from_le_bytes(a.ip().octets()),
            a.port()
        )
    };
    [
        ("/proc/net/tcp", v4(&s), v4(&r)),
        ("/proc/net/tcp6", v6(&s), v6(&r)),
    ]
    .into_iter()
    .find_map(|(table, want_local, want_remote)| {
        let file = std::fs::File::open(table).ok()?;
        BufReader::new(file).lines().skip(1).find_map(|line| {
            let line = line.ok()?;
            let mut fields = line.split_whitespace();
            let _slot = fields.next()?;
            let local = fields.next()?;
            let remote = fields.next()?;
            if local != want_local || remote != want_remote {
                return None;
            }
            // st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            fields.nth(6)?.parse().ok()
        })
    })
}

/// Whether one of `pid`'s file descriptors is `link` (e.g. `socket:[123]`).
fn holds_link(pid: i32, link: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| target.as_os_str() == link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_replaces_any_authorization_the_client_sent() {
        let head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAuthorization: Bearer theirs\r\nUpgrade: websocket\r\n\r\n";
        let out = String::from_utf8(with_token(head, "ours")).unwrap();
        assert_eq!(
            out,
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:1\r\nUpgrade: websocket\r\nAuthorization: Bearer ours\r\n\r\n"
        );
    }

    #[test]
    fn only_loopback_ws_urls_are_relayed() {
        assert_eq!(
            loopback_addr("ws://127.0.0.1:4000").unwrap(),
            "127.0.0.1:4000".parse().unwrap()
        );
        for bad in [
            "ws://10.0.0.1:4000",
            "http://127.0.0.1:4000",
            "ws://localhost:1",
        ] {
            assert!(loopback_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_socket_of_this_process_is_found_and_one_of_another_tree_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(peer_is_in_tree(peer, server.local_addr().unwrap(), me));
        // A child of this test holds no copy of the socket (std sets FD_CLOEXEC).
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let other_pid = i32::try_from(other.id()).unwrap();
        let found = peer_is_in_tree(peer, server.local_addr().unwrap(), other_pid);
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(!found);
        drop(client);
    }
}
