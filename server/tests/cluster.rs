//! Multi-process behaviour of the replicated core: three real `gangway serve`
//! processes on 127.0.0.1 with sled data dirs. Leader failover after SIGKILL,
//! restart from disk, catch-up by snapshot for a member that lost its disk,
//! full-cluster crash, leader balancing, and refusals of bad input.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use gangway_proto::admin::{
    AddLearnerRequest, BalanceRequest, ChangeMembershipRequest, CompactRequest,
    TransferLeaderRequest,
};
use gangway_proto::raft::raft_transport_client::RaftTransportClient;
use gangway_proto::raft::{Envelope, RaftRequest};
use support::{free_port, list_names, register, wipe, Cluster};

const META: u64 = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_restart_and_snapshot_rejoin() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut acked = BTreeSet::new();
    let mut inv = c.inventory(1).await;
    for i in 0..30 {
        let name = format!("n-{i:03}");
        register(&mut inv, &name)
            .await
            .expect("register before the kill");
        acked.insert(name);
    }

    // Every group committed writes: the meta group (shard map) and each shard (nodes).
    let status = c.status(1, false).await.expect("status");
    assert!(
        status.groups.iter().all(|g| g.applied_index >= 2),
        "every group applied writes: {:?}",
        status.groups
    );
    let shards: BTreeSet<u32> = c
        .inventory(1)
        .await
        .list_nodes(gangway_proto::v1::ListNodesRequest { shard: None })
        .await
        .expect("list")
        .into_inner()
        .nodes
        .iter()
        .map(|n| n.shard)
        .collect();
    assert_eq!(
        shards,
        BTreeSet::from([1, 2]),
        "nodes landed in both shards"
    );

    // The HTTP endpoints: ready, and per-group Raft metrics.
    let http = c.procs[&1].http.clone();
    let (code, body) = support::http_get(&http, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    let (code, metrics) = support::http_get(&http, "/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "gangway_raft_term",
        "gangway_raft_leader_changes_total",
        "gangway_raft_commit_index",
        "gangway_raft_apply_lag",
        "gangway_raft_append_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }

    // SIGKILL the meta group's leader: the survivors elect a new one within 2 s.
    let old = c
        .agreed_leader(META, &[1, 2, 3])
        .await
        .expect("a meta leader");
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != old).collect();
    let killed_at = Instant::now();
    c.kill(old);
    let new_leader = loop {
        if let Some(l) = c.agreed_leader(META, &survivors).await {
            if l != old {
                break l;
            }
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "no new meta leader 5 s after the kill"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let failover = killed_at.elapsed();
    eprintln!("meta leader {old} killed; node {new_leader} leads after {failover:?}");
    assert!(
        failover < Duration::from_secs(2),
        "failover took {failover:?}"
    );

    // Writes continue through a survivor, then the killed process restarts from its sled data.
    let mut inv = c.inventory(survivors[0]).await;
    for i in 30..60 {
        let name = format!("n-{i:03}");
        register(&mut inv, &name)
            .await
            .expect("register after the kill");
        acked.insert(name);
    }
    c.spawn(old);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut inv_old = c.inventory(old).await;
    let listed: BTreeSet<String> = list_names(&mut inv_old).await.into_iter().collect();
    assert_eq!(listed, acked, "every acknowledged registration survives");

    // Node 3 loses its disk. Restarting it under its old id is refused.
    c.kill(3);
    wipe(&c.procs[&3].data);
    let out = c.command(3).output().expect("run gangway serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a wiped replica must not rejoin under its old id"
    );
    assert!(stderr.contains("lost its disk"), "{stderr}");

    // With the log compacted, a new member (id 4) can only catch up by snapshot.
    let mut inv = c.inventory(1).await;
    for i in 60..80 {
        let name = format!("n-{i:03}");
        register(&mut inv, &name)
            .await
            .expect("register with node 3 down");
        acked.insert(name);
    }
    for id in [1, 2] {
        c.admin(id)
            .await
            .compact(CompactRequest { group_id: None })
            .await
            .expect("compact");
    }
    let addr4 = format!("127.0.0.1:{}", free_port());
    let peers = [1, 2]
        .into_iter()
        .map(|id| (id, c.procs[&id].grpc.clone()))
        .collect();
    c.add_proc(4, addr4.clone(), peers, true);
    c.spawn(4);
    let mut admin = c.admin(1).await;
    admin
        .add_learner(AddLearnerRequest {
            group_id: None,
            node_id: 4,
            addr: addr4,
        })
        .await
        .unwrap_or_else(|e| panic!("add learner 4: {e}\n{}", c.log(4)));
    c.admin(2)
        .await
        .change_membership(ChangeMembershipRequest {
            group_id: None,
            voters: vec![1, 2, 4],
        })
        .await
        .expect("replace 3 by 4");
    let states = c.wait_converged(&[1, 2, 4], Duration::from_secs(30)).await;
    let node4 = c.status(4, false).await.expect("node 4 status");
    for g in &node4.groups {
        assert!(
            g.snapshot_index > 0,
            "node 4 installed a snapshot for group {}: {g:?}",
            g.group_id
        );
        assert_eq!(g.voters, vec![1, 2, 4]);
    }
    assert!(
        states[0].iter().all(|g| g.purged_index > 0),
        "the log was compacted: {:?}",
        states[0]
    );
    let mut inv4 = c.inventory(4).await;
    let listed: BTreeSet<String> = list_names(&mut inv4).await.into_iter().collect();
    assert_eq!(listed, acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cluster_crash_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut writers = Vec::new();
    for via in [1u64, 2, 3] {
        let mut inv = c.inventory(via).await;
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..10_000 {
                let name = format!("w{via}-{i:05}");
                match register(&mut inv, &name).await {
                    Ok(()) => acked.push(name),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in [1, 2, 3] {
        c.kill(id);
    }
    let mut acked = BTreeSet::new();
    for w in writers {
        acked.extend(w.await.expect("writer task"));
    }
    assert!(
        acked.len() > 10,
        "writers made progress before the crash: {}",
        acked.len()
    );
    for id in [1, 2, 3] {
        c.spawn(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut inv = c.inventory(2).await;
    let listed: BTreeSet<String> = list_names(&mut inv).await.into_iter().collect();
    let lost: Vec<_> = acked.difference(&listed).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;

    // Another full restart, with replica 3's disk lost: all three start together, so
    // no peer answers while the blank one starts. It must wait for its peers rather
    // than bootstrap, then refuse, naming the flag; the other two carry on.
    for id in [1, 2, 3] {
        c.kill(id);
    }
    wipe(&c.procs[&3].data);
    let mut blank = c.command(3);
    let blank = blank
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the blank replica");
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.spawn(1);
    c.spawn(2);
    let (status, stderr) = exit_within(blank, Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "a blank replica of a formed cluster must not start: {stderr}"
    );
    assert!(
        stderr.contains("lost its disk") && stderr.contains("--initial-cluster-state"),
        "{stderr}"
    );
    c.wait_ready(&[1, 2], Duration::from_secs(20)).await;
    let mut inv = c.inventory(1).await;
    let after: BTreeSet<String> = list_names(&mut inv).await.into_iter().collect();
    assert!(
        acked.is_subset(&after),
        "acknowledged writes survive the lost disk"
    );
}

/// Waits for `child` to exit (killing it after `bound`, which fails the test); its
/// exit status and stderr.
async fn exit_within(
    mut child: std::process::Child,
    bound: Duration,
) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process still runs after {bound:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blank_replica_bootstraps_only_when_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(support::gangway_bin())
        .args(["serve", "--id", "1", "--shards", "1"])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--http", &format!("127.0.0.1:{}", free_port())])
        .arg("--data")
        .arg(dir.path().join("node-1"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--initial-cluster-state is `existing`"),
        "{stderr}"
    );
    // Told to create, then restarted without the flag: it resumes from its data.
    let mut c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    register(&mut c.inventory(1).await, "n-1")
        .await
        .expect("register");
    c.kill(1);
    c.extra_args = vec!["--initial-cluster-state".into(), "existing".into()];
    c.spawn(1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let names = list_names(&mut c.inventory(1).await).await;
    assert_eq!(names, vec!["n-1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_spreads_seven_groups_over_three_processes() {
    let c = Cluster::start(3, 6);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut admin = c.admin(1).await;
    for g in 0..=6 {
        let r = admin
            .transfer_leader(TransferLeaderRequest {
                group_id: g,
                to_node: 1,
            })
            .await
            .expect("transfer");
        assert_eq!(r.into_inner().leader, 1);
    }
    let s = c.status(1, false).await.expect("status");
    assert!(
        s.groups.iter().all(|g| g.leader == 1),
        "node 1 leads every group: {:?}",
        s.groups
    );
    let reply = c
        .admin(2)
        .await
        .balance(BalanceRequest {})
        .await
        .expect("balance")
        .into_inner();
    eprintln!("balance: {:?}", reply.transfers);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(10)).await;
    let s = c.status(3, false).await.expect("status");
    let mut per_node = std::collections::BTreeMap::<u64, u32>::new();
    for g in &s.groups {
        *per_node.entry(g.leader).or_default() += 1;
    }
    assert!(
        per_node.values().all(|n| *n <= 3),
        "leaders per node after balancing: {per_node:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_no_damage() {
    // A peer list naming the process itself.
    let out = std::process::Command::new(support::gangway_bin())
        .args([
            "serve",
            "--id",
            "1",
            "--peer",
            "1=127.0.0.1:7001",
            "--data",
            "/nonexistent/never-created",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--peer: 1=127.0.0.1:7001 names this process itself"),
        "{stderr}"
    );
    assert!(!std::path::Path::new("/nonexistent/never-created").exists());

    // A one-process cluster to aim RPCs at.
    let mut c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;

    // An unknown group id in a Raft RPC, and a request from another cluster.
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.procs[&1].grpc))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    // As a replica would call: with a proof made with the peer secret for node 1
    // (clients are refused before the envelope is read; see two_phase.rs).
    let secret = std::fs::read_to_string(support::peer_secret_path(c.dir.path()))
        .expect("peer secret")
        .trim()
        .to_string();
    let proof = gangway_raft::peer_proof(&secret, &c.cluster_id, 1);
    let mut raft = RaftTransportClient::with_interceptor(ch, move |mut req: tonic::Request<()>| {
        let value = proof
            .parse()
            .map_err(|_| tonic::Status::internal("proof header"))?;
        req.metadata_mut()
            .insert(gangway_raft::PEER_PROOF_HEADER, value);
        Ok(req)
    });
    let envelope = |cluster: &str, group: u64| Envelope {
        cluster_id: cluster.into(),
        group_id: group,
        from_node: 9,
        to_node: 1,
    };
    let err = raft
        .vote(RaftRequest {
            envelope: Some(envelope(&c.cluster_id, 99)),
            payload: Vec::new(),
        })
        .await
        .expect_err("group 99 does not exist");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(
        err.message().contains("unknown raft group 99"),
        "{}",
        err.message()
    );
    let err = raft
        .vote(RaftRequest {
            envelope: Some(envelope("another", 0)),
            payload: Vec::new(),
        })
        .await
        .expect_err("foreign cluster");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("cluster id mismatch"),
        "{}",
        err.message()
    );
    let err = raft
        .vote(RaftRequest {
            envelope: Some(envelope(&c.cluster_id, 0)),
            payload: vec![0xff; 3],
        })
        .await
        .expect_err("garbage payload");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Invalid node registrations name the field and store nothing.
    let mut inv = c.inventory(1).await;
    let mut bad = support::node("Bad_Name");
    let err = inv
        .register_node(gangway_proto::v1::RegisterNodeRequest {
            node: Some(bad.clone()),
            update: false,
        })
        .await
        .expect_err("invalid name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("node.name:"), "{}", err.message());
    bad.name = "good".into();
    bad.taints.push(gangway_proto::v1::Taint {
        key: "k".into(),
        value: String::new(),
        effect: "Sometimes".into(),
    });
    let err = inv
        .register_node(gangway_proto::v1::RegisterNodeRequest {
            node: Some(bad),
            update: false,
        })
        .await
        .expect_err("invalid taint");
    assert!(
        err.message().starts_with("node.taints[0].effect:"),
        "{}",
        err.message()
    );
    assert!(list_names(&mut inv).await.is_empty(), "nothing was stored");

    // A port already in use.
    let taken = c.procs[&1].grpc.clone();
    let out = std::process::Command::new(support::gangway_bin())
        .args(["serve", "--id", "2", "--listen", &taken, "--data"])
        .arg(c.dir.path().join("other"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("cannot listen on {taken} (--listen)")),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains("in use"), "{stderr}");

    // A data dir that belongs to another cluster id.
    c.kill(1);
    let data = c.procs[&1].data.clone();
    let out = std::process::Command::new(support::gangway_bin())
        .args([
            "serve",
            "--id",
            "1",
            "--cluster-id",
            "someone-else",
            "--shards",
            "1",
        ])
        .args([
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--http",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .arg("--data")
        .arg(&data)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("belongs to cluster \"{}\"", c.cluster_id)),
        "{stderr}"
    );
    // The refused start changed nothing: the rightful replica still starts and serves.
    c.spawn(1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
}

/// An OTLP/gRPC trace collector on 127.0.0.1 that keeps the names and attribute keys
/// of the spans it receives (the OpenTelemetry collector's TraceService).
#[derive(Clone, Default)]
struct Collector {
    spans: std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<String>)>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let keys = span.attributes.iter().map(|a| a.key.clone()).collect();
                    spans.push((span.name, keys));
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_spans_reach_an_otlp_collector() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the collector");
    let collector_addr = listener.local_addr().expect("addr");
    let collector = Collector::default();
    let served = collector.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(served))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    let args = vec![
        "--otlp-endpoint".to_string(),
        format!("http://{collector_addr}"),
    ];
    let c = Cluster::start_with(3, 2, args, Vec::new());
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    // Eight one-CPU nodes and a gang of eight one-CPU pods: it needs every node, so both
    // shards, so a two-phase transaction.
    let client = support::client(&c, 1).await;
    for i in 0..8 {
        client
            .register_node(gangway_proto::v1::NodeSpec {
                name: format!("otlp-{i}"),
                allocatable: [("cpu", "1"), ("memory", "4Gi"), ("pods", "10")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            })
            .await
            .expect("register");
    }
    let request = gangway_client::spec::GangGroupBuilder::new("traced".to_string())
        .gang(
            gangway_client::spec::GangBuilder::new("team", "wide", 8).members(
                "w",
                8,
                serde_json::json!({"requests": {"cpu": "1"}}),
            ),
        )
        .build();
    client.submit(request).await.expect("submit");
    let start = Instant::now();
    loop {
        let spans = collector
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let round = spans.iter().any(|(n, _)| n == "placement_round");
        let txn = spans
            .iter()
            .any(|(n, keys)| n == "transaction" && keys.iter().any(|k| k == "txn"));
        if round && txn {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "spans received: {:?}",
            spans.iter().map(|(n, _)| n).collect::<BTreeSet<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(c);
    let _ = stop.send(());
    let _ = server.await;
}
