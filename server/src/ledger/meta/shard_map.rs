//! The shard map: which shard owns each node. A node's shard never changes
//! once assigned, so every replica and every front door agree on where a node
//! lives. Shard ids are 1..=shards.

use std::collections::BTreeMap;

/// The shard a new node belongs to: by the value of `topology_label` when the
/// node has it (nodes of one rack or zone share a shard), by its name
/// otherwise. FNV-1a, so every process computes the same answer.
pub fn shard_for(
    name: &str,
    labels: &BTreeMap<String, String>,
    topology_label: Option<&str>,
    shards: u32,
) -> u32 {
    let key = topology_label
        .and_then(|l| labels.get(l))
        .map(String::as_str)
        .unwrap_or(name);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards.max(1))) as u32 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_label_keeps_a_rack_together() {
        let rack = |r: &str| BTreeMap::from([("rack".to_string(), r.to_string())]);
        let s1 = shard_for("a", &rack("r1"), Some("rack"), 8);
        let s2 = shard_for("b", &rack("r1"), Some("rack"), 8);
        assert_eq!(s1, s2);
        assert!((1..=8).contains(&shard_for("x", &BTreeMap::new(), Some("rack"), 8)));
    }
}
