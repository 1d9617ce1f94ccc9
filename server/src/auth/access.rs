//! Authorization: what each RPC asks for ([`RPCS`]: a verb on a resource of API group
//! `gangway.dev`, as Kubernetes RBAC names them), who may ask it, and the object rules
//! the services apply once they have read a request (a group's owner and namespaces, a
//! tenant's queues and priority, a node agent's own nodes).
//!
//! Two authorities decide: the policy's roles (`admin`, `tenant`, `node`, `viewer`;
//! [`policy_allows`], pure) and, with `--kube-auth`, the Kubernetes API
//! (SubjectAccessReview, through a [`Reviewer`]). Every refusal is PERMISSION_DENIED
//! naming the identity, verb and resource; a request without an identity never gets
//! here (the gate answers UNAUTHENTICATED). Called by every service at the start of
//! every RPC ([`Access::begin`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tonic::{Request, Status};

use crate::auth::gate::Caller;
use crate::auth::policy::{Identity, Role};

/// Verbs, as Kubernetes RBAC names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// Read one object.
    Get,
    /// Read every object.
    List,
    /// Follow an object's changes.
    Watch,
    /// Make an object.
    Create,
    /// Change an object (release a group, register a node, change membership).
    Update,
    /// End an object (cancel a group, delete a queue).
    Delete,
    /// Charge a queue, or submit at a priority (`resourceNames`: the queue, the priority).
    Use,
    /// Preempt gangs outside the preemptor's own queue subtree.
    Preempt,
}

impl Verb {
    /// The verb's RBAC name.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
            Verb::Use => "use",
            Verb::Preempt => "preempt",
        }
    }

    /// Whether it only reads.
    pub fn reads(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

/// Resources of API group [`API_GROUP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// Gang groups (namespaced by their gangs' namespaces).
    GangGroups,
    /// Queues (cluster-wide).
    Queues,
    /// Priorities a gang may be submitted at (`resourceNames`: the value, in decimal).
    Priorities,
    /// Nodes and their devices (`resourceNames`: the node).
    Nodes,
    /// The cluster: status, membership, leadership, shards, compaction.
    Cluster,
}

impl Resource {
    /// The resource's RBAC name.
    pub fn name(self) -> &'static str {
        match self {
            Resource::GangGroups => "ganggroups",
            Resource::Queues => "queues",
            Resource::Priorities => "priorities",
            Resource::Nodes => "nodes",
            Resource::Cluster => "cluster",
        }
    }
}

/// The API group gangway's resources belong to (RBAC rules name it).
pub const API_GROUP: &str = "gangway.dev";

/// One RPC: its method and what it asks for before its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// `Service/Method`.
    pub method: &'static str,
    /// The verb.
    pub verb: Verb,
    /// The resource.
    pub resource: Resource,
}

const fn rpc(method: &'static str, verb: Verb, resource: Resource) -> Rpc {
    Rpc {
        method,
        verb,
        resource,
    }
}

/// Scheduler.SubmitGangGroup.
pub const SUBMIT: Rpc = rpc(
    "Scheduler/SubmitGangGroup",
    Verb::Create,
    Resource::GangGroups,
);
/// Scheduler.GetGangGroup.
pub const GET_GROUP: Rpc = rpc("Scheduler/GetGangGroup", Verb::Get, Resource::GangGroups);
/// Scheduler.WatchGangGroup.
pub const WATCH_GROUP: Rpc = rpc(
    "Scheduler/WatchGangGroup",
    Verb::Watch,
    Resource::GangGroups,
);
/// Scheduler.WatchGangGroups.
pub const WATCH_GROUPS: Rpc = rpc(
    "Scheduler/WatchGangGroups",
    Verb::Watch,
    Resource::GangGroups,
);
/// Scheduler.CancelGangGroup.
pub const CANCEL_GROUP: Rpc = rpc(
    "Scheduler/CancelGangGroup",
    Verb::Delete,
    Resource::GangGroups,
);
/// Scheduler.ReleaseGangGroup.
pub const RELEASE_GROUP: Rpc = rpc(
    "Scheduler/ReleaseGangGroup",
    Verb::Update,
    Resource::GangGroups,
);
/// Scheduler.ReleaseMembers.
pub const RELEASE_MEMBERS: Rpc = rpc(
    "Scheduler/ReleaseMembers",
    Verb::Update,
    Resource::GangGroups,
);
/// Scheduler.ListGangGroups.
pub const LIST_GROUPS: Rpc = rpc("Scheduler/ListGangGroups", Verb::List, Resource::GangGroups);
/// Scheduler.ListShards.
pub const LIST_SHARDS: Rpc = rpc("Scheduler/ListShards", Verb::Get, Resource::Cluster);
/// Inventory.RegisterNode.
pub const REGISTER_NODE: Rpc = rpc("Inventory/RegisterNode", Verb::Update, Resource::Nodes);
/// Inventory.GetNode.
pub const GET_NODE: Rpc = rpc("Inventory/GetNode", Verb::Get, Resource::Nodes);
/// Inventory.ListNodes.
pub const LIST_NODES: Rpc = rpc("Inventory/ListNodes", Verb::List, Resource::Nodes);
/// Inventory.Heartbeat.
pub const HEARTBEAT: Rpc = rpc("Inventory/Heartbeat", Verb::Update, Resource::Nodes);
/// Inventory.ListAndWatchDevices.
pub const DEVICES: Rpc = rpc(
    "Inventory/ListAndWatchDevices",
    Verb::Update,
    Resource::Nodes,
);
/// Inventory.ReportAllocation.
pub const REPORT_ALLOCATION: Rpc = rpc("Inventory/ReportAllocation", Verb::Update, Resource::Nodes);
/// Admin.Status.
pub const STATUS: Rpc = rpc("Admin/Status", Verb::Get, Resource::Cluster);
/// Admin.AddLearner.
pub const ADD_LEARNER: Rpc = rpc("Admin/AddLearner", Verb::Update, Resource::Cluster);
/// Admin.ChangeMembership.
pub const CHANGE_MEMBERSHIP: Rpc = rpc("Admin/ChangeMembership", Verb::Update, Resource::Cluster);
/// Admin.TransferLeader.
pub const TRANSFER_LEADER: Rpc = rpc("Admin/TransferLeader", Verb::Update, Resource::Cluster);
/// Admin.Balance.
pub const BALANCE: Rpc = rpc("Admin/Balance", Verb::Update, Resource::Cluster);
/// Admin.Compact.
pub const COMPACT: Rpc = rpc("Admin/Compact", Verb::Update, Resource::Cluster);
/// Queues.PutQueue.
pub const PUT_QUEUE: Rpc = rpc("Queues/PutQueue", Verb::Update, Resource::Queues);
/// Queues.DeleteQueue.
pub const DELETE_QUEUE: Rpc = rpc("Queues/DeleteQueue", Verb::Delete, Resource::Queues);
/// Queues.ListQueues.
pub const LIST_QUEUES: Rpc = rpc("Queues/ListQueues", Verb::List, Resource::Queues);
/// Shards.MoveNodes.
pub const MOVE_NODES: Rpc = rpc("Shards/MoveNodes", Verb::Update, Resource::Cluster);
/// Shards.Rebalance.
pub const REBALANCE: Rpc = rpc("Shards/Rebalance", Verb::Update, Resource::Cluster);
/// Shards.ListMoves.
pub const LIST_MOVES: Rpc = rpc("Shards/ListMoves", Verb::Get, Resource::Cluster);
/// Shards.ListReservations.
pub const LIST_RESERVATIONS: Rpc = rpc("Shards/ListReservations", Verb::Get, Resource::Cluster);
/// Shards.GrowShards.
pub const GROW_SHARDS: Rpc = rpc("Shards/GrowShards", Verb::Update, Resource::Cluster);

/// Admin.Status with `include_state_hash`: administrators only (subresource `statehash`).
pub const STATE_HASHES: Rpc = rpc("Admin/Status+stateHash", Verb::Get, Resource::Cluster);

/// Every client RPC (the Raft transport serves replicas only and is not here), and the
/// state hashes of Admin.Status as one more.
pub const RPCS: [Rpc; 30] = [
    SUBMIT,
    GET_GROUP,
    WATCH_GROUP,
    WATCH_GROUPS,
    CANCEL_GROUP,
    RELEASE_GROUP,
    RELEASE_MEMBERS,
    LIST_GROUPS,
    LIST_SHARDS,
    REGISTER_NODE,
    GET_NODE,
    LIST_NODES,
    HEARTBEAT,
    DEVICES,
    REPORT_ALLOCATION,
    STATUS,
    ADD_LEARNER,
    CHANGE_MEMBERSHIP,
    TRANSFER_LEADER,
    BALANCE,
    COMPACT,
    PUT_QUEUE,
    DELETE_QUEUE,
    LIST_QUEUES,
    MOVE_NODES,
    REBALANCE,
    LIST_MOVES,
    LIST_RESERVATIONS,
    GROW_SHARDS,
    STATE_HASHES,
];

/// What is asked, in the words an authority decides on: a verb on a resource, in a
/// namespace, of a named object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ask {
    /// The verb.
    pub verb: Verb,
    /// The resource.
    pub resource: Resource,
    /// The namespace (gang groups), if known.
    pub namespace: Option<String>,
    /// The object's name (a node, a queue, a priority), if known.
    pub name: Option<String>,
    /// A subresource (`statehash` of `cluster`).
    pub subresource: Option<&'static str>,
}

impl Ask {
    /// The verb on the resource, nothing narrower.
    pub fn of(verb: Verb, resource: Resource) -> Self {
        Self {
            verb,
            resource,
            namespace: None,
            name: None,
            subresource: None,
        }
    }

    /// Narrowed to `namespace`.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Narrowed to the object `name`.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    fn describe(&self) -> String {
        let mut s = format!("{} {}", self.verb.name(), self.resource.name());
        if let Some(sub) = self.subresource {
            s.push('/');
            s.push_str(sub);
        }
        if let Some(n) = &self.name {
            s.push(' ');
            s.push_str(n);
        }
        if let Some(ns) = &self.namespace {
            s.push_str(" in namespace ");
            s.push_str(ns);
        }
        s
    }
}

/// A Kubernetes user, as TokenReview answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeUser {
    /// `user.username`.
    pub name: String,
    /// `user.uid`.
    pub uid: String,
    /// `user.groups`.
    pub groups: Vec<String>,
    /// `user.extra`.
    pub extra: BTreeMap<String, Vec<String>>,
    /// The name gangway records as the owner of its groups and counts its bounds by:
    /// [`KUBE_OWNER_PREFIX`] and the username (set by [`Access::resolve`]), so no policy
    /// identity can share it.
    pub owner: String,
}

/// The prefix of a Kubernetes user's owner name.
pub const KUBE_OWNER_PREFIX: &str = "kube:";

/// Who is asking, once known.
#[derive(Debug, Clone)]
pub enum Principal {
    /// A replica that requires no credentials: anything goes.
    Open,
    /// A replica of this cluster.
    Peer,
    /// An identity of the policy (or the tokens file, or a certificate without a policy).
    Policy(Arc<Identity>),
    /// A Kubernetes user (the Kubernetes API decides).
    Kube(Arc<KubeUser>),
}

impl Principal {
    /// Its name: the owner recorded on its groups (empty for the open and peer callers).
    pub fn name(&self) -> &str {
        match self {
            Principal::Open | Principal::Peer => "",
            Principal::Policy(i) => &i.name,
            Principal::Kube(u) => &u.owner,
        }
    }

    /// The identity, for the policy's grants.
    pub fn identity(&self) -> Option<&Identity> {
        match self {
            Principal::Policy(i) => Some(i),
            _ => None,
        }
    }

    /// Whether it is an administrator without asking (open, peer, policy admin).
    pub fn is_admin(&self) -> bool {
        match self {
            Principal::Open | Principal::Peer => true,
            Principal::Policy(i) => i.has(Role::Admin),
            Principal::Kube(_) => false,
        }
    }
}

/// Why the Kubernetes API could not answer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the Kubernetes API could not review the request: {0}")]
pub struct ReviewError(pub String);

/// The Kubernetes API as an authority: TokenReview and SubjectAccessReview (cached
/// with a bound by the implementation, `auth::kube`).
#[tonic::async_trait]
pub trait Reviewer: Send + Sync {
    /// The user a bearer token stands for (`None`: not authenticated).
    async fn review_token(&self, token: &str) -> Result<Option<KubeUser>, ReviewError>;
    /// Whether `user` may do what `ask` says (RBAC rules in API group [`API_GROUP`]).
    async fn allowed(&self, user: &KubeUser, ask: &Ask) -> Result<bool, ReviewError>;
}

/// Whether the policy identity `who` may do `ask` (the role rules, pure).
///
/// - `admin`: everything.
/// - `viewer`: get, list and watch of everything (state hashes excepted).
/// - `tenant`: gang groups in its namespaces (its own ones: the services check the owner),
///   listing queues, using its queues (and those under them: the services walk the
///   parents), priorities up to its maximum.
/// - `node`: get and update of its own nodes.
pub fn policy_allows(who: &Identity, ask: &Ask) -> bool {
    if who.has(Role::Admin) {
        return true;
    }
    if who.has(Role::Viewer) && ask.verb.reads() && ask.subresource.is_none() {
        return true;
    }
    if let (true, Some(t)) = (who.has(Role::Tenant), &who.tenant) {
        let allowed = match (ask.resource, ask.verb) {
            (Resource::GangGroups, v) if v != Verb::Use && v != Verb::Preempt => ask
                .namespace
                .as_deref()
                .is_none_or(|ns| t.namespaces.allows(ns)),
            (Resource::Queues, Verb::List | Verb::Get) => true,
            (Resource::Queues, Verb::Use) => {
                ask.name.as_deref().is_some_and(|q| t.queues.allows(q))
            }
            (Resource::Queues, Verb::Preempt) => t.preempt_across_queues,
            (Resource::Priorities, Verb::Use) => ask
                .name
                .as_deref()
                .and_then(|p| p.parse::<i32>().ok())
                .is_some_and(|p| p <= t.max_priority),
            _ => false,
        };
        if allowed {
            return true;
        }
    }
    if who.has(Role::Node) && ask.resource == Resource::Nodes {
        return matches!(ask.verb, Verb::Get | Verb::Update | Verb::Create)
            && ask.name.as_deref().is_none_or(|n| who.nodes.contains(n));
    }
    false
}

/// In-flight requests one identity may have on one replica.
pub const REQUESTS_IN_FLIGHT_PER_IDENTITY_MAX: u32 = 1_024;
/// Refusals (PERMISSION_DENIED, and the refusals of malformed or over-the-bound requests
/// the services count) one identity may earn per second on one replica before its
/// requests are slowed.
pub const DENIALS_PER_IDENTITY_PER_S: u32 = 20;
/// How long each request of an identity past [`DENIALS_PER_IDENTITY_PER_S`] waits before
/// it is looked at, in ms: a caller that keeps asking for what it may not have cannot
/// spend the replica's CPU at the rate it could ask.
pub const DENIED_CALLER_DELAY_MS: u64 = 250;
/// Identities whose recent refusals are remembered at once (the oldest window goes first).
pub const DENIAL_COUNTERS_MAX: usize = 10_000;
/// In-flight requests of an identity that is being slowed.
pub const PENALIZED_IN_FLIGHT_MAX: u32 = 4;
/// Bearer tokens the Kubernetes API refused that one client address may send per second
/// before its next unreviewed tokens wait [`DENIED_CALLER_DELAY_MS`] (each costs a
/// TokenReview).
pub const REFUSED_TOKENS_PER_ADDRESS_PER_S: u32 = 20;

/// Authorization as the services use it.
#[derive(Clone, Default)]
pub struct Access {
    reviewer: Option<Arc<dyn Reviewer>>,
    in_flight: Arc<Mutex<BTreeMap<String, u32>>>,
    /// Bug switch `access-allows-every-caller` only: every known caller may do anything.
    allow_all: bool,
    /// Identity -> (start of its one-second window, refusals in it).
    denials: Arc<Mutex<BTreeMap<String, (std::time::Instant, u32)>>>,
    /// Client address -> (start of its window, tokens the Kubernetes API refused in it),
    /// keyed like `denials`.
    refused_tokens: Arc<Mutex<BTreeMap<String, (std::time::Instant, u32)>>>,
}

/// Holds one in-flight request of an identity until dropped.
#[derive(Debug)]
pub struct InFlight {
    name: String,
    counts: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut c) = self.counts.lock() {
            if let Some(n) = c.get_mut(&self.name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.remove(&self.name);
                }
            }
        }
    }
}

/// A caller that passed an RPC's first check: who it is, holding its in-flight slot.
#[derive(Debug)]
pub struct Admitted {
    /// Who.
    pub principal: Principal,
    _slot: Option<InFlight>,
}

/// A window of events per key: (start of its one-second window, events in it).
type Windows = Mutex<BTreeMap<String, (std::time::Instant, u32)>>;

/// Counts one event of `key` in its one-second window (at most [`DENIAL_COUNTERS_MAX`]
/// keys: expired windows go first, then the oldest).
fn count(windows: &Windows, key: &str) {
    let Ok(mut windows) = windows.lock() else {
        return;
    };
    let now = std::time::Instant::now();
    let second = std::time::Duration::from_secs(1);
    if windows.len() >= DENIAL_COUNTERS_MAX && !windows.contains_key(key) {
        windows.retain(|_, (since, _)| now.saturating_duration_since(*since) < second);
        if windows.len() >= DENIAL_COUNTERS_MAX {
            if let Some(oldest) = windows
                .iter()
                .min_by_key(|(_, (since, _))| *since)
                .map(|(k, _)| k.clone())
            {
                windows.remove(&oldest);
            }
        }
    }
    let entry = windows.entry(key.to_string()).or_insert((now, 0));
    if now.saturating_duration_since(entry.0) >= second {
        *entry = (now, 0);
    }
    entry.1 = entry.1.saturating_add(1);
}

/// Whether `key` counted more than `max` events in its window (of the last two seconds).
fn over(windows: &Windows, key: &str, max: u32) -> bool {
    let Ok(windows) = windows.lock() else {
        return false;
    };
    windows
        .get(key)
        .is_some_and(|(since, n)| *n > max && since.elapsed() < std::time::Duration::from_secs(2))
}

/// What a caller is told when the Kubernetes API could not answer: the reason stays in
/// this replica's log (it may name gangway's own ServiceAccount and the API server).
fn review_failed(e: &ReviewError) -> Status {
    tracing::warn!(error = %e, "a Kubernetes review failed");
    Status::unavailable("the Kubernetes API could not review this request; retry")
}

fn denied(who: &Principal, ask: &Ask) -> Status {
    let name = match who {
        Principal::Open | Principal::Peer => "this caller",
        Principal::Policy(i) => &i.name,
        Principal::Kube(u) => &u.name,
    };
    Status::permission_denied(format!(
        "{name} may not {} (API group {API_GROUP})",
        ask.describe()
    ))
}

impl Access {
    /// Access decided by the policy alone (and the gate's open mode).
    pub fn policy_only() -> Self {
        Self::default()
    }

    /// Access that asks the Kubernetes API about Kubernetes users.
    pub fn with_reviewer(reviewer: Arc<dyn Reviewer>) -> Self {
        Self {
            reviewer: Some(reviewer),
            ..Self::default()
        }
    }

    /// Bug switch `access-allows-every-caller` (tests only): every authenticated caller
    /// is allowed everything, as before identities had roles.
    pub fn allowing_every_caller(mut self, on: bool) -> Self {
        self.allow_all = on;
        self
    }

    /// Who sent `request` (the gate's caller, a Kubernetes token reviewed).
    pub async fn principal<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        let caller = request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| {
                Status::internal("no caller recorded: this service is not behind its gate")
            })?;
        let from = request
            .remote_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        self.resolve_from(caller, &from).await
    }

    /// Who a caller the gate found is (a Kubernetes token reviewed).
    pub async fn resolve(&self, caller: Caller) -> Result<Principal, Status> {
        self.resolve_from(caller, "").await
    }

    /// [`Access::resolve`] for a caller at client address `from`: an address whose
    /// tokens the Kubernetes API keeps refusing waits before the next is reviewed.
    async fn resolve_from(&self, caller: Caller, from: &str) -> Result<Principal, Status> {
        if matches!(caller, Caller::Unreviewed(_))
            && over(&self.refused_tokens, from, REFUSED_TOKENS_PER_ADDRESS_PER_S)
        {
            tokio::time::sleep(std::time::Duration::from_millis(DENIED_CALLER_DELAY_MS)).await;
        }
        match caller {
            Caller::Open => Ok(Principal::Open),
            Caller::Peer => Ok(Principal::Peer),
            Caller::Known(identity) => Ok(Principal::Policy(identity)),
            Caller::Unreviewed(token) => {
                let reviewer = self
                    .reviewer
                    .as_ref()
                    .ok_or_else(|| Status::unauthenticated("bearer token not accepted"))?;
                match reviewer.review_token(&token).await {
                    Ok(Some(mut user)) => {
                        user.owner = format!("{KUBE_OWNER_PREFIX}{}", user.name);
                        Ok(Principal::Kube(Arc::new(user)))
                    }
                    Ok(None) => {
                        count(&self.refused_tokens, from);
                        Err(Status::unauthenticated(
                            "bearer token not accepted (the Kubernetes API did not authenticate it)",
                        ))
                    }
                    Err(e) => Err(review_failed(&e)),
                }
            }
        }
    }

    /// Whether `who` may do `ask`.
    pub async fn allows(&self, who: &Principal, ask: &Ask) -> Result<bool, Status> {
        if self.allow_all {
            return Ok(true);
        }
        match who {
            Principal::Open => Ok(true),
            // Peers forward what an operator's replica already authorized, and read status.
            Principal::Peer => Ok(ask.resource == Resource::Cluster),
            Principal::Policy(identity) => Ok(policy_allows(identity, ask)),
            Principal::Kube(user) => {
                let reviewer = self
                    .reviewer
                    .as_ref()
                    .ok_or_else(|| Status::internal("a Kubernetes user without a reviewer"))?;
                reviewer
                    .allowed(user, ask)
                    .await
                    .map_err(|e| review_failed(&e))
            }
        }
    }

    /// `Ok` if `who` may do `ask`, else PERMISSION_DENIED naming the verb and resource.
    pub async fn check(&self, who: &Principal, ask: &Ask) -> Result<(), Status> {
        if self.allows(who, ask).await? {
            Ok(())
        } else {
            Err(self.denied(who, ask))
        }
    }

    /// Counts a refusal of `who` the services found (a request past a bound, malformed,
    /// or denied): past [`DENIALS_PER_IDENTITY_PER_S`], its next requests wait.
    pub fn note_refusal(&self, who: &Principal) {
        self.note_denial(who);
    }

    /// Counts a refusal of `who`.
    fn note_denial(&self, who: &Principal) {
        match who {
            Principal::Open | Principal::Peer => {}
            p => count(&self.denials, p.name()),
        }
    }

    /// Whether `name` earned more refusals than [`DENIALS_PER_IDENTITY_PER_S`] lately.
    fn penalized(&self, name: &str) -> bool {
        over(&self.denials, name, DENIALS_PER_IDENTITY_PER_S)
    }

    /// The first step of every RPC: who calls, whether it may call `rpc` at all (its
    /// verb on its resource, before any object is known), and its in-flight slot
    /// (RESOURCE_EXHAUSTED past [`REQUESTS_IN_FLIGHT_PER_IDENTITY_MAX`]).
    pub async fn begin<T>(&self, request: &Request<T>, rpc: Rpc) -> Result<Admitted, Status> {
        let principal = self.principal(request).await?;
        let penalized = self.penalized(principal.name());
        let slot = match &principal {
            Principal::Open | Principal::Peer => None,
            p => Some(self.slot(
                p.name(),
                if penalized {
                    PENALIZED_IN_FLIGHT_MAX
                } else {
                    REQUESTS_IN_FLIGHT_PER_IDENTITY_MAX
                },
            )?),
        };
        if penalized {
            tokio::time::sleep(std::time::Duration::from_millis(DENIED_CALLER_DELAY_MS)).await;
        }
        let ask = Ask::of(rpc.verb, rpc.resource);
        // Peers call the Admin service only (status, and the membership and leadership
        // calls a replica forwards to a leader for a caller it authorized).
        if matches!(principal, Principal::Peer) && !rpc.method.starts_with("Admin/") {
            return Err(denied(&principal, &ask));
        }
        if !self.allows_some(&principal, &ask).await? {
            return Err(self.denied(&principal, &ask));
        }
        Ok(Admitted {
            principal,
            _slot: slot,
        })
    }

    /// Whether `who` may do `ask` for some namespace or object (a role that grants it
    /// only for some is let through; the service narrows it once it read the request).
    async fn allows_some(&self, who: &Principal, ask: &Ask) -> Result<bool, Status> {
        match (who, ask.resource) {
            // A Kubernetes user's namespaced rights are checked per namespace; a node
            // agent's per node: the services ask again, narrowed.
            (Principal::Kube(_), Resource::GangGroups) => Ok(true),
            (Principal::Kube(_), Resource::Nodes) if ask.verb != Verb::List => Ok(true),
            _ => self.allows(who, ask).await,
        }
    }

    fn slot(&self, name: &str, max: u32) -> Result<InFlight, Status> {
        let mut counts = self
            .in_flight
            .lock()
            .map_err(|_| Status::internal("in-flight counts poisoned"))?;
        let n = counts.entry(name.to_string()).or_default();
        if *n >= max {
            return Err(Status::resource_exhausted(format!(
                "{name} has {max} requests in flight on this replica; retry when some finish"
            )));
        }
        *n += 1;
        Ok(InFlight {
            name: name.to_string(),
            counts: self.in_flight.clone(),
        })
    }

    /// Whether `who` may act (`verb`) on a gang group owned by `owner` whose gangs are in
    /// `namespaces`: administrators and (for reads) viewers on every group; a tenant on
    /// its own; a Kubernetes user where RBAC grants the verb in every one of its
    /// namespaces.
    pub async fn may_touch_group(
        &self,
        who: &Principal,
        verb: Verb,
        owner: &str,
        namespaces: &[&str],
    ) -> Result<bool, Status> {
        if self.allow_all {
            return Ok(true);
        }
        let may = match who {
            Principal::Open | Principal::Peer => true,
            Principal::Policy(i) => {
                i.has(Role::Admin)
                    || (verb.reads() && i.has(Role::Viewer))
                    || (i.has(Role::Tenant) && !owner.is_empty() && owner == i.name)
            }
            Principal::Kube(_) => {
                let mut all = !namespaces.is_empty();
                for ns in namespaces {
                    let ask = Ask::of(verb, Resource::GangGroups).in_namespace(ns);
                    if !self.allows(who, &ask).await? {
                        all = false;
                        break;
                    }
                }
                all
            }
        };
        // A listing skips what it may not see; that is no refusal.
        if !may && verb != Verb::List {
            self.note_denial(who);
        }
        Ok(may)
    }

    /// Whether `who` may charge `queue`, whose ancestors are `parents` (nearest first): a
    /// grant of the queue or of any queue above it.
    pub async fn may_use_queue(
        &self,
        who: &Principal,
        queue: &str,
        parents: &[String],
    ) -> Result<bool, Status> {
        for q in std::iter::once(queue).chain(parents.iter().map(String::as_str)) {
            let ask = Ask::of(Verb::Use, Resource::Queues).named(q);
            if self.allows(who, &ask).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// PERMISSION_DENIED for `who` asking `ask` (for refusals the services find),
    /// counted against `who`.
    pub fn denied(&self, who: &Principal, ask: &Ask) -> Status {
        self.note_denial(who);
        denied(who, ask)
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
