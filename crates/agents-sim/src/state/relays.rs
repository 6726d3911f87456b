//! The relay table of the simulator's state: registrations, open rendezvous sockets and the
//! stream authorizations issued to the harness (../shared/reference/executor-protocol.md,
//! "Registration and rendezvous"), and the harness's way to run a command through a socket.
//! The HTTP side is [`crate::registration`] (register, validate) and [`crate::rendezvous`]
//! (the socket, the Noise initiator); the turns run their commands with [`run_command`].

use super::SimState;
use crate::exec_protocol::{CommandResult, Pipe};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// One registration: the executor's static keys, for the harness's handshakes.
#[derive(Clone, Debug)]
pub(crate) struct Registration {
    pub environment_id: String,
    pub x25519: Vec<u8>,
    pub mlkem: Vec<u8>,
}

/// Registrations, open rendezvous sockets and issued stream authorizations.
#[derive(Default)]
pub(crate) struct Relays {
    pub registrations: HashMap<String, Registration>,
    /// Rendezvous token → registration id.
    pub tokens: HashMap<String, String>,
    /// Environments cut off by `drop-executor`: their rendezvous upgrades answer 503.
    pub(crate) partitioned: std::collections::HashSet<String>,
    /// Authorization token (msg1's payload) → what it was issued for.
    pub authorizations: HashMap<String, Issued>,
    /// Open sockets by connection id.
    pub(crate) sockets: HashMap<String, Socket>,
}

/// What one harness authorization was issued for: a stream of a registration, by a
/// harness with this static X25519 key.
pub(crate) struct Issued {
    pub registration_id: String,
    pub stream_id: String,
    pub harness_x25519: Vec<u8>,
}

pub(crate) struct Socket {
    pub(crate) environment_id: String,
    pub(crate) open: mpsc::Sender<OpenStream>,
    pub(crate) kill: Arc<Notify>,
}

pub(crate) type OpenStream = oneshot::Sender<Result<Pipe, String>>;

/// The relay table, poison-tolerant.
pub(crate) fn relays(state: &SimState) -> std::sync::MutexGuard<'_, Relays> {
    state.0.relays.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `command` through connection `conn`'s rendezvous socket (a new stream).
///
/// # Errors
/// The socket is gone, the handshake failed, or [`crate::exec_protocol::run_command`]'s errors.
pub(crate) async fn run_command(
    state: &SimState,
    conn: &str,
    command: &str,
    timeout: Duration,
) -> Result<CommandResult, String> {
    let open = relays(state).sockets.get(conn).map(|s| s.open.clone());
    let open = open.ok_or("the executor's rendezvous socket is closed")?;
    let (tx, rx) = oneshot::channel();
    open.send(tx)
        .await
        .map_err(|_| "the executor's rendezvous socket is closed")?;
    let pipe = rx
        .await
        .map_err(|_| "the executor's rendezvous socket closed")??;
    crate::exec_protocol::run_command(pipe, command, timeout).await
}
