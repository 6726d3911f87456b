//! Owner-only files and directories for local mode's data: the data directory
//! is 0700, every file the controller writes in it 0600 (SQLite databases and their
//! `-wal`/`-shm`, executor logs, workspace snapshots, the settings file, the demo's key).
//!
//! Mode bits keep other local users out; they do not separate processes of the same user
//! (an executor runs as the user running `serve`): see docs/SECURITY.md, "What local mode
//! isolates".

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Directory mode: owner only.
pub const DIR_MODE: u32 = 0o700;
/// File mode: owner read and write only.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` (and missing parents, each 0700) and sets `dir` itself to 0700, also when
/// it existed with a wider mode.
///
/// # Errors
/// The creation or the `chmod` failing.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
}

/// Makes sure `path` exists as a file of mode 0600: creates it empty with that mode, or
/// narrows an existing file's mode to it. Its content is untouched.
///
/// # Errors
/// The creation or the `chmod` failing.
pub fn create_private_file(path: &Path) -> io::Result<()> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(FILE_MODE))
}

/// Makes this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, prctl(2)): no core dump,
/// and `/proc/<pid>/environ`, `/proc/<pid>/mem` and ptrace become root-only, so a process
/// of the same user (an executor, an agent's tool) cannot read the secrets `serve` holds
/// in its environment and memory. Children are not affected (exec resets it).
///
/// # Errors
/// The `prctl` call failing.
pub fn make_non_dumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
}
