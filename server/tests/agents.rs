//! Node agents outside Kubernetes, against real `gangway serve` processes: a device
//! stream in the device plugin's ListAndWatch style feeds the device ledger (pool,
//! health, agent link) and its healthy devices serve `nvidia.com/gpu` to gangs;
//! heartbeats renew a node lease whose lapse makes the node not ready.

mod support;

use std::time::Duration;

use gangway_client::Client;
use gangway_proto::v1::{
    DeviceHealth, DeviceListAck, DeviceListReport, GangGroupStatus, GangSpec, MemberSpec, NodeInfo,
    NodeSpec, PluginDevice, SubmitGangGroupRequest,
};
use support::gangs::device_gang;
use support::{client, wait_for, Cluster};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const GPU: &str = "nvidia.com/gpu";

fn node_spec(name: &str, gpus_listed: bool) -> NodeSpec {
    // A node that lists the GPUs is only there to be refused a stream: it takes no pods.
    let mut spec = support::node_spec(name, "16", gpus_listed);
    if gpus_listed {
        spec.allocatable.insert(GPU.to_string(), "4".to_string());
    }
    spec
}

fn report(node: &str, devices: &[(&str, DeviceHealth)]) -> DeviceListReport {
    DeviceListReport {
        node: node.into(),
        resource_name: GPU.into(),
        devices: devices
            .iter()
            .map(|(id, health)| PluginDevice {
                id: (*id).into(),
                health: *health as i32,
                numa_nodes: vec![0],
            })
            .collect(),
    }
}

/// A device stream: the sender of reports and the stream of acks.
struct Agent {
    reports: mpsc::Sender<DeviceListReport>,
    acks: tonic::Streaming<DeviceListAck>,
}

impl Agent {
    async fn open(c: &Client) -> Agent {
        let (reports, rx) = mpsc::channel(4);
        let acks = c
            .device_stream(ReceiverStream::new(rx))
            .await
            .expect("open device stream");
        Agent { reports, acks }
    }

    async fn send(&mut self, r: DeviceListReport) -> Result<DeviceListAck, tonic::Status> {
        self.reports.send(r).await.expect("stream open");
        let next = tokio::time::timeout(Duration::from_secs(10), self.acks.message())
            .await
            .expect("an ack within 10 s");
        match next {
            Ok(Some(ack)) => Ok(ack),
            Ok(None) => Err(tonic::Status::unknown("stream ended")),
            Err(status) => Err(status),
        }
    }
}

async fn node_info(c: &Client, name: &str) -> NodeInfo {
    c.get_node(name).await.expect("get node")
}

async fn placed(c: &Client, id: u64) -> GangGroupStatus {
    wait_for("group placed", Duration::from_secs(20), async || {
        let s = c.get(id).await.expect("get");
        (s.state == "Placed").then_some(s)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_stream_feeds_the_ledger_and_its_devices_serve_gangs() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 2).await;
    cl.register_node(node_spec("gpu-1", false))
        .await
        .expect("register");

    // An unregistered node and a node that lists the resource as allocatable are refused.
    let mut stray = Agent::open(&cl).await;
    let err = stray
        .send(report("ghost", &[("GPU-0", DeviceHealth::Healthy)]))
        .await
        .expect_err("unregistered node");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains("RegisterNode"), "{err:?}");
    cl.register_node(node_spec("listed", true))
        .await
        .expect("register");
    let mut listed = Agent::open(&cl).await;
    let err = listed
        .send(report("listed", &[("GPU-0", DeviceHealth::Healthy)]))
        .await
        .expect_err("listed resource");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().starts_with("resource_name:"), "{err:?}");

    // Four GPUs, one unhealthy.
    let mut agent = Agent::open(&cl).await;
    let devices = [
        ("GPU-0", DeviceHealth::Healthy),
        ("GPU-1", DeviceHealth::Healthy),
        ("GPU-2", DeviceHealth::Healthy),
        ("GPU-3", DeviceHealth::Unhealthy),
    ];
    let ack = agent.send(report("gpu-1", &devices)).await.expect("ack");
    assert_eq!((ack.generation, ack.healthy, ack.unhealthy), (1, 3, 1));
    let info = node_info(&cl, "gpu-1").await;
    assert_eq!(info.agent, "Connected");
    assert_eq!(info.devices.len(), 4);
    assert_eq!(
        info.devices
            .iter()
            .filter(|d| d.unhealthy)
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        ["gpu-3"]
    );

    // Three one-GPU members take the three healthy GPUs, one each.
    let first = cl
        .submit(device_gang("three", GPU, 3))
        .await
        .expect("submit");
    let first = placed(&cl, first.id).await;
    let mut taken: Vec<String> = first
        .placements
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.device.clone()))
        .collect();
    taken.sort();
    assert_eq!(taken, ["gpu-0", "gpu-1", "gpu-2"], "{first:?}");

    // A fourth member finds no healthy GPU and holds nothing while it waits.
    let second = cl.submit(device_gang("one", GPU, 1)).await.expect("submit");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let waiting = cl.get(second.id).await.expect("get");
    assert_ne!(waiting.state, "Placed", "{waiting:?}");
    assert_eq!(node_info(&cl, "gpu-1").await.pods, 3);

    // GPU-0 fails under its pod, GPU-3 recovers: the holder of GPU-0 is named for
    // eviction, the pool is not republished, and the waiting member takes GPU-3.
    let holder = first
        .placements
        .iter()
        .find(|p| p.devices.iter().any(|d| d.device == "gpu-0"))
        .map(|p| format!("{}/{}/{}", p.namespace, p.gang, p.member))
        .expect("a holder of gpu-0");
    let changed = [
        ("GPU-0", DeviceHealth::Unhealthy),
        ("GPU-1", DeviceHealth::Healthy),
        ("GPU-2", DeviceHealth::Healthy),
        ("GPU-3", DeviceHealth::Healthy),
    ];
    let ack = agent.send(report("gpu-1", &changed)).await.expect("ack");
    assert_eq!((ack.generation, ack.healthy, ack.unhealthy), (1, 3, 1));
    assert_eq!(ack.evicted, [holder]);
    let second = placed(&cl, second.id).await;
    assert_eq!(
        second.placements[0].devices[0].device, "gpu-3",
        "{second:?}"
    );

    // A new device list republishes the pool under the next generation.
    let mut grown = changed.to_vec();
    grown.push(("GPU-4", DeviceHealth::Healthy));
    let ack = agent.send(report("gpu-1", &grown)).await.expect("ack");
    assert_eq!((ack.generation, ack.healthy), (2, 4));

    // One stream speaks for one node; a report for another ends the stream, and the
    // ended stream leaves the agent disconnected (its devices in their grace period).
    let err = agent
        .send(report("listed", &devices))
        .await
        .expect_err("second node on one stream");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("node:"), "{err:?}");
    wait_for("agent disconnected", Duration::from_secs(10), async || {
        (node_info(&cl, "gpu-1").await.agent == "Disconnected").then_some(())
    })
    .await;
    // A new stream reconnects it.
    let mut again = Agent::open(&cl).await;
    let ack = again.send(report("gpu-1", &grown)).await.expect("ack");
    assert_eq!(ack.generation, 2, "same list: the pool is not republished");
    assert_eq!(node_info(&cl, "gpu-1").await.agent, "Connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_heartbeat_lease_makes_the_node_not_ready() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 3).await;
    cl.register_node(node_spec("edge-1", false))
        .await
        .expect("register");
    assert_eq!(node_info(&cl, "edge-1").await.lease_until_ms, 0);

    let err = cl
        .heartbeat("edge-1", true, 10)
        .await
        .expect_err("too short");
    assert!(err.to_string().contains("lease_ms"), "{err}");
    let err = cl.heartbeat("nobody", true, 0).await.expect_err("unknown");
    assert!(err.to_string().contains("RegisterNode"), "{err}");

    let until = cl
        .heartbeat("edge-1", true, 1_000)
        .await
        .expect("heartbeat");
    let info = node_info(&cl, "edge-1").await;
    assert_eq!(info.lease_until_ms, until);
    assert!(!info.node.expect("spec").not_ready);

    // No renewal: within a tick after the lease, the node is not ready and takes nothing.
    wait_for("node not ready", Duration::from_secs(10), async || {
        let info = node_info(&cl, "edge-1").await;
        info.node.filter(|n| n.not_ready).map(|_| ())
    })
    .await;
    let cpu_gang = SubmitGangGroupRequest {
        queue: String::new(),
        run_limit_seconds: 0,
        gangs: vec![GangSpec {
            members: vec![MemberSpec {
                name: "w".into(),
                count: 1,
                pod_json: r#"{"requests": {"cpu": "1"}}"#.into(),
                pods: None,
            }],
            ..device_gang("cpu", GPU, 1).gangs[0].clone()
        }],
        ..device_gang("cpu", GPU, 1)
    };
    let group = cl.submit(cpu_gang).await.expect("submit");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_ne!(cl.get(group.id).await.expect("get").state, "Placed");

    // The next heartbeat makes it ready again, and the waiting gang lands.
    cl.heartbeat("edge-1", true, 60_000)
        .await
        .expect("heartbeat");
    assert!(!node_info(&cl, "edge-1").await.node.expect("spec").not_ready);
    placed(&cl, group.id).await;
}
