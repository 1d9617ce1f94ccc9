//! The placements of one group's members, as a list sorted by member key: a group
//! holds a handful of members (one for every lone Kubernetes pod), and an ordered map
//! would reserve a node of eleven slots (~1.6 KB) for the first of them.
//!
//! Invariants: keys are unique and ascending; encodes as a map (the same bytes an
//! ordered map of the same entries encodes to), so logs and snapshots read alike.
//! Owned by [`super::GroupRecord`].

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::groups::Placement;

/// Member key (`ns/gang/member`) → where that member is, in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberPlacements(Vec<(String, Placement)>);

impl MemberPlacements {
    fn find(&self, member: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(member))
    }

    /// Where `member` is.
    pub fn get(&self, member: &str) -> Option<&Placement> {
        self.find(member).ok().map(|i| &self.0[i].1)
    }

    /// Where `member` is, to change.
    pub fn get_mut(&mut self, member: &str) -> Option<&mut Placement> {
        match self.find(member) {
            Ok(i) => Some(&mut self.0[i].1),
            Err(_) => None,
        }
    }

    /// Whether `member` is listed.
    pub fn contains_key(&self, member: &str) -> bool {
        self.find(member).is_ok()
    }

    /// Lists `member` at `placement`; returns where it was.
    pub fn insert(&mut self, member: String, placement: Placement) -> Option<Placement> {
        match self.find(&member) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, placement)),
            Err(i) => {
                self.0.insert(i, (member, placement));
                None
            }
        }
    }

    /// Takes `member` out; returns where it was.
    pub fn remove(&mut self, member: &str) -> Option<Placement> {
        self.find(member).ok().map(|i| self.0.remove(i).1)
    }

    /// How many members are listed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets every member.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// (member, placement) in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&String, &Placement)> + '_ {
        self.0.iter().map(|(k, p)| (k, p))
    }

    /// Member keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + '_ {
        self.0.iter().map(|(k, _)| k)
    }

    /// Placements in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Placement> + '_ {
        self.0.iter().map(|(_, p)| p)
    }

    /// Placements in key order, to change.
    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Placement> + '_ {
        self.0.iter_mut().map(|(_, p)| p)
    }

    /// Keeps the members `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&String, &mut Placement) -> bool) {
        self.0.retain_mut(|(k, p)| keep(k, p));
    }

    /// The same entries as an ordered map (what summaries and replies carry).
    pub fn to_map(&self) -> BTreeMap<String, Placement> {
        self.0.iter().cloned().collect()
    }
}

impl std::ops::Index<&str> for MemberPlacements {
    type Output = Placement;
    /// Panics when `member` is not listed (as an ordered map's index does).
    fn index(&self, member: &str) -> &Placement {
        match self.get(member) {
            Some(p) => p,
            None => panic!("member {member} has no placement"),
        }
    }
}

impl Extend<(String, Placement)> for MemberPlacements {
    fn extend<I: IntoIterator<Item = (String, Placement)>>(&mut self, entries: I) {
        for (k, p) in entries {
            self.insert(k, p);
        }
    }
}

impl FromIterator<(String, Placement)> for MemberPlacements {
    fn from_iter<I: IntoIterator<Item = (String, Placement)>>(entries: I) -> Self {
        let sorted: BTreeMap<String, Placement> = entries.into_iter().collect();
        Self(sorted.into_iter().collect())
    }
}

impl From<BTreeMap<String, Placement>> for MemberPlacements {
    fn from(map: BTreeMap<String, Placement>) -> Self {
        Self(map.into_iter().collect())
    }
}

impl IntoIterator for MemberPlacements {
    type Item = (String, Placement);
    type IntoIter = std::vec::IntoIter<(String, Placement)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a MemberPlacements {
    type Item = (&'a String, &'a Placement);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Placement)>,
        fn(&'a (String, Placement)) -> (&'a String, &'a Placement),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, p)| (k, p))
    }
}

impl Serialize for MemberPlacements {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, p)| (k, p)))
    }
}

impl<'de> Deserialize<'de> for MemberPlacements {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<String, Placement>::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
#[path = "placements_tests.rs"]
mod tests;
