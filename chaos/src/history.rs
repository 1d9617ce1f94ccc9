//! What clients saw and what the supervisor did, in order: every operation as
//! invoke → ok / fail / unknown, and every fault and heal. Kept in memory for
//! the checker and appended to a JSONL file (one event per line) as it
//! happens, so a drill that dies still leaves its history.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// A member's placement as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// namespace/gang/member.
    pub member: String,
    /// The node.
    pub node: String,
    /// Devices as driver/pool/device.
    pub devices: Vec<String>,
}

/// One gang of a submitted group, as the workload built it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangShape {
    /// namespace/name.
    pub name: String,
    /// Members that must be placed together.
    pub min_member: u32,
    /// Members.
    pub members: u32,
    /// Strict or NonStrict.
    pub mode: String,
    /// CPUs per member.
    pub cpu: u32,
    /// Devices per member.
    pub gpu: u32,
    /// The gang's priority (a group of higher priority may preempt it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// The node label whose one value every member must share (a required topology
    /// level), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// What an event records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A client started an operation.
    Invoke {
        /// Operation id (unique in the drill).
        op: u64,
        /// place, release, release_members or cancel.
        f: String,
        /// The idempotency key (place) or the group id (others), as text.
        key: String,
        /// The group's gangs (place only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gangs: Vec<GangShape>,
        /// Members named (release_members only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<String>,
    },
    /// The operation took effect.
    Ok {
        /// Operation id.
        op: u64,
        /// The group.
        group: u64,
        /// Its state in the answer.
        state: String,
        /// Its placements in the answer (place only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        placed: Vec<Placed>,
    },
    /// The operation certainly did not take effect (or the group ended otherwise).
    Fail {
        /// Operation id.
        op: u64,
        /// Why.
        error: String,
    },
    /// The client does not know whether it took effect.
    Unknown {
        /// Operation id.
        op: u64,
        /// The last error.
        error: String,
    },
    /// The supervisor injected a fault.
    Fault {
        /// Fault id.
        fault: u64,
        /// What kind.
        what: String,
        /// The replicas it hit.
        targets: Vec<u64>,
        /// Groups the targets led when it was injected.
        led: Vec<u64>,
        /// Whether only one replica was lost (recovery counts from the fault then).
        single_replica: bool,
    },
    /// The supervisor ended a fault.
    Heal {
        /// Fault id.
        fault: u64,
    },
    /// Something the checker should know that is no operation (e.g. a failpoint fired).
    Note {
        /// Text.
        text: String,
    },
}

/// An event with its time since the drill started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since the drill started.
    pub t_ms: u64,
    /// The event.
    #[serde(flatten)]
    pub event: Event,
}

/// A shared, append-only history.
#[derive(Clone)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
    start: Instant,
}

struct Inner {
    entries: Vec<Entry>,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl History {
    /// A history that also writes to `path` (JSONL), if given.
    pub fn new(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p)?)),
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                entries: Vec::new(),
                file,
            })),
            start: Instant::now(),
        })
    }

    /// Milliseconds since the drill started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Appends `event` now; returns its time.
    pub fn record(&self, event: Event) -> u64 {
        let entry = Entry {
            t_ms: self.now_ms(),
            event,
        };
        let t = entry.t_ms;
        if let Ok(mut inner) = self.inner.lock() {
            if let Some(file) = inner.file.as_mut() {
                if let Ok(line) = serde_json::to_string(&entry) {
                    let _ = writeln!(file, "{line}");
                }
            }
            inner.entries.push(entry);
        }
        t
    }

    /// Everything recorded so far (and flushes the file).
    pub fn entries(&self) -> Vec<Entry> {
        match self.inner.lock() {
            Ok(mut inner) => {
                if let Some(file) = inner.file.as_mut() {
                    let _ = file.flush();
                }
                inner.entries.clone()
            }
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
