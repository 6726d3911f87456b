//! Application-managed provisioning (seeds 000 and 004: "your application can
//! start compute after creating a session"): with [`ProvisionOn::Created`], the
//! `agent.session.created` of a self-hosted session starts its first executor before any
//! input needs it (step 9 of [`super::decide`], beside a required connection).
//!
//! The event is a hint like any other (docs/ARCHITECTURE.md principle 1): the start is decided on the
//! session read just now — self-hosted, owned (the filter gates starts), not failed, not
//! deleted, its `remote_url` allowed (checked in step 8) — and only for a first
//! provisioning: no compute is active and the record never named one, so a late or
//! replayed `created` never restarts an executor the idle rules stopped. After the start
//! the idle rules are the same as for webhook-managed provisioning.

use super::View;
use crate::compute::ComputeInstance;
use crate::observed::{ProvisionOn, Trigger};
use crate::outcome::Decision;
use crate::session::{Session, SessionStatus};

impl View<'_> {
    /// The start on `agent.session.created`, when this deployment provisions on creation
    /// and nothing was ever provisioned for the environment; `None` otherwise.
    pub(super) fn provision_on_creation(
        &self,
        session: &Session,
        current: Option<&ComputeInstance>,
    ) -> Option<Decision> {
        if self.o.trigger != Trigger::SessionCreated
            || self.o.policy.provision_on != ProvisionOn::Created
            || current.is_some()
            || self.stopping
            || session.status == SessionStatus::Failed
            || self.remote_url_refused(session).is_some()
        {
            return None;
        }
        let never_provisioned = self
            .record
            .is_none_or(|r| r.instance.is_none() && r.generation.0 == 0);
        never_provisioned.then(|| self.ensure_compute(session, current))
    }
}
