//! The unit of work on the queues: "look at this environment because of this trigger".

use sandbox_core::compute::ComputeInstance;
use sandbox_core::ids::{EnvironmentId, SessionId};
use sandbox_core::observed::Trigger;
use sandbox_core::record::Record;
use serde::{Deserialize, Serialize};

/// A queued job. Serialized as the message body (JSON) on both queues.
///
/// A job is a hint, never an instruction (docs/ARCHITECTURE.md principle 1): the worker re-reads the
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
    /// What the sweep read about the environment, for a [`Trigger::Sweep`] job the sweep
    /// planned: the job decides on it without reading the provider again while it is
    /// current ([`SweptEvidence::is_current`]). `None` (absent from the JSON) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swept: Option<SweptEvidence>,
    /// An operator's proof that this job was forced
    /// ([`sandbox_core::operator_proof`]): base64 of the HMAC-SHA256 tag over the job's
    /// kind, session, `enqueued_at` and trigger, with the operator key. Needed only by a
    /// `close`, `resolve` or `timeout_reported` job for a session no record names (the
    /// worker refuses such a job without it). `None` (absent from the JSON) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_proof: Option<String>,
}

/// One environment's share of a sweep's inventory (docs/ARCHITECTURE.md principle 7: one inventory
/// per sweep, shared by the per-environment decisions), carried by its sweep job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweptEvidence {
    /// When the sweep read the provider and the registry, Unix seconds.
    pub read_at: u64,
    /// The record's version as the sweep read it (`None`: no record).
    pub record_version: Option<u64>,
    /// The environment's instances as the sweep read them: its live tasks from the
    /// deployment's list, plus the recorded instance read by id. A recorded instance that
    /// is absent was answered `MISSING`.
    pub instances: Vec<ComputeInstance>,
}

impl SweptEvidence {
    /// Whether a decision may use this evidence instead of reading the provider: the
    /// record is still the version the sweep saw (no start, adoption or stop was recorded
    /// since), the evidence is at most `max_age_secs` old at `now` (Unix seconds), and it
    /// holds every instance the record names (its active compute, its lease's target).
    ///
    /// Why that is enough: what a stale read can get wrong is bounded. A stopped or gone
    /// instance stays stopped or gone (a start decided on it replays its deterministic
    /// idempotency token); anything started under the lock changes the record's version;
    /// an orphan or a divergent instance is read again by id before it is stopped.
    ///
    /// A recorded instance the sweep did not get back was `MISSING` at `read_at`: right
    /// after `RunTask` that means "not visible yet", which does not stay true. Decided
    /// later (a fanned-out job waits up to 900 s), its absence would be judged against
    /// the visibility window at `now` and read as "gone", and a second task would start;
    /// so such evidence is not current and the worker reads the instance by id.
    pub fn is_current(&self, record: Option<&Record>, now: u64, max_age_secs: u64) -> bool {
        let has = |id: &sandbox_core::ids::InstanceId| {
            self.instances.iter().any(|i| &i.instance_id == id)
        };
        let named_seen = record.is_none_or(|r| {
            let claimed = r.claims_compute().then(|| r.current()).flatten();
            claimed
                .into_iter()
                .chain(r.lease.as_ref().map(|l| &l.target))
                .all(|i| has(&i.instance_id))
        });
        self.record_version == record.map(|r| r.version)
            && now <= self.read_at.saturating_add(max_age_secs)
            && named_seen
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The application's `timeout_reported` message (events/jobs/) is a job the
    /// worker reads as it is documented.
    #[test]
    fn the_documented_timeout_reported_message_is_a_job() {
        let body = include_str!("../../../events/jobs/timeout_reported.json");
        let job: Job = serde_json::from_str(body).unwrap();
        assert_eq!(
            job.trigger,
            Trigger::TimeoutReported {
                turn_id: Some("turn_5d1e0c7a2b9f4e38a6c1d2e3".into()),
                submitted_at: 1_764_400_300
            }
        );
        assert_eq!(job.session_id.as_str(), "sess_efaeacbf3a9b230e7ddadaf0");
        assert_eq!(job.webhook_id, None);
        assert_eq!(job.handoffs, 0);
        // Without a turn id, and without an environment id.
        let job: Job = serde_json::from_str(
            r#"{"trigger":{"kind":"timeout_reported","submitted_at":5},"session_id":"s","enqueued_at":6}"#,
        )
        .unwrap();
        assert_eq!(
            job.trigger,
            Trigger::TimeoutReported {
                turn_id: None,
                submitted_at: 5
            }
        );
    }
}
