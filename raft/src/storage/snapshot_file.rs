//! A group's current snapshot as one file beside the log store: written whole to a
//! temporary file, made durable, then renamed over the previous one.
//!
//! Why a file and not a key in the log store: a snapshot of a large state is hundreds
//! of megabytes, and writing it through the store made the process-wide group commit
//! (`SyncHandle`) flush it, so every group's appends waited seconds for it. A file is
//! made durable on its own. Invariant: the file at the slot's path is always a whole
//! snapshot (the old one or the new one), never a partial write. Called by `sm_store`
//! through [`super::SnapshotSlot`]; opened by the sled store.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::PathBuf;

use super::{SnapshotSlot, StoreError};

/// Suffix of the file a new snapshot is written to before it replaces the current one.
const PARTIAL_SUFFIX: &str = ".partial";

/// One snapshot file.
pub(super) struct SnapshotFile {
    path: PathBuf,
}

impl SnapshotFile {
    /// The slot `name` in `dir` (created if missing).
    pub(super) fn open(dir: PathBuf, name: &str) -> Result<Self, StoreError> {
        fs::create_dir_all(&dir).map_err(|e| io(&dir, "cannot create", e))?;
        Ok(Self {
            path: dir.join(name),
        })
    }

    fn partial(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(PARTIAL_SUFFIX);
        PathBuf::from(p)
    }
}

fn io(path: &std::path::Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

impl SnapshotSlot for SnapshotFile {
    fn read(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&self.path, "cannot read", e)),
        }
    }

    fn is_written(&self) -> Result<bool, StoreError> {
        self.path
            .try_exists()
            .map_err(|e| io(&self.path, "cannot look for", e))
    }

    fn replace(&self, parts: &[&[u8]]) -> Result<(), StoreError> {
        let partial = self.partial();
        let mut file = File::create(&partial).map_err(|e| io(&partial, "cannot create", e))?;
        for part in parts {
            file.write_all(part)
                .map_err(|e| io(&partial, "cannot write", e))?;
        }
        file.sync_all()
            .map_err(|e| io(&partial, "cannot sync", e))?;
        drop(file);
        fs::rename(&partial, &self.path).map_err(|e| io(&self.path, "cannot rename onto", e))?;
        // The rename is durable once the directory is.
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(dir, "cannot sync", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_the_last_whole_snapshot_and_ignores_a_partial_one() {
        let dir =
            std::env::temp_dir().join(format!("gangway-snapshot-file-test-{}", std::process::id()));
        let slot = SnapshotFile::open(dir.clone(), "g0").expect("open");
        assert_eq!(slot.read().expect("read"), None);
        assert!(!slot.is_written().expect("look"));
        slot.replace(&[b"head", b"-body"]).expect("replace");
        assert_eq!(
            slot.read().expect("read").as_deref(),
            Some(&b"head-body"[..])
        );
        assert!(slot.is_written().expect("look"));
        // A write that stopped halfway left only its partial file behind.
        fs::write(slot.partial(), b"half").expect("write partial");
        let reopened = SnapshotFile::open(dir.clone(), "g0").expect("reopen");
        assert_eq!(
            reopened.read().expect("read").as_deref(),
            Some(&b"head-body"[..])
        );
        reopened.replace(&[b"next"]).expect("replace again");
        assert_eq!(
            reopened.read().expect("read").as_deref(),
            Some(&b"next"[..])
        );
        assert!(
            !reopened.partial().exists(),
            "the partial file became the snapshot"
        );
        let _ = fs::remove_dir_all(dir);
    }
}
