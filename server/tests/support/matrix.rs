//! The permission matrix: every client RPC, called by every role (and by a caller with
//! no identity), against a running cluster, each answer classified as allowed (any
//! answer but a refusal of the caller), PERMISSION_DENIED or UNAUTHENTICATED and
//! compared with the table the access rules give ([`expected`]). The calls that would
//! change the cluster are made so that they fail after authorization (a learner id 0,
//! an empty voter set, a shard count of 0), so a matrix leaves the cluster as it was
//! but for its own groups, queue and node. Shared by `authz.rs` (the policy file, over
//! mutual TLS) and `kube.rs` (ServiceAccount tokens reviewed by a real API server).

use std::collections::BTreeMap;

use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::queues_client::QueuesClient;
use gangway_proto::admin::shards_client::ShardsClient;
use gangway_proto::admin::{
    AddLearnerRequest, BalanceRequest, ChangeMembershipRequest, CompactRequest, DeleteQueueRequest,
    GrowShardsRequest, ListMovesRequest, ListQueuesRequest, ListReservationsRequest,
    MoveNodesRequest, PutQueueRequest, QueueSpec, RebalanceRequest, StatusRequest,
    TransferLeaderRequest,
};
use gangway_proto::v1::inventory_client::InventoryClient;
use gangway_proto::v1::scheduler_client::SchedulerClient;
use gangway_proto::v1::{
    DeviceListReport, GangGroupRef, GetNodeRequest, HeartbeatRequest, ListGangGroupsRequest,
    ListNodesRequest, ListShardsRequest, NodeAllocation, RegisterNodeRequest,
    ReleaseMembersRequest, ReportAllocationRequest, SubmitGangGroupRequest, WatchGangGroupRequest,
    WatchGangGroupsRequest,
};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Everything.
    Admin,
    /// A tenant of namespace and queue `team-a`, owner of the matrix's group.
    TenantA,
    /// A tenant of namespace and queue `team-b`.
    TenantB,
    /// The agent of node `node-a`.
    Node,
    /// Reads.
    Viewer,
    /// No identity.
    Nobody,
}

/// Every role, in the order the matrix calls them.
pub const ROLES: [Role; 6] = [
    Role::Nobody,
    Role::Viewer,
    Role::Node,
    Role::TenantB,
    Role::TenantA,
    Role::Admin,
];

/// How a call ended, as far as authorization goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// OK, or an error about the request itself (malformed, unknown, in the wrong state,
    /// over a bound): the caller got past authorization.
    Allowed,
    /// Any other error (INTERNAL, UNAVAILABLE, ...): no answer about authorization, and
    /// never what a cell expects.
    Broken,
    /// PERMISSION_DENIED.
    Denied,
    /// UNAUTHENTICATED.
    Unauthenticated,
}

/// The namespace (and queue) of tenant A's groups.
pub const TEAM_A: &str = "team-a";
/// The namespace (and queue) of tenant B's groups.
pub const TEAM_B: &str = "team-b";
/// The node the node agent speaks for.
pub const NODE_A: &str = "node-a";

/// Which authority decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// The access policy's roles.
    Policy,
    /// The Kubernetes API's RBAC rules (SubjectAccessReview).
    Kubernetes,
}

/// What the access rules say `role` gets for `method` (`Service/Method`) under `by`.
pub fn expected(method: &str, role: Role, by: Authority) -> Outcome {
    use Outcome::{Allowed as A, Denied as D};
    use Role::*;
    if role == Nobody {
        return Outcome::Unauthenticated;
    }
    // RBAC grants listing per namespace, and a listing names none: every Kubernetes user
    // lists, and sees the groups of the namespaces it may list in (none, for an agent).
    if by == Authority::Kubernetes
        && matches!(
            method,
            "Scheduler/ListGangGroups" | "Scheduler/WatchGangGroups"
        )
    {
        return A;
    }
    let allowed: &[Role] = match method {
        "Scheduler/SubmitGangGroup" => &[Admin, TenantA, TenantB],
        "Scheduler/GetGangGroup" | "Scheduler/WatchGangGroup" => &[Admin, TenantA, Viewer],
        "Scheduler/CancelGangGroup" | "Scheduler/ReleaseGangGroup" | "Scheduler/ReleaseMembers" => {
            &[Admin, TenantA]
        }
        "Scheduler/ListGangGroups" | "Scheduler/WatchGangGroups" => {
            &[Admin, TenantA, TenantB, Viewer]
        }
        "Scheduler/ListShards" => &[Admin, Viewer],
        "Inventory/RegisterNode"
        | "Inventory/Heartbeat"
        | "Inventory/ListAndWatchDevices"
        | "Inventory/ReportAllocation" => &[Admin, Node],
        "Inventory/GetNode" => &[Admin, Node, Viewer],
        "Inventory/ListNodes" => &[Admin, Viewer],
        "Admin/Status" | "Shards/ListMoves" | "Shards/ListReservations" => &[Admin, Viewer],
        "Admin/Status+stateHash" => &[Admin],
        "Admin/AddLearner"
        | "Admin/ChangeMembership"
        | "Admin/TransferLeader"
        | "Admin/Balance"
        | "Admin/Compact"
        | "Queues/PutQueue"
        | "Queues/DeleteQueue"
        | "Shards/MoveNodes"
        | "Shards/Rebalance"
        | "Shards/GrowShards" => &[Admin],
        "Queues/ListQueues" => &[Admin, TenantA, TenantB, Viewer],
        other => panic!("the matrix has no row for {other}"),
    };
    if allowed.contains(&role) {
        A
    } else {
        D
    }
}

/// Adds a bearer token to every request.
#[derive(Clone)]
pub struct Token(pub Option<String>);

impl Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(t) = &self.0 {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| Status::internal("token header"))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

/// How one role reaches the cluster.
#[derive(Clone)]
pub struct Caller {
    /// A connected channel (over TLS with the role's certificate, if any).
    pub channel: Channel,
    /// The role's bearer token.
    pub token: Option<String>,
}

type Svc = InterceptedService<Channel, Token>;

impl Caller {
    /// The Scheduler service as this caller.
    pub fn scheduler(&self) -> SchedulerClient<Svc> {
        SchedulerClient::with_interceptor(self.channel.clone(), Token(self.token.clone()))
    }
    /// The Inventory service as this caller.
    pub fn inventory(&self) -> InventoryClient<Svc> {
        InventoryClient::with_interceptor(self.channel.clone(), Token(self.token.clone()))
    }
    /// The Admin service as this caller.
    pub fn admin(&self) -> AdminClient<Svc> {
        AdminClient::with_interceptor(self.channel.clone(), Token(self.token.clone()))
    }
    /// The Queues service as this caller.
    pub fn queues(&self) -> QueuesClient<Svc> {
        QueuesClient::with_interceptor(self.channel.clone(), Token(self.token.clone()))
    }
    /// The Shards service as this caller.
    pub fn shards(&self) -> ShardsClient<Svc> {
        ShardsClient::with_interceptor(self.channel.clone(), Token(self.token.clone()))
    }
}

/// A one-member gang `name` in `namespace` asking for `cpu` at `priority`.
pub fn gang(namespace: &str, name: &str, cpu: &str, priority: i32) -> GangBuilder {
    GangBuilder::new(namespace, name, 1)
        .priority(priority)
        .members("m", 1, serde_json::json!({"requests": {"cpu": cpu}}))
}

/// A submission of `gangs` under `key` (also its name), charged to `queue`.
pub fn submission(key: &str, queue: &str, gangs: Vec<GangBuilder>) -> SubmitGangGroupRequest {
    gangs
        .into_iter()
        .fold(
            GangGroupBuilder::new(key).idempotency_key(key).queue(queue),
            GangGroupBuilder::gang,
        )
        .build()
}

/// What the matrix needs before it runs: queues `team-a` and `team-b`, and a group of
/// tenant A's (its id). The queues are made by `admin`.
pub async fn prepare(admin: &Caller, tenant_a: &Caller) -> u64 {
    for name in [TEAM_A, TEAM_B] {
        admin
            .queues()
            .put_queue(PutQueueRequest {
                queue: Some(QueueSpec {
                    name: name.into(),
                    weight: 1,
                    ..Default::default()
                }),
            })
            .await
            .unwrap_or_else(|e| panic!("the admin makes queue {name}: {e}"));
    }
    tenant_a
        .scheduler()
        .submit_gang_group(submission(
            "matrix-owned",
            "",
            vec![gang(TEAM_A, "owned", "1", 0)],
        ))
        .await
        .expect("tenant A submits in its namespace")
        .into_inner()
        .id
}

fn classify(r: Result<(), Status>) -> Outcome {
    match r {
        Ok(()) => Outcome::Allowed,
        Err(s) => match s.code() {
            Code::PermissionDenied => Outcome::Denied,
            Code::Unauthenticated => Outcome::Unauthenticated,
            Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::OutOfRange => Outcome::Allowed,
            _ => Outcome::Broken,
        },
    }
}

fn done<T>(r: Result<tonic::Response<T>, Status>) -> Result<(), Status> {
    r.map(|_| ())
}

/// Calls `method` as `role` through `c` (on tenant A's group `group`).
pub async fn call(method: &str, role: Role, c: &Caller, group: u64) -> Result<(), Status> {
    let r = GangGroupRef { id: group };
    match method {
        "Scheduler/SubmitGangGroup" => {
            let (namespace, key) = match role {
                Role::TenantB => (TEAM_B, format!("matrix-{role:?}").to_lowercase()),
                _ => (TEAM_A, format!("matrix-{role:?}").to_lowercase()),
            };
            let queue = if role == Role::Admin { TEAM_A } else { "" };
            done(
                c.scheduler()
                    .submit_gang_group(submission(&key, queue, vec![gang(namespace, &key, "1", 0)]))
                    .await,
            )
        }
        "Scheduler/GetGangGroup" => done(c.scheduler().get_gang_group(r).await),
        "Scheduler/WatchGangGroup" => match c
            .scheduler()
            .watch_gang_group(WatchGangGroupRequest {
                id: group,
                after_version: 0,
            })
            .await
        {
            Ok(stream) => stream.into_inner().message().await.map(|_| ()),
            Err(s) => Err(s),
        },
        // Refused at the call; a stream opened may wait for a group the caller sees.
        "Scheduler/WatchGangGroups" => done(
            c.scheduler()
                .watch_gang_groups(WatchGangGroupsRequest::default())
                .await,
        ),
        "Scheduler/CancelGangGroup" => done(c.scheduler().cancel_gang_group(r).await),
        "Scheduler/ReleaseGangGroup" => done(c.scheduler().release_gang_group(r).await),
        "Scheduler/ReleaseMembers" => done(
            c.scheduler()
                .release_members(ReleaseMembersRequest {
                    id: group,
                    members: vec![format!("{TEAM_A}/owned/m")],
                })
                .await,
        ),
        "Scheduler/ListGangGroups" => done(
            c.scheduler()
                .list_gang_groups(ListGangGroupsRequest::default())
                .await,
        ),
        "Scheduler/ListShards" => done(c.scheduler().list_shards(ListShardsRequest {}).await),
        "Inventory/RegisterNode" => done(
            c.inventory()
                .register_node(RegisterNodeRequest {
                    node: Some(super::node(NODE_A)),
                    update: true,
                })
                .await,
        ),
        "Inventory/GetNode" => done(
            c.inventory()
                .get_node(GetNodeRequest {
                    name: NODE_A.into(),
                })
                .await,
        ),
        "Inventory/ListNodes" => done(c.inventory().list_nodes(ListNodesRequest::default()).await),
        "Inventory/Heartbeat" => done(
            c.inventory()
                .heartbeat(HeartbeatRequest {
                    node: NODE_A.into(),
                    ..Default::default()
                })
                .await,
        ),
        "Inventory/ListAndWatchDevices" => {
            let report = DeviceListReport {
                node: NODE_A.into(),
                resource_name: "example.com/matrix".into(),
                devices: Vec::new(),
                ..Default::default()
            };
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let _ = tx.send(report).await;
            let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
            let answer = match c.inventory().list_and_watch_devices(outbound).await {
                Ok(acks) => acks.into_inner().message().await.map(|_| ()),
                Err(s) => Err(s),
            };
            drop(tx);
            answer
        }
        "Inventory/ReportAllocation" => done(
            c.inventory()
                .report_allocation(ReportAllocationRequest {
                    node: NODE_A.into(),
                    member: format!("{TEAM_A}/owned/m"),
                    allocation: Some(NodeAllocation {
                        resource: "example.com/matrix".into(),
                        device_ids: vec!["d0".into()],
                        ..Default::default()
                    }),
                })
                .await,
        ),
        "Admin/Status" => done(
            c.admin()
                .status(StatusRequest {
                    include_state_hash: false,
                })
                .await,
        ),
        "Admin/Status+stateHash" => {
            // Hashes are spaced per replica: a refusal for the rate is no refusal of the caller.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            done(
                c.admin()
                    .status(StatusRequest {
                        include_state_hash: true,
                    })
                    .await,
            )
        }
        "Admin/AddLearner" => done(
            c.admin()
                .add_learner(AddLearnerRequest {
                    group_id: None,
                    node_id: 0,
                    addr: "127.0.0.1:1".into(),
                })
                .await,
        ),
        "Admin/ChangeMembership" => done(
            c.admin()
                .change_membership(ChangeMembershipRequest {
                    group_id: Some(0),
                    voters: Vec::new(),
                })
                .await,
        ),
        "Admin/TransferLeader" => done(
            c.admin()
                .transfer_leader(TransferLeaderRequest {
                    group_id: 0,
                    to_node: 99,
                })
                .await,
        ),
        "Admin/Balance" => done(c.admin().balance(BalanceRequest {}).await),
        "Admin/Compact" => done(
            c.admin()
                .compact(CompactRequest {
                    group_id: Some(999),
                })
                .await,
        ),
        "Queues/PutQueue" => done(
            c.queues()
                .put_queue(PutQueueRequest {
                    queue: Some(QueueSpec {
                        name: "matrix".into(),
                        weight: 1,
                        ..Default::default()
                    }),
                })
                .await,
        ),
        "Queues/DeleteQueue" => done(
            c.queues()
                .delete_queue(DeleteQueueRequest {
                    name: "no-such-queue".into(),
                })
                .await,
        ),
        "Queues/ListQueues" => done(c.queues().list_queues(ListQueuesRequest {}).await),
        "Shards/MoveNodes" => done(c.shards().move_nodes(MoveNodesRequest::default()).await),
        "Shards/Rebalance" => done(
            c.shards()
                .rebalance(RebalanceRequest {
                    bound_percent: 50,
                    ..Default::default()
                })
                .await,
        ),
        "Shards/ListMoves" => done(c.shards().list_moves(ListMovesRequest {}).await),
        "Shards/ListReservations" => done(
            c.shards()
                .list_reservations(ListReservationsRequest {})
                .await,
        ),
        "Shards/GrowShards" => done(
            c.shards()
                .grow_shards(GrowShardsRequest { shards: 0 })
                .await,
        ),
        other => panic!("the matrix cannot call {other}"),
    }
}

/// Every `Service/Method` the proto files declare for clients (not the Raft transport).
pub fn declared_methods() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto/gangway");
    let mut methods = Vec::new();
    for file in [
        "v1/scheduler.proto",
        "v1/inventory.proto",
        "admin/v1/admin.proto",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect("a proto file");
        let mut service = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.trim_end_matches('{').trim().to_string();
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let name = rest.split('(').next().unwrap_or_default().trim();
                methods.push(format!("{service}/{name}"));
            }
        }
    }
    methods
}

/// Runs the whole matrix: every RPC of [`gangway_server::auth::access::RPCS`] (which
/// must cover every declared method) as every role. Returns the table as text and the
/// cells that differ from [`expected`].
pub async fn run(
    callers: &BTreeMap<Role, Caller>,
    group: u64,
    by: Authority,
) -> (String, Vec<String>) {
    let covered: Vec<&str> = gangway_server::auth::access::RPCS
        .iter()
        .map(|r| r.method)
        .collect();
    for m in declared_methods() {
        assert!(
            covered.contains(&m.as_str()),
            "{m} is declared in the proto files but not authorized in auth::access::RPCS"
        );
    }
    let mut table = String::new();
    let mut wrong = Vec::new();
    for rpc in gangway_server::auth::access::RPCS {
        table.push_str(&format!("{:32}", rpc.method));
        for role in ROLES {
            let caller = &callers[&role];
            let got = classify(call(rpc.method, role, caller, group).await);
            let want = expected(rpc.method, role, by);
            table.push_str(&format!(" {:>5}", short(got)));
            if got != want {
                wrong.push(format!(
                    "{} as {role:?}: {got:?}, expected {want:?}",
                    rpc.method
                ));
            }
        }
        table.push('\n');
    }
    (table, wrong)
}

fn short(o: Outcome) -> &'static str {
    match o {
        Outcome::Allowed => "ok",
        Outcome::Denied => "deny",
        Outcome::Unauthenticated => "unauth",
        Outcome::Broken => "ERROR",
    }
}
