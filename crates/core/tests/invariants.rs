//! Property tests of the decision's invariants over random observed states
//! (≥ 10,000 cases each; `PROPTEST_CASES` raises it).
//!
//! 1. never start while a live or starting compute exists that the same decision does not
//!    stop first;
//! 2. never stop a generation newer than the lease names, and never stop on a lease when a
//!    newer generation exists;
//! 3. never start or stop (or delete a session) on unavailable evidence;
//! 4. applying a decision and deciding again on the resulting state yields no further
//!    effect;
//! 5. only a current `environment_connection` requirement of an owned, self-hosted,
//!    not-closing session ever starts compute;
//! 6. never start while the recorded compute is not visible yet (recorded within the
//!    visibility window, absent from the provider's reads: ECS `MISSING`);
//! 7. never stop a running compute while a turn may run, unless the session is failed,
//!    deleted or closing.

mod support;

use proptest::prelude::*;
use sandbox_core::compute::{ComputeInstance, ComputeStatus, TASK_FAILED_TO_START};
use sandbox_core::decision::{Effect, StopReason, decide};
use sandbox_core::environment::EnvironmentStatus;
use sandbox_core::ids::{Generation, InstanceId};
use sandbox_core::observed::{
    EnvironmentRead, Inventory, Observed, SessionView, Trigger, TurnEvidence, Unavailable,
};
use sandbox_core::record::{Record, RecordStatus, ShutdownLease, StartFailure};
use sandbox_core::session::{Environment, RequiredAction, SessionStatus};
use sandbox_core::turn::{ItemStatus, TurnStatus};
use support::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn compute_status() -> impl Strategy<Value = ComputeStatus> {
    prop_oneof![
        Just(ComputeStatus::Provisioning),
        Just(ComputeStatus::Pending),
        Just(ComputeStatus::Running),
        Just(ComputeStatus::Stopping),
        Just(ComputeStatus::Stopped),
    ]
}

fn instances() -> impl Strategy<Value = Vec<ComputeInstance>> {
    prop::collection::vec(
        (
            1u64..5,
            compute_status(),
            prop::option::of(0u64..1200),
            prop::bool::weighted(0.2),
        ),
        0..4,
    )
    .prop_map(|v| {
        let mut seen = std::collections::BTreeSet::new();
        v.into_iter()
            .filter(|(g, _, _, _)| seen.insert(*g))
            .map(|(g, status, age, failed_to_start)| {
                let started = if status.is_starting() {
                    None
                } else {
                    age.map(|a| NOW - a)
                };
                let mut i = instance(&format!("task-{g}"), g, status, started);
                if status == ComputeStatus::Stopped && failed_to_start {
                    i.stop_code = Some(TASK_FAILED_TO_START.into());
                }
                i
            })
            .collect()
    })
}

fn lease_strategy() -> impl Strategy<Value = ShutdownLease> {
    (1u64..5, -400i64..400)
        .prop_map(|(g, due)| lease(&format!("task-{g}"), g, (NOW as i64 + due) as u64))
}

fn record_strategy() -> impl Strategy<Value = Option<Record>> {
    prop::option::of((
        0u64..5,
        any::<bool>(),
        prop_oneof![
            Just(RecordStatus::Active),
            Just(RecordStatus::Stopped),
            Just(RecordStatus::Closed)
        ],
        prop::option::of(lease_strategy()),
        prop::option::of((1u32..7, 0u64..5000)),
        prop::bool::weighted(0.15),
        prop::option::of(0u64..700),
        prop::option::of(0u64..700),
    ))
    .prop_map(|o| {
        o.map(
            |(g, has_instance, status, lease, failure, cleanup, recorded, requested)| {
                let id = format!("task-{g}");
                let mut r = record(g, (has_instance && g > 0).then_some(id.as_str()), status);
                r.instance_recorded_at = recorded.filter(|_| r.instance.is_some()).map(|a| NOW - a);
                r.connection_requested_at = requested.map(|a| NOW - a);
                r.lease = lease;
                r.start_failure = failure.map(|(attempts, ago)| StartFailure {
                    attempts,
                    last_failed_at: NOW - ago,
                    kind: Default::default(),
                    reason: "capacity".into(),
                });
                r.cleanup_required = cleanup;
                r
            },
        )
    })
}

fn session_view() -> impl Strategy<Value = SessionView> {
    let found = (
        prop_oneof![
            Just(SessionStatus::Idle),
            Just(SessionStatus::InProgress),
            Just(SessionStatus::RequiresAction),
            Just(SessionStatus::Failed),
            Just(SessionStatus::Unknown),
        ],
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(status, conn, fcall, hosted, other_agent)| {
            let mut actions = vec![];
            if conn {
                actions.push(connection_action());
            }
            if fcall {
                actions.push(function_call_action());
            }
            let mut s = session(status, actions);
            if hosted {
                s.environment = Environment::None;
            }
            if other_agent {
                // The filter (agent_ours) no longer accepts it: narrowed after the record.
                s.agent.id = "agent_theirs".into();
            }
            SessionView::Found {
                session: Box::new(s),
            }
        });
    prop_oneof![
        8 => found,
        1 => Just(SessionView::Deleted),
        1 => Just(SessionView::Unavailable { cause: Unavailable::ServerError }),
    ]
}

fn trigger(lease: Option<ShutdownLease>) -> impl Strategy<Value = Trigger> {
    let due = lease.map(|l| Trigger::LeaseDue { lease: l });
    let mut options = vec![
        Trigger::ConnectionRequested,
        Trigger::TurnStarted,
        Trigger::Idle,
        Trigger::Failed,
        Trigger::Sweep,
        Trigger::Close,
        Trigger::TimeoutReported {
            turn_id: None,
            submitted_at: 0,
        },
        Trigger::ResetStartFailures,
    ];
    options.extend(due);
    prop::sample::select(options)
}

fn observed() -> impl Strategy<Value = Observed> {
    (record_strategy(), lease_strategy())
        .prop_flat_map(|(record, other_lease)| {
            let lease = record
                .as_ref()
                .and_then(|r| r.lease.clone())
                .or(Some(other_lease));
            (
                Just(record),
                trigger(lease),
                session_view(),
                instances(),
                prop::bool::weighted(0.05),
                prop_oneof![
                    Just(EnvironmentRead::NotRead),
                    Just(EnvironmentRead::Unavailable),
                    Just(EnvironmentRead::Read {
                        status: EnvironmentStatus::Connected
                    }),
                    Just(EnvironmentRead::Read {
                        status: EnvironmentStatus::Disconnected
                    }),
                    Just(EnvironmentRead::Read {
                        status: EnvironmentStatus::Pending
                    }),
                ],
                prop::option::of((
                    prop_oneof![Just(TurnStatus::Completed), Just(TurnStatus::InProgress)],
                    any::<bool>(),
                )),
                -100i64..1000,
            )
        })
        .prop_map(
            |(record, trigger, view, instances, inventory_down, env_status, turn, shift)| {
                let mut o = observe_view(trigger, view);
                o.filter.agent_ids = vec![AGENT.into()];
                o.record = record;
                o.inventory = if inventory_down {
                    Inventory::Unavailable
                } else {
                    Inventory::Known { instances }
                };
                o.environment_status = env_status;
                o.latest_turn = turn.map(|(status, broken)| TurnEvidence {
                    turn_id: "turn_1".into(),
                    status,
                    broken_tools: if broken {
                        vec![(
                            "item_1".into(),
                            "command_execution".into(),
                            ItemStatus::Failed,
                        )]
                    } else {
                        vec![]
                    },
                });
                o.now = (NOW as i64 + shift) as u64;
                o
            },
        )
}

fn known(o: &Observed) -> Vec<ComputeInstance> {
    match &o.inventory {
        Inventory::Known { instances } => instances.clone(),
        Inventory::Unavailable => vec![],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn never_starts_while_a_live_or_starting_compute_is_left_running(o in observed()) {
        let d = decide(&o);
        let mut stopped: Vec<InstanceId> = vec![];
        for e in &d.effects {
            match e {
                Effect::StopCompute(s) => stopped.push(s.target.instance_id.clone()),
                Effect::StartCompute(_) => {
                    for i in known(&o) {
                        prop_assert!(
                            !i.status.is_live() || stopped.contains(&i.instance_id),
                            "start while {:?} is {:?}: {:?}", i.instance_id, i.status, d
                        );
                    }
                }
                _ => {}
            }
        }
        prop_assert!(d.effects.iter().filter(|e| matches!(e, Effect::StartCompute(_))).count() <= 1);
    }

    #[test]
    fn never_stops_a_generation_newer_than_the_lease_names(o in observed()) {
        let d = decide(&o);
        let lease = match &o.trigger {
            Trigger::LeaseDue { lease } => Some(lease.clone()),
            _ => o.record.as_ref().and_then(|r| r.lease.clone()),
        };
        // The newest compute the provider reports alive (the provider is the authority: a
        // record naming an instance the provider does not list is not a compute).
        // A divergent compute the same decision stops first does not count.
        let stopped_first: Vec<&InstanceId> = d.effects.iter().filter_map(|e| match e {
            Effect::StopCompute(s) if s.reason == StopReason::Divergent => Some(&s.target.instance_id),
            _ => None,
        }).collect();
        let newest = known(&o).iter()
            .filter(|i| i.status.is_active() && !stopped_first.contains(&&i.instance_id))
            .map(|i| i.generation)
            .max().unwrap_or(Generation(0));
        for e in &d.effects {
            if let Effect::StopCompute(s) = e
                && s.reason == StopReason::LeaseExpired
            {
                let lease = lease.clone().expect("a lease-driven stop needs a lease");
                prop_assert_eq!(&s.target, &lease.target);
                prop_assert!(s.target.generation >= newest, "newer generation exists: {:?}", d);
            }
        }
    }

    #[test]
    fn never_starts_or_stops_on_unavailable_evidence(o in observed()) {
        let d = decide(&o);
        let missing = matches!(o.session, SessionView::Unavailable { .. })
            || o.inventory == Inventory::Unavailable;
        if missing {
            prop_assert!(!d.touches_resources(), "{:?}", d);
        }
    }

    #[test]
    fn deciding_again_after_applying_a_decision_yields_no_further_effect(o in observed()) {
        let d = decide(&o);
        let next = apply(&o, &d);
        let again = decide(&next);
        prop_assert!(again.effects.is_empty(), "first {:?}\nthen {:?}\non {:?}", d, again, o);
    }

    #[test]
    fn only_a_current_connection_requirement_of_an_owned_open_session_starts(o in observed()) {
        let d = decide(&o);
        if d.effects.iter().any(|e| matches!(e, Effect::StartCompute(_))) {
            let SessionView::Found { session } = &o.session else {
                return Err(TestCaseError::fail("start without a session"));
            };
            prop_assert!(
                session.required_actions.iter().any(|a| matches!(a, RequiredAction::EnvironmentConnection { .. })),
                "start without a connection requirement: {:?}", d
            );
            prop_assert!(session.self_hosted().is_some());
            prop_assert!(session.status != SessionStatus::Failed);
            prop_assert!(o.record.as_ref().is_none_or(|r| !r.cleanup_required && r.status != RecordStatus::Closed));
            prop_assert!(o.trigger != Trigger::Close);
        }
    }

    #[test]
    fn never_starts_while_the_recorded_compute_is_not_visible_yet(o in observed()) {
        let d = decide(&o);
        let Some(r) = o.record.as_ref().filter(|r| r.claims_compute()) else { return Ok(()) };
        let named = r.instance.as_ref().unwrap();
        let absent = !known(&o).iter().any(|i| i.instance_id == named.instance_id);
        let recent = r
            .instance_recorded_at
            .is_some_and(|at| o.now < at + o.policy.visibility_window_secs);
        if absent && recent {
            prop_assert!(
                !d.effects.iter().any(|e| matches!(e, Effect::StartCompute(_))),
                "start while {:?} is not visible yet: {:?}", named, d
            );
        }
    }

    #[test]
    fn never_stops_a_running_compute_while_a_turn_may_run(o in observed()) {
        let d = decide(&o);
        let SessionView::Found { session } = &o.session else { return Ok(()) };
        let turn = o.latest_turn.as_ref().is_some_and(|t| t.status.is_active());
        let paused = session.status == SessionStatus::RequiresAction
            && !session.requires_connection_of(&o.environment_id);
        let busy = session.status == SessionStatus::InProgress || paused || turn;
        let closing = o.trigger == Trigger::Close
            || o.record.as_ref().is_some_and(|r| r.cleanup_required || r.status == RecordStatus::Closed);
        if !busy || closing || session.status == SessionStatus::Failed {
            return Ok(());
        }
        let running: Vec<InstanceId> = known(&o)
            .into_iter()
            .filter(|i| i.status == ComputeStatus::Running)
            .map(|i| i.instance_id)
            .collect();
        for e in &d.effects {
            if let Effect::StopCompute(s) = e {
                prop_assert!(
                    s.reason == StopReason::Replaced || !running.contains(&s.target.instance_id),
                    "stopped running {:?} while a turn may run: {:?}", s.target, d
                );
            }
        }
    }
}
