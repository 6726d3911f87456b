//! The [`SessionsApi`] trait the controller depends on, and its small request/response
//! types.

use crate::error::ApiError;
use sandbox_core::environment::EnvironmentInfo;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::session::Session;
use sandbox_core::turn::{Item, Page, Turn};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// The answer of `DELETE /agents/sessions/{id}`:
/// `{"id": "...", "object": "agent.session.deleted", "deleted": true}`.
///
/// Physical cleanup may continue asynchronously and the session answers 404 afterwards;
/// deleting a session neither stops its compute nor emits a webhook (agents-api.md:
/// endpoints; lifecycle rules), so the caller stops compute as a separate operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionDeleted {
    /// The deleted session's id.
    pub id: SessionId,
    /// Always `agent.session.deleted`.
    pub object: String,
    /// `true` when the deletion was accepted.
    pub deleted: bool,
}

/// Sort order of a cursor page, by creation time (agents-api.md: cursor pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Oldest first (`order=asc`).
    Asc,
    /// Newest first (`order=desc`).
    Desc,
}

impl Order {
    /// The query value: `asc` or `desc`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Asc => "asc",
            Self::Desc => "desc",
        }
    }
}

/// Smallest page `limit` the API accepts (agents-api.md: cursor pages take `limit` 1..100).
pub const MIN_PAGE_LIMIT: u32 = 1;
/// Largest page `limit` the API accepts.
pub const MAX_PAGE_LIMIT: u32 = 100;

/// Cursor parameters of a list call; every `None` is left out of the query string so the
/// API default applies (`limit` 20, agents-api.md: cursor pages; `order` `desc`, per the
/// official Python SDK 3.51.0 `turn_list_params.py`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageParams {
    /// Return entries after this id: the previous page's `last_id` (`after=...`).
    pub after: Option<String>,
    /// Page size, [`MIN_PAGE_LIMIT`]..=[`MAX_PAGE_LIMIT`] (`limit=...`). Anything else is
    /// rejected with [`ApiError::InvalidArgument`] before a request is sent.
    pub limit: Option<u32>,
    /// Sort order (`order=asc|desc`).
    pub order: Option<Order>,
}

impl PageParams {
    /// The newest `limit` entries first: `order=desc&limit={limit}` (e.g. to find the
    /// latest turn with `limit` 1).
    pub fn latest(limit: u32) -> Self {
        Self {
            after: None,
            limit: Some(limit),
            order: Some(Order::Desc),
        }
    }

    /// Checks `limit` against 1..=100.
    ///
    /// # Errors
    /// [`ApiError::InvalidArgument`] naming the rejected value.
    pub fn validate(&self) -> Result<(), ApiError> {
        match self.limit {
            Some(limit) if !(MIN_PAGE_LIMIT..=MAX_PAGE_LIMIT).contains(&limit) => {
                Err(ApiError::InvalidArgument {
                    reason: format!(
                        "page limit must be between {MIN_PAGE_LIMIT} and {MAX_PAGE_LIMIT}, got {limit}"
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// The parameters of the page after `page` in a list of turns, or `None` when it was
    /// the last page (`has_more` false, or no entries).
    ///
    /// Turn lists are plain cursor pages: the cursor is the id of the last turn on the page
    /// (as the official SDK's `CursorPage` does), falling back to `last_id`.
    pub fn next_for_turns(&self, page: &Page<Turn>) -> Option<Self> {
        let cursor = page
            .data
            .last()
            .map(|turn| turn.id.clone())
            .or_else(|| page.last_id.clone());
        self.next(page.has_more, cursor)
    }

    /// The parameters of the page after `page` in a list of turn items, or `None` when it
    /// was the last page (`has_more` false, or no `last_id`).
    ///
    /// Item lists are conversation cursor pages: the cursor is the response's `last_id`,
    /// which can differ from the last item's id (official SDK `item_list_params.py`).
    pub fn next_for_items(&self, page: &Page<Item>) -> Option<Self> {
        self.next(page.has_more, page.last_id.clone())
    }

    fn next(&self, has_more: bool, cursor: Option<String>) -> Option<Self> {
        match cursor {
            Some(after) if has_more && !after.is_empty() => Some(Self {
                after: Some(after),
                ..self.clone()
            }),
            _ => None,
        }
    }

    /// The query pairs to send, in the order `after`, `limit`, `order`.
    pub fn query_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(3);
        if let Some(after) = &self.after {
            pairs.push(("after", after.clone()));
        }
        if let Some(limit) = self.limit {
            pairs.push(("limit", limit.to_string()));
        }
        if let Some(order) = self.order {
            pairs.push(("order", order.as_str().to_owned()));
        }
        pairs
    }
}

/// The Agents API calls the controller makes (agents-api.md: endpoints the controller
/// uses). Implemented by [`crate::AgentsClient`]; tests of the controller can implement it
/// with a fake.
///
/// Every returned future is `Send`, so calls can run inside `tokio::spawn`. Every call is
/// retried per [`crate::RetryPolicy`] on 429, 5xx, timeouts and connection failures, and
/// fails fast on 404 ([`ApiError::NotFound`]) and other 4xx.
pub trait SessionsApi: Send + Sync {
    /// `GET /agents/sessions/{id}`: the session as it is now (agents-api.md: re-read the
    /// session before starting or stopping compute).
    ///
    /// # Errors
    /// [`ApiError::NotFound`] when the session is deleted or unknown; see [`ApiError`] for
    /// the rest.
    fn retrieve_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<Session, ApiError>> + Send;

    /// `DELETE /agents/sessions/{id}` with header `Idempotency-Key: {idempotency_key}`, so a
    /// retried delete is the same operation (agents-api.md: write calls accept an
    /// `Idempotency-Key`). It does not stop compute.
    ///
    /// # Errors
    /// [`ApiError::NotFound`] when the session is already gone (callers usually treat that
    /// as done); [`ApiError::InvalidArgument`] when the key is empty or not a valid header
    /// value; see [`ApiError`] for the rest.
    fn delete_session(
        &self,
        id: &SessionId,
        idempotency_key: &str,
    ) -> impl Future<Output = Result<SessionDeleted, ApiError>> + Send;

    /// `GET /agents/environments/{id}`: the `agent.environment` with its `status`
    /// (`connected` means an executor is attached).
    ///
    /// # Errors
    /// [`ApiError::NotFound`] for an unknown environment; see [`ApiError`] for the rest.
    fn retrieve_environment(
        &self,
        id: &EnvironmentId,
    ) -> impl Future<Output = Result<EnvironmentInfo, ApiError>> + Send;

    /// `GET /agents/sessions/{id}/turns?after=&limit=&order=`: one cursor page of turns.
    ///
    /// # Errors
    /// [`ApiError::InvalidArgument`] (no request sent) when `page.limit` is outside
    /// 1..=100; [`ApiError::NotFound`] for an unknown session; see [`ApiError`].
    fn list_turns(
        &self,
        session_id: &SessionId,
        page: &PageParams,
    ) -> impl Future<Output = Result<Page<Turn>, ApiError>> + Send;

    /// `GET /agents/sessions/{id}/turns/{turn_id}/items?after=&limit=&order=`: one cursor
    /// page of a turn's items (tool items carry their own `status`; a completed turn can
    /// hold a failed tool, agents-api.md).
    ///
    /// # Errors
    /// As [`SessionsApi::list_turns`]; also [`ApiError::InvalidArgument`] for an empty
    /// `turn_id`.
    fn list_turn_items(
        &self,
        session_id: &SessionId,
        turn_id: &str,
        page: &PageParams,
    ) -> impl Future<Output = Result<Page<Item>, ApiError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_bounds_are_inclusive() {
        for ok in [None, Some(1), Some(20), Some(100)] {
            let p = PageParams {
                limit: ok,
                ..PageParams::default()
            };
            assert!(p.validate().is_ok(), "{ok:?}");
        }
        for bad in [0, 101, u32::MAX] {
            let err = PageParams::latest(bad).validate().unwrap_err();
            assert!(
                err.to_string().contains(&bad.to_string()),
                "{err} should name {bad}"
            );
        }
    }

    #[test]
    fn query_pairs_skip_unset_values() {
        assert!(PageParams::default().query_pairs().is_empty());
        let p = PageParams {
            after: Some("turn_9".into()),
            limit: Some(5),
            order: Some(Order::Asc),
        };
        assert_eq!(
            p.query_pairs(),
            vec![
                ("after", "turn_9".to_owned()),
                ("limit", "5".to_owned()),
                ("order", "asc".to_owned())
            ]
        );
    }

    #[test]
    fn next_page_cursors_follow_the_sdk_rules() {
        let params = PageParams::latest(10);
        let turns: Page<Turn> = serde_json::from_value(serde_json::json!({
            "object": "list", "has_more": true,
            "data": [
                {"id": "turn_2", "object": "agent.session.turn", "session_id": "s",
                 "status": "completed", "created_at": 2},
                {"id": "turn_1", "object": "agent.session.turn", "session_id": "s",
                 "status": "completed", "created_at": 1}
            ]
        }))
        .unwrap();
        let next = params.next_for_turns(&turns).unwrap();
        assert_eq!(next.after.as_deref(), Some("turn_1"));
        assert_eq!((next.limit, next.order), (Some(10), Some(Order::Desc)));
        let last = Page {
            has_more: false,
            ..turns
        };
        assert_eq!(params.next_for_turns(&last), None);

        let items: Page<Item> = serde_json::from_value(serde_json::json!({
            "object": "list", "has_more": true, "last_id": "cursor_9",
            "data": [{"id": "item_1", "type": "message", "status": "completed"}]
        }))
        .unwrap();
        let next = params.next_for_items(&items).unwrap();
        assert_eq!(
            next.after.as_deref(),
            Some("cursor_9"),
            "last_id, not the item id"
        );
        let no_cursor = Page {
            last_id: None,
            ..items
        };
        assert_eq!(params.next_for_items(&no_cursor), None);
    }

    #[test]
    fn session_deleted_parses() {
        let d: SessionDeleted = serde_json::from_str(
            r#"{"id":"sess_1","object":"agent.session.deleted","deleted":true}"#,
        )
        .unwrap();
        assert_eq!(d.id, SessionId::new("sess_1"));
        assert!(d.deleted);
    }
}
