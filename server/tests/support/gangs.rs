//! Gang helpers the multi-process tests share: a fleet spread over every shard,
//! gang specs and submissions, what the ledgers hold, and bounded waits for a state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gangway_client::Client;
use gangway_proto::v1::{GangGroupStatus, GangSpec, MemberSpec, NodeSpec, SubmitGangGroupRequest};

/// Registers nodes (cpu `cpu`, 64Gi, 110 pods) until every shard has `per_shard` of them.
pub async fn fleet(
    c: &Client,
    shards: u32,
    per_shard: u32,
    cpu: &str,
) -> BTreeMap<u32, Vec<String>> {
    let mut by_shard: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut i = 0;
    while (1..=shards).any(|s| by_shard.get(&s).map_or(0, Vec::len) < per_shard as usize) {
        assert!(i < 1_000, "could not fill every shard: {by_shard:?}");
        let name = format!("node-{i:03}");
        i += 1;
        let spec = super::node_spec(&name, cpu, false);
        let info = c.register_node(spec.clone()).await.expect("register node");
        let list = by_shard.entry(info.shard).or_default();
        if list.len() < per_shard as usize {
            list.push(name);
        } else {
            // Full shard: cordon the extra node so it takes no pods.
            c.update_node(NodeSpec {
                unschedulable: true,
                ..spec
            })
            .await
            .expect("cordon");
        }
    }
    by_shard
}

pub fn gang(name: &str, members: u32, min: u32, cpu: &str, wait_time_ms: u64) -> GangSpec {
    GangSpec {
        name: name.into(),
        namespace: "team-a".into(),
        min_member: min,
        total_number: members,
        mode: "Strict".into(),
        wait_time_ms,
        priority: 0,
        members: vec![MemberSpec {
            name: "worker".into(),
            count: members,
            pod_json: format!(r#"{{"requests": {{"cpu": "{cpu}", "memory": "1Gi"}}}}"#),
            pods: None,
        }],
        topology: None,
    }
}

pub fn submission(key: &str, gangs: Vec<GangSpec>) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        queue: String::new(),
        run_limit_seconds: 0,
        idempotency_key: key.into(),
        name: key.into(),
        gangs,
    }
}

/// Pods held (reserved or placed) per node, over every shard's ledger.
pub async fn held(c: &Client) -> BTreeMap<String, u32> {
    let nodes = c.list_nodes(None).await.expect("list nodes");
    nodes
        .into_iter()
        .filter_map(|n| Some((n.node?.name, n.pods)))
        .filter(|(_, p)| *p > 0)
        .collect()
}

/// Waits until group `id` is in `state`; panics naming the last status after `timeout`.
pub async fn wait_state(c: &Client, id: u64, state: &str, timeout: Duration) -> GangGroupStatus {
    match wait_group(c, id, timeout, state, |s| s.state == state).await {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// Reads group `id` every 50 ms until `done` holds; after `timeout`, an error naming
/// `what` and the last status.
pub async fn wait_group(
    c: &Client,
    id: u64,
    timeout: Duration,
    what: &str,
    done: impl Fn(&GangGroupStatus) -> bool,
) -> Result<GangGroupStatus, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = c
            .get(id)
            .await
            .map_err(|e| format!("get group {id}: {e}"))?;
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            return Err(format!("group {id}: not {what} within {timeout:?}: {s:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Strict gang of `members` pods in namespace `ml`, each asking one cpu and one
/// device of `resource` (a device plugin's extended resource).
pub fn device_gang(key: &str, resource: &str, members: u32) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        queue: String::new(),
        run_limit_seconds: 0,
        idempotency_key: key.into(),
        name: key.into(),
        gangs: vec![GangSpec {
            name: key.into(),
            namespace: "ml".into(),
            min_member: members,
            total_number: members,
            mode: "Strict".into(),
            wait_time_ms: 0,
            priority: 0,
            members: vec![MemberSpec {
                name: "worker".into(),
                count: members,
                pod_json: format!(r#"{{"requests": {{"cpu": "1", "{resource}": "1"}}}}"#),
                pods: None,
            }],
            topology: None,
        }],
    }
}
