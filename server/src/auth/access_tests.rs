//! Unit tests of `access.rs`.

use super::*;
use crate::auth::policy::{Grant, TenantGrant};
use std::collections::BTreeSet;

fn who(roles: &[Role]) -> Identity {
    Identity {
        name: "x".into(),
        roles: roles.iter().copied().collect(),
        tenant: roles.contains(&Role::Tenant).then(|| TenantGrant {
            namespaces: Grant::Only(BTreeSet::from(["team-a".to_string()])),
            queues: Grant::Only(BTreeSet::from(["team-a".to_string()])),
            default_queue: Some("team-a".into()),
            max_priority: 100,
            preempt_across_queues: false,
            live_groups_max: 10,
        }),
        nodes: if roles.contains(&Role::Node) {
            BTreeSet::from(["node-7".to_string()])
        } else {
            BTreeSet::new()
        },
    }
}

#[test]
fn every_rpc_is_decided_by_role_as_the_table_says() {
    // Which roles may call each RPC at all (narrower checks follow in the services).
    for r in RPCS {
        let ask = Ask {
            subresource: r.method.ends_with("stateHash").then_some("statehash"),
            ..Ask::of(r.verb, r.resource)
        };
        let admin = policy_allows(&who(&[Role::Admin]), &ask);
        let viewer = policy_allows(&who(&[Role::Viewer]), &ask);
        let tenant = policy_allows(&who(&[Role::Tenant]), &ask);
        let node = policy_allows(&who(&[Role::Node]), &ask);
        assert!(admin, "{}", r.method);
        assert_eq!(
            viewer,
            r.verb.reads() && ask.subresource.is_none(),
            "{}",
            r.method
        );
        assert_eq!(
            tenant,
            r.resource == Resource::GangGroups
                || (r.resource == Resource::Queues && r.verb.reads()),
            "{}",
            r.method
        );
        assert_eq!(
            node,
            r.resource == Resource::Nodes && r.verb != Verb::List,
            "{}",
            r.method
        );
    }
}

#[test]
fn tenants_and_nodes_are_narrowed_to_their_grants() {
    let t = who(&[Role::Tenant]);
    let groups = |ns: &str| Ask::of(Verb::Create, Resource::GangGroups).in_namespace(ns);
    assert!(policy_allows(&t, &groups("team-a")));
    assert!(!policy_allows(&t, &groups("team-b")));
    let queue = |q: &str| Ask::of(Verb::Use, Resource::Queues).named(q);
    assert!(policy_allows(&t, &queue("team-a")) && !policy_allows(&t, &queue("team-b")));
    let prio = |p: i32| Ask::of(Verb::Use, Resource::Priorities).named(&p.to_string());
    assert!(policy_allows(&t, &prio(100)) && policy_allows(&t, &prio(-5)));
    assert!(!policy_allows(&t, &prio(101)) && !policy_allows(&t, &prio(i32::MAX)));
    assert!(!policy_allows(
        &t,
        &Ask::of(Verb::Preempt, Resource::Queues)
    ));
    let n = who(&[Role::Node]);
    let node = |name: &str| Ask::of(Verb::Update, Resource::Nodes).named(name);
    assert!(policy_allows(&n, &node("node-7")) && !policy_allows(&n, &node("node-8")));
    assert!(!policy_allows(&n, &Ask::of(Verb::List, Resource::Nodes)));
}
