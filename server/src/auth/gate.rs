//! Authentication at the gRPC edge: each request's credentials become a [`Caller`],
//! put in the request's extensions before its body is decoded, or the request is
//! refused UNAUTHENTICATED. The services then authorize the caller per RPC
//! (`auth::access`).
//!
//! Rules, in order:
//! - A peer proof (`x-gangway-peer-proof`, made with the peer secret for this replica's
//!   own id) makes the caller [`Caller::Peer`]; with mutual TLS the connection must also
//!   have presented a *peer certificate* (subject organization or common name
//!   [`PEER_ORGANIZATION`]). Nothing a client can hold is a peer: not a token, not a
//!   policy entry.
//! - With mutual TLS, a connection without a client certificate is refused, unless the
//!   replica takes bearer tokens without one (`--tls-client-certs optional`) and the
//!   request sends a token.
//! - A bearer token from `--auth-tokens-file` is an administrator named `tokens:admin`; one the
//!   policy names is that identity; with `--kube-auth`, any other is left for the
//!   Kubernetes API to review ([`Caller::Unreviewed`]); otherwise it is refused.
//! - Without a token, a client certificate whose subject CN the policy names is that
//!   identity; with no policy at all, any certificate the CA signed is an administrator
//!   (named `cert:` and its CN), as before policies existed.
//! - Writing for the first rollout of an upgrade, the peer secret itself (as the release
//!   before sends it) also makes a peer, over a connection that presented a certificate
//!   if the port speaks TLS.
//! - No credential at all is refused, except on a replica that requires none
//!   (`gangway dev`, tests): there every caller is [`Caller::Open`].

use std::sync::Arc;

use gangway_raft::{proof_accepted, NodeId, PEER_PROOF_HEADER};
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::transport::CertificateDer;
use tonic::{Request, Status};

use crate::auth::policy::{Identity, PolicyFile};
use crate::security::Tokens;

/// The subject organization (O), or common name (CN), of a peer certificate: only a
/// connection that presented one can be a replica. Peer certificates are issued to
/// replicas only. (Either field: some issuers, Helm's among them, set only the CN.)
pub const PEER_ORGANIZATION: &str = "gangway:peers";
/// The identity name of tokens from `--auth-tokens-file` (no policy name has a `:`).
pub const TOKENS_FILE_IDENTITY: &str = "tokens:admin";
/// The prefix of the name of an administrator known by its certificate alone.
pub const CERT_OWNER_PREFIX: &str = "cert:";

/// Who called, as the gate found it.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The replica requires no credentials: every caller may do everything.
    Open,
    /// A replica of this cluster.
    Peer,
    /// A known identity.
    Known(Arc<Identity>),
    /// A bearer token for the Kubernetes API to review (TokenReview).
    Unreviewed(Arc<str>),
}

/// What a replica's gRPC port accepts as credentials.
pub struct Credentials {
    /// Whether the port speaks mutual TLS (a client certificate is then required).
    pub tls: bool,
    /// With TLS: whether a caller sending a bearer token may come without a client
    /// certificate.
    pub client_certs_optional: bool,
    /// Administrator tokens (`--auth-tokens-file`).
    pub tokens: Option<Arc<Tokens>>,
    /// The access policy (`--policy-file`).
    pub policy: Option<Arc<PolicyFile>>,
    /// Whether unknown bearer tokens go to the Kubernetes API (`--kube-auth`).
    pub kube_review: bool,
    /// The peer secrets proofs are checked against.
    pub peer_secret: Arc<Tokens>,
    /// This replica's cluster.
    pub cluster_id: String,
    /// This replica's node id (proofs are made for it).
    pub node_id: NodeId,
    /// First rollout of an upgrade only: the secret itself, as the release before sends
    /// it (`x-gangway-peer-secret`), also makes a peer, and with TLS any certificate the
    /// CA signed will do (that release's replicas have no peer certificate).
    pub accept_legacy_secret: bool,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls)
            .field("client_certs_optional", &self.client_certs_optional)
            .field("tokens", &self.tokens.is_some())
            .field("policy", &self.policy.is_some())
            .field("kube_review", &self.kube_review)
            .field("node_id", &self.node_id)
            .finish()
    }
}

/// What a client certificate says about its holder.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CertSubject {
    /// Subject common names.
    pub common_names: Vec<String>,
    /// Subject organizations.
    pub organizations: Vec<String>,
}

impl CertSubject {
    /// Reads the subject of a DER certificate (empty if it does not parse).
    pub fn of(der: &[u8]) -> Self {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Self::default();
        };
        let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            attr.as_str().ok().map(str::to_string)
        };
        Self {
            common_names: cert.subject().iter_common_name().filter_map(text).collect(),
            organizations: cert
                .subject()
                .iter_organization()
                .filter_map(text)
                .collect(),
        }
    }

    /// Whether it is a peer certificate.
    pub fn is_peer(&self) -> bool {
        self.organizations
            .iter()
            .chain(&self.common_names)
            .any(|o| o == PEER_ORGANIZATION)
    }
}

fn leaf_subject(certs: Option<Arc<Vec<CertificateDer<'static>>>>) -> Option<CertSubject> {
    let certs = certs?;
    certs.first().map(|leaf| CertSubject::of(leaf.as_ref()))
}

/// The bearer token of a request, if it sends one.
pub fn bearer(metadata: &MetadataMap) -> Result<Option<&str>, Status> {
    let Some(value) = metadata.get("authorization") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(Some)
        .ok_or_else(|| Status::unauthenticated("authorization header is not `Bearer <token>`"))
}

impl Credentials {
    /// Whether the replica requires no credentials at all.
    pub fn is_open(&self) -> bool {
        !self.tls && self.tokens.is_none() && self.policy.is_none() && !self.kube_review
    }

    /// Whether `metadata` carries the secret itself, as the release before sent it.
    fn legacy_secret(&self, metadata: &MetadataMap) -> bool {
        metadata
            .get(gangway_raft::LEGACY_PEER_SECRET_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|s| self.peer_secret.accepts(s))
    }

    /// Whether `metadata` carries a proof made for this replica: `None` without one.
    fn peer_proof(&self, metadata: &MetadataMap) -> Option<bool> {
        let proof = metadata.get(PEER_PROOF_HEADER)?.to_str().ok()?;
        let secrets = self.peer_secret.secrets();
        Some(proof_accepted(
            proof,
            secrets.iter().map(String::as_str),
            &self.cluster_id,
            self.node_id,
        ))
    }

    /// The caller of a request with `metadata` over a connection that presented `certs`.
    pub fn caller(
        &self,
        metadata: &MetadataMap,
        certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    ) -> Result<Caller, Status> {
        let subject = leaf_subject(certs);
        if self.accept_legacy_secret
            && (!self.tls || subject.is_some())
            && self.legacy_secret(metadata)
        {
            return Ok(Caller::Peer);
        }
        match self.peer_proof(metadata) {
            Some(true) if !self.tls || subject.as_ref().is_some_and(CertSubject::is_peer) => {
                return Ok(Caller::Peer)
            }
            Some(true) => {
                return Err(Status::unauthenticated(format!(
                                        "a peer proof needs a peer certificate (subject O or CN {PEER_ORGANIZATION}) \
                     on this mutual-TLS cluster"
                )))
            }
            Some(false) => {
                return Err(Status::unauthenticated(
                    "peer proof not accepted: check that every replica has the same --peer-secret-file and --cluster-id",
                ))
            }
            None => {}
        }
        if self.is_open() {
            return Ok(Caller::Open);
        }
        let token = bearer(metadata)?;
        if self.tls && subject.is_none() && !(self.client_certs_optional && token.is_some()) {
            return Err(Status::unauthenticated(
                "client certificate required: this cluster uses mutual TLS; present a certificate \
                 signed by its CA (gangctl --tls-cert/--tls-key)",
            ));
        }
        if let Some(token) = token {
            return self.by_token(token);
        }
        let policy = self.policy.as_ref().map(|p| p.current());
        match (subject, policy) {
            (Some(subject), Some(policy)) => subject
                .common_names
                .iter()
                .find_map(|cn| policy.by_subject(cn))
                .map(Caller::Known)
                .ok_or_else(|| {
                    Status::unauthenticated(format!(
                        "client certificate CN={} is not in the access policy; ask an administrator \
                         to add it (or send a bearer token)",
                        subject.common_names.first().map_or("(none)", String::as_str)
                    ))
                }),
            (Some(subject), None) if self.tokens.is_none() && !self.kube_review => {
                let cn = subject.common_names.first().map_or("", String::as_str);
                let name = format!("{CERT_OWNER_PREFIX}{cn}");
                Ok(Caller::Known(Arc::new(Identity::admin(&name))))
            }
            _ => Err(Status::unauthenticated(
                "missing bearer token: send `authorization: Bearer <token>` (gangctl --token or GANGWAY_TOKEN)",
            )),
        }
    }

    /// The caller a bearer token alone stands for (the web view's sign-in).
    pub fn token_caller(&self, token: &str) -> Result<Caller, Status> {
        self.by_token(token)
    }

    /// The identity a bearer token whose SHA-256 is `d` stands for now, from the tokens
    /// file or the policy in force (the web view's sessions, checked again each request:
    /// a token withdrawn from its file ends them).
    pub fn identity_by_digest(&self, d: &[u8; 32]) -> Option<Arc<Identity>> {
        if self.tokens.as_ref().is_some_and(|t| t.accepts_digest(d)) {
            return Some(Arc::new(Identity::admin(TOKENS_FILE_IDENTITY)));
        }
        self.policy
            .as_ref()
            .and_then(|p| p.current().by_token_digest(d))
    }

    fn by_token(&self, token: &str) -> Result<Caller, Status> {
        if self.tokens.as_ref().is_some_and(|t| t.accepts(token)) {
            return Ok(Caller::Known(Arc::new(Identity::admin(
                TOKENS_FILE_IDENTITY,
            ))));
        }
        if let Some(identity) = self
            .policy
            .as_ref()
            .and_then(|p| p.current().by_token(token))
        {
            return Ok(Caller::Known(identity));
        }
        if self.kube_review {
            return Ok(Caller::Unreviewed(Arc::from(token)));
        }
        Err(Status::unauthenticated("bearer token not accepted"))
    }
}

/// The interceptor of the client services (Scheduler, Inventory, Admin, Queues,
/// Shards): authenticates and records the [`Caller`].
#[derive(Clone)]
pub struct ClientGate(pub Arc<Credentials>);

impl Interceptor for ClientGate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.0.caller(req.metadata(), req.peer_certs())?;
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// The Raft transport's interceptor: replicas only (a peer proof, and with mutual TLS a
/// peer certificate); no client credential passes.
#[derive(Clone)]
pub struct PeerGate {
    /// What is checked.
    pub credentials: Arc<Credentials>,
    /// Bug switch (tests only): check like the client services instead.
    pub open_to_clients: bool,
}

impl Interceptor for PeerGate {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let caller = self
            .credentials
            .caller(req.metadata(), req.peer_certs())
            .map_err(|s| {
                Status::unauthenticated(format!(
                    "the Raft transport serves replicas of this cluster only: {}",
                    s.message()
                ))
            })?;
        match caller {
            Caller::Peer => Ok(req),
            _ if self.open_to_clients => Ok(req),
            _ => Err(Status::unauthenticated(
                "the Raft transport serves replicas of this cluster only; clients use the \
                 Scheduler, Inventory and Admin services",
            )),
        }
    }
}
