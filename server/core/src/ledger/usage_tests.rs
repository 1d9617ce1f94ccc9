//! A node's pod marks: counted as pods come and go, and counted again when decoded.

use super::*;
use crate::model::pod::{PodAffinityTerm, Protocol};

fn key(name: &str) -> MemberKey {
    MemberKey {
        namespace: "ns".into(),
        gang: "g".into(),
        member: name.into(),
    }
}

fn committed(pod: PodSummary) -> PodSlot {
    PodSlot {
        pod,
        state: SlotState::Committed {
            txn_id: TxnId(1),
            at_ms: 0,
        },
    }
}

#[test]
fn marks_follow_the_pods_and_survive_encoding() {
    let mut usage = NodeUsage::default();
    let ported = PodSummary {
        host_ports: vec![HostPort {
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        ..PodSummary::default()
    };
    let apart = PodSummary {
        anti_affinity: vec![PodAffinityTerm {
            label_selector: None,
            topology_key: "kubernetes.io/hostname".into(),
        }],
        ..PodSummary::default()
    };
    usage.hold(key("plain"), committed(PodSummary::default()));
    assert!(!usage.marks().any_host_ports() && !usage.marks().any_anti_affinity());
    usage.hold(key("ported"), committed(ported.clone()));
    usage.hold(key("apart"), committed(apart));
    // The same member held again replaces its slot and is counted once.
    usage.hold(key("ported"), committed(ported));
    assert!(usage.marks().any_host_ports() && usage.marks().any_anti_affinity());
    assert_eq!(usage.marks(), usage.marks_counted());

    let bytes = crate::wire::WireFormat::Binary
        .encode(&usage)
        .expect("encodes");
    let decoded: NodeUsage = crate::wire::decode(&bytes).expect("decodes");
    assert_eq!(decoded, usage, "decoding counts the marks again");

    usage.take(&key("ported"));
    assert!(!usage.marks().any_host_ports() && usage.marks().any_anti_affinity());
    usage.take(&key("apart"));
    assert_eq!(usage.marks(), PodMarks::default());
    assert_eq!(usage.marks(), usage.marks_counted());
}
