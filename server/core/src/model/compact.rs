//! Compact forms for what every node and device repeats: shared strings and small maps.
//!
//! Owns [`Symbol`] (an immutable string that clones by reference count), [`SmallMap`]
//! (a map kept as one sorted vector: a few entries cost a few words where a B-tree
//! node costs half a kilobyte) and [`SymbolTable`] (hands out one `Symbol` per distinct
//! string, so that a label key or value a fleet repeats is stored once). Invariants: a
//! `SmallMap`'s entries are sorted by key without duplicates, so it iterates, compares
//! and encodes exactly like the `BTreeMap` it replaces (same serde form: a map in key
//! order); a `Symbol` compares, hashes and encodes as its text, never by identity, so
//! interning changes memory, not behaviour. Called by the model (node labels), the
//! shard ledger (which interns what it keeps) and everything that reads labels.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable string shared by reference count.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Symbol(Arc<str>);

impl Symbol {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` and `other` share one allocation (interned alike).
    pub fn shares(&self, other: &Symbol) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Symbol {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Symbol {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Symbol {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Symbol {
    fn from(text: &str) -> Self {
        Self(Arc::from(text))
    }
}

impl From<String> for Symbol {
    fn from(text: String) -> Self {
        Self(Arc::from(text))
    }
}

impl From<&String> for Symbol {
    fn from(text: &String) -> Self {
        Self(Arc::from(text.as_str()))
    }
}

impl From<Symbol> for String {
    fn from(symbol: Symbol) -> Self {
        symbol.0.to_string()
    }
}

impl From<&Symbol> for String {
    fn from(symbol: &Symbol) -> Self {
        symbol.0.to_string()
    }
}

impl PartialEq<str> for Symbol {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Symbol {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Symbol {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Symbol {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Symbol {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Symbol::from)
    }
}

/// A map kept as a slice sorted by key: for the small maps every node and device
/// carries (labels, attributes), where a `BTreeMap` allocates a whole node. A boxed
/// slice, not a vector: no spare room and no capacity word, since these maps are built
/// once and read many times (a change reallocates).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SmallMap<K, V> {
    entries: Box<[(K, V)]>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Box::default(),
        }
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    /// An empty map (allocates nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.position(key).ok()?;
        self.entries.get(i).map(|(_, v)| v)
    }

    /// The value of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.position(key).ok()?;
        self.entries.get_mut(i).map(|(_, v)| v)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    /// Sets `key` to `value`, returning the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(i) => self
                .entries
                .get_mut(i)
                .map(|(_, old)| std::mem::replace(old, value)),
            Err(i) => {
                let mut old = std::mem::take(&mut self.entries).into_vec().into_iter();
                let mut entries = Vec::with_capacity(old.len() + 1);
                entries.extend(old.by_ref().take(i));
                entries.push((key, value));
                entries.extend(old);
                self.entries = entries.into_boxed_slice();
                None
            }
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.position(key).ok()?;
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        let (_, value) = entries.remove(i);
        self.entries = entries.into_boxed_slice();
        Some(value)
    }

    /// Entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            inner: self.entries.iter(),
        }
    }

    /// Entries in key order, values changeable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// Keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    /// Values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Values in key order, changeable.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// Keeps the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        entries.retain_mut(|(k, v)| keep(k, v));
        self.entries = entries.into_boxed_slice();
    }

    /// Builds from entries in any order; of duplicate keys the last wins (as in a
    /// `BTreeMap` built by inserting in order).
    fn from_entries(entries: Vec<(K, V)>) -> Self {
        Self {
            entries: sorted_last_wins(entries, |(k, _)| k).into_boxed_slice(),
        }
    }
}

/// `items` sorted by `key`, of items with equal keys only the last given: how a map
/// built by inserting them in order would hold them.
pub fn sorted_last_wins<T, K: Ord + ?Sized>(mut items: Vec<T>, key: impl Fn(&T) -> &K) -> Vec<T> {
    // Stable: equal keys keep their order, so reversing first keeps the last.
    items.reverse();
    items.sort_by(|a, b| key(a).cmp(key(b)));
    items.dedup_by(|later, first| key(later) == key(first));
    items
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SmallMap<K, V> {
    type Output = V;

    /// The value of `key`; panics if there is none, as indexing a `BTreeMap` does.
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(value) => value,
            None => panic!("SmallMap: no entry for the key"),
        }
    }
}

/// Entries of a [`SmallMap`] in key order.
#[derive(Debug, Clone)]
pub struct Iter<'a, K, V> {
    inner: std::slice::Iter<'a, (K, V)>,
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|(k, v)| (k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|(k, v)| (k, v))
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<'a, K: Ord, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K, V> IntoIterator for SmallMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_vec().into_iter()
    }
}

impl<K: Ord, V, A: Into<K>, B: Into<V>> FromIterator<(A, B)> for SmallMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (A, B)>>(iter: I) -> Self {
        Self::from_entries(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl<K: Ord, V, A: Into<K>, B: Into<V>> Extend<(A, B)> for SmallMap<K, V> {
    fn extend<I: IntoIterator<Item = (A, B)>>(&mut self, iter: I) {
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        entries.extend(iter.into_iter().map(|(k, v)| (k.into(), v.into())));
        // Existing entries come first, so a later duplicate replaces them.
        *self = Self::from_entries(entries);
    }
}

impl<K: Ord, V, A: Into<K>, B: Into<V>, const N: usize> From<[(A, B); N]> for SmallMap<K, V> {
    fn from(entries: [(A, B); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl From<BTreeMap<String, String>> for SmallMap<Symbol, Symbol> {
    fn from(map: BTreeMap<String, String>) -> Self {
        // Already sorted and unique: no sort needed.
        let entries: Vec<(Symbol, Symbol)> = map
            .into_iter()
            .map(|(k, v)| (Symbol::from(k), Symbol::from(v)))
            .collect();
        Self {
            entries: entries.into_boxed_slice(),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<K: Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (k, v) in &self.entries {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, K, V> Deserialize<'de> for SmallMap<K, V>
where
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(std::marker::PhantomData<(K, V)>);

        impl<'de, K, V> Visitor<'de> for MapVisitor<K, V>
        where
            K: Deserialize<'de> + Ord,
            V: Deserialize<'de>,
        {
            type Value = SmallMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // The hint comes from the input: bounded, so a forged length allocates little.
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
                while let Some(entry) = access.next_entry()? {
                    entries.push(entry);
                }
                Ok(SmallMap::from_entries(entries))
            }
        }

        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// Hands out one [`Symbol`] per distinct text, so repeated strings share one allocation.
///
/// Not replicated state: two tables that interned the same texts in any order give
/// equal symbols. Texts nobody else holds any more are dropped when the table has
/// doubled since it last looked ([`SymbolTable::intern`]), so it never holds more than
/// about twice the live distinct texts.
#[derive(Debug, Default)]
pub struct SymbolTable {
    symbols: HashSet<Symbol>,
    /// Size after the last sweep (at least [`SYMBOL_SWEEP_MIN`]).
    swept_at: usize,
}

/// Symbols a table holds before its first sweep for unused ones.
pub const SYMBOL_SWEEP_MIN: usize = 1024;

impl SymbolTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table's symbol for the text of `symbol` (added if new).
    pub fn intern(&mut self, symbol: &Symbol) -> Symbol {
        if let Some(known) = self.symbols.get(symbol.as_str()) {
            return known.clone();
        }
        self.sweep_if_doubled();
        self.symbols.insert(symbol.clone());
        symbol.clone()
    }

    /// Interns every key and value of `map` in place.
    pub fn intern_map(&mut self, map: &mut SmallMap<Symbol, Symbol>) {
        for (k, v) in map.entries.iter_mut() {
            *k = self.intern(k);
            *v = self.intern(v);
        }
    }

    /// Interns every key of `map` in place (the same texts: the order holds).
    pub fn intern_keys<V>(&mut self, map: &mut SmallMap<Symbol, V>) {
        for (k, _) in map.entries.iter_mut() {
            *k = self.intern(k);
        }
    }

    /// Distinct texts held.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    fn sweep_if_doubled(&mut self) {
        if self.symbols.len() < self.swept_at.max(SYMBOL_SWEEP_MIN) * 2 {
            return;
        }
        // A count of one is the table's own reference: nobody uses the text any more.
        self.symbols.retain(|s| Arc::strong_count(&s.0) > 1);
        self.swept_at = self.symbols.len().max(SYMBOL_SWEEP_MIN);
    }
}

impl Clone for SymbolTable {
    /// A new table: a clone of a ledger interns afresh (symbols stay shared with the
    /// original's until replaced).
    fn clone(&self) -> Self {
        Self::new()
    }
}

#[cfg(test)]
#[path = "compact_tests.rs"]
mod tests;
