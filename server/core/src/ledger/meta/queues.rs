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

use crate::model::queue::{Amount, QUEUES_MAX, QUEUE_DEPTH_MAX};
use crate::model::{FieldPath, QueueSpec, ResourceName, Resources};

/// A queue as the API shows it: its spec and what it uses now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The queue.
    pub spec: QueueSpec,
    /// What its subtree's groups are charged.
    pub usage: Resources,
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
    /// would be charged (`charge`, asked once per group taken). Within a queue, the
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
                *sum = sum.saturating_add(&self.usage(&spec.name));
            }
        }
        let mut pushes = Vec::new();
        for (name, node) in nodes.iter_mut() {
            let Some(spec) = self.specs.get(name) else {
                continue;
            };
            node.subtree = self.usage(name);
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
mod tests {
    use super::*;
    use crate::model::queue::Limits;
    use crate::model::ResourceName;
    use proptest::prelude::*;

    fn cpu(cores: u64) -> Resources {
        let mut r = Resources::zero();
        r.set(&ResourceName::Cpu, cores * 1_000);
        r
    }

    fn queue(name: &str, parent: &str, max_cores: Option<u64>) -> QueueSpec {
        let mut max = Limits::none();
        if let Some(c) = max_cores {
            max.set(&ResourceName::Cpu, c * 1_000);
        }
        QueueSpec {
            name: name.into(),
            parent: parent.into(),
            weight: 1,
            min: Limits::none(),
            max,
            lend: crate::model::queue::Limits::none(),
            managed_by: String::new(),
            namespaces: Vec::new(),
        }
    }

    #[test]
    fn a_charge_counts_for_every_ancestor_and_any_max_on_the_chain_refuses() {
        let mut q = Queues::default();
        q.put(&queue("org", "", Some(10))).expect("org");
        q.put(&queue("a", "org", Some(8))).expect("a");
        q.put(&queue("b", "org", None)).expect("b");
        assert_eq!(q.refusal("a", &cpu(8)), None);
        q.charge("a", &cpu(6));
        assert_eq!(q.usage("org"), cpu(6));
        let own = q.refusal("a", &cpu(3)).expect("a's max");
        assert!(
            own.starts_with("queue a has no room: cpu 3 asked, 6 used of max 8"),
            "{own}"
        );
        let up = q.refusal("b", &cpu(5)).expect("org's max");
        assert!(
            up.starts_with("queue b's ancestor org has no room: cpu 5 asked, 6 used of max 10"),
            "{up}"
        );
        assert_eq!(q.refusal("b", &cpu(4)), None, "b borrows up to org's max");
        q.refund("a", &cpu(6));
        assert_eq!(q.usage("org"), Resources::zero());
    }

    #[test]
    fn a_tree_stays_a_tree_and_max_never_drops_below_usage() {
        let mut q = Queues::default();
        q.put(&queue("org", "", None)).expect("org");
        q.put(&queue("a", "org", None)).expect("a");
        let cycle = q.put(&queue("org", "a", None)).expect_err("cycle");
        assert!(cycle.starts_with("queue.parent:"), "{cycle}");
        let orphan = q
            .put(&queue("c", "nowhere", None))
            .expect_err("unknown parent");
        assert!(orphan.contains("no queue nowhere"), "{orphan}");
        q.charge("a", &cpu(5));
        let low = q.put(&queue("a", "org", Some(4))).expect_err("below usage");
        assert!(low.starts_with("queue.max.cpu: 4 is below"), "{low}");
        q.put(&queue("small", "", Some(2))).expect("small");
        let squeeze = q.put(&queue("a", "small", None)).expect_err("does not fit");
        assert!(
            squeeze.contains("ancestor") || squeeze.contains("queue small"),
            "{squeeze}"
        );
        q.put(&queue("big", "", Some(5))).expect("big");
        q.put(&queue("a", "big", None))
            .expect("moves with its usage");
        assert_eq!(q.usage("org"), Resources::zero());
        assert_eq!(q.usage("big"), cpu(5));
        let busy = q.delete("a", 1).expect_err("live group");
        assert!(busy.contains("1 gang groups"), "{busy}");
        let parent = q.delete("big", 0).expect_err("has a child");
        assert!(parent.contains("child queue a"), "{parent}");
    }

    /// The fair order of (queue, charge, item) groups, taken whole.
    fn ordered<T>(q: &Queues, groups: Vec<(String, Resources, T)>) -> Vec<T> {
        q.fair_order(
            groups
                .into_iter()
                .map(|(queue, c, item)| (queue, (c, item)))
                .collect(),
            |(c, _)| c.clone(),
        )
        .map(|(_, item)| item)
        .collect()
    }

    /// The fair order as its definition reads, recomputing every share at each pick: from
    /// the top, the lowest of the children with a group left in their subtree (by the
    /// subtree's usage) and the queue's own groups (by their own usage), ties to the
    /// child's name and own groups last.
    fn reference_order(q: &Queues, groups: &[(String, Resources, u32)]) -> Vec<u32> {
        let known = |queue: &str| !queue.is_empty() && q.spec(queue).is_some();
        let mut out: Vec<u32> = groups
            .iter()
            .filter(|(queue, _, _)| !known(queue))
            .map(|(_, _, id)| *id)
            .collect();
        let mut taken: Vec<bool> = groups.iter().map(|(queue, _, _)| !known(queue)).collect();
        let below = |queue: &str, top: &str| q.chain(queue).any(|s| s.name == top);
        let own_usage = |name: &str| {
            let children = q
                .specs()
                .filter(|s| s.parent == name)
                .fold(Resources::zero(), |acc, s| {
                    acc.saturating_add(&q.usage(&s.name))
                });
            q.usage(name).saturating_sub(&children)
        };
        loop {
            let mut at = String::new();
            let head = loop {
                let mut best: Option<(Share, Slot)> = None;
                for spec in q.specs().filter(|s| s.parent == at) {
                    if !(0..groups.len()).any(|i| !taken[i] && below(&groups[i].0, &spec.name)) {
                        continue;
                    }
                    let mut used = q.usage(&spec.name);
                    for (i, (queue, charge, _)) in groups.iter().enumerate() {
                        if taken[i] && known(queue) && below(queue, &spec.name) {
                            used = used.saturating_add(charge);
                        }
                    }
                    let cand = (share(spec, &used), Slot::Child(spec.name.clone()));
                    if best.as_ref().is_none_or(|b| cand < *b) {
                        best = Some(cand);
                    }
                }
                if let Some(spec) = q.spec(&at) {
                    let own_head = (0..groups.len()).find(|&i| !taken[i] && groups[i].0 == at);
                    if own_head.is_some() {
                        let mut used = own_usage(&at);
                        for (i, (queue, charge, _)) in groups.iter().enumerate() {
                            if taken[i] && *queue == at {
                                used = used.saturating_add(charge);
                            }
                        }
                        let cand = (share(spec, &used), Slot::Own);
                        if best.as_ref().is_none_or(|b| cand < *b) {
                            best = Some(cand);
                        }
                    }
                }
                match best {
                    None => break None,
                    Some((_, Slot::Own)) => {
                        break (0..groups.len()).find(|&i| !taken[i] && groups[i].0 == at)
                    }
                    Some((_, Slot::Child(c))) => at = c,
                }
            };
            let Some(head) = head else {
                return out;
            };
            taken[head] = true;
            out.push(groups[head].2);
        }
    }

    /// Queues (weight, min cores, cores used, parent pick) and groups (queue, cores,
    /// pods). Queue i's parent is queue `pick % (i + 1)`, or none when that is i itself.
    fn arb_queues() -> impl Strategy<Value = (Vec<(u32, u64, u64, u8)>, Vec<(u8, u64, u64)>)> {
        (
            prop::collection::vec((1u32..4, 0u64..6, 0u64..4, 0u8..8), 1..7),
            prop::collection::vec((0u8..8, 1u64..4, 0u64..3), 0..30),
        )
    }

    proptest::proptest! {
        /// The fair order matches its definition over random trees of queues (weights,
        /// mins, usage) and groups (charges), groups without a queue included.
        #[test]
        fn the_fair_order_matches_the_reference((qs, gs) in arb_queues()) {
            let mut q = Queues::default();
            for (i, (weight, min, used, pick)) in qs.iter().enumerate() {
                let parent = usize::from(*pick) % (i + 1);
                let parent = if parent == i { String::new() } else { format!("q{parent}") };
                let mut spec = queue(&format!("q{i}"), &parent, None);
                spec.weight = *weight;
                if *min > 0 {
                    spec.min.set(&ResourceName::Cpu, min * 1_000);
                }
                q.put(&spec).expect("queue");
                let mut usage = cpu(*used);
                usage.pods = *used;
                q.charge(&spec.name, &usage);
            }
            let groups: Vec<(String, Resources, u32)> = gs
                .iter()
                .enumerate()
                .map(|(i, (qi, cores, pods))| {
                    let name = if usize::from(*qi) < qs.len() { format!("q{qi}") } else { String::new() };
                    let mut charge = cpu(*cores);
                    charge.pods = *pods;
                    (name, charge, i as u32)
                })
                .collect();
            let fast = ordered(&q, groups.clone());
            proptest::prop_assert_eq!(fast, reference_order(&q, &groups));
        }
    }

    #[test]
    fn siblings_share_fairly_inside_their_parent_before_the_parent_competes() {
        // org (weight 1) holds a and b; solo (weight 1) is alone. org's subtree already
        // uses 4 of its min 8; solo uses 2 of 8. a and b each use 2 of their min 4.
        let mut q = Queues::default();
        let with_min = |name: &str, parent: &str, cores: u64| {
            let mut s = queue(name, parent, None);
            s.min.set(&ResourceName::Cpu, cores * 1_000);
            s
        };
        q.put(&with_min("org", "", 8)).expect("org");
        q.put(&with_min("solo", "", 8)).expect("solo");
        q.put(&with_min("a", "org", 4)).expect("a");
        q.put(&with_min("b", "org", 4)).expect("b");
        q.charge("a", &cpu(2));
        q.charge("b", &cpu(2));
        q.charge("solo", &cpu(2));
        let groups: Vec<(String, Resources, &str)> = vec![
            ("a".into(), cpu(2), "a1"),
            ("a".into(), cpu(2), "a2"),
            ("b".into(), cpu(2), "b1"),
            ("solo".into(), cpu(2), "s1"),
            ("solo".into(), cpu(2), "s2"),
        ];
        // solo 2/8 < org 4/8: s1 (solo 4/8 ties org, name order: org). Inside org a and
        // b tie at 2/4: a1 (org 6/8, a 4/4). solo 4/8 < 6/8: s2 (6/8, ties, org first).
        // Inside org, b 2/4 < a 4/4: b1. Then a2.
        assert_eq!(ordered(&q, groups), vec!["s1", "a1", "s2", "b1", "a2"]);
    }

    #[test]
    fn a_queue_over_its_share_never_starves_one_below() {
        let mut q = Queues::default();
        let mut heavy = queue("heavy", "", None);
        heavy.min.set(&ResourceName::Cpu, 4_000);
        let mut light = queue("light", "", None);
        light.min.set(&ResourceName::Cpu, 4_000);
        light.weight = 2;
        q.put(&heavy).expect("heavy");
        q.put(&light).expect("light");
        q.charge("heavy", &cpu(6));
        let groups: Vec<(String, Resources, &str)> = vec![
            ("heavy".into(), cpu(1), "h1"),
            ("heavy".into(), cpu(1), "h2"),
            ("light".into(), cpu(2), "l1"),
            ("light".into(), cpu(2), "l2"),
            ("".into(), cpu(9), "free"),
        ];
        assert_eq!(
            ordered(&q, groups),
            vec!["free", "l1", "l2", "h1", "h2"],
            "light (weight 2) stays below heavy's share 6/4 after taking 4 cores: 4/4/2"
        );
    }

    fn lender(name: &str, parent: &str, min_cores: u64, lend_cores: Option<u64>) -> QueueSpec {
        let mut q = queue(name, parent, None);
        q.min.set(&ResourceName::Cpu, min_cores * 1_000);
        if let Some(l) = lend_cores {
            q.lend.set(&ResourceName::Cpu, l * 1_000);
        }
        q
    }

    #[test]
    fn a_borrower_never_takes_what_a_lending_limit_keeps() {
        let mut q = Queues::default();
        q.put(&lender("a", "", 8, Some(4))).expect("a");
        q.put(&lender("b", "", 8, None)).expect("b");
        assert_eq!(
            q.refusal("b", &cpu(100)),
            None,
            "no capacity recorded: the top level has no pool"
        );
        q.set_capacity(cpu(16));
        q.charge("b", &cpu(12));
        let why = q.refusal("b", &cpu(1)).expect("a keeps 4 of its min 8");
        assert_eq!(
            why,
            "queue b would borrow cpu that lending limits keep: 1 asked, 12 used of the cluster's 16, 4 kept free (4 for a)"
        );
        assert_eq!(q.refusal("a", &cpu(4)), None, "a claims what it kept");
        assert_eq!(
            q.refusal("a", &cpu(8)),
            None,
            "within its min a is never refused here: reclaim returns what b borrowed"
        );
        q.charge("a", &cpu(2));
        assert!(q.refusal("b", &cpu(1)).is_some(), "2 still kept for a");
        q.charge("a", &cpu(2));
        q.refund("b", &cpu(1));
        assert_eq!(q.refusal("b", &cpu(1)), None, "a's kept part is in use");
    }

    #[test]
    fn a_parents_max_is_the_pool_its_children_lend_in() {
        let mut q = Queues::default();
        q.put(&queue("org", "", Some(10))).expect("org");
        q.put(&lender("x", "org", 5, Some(0))).expect("x");
        q.put(&queue("y", "org", None)).expect("y");
        q.charge("y", &cpu(5));
        let why = q.refusal("y", &cpu(1)).expect("x keeps all of its min");
        assert!(
            why.contains("5 used of queue org's max 10, 5 kept free (5 for x)"),
            "{why}"
        );
        assert_eq!(q.refusal("x", &cpu(5)), None);
    }

    #[test]
    fn a_guarantee_kept_deeper_in_the_tree_counts_at_every_level() {
        // p (no min) holds a (min 8, lends nothing) and b (min 8); top-level t borrows.
        let mut q = Queues::default();
        q.put(&queue("p", "", None)).expect("p");
        q.put(&lender("a", "p", 8, Some(0))).expect("a");
        q.put(&lender("b", "p", 8, None)).expect("b");
        q.put(&queue("t", "", None)).expect("t");
        q.set_capacity(cpu(16));
        assert_eq!(q.refusal("t", &cpu(8)), None);
        q.charge("t", &cpu(8));
        assert!(q.refusal("t", &cpu(1)).is_some(), "8 kept for a, inside p");
        let why = q
            .refusal("b", &cpu(1))
            .expect("b is within its min, p is not");
        assert!(
            why.starts_with("queue b's ancestor p would borrow cpu"),
            "{why}"
        );
        assert_eq!(q.refusal("a", &cpu(8)), None);
    }

    #[test]
    fn a_borrower_under_a_parent_without_max_is_checked_where_the_parent_lends() {
        // org (min 16, no max) holds x (min 8, lends nothing) and y; 16 cores.
        let mut q = Queues::default();
        q.put(&lender("org", "", 16, None)).expect("org");
        q.put(&lender("x", "org", 8, Some(0))).expect("x");
        q.put(&queue("y", "org", None)).expect("y");
        q.set_capacity(cpu(16));
        assert_eq!(
            q.refusal("y", &cpu(8)),
            None,
            "y borrows what org does not keep"
        );
        let why = q.refusal("y", &cpu(9)).expect("x keeps 8 inside org");
        assert!(why.contains("8 kept free (8 for org)"), "{why}");
        assert_eq!(
            q.refusal("x", &cpu(8)),
            None,
            "x within every min on its chain"
        );
    }

    #[test]
    fn a_device_the_nodes_do_not_list_has_no_pool_at_the_top() {
        let gpu = ResourceName::Extended("vendor.example/gpu".into());
        let mut q = Queues::default();
        let mut a = queue("a", "", None);
        a.min.set(&gpu, 4);
        a.lend.set(&gpu, 0);
        q.put(&a).expect("a");
        q.put(&queue("b", "", None)).expect("b");
        q.set_capacity(cpu(16));
        let mut two = Resources::zero();
        two.set(&gpu, 2);
        assert_eq!(
            q.refusal("b", &two),
            None,
            "unknown capacity: the shards judge"
        );
    }

    /// Flat queues on a cluster of `capacity` cores, each (min, lend or none) with the
    /// mins fitting the cluster, and operations (queue, cores, charge or refund).
    fn arb_lenders() -> impl Strategy<Value = (u64, Vec<(u64, Option<u64>)>, Vec<(u8, u64, bool)>)>
    {
        (8u64..24)
            .prop_flat_map(|capacity| {
                (
                    Just(capacity),
                    prop::collection::vec((0u64..8, prop::option::of(0u64..8)), 1..5),
                    prop::collection::vec((0u8..5, 1u64..6, prop::bool::weighted(0.7)), 1..40),
                )
            })
            .prop_filter("mins fit the cluster", |(capacity, qs, _)| {
                qs.iter().map(|(min, _)| min).sum::<u64>() <= *capacity
            })
    }

    proptest::proptest! {
        /// Lending limits against their definition over flat queues on a cluster: an
        /// admission that takes a queue past its `min` (borrowing) is refused exactly
        /// when some unlendable part is unclaimed afterwards and what all use, plus it,
        /// plus those parts would pass the capacity; one within `min` never is. After every
        /// borrowing admission (made only where the cluster has room, as the shards
        /// check), the unlendable parts not yet claimed are all free: borrowers never
        /// hold them (I8's second half; a queue within its min that finds them taken by
        /// another's within-min claim reclaims from the borrowers).
        #[test]
        fn borrowers_never_hold_what_lending_limits_keep((capacity, qs, ops) in arb_lenders()) {
            let mut q = Queues::default();
            for (i, (min, lend)) in qs.iter().enumerate() {
                let lend = lend.map(|l| l.min(*min));
                let spec = if *min > 0 {
                    lender(&format!("q{i}"), "", *min, lend)
                } else {
                    queue(&format!("q{i}"), "", None)
                };
                q.put(&spec).expect("queue");
            }
            q.set_capacity(cpu(capacity));
            let cpu_of = |q: &Queues, name: &str| q.usage(name).get(&ResourceName::Cpu);
            let total = |q: &Queues| -> u64 { q.specs().map(|s| cpu_of(q, &s.name)).sum() };
            let unclaimed = |q: &Queues, grown: &str, more: u64| -> u64 {
                q.specs()
                    .map(|s| {
                        let used = cpu_of(q, &s.name) + if s.name == grown { more } else { 0 };
                        s.unlendable(&ResourceName::Cpu).saturating_sub(used)
                    })
                    .sum()
            };
            for (step, (qi, cores, charge)) in ops.into_iter().enumerate() {
                let name = format!("q{}", usize::from(qi) % qs.len());
                let asked = cores * 1_000;
                if !charge {
                    let mut back = Resources::zero();
                    back.set(&ResourceName::Cpu, asked.min(cpu_of(&q, &name)));
                    q.refund(&name, &back);
                    continue;
                }
                let min = q.spec(&name).and_then(|s| s.min.get(&ResourceName::Cpu)).unwrap_or(0);
                let borrows = cpu_of(&q, &name) + asked > min;
                let kept_after = unclaimed(&q, &name, asked);
                let expected_ok =
                    !borrows || kept_after == 0 || total(&q) + asked + kept_after <= capacity * 1_000;
                let refusal = q.refusal(&name, &cpu(cores));
                proptest::prop_assert_eq!(
                    refusal.is_none(), expected_ok,
                    "step {}: {} asks {} cores: {:?}", step, name, cores, refusal
                );
                if refusal.is_none() && total(&q) + asked <= capacity * 1_000 {
                    q.charge(&name, &cpu(cores));
                    if borrows {
                        proptest::prop_assert!(
                            total(&q) + unclaimed(&q, "", 0) <= capacity * 1_000,
                            "step {}: a borrower holds what lending limits keep", step
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_tree_depth_is_bounded() {
        let mut q = Queues::default();
        q.put(&queue("q0", "", None)).expect("top");
        for i in 1..QUEUE_DEPTH_MAX {
            q.put(&queue(&format!("q{i}"), &format!("q{}", i - 1), None))
                .expect("within depth");
        }
        let deep = q
            .put(&queue(
                "too-deep",
                &format!("q{}", QUEUE_DEPTH_MAX - 1),
                None,
            ))
            .expect_err("too deep");
        assert!(deep.contains("deeper than"), "{deep}");
    }
}
