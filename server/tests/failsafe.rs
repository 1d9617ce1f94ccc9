//! Replicas that fail safe, as real `gangway serve` processes on 127.0.0.1: a
//! replica whose disk fills exits non-zero (its supervisor restarts it) instead of
//! serving with stopped Raft groups, and comes back with equal state once the disk
//! has room.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gangway_proto::v1::{RegisterNodeRequest, WatchGangGroupRequest};
use support::{list_names, node, Cluster};

/// Size of the filesystem the test makes for one replica's data dir.
const SMALL_FS_MB: u64 = 48;
/// Time the replica with the full disk may take to notice and exit.
const DISK_FULL_EXIT_MS: u64 = 60_000;

/// A tmpfs mounted for the test, unmounted when dropped. Needs root (as CI runs).
struct SmallFs {
    at: PathBuf,
}

impl SmallFs {
    fn mount(at: &Path, size_mb: u64) -> SmallFs {
        std::fs::create_dir_all(at).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a {size_mb} MiB tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs {
            at: at.to_path_buf(),
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Fills the filesystem holding `dir` with a file, leaving about `leave_kb` free.
fn fill(dir: &Path, leave_kb: u64) -> PathBuf {
    let path = dir.join("filler");
    let out = Command::new("df")
        .args(["--output=avail", "-k"])
        .arg(dir)
        .output()
        .expect("run df");
    let text = String::from_utf8_lossy(&out.stdout);
    let avail_kb: u64 = text
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df output: {text}"));
    let bytes = avail_kb.saturating_sub(leave_kb) * 1024;
    let f = std::fs::File::create(&path).expect("create the filler");
    f.set_len(bytes).expect("size the filler");
    // tmpfs allocates on write: write it for real.
    let status = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "conv=notrunc,fsync"])
        .arg(format!("of={}", path.display()))
        .arg(format!("count={}", bytes / (1024 * 1024)))
        .status()
        .expect("run dd");
    assert!(status.success(), "dd filled {}", path.display());
    path
}

/// Most attempts at one registration while a replica is failing.
const REGISTER_ATTEMPTS_MAX: u32 = 20;

/// Registers `spec`, again after an UNAVAILABLE answer (the replica that had the write
/// stopped mid-call: the write may or may not have been applied, and registering the
/// same node again is answered as unchanged), as a client does; other errors end it.
async fn register_retrying(
    inv: &mut gangway_proto::v1::inventory_client::InventoryClient<tonic::transport::Channel>,
    spec: gangway_proto::v1::NodeSpec,
) -> Result<(), tonic::Status> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let request = RegisterNodeRequest {
            node: Some(spec.clone()),
            update: false,
        };
        match inv.register_node(request).await {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == tonic::Code::Unavailable && attempt < REGISTER_ATTEMPTS_MAX => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_replica_and_freed_space_brings_it_back() {
    let mut c = Cluster::prepare(3, 1, Vec::new(), Vec::new());
    let data3 = c.procs[&3].data.clone();
    let _fs = SmallFs::mount(&data3, SMALL_FS_MB);
    for id in 1..=3 {
        c.spawn(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;

    let filler = fill(&data3, 256);
    let mut inv = c.inventory(1).await;
    let mut acked = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(DISK_FULL_EXIT_MS);
    let status = loop {
        if let Some(status) = c.exited(3) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "replica 3 still runs with a full disk after {DISK_FULL_EXIT_MS} ms:\n{}",
            c.log(3)
        );
        let name = format!("n-{:05}", acked.len());
        let mut spec = node(&name);
        // Large labels fill the log quickly.
        spec.labels.insert("padding".into(), "x".repeat(60));
        for i in 0..40 {
            spec.labels.insert(format!("pad-{i}"), "y".repeat(60));
        }
        register_retrying(&mut inv, spec)
            .await
            .unwrap_or_else(|e| panic!("register {name} with one replica's disk full: {e}"));
        acked.push(name);
    };
    let log = c.log(3);
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    eprintln!(
        "replica 3 exited ({status}) after {} registrations, {} ERROR lines: {:#?}",
        acked.len(),
        errors.len(),
        errors.iter().take(5).collect::<Vec<_>>()
    );
    assert!(!status.success(), "exit status {status}");
    assert!(log.contains("No space left on device"), "{log}");
    assert!(
        log.contains("exits so that its supervisor restarts it"),
        "{log}"
    );

    // The other two carry on; with room again, a restart catches up to equal state.
    support::register(&mut inv, "after-full")
        .await
        .expect("register on the majority");
    acked.push("after-full".into());
    std::fs::remove_file(&filler).expect("free the space");
    c.spawn(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
    let mut inv3 = c.inventory(3).await;
    let listed = list_names(&mut inv3).await;
    for name in &acked {
        assert!(
            listed.contains(name),
            "{name} missing on the restarted replica"
        );
    }
}

/// Waits up to `bound` for process `id` of `c` to exit on its own.
async fn exit_of(
    c: &mut Cluster,
    id: u64,
    bound: Duration,
) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = c.exited(id) {
            return (status, start.elapsed());
        }
        assert!(
            start.elapsed() < bound,
            "process {id} still runs {bound:?} after the signal:\n{}",
            c.log(id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_with_open_streams_exits_within_the_bound() {
    use gangway_proto::v1::scheduler_client::SchedulerClient;
    use gangway_proto::v1::{GangSpec, MemberSpec, SubmitGangGroupRequest};

    let mut c = Cluster::start(3, 1);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    // A healthy cluster's creation logs nothing at ERROR (its replicas run with the
    // default log filter).
    for id in 1..=3 {
        let errors: Vec<String> = c
            .log(id)
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(String::from)
            .collect();
        assert!(
            errors.is_empty(),
            "replica {id} logged ERROR while healthy: {errors:#?}"
        );
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.procs[&1].grpc))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to replica 1");
    let mut scheduler = SchedulerClient::new(channel);
    // A group no node can take stays queued, so its watch stream stays open.
    let queued = scheduler
        .submit_gang_group(SubmitGangGroupRequest {
            queue: String::new(),
            run_limit_seconds: 0,
            idempotency_key: "stuck".into(),
            name: "stuck".into(),
            gangs: vec![GangSpec {
                name: "big".into(),
                namespace: "team-a".into(),
                min_member: 1,
                total_number: 1,
                mode: "Strict".into(),
                wait_time_ms: 600_000,
                priority: 0,
                members: vec![MemberSpec {
                    name: "w".into(),
                    count: 1,
                    pod_json: r#"{"requests": {"cpu": "1000"}}"#.into(),
                    pods: None,
                }],
                topology: None,
            }],
        })
        .await
        .expect("submit")
        .into_inner();
    let mut watches = Vec::new();
    for _ in 0..4 {
        let mut stream = scheduler
            .watch_gang_group(WatchGangGroupRequest {
                id: queued.id,
                after_version: 0,
            })
            .await
            .expect("watch")
            .into_inner();
        stream.message().await.expect("first status");
        watches.push(stream);
    }
    let mut inv = c.inventory(1).await;
    let load = tokio::spawn(async move {
        let mut i = 0u32;
        loop {
            let _ = support::register(&mut inv, &format!("load-{i:05}")).await;
            i += 1;
        }
    });
    // A scraper's keep-alive connection and a client that sent half a request hold
    // the HTTP port open.
    let mut held = Vec::new();
    for request in [
        "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHo",
    ] {
        use tokio::io::AsyncWriteExt;
        let mut conn = tokio::net::TcpStream::connect(&c.procs[&1].http)
            .await
            .expect("connect to the HTTP port");
        conn.write_all(request.as_bytes()).await.expect("send");
        held.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.signal(1, "TERM");
    let bound = Duration::from_millis(gangway_server::serve::SHUTDOWN_GRACE_MS + 5_000);
    let (status, took) = exit_of(&mut c, 1, bound).await;
    load.abort();
    eprintln!("replica 1 exited ({status}) {took:?} after SIGTERM with 4 open watch streams");
    assert!(status.success(), "{status}:\n{}", c.log(1));
    // Held connections are closed after their drain time, not at the overall bound.
    assert!(
        !c.log(1).contains("shutdown did not finish in time"),
        "shutdown waited for held connections until the bound:\n{}",
        c.log(1)
    );
    c.wait_ready(&[2, 3], Duration::from_secs(30)).await;
    drop((watches, held));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangway_dev_is_quiet_stops_on_sigterm_and_refuses_a_lost_replica() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("dev");
    let out_path = dir.path().join("dev.out");
    let err_path = dir.path().join("dev.err");
    let dev = |out: &Path, err: &Path| {
        Command::new(support::gangway_bin())
            .args(["dev", "--nodes", "8", "--shards", "2", "--data"])
            .arg(&data)
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdout(Stdio::from(
                std::fs::File::create(out).expect("stdout file"),
            ))
            .stderr(Stdio::from(
                std::fs::File::create(err).expect("stderr file"),
            ))
            .spawn()
            .expect("spawn gangway dev")
    };
    let mut child = dev(&out_path, &err_path);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&out_path)
        .unwrap_or_default()
        .contains("simulated nodes registered")
    {
        assert!(
            Instant::now() < deadline,
            "gangway dev did not come up:\n{}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "gangway dev exited early"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A healthy start logs nothing a person must read (it once printed an election
    // gate line per group and replica while the groups formed, and one per group opened).
    let started = std::fs::read_to_string(&err_path).unwrap_or_default();
    let noisy: Vec<&str> = started
        .lines()
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN "))
        .collect();
    if !noisy.is_empty() {
        let _ = child.kill();
        panic!("a healthy dev start logs lines a person must read: {noisy:#?}");
    }
    let status = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let start = Instant::now();
    let bound = Duration::from_millis(gangway_server::serve::SHUTDOWN_GRACE_MS + 5_000);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            panic!("gangway dev still runs {bound:?} after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "{status}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "a healthy dev cluster logs ERROR lines: {errors:#?}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a log file: {stderr}"
    );

    // One replica's data lost: the dev cluster is not re-created around the others.
    std::fs::remove_dir_all(data.join("node-2")).expect("lose replica 2's data");
    let mut child = dev(&out_path, &err_path);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("gangway dev started with a replica's data lost");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(!status.success());
    assert!(
        stderr.contains("replicas [2]") && stderr.contains("hold no Raft state"),
        "{stderr}"
    );
}

/// A TCP proxy in front of the API server double that can stall: while stalled it
/// holds every connection open and forwards nothing, as an overloaded or
/// partitioned API server would look (the double itself always answers).
struct StallingProxy {
    addr: std::net::SocketAddr,
    stalled: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl StallingProxy {
    async fn start(upstream: std::net::SocketAddr) -> StallingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (stalled, _) = tokio::sync::watch::channel(false);
        let flag = stalled.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let flag = flag.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, flag.clone()), pipe(sr, cw, flag));
                });
            }
        });
        StallingProxy {
            addr,
            stalled,
            task,
        }
    }

    fn stall(&self) {
        let _ = self.stalled.send(true);
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stalled_api_server_exits_within_the_bound() {
    use gangway_kube_double::store::{NODES, PODS};
    use gangway_kube_double::{ApiServerDouble, Options};
    use serde_json::json;

    let api = ApiServerDouble::start(Options::default())
        .await
        .expect("double starts");
    let upstream: std::net::SocketAddr = api
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("double address");
    let proxy = StallingProxy::start(upstream).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: p\n  context:\n    cluster: p\n    user: u\ncurrent-context: p\nusers:\n- name: u\n  user: {{}}\n",
            proxy.addr
        ),
    )
    .expect("kubeconfig");
    for i in 0..20 {
        let name = format!("node-{i:03}");
        api.create(&NODES, support::objects::node(&name))
            .expect("node");
    }
    let args = vec!["--kubeconfig".to_string(), kubeconfig.display().to_string()];
    let mut c = Cluster::start_with(3, 2, args, Vec::new());
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    for i in 0..200 {
        api.create(&PODS, json!({
            "metadata": {"name": format!("p-{i:03}"), "namespace": "default"},
            "spec": {"schedulerName": "gangway",
                     "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]}
        }))
        .expect("pod");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.stall();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in [1, 2, 3] {
        c.signal(id, "TERM");
    }
    let bound = Duration::from_millis(gangway_server::serve::SHUTDOWN_GRACE_MS + 5_000);
    for id in [1, 2, 3] {
        let (status, took) = exit_of(&mut c, id, bound).await;
        eprintln!("replica {id} exited ({status}) {took:?} after SIGTERM, API server stalled");
        assert!(status.success(), "{status}:\n{}", c.log(id));
    }
}

/// Test-only codec that sends raw bytes as a message, to play a client whose requests
/// are not protobuf at all (no generated client can send them).
#[derive(Debug, Default, Clone)]
struct RawBytes;

impl tonic::codec::Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;
    fn encoder(&mut self) -> RawBytes {
        RawBytes
    }
    fn decoder(&mut self) -> RawBytes {
        RawBytes
    }
}

impl tonic::codec::Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        buf.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let bytes = buf.copy_to_bytes(buf.remaining()).to_vec();
        Ok(Some(bytes))
    }
}

/// Not a protobuf message: field 31, wire type 7 (no such type).
const GARBAGE: [u8; 4] = [0xff, 0x01, 0xff, 0xff];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_a_precise_code_and_a_short_message() {
    use gangway_proto::v1::inventory_client::InventoryClient;
    use gangway_proto::v1::scheduler_client::SchedulerClient;
    use gangway_proto::v1::{GangSpec, MemberSpec, SubmitGangGroupRequest};
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::Code;

    let c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(30)).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.procs[&1].grpc))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut scheduler = SchedulerClient::new(channel.clone());
    let mut inventory = InventoryClient::new(channel.clone());
    let submit = |name: &str, pod_json: &str| SubmitGangGroupRequest {
        queue: String::new(),
        run_limit_seconds: 0,
        idempotency_key: String::new(),
        name: name.into(),
        gangs: vec![GangSpec {
            name: "g".into(),
            namespace: "ns".into(),
            min_member: 1,
            total_number: 0,
            mode: String::new(),
            wait_time_ms: 0,
            priority: 0,
            members: vec![MemberSpec {
                name: "m".into(),
                count: 1,
                pod_json: pod_json.into(),
                pods: None,
            }],
            topology: None,
        }],
    };
    let expect = |what: &str,
                  r: Result<tonic::Response<gangway_proto::v1::GangGroupStatus>, tonic::Status>,
                  code: Code,
                  needle: &str| {
        let err = r.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err}");
        assert!(err.message().contains(needle), "{what}: {err}");
        assert!(
            err.message().len() < 2_048,
            "{what}: a {} byte message",
            err.message().len()
        );
    };

    // A misspelt pod field, named.
    let r = scheduler
        .submit_gang_group(submit("typo", r#"{"requestz": {"cpu": "1"}}"#))
        .await;
    expect(
        "misspelt field",
        r,
        Code::InvalidArgument,
        "unknown field `requestz`",
    );
    // A request below the smallest unit.
    let r = scheduler
        .submit_gang_group(submit("tiny", r#"{"requests": {"cpu": "1e-400"}}"#))
        .await;
    expect("1e-400 cpu", r, Code::InvalidArgument, "requests.cpu");
    // A selector of three nested loops over 400 elements: refused for its cost, by field.
    let items: Vec<String> = (0..400).map(|i| i.to_string()).collect();
    let r = format!("[{}]", items.join(","));
    let costly = format!("{r}.exists(a, {r}.exists(b, {r}.exists(c, a + b + c == 0)))");
    let pod = serde_json::json!({"claims": [{"name": "gpu", "requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.example.com", "selectors": [{"cel": {"expression": costly}}]}}]}]});
    let r = scheduler
        .submit_gang_group(submit("costly", &pod.to_string()))
        .await;
    expect(
        "costly CEL",
        r,
        Code::InvalidArgument,
        "selectors[0].cel.expression: estimated cost",
    );
    // No group name.
    let r = scheduler.submit_gang_group(submit("", "")).await;
    expect(
        "empty group name",
        r,
        Code::InvalidArgument,
        "name: required",
    );
    // A 3 MB name: refused with a short message the client receives whole.
    let huge = "a".repeat(3 * 1024 * 1024);
    let r = scheduler.submit_gang_group(submit(&huge, "")).await;
    expect("3 MB name", r, Code::InvalidArgument, "more bytes");
    let r = scheduler
        .submit_gang_group(submit("huge-key", &format!(r#"{{"{huge}": 1}}"#)))
        .await;
    expect("3 MB field name", r, Code::InvalidArgument, "pod_json");

    // Garbage protobuf, unary and on the device stream.
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let err = grpc
        .unary(
            tonic::Request::new(GARBAGE.to_vec()),
            PathAndQuery::from_static("/gangway.v1.Inventory/RegisterNode"),
            RawBytes,
        )
        .await
        .expect_err("garbage");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("RegisterNodeRequest"), "{err}");
    grpc.ready().await.expect("ready");
    let mut acks = grpc
        .streaming(
            tonic::Request::new(futures::stream::iter(vec![GARBAGE.to_vec()])),
            PathAndQuery::from_static("/gangway.v1.Inventory/ListAndWatchDevices"),
            RawBytes,
        )
        .await
        .expect("the stream opens")
        .into_inner();
    let err = tokio::time::timeout(Duration::from_secs(10), acks.message())
        .await
        .expect("the stream answers")
        .expect_err("garbage on the device stream ends it with an error");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    // The same node again is fine; other allocatable is refused, naming it; an update changes it.
    let spec = support::node_spec("n-1", "8", false);
    for _ in 0..2 {
        inventory
            .register_node(RegisterNodeRequest {
                node: Some(spec.clone()),
                update: false,
            })
            .await
            .expect("the same node again");
    }
    let other = support::node_spec("n-1", "16", false);
    let err = inventory
        .register_node(RegisterNodeRequest {
            node: Some(other.clone()),
            update: false,
        })
        .await
        .expect_err("other allocatable");
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.message().contains("allocatable"), "{err}");
    let updated = inventory
        .register_node(RegisterNodeRequest {
            node: Some(other),
            update: true,
        })
        .await
        .expect("an explicit update")
        .into_inner();
    let cpu = updated
        .node
        .and_then(|info| info.node)
        .and_then(|n| n.allocatable.get("cpu").cloned());
    assert_eq!(cpu.as_deref(), Some("16"));
}

/// Places a gang whose selector is slow, then a plain gang, on one shard whose GPUs are
/// streamed by device agents; whether the plain gang was placed while the slow one
/// still waited. `failpoints` arms bug switches on every replica.
async fn plain_gang_overtakes_a_slow_selector(failpoints: &str) -> bool {
    use gangway_proto::v1::{DeviceHealth, DeviceListReport, PluginDevice};
    use tokio_stream::wrappers::ReceiverStream;

    let (args, env) = if failpoints.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        (
            vec!["--test-failpoints".to_string()],
            vec![(
                "GANGWAY_TEST_FAILPOINTS".to_string(),
                failpoints.to_string(),
            )],
        )
    };
    let c = Cluster::start_with(3, 1, args, env);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let client = support::client(&c, 1).await;
    let mut agents = Vec::new();
    for i in 0..4 {
        let name = format!("gpu-node-{i}");
        client
            .register_node(support::node_spec(&name, "64", false))
            .await
            .expect("register");
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let mut acks = client
            .device_stream(ReceiverStream::new(rx))
            .await
            .expect("device stream");
        let devices = (0..8)
            .map(|g| PluginDevice {
                id: format!("GPU-{i}-{g}"),
                health: DeviceHealth::Healthy as i32,
                numa_nodes: vec![0],
            })
            .collect();
        tx.send(DeviceListReport {
            node: name,
            resource_name: "nvidia.com/gpu".into(),
            devices,
        })
        .await
        .expect("report");
        tokio::time::timeout(Duration::from_secs(10), acks.message())
            .await
            .expect("ack in time")
            .expect("ack")
            .expect("an ack");
        agents.push((tx, acks));
    }
    // 32 devices, each a 200 x 200 loop: seconds of evaluation in a debug build.
    let items: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    let list = format!("[{}]", items.join(","));
    let selector = format!(
        "{list}.exists(a, {list}.exists(b, a * b == -1)) || device.driver == \"gpu.nvidia.com\""
    );
    let slow_pod = serde_json::json!({"requests": {"cpu": "1"}, "claims": [{"name": "gpu",
        "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": selector}}]}}]}]});
    let group = |name: &str, pod: serde_json::Value| {
        gangway_client::spec::GangGroupBuilder::new(name)
            .gang(gangway_client::spec::GangBuilder::new("ns", name, 1).members("w", 1, pod))
            .build()
    };
    let slow = client
        .submit(group("slow", slow_pod))
        .await
        .expect("submit slow");
    let plain = client
        .submit(group(
            "plain",
            serde_json::json!({"requests": {"cpu": "1"}}),
        ))
        .await
        .expect("submit plain");
    let placed =
        |s: &gangway_proto::v1::GangGroupStatus| s.state != "Queued" && s.state != "Placing";
    let plain = tokio::time::timeout(
        Duration::from_secs(120),
        client.watch_until(plain.id, placed),
    )
    .await
    .expect("plain gang placed within 120 s")
    .expect("watch plain");
    assert_eq!(plain.state, "Placed", "{plain:?}");
    // Still waiting for its plan: Queued, never tried or told its selector is still
    // being evaluated. Placing means its plan is done and its reservation under way,
    // which may commit after the plain gang's own. Queued after an attempt that failed
    // for another reason (a plan read that timed out while the selector ran inline) is
    // not the warmer at work, so it does not count as overtaking.
    let slow_now = client.get(slow.id).await.expect("get slow");
    let overtook = slow_now.state == "Queued"
        && (slow_now.attempts == 0 || slow_now.reason.contains("still being evaluated"));
    eprintln!(
        "plain placed; slow: state {} attempts {} reason {:?}",
        slow_now.state, slow_now.attempts, slow_now.reason
    );
    let slow = tokio::time::timeout(
        Duration::from_secs(300),
        client.watch_until(slow.id, placed),
    )
    .await
    .expect("slow gang placed within 300 s")
    .expect("watch slow");
    assert_eq!(slow.state, "Placed", "{slow:?}");
    overtook
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_selector_delays_only_its_own_gang() {
    assert!(
        plain_gang_overtakes_a_slow_selector("").await,
        "the plain gang waited for the slow selector"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_finds_plans_that_evaluate_slow_selectors_inline() {
    assert!(
        !plain_gang_overtakes_a_slow_selector("selectors-evaluated-inline").await,
        "with the bug switch the plain gang should have waited for the slow plan"
    );
}
