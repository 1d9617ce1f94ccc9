//! A replica's data directory and its identity file: which cluster, node id
//! and shard count the stored data belongs to. Opening a directory that
//! belongs to another cluster or node is refused before any data is touched.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use gangway_raft::NodeId;
use serde::{Deserialize, Serialize};

const IDENTITY_FILE: &str = "identity.json";

/// What a data directory belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Cluster id.
    pub cluster_id: String,
    /// Node id.
    pub node_id: NodeId,
    /// Shard groups the cluster was created with.
    pub shards: u32,
}

/// Whether the directory held data before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirState {
    /// Newly created: this replica has never stored anything.
    Fresh,
    /// Holds this replica's earlier data.
    Existing,
}

/// A data directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// Filesystem failure.
    #[error("data dir {path}: {reason}")]
    Io {
        /// The directory.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The directory belongs to something else.
    #[error("data dir {path} belongs to cluster {found_cluster:?} node {found_node} ({found_shards} shards), not cluster {cluster:?} node {node} ({shards} shards); {hint}")]
    Mismatch {
        /// The directory.
        path: String,
        /// Its cluster id.
        found_cluster: String,
        /// Its node id.
        found_node: NodeId,
        /// Its shard count.
        found_shards: u32,
        /// The configured cluster id.
        cluster: String,
        /// The configured node id.
        node: NodeId,
        /// The configured shard count.
        shards: u32,
        /// What to do.
        hint: &'static str,
    },
}

/// Opens (creating if needed) `dir` for `expected`; refuses a foreign one.
pub fn open(dir: &Path, expected: &Identity) -> Result<DataDirState, DataDirError> {
    let state = probe(dir, expected)?;
    if state == DataDirState::Fresh {
        let io = |e: std::io::Error| DataDirError::Io {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        fs::create_dir_all(dir).map_err(io)?;
        write_identity(&dir.join(IDENTITY_FILE), expected).map_err(io)?;
    }
    Ok(state)
}

/// Tells whether `dir` is fresh or already `expected`'s, writing nothing.
pub fn probe(dir: &Path, expected: &Identity) -> Result<DataDirState, DataDirError> {
    let io = |e: std::io::Error| DataDirError::Io {
        path: dir.display().to_string(),
        reason: e.to_string(),
    };
    let id_path = dir.join(IDENTITY_FILE);
    match fs::read(&id_path) {
        Ok(bytes) => {
            let found: Identity = serde_json::from_slice(&bytes).map_err(|e| DataDirError::Io {
                path: id_path.display().to_string(),
                reason: format!("unreadable identity file: {e}"),
            })?;
            if &found != expected {
                return Err(DataDirError::Mismatch {
                    path: dir.display().to_string(),
                    found_cluster: found.cluster_id,
                    found_node: found.node_id,
                    found_shards: found.shards,
                    cluster: expected.cluster_id.clone(),
                    node: expected.node_id,
                    shards: expected.shards,
                    hint: "use this replica's own data dir, or an empty one with a new node id and --join",
                });
            }
            Ok(DataDirState::Existing)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let non_empty = match fs::read_dir(dir) {
                Ok(mut entries) => entries.next().is_some(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(io(e)),
            };
            if non_empty {
                return Err(DataDirError::Io {
                    path: dir.display().to_string(),
                    reason: "not empty but has no identity file; refusing to use it".into(),
                });
            }
            Ok(DataDirState::Fresh)
        }
        Err(e) => Err(io(e)),
    }
}

fn write_identity(path: &Path, id: &Identity) -> std::io::Result<()> {
    let tmp: PathBuf = path.with_extension("json.tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(id).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// The sled directory inside a data dir.
pub fn store_path(dir: &Path) -> PathBuf {
    dir.join("raft")
}

#[cfg(test)]
#[path = "datadir_tests.rs"]
mod tests;
