//! [`NoSessions`]: the Agents API port of a controller that must never read a session —
//! `sandboxctl sweep` plans and fans out a sweep (registry, provider, timers queue), which
//! reads no session, so it needs no API key. Every call is refused without a request.

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
        reason: "this sandboxctl command reads no session (no Agents API key configured)".into(),
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
