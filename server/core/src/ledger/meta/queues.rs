//! The queues the meta group keeps, and what each one's groups are charged.
//!
//! Owns [`Queues`]: every [`QueueSpec`] by name and each queue's usage, the sum of the
//! charges of the groups in its subtree (its own groups and its descendants'). A group
//! is charged when it holds, or is being given, capacity (docs/ARCHITECTURE.md, queues);
//! the charge goes to its queue and every ancestor. Invariant I8: no queue's usage
//! passes its `max` — [`Queues::refusal`] is asked before every charge that grows, and a
//! queue's `max` cannot be lowered below its usage. Pure and deterministic; called by
//! [`super::MetaState`] only.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::usage_history::{
    UsageHistory, FAIR_SHARE_HALF_LIFE_MS_MAX, FAIR_SHARE_HALF_LIFE_MS_MIN,
};
use crate::model::queue::{Amount, QUEUES_MAX, QUEUE_DEPTH_MAX};
use crate::model::{FieldPath, QueueSpec, ResourceName, Resources};

/// A queue as the API shows it: its spec and what it uses now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The queue.
    pub spec: QueueSpec,
    /// What its subtree's groups are charged.
    pub usage: Resources,
    /// Its subtree's usage over time, decayed by the half-life; `None` while fair
    /// sharing over time is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decayed_usage: Option<Resources>,
    /// Its own groups waiting to be placed.
    pub queued: u64,
    /// Its own groups holding capacity (placing, placed, or releasing).
    pub admitted: u64,
}

/// Every queue, with its subtree's usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queues {
    specs: BTreeMap<String, QueueSpec>,
    /// Name → the charges of its subtree's groups; an entry for every queue.
    usage: BTreeMap<String, Resources>,
    /// The cluster's allocatable resources as the coordinator last recorded them: the
    /// pool top-level queues share when lending limits apply. `None` until recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<Resources>,
    /// Each queue's usage over time, while fair sharing over time is on
    /// (`MetaCommand::SampleUsage` with a half-life); `None`: the fair order reads
    /// current usage only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history: Option<UsageHistory>,
}

impl Queues {
    /// Whether no queue is defined.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// One queue's spec.
    pub fn spec(&self, name: &str) -> Option<&QueueSpec> {
        self.specs.get(name)
    }

    /// Every queue's spec, in name order.
    pub fn specs(&self) -> impl Iterator<Item = &QueueSpec> {
        self.specs.values()
    }

    /// One queue's subtree usage (zero for an unknown queue).
    pub fn usage(&self, name: &str) -> Resources {
        self.usage.get(name).cloned().unwrap_or_default()
    }

    /// Whether queue `name` is `root` or under it.
    pub fn within(&self, name: &str, root: &str) -> bool {
        self.chain(name).any(|q| q.name == root)
    }

    /// `name` and its ancestors, nearest first (stops at an unknown name).
    fn chain<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a QueueSpec> + 'a {
        let mut next = Some(name);
        let mut steps = 0usize;
        std::iter::from_fn(move || {
            let spec = self.specs.get(next?)?;
            steps += 1;
            // The tree is checked acyclic at every change: a longer chain is corruption.
            assert!(steps <= QUEUES_MAX, "queue {name}'s ancestors form a cycle");
            next = (!spec.parent.is_empty()).then_some(spec.parent.as_str());
            Some(spec)
        })
    }

    /// Records the cluster's allocatable resources (`MetaCommand::NoteCapacity`).
    pub fn set_capacity(&mut self, capacity: Resources) {
        self.capacity = Some(capacity);
    }

    /// The cluster's allocatable resources as last recorded.
    pub fn capacity(&self) -> Option<&Resources> {
        self.capacity.as_ref()
    }

    /// Advances every queue's usage over time to `at_ms` (`MetaCommand::SampleUsage`);
    /// a half-life of 0 forgets the history and turns fair sharing over time off.
    pub fn sample_usage(&mut self, at_ms: u64, half_life_ms: u64) -> Result<(), String> {
        if half_life_ms == 0 {
            self.history = None;
            return Ok(());
        }
        let range = FAIR_SHARE_HALF_LIFE_MS_MIN..=FAIR_SHARE_HALF_LIFE_MS_MAX;
        if !range.contains(&half_life_ms) {
            return Err(format!(
                "half_life_ms: {half_life_ms} is not 0 or in {FAIR_SHARE_HALF_LIFE_MS_MIN}..={FAIR_SHARE_HALF_LIFE_MS_MAX}"
            ));
        }
        match &mut self.history {
            Some(history) => history.sample(at_ms, half_life_ms, &self.usage),
            None => self.history = Some(UsageHistory::starting(at_ms, half_life_ms)),
        }
        Ok(())
    }

    /// Each queue's usage over time, while fair sharing over time is on.
    pub fn history(&self) -> Option<&UsageHistory> {
        self.history.as_ref()
    }

    /// What the fair order measures queue `name` by: its usage now, plus, while fair
    /// sharing over time is on, its decayed usage.
    pub fn fair_usage(&self, name: &str) -> Resources {
        let now = self.usage(name);
        match &self.history {
            Some(history) => now.saturating_add(&history.decayed(name)),
            None => now,
        }
    }

    /// Why charging `more` to queue `name` would pass some `max` on its chain, or make
    /// it borrow what lending limits keep ([`Self::lending_refusal`]), naming the queue
    /// and resource; `None` when it fits.
    pub fn refusal(&self, name: &str, more: &Resources) -> Option<String> {
        if more.is_zero() {
            return None;
        }
        self.max_refusal(name, more)
            .or_else(|| self.lending_refusal(name, more))
    }

    fn max_refusal(&self, name: &str, more: &Resources) -> Option<String> {
        self.chain(name).find_map(|q| {
            let after = self.usage(&q.name).saturating_add(more);
            q.max.first_exceeded(&after).map(|(resource, used, max)| {
                let asked = more.get(&resource);
                let held = used.saturating_sub(asked);
                let whose = if q.name == name {
                    format!("queue {name}")
                } else {
                    format!("queue {name}'s ancestor {}", q.name)
                };
                format!(
                    "{whose} has no room: {resource} {} asked, {} used of max {}",
                    Amount(&resource, asked),
                    Amount(&resource, held),
                    Amount(&resource, max)
                )
            })
        })
    }

    /// The resources some queue names a lending limit for, in name order.
    fn lent_resources(&self) -> Vec<ResourceName> {
        let mut out: Vec<ResourceName> = self
            .specs
            .values()
            .flat_map(|q| q.lend.iter().map(|(r, _)| r))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The pool the children of `parent` ("" for the top) share of `resource`: the
    /// parent's `max`, or for top-level queues the cluster's recorded capacity.
    fn pool(&self, parent: &str, resource: &ResourceName) -> Option<u64> {
        if parent.is_empty() {
            // A resource the nodes' allocatable does not list (devices a plugin or a DRA
            // driver serves) has no recorded capacity: unknown, not zero.
            self.capacity
                .as_ref()
                .map(|c| c.get(resource))
                .filter(|amount| *amount > 0)
        } else {
            self.specs.get(parent)?.max.get(resource)
        }
    }

    /// What `parent` holds of `resource` (its own groups and its children's; for the
    /// top, what every top-level queue holds).
    fn pool_usage(&self, parent: &str, resource: &ResourceName) -> u64 {
        if parent.is_empty() {
            self.specs
                .values()
                .filter(|q| q.parent.is_empty())
                .map(|q| self.usage(&q.name).get(resource))
                .sum()
        } else {
            self.usage(parent).get(resource)
        }
    }

    /// What of `resource` must stay free for queue `name`'s subtree to claim its
    /// unlendable guarantees, were `more` added to every queue in `grown`:
    /// kept(q) = max(unlendable(q) − usage(q), Σ kept(children of q)).
    fn kept(
        &self,
        name: &str,
        resource: &ResourceName,
        grown: &[&str],
        more: u64,
        children: &BTreeMap<&str, Vec<&str>>,
    ) -> u64 {
        let Some(spec) = self.specs.get(name) else {
            return 0;
        };
        let mut used = self.usage(name).get(resource);
        if grown.contains(&name) {
            used = used.saturating_add(more);
        }
        let own = spec.unlendable(resource).saturating_sub(used);
        let below: u64 = children
            .get(name)
            .map(|cs| {
                cs.iter()
                    .map(|c| self.kept(c, resource, grown, more, children))
                    .sum()
            })
            .unwrap_or(0);
        own.max(below)
    }

    /// Why charging `more` to queue `name` would borrow what lending limits keep. From
    /// the lowest level of its chain where the queue on the chain (`c`, under parent
    /// `p`) would pass its `min` of a resource — it borrows there — up to the top, at
    /// every level where `p`'s pool is known ([`Self::pool`]), what `p` holds, plus
    /// `more`, plus what every child of `p` must keep free afterwards ([`Self::kept`]),
    /// must fit the pool. An admission within the `min` of every queue on its chain is
    /// never refused here: if the room is gone, reclaim returns it.
    pub fn lending_refusal(&self, name: &str, more: &Resources) -> Option<String> {
        let lent = self.lent_resources();
        if lent.is_empty() {
            return None;
        }
        let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for q in self.specs.values() {
            children
                .entry(q.parent.as_str())
                .or_default()
                .push(q.name.as_str());
        }
        let grown: Vec<&str> = self.chain(name).map(|q| q.name.as_str()).collect();
        // Resources some queue below on the chain borrows: every level above is checked
        // for them, within its own min or not (the borrowed room is someone's there).
        let mut borrowed: BTreeSet<&ResourceName> = BTreeSet::new();
        for c in self.chain(name) {
            for resource in &lent {
                let asked = more.get(resource);
                let used_by_c = self.usage(&c.name).get(resource);
                let guaranteed = c.min.get(resource).unwrap_or(0);
                if asked == 0 {
                    continue;
                }
                if used_by_c.saturating_add(asked) > guaranteed {
                    borrowed.insert(resource);
                }
                if !borrowed.contains(resource) {
                    continue;
                }
                let Some(pool) = self.pool(&c.parent, resource) else {
                    continue;
                };
                let siblings = children.get(c.parent.as_str()).cloned().unwrap_or_default();
                let kept: Vec<(&str, u64)> = siblings
                    .iter()
                    .map(|s| (*s, self.kept(s, resource, &grown, asked, &children)))
                    .filter(|(_, k)| *k > 0)
                    .collect();
                let kept_sum: u64 = kept.iter().map(|(_, k)| k).sum();
                let used = self.pool_usage(&c.parent, resource);
                // Nothing kept: the shards alone judge whether the cluster has room.
                if kept_sum == 0 || used.saturating_add(asked).saturating_add(kept_sum) <= pool {
                    continue;
                }
                let whose = if c.parent.is_empty() {
                    format!("the cluster's {}", Amount(resource, pool))
                } else {
                    format!("queue {}'s max {}", c.parent, Amount(resource, pool))
                };
                let keepers: Vec<String> = kept
                    .iter()
                    .map(|(s, k)| format!("{} for {s}", Amount(resource, *k)))
                    .collect();
                let borrower = if c.name == name {
                    format!("queue {name}")
                } else {
                    format!("queue {name}'s ancestor {}", c.name)
                };
                return Some(format!(
                    "{borrower} would borrow {resource} that lending limits keep: {} asked, {} used of {whose}, {} kept free ({})",
                    Amount(resource, asked),
                    Amount(resource, used),
                    Amount(resource, kept_sum),
                    keepers.join(", ")
                ));
            }
        }
        None
    }

    /// Adds `amount` to queue `name`'s chain. The caller asked [`Self::refusal`] first.
    pub fn charge(&mut self, name: &str, amount: &Resources) {
        let names: Vec<String> = self.chain(name).map(|q| q.name.clone()).collect();
        for n in names {
            let usage = self.usage.entry(n).or_default();
            *usage = usage.saturating_add(amount);
        }
    }

    /// Takes `amount` off queue `name`'s chain.
    ///
    /// # Panics
    /// When some queue on the chain uses less than `amount`: the charges are corrupt.
    pub fn refund(&mut self, name: &str, amount: &Resources) {
        let names: Vec<String> = self.chain(name).map(|q| q.name.clone()).collect();
        for n in names {
            let usage = self.usage.entry(n.clone()).or_default();
            *usage = usage
                .checked_sub(amount)
                .unwrap_or_else(|| panic!("queue {n} refunded {amount:?} but uses only {usage:?}"));
        }
    }

    /// Creates or changes a queue. Refused, naming the field: a bad spec, an unknown
    /// parent, a cycle, a tree too deep or too large, a `max` (its own, or a new
    /// ancestor's) below what the subtree uses now.
    pub fn put(&mut self, spec: &QueueSpec) -> Result<(), String> {
        let path = FieldPath::new("queue");
        spec.validate(&path).map_err(|e| e.to_string())?;
        let old = self.specs.get(&spec.name).cloned();
        if old.is_none() && self.specs.len() >= QUEUES_MAX {
            return Err(format!(
                "queue: {QUEUES_MAX} queues exist, the most allowed"
            ));
        }
        if !spec.parent.is_empty() {
            if !self.specs.contains_key(&spec.parent) {
                return Err(format!(
                    "queue.parent: no queue {}; create it first",
                    spec.parent
                ));
            }
            let above: Vec<&str> = self.chain(&spec.parent).map(|q| q.name.as_str()).collect();
            if above.contains(&spec.name.as_str()) {
                return Err(format!(
                    "queue.parent: {} is below {} already; a queue cannot sit under its own descendant",
                    spec.parent, spec.name
                ));
            }
            if above.len() + 1 + self.height(&spec.name) > QUEUE_DEPTH_MAX {
                return Err(format!(
                    "queue.parent: the tree would be deeper than {QUEUE_DEPTH_MAX} levels"
                ));
            }
        }
        let used = self.usage(&spec.name);
        if let Some((resource, used, max)) = spec.max.first_exceeded(&used) {
            return Err(format!(
                "queue.max.{resource}: {} is below what the queue's groups use now ({}); release some first",
                Amount(&resource, max),
                Amount(&resource, used)
            ));
        }
        let moved = old.as_ref().is_some_and(|o| o.parent != spec.parent);
        let old_parent = old.map(|o| o.parent).unwrap_or_default();
        if moved {
            // Off the old chain first: the new one may share ancestors with it.
            if !old_parent.is_empty() {
                self.refund(&old_parent, &used);
            }
            if !spec.parent.is_empty() {
                if let Some(why) = self.refusal(&spec.parent, &used) {
                    if !old_parent.is_empty() {
                        self.charge(&old_parent, &used);
                    }
                    return Err(format!("queue.parent: its groups do not fit there: {why}"));
                }
            }
        }
        self.specs.insert(spec.name.clone(), spec.clone());
        self.usage.entry(spec.name.clone()).or_default();
        if moved && !spec.parent.is_empty() {
            self.charge(&spec.parent.clone(), &used);
        }
        Ok(())
    }

    /// Levels below `name` (0 for a leaf).
    fn height(&self, name: &str) -> usize {
        self.specs
            .values()
            .filter(|q| q.parent == name)
            .map(|q| 1 + self.height(&q.name))
            .max()
            .unwrap_or(0)
    }

    /// Deletes a queue with no children and nothing charged. `live` is how many groups
    /// not yet ended name it (they must end first).
    pub fn delete(&mut self, name: &str, live: u64) -> Result<(), String> {
        if !self.specs.contains_key(name) {
            return Err(format!("name: no queue {name}"));
        }
        if let Some(child) = self.specs.values().find(|q| q.parent == name) {
            return Err(format!(
                "name: queue {name} has child queue {}; delete or move its children first",
                child.name
            ));
        }
        if live > 0 {
            return Err(format!(
                "name: {live} gang groups of queue {name} have not ended; cancel or release them first"
            ));
        }
        if !self.usage(name).is_zero() {
            // No live group, yet a charge: corruption, not a user error.
            panic!(
                "queue {name} has no live group but uses {:?}",
                self.usage(name)
            );
        }
        self.specs.remove(name);
        self.usage.remove(name);
        Ok(())
    }

    /// The usage every queue would have with `charges` (queue → own groups' charges),
    /// recomputed from scratch: what the kept usage must equal.
    pub fn recomputed<'a>(
        &self,
        charges: impl Iterator<Item = (&'a str, &'a Resources)>,
    ) -> BTreeMap<String, Resources> {
        let mut fresh = Self {
            capacity: self.capacity.clone(),
            specs: self.specs.clone(),
            usage: self
                .specs
                .keys()
                .map(|n| (n.clone(), Resources::zero()))
                .collect(),
            history: None,
        };
        for (queue, charge) in charges {
            fresh.charge(queue, charge);
        }
        fresh.usage
    }

    /// The kept usage of every queue.
    pub fn all_usage(&self) -> &BTreeMap<String, Resources> {
        &self.usage
    }
}

/// A queue's dominant share, for ordering ([`Queues::fair_order`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share(pub f64);

impl Eq for Share {}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The dominant share of a queue using `usage`: the largest fraction of its basis it
/// uses over the resources of the basis, divided by its weight. The basis is its `min`
/// (the resources it names with an amount above zero), else its `max`, else its usage
/// is measured in pods held (so a queue with neither orders after the queues below
/// their guarantee).
pub fn share(spec: &QueueSpec, usage: &Resources) -> Share {
    let basis = |limits: &crate::model::queue::Limits| -> Option<f64> {
        limits
            .iter()
            .filter(|(_, amount)| *amount > 0)
            .map(|(r, amount)| usage.get(&r) as f64 / amount as f64)
            .reduce(f64::max)
    };
    let dominant = basis(&spec.min)
        .or_else(|| basis(&spec.max))
        .unwrap_or(usage.pods as f64);
    Share(dominant / f64::from(spec.weight.max(1)))
}

/// What a queue of the fair order's tree picks among: a child queue's subtree, or its
/// own groups. Ties of share go to the child's name, a queue's own groups after its
/// children (the derived order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Child(String),
    Own,
}

/// One queue (or the root, named "") during a fair order: its slots by share, its own
/// groups not yet taken, and its usage counting the groups taken so far.
struct OrderNode<T> {
    slots: std::collections::BinaryHeap<std::cmp::Reverse<(Share, Slot)>>,
    own: std::collections::VecDeque<T>,
    subtree: Resources,
    own_usage: Resources,
}

impl<T> OrderNode<T> {
    fn new() -> Self {
        Self {
            slots: std::collections::BinaryHeap::new(),
            own: std::collections::VecDeque::new(),
            subtree: Resources::zero(),
            own_usage: Resources::zero(),
        }
    }
}

/// Queued groups in fair order ([`Queues::fair_order`]), computed as they are taken:
/// a reader that stops early pays only for the groups it took.
pub struct FairOrder<'a, T, F> {
    queues: &'a Queues,
    unqueued: std::vec::IntoIter<T>,
    nodes: BTreeMap<String, OrderNode<T>>,
    charge: F,
}

impl<T, F: Fn(&T) -> Resources> Iterator for FairOrder<'_, T, F> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if let Some(item) = self.unqueued.next() {
            return Some(item);
        }
        self.take_fairest()
    }
}

impl Queues {
    /// Queued groups in the order a round takes them: groups without a queue first, as
    /// given; then hierarchical dominant-resource fairness — each next group is found by
    /// walking down from the top, at every queue taking the slot with the lowest
    /// [`share`]: a child queue by its subtree's usage, or the queue's own groups (one
    /// more slot) by what they alone use, usage counting what the groups already taken
    /// would be charged (`charge`, asked once per group taken). Usage is
    /// [`Self::fair_usage`]: with fair sharing over time on, the decayed usage counts
    /// too. Within a queue, the
    /// order given (priority, then creation). `groups` are (queue, item) in within-queue
    /// order. Each pick pops and pushes one slot per level: O(depth × log siblings).
    pub fn fair_order<T, F: Fn(&T) -> Resources>(
        &self,
        groups: Vec<(String, T)>,
        charge: F,
    ) -> FairOrder<'_, T, F> {
        use std::cmp::Reverse;
        let mut unqueued = Vec::new();
        let mut nodes: BTreeMap<String, OrderNode<T>> = BTreeMap::new();
        for (queue, item) in groups {
            if queue.is_empty() || !self.specs.contains_key(&queue) {
                unqueued.push(item);
            } else {
                nodes
                    .entry(queue)
                    .or_insert_with(OrderNode::new)
                    .own
                    .push_back(item);
            }
        }
        let lines: Vec<String> = nodes.keys().cloned().collect();
        for q in &lines {
            for above in self.chain(q).skip(1) {
                nodes
                    .entry(above.name.clone())
                    .or_insert_with(OrderNode::new);
            }
        }
        let mut children_usage: BTreeMap<&str, Resources> = BTreeMap::new();
        for spec in self.specs.values() {
            if nodes.contains_key(&spec.parent) {
                let sum = children_usage.entry(spec.parent.as_str()).or_default();
                *sum = sum.saturating_add(&self.fair_usage(&spec.name));
            }
        }
        let mut pushes = Vec::new();
        for (name, node) in nodes.iter_mut() {
            let Some(spec) = self.specs.get(name) else {
                continue;
            };
            node.subtree = self.fair_usage(name);
            node.own_usage = node.subtree.saturating_sub(
                &children_usage
                    .get(name.as_str())
                    .cloned()
                    .unwrap_or_default(),
            );
            if !node.own.is_empty() {
                node.slots
                    .push(Reverse((share(spec, &node.own_usage), Slot::Own)));
            }
            pushes.push((
                spec.parent.clone(),
                share(spec, &node.subtree),
                Slot::Child(name.clone()),
            ));
        }
        let mut root = OrderNode::new();
        for (parent, s, slot) in pushes {
            let at = if parent.is_empty() {
                &mut root
            } else {
                nodes.entry(parent).or_insert_with(OrderNode::new)
            };
            at.slots.push(Reverse((s, slot)));
        }
        nodes.insert(String::new(), root);
        FairOrder {
            queues: self,
            unqueued: unqueued.into_iter(),
            nodes,
            charge,
        }
    }
}

impl<T, F: Fn(&T) -> Resources> FairOrder<'_, T, F> {
    /// The next group: down from the root along the lowest slots, then the taken
    /// group's charge added along the path and each slot pushed back while it still
    /// has groups. `None` once every group is taken.
    fn take_fairest(&mut self) -> Option<T> {
        use std::cmp::Reverse;
        let nodes = &mut self.nodes;
        let specs = &self.queues.specs;
        let mut path: Vec<(String, Slot)> = Vec::new();
        let mut at = String::new();
        let item = loop {
            let node = nodes.get_mut(&at)?;
            let Reverse((_, slot)) = node.slots.pop()?;
            path.push((at.clone(), slot.clone()));
            match slot {
                Slot::Own => break node.own.pop_front()?,
                Slot::Child(c) => at = c,
            }
        };
        let charge = (self.charge)(&item);
        if let Some(node) = nodes.get_mut(&at) {
            node.own_usage = node.own_usage.saturating_add(&charge);
        }
        for (_, slot) in &path {
            if let Slot::Child(c) = slot {
                if let Some(node) = nodes.get_mut(c) {
                    node.subtree = node.subtree.saturating_add(&charge);
                }
            }
        }
        for (parent, slot) in path.into_iter().rev() {
            let again = match &slot {
                Slot::Own => nodes.get(&parent).and_then(|n| {
                    let spec = specs.get(&parent)?;
                    (!n.own.is_empty()).then(|| share(spec, &n.own_usage))
                }),
                Slot::Child(c) => nodes.get(c).and_then(|n| {
                    let spec = specs.get(c)?;
                    (!n.slots.is_empty()).then(|| share(spec, &n.subtree))
                }),
            };
            if let (Some(s), Some(node)) = (again, nodes.get_mut(&parent)) {
                node.slots.push(Reverse((s, slot)));
            }
        }
        Some(item)
    }
}

#[cfg(test)]
#[path = "queues_tests.rs"]
mod tests;
