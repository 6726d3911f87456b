//! The unit of work on the queues: "look at this environment because of this trigger".

use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use serde::{Deserialize, Serialize};

/// A queued job. Serialized as the message body (JSON) on both queues.
///
/// A job is a hint, never an instruction (DESIGN.md principle 1): the worker re-reads the
/// session, the record and the provider before deciding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Why the controller should look.
    pub trigger: Trigger,
    /// The session concerned.
    pub session_id: SessionId,
    /// The environment, when the event or the record named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<EnvironmentId>,
    /// The `webhook-id` of the delivery (the de-duplication key), for webhook jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_id: Option<String>,
    /// When the job was enqueued, Unix seconds.
    pub enqueued_at: u64,
    /// How many times this job was handed off to the timers queue because it could not
    /// be processed then (busy lock, missing evidence, a failed effect); each hand-off
    /// doubles the delay ([`Controller::hand_off`](crate::Controller::hand_off)). 0 (and
    /// absent from the JSON) for a fresh job.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub handoffs: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Job {
    /// The FIFO message group: the session id (ordering per session).
    pub fn group(&self) -> &str {
        self.session_id.as_str()
    }
}
