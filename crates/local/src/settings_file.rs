//! The settings a running embedded stack decides with, kept in its data directory so the
//! operator's tools decide with them too.
//!
//! On AWS, `sandboxctl --backend aws` reads the same environment variables as the Lambdas;
//! locally the stack's settings are `sandboxctl serve` flags, which a later `sandboxctl
//! explain` or `sweep --dry-run` cannot see. So the stack writes its policy and ownership
//! filter to `<data_dir>/controller-settings.json` at start-up (replacing the file
//! atomically), and the local operator backend reads them from there.
//!
//! Shape: `{"deployment": "<id>", "policy": Policy, "filter": OwnershipFilter}` as
//! serialized by `sandbox_core::observed` (seconds throughout). No secret is ever in it.

use sandbox_controller::ControllerConfig;
use sandbox_core::observed::{OwnershipFilter, Policy};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file name inside the data directory.
pub const SETTINGS_FILE: &str = "controller-settings.json";

/// What the file holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackSettings {
    /// The deployment id the stack ran as.
    pub deployment: String,
    /// The decision's settings.
    pub policy: Policy,
    /// Which sessions the stack handles.
    pub filter: OwnershipFilter,
}

/// The settings file of `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(SETTINGS_FILE)
}

/// Writes `config`'s settings into `data_dir` (a temporary file renamed over the old one,
/// so a reader never sees half a file).
///
/// # Errors
/// The write or the rename failing.
pub fn write(data_dir: &Path, config: &ControllerConfig) -> std::io::Result<()> {
    let settings = StackSettings {
        deployment: config.deployment.as_str().to_owned(),
        policy: config.policy.clone(),
        filter: config.filter.clone(),
    };
    let body = serde_json::to_vec_pretty(&settings).map_err(std::io::Error::other)?;
    let tmp = data_dir.join(format!("{SETTINGS_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    crate::private::create_private_file(&tmp)?;
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path(data_dir))
}

/// Reads the settings of `data_dir`; `Ok(None)` when no stack wrote any.
///
/// # Errors
/// The file exists but cannot be read or does not parse (the message names the file).
pub fn read(data_dir: &Path) -> Result<Option<StackSettings>, String> {
    let file = path(data_dir);
    match std::fs::read(&file) {
        Ok(body) => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| format!("{}: {e}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", file.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ids::DeploymentId;

    #[test]
    fn a_written_policy_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let mut config = ControllerConfig::new(DeploymentId::new("dep-1").unwrap());
        config.policy.shutdown_grace_secs = 7;
        config.policy.max_lifetime_secs = 60;
        config.policy.remote_url_allowlist = vec!["example.test"].into();
        config.filter.workspace_directory = Some("/w".into());
        write(dir.path(), &config).unwrap();
        let got = read(dir.path()).unwrap().unwrap();
        assert_eq!(got.deployment, "dep-1");
        assert_eq!(got.policy, config.policy);
        assert_eq!(got.filter, config.filter);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), b"{").unwrap();
        let e = read(dir.path()).unwrap_err();
        assert!(e.contains(SETTINGS_FILE), "{e}");
    }
}
