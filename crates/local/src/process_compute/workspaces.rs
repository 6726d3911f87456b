//! Local workspace persistence of [`ProcessCompute`](super::ProcessCompute): the
//! per-generation directories, their `tar` + `zstd` archives
//! ([`crate::workspace_archive`]) and the [`Workspaces`] port.

use super::{DEP, ProcessCompute};
use crate::db::from_sql_int;
use crate::workspace_archive as ws;
use rusqlite::params;
use sandbox_controller::ports::PortError;
use sandbox_controller::ports::{StoredKind, StoredWorkspace, Workspaces};
use sandbox_core::ids::{DeploymentId, EnvironmentId, Generation};
use sandbox_core::workspace::{SnapshotState, WorkspaceDisposition};
use std::path::Path;

/// Replaces `dir` by an empty directory, or by the contents of `archive`.
pub(super) fn fresh_workspace(dir: &Path, archive: Option<&Path>) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    match archive {
        Some(a) => ws::restore(a, dir).map_err(|e| e.to_string()),
        None => std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display())),
    }
}

/// A directory-safe environment id: 1 to 128 of `[A-Za-z0-9._-]`, not starting with `.`.
pub(super) fn workspace_name(env: &EnvironmentId) -> Result<&str, PortError> {
    let s = env.as_str();
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(s)
    } else {
        Err(PortError::permanent(
            DEP,
            "start",
            "environment id is not usable as a workspace directory name (1 to 128 of [A-Za-z0-9._-], not starting with '.')",
        ))
    }
}

impl ProcessCompute {
    /// Whether an executor of (`env`, `generation`) is still live (its directory in use).
    async fn generation_live(
        &self,
        env: &str,
        generation: Generation,
        operation: &'static str,
    ) -> Result<bool, PortError> {
        Ok(self
            .inner
            .live_rows(operation)
            .await?
            .iter()
            .any(|r| r.environment_id == env && r.generation == generation.0))
    }

    fn in_use(env: &str, generation: Generation, operation: &'static str) -> PortError {
        PortError::permanent(
            "workspace",
            operation,
            format!("the workspace of {env} generation {generation} is in use by a live executor"),
        )
    }
}

/// Local workspace persistence (see [`crate::workspace_archive`] for the layout): a
/// stopped generation's directory becomes `tar` + `zstd` archive, the next generation's
/// directory is restored from the archive its start names. One data directory is one
/// deployment, so `deployment` only scopes nothing here.
impl Workspaces for ProcessCompute {
    async fn save_workspace(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let env = ws::checked_env(environment_id, "save")?;
        let root = self.inner.config.workspace_root.clone();
        let id = ws::snapshot_id(env, generation);
        let archive = ws::archive_path(&root, deployment.as_str(), &id)?;
        let dir = ws::generation_dir(&root, env, generation);
        if archive.is_file() {
            // Saved already (a retried save): the directory may remain if the crash came
            // between the rename and the delete.
            if dir.exists() && !self.generation_live(env, generation, "save").await? {
                let _ = tokio::fs::remove_dir_all(&dir).await;
            }
            return Ok(WorkspaceDisposition::Snapshot { snapshot_id: id });
        }
        if !dir.is_dir() {
            return Ok(WorkspaceDisposition::None);
        }
        if self.generation_live(env, generation, "save").await? {
            return Err(Self::in_use(env, generation, "save"));
        }
        let (d, a) = (dir.clone(), archive.clone());
        tokio::task::spawn_blocking(move || ws::archive_dir(&d, &a))
            .await
            .map_err(|e| PortError::transient("workspace", "save", e.to_string()))??;
        tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
            PortError::transient("workspace", "save", format!("{}: {e}", dir.display()))
        })?;
        tracing::info!(environment_id = %environment_id, %generation, snapshot_id = %id, "workspace archived");
        Ok(WorkspaceDisposition::Snapshot { snapshot_id: id })
    }

    /// An archive is complete once it exists (written to a temporary name, then renamed):
    /// `completed`, else `gone`.
    async fn snapshot_state(
        &self,
        deployment: &DeploymentId,
        snapshot_id: &str,
    ) -> Result<SnapshotState, PortError> {
        let root = &self.inner.config.workspace_root;
        // Not an archive name this deployment could have written: no such snapshot.
        let Ok(archive) = ws::archive_path(root, deployment.as_str(), snapshot_id) else {
            return Ok(SnapshotState::Gone);
        };
        Ok(if archive.is_file() {
            SnapshotState::Completed
        } else {
            SnapshotState::Gone
        })
    }

    /// Local mode's save deletes the directory itself once the archive is in place (an
    /// archive is complete when it exists; one not recorded yet is kept by the sweeper,
    /// which never deletes a snapshot newer than the record's latest, and a retried save
    /// returns it). This deletes a directory a crash left after its archive.
    async fn delete_working_copy(
        &self,
        deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
        snapshot_id: &str,
    ) -> Result<bool, PortError> {
        let env = ws::checked_env(environment_id, "delete_working_copy")?;
        let root = &self.inner.config.workspace_root;
        if !ws::archive_path(root, deployment.as_str(), snapshot_id)?.is_file() {
            return Ok(false);
        }
        let dir = ws::generation_dir(root, env, generation);
        if dir.exists() {
            if self
                .generation_live(env, generation, "delete_working_copy")
                .await?
            {
                return Err(Self::in_use(env, generation, "delete_working_copy"));
            }
            tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
                PortError::transient(
                    "workspace",
                    "delete_working_copy",
                    format!("{}: {e}", dir.display()),
                )
            })?;
        }
        Ok(true)
    }

    async fn discard_workspace(
        &self,
        _deployment: &DeploymentId,
        environment_id: &EnvironmentId,
        generation: Generation,
    ) -> Result<WorkspaceDisposition, PortError> {
        let env = ws::checked_env(environment_id, "discard")?;
        let dir = ws::generation_dir(&self.inner.config.workspace_root, env, generation);
        if !dir.exists() {
            return Ok(WorkspaceDisposition::None);
        }
        if self.generation_live(env, generation, "discard").await? {
            return Err(Self::in_use(env, generation, "discard"));
        }
        tokio::fs::remove_dir_all(&dir).await.map_err(|e| {
            PortError::transient("workspace", "discard", format!("{}: {e}", dir.display()))
        })?;
        Ok(WorkspaceDisposition::Deleted)
    }

    async fn delete_stored(
        &self,
        deployment: &DeploymentId,
        kind: StoredKind,
        id: &str,
    ) -> Result<(), PortError> {
        let root = &self.inner.config.workspace_root;
        let result = match kind {
            StoredKind::Snapshot => {
                tokio::fs::remove_file(ws::archive_path(root, deployment.as_str(), id)?).await
            }
            StoredKind::Volume => {
                let dir = ws::volume_path(root, id)?;
                let (env, g) = id.split_once("/g").unwrap_or_default();
                let generation = Generation(g.parse().unwrap_or_default());
                if self.generation_live(env, generation, "delete").await? {
                    return Err(Self::in_use(env, generation, "delete"));
                }
                tokio::fs::remove_dir_all(dir).await
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PortError::transient(
                "workspace",
                "delete",
                format!("{id}: {e}"),
            )),
        }
    }

    async fn list_stored(
        &self,
        deployment: &DeploymentId,
    ) -> Result<Vec<StoredWorkspace>, PortError> {
        let root = self.inner.config.workspace_root.clone();
        let live: Vec<(String, u64)> = self
            .inner
            .live_rows("list_stored")
            .await?
            .into_iter()
            .map(|r| (r.environment_id, r.generation))
            .collect();
        let dep = deployment.as_str().to_owned();
        let owned: Vec<(String, u64)> = self
            .inner
            .db
            .call(DEP, "list_stored", move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT DISTINCT environment_id, generation FROM compute_instances WHERE deployment = ?1",
                )?;
                let rows = stmt
                    .query_map(params![dep], |r| {
                        Ok((r.get::<_, String>(0)?, from_sql_int(r.get(1)?)))
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await?;
        let dep = deployment.as_str().to_owned();
        tokio::task::spawn_blocking(move || list_local(&root, &dep, &owned, &live))
            .await
            .map_err(|e| PortError::transient("workspace", "list", e.to_string()))?
    }
}

/// Every archive of `deployment` and every generation directory its executors used under
/// `root` (`owned`: the (environment, generation) pairs of its instances).
fn list_local(
    root: &Path,
    deployment: &str,
    owned: &[(String, u64)],
    live: &[(String, u64)],
) -> Result<Vec<StoredWorkspace>, PortError> {
    let read = |p: &Path| -> Result<Vec<std::fs::DirEntry>, PortError> {
        match std::fs::read_dir(p) {
            Ok(rd) => rd.collect::<Result<Vec<_>, _>>().map_err(|e| {
                PortError::transient("workspace", "list", format!("{}: {e}", p.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
            Err(e) => Err(PortError::transient(
                "workspace",
                "list",
                format!("{}: {e}", p.display()),
            )),
        }
    };
    let mut out = Vec::new();
    for env_entry in read(root)? {
        let Some(env) = env_entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if env == ws::SNAPSHOT_DIR {
            for env_dir in read(&env_entry.path().join(deployment))? {
                let Some(env) = env_dir.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                for f in read(&env_dir.path())? {
                    let name = f.file_name().to_string_lossy().into_owned();
                    let id = format!("{env}/{name}");
                    let Ok(path) = ws::archive_path(root, deployment, &id) else {
                        continue;
                    };
                    let g = name
                        .trim_start_matches('g')
                        .trim_end_matches(".tar.zst")
                        .parse()
                        .unwrap_or_default();
                    out.push(StoredWorkspace {
                        kind: StoredKind::Snapshot,
                        id,
                        environment_id: EnvironmentId::new(env.clone()),
                        generation: Generation(g),
                        created_at: ws::mtime_secs(&path),
                        in_use: false,
                    });
                }
            }
            continue;
        }
        if !ws::dir_safe(&env) || !env_entry.path().is_dir() {
            continue;
        }
        for g in read(&env_entry.path())? {
            let name = g.file_name().to_string_lossy().into_owned();
            let id = format!("{env}/{name}");
            if ws::volume_path(root, &id).is_err() || !g.path().is_dir() {
                continue;
            }
            let generation: u64 = name[1..].parse().unwrap_or_default();
            if !owned.iter().any(|(e, n)| *e == env && *n == generation) {
                continue;
            }
            out.push(StoredWorkspace {
                kind: StoredKind::Volume,
                id,
                environment_id: EnvironmentId::new(env.clone()),
                generation: Generation(generation),
                created_at: ws::mtime_secs(&g.path()),
                in_use: live.iter().any(|(e, n)| *e == env && *n == generation),
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}
