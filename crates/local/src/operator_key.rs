//! Local mode's operator key ([`sandbox_core::operator_proof`]):
//! `<data-dir>/operator.key`, 64 hexadecimal characters (32 bytes from `/dev/urandom`),
//! mode 0600, created by whichever of `serve` and `sandboxctl` needs it first.
//!
//! What it keeps out: another local user (the data directory is 0700 and the file 0600).
//! What it does not: a process of the user running `serve` can read it, as it can the
//! queue database (docs/SECURITY.md).

use sandbox_core::operator_proof::OperatorKey;
use std::fs;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The key file's name inside the data directory.
pub const FILE_NAME: &str = "operator.key";

/// The key file's path for `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Reads the operator key of `data_dir`, creating it (mode 0600, never overwriting one
/// another process created meanwhile) when it does not exist.
///
/// # Errors
/// The file unreadable or uncreatable, or holding fewer than 32 bytes (`InvalidData`).
pub fn load_or_create(data_dir: &Path) -> io::Result<OperatorKey> {
    let p = path(data_dir);
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(crate::private::FILE_MODE)
        .open(&p)
    {
        Ok(mut f) => {
            let mut bytes = [0u8; 32];
            fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            f.write_all(hex.as_bytes())?;
            f.sync_all()?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let text = fs::read_to_string(&p)?;
    OperatorKey::from_text(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_key_is_created_once_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a, b);
        let meta = fs::metadata(path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_to_string(path(dir.path())).unwrap().len(), 64);
        fs::write(path(dir.path()), "short").unwrap();
        assert_eq!(
            load_or_create(dir.path()).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
