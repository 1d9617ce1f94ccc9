//! Meta's derived indexes over its groups, so no command and no per-round read visits
//! every group: the groups that ended (what old groups are forgotten from), the groups
//! the coordinator has work on in queue order (its `Pending` read), every group by its
//! change stamp (`ChangedSince`), the Placed groups by priority (the lowest preemption
//! could take), the Placed groups gangway releases at their run-time limit (not
//! Kubernetes pods, whose kubelets stop them) by their end, the count of groups in each state, and each queue's queued
//! and admitted groups (the metrics sampler reads both every second on every replica).
//!
//! Invariants: built from the groups on a state's first command or restore (never
//! encoded, so a snapshot carries only the groups), then kept exact by reindexing every
//! group a command changed ([`ChangeStamps`] records each change stamp given);
//! [`GroupIndex::check`] compares it with a fresh build (debug builds, after every
//! command on small states). Being derived, it compares equal always. Owned by
//! [`super::MetaState`]; nothing outside meta sees it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::groups::{GroupRecord, GroupSeq, GroupState};
use super::table::GroupTable;

/// The last change stamp given to a group ([`GroupRecord::bump`]), and the groups
/// stamped since the index last caught up (not state: never encoded).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChangeStamps {
    last: u64,
    #[serde(skip)]
    changed: Vec<GroupSeq>,
}

impl PartialEq for ChangeStamps {
    fn eq(&self, other: &Self) -> bool {
        self.last == other.last
    }
}

impl ChangeStamps {
    /// The last stamp given.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Gives `seq`, now at `version`, the next stamp above both; returns it.
    pub(super) fn next(&mut self, seq: GroupSeq, version: u64) -> u64 {
        let stamp = self.last.max(version) + 1;
        self.last = stamp;
        self.changed.push(seq);
        stamp
    }

    /// The groups stamped since the last call.
    pub(super) fn take_changed(&mut self) -> Vec<GroupSeq> {
        std::mem::take(&mut self.changed)
    }

    /// Tests only: sets the last stamp, as data written before stamps were global.
    #[cfg(test)]
    pub(super) fn set_last(&mut self, last: u64) {
        self.last = last;
    }
}

/// How a group counts in its queue's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueueCount {
    /// Queued, holding nothing.
    Queued,
    /// Being placed, placed, or holding members (anything but queued-empty and done).
    Admitted,
}

/// What one group is indexed under, so it can be taken out again after it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    version: u64,
    /// Position of its state's name in [`GroupState::NAMES`].
    state: u8,
    /// Its queue order key, when the coordinator has work on it.
    pending: Option<(i64, GroupSeq)>,
    /// Its highest priority, when it is Placed.
    placed: Option<i32>,
    /// When it is expected to end, when it is Placed with a run-time limit gangway
    /// enforces (its members are not Kubernetes pods).
    ends: Option<u64>,
    ended: bool,
    /// Its queue and how it counts there (None without a queue, or once done).
    queue: Option<(Arc<str>, QueueCount)>,
}

impl Entry {
    fn of(g: &GroupRecord) -> Self {
        let name = g.state.name();
        let state = GroupState::NAMES
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("group {}: state {name} has no index code", g.seq));
        let queue_count = match g.state {
            _ if g.group.queue.is_empty() => None,
            GroupState::Queued if g.holds_nothing() => Some(QueueCount::Queued),
            GroupState::Done { .. } => None,
            _ => Some(QueueCount::Admitted),
        };
        Entry {
            version: g.version,
            state: state as u8,
            pending: g.is_pending().then(|| g.order_key()),
            placed: (g.state == GroupState::Placed).then(|| g.highest_priority()),
            ends: (g.state == GroupState::Placed && g.group.run_limit_ms.is_some())
                .then(|| g.ends_at_ms().filter(|_| !g.is_kubernetes()))
                .flatten(),
            ended: g.state.is_terminal(),
            queue: queue_count.map(|c| (Arc::from(g.group.queue.as_str()), c)),
        }
    }
}

/// A queue's groups: (queued holding nothing, admitted).
pub(super) type QueueGroups = (u64, u64);

/// The indexes of one state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Indexes {
    entries: HashMap<GroupSeq, Entry>,
    by_stamp: BTreeSet<(u64, GroupSeq)>,
    pending: BTreeSet<(i64, GroupSeq)>,
    ended: BTreeSet<GroupSeq>,
    placed: BTreeSet<(i32, GroupSeq)>,
    ending: BTreeSet<(u64, GroupSeq)>,
    counts: [u64; GroupState::NAMES.len()],
    /// Per queue with any counted group.
    queues: BTreeMap<Arc<str>, QueueGroups>,
}

impl Indexes {
    fn build(groups: &GroupTable) -> Self {
        let mut built = Indexes::default();
        for g in groups.values() {
            built.insert(g.seq, Entry::of(g));
        }
        built
    }

    fn insert(&mut self, seq: GroupSeq, e: Entry) {
        self.by_stamp.insert((e.version, seq));
        if let Some(order) = e.pending {
            self.pending.insert(order);
        }
        if e.ended {
            self.ended.insert(seq);
        }
        if let Some(priority) = e.placed {
            self.placed.insert((priority, seq));
        }
        if let Some(end) = e.ends {
            self.ending.insert((end, seq));
        }
        self.counts[usize::from(e.state)] += 1;
        if let Some((queue, count)) = &e.queue {
            let groups = self.queues.entry(queue.clone()).or_default();
            match count {
                QueueCount::Queued => groups.0 += 1,
                QueueCount::Admitted => groups.1 += 1,
            }
        }
        self.entries.insert(seq, e);
    }

    fn remove(&mut self, seq: GroupSeq) {
        let Some(e) = self.entries.remove(&seq) else {
            return;
        };
        self.by_stamp.remove(&(e.version, seq));
        if let Some(order) = e.pending {
            self.pending.remove(&order);
        }
        self.ended.remove(&seq);
        if let Some(priority) = e.placed {
            self.placed.remove(&(priority, seq));
        }
        if let Some(end) = e.ends {
            self.ending.remove(&(end, seq));
        }
        self.counts[usize::from(e.state)] -= 1;
        if let Some((queue, count)) = &e.queue {
            if let Some(groups) = self.queues.get_mut(queue) {
                match count {
                    QueueCount::Queued => groups.0 -= 1,
                    QueueCount::Admitted => groups.1 -= 1,
                }
                if *groups == (0, 0) {
                    self.queues.remove(queue);
                }
            }
        }
    }

    fn reindex(&mut self, seq: GroupSeq, now: Option<&GroupRecord>) {
        let entry = now.map(Entry::of);
        if entry.is_some() && self.entries.get(&seq) == entry.as_ref() {
            return;
        }
        self.remove(seq);
        if let Some(e) = entry {
            self.insert(seq, e);
        }
    }
}

/// Meta's derived indexes (see the module header), built on first use. A clone
/// starts unbuilt: the copy a snapshot is encoded from needs none, and a clone that
/// applies commands builds its own from its groups.
#[derive(Debug, Default)]
pub(super) struct GroupIndex {
    built: Option<Indexes>,
}

impl Clone for GroupIndex {
    fn clone(&self) -> Self {
        GroupIndex::default()
    }
}

impl PartialEq for GroupIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl GroupIndex {
    /// Builds the indexes from `groups` unless they are kept already.
    pub(super) fn ensure(&mut self, groups: &GroupTable) {
        if self.built.is_none() {
            self.built = Some(Indexes::build(groups));
        }
    }

    /// Forgets the indexes (state changed outside `apply`): the next use builds them.
    pub(super) fn invalidate(&mut self) {
        self.built = None;
    }

    /// Brings `seqs` up to date with `groups` (a forgotten group leaves every index).
    pub(super) fn reindex(
        &mut self,
        groups: &GroupTable,
        seqs: impl IntoIterator<Item = GroupSeq>,
    ) {
        let Some(built) = self.built.as_mut() else {
            return;
        };
        for seq in seqs {
            built.reindex(seq, groups.get(&seq));
        }
    }

    /// The indexes for a read: the kept ones, or (on a state that has applied nothing
    /// since it was decoded or cloned) ones built for this read.
    pub(super) fn read<'a>(&'a self, groups: &GroupTable) -> Cow<'a, Indexes> {
        match &self.built {
            Some(built) => Cow::Borrowed(built),
            None => Cow::Owned(Indexes::build(groups)),
        }
    }

    /// Panics unless the kept indexes equal a fresh build from `groups` (after `what`).
    #[cfg(debug_assertions)]
    pub(super) fn check(&self, groups: &GroupTable, what: &dyn std::fmt::Debug) {
        if let Some(built) = &self.built {
            let fresh = Indexes::build(groups);
            assert!(
                *built == fresh,
                "meta's group index differs from its groups after {what:?}: kept {built:?}, groups {fresh:?}"
            );
        }
    }
}

impl Indexes {
    /// The groups that ended, oldest first.
    pub(super) fn ended(&self) -> impl Iterator<Item = GroupSeq> + '_ {
        self.ended.iter().copied()
    }

    /// How many groups ended.
    pub(super) fn ended_count(&self) -> usize {
        self.ended.len()
    }

    /// The groups the coordinator has work on, in queue order.
    pub(super) fn pending(&self) -> impl Iterator<Item = GroupSeq> + '_ {
        self.pending.iter().map(|(_, seq)| *seq)
    }

    /// The groups changed after stamp `after`, oldest change first.
    pub(super) fn changed_after(&self, after: u64) -> impl Iterator<Item = GroupSeq> + '_ {
        self.by_stamp
            .range((after.saturating_add(1), 0)..)
            .map(|(_, seq)| *seq)
    }

    /// Placed groups gangway releases at their limit whose end is at or before `at_ms`,
    /// earliest end first.
    pub(super) fn ended_by(&self, at_ms: u64) -> impl Iterator<Item = GroupSeq> + '_ {
        self.ending
            .range(..=(at_ms, GroupSeq::MAX))
            .map(|(_, seq)| *seq)
    }

    /// Placed groups, lowest priority first.
    pub(super) fn placed_by_priority(&self) -> impl Iterator<Item = (i32, GroupSeq)> + '_ {
        self.placed.iter().copied()
    }

    /// A queue's groups, (queued holding nothing, admitted); zeros if it has none.
    pub(super) fn queue_groups(&self, queue: &str) -> QueueGroups {
        self.queues.get(queue).copied().unwrap_or_default()
    }

    /// Groups per state name.
    pub(super) fn counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        GroupState::NAMES
            .iter()
            .copied()
            .zip(self.counts.iter().copied())
    }
}
