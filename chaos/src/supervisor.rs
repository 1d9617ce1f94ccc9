//! The processes of one drill: N `gangway serve` replicas on 127.0.0.1, each
//! with its own ports, data dir and log, and a [`LinkProxy`] for every ordered
//! pair of replicas (every peer call goes through one).
//!
//! Invariants: the supervisor signals only the processes it started (it keeps
//! their `Child` handles and pids), and every one of them is gone when it is
//! dropped, on every exit path: normal return, error, panic (a panic hook
//! kills the registered pids) and Ctrl-C (the runner drops it). Children also
//! get SIGKILL from the kernel if the supervisor itself dies (PR_SET_PDEATHSIG).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::{StatusReply, StatusRequest};
use tonic::transport::Endpoint;

use crate::proxy::{LinkMode, LinkProxy};

/// Time for a replica to answer a status call.
pub const STATUS_TIMEOUT_MS: u64 = 500;
/// Time for a graceful stop (SIGTERM) before SIGKILL.
pub const STOP_TIMEOUT_MS: u64 = 10_000;

/// Pids of every live child of this process, for the panic hook. A registry
/// rather than a handle because a panic hook cannot reach the supervisor.
static CHILDREN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Installs (once) a panic hook that SIGKILLs every registered child first.
pub fn install_panic_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            kill_registered();
            previous(info);
        }));
    });
}

/// SIGKILLs every registered child (for abnormal exits).
pub fn kill_registered() {
    let pids: Vec<i32> = CHILDREN
        .lock()
        .map(|set| set.iter().copied().collect())
        .unwrap_or_default();
    for pid in pids {
        // SAFETY: kill(2) with a pid this process spawned and has not reaped.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

fn register(pid: i32) {
    if let Ok(mut set) = CHILDREN.lock() {
        set.insert(pid);
    }
}

fn unregister(pid: i32) {
    if let Ok(mut set) = CHILDREN.lock() {
        set.remove(&pid);
    }
}

/// Why a drill could not start or a replica misbehaved.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The gangway binary cannot be run.
    #[error("gangway binary {path}: {reason}")]
    Binary {
        /// The path tried.
        path: String,
        /// Why it cannot be run.
        reason: String,
    },
    /// The work dir or a data dir cannot be written.
    #[error("data dir {path} is not writable: {reason}")]
    DataDir {
        /// The directory.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// A port the drill needs is in use.
    #[error("port {port} ({what}) is already in use")]
    PortTaken {
        /// The port.
        port: u16,
        /// What it was for.
        what: String,
    },
    /// A replica exited while starting.
    #[error("replica {id} exited while starting ({status}): {last_line}")]
    Exited {
        /// The replica.
        id: u64,
        /// Its exit status.
        status: String,
        /// The last line of its log.
        last_line: String,
    },
    /// The cluster did not elect leaders in time.
    #[error("cluster not ready within {ms} ms: {detail}")]
    NotReady {
        /// The bound.
        ms: u64,
        /// What was missing.
        detail: String,
    },
    /// An OS call failed.
    #[error("{what}: {reason}")]
    Os {
        /// What was attempted.
        what: String,
        /// The OS error.
        reason: String,
    },
}

/// How to start the replicas of a drill.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `gangway` binary.
    pub bin: PathBuf,
    /// Replicas (ids 1..=replicas).
    pub replicas: u64,
    /// Shard groups.
    pub shards: u32,
    /// Work dir: data dirs, logs and failpoint markers go here.
    pub dir: PathBuf,
    /// First of 2 × replicas consecutive ports (gRPC, HTTP per replica); None picks free ones.
    pub base_port: Option<u16>,
    /// Crash points and bug switches armed in every replica (GANGWAY_TEST_FAILPOINTS).
    pub failpoints: Vec<String>,
    /// Cluster id.
    pub cluster_id: String,
    /// More flags for every replica (e.g. --kubeconfig).
    pub extra_args: Vec<String>,
}

/// One replica process.
#[derive(Debug)]
pub struct Replica {
    /// Node id.
    pub id: u64,
    /// Its gRPC address (clients dial it directly; peers through proxies).
    pub grpc: SocketAddr,
    /// Its HTTP address (metrics, health).
    pub http: SocketAddr,
    /// Data dir.
    pub data: PathBuf,
    /// Log file (stdout and stderr, appended across restarts).
    pub log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl Replica {
    /// Whether the process runs (it may be paused).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether it is stopped by SIGSTOP.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// The last non-empty line of its log.
    pub fn last_log_line(&self) -> String {
        last_line(&self.log)
    }
}

fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(empty log)")
        .to_string()
}

/// The replicas and link proxies of one drill.
pub struct Supervisor {
    spec: ClusterSpec,
    replicas: BTreeMap<u64, Replica>,
    links: BTreeMap<(u64, u64), LinkProxy>,
    markers: PathBuf,
}

/// A replica that exited without being told to.
#[derive(Debug, Clone)]
pub struct Exit {
    /// The replica.
    pub id: u64,
    /// Its exit status.
    pub status: String,
    /// The crash point that fired, if its log names one.
    pub failpoint: Option<String>,
    /// The last line of its log.
    pub last_line: String,
}

impl Supervisor {
    /// Checks the binary, dirs and ports, starts the proxies and every replica.
    pub async fn start(spec: ClusterSpec) -> Result<Self, SupervisorError> {
        install_panic_cleanup();
        check_binary(&spec.bin)?;
        let markers = spec.dir.join("failpoints");
        create_dir(&spec.dir)?;
        create_dir(&markers)?;
        write_peer_secret(&spec.dir)?;
        let ports = pick_ports(&spec)?;
        let mut replicas = BTreeMap::new();
        for id in 1..=spec.replicas {
            let (grpc, http) = ports[(id - 1) as usize];
            let data = spec.dir.join(format!("node-{id}"));
            create_dir(&data)?;
            replicas.insert(
                id,
                Replica {
                    id,
                    grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
                    http: SocketAddr::from(([127, 0, 0, 1], http)),
                    data,
                    log: spec.dir.join(format!("node-{id}.log")),
                    child: None,
                    paused: false,
                },
            );
        }
        let mut links = BTreeMap::new();
        for from in replicas.keys() {
            for (to, r) in &replicas {
                if from != to {
                    let proxy = LinkProxy::start(r.grpc)
                        .await
                        .map_err(|e| os("start a link proxy", e))?;
                    links.insert((*from, *to), proxy);
                }
            }
        }
        let mut sup = Self {
            spec,
            replicas,
            links,
            markers,
        };
        let ids: Vec<u64> = sup.replicas.keys().copied().collect();
        for id in &ids {
            sup.spawn(*id)?;
        }
        Ok(sup)
    }

    /// Every replica id.
    pub fn ids(&self) -> Vec<u64> {
        self.replicas.keys().copied().collect()
    }

    /// A replica.
    pub fn replica(&self, id: u64) -> Option<&Replica> {
        self.replicas.get(&id)
    }

    /// Every replica's gRPC address, for clients.
    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.values().map(|r| r.grpc.to_string()).collect()
    }

    /// The work dir.
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }

    fn command(&self, id: u64) -> Command {
        let r = &self.replicas[&id];
        let mut cmd = Command::new(&self.spec.bin);
        cmd.arg("serve")
            .args(["--id", &id.to_string()])
            .args(["--listen", &r.grpc.to_string()])
            .args(["--advertise", &r.grpc.to_string()])
            .args(["--http", &r.http.to_string()])
            .args(["--cluster-id", &self.spec.cluster_id])
            .args(["--shards", &self.spec.shards.to_string()])
            .arg("--data")
            .arg(&r.data)
            .arg("--peer-secret-file")
            .arg(peer_secret_path(&self.spec.dir))
            .arg("--test-failpoints")
            .args(["--initial-cluster-state", "new"]);
        for (peer, p) in &self.replicas {
            if *peer == id {
                continue;
            }
            cmd.args(["--peer", &format!("{peer}={}", p.grpc)]);
            if let Some(link) = self.links.get(&(id, *peer)) {
                cmd.args(["--test-peer-route", &format!("{}={}", p.grpc, link.addr())]);
            }
        }
        cmd.args(&self.spec.extra_args);
        cmd.env("GANGWAY_TEST_FAILPOINTS", self.spec.failpoints.join(","))
            .env("GANGWAY_TEST_FAILPOINT_DIR", &self.markers)
            .env(
                "RUST_LOG",
                std::env::var("GANGWAY_CHAOS_RUST_LOG")
                    .unwrap_or_else(|_| "info,openraft=error".into()),
            );
        // SAFETY: prctl in the child between fork and exec touches no shared state.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd
    }

    /// Starts replica `id` (not running).
    pub fn spawn(&mut self, id: u64) -> Result<(), SupervisorError> {
        let r = &self.replicas[&id];
        if r.child.is_some() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .map_err(|e| data_dir_err(&r.log, e))?;
        let err = log.try_clone().map_err(|e| os("clone a log handle", e))?;
        let child = self
            .command(id)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| SupervisorError::Binary {
                path: self.spec.bin.display().to_string(),
                reason: e.to_string(),
            })?;
        register(child.id() as i32);
        let r = self.replicas.get_mut(&id).ok_or_else(|| unknown(id))?;
        r.child = Some(child);
        r.paused = false;
        Ok(())
    }

    /// SIGKILLs replica `id` and reaps it.
    pub fn kill(&mut self, id: u64) {
        if let Some(r) = self.replicas.get_mut(&id) {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                unregister(child.id() as i32);
            }
            r.paused = false;
        }
    }

    /// SIGTERMs replica `id` and waits for it to exit (SIGKILL after [`STOP_TIMEOUT_MS`]).
    pub async fn stop(&mut self, id: u64) {
        let Some(r) = self.replicas.get_mut(&id) else {
            return;
        };
        if r.paused {
            signal(r, libc::SIGCONT);
            r.paused = false;
        }
        let Some(child) = r.child.as_mut() else {
            return;
        };
        let pid = child.id() as i32;
        // SAFETY: kill(2) on our own unreaped child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_millis(STOP_TIMEOUT_MS);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill(id);
    }

    /// SIGSTOPs replica `id`: its peers see silence.
    pub fn pause(&mut self, id: u64) {
        if let Some(r) = self.replicas.get_mut(&id) {
            if r.child.is_some() && !r.paused {
                signal(r, libc::SIGSTOP);
                r.paused = true;
            }
        }
    }

    /// SIGCONTs replica `id`.
    pub fn resume(&mut self, id: u64) {
        if let Some(r) = self.replicas.get_mut(&id) {
            if r.paused {
                signal(r, libc::SIGCONT);
                r.paused = false;
            }
        }
    }

    /// Sets the link `from` → `to` (calls `from` makes to `to`).
    pub fn set_link(&self, from: u64, to: u64, mode: LinkMode) {
        if let Some(link) = self.links.get(&(from, to)) {
            link.set(mode);
        }
    }

    /// Cuts every link between the two sides (both directions).
    pub fn partition(&self, side_a: &[u64], side_b: &[u64]) {
        for a in side_a {
            for b in side_b {
                self.set_link(*a, *b, LinkMode::Cut);
                self.set_link(*b, *a, LinkMode::Cut);
            }
        }
    }

    /// Every link passes at once again.
    pub fn heal_links(&self) {
        for link in self.links.values() {
            link.set(LinkMode::Pass);
        }
    }

    /// Whether any link is cut or delayed.
    pub fn links_disturbed(&self) -> bool {
        self.links.values().any(|l| l.mode() != LinkMode::Pass)
    }

    /// Arms crash point `name` for one firing (its marker file is removed).
    pub fn arm(&self, name: &str) {
        let _ = std::fs::remove_file(self.markers.join(name));
    }

    /// Disarms crash point `name` (its marker file exists); true if it had not fired.
    pub fn disarm(&self, name: &str) -> bool {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.markers.join(name))
            .is_ok()
    }

    /// Replicas that exited on their own since the last call (they are reaped).
    pub fn exits(&mut self) -> Vec<Exit> {
        let mut out = Vec::new();
        for r in self.replicas.values_mut() {
            let Some(child) = r.child.as_mut() else {
                continue;
            };
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                _ => continue,
            };
            unregister(child.id() as i32);
            r.child = None;
            r.paused = false;
            let log = std::fs::read_to_string(&r.log).unwrap_or_default();
            let failpoint = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("gangway: failpoint "))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            out.push(Exit {
                id: r.id,
                status: describe(status),
                failpoint,
                last_line: last_line(&r.log),
            });
        }
        out
    }

    /// Status of replica `id`, if it answers within [`STATUS_TIMEOUT_MS`].
    pub async fn status(&self, id: u64, with_hash: bool) -> Option<StatusReply> {
        let r = self.replicas.get(&id)?;
        if r.child.is_none() || r.paused {
            return None;
        }
        status_of(r.grpc, with_hash).await
    }

    /// The leader of `group` as the running replicas report it (majority view).
    pub async fn leader_of(&self, group: u64) -> Option<u64> {
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for id in self.ids() {
            if let Some(s) = self.status(id, false).await {
                if let Some(g) = s.groups.iter().find(|g| g.group_id == group) {
                    if g.leader != 0 {
                        *votes.entry(g.leader).or_default() += 1;
                    }
                }
            }
        }
        votes.into_iter().max_by_key(|(_, n)| *n).map(|(id, _)| id)
    }

    /// Groups replica `id` leads, by its own report.
    pub async fn groups_led_by(&self, id: u64) -> Vec<u64> {
        match self.status(id, false).await {
            Some(s) => s
                .groups
                .iter()
                .filter(|g| g.role == "leader")
                .map(|g| g.group_id)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Waits until every running replica answers and knows a live leader for every group.
    pub async fn wait_ready(&mut self, timeout_ms: u64) -> Result<(), SupervisorError> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            if let Some(exit) = self.exits().into_iter().next() {
                return Err(SupervisorError::Exited {
                    id: exit.id,
                    status: exit.status,
                    last_line: exit.last_line,
                });
            }
            let missing = self.not_ready().await;
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SupervisorError::NotReady {
                    ms: timeout_ms,
                    detail: missing.join("; "),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn not_ready(&self) -> Vec<String> {
        let live: Vec<u64> = self
            .replicas
            .values()
            .filter(|r| r.running() && !r.paused)
            .map(|r| r.id)
            .collect();
        let mut missing = Vec::new();
        for id in &live {
            match self.status(*id, false).await {
                None => missing.push(format!("replica {id} does not answer")),
                Some(s) => {
                    for g in &s.groups {
                        if !live.contains(&g.leader) {
                            missing.push(format!(
                                "replica {id} knows no live leader of group {}",
                                g.group_id
                            ));
                        }
                    }
                }
            }
        }
        missing
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        for id in self.ids() {
            self.kill(id);
        }
    }
}

/// Status of the replica at `addr`, bounded by [`STATUS_TIMEOUT_MS`].
pub async fn status_of(addr: SocketAddr, with_hash: bool) -> Option<StatusReply> {
    let bound = Duration::from_millis(if with_hash { 5_000 } else { STATUS_TIMEOUT_MS });
    let call = async {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect_timeout(bound)
            .timeout(bound)
            .connect()
            .await
            .ok()?;
        AdminClient::new(ch)
            .status(StatusRequest {
                include_state_hash: with_hash,
            })
            .await
            .ok()
            .map(|r| r.into_inner())
    };
    tokio::time::timeout(bound, call).await.ok().flatten()
}

fn signal(r: &Replica, sig: i32) {
    if let Some(child) = &r.child {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}

fn unknown(id: u64) -> SupervisorError {
    SupervisorError::Os {
        what: format!("replica {id}"),
        reason: "not part of this drill".into(),
    }
}

fn os(what: &str, e: std::io::Error) -> SupervisorError {
    SupervisorError::Os {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

fn data_dir_err(path: &Path, e: std::io::Error) -> SupervisorError {
    SupervisorError::DataDir {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Creates `dir` and proves it writable.
/// Where the drill's replicas find their peer secret.
pub fn peer_secret_path(dir: &Path) -> PathBuf {
    dir.join("peer-secret")
}

/// Writes the replicas' peer secret (unique per drill; drills run on one machine, so
/// it need not be secret from it).
fn write_peer_secret(dir: &Path) -> Result<(), SupervisorError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let path = peer_secret_path(dir);
    std::fs::write(
        &path,
        format!("drill-peer-secret-{}-{nanos}\n", std::process::id()),
    )
    .map_err(|e| data_dir_err(&path, e))
}

fn create_dir(dir: &Path) -> Result<(), SupervisorError> {
    std::fs::create_dir_all(dir).map_err(|e| data_dir_err(dir, e))?;
    let probe = dir.join(".gangway-chaos-probe");
    std::fs::write(&probe, b"probe").map_err(|e| data_dir_err(dir, e))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

fn check_binary(bin: &Path) -> Result<(), SupervisorError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |reason: &str| SupervisorError::Binary {
        path: bin.display().to_string(),
        reason: reason.to_string(),
    };
    let meta = std::fs::metadata(bin).map_err(|e| err(&e.to_string()))?;
    if !meta.is_file() {
        return Err(err("not a file"));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(err("not executable"));
    }
    Ok(())
}

/// Picks (gRPC, HTTP) ports per replica and checks each is free now.
fn pick_ports(spec: &ClusterSpec) -> Result<Vec<(u16, u16)>, SupervisorError> {
    let mut out = Vec::new();
    for i in 0..spec.replicas {
        let pair = match spec.base_port {
            Some(base) => {
                let grpc = u64::from(base) + 2 * i;
                let http = grpc + 1;
                let (Ok(grpc), Ok(http)) = (u16::try_from(grpc), u16::try_from(http)) else {
                    return Err(SupervisorError::Os {
                        what: "--base-port".into(),
                        reason: format!("{base} leaves no room for {} replicas", spec.replicas),
                    });
                };
                (grpc, http)
            }
            None => (free_port()?, free_port()?),
        };
        for (port, what) in [(pair.0, "gRPC"), (pair.1, "HTTP")] {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                return Err(SupervisorError::PortTaken {
                    port,
                    what: format!("{what} of replica {}", i + 1),
                });
            }
        }
        out.push(pair);
    }
    Ok(out)
}

fn free_port() -> Result<u16, SupervisorError> {
    gangway_client::loopback::free_port().map_err(|e| os("find a free loopback port", e))
}
