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
use gangway_proto::v1::{GangSpec, MemberSpec, NodeInfo, SubmitGangGroupRequest};
use support::device_plugin::{register, TestPlugin};
use support::{client, Cluster};

const RESOURCE: &str = "vendor.example/gpu";
const NODE: &str = "plugin-node";

/// A `gangway agent` process, killed when dropped.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(c: &Cluster, dir: &Path) -> Agent {
        let servers: Vec<String> = c.procs.values().map(|p| p.grpc.clone()).collect();
        let log = dir.join("agent.log");
        let out = std::fs::File::create(&log).expect("agent log");
        let err = out.try_clone().expect("agent log");
        let child = Command::new(support::gangway_bin())
            .args(["agent", "--server", &servers.join(","), "--node", NODE])
            .args(["--cpu", "8", "--memory", "32Gi", "--label", "zone=z1"])
            .arg("--device-plugin-dir")
            .arg(dir)
            .args(["--lease-ms", "4000"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start gangway agent");
        Agent { child, log }
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

async fn wait_for<T>(
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

fn gpu_gang(key: &str) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        queue: String::new(),
        idempotency_key: key.into(),
        name: key.into(),
        gangs: vec![GangSpec {
            name: key.into(),
            namespace: "ml".into(),
            min_member: 1,
            total_number: 1,
            mode: "Strict".into(),
            wait_time_ms: 0,
            priority: 0,
            members: vec![MemberSpec {
                name: "worker".into(),
                count: 1,
                pod_json: format!(r#"{{"requests": {{"cpu": "1", "{RESOURCE}": "1"}}}}"#),
            }],
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_feeds_gangway_through_the_agent() {
    let c = Cluster::start(3, 1);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    let dir = tempfile::tempdir().expect("plugin dir");
    let mut agent = Agent::start(&c, dir.path());

    // The agent registers the node from its flags.
    let info = wait_for("node registered", Duration::from_secs(20), async || {
        node(&cl).await
    })
    .await;
    let spec = info.node.clone().expect("spec");
    assert_eq!(spec.allocatable.get("cpu").map(String::as_str), Some("8"));
    assert_eq!(spec.labels.get("zone").map(String::as_str), Some("z1"));
    assert!(
        info.lease_until_ms > 0,
        "heartbeats renew the lease: {info:?}"
    );

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
    let info = wait_for("devices reported", Duration::from_secs(20), async || {
        node(&cl)
            .await
            .filter(|i| i.devices.len() == 4 && i.agent == "Connected")
    })
    .await;
    assert_eq!(
        health(&info),
        [
            ("dev-0".to_string(), false),
            ("dev-1".to_string(), false),
            ("dev-2".to_string(), false),
            ("dev-3".to_string(), true)
        ]
    );

    // A gang takes one healthy device; the device failing under it evicts it.
    let g = cl.submit(gpu_gang("one")).await.expect("submit");
    let placed = wait_for("placed", Duration::from_secs(20), async || {
        cl.get(g.id).await.ok().filter(|s| s.state == "Placed")
    })
    .await;
    let device = placed.placements[0].devices[0].device.clone();
    let id = device.to_uppercase();
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
    let p = &placed.placements[0];
    let holder = format!("{}/{}/{}", p.namespace, p.gang, p.member);
    wait_for(
        "the holder named for eviction",
        Duration::from_secs(10),
        async || {
            let log = agent.log();
            (log.contains("evicted") && log.contains(&holder)).then_some(())
        },
    )
    .await;

    // The plugin restarts: it registers again, the agent replaces the link, and the
    // devices stay published; nothing placed is lost.
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
                    && health(i).iter().all(|(_, bad)| !bad)
                    && i.devices.len() == 4
            })
        },
    )
    .await;
    let again = cl.submit(gpu_gang("two")).await.expect("submit");
    wait_for(
        "placed after the restart",
        Duration::from_secs(20),
        async || cl.get(again.id).await.ok().filter(|s| s.state == "Placed"),
    )
    .await;

    // SIGTERM: the agent stops, removing its registration socket.
    let status = agent.terminate();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(!dir.path().join("kubelet.sock").exists(), "{}", agent.log());
    plugin.stop().await;
}
