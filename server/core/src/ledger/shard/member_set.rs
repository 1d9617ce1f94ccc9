//! The members one transaction holds on a shard, as a sorted list: a transaction
//! usually holds a handful of members (one for a lone Kubernetes pod), and an ordered
//! set would reserve a node of eleven keys (~800 bytes) for the first of them, once per
//! placed group. Derived state only (the ledger's transaction index); never encoded.

use crate::model::gang::MemberKey;

/// Members in key order, each once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct MemberSet(Vec<MemberKey>);

impl MemberSet {
    /// Adds `member`; whether it was new.
    pub(super) fn insert(&mut self, member: MemberKey) -> bool {
        match self.0.binary_search(&member) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, member);
                true
            }
        }
    }

    /// Takes `member` out; whether it was there.
    pub(super) fn remove(&mut self, member: &MemberKey) -> bool {
        match self.0.binary_search(member) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether no member is left.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The members in key order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, MemberKey> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a MemberSet {
    type Item = &'a MemberKey;
    type IntoIter = std::slice::Iter<'a, MemberKey>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
