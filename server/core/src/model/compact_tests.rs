use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::wire::{self, WireFormat};

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u16),
    Remove(u8),
    Extend(Vec<(u8, u16)>),
    Retain(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, any::<u16>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (0u8..24).prop_map(Op::Remove),
        1 => prop::collection::vec((0u8..24, any::<u16>()), 0..6).prop_map(Op::Extend),
        1 => (1u8..5).prop_map(Op::Retain),
    ]
}

fn key(k: u8) -> String {
    format!("example.com/key-{k}")
}

proptest! {
    /// Every operation leaves a SmallMap equal, entry for entry and in its encodings, to
    /// the BTreeMap given the same operations.
    #[test]
    fn small_map_is_a_btree_map(ops in prop::collection::vec(op(), 0..40)) {
        let mut model: BTreeMap<String, u16> = BTreeMap::new();
        let mut map: SmallMap<String, u16> = SmallMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => prop_assert_eq!(map.insert(key(k), v), model.insert(key(k), v)),
                Op::Remove(k) => prop_assert_eq!(map.remove(key(k).as_str()), model.remove(&key(k))),
                Op::Extend(entries) => {
                    map.extend(entries.iter().map(|(k, v)| (key(*k), *v)));
                    model.extend(entries.iter().map(|(k, v)| (key(*k), *v)));
                }
                Op::Retain(m) => {
                    map.retain(|_, v| *v % u16::from(m) == 0);
                    model.retain(|_, v| *v % u16::from(m) == 0);
                }
            }
            let entries: Vec<(&String, &u16)> = map.iter().collect();
            prop_assert_eq!(entries, model.iter().collect::<Vec<_>>());
            prop_assert_eq!(map.len(), model.len());
            for k in 0..24 {
                prop_assert_eq!(map.get(key(k).as_str()), model.get(&key(k)));
            }
        }
        for format in [WireFormat::Binary, WireFormat::Json] {
            let bytes = format.encode(&map).expect("encodes");
            prop_assert_eq!(&bytes, &format.encode(&model).expect("encodes"));
            let back: SmallMap<String, u16> = wire::decode(&bytes).expect("decodes");
            prop_assert_eq!(&back, &map);
        }
    }
}

#[test]
fn a_decoded_map_with_a_repeated_key_keeps_the_last_value_as_a_btree_map_does() {
    let json = br#"{"b":1,"a":2,"b":3}"#;
    let map: SmallMap<String, u32> = serde_json::from_slice(json).expect("decodes");
    let model: BTreeMap<String, u32> = serde_json::from_slice(json).expect("decodes");
    assert_eq!(
        map.iter().collect::<Vec<_>>(),
        model.iter().collect::<Vec<_>>()
    );
}

#[test]
fn collecting_keeps_the_last_of_duplicate_keys() {
    let map: SmallMap<Symbol, Symbol> = [("k", "first"), ("a", "x"), ("k", "last")].into();
    assert_eq!(map.get("k").map(Symbol::as_str), Some("last"));
    assert_eq!(map.len(), 2);
}

#[test]
fn a_symbol_compares_and_encodes_as_its_text() {
    let symbol = Symbol::from("topology.kubernetes.io/zone");
    assert_eq!(symbol, "topology.kubernetes.io/zone");
    assert_eq!(
        serde_json::to_string(&symbol).expect("encodes"),
        "\"topology.kubernetes.io/zone\""
    );
    assert!(Symbol::from("a") < Symbol::from("b"));
}

#[test]
fn a_table_shares_one_allocation_per_text() {
    let mut table = SymbolTable::new();
    let first = table.intern(&Symbol::from("zone-1"));
    let second = table.intern(&Symbol::from(String::from("zone-1")));
    assert!(first.shares(&second));
    assert!(!first.shares(&table.intern(&Symbol::from("zone-2"))));
    assert_eq!(table.len(), 2);

    let mut labels: SmallMap<Symbol, Symbol> = [("zone", "zone-1")].into();
    table.intern_map(&mut labels);
    let (k, v) = labels.iter().next().expect("one label");
    assert!(v.shares(&first));
    assert!(k.shares(&table.intern(&Symbol::from("zone"))));
}

#[test]
fn a_table_forgets_texts_nobody_holds_once_it_has_doubled() {
    let mut table = SymbolTable::new();
    let kept: Vec<Symbol> = (0..10)
        .map(|i| table.intern(&Symbol::from(format!("kept-{i}"))))
        .collect();
    for i in 0..SYMBOL_SWEEP_MIN * 4 {
        table.intern(&Symbol::from(format!("passing-{i}")));
    }
    assert!(
        table.len() <= SYMBOL_SWEEP_MIN * 2,
        "{} symbols held",
        table.len()
    );
    for symbol in &kept {
        assert!(table.intern(&Symbol::from(symbol.as_str())).shares(symbol));
    }
}
