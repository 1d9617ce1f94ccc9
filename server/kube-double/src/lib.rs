//! A test double of the kube-apiserver, for gangway's tests and benchmarks only (it
//! is not part of the product). A real kube-apiserver cannot run on the machines
//! these tests run on, so this one serves the subset gangway uses over plain HTTP on
//! 127.0.0.1, with the real server's behaviour where gangway depends on it:
//!
//! - list returns a list resourceVersion; watch from a resourceVersion replays every
//!   later change in order, sends BOOKMARK events when asked (`allowWatchBookmarks`),
//!   and answers a resourceVersion older than the kept history with an ERROR event
//!   carrying a 410 Expired Status (the client must re-list), as after etcd compaction;
//!   objects moving in or out of a field or label selector arrive as ADDED / DELETED;
//! - create answers 409 AlreadyExists for a taken name; update with a stale
//!   metadata.resourceVersion answers 409 Conflict; delete honours uid and
//!   resourceVersion preconditions (409); a missing object is 404;
//! - `status` is a subresource for pods, nodes, PodGroups and ResourceClaims: writes to
//!   the main resource leave status alone and status writes change only status;
//! - `pods/{name}/binding` sets spec.nodeName and the PodScheduled condition; a second
//!   binding is 409 Conflict ("already assigned to node"), a uid precondition that does
//!   not match is 409 Conflict, a missing pod 404;
//! - kube-controller-manager's resourceclaim controller is played by
//!   [`claim_controller`] (claims from templates, names in pod status, deleted with
//!   their pod).
//!
//! For fault tests, `pods/binding` can be made to answer 503 ServiceUnavailable (as an
//! overloaded server does), and objects deleted over HTTP are kept for inspection.
//!
//! Where it differs from the real server: no authentication, admission, validation or
//! defaulting of object contents; lists are never paginated (`limit` is ignored);
//! strategic merge patches are applied as JSON merge patches and JSON patches and
//! server-side apply are refused with 415; deletes are immediate (no graceful
//! deletion, finalizers or deletionTimestamp); set-based label selectors are refused;
//! one revision counter serves every kind; there is no discovery beyond `/version`.

pub mod claim_controller;
mod http;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use store::{ApiError, Kind, Selector, Store};

/// How the double behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Play the resourceclaim controller.
    pub claim_controller: bool,
    /// Changes kept per kind for watches (older resourceVersions get 410).
    pub history_events: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            claim_controller: true,
            history_events: store::HISTORY_EVENTS_DEFAULT,
        }
    }
}

/// State shared by the HTTP handlers and the test's direct calls.
pub struct Shared {
    store: Mutex<Store>,
    bindings: Mutex<Vec<Binding>>,
    /// Objects deleted through the HTTP API, as they were at deletion (tests read them).
    deleted: Mutex<Vec<Value>>,
    /// While set, `pods/binding` answers 503 (as an overloaded server may).
    bindings_unavailable: AtomicBool,
    revisions: watch::Sender<u64>,
    options: Options,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves a consistent store (writes are whole).
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_binding(&self, binding: Binding) {
        self.bindings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(binding);
    }

    fn bindings_unavailable(&self) -> bool {
        self.bindings_unavailable.load(Ordering::SeqCst)
    }

    fn record_deletion(&self, object: Value) {
        self.deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(object);
    }

    /// Runs `f` on the store and wakes watches.
    fn write<T>(&self, f: impl FnOnce(&mut Store) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (out, rv) = {
            let mut store = self.store();
            let out = f(&mut store);
            (out, store.revision())
        };
        self.revisions.send_replace(rv);
        out
    }
}

/// One successful `pods/binding` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Node bound to.
    pub node: String,
    /// Revision the binding produced.
    pub revision: u64,
}

/// A running API server double on 127.0.0.1.
pub struct ApiServerDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ApiServerDouble {
    /// Starts one on an ephemeral port.
    pub async fn start(options: Options) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (revisions, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(options.history_events)),
            bindings: Mutex::new(Vec::new()),
            deleted: Mutex::new(Vec::new()),
            bindings_unavailable: AtomicBool::new(false),
            revisions,
            options,
        });
        let handler_state = shared.clone();
        let app =
            axum::Router::new().fallback(move |method, uri, headers, body: axum::body::Bytes| {
                let shared = handler_state.clone();
                async move { http::handle(shared, method, uri, headers, body).await }
            });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "API server double stopped with an error");
            }
        });
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig that points at it.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\ncontexts:\n- name: double\n  context:\n    cluster: double\n    user: tester\n    namespace: default\ncurrent-context: double\nusers:\n- name: tester\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, text)
    }

    /// Creates an object as a POST would.
    pub fn create(&self, kind: &Kind, object: Value) -> Result<Value, ApiError> {
        let ns = object["metadata"]["namespace"].as_str().map(String::from);
        self.shared.write(|store| {
            let created = store.create(kind, ns.as_deref(), object)?;
            if *kind == store::PODS && self.shared.options.claim_controller {
                claim_controller::pod_created(store, &created);
            }
            Ok(created)
        })
    }

    /// One object.
    pub fn get(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.shared.store().get(kind, namespace, name)
    }

    /// Every object of `kind` (in `namespace` if given).
    pub fn list(&self, kind: &Kind, namespace: Option<&str>) -> Vec<Value> {
        let selector = Selector {
            namespace: namespace.map(String::from),
            ..Default::default()
        };
        self.shared.store().list(kind, &selector).0
    }

    /// Changes an object as an update would (no resourceVersion precondition).
    pub fn update(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        edit: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        self.shared
            .write(|store| store.update(kind, namespace, name, None, edit))
    }

    /// Deletes an object as a DELETE without preconditions would.
    pub fn delete(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let gone = self.shared.write(|store| {
            let gone = store.delete(kind, namespace, name, None, None)?;
            if *kind == store::PODS && self.shared.options.claim_controller {
                claim_controller::pod_deleted(store, &gone);
            }
            Ok(gone)
        })?;
        self.shared.record_deletion(gone.clone());
        Ok(gone)
    }

    /// Every successful binding so far, in order (tests count them per pod).
    pub fn bindings(&self) -> Vec<Binding> {
        self.shared
            .bindings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every object deleted so far (through the HTTP API or [`Self::delete`]), as it was
    /// when deleted, its `resourceVersion` the deletion's (one counter with bindings').
    pub fn deleted(&self) -> Vec<Value> {
        self.shared
            .deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `pods/binding` answer 503 ServiceUnavailable (`true`) or work again.
    pub fn set_bindings_unavailable(&self, unavailable: bool) {
        self.shared
            .bindings_unavailable
            .store(unavailable, Ordering::SeqCst);
    }

    /// Stops serving (watches end).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.shared.revisions.send_replace(u64::MAX);
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
