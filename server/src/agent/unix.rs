//! gRPC over Unix sockets, as the device plugin API runs: a channel to a plugin's
//! socket, and the listener the agent's `Registration` service answers on. Called by
//! the agent only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Time allowed to connect to a plugin's socket, in ms (the kubelet's dial timeout).
pub const PLUGIN_DIAL_TIMEOUT_MS: u64 = 10_000;

/// A channel to the gRPC server on the Unix socket at `path`, connected now.
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by the builder and never dialled: every connection goes to
    // the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_millis(PLUGIN_DIAL_TIMEOUT_MS))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Listens on a fresh socket at `path`, replacing a stale socket file a previous run
/// left (as the kubelet cleans its directory); creates the directory if needed.
pub fn listen(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}
