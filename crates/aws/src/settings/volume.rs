//! The workspace volume settings (ECS-managed EBS): the variables, the volume types and
//! their rules, and the check of one volume against them.

use super::SettingsError;
use super::vars::Vars;

/// The workspace volume of every task (ECS-managed EBS), from `ECS_INFRASTRUCTURE_ROLE_ARN`,
/// `WORKSPACE_VOLUME_GIB` and `WORKSPACE_VOLUME_TYPE`; all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceVolumeSettings {
    /// `ECS_INFRASTRUCTURE_ROLE_ARN`: the role ECS uses to create and attach the volume.
    pub infrastructure_role_arn: String,
    /// `WORKSPACE_VOLUME_GIB`, 1–16,384.
    pub size_gib: i32,
    /// `WORKSPACE_VOLUME_TYPE`, default `gp3`.
    pub volume_type: String,
    /// `WORKSPACE_VOLUME_IOPS` (`iops`): required for `io1`/`io2`, optional for `gp3`,
    /// `None` otherwise ([`VolumeTypeRules`]).
    pub iops: Option<i32>,
    /// `WORKSPACE_VOLUME_THROUGHPUT` (`throughput`, MiB/s): `gp3` only.
    pub throughput: Option<i32>,
}

/// The EBS volume types `RunTask` accepts for a managed volume on Fargate (ECS API
/// reference, TaskManagedEBSVolumeConfiguration `volumeType`: "The magnetic volume type
/// is not supported on Fargate", so `standard` is not among them).
pub const WORKSPACE_VOLUME_TYPES: &[&str] = &["gp2", "gp3", "io1", "io2", "st1", "sc1"];

/// What `RunTask` accepts for one volume type (ECS API reference,
/// TaskManagedEBSVolumeConfiguration — <https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_TaskManagedEBSVolumeConfiguration.html>:
/// `sizeInGiB` "gp2 and gp3: 1-16,384; io1 and io2: 4-16,384; st1 and sc1: 125-16,384";
/// `iops` "gp3: 3,000 - 16,000 IOPS; io1: 100 - 64,000 IOPS; io2: 100 - 256,000 IOPS ...
/// required for io1 and io2 ... not supported for st1, sc1, or standard"; `throughput`
/// "a maximum of 1,000 MiB/s ... only supported for the gp3 volume type". The ratios come
/// from the EBS User Guide, "Amazon EBS volume types": gp3 and io2 at most 500 IOPS per
/// GiB, io1 50; gp3 throughput from 125 MiB/s, at most 0.25 MiB/s per provisioned IOPS.
/// `iops` is refused for gp2 too: CreateVolume (to which it maps 1:1) does not take it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeTypeRules {
    /// The type (`volumeType`).
    pub name: &'static str,
    /// `sizeInGiB`, inclusive.
    pub size_gib: (i32, i32),
    /// `iops`, inclusive, and the most IOPS per GiB; `None`: the type takes no `iops`.
    pub iops: Option<((i32, i32), i32)>,
    /// Whether `iops` must be given.
    pub iops_required: bool,
    /// `throughput` (MiB/s), inclusive; `None`: the type takes no `throughput`.
    pub throughput: Option<(i32, i32)>,
}

/// [`VolumeTypeRules`] of every type in [`WORKSPACE_VOLUME_TYPES`].
pub const VOLUME_TYPE_RULES: &[VolumeTypeRules] = &[
    VolumeTypeRules {
        name: "gp3",
        size_gib: (1, 16_384),
        iops: Some(((3_000, 16_000), 500)),
        iops_required: false,
        throughput: Some((125, 1_000)),
    },
    VolumeTypeRules {
        name: "gp2",
        size_gib: (1, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
    VolumeTypeRules {
        name: "io1",
        size_gib: (4, 16_384),
        iops: Some(((100, 64_000), 50)),
        iops_required: true,
        throughput: None,
    },
    VolumeTypeRules {
        name: "io2",
        size_gib: (4, 16_384),
        iops: Some(((100, 256_000), 500)),
        iops_required: true,
        throughput: None,
    },
    VolumeTypeRules {
        name: "st1",
        size_gib: (125, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
    VolumeTypeRules {
        name: "sc1",
        size_gib: (125, 16_384),
        iops: None,
        iops_required: false,
        throughput: None,
    },
];

/// Checks a workspace volume against [`VOLUME_TYPE_RULES`]: the type is known, the size in
/// its range, `iops` present when required, absent when not taken, in range and within
/// the per-GiB ratio, `throughput` only on gp3, in range and at most IOPS / 4 (gp3's
/// default 3,000 IOPS when none is given).
///
/// # Errors
/// [`SettingsError::Invalid`] naming the variable at fault and the rule it broke (never
/// the value).
pub fn check_workspace_volume(
    volume_type: &str,
    size_gib: i32,
    iops: Option<i32>,
    throughput: Option<i32>,
) -> Result<(), SettingsError> {
    let invalid = |var, reason| Err(SettingsError::Invalid { var, reason });
    let Some(rules) = VOLUME_TYPE_RULES.iter().find(|r| r.name == volume_type) else {
        return invalid(
            "WORKSPACE_VOLUME_TYPE",
            "one of gp3, gp2, io1, io2, st1, sc1 (standard is not supported on Fargate)",
        );
    };
    let (lo, hi) = rules.size_gib;
    if !(lo..=hi).contains(&size_gib) {
        return invalid(
            "WORKSPACE_VOLUME_GIB",
            match rules.name {
                "io1" | "io2" => "whole GiB from 4 to 16384 for io1 and io2",
                "st1" | "sc1" => "whole GiB from 125 to 16384 for st1 and sc1",
                _ => "whole GiB from 1 to 16384",
            },
        );
    }
    match (rules.iops, iops) {
        (None, Some(_)) => {
            return invalid(
                "WORKSPACE_VOLUME_IOPS",
                "only for gp3, io1 and io2 volumes (unset it for gp2, st1, sc1)",
            );
        }
        (Some(_), None) if rules.iops_required => {
            return invalid(
                "WORKSPACE_VOLUME_IOPS",
                "required for io1 and io2 volumes (io1: 100-64000, io2: 100-256000)",
            );
        }
        (Some(((lo, hi), per_gib)), Some(n)) => {
            if !(lo..=hi).contains(&n) {
                return invalid(
                    "WORKSPACE_VOLUME_IOPS",
                    match rules.name {
                        "gp3" => "from 3000 to 16000 for gp3",
                        "io1" => "from 100 to 64000 for io1",
                        _ => "from 100 to 256000 for io2",
                    },
                );
            }
            if i64::from(n) > i64::from(per_gib) * i64::from(size_gib) {
                return invalid(
                    "WORKSPACE_VOLUME_IOPS",
                    if rules.name == "io1" {
                        "at most 50 IOPS per GiB of WORKSPACE_VOLUME_GIB for io1"
                    } else {
                        "at most 500 IOPS per GiB of WORKSPACE_VOLUME_GIB"
                    },
                );
            }
        }
        _ => {}
    }
    match (rules.throughput, throughput) {
        (None, Some(_)) => invalid("WORKSPACE_VOLUME_THROUGHPUT", "only for gp3 volumes"),
        (Some((lo, hi)), Some(t)) if !(lo..=hi).contains(&t) => invalid(
            "WORKSPACE_VOLUME_THROUGHPUT",
            "MiB/s from 125 to 1000 for gp3",
        ),
        (Some(_), Some(t)) if i64::from(t) * 4 > i64::from(iops.unwrap_or(3_000)) => invalid(
            "WORKSPACE_VOLUME_THROUGHPUT",
            "at most WORKSPACE_VOLUME_IOPS / 4 MiB/s (gp3: 0.25 MiB/s per IOPS, 3000 IOPS by default)",
        ),
        _ => Ok(()),
    }
}

#[cfg(feature = "ec2")]
impl WorkspaceVolumeSettings {
    /// The EBS adapter's configuration (default waits).
    pub fn ebs_config(&self) -> crate::EbsConfig {
        let mut config = crate::EbsConfig::new(&self.infrastructure_role_arn, self.size_gib);
        config.volume_type = self.volume_type.clone();
        config.iops = self.iops;
        config.throughput = self.throughput;
        config
    }
}

/// The workspace volume settings: all of `ECS_INFRASTRUCTURE_ROLE_ARN` and
/// `WORKSPACE_VOLUME_GIB` (plus the optional `WORKSPACE_VOLUME_TYPE`), or none of them.
/// A half configuration fails naming the missing variable, so a deployment never runs
/// believing it keeps workspaces when it does not.
pub(super) fn workspace_volume<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
) -> Result<Option<WorkspaceVolumeSettings>, SettingsError> {
    let role = vars.optional("ECS_INFRASTRUCTURE_ROLE_ARN");
    let gib = vars.optional("WORKSPACE_VOLUME_GIB");
    let volume_type = vars.optional("WORKSPACE_VOLUME_TYPE");
    let performance = vars.optional("WORKSPACE_VOLUME_IOPS").is_some()
        || vars.optional("WORKSPACE_VOLUME_THROUGHPUT").is_some();
    let Some(role) = role else {
        if gib.is_some() || volume_type.is_some() || performance {
            return Err(SettingsError::Missing {
                var: "ECS_INFRASTRUCTURE_ROLE_ARN",
            });
        }
        return Ok(None);
    };
    if !role.starts_with("arn:") || !role.contains(":role/") {
        return Err(SettingsError::Invalid {
            var: "ECS_INFRASTRUCTURE_ROLE_ARN",
            reason: "an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)",
        });
    }
    let Some(gib) = gib else {
        return Err(SettingsError::Missing {
            var: "WORKSPACE_VOLUME_GIB",
        });
    };
    let size_gib = gib
        .parse::<i32>()
        .ok()
        .filter(|g| (1..=16_384).contains(g))
        .ok_or(SettingsError::Invalid {
            var: "WORKSPACE_VOLUME_GIB",
            reason: "whole GiB from 1 to 16384",
        })?;
    let volume_type = volume_type.unwrap_or_else(|| "gp3".to_owned());
    let whole = |var: &'static str, reason: &'static str| {
        vars.optional(var)
            .map(|v| {
                v.parse::<i32>()
                    .map_err(|_| SettingsError::Invalid { var, reason })
            })
            .transpose()
    };
    let iops = whole("WORKSPACE_VOLUME_IOPS", "a whole number of IOPS")?;
    let throughput = whole("WORKSPACE_VOLUME_THROUGHPUT", "a whole number of MiB/s")?;
    check_workspace_volume(&volume_type, size_gib, iops, throughput)?;
    Ok(Some(WorkspaceVolumeSettings {
        infrastructure_role_arn: role,
        size_gib,
        volume_type,
        iops,
        throughput,
    }))
}
