//! Topology-constrained gangs through real `gangway serve` processes (docs/ARCHITECTURE.md
//! §4a): three racks in two blocks on two shards (the rack is the shard label, so each
//! rack lives on one shard). A required-rack gang lands in one rack; one that no rack can
//! hold waits with the reason and holds nothing, although the racks of both shards
//! together could hold it; slices each stay in one rack; a preferred-rack gang too large
//! for a rack takes the fewest racks; GetGangGroup names the domains a group uses.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gangway_client::Client;
use gangway_proto::v1::{GangGroupStatus, GangSpec, TopologySpec};
use support::gangs::{gang, held, submission, wait_group, wait_state};
use support::{client, Cluster};

const RACK: &str = "example.com/rack";
const BLOCK: &str = "example.com/block";
const LEVELS: &str = "example.com/block,example.com/rack,kubernetes.io/hostname";
const WAIT: Duration = Duration::from_secs(30);

/// Racks and their blocks: two nodes of 4 cpu each.
const RACKS: [(&str, &str); 3] = [("r0", "b0"), ("r1", "b0"), ("r2", "b1")];

async fn register_racks(c: &Client) -> BTreeMap<String, u32> {
    let mut shard_of_rack = BTreeMap::new();
    for (rack, block) in RACKS {
        for i in 0..2 {
            let mut spec = support::node_spec(&format!("{rack}-n{i}"), "4", false);
            spec.labels.insert(RACK.into(), rack.into());
            spec.labels.insert(BLOCK.into(), block.into());
            let info = c.register_node(spec).await.expect("register node");
            shard_of_rack.insert(rack.to_string(), info.shard);
        }
    }
    shard_of_rack
}

fn with_topology(mut g: GangSpec, topology: TopologySpec) -> GangSpec {
    g.topology = Some(topology);
    g
}

/// The rack of each placed member, in member order (node names start with the rack).
fn racks(status: &GangGroupStatus) -> Vec<String> {
    let mut placements = status.placements.clone();
    placements.sort_by_key(|p| {
        let n: u32 = p
            .member
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        n
    });
    placements
        .iter()
        .map(|p| p.node.split('-').next().unwrap_or("").to_string())
        .collect()
}

fn distinct(values: &[String]) -> usize {
    values.iter().collect::<BTreeSet<_>>().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_constraints_hold_across_two_shards() {
    let cluster = Cluster::start_with(
        3,
        2,
        ["--topology-label", RACK, "--topology-levels", LEVELS]
            .map(str::to_string)
            .to_vec(),
        Vec::new(),
    );
    let c = client(&cluster, 1).await;
    let shard_of_rack = register_racks(&c).await;
    assert_ne!(
        shard_of_rack["r0"], shard_of_rack["r1"],
        "{shard_of_rack:?}"
    );

    // Six of one cpu fit a rack (8 cpu): one rack.
    let required = |name: &str, members: u32| {
        let topology = TopologySpec {
            required: RACK.into(),
            ..TopologySpec::default()
        };
        with_topology(gang(name, members, members, "1", 0), topology)
    };
    let six = c
        .submit(submission("six", vec![required("six", 6)]))
        .await
        .expect("submit");
    let placed = wait_state(&c, six.id, "Placed", WAIT).await;
    assert_eq!(distinct(&racks(&placed)), 1, "{placed:?}");
    // GetGangGroup says where it went, per level (the host level left out).
    let got = c.get(six.id).await.expect("get");
    let spread: Vec<(&str, usize)> = got
        .spread
        .iter()
        .map(|d| (d.key.as_str(), d.domains.len()))
        .collect();
    assert_eq!(spread, [(BLOCK, 1), (RACK, 1)], "{got:?}");

    // Ten fit no rack, though the free cpu of both shards (18) would hold them: the gang
    // waits with the reason and holds nothing.
    let before = held(&c).await;
    let ten = c
        .submit(submission("ten", vec![required("ten", 10)]))
        .await
        .expect("submit");
    let waiting = wait_group(&c, ten.id, WAIT, "refused by topology", |s| {
        s.reason
            .contains("in no example.com/rack that holds 10 members")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(waiting.state, "Queued", "{waiting:?}");
    assert!(waiting.placements.is_empty(), "{waiting:?}");
    assert_eq!(held(&c).await, before, "nothing held for a gang that waits");
    c.cancel(ten.id).await.expect("cancel");

    // Two slices of four: each slice in one rack.
    let sliced = with_topology(
        gang("sliced", 8, 8, "1", 0),
        TopologySpec {
            slice_key: RACK.into(),
            slice_size: 4,
            ..TopologySpec::default()
        },
    );
    let sliced = c
        .submit(submission("sliced", vec![sliced]))
        .await
        .expect("submit");
    let placed = wait_state(&c, sliced.id, "Placed", WAIT).await;
    let used = racks(&placed);
    for slice in used.chunks(4) {
        assert_eq!(distinct(slice), 1, "a slice spans racks: {used:?}");
    }
    c.release(six.id).await.expect("release");
    c.release(sliced.id).await.expect("release");
    wait_state(&c, sliced.id, "Released", WAIT).await;

    // Ten preferring a rack: no rack holds ten, two do.
    let preferred = with_topology(
        gang("spread", 10, 10, "1", 0),
        TopologySpec {
            preferred: RACK.into(),
            ..TopologySpec::default()
        },
    );
    let spread = c
        .submit(submission("spread", vec![preferred]))
        .await
        .expect("submit");
    let placed = wait_state(&c, spread.id, "Placed", WAIT).await;
    assert_eq!(distinct(&racks(&placed)), 2, "{placed:?}");
    let got = c.get(spread.id).await.expect("get");
    let racks_used = got
        .spread
        .iter()
        .find(|d| d.key == RACK)
        .map(|d| d.domains.len());
    assert_eq!(racks_used, Some(2), "{got:?}");

    // A slice without a size is refused by name at the door.
    let bad = with_topology(
        gang("bad", 2, 2, "1", 0),
        TopologySpec {
            slice_key: RACK.into(),
            ..TopologySpec::default()
        },
    );
    let err = c
        .submit(submission("bad", vec![bad]))
        .await
        .expect_err("a slice key without a size");
    assert!(
        err.to_string().contains("gangs[0].topology.slice_key"),
        "{err}"
    );
}
