//! A device plugin written for the tests: a real gRPC server speaking the kubelet's
//! device plugin API (`v1beta1`) on a Unix socket, as a vendor's plugin does. It
//! serves `ListAndWatch` from a device list the test changes, records every
//! `Allocate`, and registers with whatever serves `kubelet.sock` in its directory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use gangway_proto::deviceplugin::registration_client::RegistrationClient;
use gangway_proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

/// (device id, healthy).
pub type DeviceList = Vec<(String, bool)>;

/// A running test plugin.
pub struct TestPlugin {
    devices: watch::Sender<DeviceList>,
    /// The device ids of every `Allocate` container request, in call order.
    pub allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stopping: watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    socket: PathBuf,
}

/// Registers `endpoint` for `resource` with the `kubelet.sock` in `dir`, retrying for
/// up to 20 s while nothing serves it yet; the server's answer otherwise.
pub async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let channel = loop {
        match gangway_server::agent::unix::connect(&dir.join("kubelet.sock")).await {
            Ok(c) => break c,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "nothing serves kubelet.sock: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(DevicePluginOptions::default()),
        })
        .await
        .map(|_| ())
}

impl TestPlugin {
    /// Serves on `dir/endpoint`, then registers for `resource`.
    pub async fn start(
        dir: &Path,
        endpoint: &str,
        resource: &str,
        devices: &[(&str, bool)],
    ) -> Self {
        let socket = dir.join(endpoint);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind the plugin's socket");
        let (devices_tx, _) = watch::channel(list(devices));
        let allocations: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let (stopping_tx, stopping) = watch::channel(false);
        let service = Plugin {
            devices: devices_tx.clone(),
            allocations: allocations.clone(),
            stopping,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        register(dir, endpoint, resource)
            .await
            .expect("the agent takes the registration");
        TestPlugin {
            devices: devices_tx,
            allocations,
            stopping: stopping_tx,
            stop: Some(stop),
            task,
            socket,
        }
    }

    /// Reports a new device list (ListAndWatch sends it at once).
    pub fn set(&self, devices: &[(&str, bool)]) {
        self.devices.send_replace(list(devices));
    }

    /// Stops serving (its ListAndWatch streams end) and removes its socket.
    pub async fn stop(mut self) {
        // Open ListAndWatch streams hold the server: end them first.
        self.stopping.send_replace(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn list(devices: &[(&str, bool)]) -> DeviceList {
    devices
        .iter()
        .map(|(id, ok)| (id.to_string(), *ok))
        .collect()
}

struct Plugin {
    devices: watch::Sender<DeviceList>,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    /// Fires when the plugin stops: its ListAndWatch streams end.
    stopping: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut changes = self.devices.subscribe();
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            loop {
                if *stopping.borrow() {
                    return;
                }
                let now = changes.borrow_and_update().clone();
                let answer = ListAndWatchResponse {
                    devices: now
                        .iter()
                        .map(|(id, ok)| Device {
                            id: id.clone(),
                            health: if *ok { "Healthy" } else { "Unhealthy" }.into(),
                            topology: None,
                        })
                        .collect(),
                };
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = stopping.changed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "the test plugin offers no preferred allocation",
        ))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let r = request.into_inner();
        let mut responses = Vec::new();
        for c in &r.container_requests {
            if let Ok(mut seen) = self.allocations.lock() {
                seen.push(c.devices_ids.clone());
            }
            responses.push(ContainerAllocateResponse {
                envs: [("TEST_DEVICES".to_string(), c.devices_ids.join(","))].into(),
                ..Default::default()
            });
        }
        Ok(Response::new(AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
