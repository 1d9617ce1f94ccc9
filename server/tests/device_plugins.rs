//! `gangway agent` with a device plugin written for the test (a real gRPC server on a
//! Unix socket, `support::device_plugin`), against three real `gangway serve`
//! processes: the plugin registers as it would with a kubelet, its devices reach the
//! ledger with their health, a device turning unhealthy evicts its holder, a plugin
//! restart replaces its registration and loses no placement, bad registrations are
//! refused as the kubelet refuses them, and the agent stops cleanly on SIGTERM.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_client::Client;
use gangway_proto::v1::NodeInfo;
use support::device_plugin::{register, TestPlugin};
use support::gangs::device_gang;
use support::{client, wait_for, Cluster};

const RESOURCE: &str = "vendor.example/gpu";
const NODE: &str = "plugin-node";

/// A `gangway agent` process, killed when dropped.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
    /// Its metrics address.
    http: String,
}

impl Agent {
    /// The agent of node [`NODE`] (8 cpu, label zone=z1) with its plugins in `dir`.
    fn start(c: &Cluster, dir: &Path) -> Agent {
        Self::start_node(c, dir, NODE, "8")
    }

    /// The agent of node `node` with `cpu` cores, its plugins and log in `dir`, its
    /// metrics on a free port.
    fn start_node(c: &Cluster, dir: &Path, node: &str, cpu: &str) -> Agent {
        let http = format!("127.0.0.1:{}", support::free_port());
        let servers: Vec<String> = c.procs.values().map(|p| p.grpc.clone()).collect();
        let log = dir.join("agent.log");
        let out = std::fs::File::create(&log).expect("agent log");
        let err = out.try_clone().expect("agent log");
        let child = Command::new(support::gangway_bin())
            .args(["agent", "--server", &servers.join(","), "--node", node])
            .args(["--cpu", cpu, "--memory", "32Gi", "--label", "zone=z1"])
            .arg("--device-plugin-dir")
            .arg(dir)
            .args(["--lease-ms", "4000", "--http", &http])
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start gangway agent");
        Agent { child, log, http }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status within 10 s.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn node(cl: &Client) -> Option<NodeInfo> {
    cl.get_node(NODE).await.ok()
}

/// (device name, unhealthy) of the node's devices, in name order.
fn health(info: &NodeInfo) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = info
        .devices
        .iter()
        .map(|d| (d.name.clone(), d.unhealthy))
        .collect();
    out.sort();
    out
}

/// The member key of a one-member group's placement.
fn member_of(s: &gangway_proto::v1::GangGroupStatus) -> String {
    let p = &s.placements[0];
    format!("{}/{}/{}", p.namespace, p.gang, p.member)
}

/// Waits until group `id` is placed and its placement shows the plugin's allocation.
async fn allocated(cl: &Client, id: u64) -> gangway_proto::v1::GangGroupStatus {
    wait_for(
        "placed with the plugin's allocation",
        Duration::from_secs(20),
        async || {
            cl.get(id)
                .await
                .ok()
                .filter(|s| s.state == "Placed" && !s.placements[0].allocations.is_empty())
        },
    )
    .await
}

/// The members the agent's checkpoint holds.
fn checkpointed(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("gangway_agent_checkpoint")).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    json["entries"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_feeds_gangway_through_the_agent() {
    let c = Cluster::start(3, 1);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    let dir = tempfile::tempdir().expect("plugin dir");
    let agent = Agent::start(&c, dir.path());

    // The agent registers the node from its flags.
    let info = wait_for("node registered", Duration::from_secs(20), async || {
        node(&cl).await
    })
    .await;
    let spec = info.node.clone().expect("spec");
    assert_eq!(spec.allocatable.get("cpu").map(String::as_str), Some("8"));
    assert_eq!(spec.labels.get("zone").map(String::as_str), Some("z1"));
    wait_for(
        "heartbeats renew the lease",
        Duration::from_secs(10),
        async || node(&cl).await.filter(|i| i.lease_until_ms > 0),
    )
    .await;

    // Registrations the kubelet would refuse are refused, naming the field.
    let bad = register(dir.path(), "bad.sock", "gpu")
        .await
        .expect_err("no domain");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().starts_with("resource_name:"), "{bad:?}");
    let absent = register(dir.path(), "absent.sock", RESOURCE)
        .await
        .expect_err("nothing serves the endpoint");
    assert_eq!(absent.code(), tonic::Code::Unavailable, "{absent:?}");

    // A plugin with four devices, one unhealthy.
    let plugin = TestPlugin::start(
        dir.path(),
        "vendor.sock",
        RESOURCE,
        &[
            ("DEV-0", true),
            ("DEV-1", true),
            ("DEV-2", true),
            ("DEV-3", false),
        ],
    )
    .await;
    let expected = [
        ("dev-0".to_string(), false),
        ("dev-1".to_string(), false),
        ("dev-2".to_string(), false),
        ("dev-3".to_string(), true),
    ];
    wait_for(
        "devices reported with their health",
        Duration::from_secs(20),
        async || {
            node(&cl)
                .await
                .filter(|i| i.agent == "Connected" && health(i) == expected)
        },
    )
    .await;
    let listed = Command::new(support::gangctl_bin())
        .args(["-s", &c.procs[&1].grpc, "nodes"])
        .output()
        .expect("run gangctl nodes");
    let table = String::from_utf8_lossy(&listed.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with(NODE))
        .unwrap_or_else(|| panic!("{NODE} not in gangctl nodes:\n{table}"));
    assert!(
        row.contains("0/3/4"),
        "held/usable/total devices in gangctl nodes: {row}"
    );

    // A gang takes one healthy device: Allocate is called with exactly that device,
    // and its answer reaches the placement status and the checkpoint.
    let one = cl
        .submit(device_gang("one", RESOURCE, 1))
        .await
        .expect("submit");
    let one = allocated(&cl, one.id).await;
    let device = one.placements[0].devices[0].device.clone();
    let id = device.to_uppercase();
    let a = &one.placements[0].allocations[0];
    assert_eq!(
        (a.resource.as_str(), a.device_ids.clone()),
        (RESOURCE, vec![id.clone()])
    );
    assert_eq!(a.envs.get("TEST_DEVICES"), Some(&id), "{a:?}");
    assert_eq!(
        *plugin.allocations.lock().expect("lock"),
        [vec![id.clone()]]
    );
    assert_eq!(checkpointed(dir.path()), [member_of(&one)]);
    let (code, body) = support::http_get(&agent.http, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains(&format!(
            "gangway_agent_allocations_total{{resource=\"{RESOURCE}\"}} 1"
        )),
        "{body}"
    );

    // The device fails under its pod: the holder is named for eviction.
    let mut list: Vec<(&str, bool)> = vec![
        ("DEV-0", true),
        ("DEV-1", true),
        ("DEV-2", true),
        ("DEV-3", true),
    ];
    for d in &mut list {
        if d.0 == id {
            d.1 = false;
        }
    }
    plugin.set(&list);
    wait_for(
        "the failed device unhealthy",
        Duration::from_secs(20),
        async || {
            node(&cl)
                .await
                .filter(|i| health(i).iter().any(|(n, bad)| *n == device && *bad))
        },
    )
    .await;
    let holder = member_of(&one);
    wait_for(
        "the holder named for eviction",
        Duration::from_secs(10),
        async || {
            let log = agent.log();
            log.lines()
                .any(|l| l.contains("evicted") && l.contains(&holder))
                .then_some(())
        },
    )
    .await;
    let (_, body) = support::http_get(&agent.http, "/metrics").await;
    assert!(
        body.contains(&format!(
            "gangway_agent_evictions_total{{resource=\"{RESOURCE}\"}} 1"
        )),
        "{body}"
    );

    // The plugin restarts: it registers again, the agent replaces the link, the
    // devices stay published, and nothing placed is allocated again or lost.
    plugin.stop().await;
    let plugin = TestPlugin::start(
        dir.path(),
        "vendor.sock",
        RESOURCE,
        &[
            ("DEV-0", true),
            ("DEV-1", true),
            ("DEV-2", true),
            ("DEV-3", true),
        ],
    )
    .await;
    wait_for(
        "healthy again after the restart",
        Duration::from_secs(20),
        async || {
            node(&cl).await.filter(|i| {
                i.agent == "Connected"
                    && i.devices.len() == 4
                    && health(i).iter().all(|(_, bad)| !bad)
            })
        },
    )
    .await;
    let two = cl
        .submit(device_gang("two", RESOURCE, 1))
        .await
        .expect("submit");
    let two = allocated(&cl, two.id).await;
    let two_id = two.placements[0].allocations[0].device_ids.clone();
    assert_eq!(
        *plugin.allocations.lock().expect("lock"),
        [two_id.clone()],
        "the restarted plugin allocates only the new member"
    );

    // The agent restarts (SIGKILL): its checkpoint keeps both allocations, so the
    // plugin, registering again with the new agent, allocates nothing twice.
    drop(agent);
    let mut agent = Agent::start(&c, dir.path());
    register(dir.path(), "vendor.sock", RESOURCE)
        .await
        .expect("the plugin registers with the restarted agent");
    let three = cl
        .submit(device_gang("three", RESOURCE, 1))
        .await
        .expect("submit");
    let three = allocated(&cl, three.id).await;
    let three_id = three.placements[0].allocations[0].device_ids.clone();
    assert_eq!(
        *plugin.allocations.lock().expect("lock"),
        [two_id, three_id]
    );
    let mut members = checkpointed(dir.path());
    members.sort();
    let mut expected = vec![member_of(&one), member_of(&two), member_of(&three)];
    expected.sort();
    assert_eq!(members, expected);

    // A released member's devices are freed on the node and leave the checkpoint.
    cl.release(one.id).await.expect("release");
    wait_for(
        "the released member's allocation collected",
        Duration::from_secs(20),
        async || (!checkpointed(dir.path()).contains(&member_of(&one))).then_some(()),
    )
    .await;
    let info = node(&cl).await.expect("node");
    assert!(
        info.devices
            .iter()
            .filter(|d| d.name == device)
            .all(|d| d.held_by.is_empty()),
        "{info:?}"
    );

    // A report for a member not placed on the node is refused, naming why.
    let wrong = cl
        .report_allocation(
            "other-node",
            &member_of(&two),
            gangway_proto::v1::NodeAllocation {
                resource: RESOURCE.into(),
                device_ids: vec!["DEV-0".into()],
                ..Default::default()
            },
        )
        .await
        .expect_err("placed elsewhere");
    assert!(wrong.to_string().contains("is placed on node"), "{wrong}");
    let stranger = cl
        .report_allocation(
            NODE,
            &member_of(&two),
            gangway_proto::v1::NodeAllocation {
                resource: RESOURCE.into(),
                device_ids: vec!["NOT-ITS-DEVICE".into()],
                ..Default::default()
            },
        )
        .await
        .expect_err("devices gangway did not give it");
    assert!(
        stranger.to_string().contains("NOT-ITS-DEVICE is not among"),
        "{stranger}"
    );

    // SIGTERM: the agent stops, removing its registration socket.
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(!dir.path().join("kubelet.sock").exists(), "{}", agent.log());
    plugin.stop().await;
}

/// Three replicas and four agents, each with its own plugin of two devices: gangs
/// are placed and released while one plugin restarts, and then while the replica the
/// agents reached first is killed. Every placed member's devices
/// are allocated by its node's plugin with exactly the devices gangway chose and
/// reported in its status; each node's checkpoint holds exactly its placed members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_agents_allocate_what_gangway_places_while_a_plugin_restarts() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 2).await;
    let mut dirs = Vec::new();
    let mut agents = Vec::new();
    let mut plugins = Vec::new();
    for i in 0..4 {
        let dir = tempfile::tempdir().expect("dir");
        agents.push(Agent::start_node(&c, dir.path(), &format!("node-{i}"), "4"));
        let plugin = TestPlugin::start(
            dir.path(),
            "vendor.sock",
            RESOURCE,
            &[(&format!("N{i}-A"), true), (&format!("N{i}-B"), true)],
        )
        .await;
        plugins.push(plugin);
        dirs.push(dir);
    }
    wait_for(
        "eight devices on four nodes",
        Duration::from_secs(30),
        async || {
            let nodes = cl.list_nodes(None).await.ok()?;
            let devices: usize = nodes.iter().map(|n| n.devices.len()).sum();
            (devices == 8 && nodes.iter().all(|n| n.agent == "Connected")).then_some(())
        },
    )
    .await;

    let mut live: Vec<u64> = Vec::new();
    let mut every_allocation: Vec<(String, Vec<String>)> = Vec::new();
    for round in 0..6u32 {
        if round == 4 {
            // The replica the agents reach first dies: they move to the next.
            c.kill(1);
            c.wait_ready(&[2, 3], Duration::from_secs(30)).await;
        }
        if round == 2 {
            // Node 1's plugin restarts while groups are placed and come and go.
            let old = plugins.remove(1);
            old.stop().await;
            plugins.insert(
                1,
                TestPlugin::start(
                    dirs[1].path(),
                    "vendor.sock",
                    RESOURCE,
                    &[("N1-A", true), ("N1-B", true)],
                )
                .await,
            );
        }
        let g = cl
            .submit(device_gang(&format!("g{round}"), RESOURCE, 2))
            .await
            .expect("submit");
        let s = wait_for(
            "both members allocated",
            Duration::from_secs(30),
            async || {
                cl.get(g.id).await.ok().filter(|s| {
                    s.state == "Placed"
                        && s.placements.len() == 2
                        && s.placements.iter().all(|p| !p.allocations.is_empty())
                })
            },
        )
        .await;
        for p in &s.placements {
            let chosen: Vec<String> = p.devices.iter().map(|d| d.device.to_uppercase()).collect();
            assert_eq!(p.allocations[0].device_ids, chosen, "{p:?}");
            every_allocation.push((p.node.clone(), chosen));
        }
        live.push(g.id);
        if live.len() > 2 {
            let gone = live.remove(0);
            cl.release(gone).await.expect("release");
        }
    }
    // Each node's checkpoint holds exactly the members placed there now.
    wait_for(
        "checkpoints match the placements",
        Duration::from_secs(20),
        async || {
            let mut expected: Vec<Vec<String>> = vec![Vec::new(); 4];
            for id in &live {
                let s = cl.get(*id).await.ok()?;
                for p in &s.placements {
                    let i: usize = p.node.strip_prefix("node-")?.parse().ok()?;
                    expected[i].push(format!("{}/{}/{}", p.namespace, p.gang, p.member));
                }
            }
            for e in &mut expected {
                e.sort();
            }
            let actual: Vec<Vec<String>> = dirs
                .iter()
                .map(|d| {
                    let mut m = checkpointed(d.path());
                    m.sort();
                    m
                })
                .collect();
            (actual == expected).then_some(())
        },
    )
    .await;
    // Every Allocate a plugin (still running) saw was for devices of its own node
    // that gangway chose.
    for (i, plugin) in plugins.iter().enumerate() {
        let node = format!("node-{i}");
        for ids in plugin.allocations.lock().expect("lock").iter() {
            assert!(
                every_allocation
                    .iter()
                    .any(|(n, chosen)| *n == node && chosen == ids),
                "node {node}'s plugin allocated {ids:?}, which gangway did not choose there"
            );
        }
    }
    for a in &mut agents {
        assert!(a.terminate().success(), "{}", a.log());
    }
    for p in plugins {
        p.stop().await;
    }
}

/// With bearer tokens on, the agent sends its token (`--token`, or `GANGWAY_TOKEN`) on
/// every call; a wrong one stops it at start with gangway's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_sends_its_token_and_a_wrong_one_stops_it_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "agent-token\n").expect("tokens");
    let c = Cluster::start_with(
        3,
        1,
        vec!["--auth-tokens-file".into(), tokens.display().to_string()],
        Vec::new(),
    );
    let servers: Vec<String> = c.procs.values().map(|p| p.grpc.clone()).collect();
    let agent = |token: &str, plugins: &Path| {
        Command::new(support::gangway_bin())
            .args([
                "agent",
                "--server",
                &servers.join(","),
                "--node",
                "secure-node",
            ])
            .args(["--cpu", "2", "--memory", "4Gi"])
            .arg("--device-plugin-dir")
            .arg(plugins)
            .env("GANGWAY_TOKEN", token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent")
    };
    let wrong_dir = dir.path().join("wrong");
    let wrong = agent("not-the-token", &wrong_dir);
    let out = tokio::task::spawn_blocking(move || wrong.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gangway refused node secure-node"), "{err}");

    let good_dir = dir.path().join("good");
    let mut good = Agent {
        child: agent("agent-token", &good_dir),
        log: good_dir.join("none"),
        http: String::new(),
    };
    let cl = gangway_client::Client::connect_with(
        &servers,
        gangway_client::Credentials {
            tls: None,
            token: Some("agent-token".into()),
        },
    )
    .await
    .expect("connect");
    wait_for(
        "the node registered with the token",
        Duration::from_secs(30),
        async || {
            cl.get_node("secure-node")
                .await
                .ok()
                .filter(|i| i.lease_until_ms > 0)
        },
    )
    .await;
    assert!(good.terminate().success());
}

/// An agent that cannot reach gangway yet still stops at once on SIGTERM, removing its
/// registration socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_waiting_for_gangway_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let nowhere = format!("127.0.0.1:{}", support::free_port());
    let mut agent = Agent {
        child: Command::new(support::gangway_bin())
            .args(["agent", "--server", &nowhere, "--node", "lonely"])
            .args(["--cpu", "1", "--memory", "1Gi"])
            .arg("--device-plugin-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent"),
        log: dir.path().join("none"),
        http: String::new(),
    };
    let socket = dir.path().join("kubelet.sock");
    wait_for(
        "the registration socket",
        Duration::from_secs(10),
        async || socket.exists().then_some(()),
    )
    .await;
    let status = agent.terminate();
    assert_eq!(status.code(), Some(1), "{status:?}");
    let mut err = String::new();
    if let Some(mut pipe) = agent.child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut err);
    }
    assert!(
        err.contains("stopped before gangway took node lonely"),
        "{err}"
    );
    assert!(!socket.exists(), "the socket was left behind");
}
