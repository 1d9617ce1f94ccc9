//! Transport security and credential files for `gangway serve`: mutual TLS on the
//! gRPC port (peers and clients alike present a certificate signed by the configured
//! CA; plaintext is refused), the administrator tokens file, and the peer secret that
//! keys the replicas' peer proofs (`auth::gate`). Only replicas hold the peer secret
//! (`--peer-secret-file`, or one generated in memory when no other process needs it),
//! and it is never sent, so no client token or certificate lets a caller vote, append
//! entries or propose a command: a client that could write the log could break every
//! invariant. Who may call what is `auth`'s; this module only loads and reloads. The
//! server side re-reads certificate, key, CA, token and secret files when they change
//! (checked every [`CREDENTIALS_RELOAD_MS`]): new connections use the new
//! certificate, new requests are checked against the new secrets, and what is sent to
//! peers follows the files; a file that fails to load leaves the last good one in
//! force. The certificate a replica presents to its peers is read at start: rotate a
//! CA by adding the new one to the bundle first, then restart replicas one at a time.
//! Client tokens are kept as SHA-256 digests; peer secrets in plain text too (they key
//! the proofs), never sent and never logged. Used by `Replica` (the server side),
//! `serve` and `dev` (peer identity), and `auth::gate`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_rustls::server::TlsStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// How often the credential files are checked for changes, in ms.
pub const CREDENTIALS_RELOAD_MS: u64 = 5_000;
/// Time allowed for one TLS handshake, in ms.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// TLS handshakes in progress at once.
pub const TLS_HANDSHAKES_MAX: usize = 256;
/// Wait after a failed accept before the next, in ms.
pub const ACCEPT_RETRY_MS: u64 = 100;

/// The PEM files of mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This replica's certificate chain (server and, towards peers, client identity).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signs every peer's and client's certificate.
    pub client_ca: PathBuf,
}

/// A credential file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The file could not be read.
    #[error("{flag} {path}: {reason}")]
    Unreadable {
        /// The flag naming it.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The TLS configuration was refused.
    #[error("TLS configuration (--tls-cert, --tls-key, --tls-client-ca): {0}")]
    Tls(String),
}

fn unreadable(flag: &'static str, path: &Path, reason: impl ToString) -> SecurityError {
    SecurityError::Unreadable {
        flag,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|e| unreadable(flag, path, e))
}

fn certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let pem = read(flag, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| unreadable(flag, path, e))?;
    if certs.is_empty() {
        return Err(unreadable(flag, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server side of mutual TLS from `files` (HTTP/2 only, client certificate required).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, SecurityError> {
    let chain = certs("--tls-cert", &files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read("--tls-key", &files.key)?)
        .map_err(|e| unreadable("--tls-key", &files.key, e))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in certs("--tls-client-ca", &files.client_ca)? {
        roots
            .add(ca)
            .map_err(|e| unreadable("--tls-client-ca", &files.client_ca, e))?;
    }
    // A certificate that is presented must chain to the CA, or the handshake fails;
    // one that is missing is refused by the gRPC layer instead (`Gate`), which can
    // answer with a status that says what to do.
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| SecurityError::Tls(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| SecurityError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| SecurityError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The client side of mutual TLS from `files`: this replica's identity towards peers,
/// trusting the same CA.
pub fn client_config(files: &TlsFiles) -> Result<ClientTlsConfig, SecurityError> {
    // Parse now, so a bad file fails at start-up rather than on the first peer call.
    server_config(files)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(
            "--tls-client-ca",
            &files.client_ca,
        )?))
        .identity(Identity::from_pem(
            read("--tls-cert", &files.cert)?,
            read("--tls-key", &files.key)?,
        )))
}

/// When `paths` last changed (the latest modification time among them).
fn stamp(paths: &[&Path]) -> Option<SystemTime> {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
}

/// The server TLS configuration in force, swapped when its files change.
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<rustls::ServerConfig>>,
    loaded: RwLock<Option<SystemTime>>,
}

impl ServerTls {
    /// Loads `files` (an error names the flag and file).
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, SecurityError> {
        let config = server_config(&files)?;
        let loaded = stamp(&[&files.cert, &files.key, &files.client_ca]);
        Ok(Arc::new(Self {
            files,
            current: RwLock::new(config),
            loaded: RwLock::new(loaded),
        }))
    }

    fn current(&self) -> Arc<rustls::ServerConfig> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads the files if they changed; a failure keeps the configuration in force.
    fn reload_if_changed(&self) {
        let f = &self.files;
        let now = stamp(&[&f.cert, &f.key, &f.client_ca]);
        let before = self.loaded.read().map(|l| *l).unwrap_or(None);
        if now == before {
            return;
        }
        match server_config(f) {
            Ok(config) => {
                if let Ok(mut c) = self.current.write() {
                    *c = config;
                }
                if let Ok(mut l) = self.loaded.write() {
                    *l = now;
                }
                tracing::info!(cert = %f.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS files changed but cannot be used; keeping the previous ones")
            }
        }
    }
}

/// Accepts TCP connections on `listener` and completes their TLS handshakes (each
/// bounded by [`TLS_HANDSHAKE_TIMEOUT_MS`], at most [`TLS_HANDSHAKES_MAX`] at once);
/// the streams that pass come out of the returned receiver. A client without a
/// valid certificate, or speaking plaintext, never gets a stream.
pub fn tls_incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    mut stop: watch::Receiver<bool>,
) -> mpsc::Receiver<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(TLS_HANDSHAKES_MAX);
    let slots = Arc::new(Semaphore::new(TLS_HANDSHAKES_MAX));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.changed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let handshake = tokio::time::timeout(
                    Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS),
                    acceptor.accept(tcp),
                )
                .await;
                match handshake {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

/// Fewest characters of a peer secret.
pub const PEER_SECRET_CHARS_MIN: usize = 16;
/// Random bytes of a generated peer secret (hex-encoded, so twice as many characters).
pub const GENERATED_SECRET_BYTES: usize = 32;

/// Accepted secrets (bearer tokens, or the peer secret), as SHA-256 digests, swapped
/// when their file changes.
pub struct Tokens {
    /// The file they come from; `None` for a secret generated in memory.
    path: Option<PathBuf>,
    /// The flag naming the file, for errors.
    flag: &'static str,
    digests: RwLock<HashSet<[u8; 32]>>,
    /// The file's first token in plain text: for the peer secret, what keys this
    /// replica's proofs to its peers.
    first: gangway_raft::SharedToken,
    /// Peer secrets only: every accepted one in plain text (proofs are checked with
    /// each, so a rotation can add one before it is first). Empty for client tokens,
    /// which are kept as digests only.
    keys: RwLock<Vec<String>>,
    loaded: RwLock<Option<SystemTime>>,
}

fn read_tokens(flag: &'static str, path: &Path) -> Result<Vec<String>, SecurityError> {
    let text = std::fs::read_to_string(path).map_err(|e| unreadable(flag, path, e))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    if tokens.is_empty() {
        return Err(unreadable(
            flag,
            path,
            "no token in the file (one per line)",
        ));
    }
    if let Some(bad) = tokens
        .iter()
        .position(|t| t.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(unreadable(
            flag,
            path,
            format!(
                "token on data line {} has whitespace or control characters",
                bad + 1
            ),
        ));
    }
    if flag == PEER_SECRET_FLAG {
        if let Some(short) = tokens.iter().position(|t| t.len() < PEER_SECRET_CHARS_MIN) {
            return Err(unreadable(
                flag,
                path,
                format!(
                    "secret on data line {} is shorter than {PEER_SECRET_CHARS_MIN} characters \
                     (make one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)",
                    short + 1
                ),
            ));
        }
    }
    Ok(tokens)
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The flag of the client token file.
pub const TOKENS_FLAG: &str = "--auth-tokens-file";
/// The flag of the peer secret file.
pub const PEER_SECRET_FLAG: &str = "--peer-secret-file";

impl Tokens {
    /// Loads the token file (one token per line; `#` comments and blank lines skipped).
    pub fn load(path: PathBuf) -> Result<Arc<Self>, SecurityError> {
        Self::load_file(TOKENS_FLAG, path)
    }

    /// Loads the peer secret file (same format; every line is accepted, the first is
    /// sent, so a secret is rotated by adding the new one second, then first, then
    /// removing the old).
    pub fn load_peer_secret(path: PathBuf) -> Result<Arc<Self>, SecurityError> {
        Self::load_file(PEER_SECRET_FLAG, path)
    }

    fn load_file(flag: &'static str, path: PathBuf) -> Result<Arc<Self>, SecurityError> {
        let tokens = read_tokens(flag, &path)?;
        let loaded = stamp(&[&path]);
        let keys = if flag == PEER_SECRET_FLAG {
            tokens.clone()
        } else {
            Vec::new()
        };
        Ok(Arc::new(Self {
            digests: RwLock::new(tokens.iter().map(|t| digest(t)).collect()),
            first: Arc::new(RwLock::new(tokens[0].clone())),
            keys: RwLock::new(keys),
            loaded: RwLock::new(loaded),
            flag,
            path: Some(path),
        }))
    }

    /// A random peer secret held in memory only: for replicas that share a process
    /// (`gangway dev`) or have no peers.
    pub fn generated_peer_secret() -> Result<Arc<Self>, SecurityError> {
        use std::io::Read;
        let source = Path::new("/dev/urandom");
        let mut bytes = [0u8; GENERATED_SECRET_BYTES];
        std::fs::File::open(source)
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| unreadable(PEER_SECRET_FLAG, source, e))?;
        let secret = hex::encode(bytes);
        Ok(Arc::new(Self {
            digests: RwLock::new(HashSet::from([digest(&secret)])),
            keys: RwLock::new(vec![secret.clone()]),
            first: Arc::new(RwLock::new(secret)),
            loaded: RwLock::new(None),
            flag: PEER_SECRET_FLAG,
            path: None,
        }))
    }

    /// The peer secrets proofs are checked with (empty for client tokens).
    pub fn secrets(&self) -> Vec<String> {
        self.keys.read().map(|k| k.clone()).unwrap_or_default()
    }

    /// The file's first token (for the peer secret: what keys this replica's proofs).
    pub fn own(&self) -> String {
        self.first.read().map(|f| f.clone()).unwrap_or_default()
    }

    /// The same token, shared: it follows the file when the file changes.
    pub fn own_shared(&self) -> gangway_raft::SharedToken {
        self.first.clone()
    }

    /// Whether a token with SHA-256 `d` is one of the accepted ones.
    pub fn accepts_digest(&self, d: &[u8; 32]) -> bool {
        self.digests.read().is_ok_and(|set| set.contains(d))
    }

    /// Whether `token` is one of the accepted ones.
    pub fn accepts(&self, token: &str) -> bool {
        self.digests
            .read()
            .is_ok_and(|d| d.contains(&digest(token)))
    }

    fn reload_if_changed(&self) {
        let Some(path) = &self.path else {
            return;
        };
        let now = stamp(&[path]);
        let before = self.loaded.read().map(|l| *l).unwrap_or(None);
        if now == before {
            return;
        }
        match read_tokens(self.flag, path) {
            Ok(tokens) => {
                if let Ok(mut d) = self.digests.write() {
                    *d = tokens.iter().map(|t| digest(t)).collect();
                }
                if let Ok(mut f) = self.first.write() {
                    *f = tokens[0].clone();
                }
                if self.flag == PEER_SECRET_FLAG {
                    if let Ok(mut k) = self.keys.write() {
                        *k = tokens.clone();
                    }
                }
                if let Ok(mut l) = self.loaded.write() {
                    *l = now;
                }
                tracing::info!(flag = self.flag, tokens = tokens.len(), "secrets reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "secret file changed but cannot be used; keeping the previous secrets")
            }
        }
    }
}

/// What the server side of a replica enforces.
#[derive(Clone)]
pub struct ServerSecurity {
    /// Mutual TLS on the gRPC port.
    pub tls: Option<Arc<ServerTls>>,
    /// With TLS: whether callers with a bearer token may come without a client certificate.
    pub client_certs_optional: bool,
    /// Administrator bearer tokens (`--auth-tokens-file`).
    pub tokens: Option<Arc<Tokens>>,
    /// The secret only replicas hold, which keys the peer proofs the Raft transport
    /// requires (always: a client that could write the log could break every invariant).
    pub peer_secret: Arc<Tokens>,
    /// The access policy (`--policy-file`).
    pub policy: Option<Arc<crate::auth::PolicyFile>>,
    /// The Kubernetes API as an authority for other bearer tokens (`--kube-auth`).
    pub reviewer: Option<Arc<dyn crate::auth::access::Reviewer>>,
    /// First rollout of an upgrade only: peers of the release before are recognised by
    /// the secret they send.
    pub accept_legacy_secret: bool,
}

impl ServerSecurity {
    /// No TLS and no client credentials (every caller may do everything); the Raft
    /// transport still wants proofs made with `peer_secret`.
    pub fn open(peer_secret: Arc<Tokens>) -> Self {
        Self {
            tls: None,
            client_certs_optional: false,
            tokens: None,
            peer_secret,
            policy: None,
            reviewer: None,
            accept_legacy_secret: false,
        }
    }

    /// The credentials replica `node_id` of `cluster_id` accepts.
    pub fn credentials(&self, cluster_id: &str, node_id: u64) -> crate::auth::Credentials {
        crate::auth::Credentials {
            tls: self.tls.is_some(),
            client_certs_optional: self.client_certs_optional,
            tokens: self.tokens.clone(),
            policy: self.policy.clone(),
            kube_review: self.reviewer.is_some(),
            peer_secret: self.peer_secret.clone(),
            cluster_id: cluster_id.to_string(),
            node_id,
            accept_legacy_secret: self.accept_legacy_secret,
        }
    }

    /// Authorization as the services apply it.
    pub fn access(&self) -> crate::auth::Access {
        match &self.reviewer {
            Some(r) => crate::auth::Access::with_reviewer(r.clone()),
            None => crate::auth::Access::policy_only(),
        }
    }
}

impl std::fmt::Debug for ServerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSecurity")
            .field("tls", &self.tls.is_some())
            .field("tokens", &self.tokens.is_some())
            .field("peer_secret", &"<redacted>")
            .field("policy", &self.policy.is_some())
            .field("kube_review", &self.reviewer.is_some())
            .finish()
    }
}

/// Re-reads changed credential files every [`CREDENTIALS_RELOAD_MS`] until `stop` fires.
pub async fn watch_credentials(
    tls: Option<Arc<ServerTls>>,
    tokens: Vec<Arc<Tokens>>,
    policy: Option<Arc<crate::auth::PolicyFile>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(CREDENTIALS_RELOAD_MS)) => {}
        }
        if let Some(t) = &tls {
            t.reload_if_changed();
        }
        for t in &tokens {
            t.reload_if_changed();
        }
        if let Some(p) = &policy {
            p.reload_if_changed();
        }
    }
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;
