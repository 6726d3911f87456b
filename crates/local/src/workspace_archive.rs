//! Local workspace snapshots: one `tar` + `zstd` archive per environment and generation,
//! so local mode has the semantics of replacement compute on AWS: a stopped
//! generation's directory is archived and deleted, and the next generation starts from a
//! fresh directory restored from the latest archive.
//!
//! Layout under the workspace root (`<data dir>/workspaces` in the embedded stack):
//!
//! - `<environment_id>/g<generation>/`: the live working directory of one generation;
//! - `<environment_id>/executor-g<generation>.log`: its executor's output (not archived);
//! - `.snapshots/<deployment>/<environment_id>/g<generation>.tar.zst`: its archive. The
//!   snapshot id is `<environment_id>/g<generation>.tar.zst` within the deployment (no
//!   environment id starts with `.`, so the directory cannot collide with a workspace).
//!   A working directory belongs to the deployment whose executor used it (the instance
//!   table says which).
//!
//! Archives are written to a temporary file in the same directory, synced and renamed, so a
//! crash never leaves a partial archive under the final name; the working directory is
//! deleted only after the archive is durable. Unpacking uses `tar`'s `unpack`, which
//! refuses entries that would land outside the target (`..`, absolute paths).

use sandbox_controller::ports::PortError;
use sandbox_core::ids::{EnvironmentId, Generation};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const DEP: &str = "workspace";
/// zstd level: the library default (3), a good speed/size balance for source trees.
const ZSTD_LEVEL: i32 = 3;
/// The archives' directory name under the workspace root.
pub const SNAPSHOT_DIR: &str = ".snapshots";

/// The live working directory of one generation.
pub fn generation_dir(root: &Path, env: &str, generation: Generation) -> PathBuf {
    root.join(env).join(format!("g{}", generation.0))
}

/// The snapshot id of one generation's archive.
pub fn snapshot_id(env: &str, generation: Generation) -> String {
    format!("{env}/g{}.tar.zst", generation.0)
}

/// The archive file of a snapshot id of `deployment`, when the id is one this module
/// makes (refuses anything else, `..` in particular).
pub fn archive_path(root: &Path, deployment: &str, id: &str) -> Result<PathBuf, PortError> {
    if !dir_safe(deployment) {
        return Err(PortError::permanent(
            DEP,
            "parse",
            "deployment id not usable as a directory name",
        ));
    }
    parse_id(id, ".tar.zst").map(|(env, g)| {
        root.join(SNAPSHOT_DIR)
            .join(deployment)
            .join(env)
            .join(format!("g{}.tar.zst", g.0))
    })
}

/// The working directory named by a volume id `<environment_id>/g<generation>`.
pub fn volume_path(root: &Path, id: &str) -> Result<PathBuf, PortError> {
    parse_id(id, "").map(|(env, g)| generation_dir(root, &env, g))
}

fn parse_id(id: &str, suffix: &str) -> Result<(String, Generation), PortError> {
    let bad = || PortError::permanent(DEP, "parse", format!("not a local workspace id: {id:?}"));
    let (env, rest) = id.split_once('/').ok_or_else(bad)?;
    let g = rest
        .strip_suffix(suffix)
        .and_then(|r| r.strip_prefix('g'))
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(bad)?;
    if !dir_safe(env) || format!("g{g}{suffix}") != rest {
        return Err(bad());
    }
    Ok((env.to_owned(), Generation(g)))
}

/// 1 to 128 of `[A-Za-z0-9._-]`, not starting with `.` (the workspace directory rule).
pub fn dir_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn io_err(operation: &'static str, what: &Path, e: &io::Error) -> PortError {
    PortError::transient(DEP, operation, format!("{}: {e}", what.display()))
}

/// Archives `dir` into `archive` (tar, zstd), atomically: a temporary file in the same
/// directory, synced, then renamed.
///
/// # Errors
/// A transient [`PortError`] on any I/O failure; `dir` is untouched.
pub fn archive_dir(dir: &Path, archive: &Path) -> Result<(), PortError> {
    let parent = archive
        .parent()
        .ok_or_else(|| PortError::permanent(DEP, "archive", "archive path has no parent"))?;
    fs::create_dir_all(parent).map_err(|e| io_err("archive", parent, &e))?;
    let tmp = parent.join(format!(
        ".{}.tmp",
        archive
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("archive")
    ));
    let write = || -> io::Result<()> {
        let _ = fs::remove_file(&tmp);
        crate::private::create_private_file(&tmp)?;
        let file = fs::File::create(&tmp)?;
        let encoder = zstd::stream::write::Encoder::new(file, ZSTD_LEVEL)?;
        let mut builder = tar::Builder::new(encoder);
        builder.follow_symlinks(false);
        builder.append_dir_all(".", dir)?;
        let encoder = builder.into_inner()?;
        let mut file = encoder.finish()?;
        file.flush()?;
        file.sync_all()?;
        fs::rename(&tmp, archive)?;
        fs::File::open(parent)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err("archive", dir, &e)
    })
}

/// Unpacks `archive` into `dir` (created; must not exist or be empty).
///
/// # Errors
/// A transient [`PortError`] when the archive cannot be read or unpacked.
pub fn restore(archive: &Path, dir: &Path) -> Result<(), PortError> {
    let run = || -> io::Result<()> {
        fs::create_dir_all(dir)?;
        let file = fs::File::open(archive)?;
        let decoder = zstd::stream::read::Decoder::new(file)?;
        let mut ar = tar::Archive::new(decoder);
        ar.set_preserve_permissions(true);
        ar.set_overwrite(true);
        ar.unpack(dir)
    };
    run().map_err(|e| io_err("restore", archive, &e))
}

/// Whether `env`'s id is usable here, as an error naming the operation.
pub fn checked_env<'a>(
    env: &'a EnvironmentId,
    operation: &'static str,
) -> Result<&'a str, PortError> {
    let s = env.as_str();
    if dir_safe(s) {
        Ok(s)
    } else {
        Err(PortError::permanent(
            DEP,
            operation,
            "environment id is not usable as a workspace directory name",
        ))
    }
}

/// Modification time of `p`, Unix seconds (0 when unknown).
pub fn mtime_secs(p: &Path) -> u64 {
    fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_and_restore_round_trip_files_dirs_and_modes() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f.txt"), "hello").unwrap();
        fs::write(src.join("top"), "x").unwrap();
        std::os::unix::fs::symlink("top", src.join("link")).unwrap();
        let ar = t.path().join("snap/g1.tar.zst");
        archive_dir(&src, &ar).unwrap();
        let dst = t.path().join("dst");
        restore(&ar, &dst).unwrap();
        assert_eq!(fs::read_to_string(dst.join("a/b/f.txt")).unwrap(), "hello");
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            PathBuf::from("top")
        );
        assert!(!t.path().join("snap/.g1.tar.zst.tmp").exists());
    }

    #[test]
    fn ids_round_trip_and_refuse_traversal() {
        let root = Path::new("/r");
        let id = snapshot_id("env_1", Generation(3));
        assert_eq!(
            archive_path(root, "dep", &id).unwrap(),
            PathBuf::from("/r/.snapshots/dep/env_1/g3.tar.zst")
        );
        assert!(archive_path(root, "..", &id).is_err());
        assert_eq!(
            volume_path(root, "env_1/g3").unwrap(),
            PathBuf::from("/r/env_1/g3")
        );
        for bad in [
            "../x/g1.tar.zst",
            "env/g1/../../x.tar.zst",
            ".snap/g1.tar.zst",
            "env/g01.tar.zst",
            "env/gx.tar.zst",
            "env",
        ] {
            assert!(archive_path(root, "dep", bad).is_err(), "{bad}");
        }
    }
}
