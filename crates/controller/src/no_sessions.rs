//! [`NoSessions`]: the Agents API port of a controller that must never read a session.
//! A sweep (`Controller::sweep_fan_out`: the registry's open records, the provider
//! inventory, the timers queue, stored workspaces) reads no session: the jobs it fans
//! out are decided by the worker, which re-reads each session. So the sweeper function
//! and `sandboxctl sweep` are built with this port and hold no Agents API key (docs/SECURITY.md:
//! one role per function with exactly what its code calls). Every call is refused with
//! [`ApiError::InvalidArgument`], without a request.

use sandbox_agents_api::{ApiError, PageParams, SessionDeleted, SessionsApi};
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};

/// An Agents API port that refuses every call (no request is sent).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSessions;

fn refused() -> ApiError {
    ApiError::InvalidArgument {
        reason: "this controller reads no session (it holds no Agents API key)".into(),
    }
}

impl SessionsApi for NoSessions {
    async fn retrieve_session(&self, _: &SessionId) -> Result<Session, ApiError> {
        Err(refused())
    }
    async fn delete_session(&self, _: &SessionId, _: &str) -> Result<SessionDeleted, ApiError> {
        Err(refused())
    }
    async fn retrieve_environment(&self, _: &EnvironmentId) -> Result<EnvironmentInfo, ApiError> {
        Err(refused())
    }
    async fn list_turns(&self, _: &SessionId, _: &PageParams) -> Result<Page<Turn>, ApiError> {
        Err(refused())
    }
    async fn list_turn_items(
        &self,
        _: &SessionId,
        _: &str,
        _: &PageParams,
    ) -> Result<Page<Item>, ApiError> {
        Err(refused())
    }
}
