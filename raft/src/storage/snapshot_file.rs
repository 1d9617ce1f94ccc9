//! A group's current snapshot as one file beside the log store: written whole to a
//! temporary file, made durable, then renamed over the previous one.
//!
//! Why a file and not a key in the log store: a snapshot of a large state is hundreds
//! of megabytes, and writing it through the store made the process-wide group commit
//! (`SyncHandle`) flush it, so every group's appends waited seconds for it. A file is
//! made durable on its own. Invariant: the file at the slot's path is always a whole
//! snapshot (the old one or the new one), never a partial write; a partial file is never
//! read, and is removed when the slot is next opened. Called by `sm_store`
//! through [`super::SnapshotSlot`]; opened by the sled store.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{SnapshotSlot, StoreError};

/// Suffix (then a number) of a file a new snapshot is written to before it replaces the
/// current one.
const PARTIAL_SUFFIX: &str = ".partial.";

/// One snapshot file.
pub(super) struct SnapshotFile {
    path: PathBuf,
    /// Numbers the partial files, so two writes at once (a snapshot built while one is
    /// installed) never share one; the last rename wins, and each file is whole.
    writes: AtomicU64,
}

impl SnapshotFile {
    /// The slot `name` in `dir` (created if missing); partial files a stopped write left
    /// behind are removed.
    pub(super) fn open(dir: PathBuf, name: &str) -> Result<Self, StoreError> {
        fs::create_dir_all(&dir).map_err(|e| io(&dir, "cannot create", e))?;
        let left = format!("{name}{PARTIAL_SUFFIX}");
        let entries = fs::read_dir(&dir).map_err(|e| io(&dir, "cannot list", e))?;
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&left) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| io(&path, "cannot remove", e))?;
            }
        }
        Ok(Self {
            path: dir.join(name),
            writes: AtomicU64::new(0),
        })
    }

    fn partial(&self, write: u64) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!("{PARTIAL_SUFFIX}{write}"));
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
        let partial = self.partial(self.writes.fetch_add(1, Ordering::Relaxed));
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
#[path = "snapshot_file_tests.rs"]
mod tests;
