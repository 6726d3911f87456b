//! Triggers and evidence: what is not compute's business, what cannot be decided on the
//! evidence read, and what the controller answers for (steps 1 to 4 of [`super::decide`]).
//!
//! Lifecycle rows decided here (`shared/reference/lifecycle-cases.md`):
//! - row 3: an `action_required` of another type, or an event that does not concern
//!   compute: ignore;
//! - row 21: a timed-out submission is reconciled from turn evidence only, never retried;
//! - row 22: the session or the inventory could not be read: uncertain, change nothing;
//! - row 23: the environment is not `self_hosted`: ignore;
//! - row 24: the ownership filter rejects the session: ignore, unless this deployment
//!   already has a record or a compute for it (then nothing new starts, but it is still
//!   released);
//! - a recorded compute the provider does not show yet counts as starting for
//!   `Policy::visibility_window_secs` (docs/ARCHITECTURE.md principle 7), which every
//!   later row relies on.

use super::View;
use crate::compute::{ComputeInstance, ComputeStatus};
use crate::observed::{Inventory, Observed, SessionView, Trigger};
use crate::outcome::{Decision, Outcome};
use crate::reason::Reason;
use crate::record::Record;

/// Row 3 and unknown events: triggers that are not compute's business.
pub(super) fn not_about_compute(o: &Observed) -> Option<Decision> {
    match &o.trigger {
        Trigger::OtherActionRequired { .. } => Some(Decision::ignore(Reason::NotAComputeAction)),
        Trigger::OtherEvent { .. } => Some(Decision::ignore(Reason::UnrelatedEvent)),
        _ => None,
    }
}

/// Row 22: the session and the provider's inventory must both have been read; the
/// inventory's instances when they were.
pub(super) fn evidence_read(o: &Observed) -> Result<&[ComputeInstance], Decision> {
    // Uncertain means hands off (docs/ARCHITECTURE.md principle 6, row 22).
    if let SessionView::Unavailable { cause } = &o.session {
        return Err(Decision::new(
            Outcome::Uncertain,
            Reason::SessionUnavailable { cause: *cause },
        )
        .recheck(o.policy.uncertain_retry_secs));
    }
    let Inventory::Known { instances } = &o.inventory else {
        return Err(
            Decision::new(Outcome::Uncertain, Reason::InventoryUnavailable)
                .recheck(o.policy.uncertain_retry_secs),
        );
    };
    Ok(instances)
}

/// Row 21: a timed-out submission is answered from the turn evidence alone.
pub(super) fn timed_out_submission(o: &Observed) -> Option<Decision> {
    if !matches!(o.trigger, Trigger::TimeoutReported { .. }) {
        return None;
    }
    Some(match &o.latest_turn {
        None if o.turn_not_found => Decision::new(Outcome::Reconcile, Reason::SubmissionNotFound),
        None => Decision::new(Outcome::Uncertain, Reason::SubmissionOutcomeUnknown)
            .recheck(o.policy.uncertain_retry_secs),
        Some(t) => Decision::new(
            Outcome::Reconcile,
            Reason::SubmissionFound {
                turn_id: t.turn_id.clone(),
                status: t.status,
            },
        ),
    })
}

/// The compute the record names, as a `Provisioning` stand-in, when the provider does not
/// show it (absent or `MISSING`) and it was recorded less than
/// [`crate::observed::Policy::visibility_window_secs`] ago: ECS reads are eventually
/// consistent right after `RunTask`, so absence then is "not visible yet", never "gone".
pub(super) fn not_visible_yet(
    o: &Observed,
    instances: &[ComputeInstance],
) -> Option<ComputeInstance> {
    let record = o.record.as_ref().filter(|r| r.claims_compute())?;
    let named = record.current()?;
    if instances
        .iter()
        .filter(|i| i.environment_id == o.environment_id)
        .any(|i| i.instance_id == named.instance_id)
    {
        return None;
    }
    let recorded_at = record.instance_recorded_at?;
    (o.now < recorded_at.saturating_add(o.policy.visibility_window_secs)).then(|| ComputeInstance {
        instance_id: named.instance_id.clone(),
        environment_id: o.environment_id.clone(),
        session_id: Some(record.session_id.clone()),
        generation: named.generation,
        status: ComputeStatus::Provisioning,
        started_at: None,
        stop_code: None,
        exit: None,
    })
}

impl<'a> View<'a> {
    /// Rows 23 and 24, then the view every later check reads: this environment's
    /// instances, the active ones with `unseen` (the recorded compute not visible yet)
    /// counted among them.
    pub(super) fn of(
        o: &'a Observed,
        instances: &'a [ComputeInstance],
        unseen: Option<&'a ComputeInstance>,
    ) -> Result<Self, Decision> {
        let mine: Vec<&ComputeInstance> = instances
            .iter()
            .filter(|i| i.environment_id == o.environment_id)
            .collect();
        let mut active: Vec<&ComputeInstance> = mine
            .iter()
            .copied()
            .filter(|i| i.status.is_active())
            .collect();
        // The filter gates new starts only: a record or a compute of this deployment stays
        // its responsibility (release on failure, deletion, idle, close) if the filter
        // narrows.
        let mut may_start = true;
        let session = match &o.session {
            SessionView::Found { session } => {
                if session.self_hosted().is_none() {
                    return Err(Decision::ignore(Reason::NotSelfHosted));
                }
                if !o.filter.accepts(session) {
                    if o.record.is_none() && active.is_empty() {
                        return Err(Decision::ignore(Reason::NotOwned));
                    }
                    may_start = false;
                }
                Some(session.as_ref())
            }
            _ => None,
        };
        // A recorded compute the provider does not show yet counts as starting
        // (principle 7).
        active.extend(unseen);
        Ok(View {
            o,
            session,
            record: o.record.as_ref(),
            active,
            unseen: unseen.map(|i| &i.instance_id),
            recorded_seen: o.record.as_ref().and_then(Record::current).and_then(|r| {
                mine.iter()
                    .copied()
                    .find(|i| i.instance_id == r.instance_id)
            }),
            may_start,
            stopping: mine.iter().any(|i| i.status == ComputeStatus::Stopping),
            max_generation: mine
                .iter()
                .map(|i| i.generation)
                .chain(o.record.as_ref().map(|r| r.generation))
                .max()
                .unwrap_or_default(),
        })
    }

    /// A `Wait` while the recorded compute is not visible yet: its stop could be neither
    /// sent nor confirmed, and it must not be forgotten.
    pub(super) fn awaiting_visibility(&self) -> Option<Decision> {
        self.unseen?;
        let recorded_at = self.record.and_then(|r| r.instance_recorded_at)?;
        Some(
            Decision::new(
                Outcome::Wait,
                Reason::ComputeNotVisibleYet {
                    recorded_secs: self.o.now.saturating_sub(recorded_at),
                },
            )
            .recheck(self.o.policy.recheck_secs),
        )
    }
}
