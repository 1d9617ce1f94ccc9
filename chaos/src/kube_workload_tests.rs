//! Unit tests of `kube_workload.rs`.

use super::*;

fn change(revision: u64, pod: &str, node: &str, arrived: bool) -> NodeChange {
    NodeChange {
        revision,
        pod: pod.into(),
        node: node.into(),
        arrived,
    }
}

#[test]
fn a_node_is_over_capacity_only_while_more_pods_are_bound_than_fit() {
    let fits = (KUBE_NODE_CPUS / POD_CPUS) as u64;
    let mut view = ApiView::default();
    for i in 0..fits {
        view.timeline.push(change(i, &format!("p{i}"), "n1", true));
    }
    // One leaves, then another arrives: never over.
    view.timeline.push(change(fits, "p0", "n1", false));
    view.timeline.push(change(fits + 1, "late", "n1", true));
    view.timeline
        .push(change(fits + 2, "elsewhere", "n2", true));
    assert!(view.over_capacity().is_empty());
    // One more before anyone leaves: over, at that revision.
    view.timeline.push(change(fits + 3, "extra", "n1", true));
    assert_eq!(
        view.over_capacity(),
        vec![("n1".to_string(), fits + 3, (fits as u32 + 1) * POD_CPUS)]
    );
}
