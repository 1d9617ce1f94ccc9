//! Three (then four) in-process hosts on loopback gRPC with a small key-value
//! state machine: writes in every group, routed writes and reads from any
//! replica, identical state hashes, leadership transfer and balancing, and a
//! new member catching up through a snapshot after the log was compacted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gangway_raft::storage::MemoryStore;
use gangway_raft::{GroupId, HostConfig, NodeId, RaftHost, RaftTiming, RestoreError, StateMachine};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

/// A key-value map; a command is `key=value`, a query is a key.
#[derive(Default)]
struct KvMachine {
    map: BTreeMap<String, String>,
}

impl StateMachine for KvMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(command);
        match text.split_once('=') {
            Some((k, v)) => {
                self.map.insert(k.to_string(), v.to_string());
                b"ok".to_vec()
            }
            None => b"error: expected key=value".to_vec(),
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.map).unwrap_or_default()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.map = serde_json::from_slice(snapshot).map_err(|e| RestoreError(e.to_string()))?;
        Ok(())
    }
    fn admission(&self) -> Option<gangway_raft::Admission> {
        Some(Arc::new(|command: &[u8]| {
            if command.contains(&b'=') {
                Ok(())
            } else {
                Err("expected key=value".into())
            }
        }))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        let key = String::from_utf8_lossy(query);
        self.map
            .get(key.as_ref())
            .cloned()
            .unwrap_or_default()
            .into_bytes()
    }
}

struct Replica {
    host: RaftHost,
    /// Where its transport listens.
    addr: String,
    stop: Option<oneshot::Sender<()>>,
}

const GROUPS: u64 = 7;

/// Entries between automatic snapshots in most tests: more than any writes, so only
/// explicit compactions snapshot.
const SNAPSHOT_EVERY_ENTRIES: u64 = 100_000;

/// A key-value machine for any group.
fn kv_machine(_group: GroupId) -> Box<dyn StateMachine> {
    Box::new(KvMachine::default())
}

/// Starts replica `id` on a new store, with key-value machines.
async fn start_replica(id: NodeId, listener: TcpListener, snapshot_every_entries: u64) -> Replica {
    let store = Arc::new(MemoryStore::new());
    start_replica_on(
        id,
        listener,
        snapshot_every_entries,
        store,
        Arc::new(kv_machine),
    )
    .await
}

/// Starts replica `id` on `store`, its machines built by `factory`.
async fn start_replica_on(
    id: NodeId,
    listener: TcpListener,
    snapshot_every_entries: u64,
    store: Arc<MemoryStore>,
    factory: Arc<gangway_raft::StateMachineFactory>,
) -> Replica {
    // RUST_LOG=info shows the hosts' logs when a run fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let addr = listener.local_addr().expect("local addr").to_string();
    let cfg = HostConfig {
        cluster_id: "test".into(),
        node_id: id,
        advertise_addr: addr.clone(),
        groups: (0..GROUPS).collect(),
        timing: RaftTiming {
            balance_interval_ms: 0,
            snapshot_every_entries,
            ..RaftTiming::default()
        },
        peer_security: Default::default(),
        peer_routes: Default::default(),
        transport: Default::default(),
    };
    let host = RaftHost::start(cfg, store, factory)
        .await
        .expect("host starts");
    let (tx, rx) = oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .add_service(host.transport_service())
        .add_service(host.admin_service());
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = rx.await;
            })
            .await;
    });
    Replica {
        host,
        addr,
        stop: Some(tx),
    }
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback")
}

async fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three replicas on loopback, bootstrapped, each group with a leader.
async fn start_three() -> Vec<Replica> {
    start_three_snapshotting_every(SNAPSHOT_EVERY_ENTRIES).await
}

/// [`start_three`] with automatic snapshots after `entries` entries.
async fn start_three_snapshotting_every(entries: u64) -> Vec<Replica> {
    let stores = [(); 3].map(|_| Arc::new(MemoryStore::new()));
    start_three_on(entries, &stores).await
}

/// [`start_three_snapshotting_every`] on the given stores, one per replica.
async fn start_three_on(entries: u64, stores: &[Arc<MemoryStore>; 3]) -> Vec<Replica> {
    let listeners = [bind().await, bind().await, bind().await];
    let members: BTreeMap<NodeId, String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as NodeId + 1, l.local_addr().expect("addr").to_string()))
        .collect();
    let mut replicas = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let (id, store) = (i as NodeId + 1, stores[i].clone());
        replicas.push(start_replica_on(id, l, entries, store, Arc::new(kv_machine)).await);
    }
    for r in &replicas {
        r.host.bootstrap(&members).await.expect("bootstrap");
    }
    wait_until("a leader in every group", 10, || {
        replicas.iter().all(|r| r.host.knows_every_leader())
    })
    .await;
    replicas
}

/// Stops every replica: its host, then its transport server.
async fn stop_all(replicas: impl IntoIterator<Item = Replica>) {
    for mut r in replicas {
        r.host.shutdown().await;
        if let Some(stop) = r.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Writes `key=value` to group 1 through the first replica.
async fn put(replicas: &[Replica], key: &str, value: &str) {
    replicas[0]
        .host
        .write(1, format!("{key}={value}").into_bytes())
        .await
        .unwrap_or_else(|e| panic!("write {key}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_added_while_the_hosts_run_elects_a_leader_and_replicates() {
    let replicas = start_three().await;
    let voters = replicas[0].host.members();
    let new = GROUPS;
    // Two hosts open the group at once; the third only later, as a replica does that
    // applies the decision late. The group must still form and take the third in.
    for r in &replicas[1..] {
        assert!(r.host.add_group(new, &voters).await.expect("add group"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(replicas[0]
        .host
        .add_group(new, &voters)
        .await
        .expect("add group"));
    assert!(
        !replicas[0]
            .host
            .add_group(new, &voters)
            .await
            .expect("add again"),
        "adding a group the host has is a no-op"
    );
    wait_until("a leader of the added group on every host", 10, || {
        replicas.iter().all(|r| r.host.leader_of(new).is_some())
    })
    .await;
    for (i, r) in replicas.iter().enumerate() {
        let out = r
            .host
            .write(new, format!("k{i}=v{i}").into_bytes())
            .await
            .expect("write to the added group");
        assert_eq!(out.reply, b"ok");
    }
    for r in &replicas {
        for i in 0..replicas.len() {
            let out = r
                .host
                .read(new, format!("k{i}").into_bytes())
                .await
                .expect("read");
            assert_eq!(out.reply, format!("v{i}").into_bytes());
        }
        assert!(r.host.group_ids().contains(&new));
    }
    // A typed read runs on the leader, after every acknowledged write; elsewhere it
    // answers NotLeader naming the leader, and the caller reads through it.
    let leader = replicas[0].host.leader_of(new).expect("leader");
    for r in &replicas {
        let typed = r
            .host
            .inspect(new, |sm| {
                sm.downcast_ref::<KvMachine>().map(|m| m.map.len())
            })
            .await;
        if r.host.node_id() == leader {
            assert_eq!(typed.expect("typed read on the leader"), Some(3));
        } else {
            match typed {
                Err(gangway_raft::HostError::NotLeader {
                    leader: Some((id, _)),
                    ..
                }) => assert_eq!(id, leader),
                other => panic!("a typed read on a follower: {other:?}"),
            }
        }
        let local = r
            .host
            .inspect_local(new, |sm| sm.downcast_ref::<KvMachine>().is_some())
            .expect("local typed read");
        assert!(local);
    }
    // The groups that were there go on as before.
    let out = replicas[2]
        .host
        .write(0, b"still=here".to_vec())
        .await
        .expect("write");
    assert_eq!(out.reply, b"ok");
    stop_all(replicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_replicate_transfer_balance_and_snapshot() {
    let replicas = start_three().await;

    // Writes in every group, through every replica (followers forward).
    for g in 0..GROUPS {
        for (i, r) in replicas.iter().enumerate() {
            let out = r
                .host
                .write(g, format!("k{g}-{i}=v{i}").into_bytes())
                .await
                .expect("write");
            assert_eq!(out.reply, b"ok");
        }
    }
    // Linearizable reads through any replica see every acknowledged write.
    for g in 0..GROUPS {
        for (i, r) in replicas.iter().enumerate() {
            let out = r
                .host
                .read(g, format!("k{g}-{i}").into_bytes())
                .await
                .expect("read");
            assert_eq!(out.reply, format!("v{i}").into_bytes());
        }
    }
    // A reply past tonic's default 4 MiB comes back through a follower too (the
    // forwarding client once kept that default and refused it).
    let big = "x".repeat(6 << 20);
    put(&replicas, "big", &big).await;
    for r in &replicas {
        let out = r.host.read(1, b"big".to_vec()).await.expect("read 6 MiB");
        assert_eq!(out.reply.len(), big.len());
    }
    // Identical state on every replica once all applied the same log.
    wait_until("equal state hashes", 10, || {
        let hashes: Vec<_> = replicas.iter().map(|r| r.host.status(true)).collect();
        (0..GROUPS as usize).all(|g| {
            let first = &hashes[0][g];
            hashes.iter().all(|h| {
                h[g].applied_index == first.applied_index && h[g].state_hash == first.state_hash
            })
        })
    })
    .await;

    // A command the machine does not admit is refused wherever it is sent, and
    // takes no log index.
    let before: Vec<u64> = replicas[0]
        .host
        .status(false)
        .iter()
        .map(|g| g.applied_index)
        .collect();
    for r in &replicas {
        let err = r
            .host
            .write(1, b"no equals sign".to_vec())
            .await
            .expect_err("not admitted");
        assert!(err.to_string().contains("expected key=value"), "{err}");
    }
    let after: Vec<u64> = replicas[0]
        .host
        .status(false)
        .iter()
        .map(|g| g.applied_index)
        .collect();
    assert_eq!(before, after, "a refused command took a log index");

    // An unknown group is refused by name.
    let err = replicas[0]
        .host
        .write(99, b"a=b".to_vec())
        .await
        .expect_err("group 99 does not exist");
    assert!(err.to_string().contains("unknown raft group 99"), "{err}");

    // Transfer group 0's leadership to each other node in turn.
    for to in [2, 3, 1] {
        let leader = replicas[0]
            .host
            .transfer_leader(0, to)
            .await
            .expect("transfer");
        assert_eq!(leader, to);
    }

    // Put every leadership on node 1, then balance: no node leads more than 3 of 7.
    for g in 0..GROUPS {
        replicas[1]
            .host
            .transfer_leader(g, 1)
            .await
            .expect("gather on node 1");
    }
    let reply = replicas[2].host.balance().await.expect("balance");
    assert!(
        reply.leaders_per_node.values().all(|c| *c <= 3),
        "{:?}",
        reply.leaders_per_node
    );

    // Compact every replica's log, then add node 4: it can only catch up by snapshot.
    for g in 0..GROUPS {
        replicas[0]
            .host
            .write(g, format!("after-compact-{g}=x").into_bytes())
            .await
            .expect("write");
    }
    for r in &replicas {
        r.host.compact(None).await.expect("compact");
    }
    let l4 = bind().await;
    let addr4 = l4.local_addr().expect("addr").to_string();
    let r4 = start_replica(4, l4, SNAPSHOT_EVERY_ENTRIES).await;
    replicas[0]
        .host
        .add_learner(None, 4, &addr4)
        .await
        .expect("add learner 4");
    let voters: BTreeSet<NodeId> = [1, 2, 4].into_iter().collect();
    replicas[1]
        .host
        .change_membership(None, voters.clone())
        .await
        .expect("replace 3 by 4");
    let status4 = r4.host.status(false);
    assert!(
        status4.iter().all(|g| g.snapshot_index > 0),
        "node 4 installed snapshots: {status4:?}"
    );
    for g in 0..GROUPS {
        let out = r4
            .host
            .read_local(g, format!("after-compact-{g}").as_bytes())
            .expect("local read");
        assert_eq!(out.reply, b"x");
    }
    // The change is committed on the leader when it answers; node 4 applies it a
    // moment later.
    wait_until("node 4 applies the new voters in every group", 10, || {
        r4.host.status(false).iter().all(|g| {
            let now: BTreeSet<NodeId> = g.voters.iter().copied().collect();
            now == voters
        })
    })
    .await;

    stop_all(replicas.into_iter().chain([r4])).await;
}

/// Writes forwarded by a follower travel in batches: hundreds of concurrent writes
/// through a follower each get their own outcome (a refused one its own error), and
/// every accepted one is there to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_through_a_follower_each_get_their_outcome() {
    let replicas = start_three().await;
    let group = 2;
    let leader = replicas[0].host.leader_of(group).expect("a leader");
    let follower = replicas
        .iter()
        .find(|r| r.host.node_id() != leader)
        .expect("a follower")
        .host
        .clone();
    const WRITES: usize = 600;
    let writes: Vec<_> = (0..WRITES)
        .map(|i| {
            let host = follower.clone();
            // Every seventh write is one the group's admission refuses.
            let command = if i % 7 == 0 {
                format!("refused-{i}")
            } else {
                format!("fwd-{i}=v{i}")
            };
            tokio::spawn(async move { host.write(group, command.into_bytes()).await })
        })
        .collect();
    for (i, w) in writes.into_iter().enumerate() {
        let result = w.await.expect("task");
        if i % 7 == 0 {
            let err = result.expect_err("not admitted");
            assert!(err.to_string().contains("expected key=value"), "{i}: {err}");
        } else {
            let out = result.unwrap_or_else(|e| panic!("write {i}: {e}"));
            assert_eq!(out.reply, b"ok", "write {i}");
            assert!(out.index > 0, "write {i} has its entry's index");
        }
    }
    for i in (0..WRITES).filter(|i| i % 7 != 0) {
        let out = follower
            .read(group, format!("fwd-{i}").into_bytes())
            .await
            .expect("read");
        assert_eq!(out.reply, format!("v{i}").into_bytes(), "fwd-{i}");
    }
    stop_all(replicas).await;
}

/// Group 1's snapshot index on every replica.
fn snapshot_indexes(replicas: &[Replica]) -> Vec<u64> {
    replicas
        .iter()
        .map(|r| r.host.status(false)[1].snapshot_index)
        .collect()
}

async fn write_small(replicas: &[Replica], from: usize, count: usize) {
    for i in from..from + count {
        put(replicas, &format!("k{i}"), "v").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_follow_entries_on_a_small_state_and_bytes_on_a_large_one() {
    let every = 20;
    let replicas = start_three_snapshotting_every(every).await;
    // A small state: the entry count decides.
    write_small(&replicas, 0, 30).await;
    wait_until("a snapshot after 20 entries", 10, || {
        snapshot_indexes(&replicas).iter().all(|i| *i > 0)
    })
    .await;
    // A large state: 4 MiB, then small writes until it is snapshotted whole.
    put(&replicas, "big", &"x".repeat(4 << 20)).await;
    let big_at = replicas
        .iter()
        .map(|r| r.host.status(false)[1].applied_index)
        .max()
        .unwrap_or(0);
    write_small(&replicas, 100, every as usize).await;
    wait_until("a snapshot holding the 4 MiB value", 10, || {
        snapshot_indexes(&replicas).iter().all(|i| *i >= big_at)
    })
    .await;
    let large = snapshot_indexes(&replicas);
    // Many entries but few bytes: no new snapshot (a quarter of 4 MiB is due first).
    write_small(&replicas, 200, 3 * every as usize).await;
    tokio::time::sleep(Duration::from_millis(
        5 * gangway_raft::snapshot_cadence::SNAPSHOT_CHECK_MS,
    ))
    .await;
    assert_eq!(
        snapshot_indexes(&replicas),
        large,
        "60 small entries after a 4 MiB snapshot built none"
    );
    // A quarter of its size in commands: due again.
    put(&replicas, "q", &"y".repeat((1 << 20) + 1)).await;
    wait_until("a snapshot after a quarter of its size", 10, || {
        snapshot_indexes(&replicas)
            .iter()
            .zip(&large)
            .all(|(now, before)| now > before)
    })
    .await;
    stop_all(replicas).await;
}

/// A [`KvMachine`] whose restore from a snapshot takes [`SLOW_RESTORE_MS`], as a large
/// state's does.
#[derive(Default)]
struct SlowRestore(KvMachine);

/// How long [`SlowRestore`] restores: several election timeouts.
const SLOW_RESTORE_MS: u64 = 2_000;

impl StateMachine for SlowRestore {
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8> {
        self.0.apply(index, command)
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        std::thread::sleep(Duration::from_millis(SLOW_RESTORE_MS));
        self.0.restore(snapshot)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        self.0.query(query)
    }
}

/// Binds `addr` again once the stopped server that held it has let it go (its task
/// ends shortly after its stop signal).
async fn rebind(addr: &str) -> TcpListener {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("rebind {addr}: {e}"),
        }
    }
}

/// Each group's (leader, term) as `replica` sees it.
fn leaders_and_terms(replica: &Replica) -> Vec<(u64, u64)> {
    replica
        .host
        .status(false)
        .iter()
        .map(|g| (g.leader, g.term))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_restarts_slowly_deposes_no_leader() {
    let stores = [(); 3].map(|_| Arc::new(MemoryStore::new()));
    let mut replicas = start_three_on(SNAPSHOT_EVERY_ENTRIES, &stores).await;
    // Replica 3 holds a snapshot of group 0 and leads nothing.
    for i in 0..5 {
        let out = replicas[0]
            .host
            .write(0, format!("k{i}=v").into_bytes())
            .await
            .expect("write");
        assert_eq!(out.reply, b"ok");
    }
    wait_until("replica 3 applied group 0", 10, || {
        replicas[2].host.status(false)[0].applied_index
            >= replicas[0].host.status(false)[0].applied_index
    })
    .await;
    replicas[2].host.compact(Some(0)).await.expect("compact");
    for g in 0..GROUPS {
        if replicas[0].host.status(false)[g as usize].leader == 3 {
            replicas[2]
                .host
                .transfer_leader(g, 1)
                .await
                .expect("transfer off replica 3");
        }
    }
    let third = replicas.pop().expect("three replicas");
    let third_addr = third.addr.clone();
    stop_all([third]).await;
    wait_until("replicas 1 and 2 agree on every leader", 10, || {
        let (a, b) = (
            leaders_and_terms(&replicas[0]),
            leaders_and_terms(&replicas[1]),
        );
        a == b && a.iter().all(|(leader, _)| *leader == 1 || *leader == 2)
    })
    .await;
    let before = leaders_and_terms(&replicas[0]);

    // Restarted on its data: group 0 restores for seconds while the other groups wait.
    let slow = |g: GroupId| -> Box<dyn StateMachine> {
        if g == 0 {
            Box::new(SlowRestore::default())
        } else {
            kv_machine(g)
        }
    };
    let listener = rebind(&third_addr).await;
    let restarted = start_replica_on(
        3,
        listener,
        SNAPSHOT_EVERY_ENTRIES,
        stores[2].clone(),
        Arc::new(slow),
    )
    .await;
    wait_until("replica 3 knows every leader", 10, || {
        restarted.host.knows_every_leader()
    })
    .await;
    // Several election timeouts in which a campaign it started would show.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for r in replicas.iter().chain(std::iter::once(&restarted)) {
        assert_eq!(
            leaders_and_terms(r),
            before,
            "a restarted replica campaigned and moved a leader or a term (leader, term per group)"
        );
    }
    replicas.push(restarted);
    stop_all(replicas).await;
}
