//! The gang queue: which gang is offered to placement next.
//!
//! Owns [`GangQueue`]: gangs ordered by priority (higher first), then creation order
//! (earlier first), then gang id. A gang's arrived members travel with it, so members of
//! a gang are always offered together; a gang with fewer arrived members than minMember
//! waits and is skipped without being removed. Invariants: each gang id appears once;
//! the order key of a queued gang matches its current priority and creation order;
//! arrived members never exceed totalNumber and have unique names. Deterministic
//! (`BTreeMap`s only). Called by the coordinator on the meta leader.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::model::gang::{Gang, GangId, Member};

/// Order of a queued gang: priority (higher first), creation order, id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    priority: Reverse<i32>,
    creation_order: u64,
    id: GangId,
}

impl QueueKey {
    fn of(gang: &Gang) -> Self {
        Self {
            priority: Reverse(gang.priority),
            creation_order: gang.creation_order,
            id: gang.id(),
        }
    }
}

/// Whether a pushed gang was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// It was not queued.
    Added,
    /// It replaced the queued gang with the same id.
    Replaced,
}

/// Why a member could not join a queued gang.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// No such gang is queued.
    #[error("gang {0} is not queued")]
    UnknownGang(GangId),
    /// A member with this name already arrived.
    #[error("gang {gang}: member {member} already arrived")]
    DuplicateMember {
        /// The gang.
        gang: GangId,
        /// The member name.
        member: String,
    },
    /// The gang already has totalNumber members.
    #[error("gang {gang}: already has its {total} members")]
    GangFull {
        /// The gang.
        gang: GangId,
        /// Its totalNumber.
        total: u32,
    },
}

/// Queued gangs in scheduling order.
#[derive(Debug, Clone, Default)]
pub struct GangQueue {
    entries: BTreeMap<QueueKey, Gang>,
    keys: BTreeMap<GangId, QueueKey>,
}

impl GangQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a gang with the members that have arrived so far (replacing one with its id).
    pub fn push(&mut self, gang: Gang) -> Pushed {
        let pushed = match self.remove(&gang.id()) {
            Some(_) => Pushed::Replaced,
            None => Pushed::Added,
        };
        let key = QueueKey::of(&gang);
        self.keys.insert(key.id.clone(), key.clone());
        self.entries.insert(key, gang);
        pushed
    }

    /// Adds an arrived member to a queued gang.
    pub fn add_member(&mut self, id: &GangId, member: Member) -> Result<(), QueueError> {
        let gang = self
            .keys
            .get(id)
            .and_then(|key| self.entries.get_mut(key))
            .ok_or_else(|| QueueError::UnknownGang(id.clone()))?;
        if gang.members.iter().any(|m| m.name == member.name) {
            return Err(QueueError::DuplicateMember {
                gang: id.clone(),
                member: member.name,
            });
        }
        if gang.members.len() as u64 >= u64::from(gang.total_number) {
            return Err(QueueError::GangFull {
                gang: id.clone(),
                total: gang.total_number,
            });
        }
        gang.members.push(member);
        Ok(())
    }

    /// Removes a gang, returning it.
    pub fn remove(&mut self, id: &GangId) -> Option<Gang> {
        let key = self.keys.remove(id)?;
        self.entries.remove(&key)
    }

    /// Gangs ready to be offered (arrived members >= minMember), in order.
    pub fn ready(&self) -> impl Iterator<Item = &Gang> {
        self.entries.values().filter(|g| is_ready(g))
    }

    /// Gangs still waiting for members, in order.
    pub fn waiting(&self) -> impl Iterator<Item = &Gang> {
        self.entries.values().filter(|g| !is_ready(g))
    }

    /// The next ready gang, left in the queue.
    pub fn peek_ready(&self) -> Option<&Gang> {
        self.ready().next()
    }

    /// Takes the next ready gang out of the queue.
    pub fn pop_ready(&mut self) -> Option<Gang> {
        let id = self.peek_ready()?.id();
        self.remove(&id)
    }

    /// Number of queued gangs, ready or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn is_ready(gang: &Gang) -> bool {
    gang.members.len() as u64 >= u64::from(gang.min_member)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gang::GangMode;
    use crate::model::pod::PodSpec;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            spec: PodSpec::default(),
            uid: None,
        }
    }

    fn gang(name: &str, priority: i32, creation_order: u64, min: u32, arrived: usize) -> Gang {
        Gang {
            name: name.into(),
            namespace: "ns".into(),
            min_member: min,
            total_number: 4,
            mode: GangMode::Strict,
            wait_time_ms: 1000,
            priority,
            creation_order,
            members: (0..arrived).map(|i| member(&format!("m-{i}"))).collect(),
        }
    }

    fn drain(queue: &mut GangQueue) -> Vec<String> {
        std::iter::from_fn(|| queue.pop_ready().map(|g| g.name)).collect()
    }

    #[test]
    fn orders_by_priority_then_creation_then_id() {
        let mut q = GangQueue::new();
        q.push(gang("late-high", 10, 5, 1, 1));
        q.push(gang("early-low", 1, 1, 1, 1));
        q.push(gang("b-mid", 5, 3, 1, 1));
        q.push(gang("a-mid", 5, 3, 1, 1));
        q.push(gang("early-high", 10, 2, 1, 1));
        assert_eq!(
            drain(&mut q),
            vec!["early-high", "late-high", "a-mid", "b-mid", "early-low"]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn gangs_below_min_member_wait_until_members_arrive() {
        let mut q = GangQueue::new();
        q.push(gang("big", 10, 1, 3, 1));
        q.push(gang("small", 1, 2, 1, 1));
        assert_eq!(q.peek_ready().map(|g| g.name.as_str()), Some("small"));
        assert_eq!(q.waiting().count(), 1);
        let id = GangId::new("ns", "big");
        assert_eq!(q.add_member(&id, member("m-1")), Ok(()));
        assert_eq!(q.peek_ready().map(|g| g.name.as_str()), Some("small"));
        assert_eq!(q.add_member(&id, member("m-2")), Ok(()));
        let first = q.pop_ready();
        assert_eq!(first.as_ref().map(|g| g.name.as_str()), Some("big"));
        assert_eq!(
            first.map(|g| g.members.len()),
            Some(3),
            "members travel together"
        );
        assert_eq!(drain(&mut q), vec!["small"]);
    }

    #[test]
    fn member_arrival_errors_and_replacement() {
        let mut q = GangQueue::new();
        let id = GangId::new("ns", "g");
        assert_eq!(
            q.add_member(&id, member("x")),
            Err(QueueError::UnknownGang(id.clone()))
        );
        assert_eq!(q.push(gang("g", 1, 1, 4, 3)), Pushed::Added);
        assert!(matches!(
            q.add_member(&id, member("m-0")),
            Err(QueueError::DuplicateMember { .. })
        ));
        assert_eq!(q.add_member(&id, member("m-3")), Ok(()));
        assert!(matches!(
            q.add_member(&id, member("m-4")),
            Err(QueueError::GangFull { total: 4, .. })
        ));
        assert_eq!(q.push(gang("g", 7, 1, 1, 1)), Pushed::Replaced);
        assert_eq!(q.len(), 1);
        assert_eq!(q.peek_ready().map(|g| g.priority), Some(7));
    }
}
