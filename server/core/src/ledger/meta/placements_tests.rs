//! `MemberPlacements` against the ordered map it stands in for: the same answers
//! after any sequence of changes, and the same encoded bytes.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::wire::WireFormat;

fn at(node: u8) -> Placement {
    Placement {
        node: format!("n{node}"),
        shard: u32::from(node % 3),
        devices: Vec::new(),
        txn: None,
        network_shards: Vec::new(),
        allocations: Vec::new(),
    }
}

#[derive(Debug, Clone)]
enum Change {
    Insert(u8, u8),
    Remove(u8),
    Retain(u8),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (0u8..12, any::<u8>()).prop_map(|(k, n)| Change::Insert(k, n)),
        (0u8..12).prop_map(Change::Remove),
        (1u8..4).prop_map(Change::Retain),
    ]
}

proptest! {
    #[test]
    fn behaves_and_encodes_as_an_ordered_map(changes in prop::collection::vec(change(), 0..40)) {
        let mut list = MemberPlacements::default();
        let mut map: BTreeMap<String, Placement> = BTreeMap::new();
        for c in changes {
            match c {
                Change::Insert(k, n) => {
                    let key = format!("ns/g/m{k}");
                    prop_assert_eq!(list.insert(key.clone(), at(n)), map.insert(key, at(n)));
                }
                Change::Remove(k) => {
                    let key = format!("ns/g/m{k}");
                    prop_assert_eq!(list.remove(&key), map.remove(&key));
                }
                Change::Retain(m) => {
                    let keep = |p: &Placement| p.node.len() % usize::from(m) == 0;
                    list.retain(|_, p| keep(p));
                    map.retain(|_, p| keep(p));
                }
            }
            prop_assert_eq!(list.to_map(), map.clone());
            prop_assert_eq!(list.len(), map.len());
            for k in 0u8..12 {
                let key = format!("ns/g/m{k}");
                prop_assert_eq!(list.get(&key), map.get(&key));
            }
        }
        for format in [WireFormat::Binary, WireFormat::Json] {
            let ours = format.encode(&list).expect("encodes");
            prop_assert_eq!(&ours, &format.encode(&map).expect("encodes"));
            let back: MemberPlacements = crate::wire::decode(&ours).expect("decodes");
            prop_assert_eq!(&back, &list);
        }
    }
}

#[test]
fn a_map_written_out_of_order_is_read_sorted() {
    let json = br#"{"ns/g/m2":{"node":"b","shard":1},"ns/g/m1":{"node":"a","shard":0}}"#;
    let read: MemberPlacements = crate::wire::decode(json).expect("decodes");
    let keys: Vec<&String> = read.keys().collect();
    assert_eq!(keys, ["ns/g/m1", "ns/g/m2"]);
    assert_eq!(read["ns/g/m1"].node, "a");
}
