//! Settings from environment variables: every missing or invalid variable is named, no
//! value is ever repeated.

use sandbox_lambda::settings::{
    ControllerSettings, SettingsError, WebhookSettings, queue_name_of_url,
};
use std::collections::HashMap;

const EVENTS: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-jobs.fifo";
const TIMERS: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-timers";
const SWEEP: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-sweep";

fn controller_env() -> HashMap<&'static str, String> {
    [
        ("EVENTS_QUEUE_URL", EVENTS),
        (
            "EVENTS_DLQ_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/sandbox-lifecycle-jobs-dlq.fifo",
        ),
        ("TIMERS_QUEUE_URL", TIMERS),
        ("SWEEP_QUEUE_URL", SWEEP),
        ("TABLE_NAME", "sandbox-lifecycle"),
        ("ECS_CLUSTER", "sandbox-executors"),
        ("TASK_DEFINITION", "codex-exec-server:7"),
        ("CONTAINER_NAME", "executor"),
        ("SUBNETS", "subnet-0a1b2c3d, subnet-4e5f6a7b"),
        ("SECURITY_GROUPS", "sg-0123456789abcdef0"),
        ("ASSIGN_PUBLIC_IP", "ENABLED"),
        ("DEPLOYMENT_ID", "prod-eu"),
        ("AGENT_IDS", "agent_1,agent_2"),
        ("WORKSPACE_DIRECTORY", "/workspace"),
        ("SHUTDOWN_GRACE_SECS", "120"),
        ("CONNECT_DEADLINE_SECS", "240"),
        ("SNAPSHOT_KEEP", "3"),
        ("SNAPSHOT_WAIT_SECS", "7200"),
        ("SNAPSHOT_RECHECK_SECS", "45"),
        ("CLOSE_WORKSPACE", "delete"),
        (
            "OPENAI_API_KEY_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:openai-key-AbCdEf",
        ),
        ("AWS_LAMBDA_FUNCTION_NAME", "sandbox-lifecycle-worker"),
        (
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "2025/11/29/[$LATEST]0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

fn controller(env: &HashMap<&'static str, String>) -> Result<ControllerSettings, SettingsError> {
    ControllerSettings::from_lookup(|k| env.get(k).cloned())
}

#[test]
fn complete_controller_environment_parses_every_variable() {
    let s = controller(&controller_env()).unwrap();
    assert!(s.events_queue_fifo);
    assert_eq!(s.timers_queue_url, TIMERS);
    assert_eq!(s.sweep_queue_url, SWEEP);
    assert_eq!(s.table_name, "sandbox-lifecycle");
    assert_eq!(s.ecs.subnets, ["subnet-0a1b2c3d", "subnet-4e5f6a7b"]);
    assert_eq!(s.ecs.security_groups, ["sg-0123456789abcdef0"]);
    assert!(s.ecs.assign_public_ip);
    assert_eq!(s.controller.deployment.as_str(), "prod-eu");
    assert_eq!(s.controller.filter.agent_ids, ["agent_1", "agent_2"]);
    assert_eq!(
        s.controller.filter.workspace_directory.as_deref(),
        Some("/workspace")
    );
    assert_eq!(s.controller.policy.shutdown_grace_secs, 120);
    assert_eq!(s.controller.policy.connect_deadline_secs, 240);
    assert_eq!(s.controller.policy.snapshot_keep, 3);
    assert_eq!(s.controller.policy.snapshot_wait_secs, 7_200);
    assert_eq!(s.controller.policy.snapshot_recheck_secs, 45);
    assert_eq!(
        s.controller.policy.close_workspace,
        sandbox_core::workspace::CloseWorkspace::Delete
    );
    assert_eq!(s.agents_api_base_url, "https://api.openai.com/v1");
    assert_eq!(s.api_key_secret().unwrap().var, "OPENAI_API_KEY_SECRET_ARN");
    assert_eq!(s.aws_endpoint_url, None);
    assert_eq!(
        s.controller.worker_id,
        "sandbox-lifecycle-worker/2025/11/29/[$LATEST]0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    );
}

#[test]
fn optional_controller_variables_take_their_defaults() {
    let mut env = controller_env();
    for k in [
        "EVENTS_DLQ_URL",
        "SECURITY_GROUPS",
        "ASSIGN_PUBLIC_IP",
        "AGENT_IDS",
        "WORKSPACE_DIRECTORY",
        "SHUTDOWN_GRACE_SECS",
        "CONNECT_DEADLINE_SECS",
        "SNAPSHOT_KEEP",
        "SNAPSHOT_WAIT_SECS",
        "SNAPSHOT_RECHECK_SECS",
        "CLOSE_WORKSPACE",
    ] {
        env.remove(k);
    }
    env.insert("AGENTS_API_BASE_URL", "   ".into()); // blank counts as unset
    let s = controller(&env).unwrap();
    assert_eq!(s.events_dlq_url, None);
    assert!(s.ecs.security_groups.is_empty());
    assert!(!s.ecs.assign_public_ip);
    assert!(s.controller.filter.agent_ids.is_empty());
    assert_eq!(s.controller.filter.workspace_directory, None);
    assert_eq!(s.controller.policy.shutdown_grace_secs, 300);
    assert_eq!(s.controller.policy.connect_deadline_secs, 180);
    assert_eq!(s.controller.policy.snapshot_keep, 1);
    assert_eq!(s.controller.policy.snapshot_wait_secs, 14_400);
    assert_eq!(s.controller.policy.snapshot_recheck_secs, 30);
    assert_eq!(
        s.controller.policy.close_workspace,
        sandbox_core::workspace::CloseWorkspace::Retain { days: 7 }
    );
    assert_eq!(s.agents_api_base_url, "https://api.openai.com/v1");
}

#[test]
fn each_missing_required_controller_variable_is_named_in_the_error() {
    for var in [
        "EVENTS_QUEUE_URL",
        "TIMERS_QUEUE_URL",
        "SWEEP_QUEUE_URL",
        "TABLE_NAME",
        "ECS_CLUSTER",
        "TASK_DEFINITION",
        "CONTAINER_NAME",
        "SUBNETS",
        "DEPLOYMENT_ID",
    ] {
        let mut env = controller_env();
        env.remove(var);
        let err = controller(&env).unwrap_err();
        assert_eq!(err, SettingsError::Missing { var }, "{var}");
        assert_eq!(
            err.to_string(),
            format!("environment variable {var} is not set")
        );
    }
}

/// The sweeper reads no session, so its settings parse without the API key's
/// secret; what reads sessions (the worker's cold start, `sandboxctl close`) asks for it
/// through `api_key_secret()`, which names the variable.
#[test]
fn the_api_key_secret_is_needed_only_by_what_reads_sessions() {
    let mut env = controller_env();
    env.remove("OPENAI_API_KEY_SECRET_ARN");
    let s = controller(&env).unwrap();
    assert_eq!(s.api_key_secret, None);
    let err = s.api_key_secret().unwrap_err();
    assert_eq!(
        err,
        SettingsError::Missing {
            var: "OPENAI_API_KEY_SECRET_ARN"
        }
    );
    assert_eq!(
        err.to_string(),
        "environment variable OPENAI_API_KEY_SECRET_ARN is not set"
    );
}

#[test]
fn invalid_controller_values_name_the_variable_and_never_repeat_the_value() {
    for (var, value) in [
        ("SHUTDOWN_GRACE_SECS", "5m"),
        ("SHUTDOWN_GRACE_SECS", "-1"),
        ("CONNECT_DEADLINE_SECS", "0"),
        ("SNAPSHOT_KEEP", "0"),
        ("SNAPSHOT_KEEP", "all"),
        ("SNAPSHOT_WAIT_SECS", "0"),
        ("SNAPSHOT_WAIT_SECS", "4h"),
        ("SNAPSHOT_RECHECK_SECS", "0"),
        ("CLOSE_WORKSPACE", "retain:0"),
        ("CLOSE_WORKSPACE", "keep-forever"),
        ("ASSIGN_PUBLIC_IP", "maybe"),
        ("DEPLOYMENT_ID", "prod/eu west"),
        ("SUBNETS", "subnet-1,,subnet-2"),
        ("EVENTS_QUEUE_URL", "sandbox-lifecycle-jobs.fifo"),
        (
            "TIMERS_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/timers.fifo",
        ),
        (
            "SWEEP_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/sweep.fifo",
        ),
        ("SWEEP_QUEUE_URL", TIMERS),
        ("AGENTS_API_BASE_URL", "api.openai.com"),
        (
            "OPENAI_API_KEY_SECRET_ARN",
            "sk-proj-THISISAKEYPASTEDBYMISTAKE",
        ),
    ] {
        let mut env = controller_env();
        env.insert(var, value.into());
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{var}={value}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.starts_with(&format!("environment variable {var} is invalid: ")));
        assert!(!message.contains(value), "{message}");
    }
}

#[test]
fn webhook_needs_only_the_events_queue_and_the_secret_arn() {
    let env: HashMap<&str, &str> = [
        ("EVENTS_QUEUE_URL", EVENTS),
        (
            "WEBHOOK_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-AbCdEf",
        ),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
    ]
    .into();
    let s = WebhookSettings::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
    assert!(s.events_queue_fifo);
    assert_eq!(s.webhook_secret.var, "WEBHOOK_SECRET_ARN");
    assert_eq!(s.aws_endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));

    let err =
        WebhookSettings::from_lookup(|k| (k == "EVENTS_QUEUE_URL").then(|| EVENTS.to_owned()))
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "environment variable WEBHOOK_SECRET_ARN is not set"
    );

    let err = WebhookSettings::from_lookup(|k| match k {
        "EVENTS_QUEUE_URL" => Some(EVENTS.to_owned()),
        "WEBHOOK_SECRET_ARN" => Some("whsec_d0jBWkxw8kwXPSTcgFkLyF4RsJ2W0Xo2SjxObaPtVAc=".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(err.to_string().contains("WEBHOOK_SECRET_ARN"));
    assert!(!err.to_string().contains("whsec_"));
}

#[test]
fn queue_name_is_the_last_segment_of_the_url() {
    assert_eq!(queue_name_of_url(EVENTS), "sandbox-lifecycle-jobs.fifo");
    assert_eq!(
        queue_name_of_url("http://127.0.0.1:5000/123456789012/timers/"),
        "timers"
    );
}

// ----------------------------------------------------------------- ceilings

#[test]
fn ceilings_default_when_unset() {
    let s = controller(&controller_env()).unwrap();
    let p = &s.controller.policy;
    assert_eq!(
        (
            p.max_lifetime_secs,
            p.lifetime_hard_cap_secs,
            p.no_work_secs,
            p.max_replacements,
            p.replacement_window_secs
        ),
        (28_800, 32_400, 3_600, 3, 3_600)
    );
    assert_eq!(p.remote_url_allowlist.entries(), ["api.openai.com"]);
    assert_eq!(p.max_executors, 0, "the concurrency cap is off by default");
}

#[test]
fn ceilings_are_read_from_their_variables() {
    let mut env = controller_env();
    for (k, v) in [
        ("MAX_LIFETIME_SECS", "3600"),
        ("LIFETIME_HARD_CAP_SECS", "0"),
        ("NO_WORK_SECS", "0"),
        ("MAX_REPLACEMENTS", "5"),
        ("REPLACEMENT_WINDOW_SECS", "600"),
        ("REMOTE_URL_ALLOWLIST", "api.openai.com, *.corp.example"),
        ("MAX_EXECUTORS", "50"),
    ] {
        env.insert(k, v.into());
    }
    let p = controller(&env).unwrap().controller.policy;
    assert_eq!(p.max_executors, 50);
    assert_eq!(p.max_lifetime_secs, 3_600);
    assert_eq!(p.lifetime_hard_cap_secs, 0);
    assert_eq!(p.no_work_secs, 0);
    assert_eq!(p.max_replacements, 5);
    assert_eq!(p.replacement_window_secs, 600);
    assert_eq!(
        p.remote_url_allowlist.entries(),
        ["api.openai.com", "*.corp.example"]
    );
}

#[test]
fn invalid_ceilings_name_the_variable_and_never_repeat_the_value() {
    for (var, value) in [
        ("MAX_LIFETIME_SECS", "8h"),
        ("NO_WORK_SECS", "-5"),
        ("MAX_REPLACEMENTS", "99999999999"),
        ("MAX_EXECUTORS", "99999999999"),
        ("MAX_EXECUTORS", "ten"),
        ("REPLACEMENT_WINDOW_SECS", "0"),
        ("REMOTE_URL_ALLOWLIST", "user@evil.example"),
        ("REMOTE_URL_ALLOWLIST", "a.*.example"),
    ] {
        let mut env = controller_env();
        env.insert(var, value.into());
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{var}={value}: {err:?}"
        );
        assert!(!err.to_string().contains(value), "{err}");
    }
    // A hard cap below the lifetime.
    let mut env = controller_env();
    env.insert("MAX_LIFETIME_SECS", "7200".into());
    env.insert("LIFETIME_HARD_CAP_SECS", "3600".into());
    let err = controller(&env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("environment variable LIFETIME_HARD_CAP_SECS is invalid"),
        "{err}"
    );
}

#[test]
fn webhook_reads_the_previous_secret_arn_and_the_tolerance() {
    let env: HashMap<&str, &str> = [
        ("EVENTS_QUEUE_URL", EVENTS),
        (
            "WEBHOOK_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-new",
        ),
        (
            "WEBHOOK_PREVIOUS_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-old",
        ),
        ("WEBHOOK_TOLERANCE_SECS", "120"),
    ]
    .into();
    let s = WebhookSettings::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
    let previous = s.previous_webhook_secret.unwrap();
    assert_eq!(previous.var, "WEBHOOK_PREVIOUS_SECRET_ARN");
    assert!(previous.arn.ends_with("webhook-old"));
    assert_eq!(s.tolerance_secs, 120);

    let defaults = WebhookSettings::from_lookup(|k| match k {
        "EVENTS_QUEUE_URL" => Some(EVENTS.to_owned()),
        "WEBHOOK_SECRET_ARN" => Some("arn:aws:secretsmanager:us-east-1:1:secret:w".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(defaults.previous_webhook_secret, None);
    assert_eq!(defaults.tolerance_secs, 300);

    for (var, value) in [
        ("WEBHOOK_TOLERANCE_SECS", "0"),
        ("WEBHOOK_TOLERANCE_SECS", "five"),
        // Capped at 900 s (replays past the FIFO deduplication otherwise).
        ("WEBHOOK_TOLERANCE_SECS", "901"),
        ("WEBHOOK_PREVIOUS_SECRET_ARN", "whsec_pastedthesecretitself"),
    ] {
        let err = WebhookSettings::from_lookup(|k| match k {
            "EVENTS_QUEUE_URL" => Some(EVENTS.to_owned()),
            "WEBHOOK_SECRET_ARN" => Some("arn:aws:secretsmanager:us-east-1:1:secret:w".into()),
            k if k == var => Some(value.to_owned()),
            _ => None,
        })
        .unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{var}={value}: {err:?}"
        );
        assert!(!err.to_string().contains(value));
    }
}

const INFRA_ROLE: &str = "arn:aws:iam::123456789012:role/sandbox-ecs-infrastructure";

#[test]
fn workspace_volumes_are_off_unless_the_infrastructure_role_is_set() {
    let s = controller(&controller_env()).unwrap();
    assert_eq!(s.ecs.workspace, None, "unset: no workspace kept (`none`)");
}

#[test]
fn workspace_volume_settings_are_read_with_their_default_type() {
    let mut env = controller_env();
    env.insert("ECS_INFRASTRUCTURE_ROLE_ARN", INFRA_ROLE.into());
    env.insert("WORKSPACE_VOLUME_GIB", "30".into());
    let ws = controller(&env).unwrap().ecs.workspace.unwrap();
    assert_eq!(ws.infrastructure_role_arn, INFRA_ROLE);
    assert_eq!(ws.size_gib, 30);
    assert_eq!(ws.volume_type, "gp3");
    env.insert("WORKSPACE_VOLUME_TYPE", "io2".into());
    env.insert("WORKSPACE_VOLUME_IOPS", "3000".into());
    let ws = controller(&env).unwrap().ecs.workspace.unwrap();
    assert_eq!(ws.volume_type, "io2");
    assert_eq!(ws.iops, Some(3000));
}

/// Only volumes `RunTask` accepts (ECS API reference,
/// TaskManagedEBSVolumeConfiguration): each type's size range, `iops` where the type needs
/// or takes it, `throughput` on gp3 only; every mistake fails at start-up naming the
/// variable at fault.
#[test]
fn workspace_volumes_run_task_would_refuse_fail_at_start_up_naming_the_mistake() {
    let refused: &[(&[(&str, &str)], &str)] = &[
        (&[("WORKSPACE_VOLUME_TYPE", "io1")], "WORKSPACE_VOLUME_IOPS"),
        (&[("WORKSPACE_VOLUME_TYPE", "io2")], "WORKSPACE_VOLUME_IOPS"),
        (&[("WORKSPACE_VOLUME_TYPE", "st1")], "WORKSPACE_VOLUME_GIB"),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "sc1"),
                ("WORKSPACE_VOLUME_GIB", "124"),
            ],
            "WORKSPACE_VOLUME_GIB",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io2"),
                ("WORKSPACE_VOLUME_GIB", "3"),
                ("WORKSPACE_VOLUME_IOPS", "100"),
            ],
            "WORKSPACE_VOLUME_GIB",
        ),
        (
            &[("WORKSPACE_VOLUME_TYPE", "standard")],
            "WORKSPACE_VOLUME_TYPE",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "gp2"),
                ("WORKSPACE_VOLUME_IOPS", "3000"),
            ],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "st1"),
                ("WORKSPACE_VOLUME_GIB", "500"),
                ("WORKSPACE_VOLUME_IOPS", "500"),
            ],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[("WORKSPACE_VOLUME_IOPS", "2999")],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[("WORKSPACE_VOLUME_IOPS", "16001")],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_GIB", "5"),
                ("WORKSPACE_VOLUME_IOPS", "3000"),
            ],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io1"),
                ("WORKSPACE_VOLUME_IOPS", "1501"),
            ],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io1"),
                ("WORKSPACE_VOLUME_IOPS", "99"),
            ],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[("WORKSPACE_VOLUME_IOPS", "lots")],
            "WORKSPACE_VOLUME_IOPS",
        ),
        (
            &[("WORKSPACE_VOLUME_THROUGHPUT", "124")],
            "WORKSPACE_VOLUME_THROUGHPUT",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_THROUGHPUT", "1001"),
                ("WORKSPACE_VOLUME_IOPS", "16000"),
                ("WORKSPACE_VOLUME_GIB", "100"),
            ],
            "WORKSPACE_VOLUME_THROUGHPUT",
        ),
        (
            &[("WORKSPACE_VOLUME_THROUGHPUT", "751")],
            "WORKSPACE_VOLUME_THROUGHPUT",
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io2"),
                ("WORKSPACE_VOLUME_IOPS", "1000"),
                ("WORKSPACE_VOLUME_THROUGHPUT", "250"),
            ],
            "WORKSPACE_VOLUME_THROUGHPUT",
        ),
    ];
    for (set, var) in refused {
        let mut env = controller_env();
        env.insert("ECS_INFRASTRUCTURE_ROLE_ARN", INFRA_ROLE.into());
        env.insert("WORKSPACE_VOLUME_GIB", "30".into());
        for (k, v) in *set {
            env.insert(*k, (*v).into());
        }
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == *var),
            "{set:?}: {err:?}"
        );
    }
    type Accepted<'a> = (&'a [(&'a str, &'a str)], Option<i32>, Option<i32>);
    let accepted: &[Accepted<'_>] = &[
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io1"),
                ("WORKSPACE_VOLUME_IOPS", "1500"),
            ],
            Some(1500),
            None,
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "io2"),
                ("WORKSPACE_VOLUME_IOPS", "15000"),
            ],
            Some(15000),
            None,
        ),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "st1"),
                ("WORKSPACE_VOLUME_GIB", "125"),
            ],
            None,
            None,
        ),
        (
            &[
                ("WORKSPACE_VOLUME_IOPS", "6000"),
                ("WORKSPACE_VOLUME_THROUGHPUT", "500"),
            ],
            Some(6000),
            Some(500),
        ),
        (&[("WORKSPACE_VOLUME_THROUGHPUT", "750")], None, Some(750)),
        (
            &[
                ("WORKSPACE_VOLUME_TYPE", "gp2"),
                ("WORKSPACE_VOLUME_GIB", "1"),
            ],
            None,
            None,
        ),
    ];
    for (set, iops, throughput) in accepted {
        let mut env = controller_env();
        env.insert("ECS_INFRASTRUCTURE_ROLE_ARN", INFRA_ROLE.into());
        env.insert("WORKSPACE_VOLUME_GIB", "30".into());
        for (k, v) in *set {
            env.insert(*k, (*v).into());
        }
        let ws = controller(&env)
            .unwrap_or_else(|e| panic!("{set:?}: {e}"))
            .ecs
            .workspace
            .unwrap();
        assert_eq!((ws.iops, ws.throughput), (*iops, *throughput), "{set:?}");
    }
}

#[test]
fn half_configured_workspace_volumes_fail_naming_the_missing_variable() {
    for (set, missing) in [
        (
            vec![("ECS_INFRASTRUCTURE_ROLE_ARN", INFRA_ROLE)],
            "WORKSPACE_VOLUME_GIB",
        ),
        (
            vec![("WORKSPACE_VOLUME_GIB", "30")],
            "ECS_INFRASTRUCTURE_ROLE_ARN",
        ),
        (
            vec![("WORKSPACE_VOLUME_TYPE", "gp3")],
            "ECS_INFRASTRUCTURE_ROLE_ARN",
        ),
        (
            vec![("WORKSPACE_VOLUME_IOPS", "3000")],
            "ECS_INFRASTRUCTURE_ROLE_ARN",
        ),
    ] {
        let mut env = controller_env();
        for (k, v) in &set {
            env.insert(*k, (*v).into());
        }
        let err = controller(&env).unwrap_err();
        assert_eq!(err, SettingsError::Missing { var: missing }, "{set:?}");
    }
}

#[test]
fn invalid_workspace_volume_settings_name_the_variable_and_never_repeat_the_value() {
    for (var, value) in [
        ("WORKSPACE_VOLUME_GIB", "0"),
        ("WORKSPACE_VOLUME_GIB", "16385"),
        ("WORKSPACE_VOLUME_GIB", "20GiB"),
        ("WORKSPACE_VOLUME_TYPE", "ssd-fast"),
        ("ECS_INFRASTRUCTURE_ROLE_ARN", "ecsInfrastructureRoleXYZ"),
    ] {
        let mut env = controller_env();
        env.insert("ECS_INFRASTRUCTURE_ROLE_ARN", INFRA_ROLE.into());
        env.insert("WORKSPACE_VOLUME_GIB", "30".into());
        env.insert(var, value.into());
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{var}={value}: {err:?}"
        );
        assert!(!err.to_string().contains(value), "{err}");
    }
}

/// `OWNER_METADATA` (the metadata ownership rule, beside `AGENT_IDS`) and
/// `PROVISION_ON` (worker, sweeper and webhook), parsed or refused naming the variable.
#[test]
fn owner_metadata_and_provision_on_are_read_or_refused_by_name() {
    use sandbox_core::observed::ProvisionOn;
    let s = controller(&controller_env()).unwrap();
    assert!(s.controller.filter.metadata.is_empty());
    assert_eq!(
        s.controller.policy.provision_on,
        ProvisionOn::ConnectionRequest
    );

    let mut env = controller_env();
    env.insert("OWNER_METADATA", "owner=team-a, tier=gold".into());
    env.insert("PROVISION_ON", "created".into());
    let s = controller(&env).unwrap();
    assert_eq!(s.controller.filter.metadata.len(), 2);
    assert_eq!(s.controller.filter.metadata["owner"], "team-a");
    assert_eq!(s.controller.filter.metadata["tier"], "gold");
    assert_eq!(s.controller.policy.provision_on, ProvisionOn::Created);

    for (var, bad) in [
        ("OWNER_METADATA", "owner"),
        ("OWNER_METADATA", "=team-a"),
        ("OWNER_METADATA", "owner=a,owner=b"),
        ("OWNER_METADATA", "owner=a,,tier=b"),
        ("PROVISION_ON", "idle"),
    ] {
        let mut env = controller_env();
        env.insert(var, bad.into());
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{var}={bad}: {err}"
        );
        assert!(!err.to_string().contains(bad), "{err}");
    }

    let webhook = |provision: Option<&str>| {
        WebhookSettings::from_lookup(|k| match k {
            "EVENTS_QUEUE_URL" => Some(EVENTS.to_owned()),
            "WEBHOOK_SECRET_ARN" => {
                Some("arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-AbCdEf".into())
            }
            "PROVISION_ON" => provision.map(str::to_owned),
            _ => None,
        })
    };
    assert_eq!(
        webhook(None).unwrap().provision_on,
        ProvisionOn::ConnectionRequest
    );
    assert_eq!(
        webhook(Some("created")).unwrap().provision_on,
        ProvisionOn::Created
    );
    assert!(matches!(
        webhook(Some("sometimes")),
        Err(SettingsError::Invalid {
            var: "PROVISION_ON",
            ..
        })
    ));
}

/// The warm pool (docs/WARM_POOL.md) is off is off unless `POOL_SIZE` > 0; then its
/// table and the task role's unique id are required, by name.
#[test]
fn the_warm_pool_is_off_by_default_and_needs_its_table_and_task_role_id_when_on() {
    let s = controller(&controller_env()).unwrap();
    assert_eq!(s.controller.pool.size, 0);
    assert_eq!(s.controller.pool.max_age_secs, 3_600);
    assert_eq!(s.ecs.pool, None);

    let mut env = controller_env();
    env.insert("POOL_SIZE", "2".into());
    let err = controller(&env).unwrap_err();
    assert!(
        matches!(
            err,
            SettingsError::Missing {
                var: "POOL_TASK_ROLE_ID"
            }
        ),
        "{err:?}"
    );
    env.insert("POOL_TASK_ROLE_ID", "AROA3XFRBF535PLBIFPI4".into());
    let err = controller(&env).unwrap_err();
    assert!(
        matches!(
            err,
            SettingsError::Missing {
                var: "POOL_TABLE_NAME"
            }
        ),
        "{err:?}"
    );
    env.insert("POOL_TABLE_NAME", "sandbox-lifecycle-pool".into());
    env.insert("POOL_MAX_AGE_SECS", "900".into());
    let s = controller(&env).unwrap();
    assert_eq!(
        (s.controller.pool.size, s.controller.pool.max_age_secs),
        (2, 900)
    );
    let pool = s.ecs.pool.expect("the pool's table");
    assert_eq!(pool.table_name, "sandbox-lifecycle-pool");
    assert_eq!(pool.task_role_id, "AROA3XFRBF535PLBIFPI4");
    assert_eq!(pool.max_age_secs, 900);
    assert_eq!(pool.history_retention_secs, s.history_retention_secs);
}

/// The variable an error names, the changes that provoke it, and what its reason says.
type Case = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

/// A pool that would hand a pooled executor the key, could not carry a workspace, or would
/// eat the executor cap fails at start-up naming `POOL_SIZE`; bad values name their
/// variable and are never repeated.
#[test]
fn a_warm_pool_that_cannot_work_fails_at_start_up_naming_the_mistake() {
    let pooled = || {
        let mut env = controller_env();
        env.insert("POOL_SIZE", "2".into());
        env.insert("POOL_TABLE_NAME", "sandbox-lifecycle-pool".into());
        env.insert("POOL_TASK_ROLE_ID", "AROA3XFRBF535PLBIFPI4".into());
        env
    };
    assert!(controller(&pooled()).is_ok());
    let cases: Vec<Case> = vec![
        (
            "POOL_SIZE",
            vec![("EXECUTOR_MODE", "single")],
            "EXECUTOR_MODE=single",
        ),
        (
            "POOL_SIZE",
            vec![
                (
                    "ECS_INFRASTRUCTURE_ROLE_ARN",
                    "arn:aws:iam::123456789012:role/ecs-infrastructure",
                ),
                ("WORKSPACE_VOLUME_GIB", "20"),
            ],
            "EBS workspaces",
        ),
        ("POOL_SIZE", vec![("MAX_EXECUTORS", "2")], "MAX_EXECUTORS"),
        ("POOL_SIZE", vec![("POOL_SIZE", "two")], "a count"),
        ("POOL_SIZE", vec![("POOL_SIZE", "101")], "at most 100"),
        (
            "POOL_MAX_AGE_SECS",
            vec![("POOL_MAX_AGE_SECS", "59")],
            "at least 60",
        ),
        (
            "POOL_MAX_AGE_SECS",
            vec![("POOL_MAX_AGE_SECS", "1h")],
            "at least 1",
        ),
        (
            "POOL_TASK_ROLE_ID",
            vec![(
                "POOL_TASK_ROLE_ID",
                "arn:aws:iam::123456789012:role/ExecutorTaskRole",
            )],
            "unique id",
        ),
    ];
    for (var, changes, says) in cases {
        let mut env = pooled();
        for (k, v) in &changes {
            env.insert(k, (*v).into());
        }
        let err = controller(&env).unwrap_err();
        assert!(
            matches!(err, SettingsError::Invalid { var: v, .. } if v == var),
            "{changes:?}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(says), "{changes:?}: {message}");
        for (k, v) in &changes {
            if *k == var {
                assert!(!message.contains(v), "{message}");
            }
        }
    }
    // Off, the pool's own variables are not needed (the templates leave them out).
    let mut env = controller_env();
    env.insert("POOL_SIZE", "0".into());
    env.insert("EXECUTOR_MODE", "single".into());
    assert!(controller(&env).is_ok());
}
