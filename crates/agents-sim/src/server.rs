//! [`spawn`]: bind 127.0.0.1, serve the [`router`], and hand back a [`SimHandle`].

use crate::client::SimClient;
use crate::config::SimConfig;
use crate::error::SimError;
use crate::routes::router;
use crate::snapshot::{DeliveryStats, SimSnapshot};
use crate::state::SimState;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How long [`SimHandle::shutdown`] waits for the server task to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Starts a simulator on `127.0.0.1:{config.port}` (port 0 = any free port; no other
/// address is ever bound), with its webhook delivery task and turn drivers.
///
/// # Errors
/// [`SimError::Config`] / [`SimError::Secret`] for an unusable configuration,
/// [`SimError::Bind`] when the port cannot be bound.
pub async fn spawn(config: SimConfig) -> Result<SimHandle, SimError> {
    config.validate().map_err(SimError::Config)?;
    let port = config.port;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .map_err(|source| SimError::Bind { port, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| SimError::Bind { port, source })?;
    let state = SimState::new(config, format!("http://{addr}"))?;
    let app = router(state.clone());
    let mut stop = state.0.shutdown.subscribe();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
    });
    tracing::info!(base_url = %state.base_url(), "agents simulator listening");
    Ok(SimHandle {
        state,
        addr,
        server: Some(server),
    })
}

/// A running simulator. Dropping it stops background work and the server (without waiting);
/// [`SimHandle::shutdown`] stops and waits.
#[derive(Debug)]
pub struct SimHandle {
    state: SimState,
    addr: SocketAddr,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl SimHandle {
    /// The API base URL, `http://127.0.0.1:PORT/v1` (what an Agents API client takes).
    pub fn base_url(&self) -> String {
        self.state.base_url()
    }

    /// The simulator root, `http://127.0.0.1:PORT` (control endpoints under `/sim`).
    pub fn root_url(&self) -> &str {
        self.state.root_url()
    }

    /// The bound address (always 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of sessions, environments, events and delivery counters.
    pub fn state(&self) -> SimSnapshot {
        self.state.snapshot()
    }

    /// Delivery counters only.
    pub fn delivery_stats(&self) -> DeliveryStats {
        self.state.delivery_stats()
    }

    /// The live state handle (for [`router`] or direct control).
    pub fn sim_state(&self) -> &SimState {
        &self.state
    }

    /// A client for this simulator, with its configured API and executor keys.
    pub fn client(&self) -> SimClient {
        let cfg = self.state.config();
        SimClient::new(&self.base_url(), &cfg.api_key, &cfg.executor_key)
    }

    /// Moves simulated time forward by `secs` simulated seconds.
    pub fn advance_clock(&self, secs: f64) {
        self.state.advance_clock(secs);
    }

    /// Waits (at most `timeout`, real time) until every queued delivery copy is
    /// acknowledged or abandoned; returns whether that happened.
    pub async fn wait_deliveries_idle(&self, timeout: Duration) -> bool {
        self.state.wait_deliveries_idle(timeout).await
    }

    /// Stops deliveries, turn drivers and the server, and waits up to
    /// [`SHUTDOWN_GRACE`] for the server to finish.
    pub async fn shutdown(mut self) {
        self.state.shutdown();
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.state.shutdown();
    }
}
