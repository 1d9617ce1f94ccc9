//! Test support: real `gangway serve` processes on 127.0.0.1 with their own
//! ports and data dirs, killed (SIGKILL) and restarted at will, and gRPC
//! helpers to observe them. Every wait is bounded; every process started here
//! is killed when the `Cluster` is dropped. Tests that use it run one at a
//! time (a process-wide lock), so timing checks are not skewed by each other.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::{GroupStatus, StatusReply, StatusRequest};
use gangway_proto::v1::inventory_client::InventoryClient;
use gangway_proto::v1::{ListNodesRequest, NodeSpec, RegisterNodeRequest};
use tonic::transport::{Channel, Endpoint};

pub mod chart;
pub mod device_plugin;
pub mod gangs;
pub mod kube;
pub mod matrix;
pub mod pki;

static SERIAL: Mutex<()> = Mutex::new(());

/// A free loopback port outside the ephemeral range (see `gangway_client::loopback`).
pub fn free_port() -> u16 {
    gangway_client::loopback::free_port().expect("a free loopback port")
}

/// One `gangway serve` process.
pub struct Proc {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub data: PathBuf,
    pub peers: BTreeMap<u64, String>,
    pub join: bool,
    child: Option<Child>,
}

/// A set of processes forming one cluster.
pub struct Cluster {
    pub procs: BTreeMap<u64, Proc>,
    pub dir: tempfile::TempDir,
    pub cluster_id: String,
    pub shards: u32,
    /// Extra flags and environment for every process.
    pub extra_args: Vec<String>,
    /// Extra flags for one process (after `extra_args`).
    pub proc_args: BTreeMap<u64, Vec<String>>,
    pub env: Vec<(String, String)>,
    _serial: MutexGuard<'static, ()>,
}

pub fn gangway_bin() -> &'static str {
    env!("CARGO_BIN_EXE_gangway")
}

/// Waits until the failpoint `name` fired (its marker file appeared in `dir`, see
/// `GANGWAY_TEST_FAILPOINT_DIR`), failing the test after `timeout`.
pub async fn wait_for_failpoint(dir: &Path, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !dir.join(name).exists() {
        assert!(Instant::now() < deadline, "failpoint {name} never fired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `probe` every 100 ms until it answers `Some`, failing the test after `timeout`.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resident memory of process `pid`, in KiB (from /proc).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The gangctl binary beside the gangway binary, built if this test run did not build it.
pub fn gangctl_bin() -> PathBuf {
    let dir = PathBuf::from(gangway_bin())
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let path = dir.join("gangctl");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "gangway-client", "--bin", "gangctl"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building gangctl failed");
    }
    path
}

/// Where a cluster dir keeps the replicas' peer secret.
pub fn peer_secret_path(dir: &std::path::Path) -> PathBuf {
    dir.join("peer-secret")
}

/// Writes a peer secret for the replicas of the cluster in `dir` (tests only: unique
/// per run, not secret from this machine).
pub fn write_peer_secret(dir: &std::path::Path) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let secret = format!("test-peer-secret-{}-{nanos}\n", std::process::id());
    std::fs::write(peer_secret_path(dir), secret).expect("write the peer secret");
}

impl Cluster {
    /// Starts `n` processes (ids 1..=n) of a new cluster with `shards` shards.
    pub fn start(n: u64, shards: u32) -> Cluster {
        Self::start_with(n, shards, Vec::new(), Vec::new())
    }

    /// Like `start`, with extra flags and environment for every process.
    pub fn start_with(
        n: u64,
        shards: u32,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Cluster {
        let mut cluster = Self::prepare(n, shards, extra_args, env);
        for id in 1..=n {
            cluster.spawn(id);
        }
        cluster
    }

    /// Like `start_with`, without starting the processes (to prepare their data dirs).
    pub fn prepare(
        n: u64,
        shards: u32,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Cluster {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        write_peer_secret(dir.path());
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut cluster = Cluster {
            procs: BTreeMap::new(),
            dir,
            cluster_id: format!("test-{}", std::process::id()),
            shards,
            extra_args,
            proc_args: BTreeMap::new(),
            env,
            _serial: serial,
        };
        for (&id, addr) in &addrs {
            let peers = addrs
                .iter()
                .filter(|(p, _)| **p != id)
                .map(|(p, a)| (*p, a.clone()))
                .collect();
            cluster.add_proc(id, addr.clone(), peers, false);
        }
        cluster
    }

    /// Registers a process (not started yet).
    pub fn add_proc(&mut self, id: u64, grpc: String, peers: BTreeMap<u64, String>, join: bool) {
        let data = self.dir.path().join(format!("node-{id}"));
        let http = format!("127.0.0.1:{}", free_port());
        self.procs.insert(
            id,
            Proc {
                id,
                grpc,
                http,
                data,
                peers,
                join,
                child: None,
            },
        );
    }

    /// The command line of process `id`.
    pub fn command(&self, id: u64) -> Command {
        let p = &self.procs[&id];
        let mut cmd = Command::new(gangway_bin());
        cmd.arg("serve")
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                &p.grpc,
                "--http",
                &p.http,
            ])
            .args([
                "--cluster-id",
                &self.cluster_id,
                "--shards",
                &self.shards.to_string(),
            ])
            .arg("--data")
            .arg(&p.data)
            .args(["--balance-interval-ms", "0"])
            .arg("--peer-secret-file")
            .arg(peer_secret_path(self.dir.path()));
        for (peer, addr) in &p.peers {
            cmd.args(["--peer", &format!("{peer}={addr}")]);
        }
        if p.join {
            cmd.arg("--join");
        } else if !self
            .extra_args
            .iter()
            .any(|a| a == "--initial-cluster-state")
        {
            cmd.args(["--initial-cluster-state", "new"]);
        }
        cmd.args(&self.extra_args);
        cmd.args(self.proc_args.get(&id).into_iter().flatten());
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// Starts process `id`, logging to a file in the cluster dir.
    pub fn spawn(&mut self, id: u64) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .expect("log file");
        let err = log.try_clone().expect("log file");
        let child = self
            .command(id)
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn gangway serve");
        self.procs.get_mut(&id).expect("known proc").child = Some(child);
    }

    /// The exit status of process `id` if it has exited on its own (reaped).
    pub fn exited(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let p = self.procs.get_mut(&id)?;
        let status = p.child.as_mut()?.try_wait().ok()??;
        p.child = None;
        Some(status)
    }

    /// Sends `signal` (a `kill -s` name such as TERM or STOP) to process `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        let pid = self.procs[&id]
            .child
            .as_ref()
            .map(|c| c.id())
            .expect("process runs");
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} {pid}");
    }

    /// The operating system's id of process `id` (it must be running).
    pub fn pid(&self, id: u64) -> u32 {
        self.procs[&id]
            .child
            .as_ref()
            .map(|c| c.id())
            .expect("process runs")
    }

    /// SIGKILLs process `id` and reaps it.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.procs.get_mut(&id).and_then(|p| p.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process ids currently running.
    pub fn live(&self) -> Vec<u64> {
        self.procs
            .values()
            .filter(|p| p.child.is_some())
            .map(|p| p.id)
            .collect()
    }

    /// The log of process `id`, for failure messages.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    async fn channel(&self, id: u64) -> Option<Channel> {
        let ep = Endpoint::from_shared(format!("http://{}", self.procs[&id].grpc)).ok()?;
        ep.connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .ok()
    }

    /// Admin client of process `id`.
    pub async fn admin(&self, id: u64) -> AdminClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(ch) = self.channel(id).await {
                return AdminClient::new(ch);
            }
            assert!(
                Instant::now() < deadline,
                "process {id} does not accept connections:\n{}",
                self.log(id)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Inventory client of process `id`.
    pub async fn inventory(&self, id: u64) -> InventoryClient<Channel> {
        let _ = self.admin(id).await;
        InventoryClient::new(self.channel(id).await.expect("connect"))
    }

    /// Status of process `id`, or None if it does not answer within a second.
    pub async fn status(&self, id: u64, with_hash: bool) -> Option<StatusReply> {
        let ch = self.channel(id).await?;
        let mut req = tonic::Request::new(StatusRequest {
            include_state_hash: with_hash,
        });
        req.set_timeout(Duration::from_secs(1));
        AdminClient::new(ch)
            .status(req)
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    /// Waits until every process in `ids` knows a leader among `ids` for every group.
    pub async fn wait_ready(&self, ids: &[u64], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ready = true;
            for &id in ids {
                match self.status(id, false).await {
                    Some(s) => ready &= s.groups.iter().all(|g| ids.contains(&g.leader)),
                    None => ready = false,
                }
            }
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster {ids:?} not ready within {timeout:?}:\n{}",
                self.logs(ids)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The leader of `group` that every process in `ids` agrees on, if any.
    pub async fn agreed_leader(&self, group: u64, ids: &[u64]) -> Option<u64> {
        let mut leader = None;
        for &id in ids {
            let s = self.status(id, false).await?;
            let l = s.groups.iter().find(|g| g.group_id == group)?.leader;
            if l == 0 || leader.is_some_and(|x| x != l) {
                return None;
            }
            leader = Some(l);
        }
        leader
    }

    /// Waits until the processes in `ids` hold identical state (applied index and hash) in every group.
    pub async fn wait_converged(&self, ids: &[u64], timeout: Duration) -> Vec<Vec<GroupStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut all = Vec::new();
            for &id in ids {
                if let Some(s) = self.status(id, true).await {
                    all.push(s.groups);
                }
            }
            if all.len() == ids.len() && converged(&all) {
                return all;
            }
            assert!(
                Instant::now() < deadline,
                "replicas {ids:?} did not converge within {timeout:?}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn logs(&self, ids: &[u64]) -> String {
        ids.iter()
            .map(|id| format!("--- node {id} ---\n{}", self.log(*id)))
            .collect()
    }
}

fn converged(all: &[Vec<GroupStatus>]) -> bool {
    let first = &all[0];
    all.iter().all(|groups| {
        groups.len() == first.len()
            && groups.iter().zip(first).all(|(a, b)| {
                a.group_id == b.group_id
                    && a.applied_index == b.applied_index
                    && a.state_hash == b.state_hash
            })
    })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.procs.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
    }
}

/// A node spec with the given name.
pub fn node(name: &str) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        labels: [("rack".to_string(), "r1".to_string())]
            .into_iter()
            .collect(),
        taints: Vec::new(),
        allocatable: [("cpu".to_string(), "8".to_string())].into_iter().collect(),
        unschedulable: false,
        not_ready: false,
    }
}

/// A node named `name` (hostname label), with `cpu` CPUs, 64Gi and 110 pods.
pub fn node_spec(name: &str, cpu: &str, unschedulable: bool) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        labels: [("kubernetes.io/hostname".to_string(), name.to_string())]
            .into_iter()
            .collect(),
        taints: Vec::new(),
        allocatable: [("cpu", cpu), ("memory", "64Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        unschedulable,
        not_ready: false,
    }
}

/// Registers `name` through process `via`.
pub async fn register(inv: &mut InventoryClient<Channel>, name: &str) -> Result<(), tonic::Status> {
    inv.register_node(RegisterNodeRequest {
        node: Some(node(name)),
        update: false,
    })
    .await
    .map(|_| ())
}

/// Every node name the cluster lists through `inv`.
pub async fn list_names(inv: &mut InventoryClient<Channel>) -> Vec<String> {
    let reply = inv
        .list_nodes(ListNodesRequest { shard: None })
        .await
        .expect("list nodes")
        .into_inner();
    let mut names: Vec<String> = reply
        .nodes
        .into_iter()
        .filter_map(|n| n.node.map(|s| s.name))
        .collect();
    names.sort();
    names
}

/// GET `path` from `addr` over plain HTTP/1.1; (status code, body).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// GET `path` from `addr`, answered within `timeout`; the error says which step failed
/// (for probes of a process that may still be starting).
pub async fn try_http_get(
    addr: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send request: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read answer: {e}"))?;
        Ok::<_, String>(raw)
    };
    let raw = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))??;
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Sends `method path` with extra header lines and a body to `addr`; answers the status
/// code, the header block and the body (the server closes the connection after it).
pub async fn http_call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} http://{addr}{path}: no answer within 10 s"))
        .unwrap_or_else(|e| panic!("{method} http://{addr}{path}: {e}"));
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_string(), body.to_string())
}

/// A client connected to process `id`.
pub async fn client(c: &Cluster, id: u64) -> gangway_client::Client {
    let _ = c.admin(id).await;
    gangway_client::Client::connect(&[c.procs[&id].grpc.clone()])
        .await
        .expect("client connects")
}

/// SIGKILLs the process of replicas 1–3 that leads the meta group; a client of the first
/// survivor (which may not have a leader yet: callers retry their first call).
pub async fn kill_meta_leader(c: &mut Cluster) -> gangway_client::Client {
    let meta_leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
    c.kill(meta_leader);
    let survivor = [1, 2, 3]
        .into_iter()
        .find(|i| *i != meta_leader)
        .expect("two survivors");
    client(c, survivor).await
}

/// Removes a data dir as a lost disk would.
pub fn wipe(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

/// Arms test bug switches on `gangway serve`: adds `--test-failpoints` to `args` when
/// `failpoints` names any, and answers the environment that names them.
pub fn arm_failpoints(args: &mut Vec<String>, failpoints: &[&str]) -> Vec<(String, String)> {
    if failpoints.is_empty() {
        return Vec::new();
    }
    args.push("--test-failpoints".into());
    vec![("GANGWAY_TEST_FAILPOINTS".to_string(), failpoints.join(","))]
}

/// Kubernetes objects the Kubernetes tests create (against the real API server or the
/// double).
pub mod objects {
    use serde_json::{json, Value};

    /// A Ready Node with 64 CPUs, 256Gi and 110 pods allocatable.
    pub fn node(name: &str) -> Value {
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        })
    }

    /// A pod of gangway's that requests `cpu` CPUs.
    pub fn pod_with_cpu(namespace: &str, name: &str, cpu: &str, annotations: Value) -> Value {
        json!({
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {
                "schedulerName": "gangway",
                "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": cpu}}}]
            }
        })
    }
}
