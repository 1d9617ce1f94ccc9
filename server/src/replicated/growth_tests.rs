//! Unit tests of `growth.rs`.

use super::*;

#[test]
fn the_count_only_rises() {
    let c = ShardCount::new(4);
    c.raise(6);
    assert_eq!(c.get(), 6);
    c.raise(5);
    assert_eq!(c.get(), 6);
    assert_eq!(c.ids(), 1..=6);
    let shared = c.clone();
    shared.raise(7);
    assert_eq!(c.get(), 7, "clones share the count");
}
