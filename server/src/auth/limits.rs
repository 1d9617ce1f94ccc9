//! What one identity may hold at once on one replica, beyond what the policy says:
//! open streams (group watches, device streams) per identity and in all, and how often
//! the replica computes state hashes for anyone (each one serializes every group's
//! state). Every bound is a named constant; past one, a call is refused
//! RESOURCE_EXHAUSTED saying which bound and when to retry. Used by the services.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Status;

/// Open streams (watches, device streams) one identity may have on one replica.
pub const STREAMS_PER_IDENTITY_MAX: u32 = 256;
/// Open streams on one replica in all.
pub const STREAMS_MAX: u32 = 8_192;
/// Shortest time between two state-hash computations of one replica, in ms.
pub const STATE_HASH_INTERVAL_MS: u64 = 200;

/// Open streams, per identity.
#[derive(Clone, Default)]
pub struct StreamLimits {
    open: Arc<Mutex<BTreeMap<String, u32>>>,
}

/// One open stream, counted until dropped.
#[derive(Debug)]
pub struct StreamSlot {
    name: String,
    open: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.open.lock() {
            if let Some(n) = open.get_mut(&self.name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&self.name);
                }
            }
        }
    }
}

impl StreamLimits {
    /// A slot for one more stream of `name` (the empty name: callers without an
    /// identity on an open replica, counted together), or RESOURCE_EXHAUSTED.
    pub fn open(&self, name: &str) -> Result<StreamSlot, Status> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| Status::internal("stream counts poisoned"))?;
        let total: u32 = open.values().sum();
        if total >= STREAMS_MAX {
            return Err(Status::resource_exhausted(format!(
                "this replica has {STREAMS_MAX} streams open; retry later or on another replica"
            )));
        }
        let n = open.entry(name.to_string()).or_default();
        if *n >= STREAMS_PER_IDENTITY_MAX {
            let who = if name.is_empty() { "this caller" } else { name };
            return Err(Status::resource_exhausted(format!(
                "{who} has {STREAMS_PER_IDENTITY_MAX} streams open on this replica; close some first"
            )));
        }
        *n += 1;
        Ok(StreamSlot {
            name: name.to_string(),
            open: self.open.clone(),
        })
    }

    /// Streams open for `name`.
    pub fn count(&self, name: &str) -> u32 {
        self.open
            .lock()
            .map(|o| o.get(name).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// At most one state-hash computation per [`STATE_HASH_INTERVAL_MS`] per replica.
#[derive(Clone, Default)]
pub struct HashRate {
    last: Arc<Mutex<Option<Instant>>>,
}

impl HashRate {
    /// Takes the next computation, or RESOURCE_EXHAUSTED naming when to retry.
    pub fn take(&self, now: Instant) -> Result<(), Status> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| Status::internal("state hash rate poisoned"))?;
        let interval = Duration::from_millis(STATE_HASH_INTERVAL_MS);
        if let Some(before) = *last {
            let since = now.saturating_duration_since(before);
            if since < interval {
                return Err(Status::resource_exhausted(format!(
                    "state hashes are computed at most every {STATE_HASH_INTERVAL_MS} ms on a \
                     replica; retry in {} ms",
                    (interval - since).as_millis()
                )));
            }
        }
        *last = Some(now);
        Ok(())
    }
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
