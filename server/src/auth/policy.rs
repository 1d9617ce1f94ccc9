//! The access policy file (`--policy-file`): the identities a cluster without
//! Kubernetes knows, how each is recognised (bearer tokens, client certificate
//! subjects) and what each may do (roles, and a tenant's or node's grants). Parsed and
//! validated as a whole, every error naming the field (`identities[2].tenant.queues[0]`);
//! a file that fails keeps the last good policy in force. Pure apart from reading the
//! file; used by `auth::access` and the gates.
//!
//! ```yaml
//! identities:
//!   - name: ops
//!     roles: [admin]
//!     tokens: ["sha256:<hex of the token's SHA-256>"]
//!   - name: team-a
//!     roles: [tenant]
//!     certificates: [team-a]          # client certificate subject CNs
//!     tenant:
//!       namespaces: [team-a]
//!       queues: [team-a]              # and the queues under them
//!       defaultQueue: team-a
//!       maxPriority: 100
//!   - name: node-7
//!     roles: [node]
//!     tokens: ["a-long-random-token-for-node-7"]
//!     nodes: [node-7]
//!   - name: dashboards
//!     roles: [viewer]
//!     tokens: ["sha256:..."]
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use gangway_core::model::names::is_dns_label;

/// Most identities one policy may name.
pub const POLICY_IDENTITIES_MAX: usize = 10_000;
/// Longest identity name, in bytes.
pub const IDENTITY_NAME_BYTES_MAX: usize = 253;
/// Fewest characters of a token written in the policy as itself.
pub const POLICY_TOKEN_CHARS_MIN: usize = 16;
/// Largest policy file read, in bytes.
pub const POLICY_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Live (not ended) gang groups one identity may have at once, unless its policy says otherwise.
pub const LIVE_GROUPS_PER_IDENTITY_DEFAULT: u32 = 10_000;
/// Most live gang groups a policy may allow one identity.
pub const LIVE_GROUPS_PER_IDENTITY_MAX: u32 = 1_000_000;
/// The prefix of a token written as the hex of its SHA-256.
pub const TOKEN_DIGEST_PREFIX: &str = "sha256:";
/// Written in a list of namespaces or queues: every one.
pub const ANY: &str = "*";

/// What an identity may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything: membership, shards, queues, compaction, every group and node.
    Admin,
    /// Its own gang groups, in the namespaces and queues it is granted, up to its priority.
    Tenant,
    /// Inventory (registration, heartbeats, devices, allocations) for its own nodes.
    Node,
    /// Reads: every group, queue, node and the cluster's status.
    Viewer,
}

impl Role {
    /// The role's name as the policy writes it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Tenant => "tenant",
            Role::Node => "node",
            Role::Viewer => "viewer",
        }
    }
}

/// Names granted: every one, or these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// `*`.
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl Grant {
    /// Whether `name` is granted.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Grant::All => true,
            Grant::Only(names) => names.contains(name),
        }
    }
}

/// What a tenant may do besides owning its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantGrant {
    /// Namespaces its gangs may be declared in.
    pub namespaces: Grant,
    /// Queues it may charge (and every queue under one of them).
    pub queues: Grant,
    /// The queue a submission that names none is charged to (none: such a submission
    /// is refused; a tenant never runs outside quota).
    pub default_queue: Option<String>,
    /// The highest gang (and pod) priority it may submit.
    pub max_priority: i32,
    /// Whether its gangs may preempt gangs outside their own queue's subtree.
    pub preempt_across_queues: bool,
    /// Live gang groups it may have at once.
    pub live_groups_max: u32,
}

/// An identity of the policy (or one the gates make: the tokens file's, Kubernetes').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its name: the owner recorded on its groups.
    pub name: String,
    /// Its roles.
    pub roles: BTreeSet<Role>,
    /// With the tenant role: its grant.
    pub tenant: Option<TenantGrant>,
    /// With the node role: the nodes it speaks for.
    pub nodes: BTreeSet<String>,
}

impl Identity {
    /// An administrator named `name` (the tokens file's, and certificates without a policy).
    pub fn admin(name: &str) -> Self {
        Self {
            name: name.to_string(),
            roles: BTreeSet::from([Role::Admin]),
            tenant: None,
            nodes: BTreeSet::new(),
        }
    }

    /// Whether it holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

/// A policy that cannot be used, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--policy-file {file}: {detail}")]
pub struct PolicyError {
    /// The file.
    pub file: String,
    /// `field: what is wrong`, or the parser's message.
    pub detail: String,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDoc {
    #[serde(default)]
    identities: Vec<IdentityDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityDoc {
    name: String,
    #[serde(default)]
    roles: Vec<Role>,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    certificates: Vec<String>,
    #[serde(default)]
    tenant: Option<TenantDoc>,
    #[serde(default)]
    nodes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TenantDoc {
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    queues: Vec<String>,
    #[serde(default)]
    default_queue: Option<String>,
    #[serde(default)]
    max_priority: i32,
    #[serde(default)]
    preempt_across_queues: bool,
    #[serde(default)]
    live_groups_max: Option<u32>,
}

/// A validated policy: identities by token digest and by certificate subject.
#[derive(Debug, Default)]
pub struct Policy {
    identities: Vec<Arc<Identity>>,
    by_token: HashMap<[u8; 32], usize>,
    by_subject: HashMap<String, usize>,
}

/// SHA-256 of a token: how tokens are kept and compared.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn field_error(field: &str, what: impl std::fmt::Display) -> String {
    format!("{field}: {what}")
}

fn grant(field: &str, names: &[String]) -> Result<Grant, String> {
    if names.iter().any(|n| n == ANY) {
        if names.len() > 1 {
            return Err(field_error(
                field,
                "\"*\" grants every name; list nothing beside it",
            ));
        }
        return Ok(Grant::All);
    }
    for (i, n) in names.iter().enumerate() {
        if !is_dns_label(n) {
            return Err(field_error(
                &format!("{field}[{i}]"),
                format!("{n:?} is not a DNS-1123 label (or \"*\")"),
            ));
        }
    }
    Ok(Grant::Only(names.iter().cloned().collect()))
}

fn token_key(field: &str, token: &str) -> Result<[u8; 32], String> {
    if let Some(hex_digest) = token.strip_prefix(TOKEN_DIGEST_PREFIX) {
        let bytes = hex::decode(hex_digest).map_err(|_| {
            field_error(
                field,
                "after \"sha256:\" comes the 64 hex digits of the token's SHA-256",
            )
        })?;
        return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
            field_error(
                field,
                "after \"sha256:\" comes the 64 hex digits of the token's SHA-256",
            )
        });
    }
    if token.chars().count() < POLICY_TOKEN_CHARS_MIN
        || token.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(field_error(
            field,
            format!(
                "a token is at least {POLICY_TOKEN_CHARS_MIN} characters without whitespace \
                 (or \"sha256:\" and the hex of its SHA-256)"
            ),
        ));
    }
    Ok(token_digest(token))
}

fn tenant_grant(field: &str, doc: &TenantDoc) -> Result<TenantGrant, String> {
    let namespaces = grant(&format!("{field}.namespaces"), &doc.namespaces)?;
    let queues = grant(&format!("{field}.queues"), &doc.queues)?;
    if let Some(q) = &doc.default_queue {
        if !is_dns_label(q) {
            return Err(field_error(
                &format!("{field}.defaultQueue"),
                format!("{q:?} is not a DNS-1123 label"),
            ));
        }
        if !queues.allows(q) {
            return Err(field_error(
                &format!("{field}.defaultQueue"),
                format!("{q:?} is not among the tenant's queues"),
            ));
        }
    }
    let live_groups_max = doc
        .live_groups_max
        .unwrap_or(LIVE_GROUPS_PER_IDENTITY_DEFAULT);
    if !(1..=LIVE_GROUPS_PER_IDENTITY_MAX).contains(&live_groups_max) {
        return Err(field_error(
            &format!("{field}.liveGroupsMax"),
            format!("{live_groups_max} is not in 1..={LIVE_GROUPS_PER_IDENTITY_MAX}"),
        ));
    }
    Ok(TenantGrant {
        namespaces,
        queues,
        default_queue: doc.default_queue.clone(),
        max_priority: doc.max_priority,
        preempt_across_queues: doc.preempt_across_queues,
        live_groups_max,
    })
}

fn identity(at: &str, doc: &IdentityDoc) -> Result<Identity, String> {
    let name = &doc.name;
    if name.is_empty()
        || name.len() > IDENTITY_NAME_BYTES_MAX
        || name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == ':')
    {
        return Err(field_error(
            &format!("{at}.name"),
            format!(
                "{name:?}: a name is 1..={IDENTITY_NAME_BYTES_MAX} bytes without whitespace, control \
                 characters or ':' (names with ':' are gangway's own: kube:..., cert:..., tokens:admin)"
            ),
        ));
    }
    if doc.roles.is_empty() {
        return Err(field_error(
            &format!("{at}.roles"),
            "name at least one of admin, tenant, node, viewer",
        ));
    }
    let roles: BTreeSet<Role> = doc.roles.iter().copied().collect();
    if doc.tokens.is_empty() && doc.certificates.is_empty() {
        return Err(field_error(
            at,
            "no way to recognise it: give tokens or certificates",
        ));
    }
    let tenant = match (&doc.tenant, roles.contains(&Role::Tenant)) {
        (Some(t), true) => Some(tenant_grant(&format!("{at}.tenant"), t)?),
        (None, true) => {
            return Err(field_error(
                &format!("{at}.tenant"),
                "the tenant role needs its grant (namespaces, queues, maxPriority)",
            ))
        }
        (Some(_), false) => {
            return Err(field_error(
                &format!("{at}.tenant"),
                "only an identity with the tenant role has a tenant grant",
            ))
        }
        (None, false) => None,
    };
    if roles.contains(&Role::Node) == doc.nodes.is_empty() {
        return Err(field_error(
            &format!("{at}.nodes"),
            if doc.nodes.is_empty() {
                "the node role needs the node names it speaks for"
            } else {
                "only an identity with the node role lists nodes"
            },
        ));
    }
    for (i, n) in doc.nodes.iter().enumerate() {
        if !gangway_core::model::names::is_dns_subdomain(n) {
            return Err(field_error(
                &format!("{at}.nodes[{i}]"),
                format!("{n:?} is not a DNS-1123 subdomain"),
            ));
        }
    }
    Ok(Identity {
        name: name.clone(),
        roles,
        tenant,
        nodes: doc.nodes.iter().cloned().collect(),
    })
}

impl Policy {
    /// Parses and validates a policy document (`file` names it in errors).
    pub fn parse(file: &str, text: &str) -> Result<Self, PolicyError> {
        let err = |detail: String| PolicyError {
            file: file.to_string(),
            detail,
        };
        let doc: PolicyDoc = serde_saphyr::from_str(text).map_err(|e| err(e.to_string()))?;
        if doc.identities.len() > POLICY_IDENTITIES_MAX {
            return Err(err(field_error(
                "identities",
                format!("more than {POLICY_IDENTITIES_MAX}"),
            )));
        }
        let mut policy = Policy::default();
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, doc) in doc.identities.iter().enumerate() {
            let at = format!("identities[{i}]");
            let identity = identity(&at, doc).map_err(err)?;
            if let Some(first) = names.insert(&doc.name, i) {
                return Err(err(field_error(
                    &format!("{at}.name"),
                    format!("{:?} is also identities[{first}]", doc.name),
                )));
            }
            for (j, token) in doc.tokens.iter().enumerate() {
                let field = format!("{at}.tokens[{j}]");
                let key = token_key(&field, token).map_err(err)?;
                if let Some(other) = policy.by_token.insert(key, i) {
                    return Err(err(field_error(
                        &field,
                        format!("the same token as identities[{other}]"),
                    )));
                }
            }
            for (j, subject) in doc.certificates.iter().enumerate() {
                let field = format!("{at}.certificates[{j}]");
                if subject.is_empty() || subject.chars().any(char::is_control) {
                    return Err(err(field_error(
                        &field,
                        "a certificate subject CN, not empty",
                    )));
                }
                if let Some(other) = policy.by_subject.insert(subject.clone(), i) {
                    return Err(err(field_error(
                        &field,
                        format!("the same subject as identities[{other}]"),
                    )));
                }
            }
            policy.identities.push(Arc::new(identity));
        }
        Ok(policy)
    }

    /// The identity a bearer token stands for.
    pub fn by_token(&self, token: &str) -> Option<Arc<Identity>> {
        let i = self.by_token.get(&token_digest(token))?;
        self.identities.get(*i).cloned()
    }

    /// The identity a bearer token whose SHA-256 is `d` stands for.
    pub fn by_token_digest(&self, d: &[u8; 32]) -> Option<Arc<Identity>> {
        let i = self.by_token.get(d)?;
        self.identities.get(*i).cloned()
    }

    /// The identity a client certificate's subject CN stands for.
    pub fn by_subject(&self, cn: &str) -> Option<Arc<Identity>> {
        let i = self.by_subject.get(cn)?;
        self.identities.get(*i).cloned()
    }

    /// How many identities it names.
    pub fn len(&self) -> usize {
        self.identities.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.identities.is_empty()
    }
}

/// The policy in force, re-read when its file changes (a broken file keeps the last good one).
pub struct PolicyFile {
    path: PathBuf,
    current: RwLock<Arc<Policy>>,
    loaded: RwLock<Option<SystemTime>>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_policy(path: &Path) -> Result<Policy, PolicyError> {
    let file = path.display().to_string();
    let size = std::fs::metadata(path)
        .map_err(|e| PolicyError {
            file: file.clone(),
            detail: e.to_string(),
        })?
        .len();
    if size > POLICY_FILE_BYTES_MAX {
        return Err(PolicyError {
            file,
            detail: format!("{size} bytes, more than {POLICY_FILE_BYTES_MAX}"),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
        file: file.clone(),
        detail: e.to_string(),
    })?;
    Policy::parse(&file, &text)
}

impl PolicyFile {
    /// Loads and validates `path`.
    pub fn load(path: PathBuf) -> Result<Arc<Self>, PolicyError> {
        let policy = read_policy(&path)?;
        let loaded = modified(&path);
        Ok(Arc::new(Self {
            path,
            current: RwLock::new(Arc::new(policy)),
            loaded: RwLock::new(loaded),
        }))
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<Policy> {
        match self.current.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads the file if it changed; a failure keeps the policy in force.
    pub fn reload_if_changed(&self) {
        let now = modified(&self.path);
        let before = self.loaded.read().map(|l| *l).unwrap_or(None);
        if now == before {
            return;
        }
        match read_policy(&self.path) {
            Ok(policy) => {
                let count = policy.len();
                if let Ok(mut c) = self.current.write() {
                    *c = Arc::new(policy);
                }
                if let Ok(mut l) = self.loaded.write() {
                    *l = now;
                }
                tracing::info!(identities = count, "access policy reloaded");
            }
            Err(e) => {
                // Mark this version seen: the warning is not repeated every check.
                if let Ok(mut l) = self.loaded.write() {
                    *l = now;
                }
                tracing::warn!(error = %e, "the access policy changed but cannot be used; keeping the previous one")
            }
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
