//! The shard count a replica serves, and its growth on a live cluster.
//!
//! Owns [`ShardCount`], the number of shards whose groups this replica hosts, which
//! every service reads where it once took a count fixed at start; and the task that
//! follows the meta group's shard set (`GrowShards`, applied by `gangctl shards grow`),
//! opening each added shard's Raft group here before raising the count.
//!
//! Invariants: the count only rises; it never names a shard whose group this replica
//! has not opened, nor one the meta group has not recorded, so every shard id a
//! service derives from it is one meta's apply accepts. A restarted replica opens the
//! shards it was started with (`--shards`, the count the cluster was created with) and
//! this task opens the rest as soon as its meta replica has applied them again.
//! Called by `Replica::start`; one task per replica.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::replicated::{GroupError, Groups};
use gangway_core::ledger::meta::{MetaQuery, MetaReply};

/// Period of the look at the meta group's shard set, in ms.
pub const GROWTH_CHECK_MS: u64 = 200;

/// The number of shards this replica's services use: shards 1..=count.
#[derive(Debug, Clone)]
pub struct ShardCount(Arc<AtomicU32>);

impl ShardCount {
    /// A count of `shards`, as the replica starts.
    pub fn new(shards: u32) -> Self {
        Self(Arc::new(AtomicU32::new(shards)))
    }

    /// The count now.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    /// The shard ids now: 1..=count.
    pub fn ids(&self) -> RangeInclusive<u32> {
        1..=self.get()
    }

    /// Raises the count to `shards` (a lower value leaves it as it is).
    fn raise(&self, shards: u32) {
        self.0.fetch_max(shards, Ordering::AcqRel);
    }
}

/// Why an added shard could not be opened here yet.
#[derive(Debug, thiserror::Error)]
pub enum GrowthError {
    /// Reading the shard set failed.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// Opening the added shard's group failed.
    #[error(transparent)]
    Host(#[from] gangway_raft::HostError),
    /// The meta group answered something other than a shard set.
    #[error("meta answered the shard set with {0}")]
    Unexpected(String),
    /// Meta names a shard above this replica's count without its voters: the replica
    /// was started with a smaller `--shards` than the cluster was created with.
    #[error(
        "shard {0} is recorded in meta but not as added on a live cluster; \
         start this replica with the --shards the cluster was created with"
    )]
    NotRecorded(u32),
}

/// Opens the shards meta added until `stop` fires, raising `count` after each.
pub async fn run(groups: Groups, count: ShardCount, mut stop: watch::Receiver<bool>) {
    let mut last_error: Option<String> = None;
    loop {
        match open_added(&groups, &count).await {
            Ok(()) => last_error = None,
            Err(e) => {
                let e = e.to_string();
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "cannot open an added shard yet; trying again");
                }
                last_error = Some(e);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(GROWTH_CHECK_MS)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Opens every shard above `count` that this replica's meta state records, in order.
async fn open_added(groups: &Groups, count: &ShardCount) -> Result<(), GrowthError> {
    let (shards, added) = shard_set(groups)?;
    for shard in count.get() + 1..=shards {
        let voters = added.get(&shard).ok_or(GrowthError::NotRecorded(shard))?;
        if groups.host().add_group(u64::from(shard), voters).await? {
            tracing::info!(shard, "opened a shard added to the live cluster");
        }
        count.raise(shard);
    }
    Ok(())
}

/// This replica's view of the shard set: the count and the added shards' voters.
type ShardSetView = (u32, BTreeMap<u32, BTreeMap<u64, String>>);

fn shard_set(groups: &Groups) -> Result<ShardSetView, GrowthError> {
    match groups.meta_query_local(&MetaQuery::ShardSet)? {
        MetaReply::ShardSet { shards, added } => Ok((shards, added)),
        other => Err(GrowthError::Unexpected(format!("{other:?}"))),
    }
}

#[cfg(test)]
#[path = "growth_tests.rs"]
mod tests;
