//! Unit tests of `search.rs`.

use super::*;

#[test]
fn numbers_follow_kube_scheduler() {
    // Fewer than 100 nodes: all of them, whatever the percentage.
    assert_eq!(feasible_nodes_to_find(10, 99), 99);
    assert_eq!(feasible_nodes_to_find(0, 0), 0);
    // Adaptive: 50% - nodes/125.
    assert_eq!(
        feasible_nodes_to_find(0, 100),
        100,
        "50 nodes, raised to 100"
    );
    assert_eq!(feasible_nodes_to_find(0, 1_000), 420);
    assert_eq!(feasible_nodes_to_find(0, 5_000), 500);
    // Floor of 5% from 5,625 nodes on.
    assert_eq!(feasible_nodes_to_find(0, 10_000), 500);
    assert_eq!(feasible_nodes_to_find(0, 100_000), 5_000);
    // Never fewer than 100.
    assert_eq!(feasible_nodes_to_find(0, 1_500), 570);
    assert_eq!(feasible_nodes_to_find(1, 5_000), 100);
    // Explicit percentages; 100 and above mean every node.
    assert_eq!(feasible_nodes_to_find(30, 5_000), 1_500);
    assert_eq!(feasible_nodes_to_find(100, 5_000), 5_000);
    assert_eq!(feasible_nodes_to_find(250, 5_000), 5_000);
}

#[test]
fn round_robin_over_every_node() {
    let all = Scope::All(10);
    assert_eq!(all.first_position(0), 0);
    assert_eq!(all.first_position(13), 3);
    let order: Vec<usize> = (0..10).map(|step| all.node_at_step(7, step)).collect();
    assert_eq!(order, vec![7, 8, 9, 0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(all.cursor_after(7, 4, 7), 1, "(7 + 4) % 10");
    assert_eq!(
        all.cursor_after(7, 10, 7),
        7,
        "a full lap ends where it began"
    );
    assert_eq!(all.cursor_after(7, 0, 7), 7);
}

#[test]
fn round_robin_over_a_subset() {
    let nodes = [2, 5, 8];
    let some = Scope::Only(&nodes);
    assert_eq!(some.first_position(0), 0);
    assert_eq!(some.first_position(5), 1, "starts at the cursor's node");
    assert_eq!(some.first_position(6), 2, "or the next one in scope");
    assert_eq!(some.first_position(9), 0, "wrapping around");
    let order: Vec<usize> = (0..3).map(|step| some.node_at_step(2, step)).collect();
    assert_eq!(order, vec![8, 2, 5]);
    assert_eq!(
        some.cursor_after(2, 2, 9),
        3,
        "after node 2, the last visited"
    );
    assert_eq!(Scope::Only(&[]).cursor_after(0, 0, 4), 4);
}
