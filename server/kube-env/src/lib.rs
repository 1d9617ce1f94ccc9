//! A real Kubernetes control plane on loopback for gangway's tests and benchmarks
//! (not part of the product), the way controller-runtime's envtest runs one: etcd,
//! kube-apiserver and, where a test needs them, kube-controller-manager's
//! controllers (the resourceclaim controller that makes claims from templates, the
//! garbage collector), started from the binaries [`assets`] finds, with
//! certificates made afresh ([`pki`]), token authentication, RBAC authorization and
//! an audit log of the writes tests reason about ([`audit`]).
//!
//! Every process is killed and every file removed when the [`ControlPlane`] is
//! dropped. Starting waits for `/readyz` for at most [`READY_TIMEOUT_MS`].
//!
//! The admin helpers ([`ControlPlane::create`] and the rest) write objects as a user
//! with `kubectl` would; `create` also writes the object's `status` through the
//! status subresource (the real server drops it on create), so a test can describe
//! a Node or an allocated claim in one literal.

pub mod assets;
pub mod audit;
pub mod pki;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_kube_double::Kind;
use http::{Method, Request};
use serde_json::{json, Value};

pub use assets::Assets;
pub use audit::{AuditEntry, Binding};

/// How long the API server may take to answer `/readyz` ok.
pub const READY_TIMEOUT_MS: u64 = 90_000;
/// How long an installed CRD may take to be established.
pub const CRD_TIMEOUT_MS: u64 = 30_000;
/// Attempts of an update that meets a conflicting write.
const UPDATE_ATTEMPTS_MAX: usize = 10;
/// The admin user's name (group `system:masters`).
pub const ADMIN_USER: &str = "admin";
/// Lifetime of the ServiceAccount tokens tests ask for, in seconds (the API server's
/// minimum is 600).
pub const SERVICE_ACCOUNT_TOKEN_S: u64 = 3_600;

/// The control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The binaries are missing or damaged.
    #[error("control plane binaries: {0}")]
    Assets(String),
    /// A file could not be written or read.
    #[error("control plane files: {0}")]
    Io(String),
    /// Certificates could not be made.
    #[error("certificates: {0}")]
    Pki(String),
    /// A process did not start or did not become ready.
    #[error("{process}: {reason}\n--- last lines of its log ---\n{log}")]
    Process {
        /// Which one.
        process: String,
        /// Why.
        reason: String,
        /// Its log's tail.
        log: String,
    },
    /// The API server answered a request with an error.
    #[error("{method} {path}: {code} {message}")]
    Api {
        /// Method.
        method: String,
        /// Path.
        path: String,
        /// HTTP code (0: no answer).
        code: u16,
        /// The server's message.
        message: String,
    },
}

impl EnvError {
    /// The HTTP code of an API answer (404 for a missing object, ...).
    pub fn code(&self) -> Option<u16> {
        match self {
            EnvError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A user the API server knows by a bearer token.
#[derive(Debug, Clone)]
pub struct Identity {
    /// User name (e.g. `system:serviceaccount:gangway:gangway`).
    pub user: String,
    /// Groups it belongs to.
    pub groups: Vec<String>,
}

impl Identity {
    /// The identity a ServiceAccount's token carries.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
        }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// kube-controller-manager controllers to run (none: no controller manager).
    pub controllers: Vec<String>,
    /// Users besides the admin.
    pub identities: Vec<Identity>,
    /// Extra kube-apiserver flags (e.g. `--runtime-config` for APIs off by default).
    pub apiserver_args: Vec<String>,
    /// Extra kube-controller-manager flags (e.g. `--feature-gates`).
    pub controller_args: Vec<String>,
}

/// The feature gates that turn on Kubernetes' own gang API (alpha in v1.36): the
/// Workload and PodGroup kinds, kube-scheduler's GangScheduling plugin and the Job
/// controller's Workloads.
pub const WORKLOAD_API_GATES: &str = "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true,WorkloadWithJob=true";

impl Options {
    /// These options with Kubernetes' gang API on: the gates on the API server and the
    /// controller manager, `scheduling.k8s.io/v1alpha2` served, and the Job and
    /// PodGroup-protection controllers running.
    pub fn with_workload_api(mut self) -> Self {
        let gates = format!("--feature-gates={WORKLOAD_API_GATES}");
        self.apiserver_args.push(gates.clone());
        self.apiserver_args.push(
            "--runtime-config=resource.k8s.io/v1=true,scheduling.k8s.io/v1alpha2=true".into(),
        );
        self.controller_args.push(gates);
        for controller in ["job-controller", "podgroup-protection-controller"] {
            if !self.controllers.iter().any(|c| c == controller) {
                self.controllers.push(controller.to_string());
            }
        }
        self
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            controllers: vec![
                "resourceclaim-controller".to_string(),
                "garbage-collector-controller".to_string(),
            ],
            identities: Vec::new(),
            apiserver_args: Vec::new(),
            controller_args: Vec::new(),
        }
    }
}

/// One child process with its log file.
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// A running control plane.
pub struct ControlPlane {
    url: String,
    pki: pki::Pki,
    tokens: BTreeMap<String, String>,
    audit_log: PathBuf,
    client: kube::Client,
    processes: Vec<Process>,
    assets: Assets,
    dir: tempfile::TempDir,
    // Last: removed after the processes are gone.
    _etcd_dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts etcd, the API server and the controllers asked for, and waits until
    /// the API server is ready.
    pub async fn start(options: Options) -> Result<Self, EnvError> {
        let assets = Assets::locate()?;
        let dir = tempfile::Builder::new()
            .prefix("gangway-k8s-")
            .tempdir()
            .map_err(|e| EnvError::Io(e.to_string()))?;
        // etcd fsyncs every write; on tmpfs that costs nothing.
        let etcd_dir = match Path::new("/dev/shm").is_dir() {
            true => tempfile::Builder::new()
                .prefix("gangway-etcd-")
                .tempdir_in("/dev/shm"),
            false => tempfile::Builder::new().prefix("gangway-etcd-").tempdir(),
        }
        .map_err(|e| EnvError::Io(e.to_string()))?;
        let pki = pki::write(dir.path())?;
        let tokens = write_tokens(dir.path(), &options.identities)?;
        let audit_policy = dir.path().join("audit-policy.yaml");
        write(&audit_policy, audit::POLICY)?;
        let audit_log = dir.path().join("audit.log");

        let mut processes = Vec::new();
        let etcd_client = port()?;
        let etcd_peer = port()?;
        processes.push(spawn(
            "etcd",
            &assets,
            dir.path(),
            &[
                "--name".into(),
                "default".into(),
                "--data-dir".into(),
                etcd_dir.path().join("data").display().to_string(),
                "--listen-client-urls".into(),
                format!("http://127.0.0.1:{etcd_client}"),
                "--advertise-client-urls".into(),
                format!("http://127.0.0.1:{etcd_client}"),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-advertise-peer-urls".into(),
                format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-cluster".into(),
                format!("default=http://127.0.0.1:{etcd_peer}"),
                "--logger".into(),
                "zap".into(),
                "--log-level".into(),
                "warn".into(),
            ],
        )?);

        let secure_port = port()?;
        let url = format!("https://127.0.0.1:{secure_port}");
        let path = |p: &Path| p.display().to_string();
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            format!("--secure-port={secure_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--tls-cert-file={}", path(&pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&pki.serving_key)),
            format!("--client-ca-file={}", path(&pki.ca_cert)),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!(
                "--service-account-key-file={}",
                path(&pki.service_account_public)
            ),
            format!(
                "--service-account-signing-key-file={}",
                path(&pki.service_account_key)
            ),
            format!("--token-auth-file={}", path(&dir.path().join("tokens.csv"))),
            "--authorization-mode=Node,RBAC".into(),
            "--endpoint-reconciler-type=none".into(),
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into(),
            format!("--requestheader-client-ca-file={}", path(&pki.ca_cert)),
            format!("--proxy-client-cert-file={}", path(&pki.proxy_cert)),
            format!("--proxy-client-key-file={}", path(&pki.proxy_key)),
            format!("--requestheader-allowed-names={}", pki::FRONT_PROXY_CN),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--audit-policy-file={}", path(&audit_policy)),
            format!("--audit-log-path={}", path(&audit_log)),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ];
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        processes.push(spawn(
            "kube-apiserver",
            &assets,
            dir.path(),
            &apiserver_args,
        )?);

        let admin_token = tokens
            .get(ADMIN_USER)
            .cloned()
            .ok_or_else(|| EnvError::Io("no admin token".into()))?;
        let client = make_client(&url, &pki.ca_pem, &admin_token)?;
        let mut plane = Self {
            url,
            pki,
            tokens,
            audit_log,
            client,
            processes,
            assets,
            dir,
            _etcd_dir: etcd_dir,
        };
        plane.wait_ready().await?;
        if !options.controllers.is_empty() {
            let kubeconfig = plane.dir.path().join("admin.kubeconfig");
            plane.write_kubeconfig(&kubeconfig, ADMIN_USER)?;
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--controllers={}", options.controllers.join(",")),
                "--use-service-account-credentials=false".into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ];
            args.extend(options.controller_args.iter().cloned());
            let kcm = spawn(
                "kube-controller-manager",
                &plane.assets,
                plane.dir.path(),
                &args,
            )?;
            plane.processes.push(kcm);
        }
        Ok(plane)
    }

    /// Starts kube-scheduler as the admin (client QPS and burst 1000, no leader election,
    /// no serving port); it stops with the control plane. For side-by-side runs: it
    /// schedules the pods whose `schedulerName` is `default-scheduler`.
    pub fn start_kube_scheduler(&mut self) -> Result<(), EnvError> {
        self.start_kube_scheduler_with(&[])
    }

    /// [`ControlPlane::start_kube_scheduler`] with extra flags (feature gates, say).
    pub fn start_kube_scheduler_with(&mut self, extra: &[&str]) -> Result<(), EnvError> {
        let kubeconfig = self.dir.path().join("scheduler.kubeconfig");
        self.write_kubeconfig(&kubeconfig, ADMIN_USER)?;
        let config = self.dir.path().join("kube-scheduler.yaml");
        write(&config, &kube_scheduler_config(&kubeconfig))?;
        let mut args = vec![format!("--config={}", config.display())];
        args.extend(KUBE_SCHEDULER_FLAGS.iter().map(|f| f.to_string()));
        args.extend(extra.iter().map(|f| f.to_string()));
        let scheduler = spawn("kube-scheduler", &self.assets, self.dir.path(), &args)?;
        self.processes.push(scheduler);
        Ok(())
    }

    /// The API server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// An admin client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The directory holding the certificates, token file, logs and audit log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where a program of the control plane is (to run kube-scheduler beside it).
    pub fn program(&self, name: &str) -> PathBuf {
        self.assets.program(name)
    }

    /// Writes a kubeconfig for `user` (the admin or one of the identities asked for).
    pub fn write_kubeconfig(&self, path: &Path, user: &str) -> Result<(), EnvError> {
        let token = self
            .tokens
            .get(user)
            .ok_or_else(|| EnvError::Io(format!("no identity {user:?} was asked for")))?;
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\n    namespace: default\ncurrent-context: test\nusers:\n- name: {user}\n  user:\n    token: {token}\n",
            self.url,
            self.pki.ca_cert.display()
        );
        write(path, &text)
    }

    /// The last lines of a process's log (`etcd`, `kube-apiserver`, ...).
    pub fn log_tail(&self, process: &str) -> String {
        self.processes
            .iter()
            .find(|p| p.name == process)
            .map(|p| tail(&p.log))
            .unwrap_or_default()
    }

    /// The process id of a running program of the control plane.
    pub fn pid(&self, process: &str) -> Option<u32> {
        self.processes
            .iter()
            .find(|p| p.name == process)
            .map(|p| p.child.id())
    }

    /// Every audited request so far.
    pub fn audit(&self) -> Vec<AuditEntry> {
        audit::read(&self.audit_log)
    }

    /// Every successful binding so far, in arrival order.
    pub fn bindings(&self) -> Vec<Binding> {
        audit::bindings(&self.audit())
    }

    async fn wait_ready(&mut self) -> Result<(), EnvError> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < Duration::from_millis(READY_TIMEOUT_MS) {
            for p in &mut self.processes {
                if let Ok(Some(status)) = p.child.try_wait() {
                    return Err(EnvError::Process {
                        process: p.name.to_string(),
                        reason: format!("exited with {status} while starting"),
                        log: tail(&p.log),
                    });
                }
            }
            let request = Request::builder()
                .uri("/readyz")
                .body(Vec::new())
                .map_err(|e| EnvError::Io(e.to_string()))?;
            match self.client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(EnvError::Process {
            process: "kube-apiserver".into(),
            reason: format!("not ready after {READY_TIMEOUT_MS} ms: {last}"),
            log: self.log_tail("kube-apiserver"),
        })
    }

    /// Sends one JSON request as the admin.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Value, EnvError> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(bytes)
            .map_err(|e| EnvError::Io(e.to_string()))?;
        self.client
            .request::<Value>(request)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) => EnvError::Api {
                    method: method.to_string(),
                    path: path.to_string(),
                    code: status.code,
                    message: status.message.clone(),
                },
                other => EnvError::Api {
                    method: method.to_string(),
                    path: path.to_string(),
                    code: 0,
                    message: other.to_string(),
                },
            })
    }

    /// Creates `object` (its `status`, if any, written next through the status
    /// subresource); answers the object as stored.
    pub async fn create(&self, kind: &Kind, object: Value) -> Result<Value, EnvError> {
        let ns = object["metadata"]["namespace"].as_str().map(String::from);
        let mut body = object.clone();
        body["apiVersion"] = json!(kind.api_version());
        body["kind"] = json!(kind.kind);
        let created = self
            .call(
                Method::POST,
                &collection_path(kind, ns.as_deref()),
                JSON,
                Some(&body),
            )
            .await?;
        let status = &object["status"];
        if !kind.status_subresource || status.is_null() {
            return Ok(created);
        }
        let name = created["metadata"]["name"].as_str().unwrap_or_default();
        self.call(
            Method::PATCH,
            &format!("{}/status", object_path(kind, ns.as_deref(), name)),
            MERGE,
            Some(&json!({"status": status})),
        )
        .await
    }

    /// One object.
    pub async fn get(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, EnvError> {
        self.call(Method::GET, &object_path(kind, namespace, name), JSON, None)
            .await
    }

    /// Every object of `kind` (in `namespace` if given).
    pub async fn list(&self, kind: &Kind, namespace: Option<&str>) -> Result<Vec<Value>, EnvError> {
        let list = self
            .call(Method::GET, &collection_path(kind, namespace), JSON, None)
            .await?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Reads, edits and writes back an object (main resource and, if it changed,
    /// status), retrying on conflicting writes.
    pub async fn update(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        edit: impl Fn(&mut Value),
    ) -> Result<Value, EnvError> {
        let path = object_path(kind, namespace, name);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut object = self.get(kind, namespace, name).await?;
            let before = object.clone();
            edit(&mut object);
            let mut written = self.call(Method::PUT, &path, JSON, Some(&object)).await;
            let status_changed = kind.status_subresource && object["status"] != before["status"];
            if let (Ok(current), true) = (&written, status_changed) {
                let mut status = current.clone();
                status["status"] = object["status"].clone();
                written = self
                    .call(Method::PUT, &format!("{path}/status"), JSON, Some(&status))
                    .await;
            }
            match written {
                Err(e) if e.code() == Some(409) && attempt < UPDATE_ATTEMPTS_MAX => continue,
                other => return other,
            }
        }
    }

    /// Deletes an object at once (`gracePeriodSeconds: 0`: no kubelet runs here to
    /// finish a graceful deletion).
    pub async fn delete(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, EnvError> {
        self.call(
            Method::DELETE,
            &object_path(kind, namespace, name),
            JSON,
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})),
        )
        .await
    }

    /// Makes a namespace if it does not exist.
    pub async fn ensure_namespace(&self, name: &str) -> Result<(), EnvError> {
        match self
            .call(
                Method::POST,
                "/api/v1/namespaces",
                JSON,
                Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})),
            )
            .await
        {
            Err(e) if e.code() == Some(409) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// A real token of ServiceAccount `namespace/name` (made if missing), from the
    /// TokenRequest API: what a pod running as it would present (valid an hour).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, EnvError> {
        self.ensure_namespace(namespace).await?;
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts");
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
        match self.call(Method::POST, &path, JSON, Some(&account)).await {
            Err(e) if e.code() == Some(409) => {}
            other => {
                other?;
            }
        }
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": SERVICE_ACCOUNT_TOKEN_S}
        });
        let answer = self
            .call(
                Method::POST,
                &format!("{path}/{name}/token"),
                JSON,
                Some(&request),
            )
            .await?;
        answer["status"]["token"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| {
                EnvError::Io(format!(
                    "TokenRequest for {namespace}/{name}: no token in {answer}"
                ))
            })
    }

    /// Installs the PodGroup CRDs of both scheduler-plugins groups
    /// (`scheduling.x-k8s.io` and `scheduling.sigs.k8s.io`, v1alpha1, with a status
    /// subresource) and waits until they are served.
    pub async fn install_pod_group_crds(&self) -> Result<(), EnvError> {
        for group in ["scheduling.x-k8s.io", "scheduling.sigs.k8s.io"] {
            self.install_crd(pod_group_crd(group)).await?;
        }
        Ok(())
    }

    /// Creates a CRD and waits until it is established.
    pub async fn install_crd(&self, crd: Value) -> Result<(), EnvError> {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        match self.call(Method::POST, path, JSON, Some(&crd)).await {
            Err(e) if e.code() == Some(409) => {}
            other => {
                other?;
            }
        }
        let start = Instant::now();
        loop {
            let got = self
                .call(Method::GET, &format!("{path}/{name}"), JSON, None)
                .await?;
            let established = got["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
            if established {
                return Ok(());
            }
            if start.elapsed() > Duration::from_millis(CRD_TIMEOUT_MS) {
                return Err(EnvError::Process {
                    process: "kube-apiserver".into(),
                    reason: format!("CRD {name} not established after {CRD_TIMEOUT_MS} ms"),
                    log: self.log_tail("kube-apiserver"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Controllers first, etcd last, so nothing logs a lost backend.
        for p in self.processes.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// kube-scheduler's configuration for side-by-side runs: client QPS and burst 1000 (its
/// default 50 QPS would cap it near 50 pods/s), no leader election.
pub fn kube_scheduler_config(kubeconfig: &Path) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\n  qps: 1000\n  burst: 1000\nleaderElection:\n  leaderElect: false\n",
        kubeconfig.display()
    )
}

/// kube-scheduler's flags besides `--config`: no serving port, quiet logs.
pub const KUBE_SCHEDULER_FLAGS: [&str; 2] = ["--secure-port=0", "-v=0"];

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

/// The URL path of a kind's collection.
pub fn collection_path(kind: &Kind, namespace: Option<&str>) -> String {
    let base = if kind.group.is_empty() {
        format!("/api/{}", kind.version)
    } else {
        format!("/apis/{}/{}", kind.group, kind.version)
    };
    match (kind.namespaced, namespace) {
        (true, Some(ns)) => format!("{base}/namespaces/{ns}/{}", kind.plural),
        _ => format!("{base}/{}", kind.plural),
    }
}

/// The URL path of one object.
pub fn object_path(kind: &Kind, namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", collection_path(kind, namespace))
}

/// A PodGroup CRD for `group` (fields left open: gangway reads minMember and
/// scheduleTimeoutSeconds and writes status).
pub fn pod_group_crd(group: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("podgroups.{group}"),
            "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/kubernetes/pull/78458"}
        },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": "PodGroup", "listKind": "PodGroupList", "plural": "podgroups", "singular": "podgroup"},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    })
}

fn port() -> Result<u16, EnvError> {
    gangway_client::loopback::free_port().map_err(|e| EnvError::Io(format!("free port: {e}")))
}

fn write(path: &Path, text: &str) -> Result<(), EnvError> {
    std::fs::write(path, text).map_err(|e| EnvError::Io(format!("{}: {e}", path.display())))
}

/// Writes the token file: the admin (`system:masters`) and each identity, with a
/// fresh random token each.
fn write_tokens(dir: &Path, identities: &[Identity]) -> Result<BTreeMap<String, String>, EnvError> {
    let mut tokens = BTreeMap::new();
    let mut lines = String::new();
    let admin = Identity {
        user: ADMIN_USER.to_string(),
        groups: vec!["system:masters".to_string()],
    };
    for (i, identity) in std::iter::once(&admin).chain(identities).enumerate() {
        let token = fresh_token()?;
        lines.push_str(&format!(
            "{token},{},uid-{i},\"{}\"\n",
            identity.user,
            identity.groups.join(",")
        ));
        tokens.insert(identity.user.clone(), token);
    }
    write(&dir.join("tokens.csv"), &lines)?;
    Ok(tokens)
}

fn fresh_token() -> Result<String, EnvError> {
    let mut bytes = [0u8; 24];
    let mut file =
        File::open("/dev/urandom").map_err(|e| EnvError::Io(format!("/dev/urandom: {e}")))?;
    std::io::Read::read_exact(&mut file, &mut bytes)
        .map_err(|e| EnvError::Io(format!("/dev/urandom: {e}")))?;
    Ok(hex::encode(bytes))
}

fn make_client(url: &str, ca_pem: &str, token: &str) -> Result<kube::Client, EnvError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| EnvError::Io(format!("url {url}: {e}")))?;
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(vec![pem_to_der(ca_pem)?]);
    config.auth_info.token = Some(token.to_string().into());
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| EnvError::Io(format!("client: {e}")))
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>, EnvError> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .map_err(|e| EnvError::Pki(format!("CA PEM: {e:?}")))
}

fn spawn(
    name: &'static str,
    assets: &Assets,
    dir: &Path,
    args: &[String],
) -> Result<Process, EnvError> {
    let log = dir.join(format!("{name}.log"));
    let out = File::create(&log).map_err(|e| EnvError::Io(format!("{}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| EnvError::Io(format!("{}: {e}", log.display())))?;
    let child = Command::new(assets.program(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| EnvError::Process {
            process: name.to_string(),
            reason: format!("could not start {}: {e}", assets.program(name).display()),
            log: String::new(),
        })?;
    Ok(Process { name, child, log })
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
