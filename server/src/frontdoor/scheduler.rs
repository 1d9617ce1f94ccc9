//! The Scheduler service: batch frameworks submit gang groups here and watch
//! them placed. A submission is validated completely (errors name the field), each
//! member template once and within its bounds before `count` expands it, then
//! authorized (the caller's namespaces, queue, priority; its owner and preemption
//! boundary recorded) and committed to the meta group before it is acknowledged; the
//! same idempotency key of the same owner always yields the same group. Every other
//! call acts on a group only for a caller that may (its owner, an administrator, a
//! viewer for reads; `auth::access`). Placement itself is the coordinator's job.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use gangway_proto::v1::scheduler_server::{Scheduler, SchedulerServer};
use gangway_proto::v1::{
    DomainSpread, GangGroupRef, GangGroupStatus, GangSpec, ListGangGroupsReply,
    ListGangGroupsRequest, ListShardsReply, ListShardsRequest, MemberPlacement,
    ReleaseMembersRequest, ShardInfo, SubmitGangGroupRequest, TopologySpec, WatchGangGroupRequest,
    WatchGangGroupsRequest,
};
use gangway_raft::META_GROUP;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::watch;
use crate::auth::access::{self, Access, Ask, Principal, Resource, Verb};
use crate::auth::limits::StreamLimits;
use crate::auth::policy::LIVE_GROUPS_PER_IDENTITY_DEFAULT;
use crate::failpoints::{self, Failpoints};
use crate::replicated::growth::ShardCount;
use crate::replicated::release::release_members;
use crate::replicated::{now_ms, GroupError, Groups};
use gangway_core::ledger::meta::{
    GroupSeq, GroupSummary, MetaCommand, MetaQuery, MetaReply, RejectionKind,
};
use gangway_core::ledger::{LedgerOp, ReleaseTarget};
use gangway_core::model::gang::{RawGang, RawGangSpec, RawMember};
use gangway_core::model::node::LABEL_HOSTNAME;
use gangway_core::model::PodBinding;
use gangway_core::model::{
    clip_to, GangGroup, LearnedHierarchies, MemberKey, RawGangGroup, RawPodSpec,
    TopologyConstraint, TopologyHierarchy, TopologySlice, MESSAGE_CHARS_MAX, PATH_CHARS_MAX,
};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Most members one gang group may have.
pub const GROUP_MEMBERS_MAX: usize = 10_000;
/// Largest a gang group may be once its templates are expanded, in bytes of member
/// specs as submitted (its meta entry is about as large; the transport carries 64 MiB).
pub const GROUP_SPEC_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Longest a gang may wait to be placed, in ms (7 days).
pub const WAIT_TIME_MS_MAX: u64 = 7 * 24 * 3_600_000;
/// Most gangs one gang group may have.
pub const GROUP_GANGS_MAX: usize = 256;
/// Groups a listing of changes answers when the caller sets no limit.
pub const LIST_CHANGES_DEFAULT: u32 = 1_000;
/// Most groups one listing of changes answers.
pub const LIST_CHANGES_MAX: u32 = 10_000;
/// Longest `ListShards` waits for one shard's capacity, in ms (0 is shown without it).
pub const SHARD_READ_TIMEOUT_MS: u64 = 500;

/// The Scheduler gRPC service over one replica's groups.
pub struct SchedulerService {
    groups: Groups,
    shards: ShardCount,
    failpoints: Failpoints,
    access: Access,
    streams: StreamLimits,
    topology: Topology,
}

/// The cluster's topology hierarchies as the front door reads them: the configured ones,
/// then those Kueue's Topology objects define (kept by the Kubernetes ingest).
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// `--topology-levels`.
    pub configured: Vec<TopologyHierarchy>,
    /// Kueue's.
    pub learned: std::sync::Arc<LearnedHierarchies>,
}

impl Topology {
    /// Every level of every hierarchy but the host's, each once, widest first.
    fn levels(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for h in self.learned.merged(&self.configured) {
            for level in h.levels {
                if level != LABEL_HOSTNAME && !out.contains(&level) {
                    out.push(level);
                }
            }
        }
        out
    }
}

/// Most placed members a group's spread is read for (a larger group shows none).
pub const SPREAD_NODES_MAX: usize = 10_000;

impl SchedulerService {
    /// The domains, per topology level, of the nodes `placements` name, read from the
    /// shards that hold them; nodes a shard no longer has (moved since) are left out, as
    /// is every node of a shard that cannot answer.
    async fn spread(&self, placements: &[MemberPlacement]) -> Vec<DomainSpread> {
        let keys = self.topology.levels();
        if keys.is_empty() || placements.is_empty() || placements.len() > SPREAD_NODES_MAX {
            return Vec::new();
        }
        let mut by_shard: BTreeMap<u32, std::collections::BTreeSet<String>> = BTreeMap::new();
        for p in placements {
            by_shard.entry(p.shard).or_default().insert(p.node.clone());
        }
        let mut domains: Vec<std::collections::BTreeSet<String>> =
            vec![Default::default(); keys.len()];
        for (shard, nodes) in by_shard {
            let query = ShardQuery::NodeLabels {
                nodes: nodes.into_iter().collect(),
                keys: keys.clone(),
            };
            let Ok(ShardAnswer::NodeLabels { labels }) =
                self.groups.shard_query(shard, &query).await
            else {
                continue;
            };
            for (_, values) in labels {
                for (i, value) in values.into_iter().enumerate() {
                    if let (Some(value), Some(set)) = (value, domains.get_mut(i)) {
                        set.insert(value);
                    }
                }
            }
        }
        keys.into_iter()
            .zip(domains)
            .filter(|(_, d)| !d.is_empty())
            .map(|(key, d)| DomainSpread {
                key,
                domains: d.into_iter().collect(),
            })
            .collect()
    }

    /// A service over `groups` with `shards` shards, authorizing with `access`,
    /// bounding watches with `streams` and reading placed groups' spread over `topology`
    /// (`failpoints` only in fault tests).
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        failpoints: Failpoints,
        access: Access,
        streams: StreamLimits,
        topology: Topology,
    ) -> SchedulerServer<Self> {
        SchedulerServer::new(Self {
            groups,
            shards,
            failpoints,
            access,
            streams,
            topology,
        })
    }

    /// Validates, authorizes and submits one request of `who`.
    async fn submit(
        &self,
        who: &Principal,
        req: SubmitGangGroupRequest,
    ) -> Result<GangGroupStatus, Status> {
        if self.groups.legacy_writer() && !who.is_admin() {
            // Replicas of the release before would drop the owner and the bounds this
            // submission is held to, and apply it otherwise than this one.
            return Err(Status::unavailable(
                "the cluster is being upgraded (a replica writes for the first rollout, \
                 --wire-format json): only administrators submit until the second rollout",
            ));
        }
        // Whom the gangs are for is checked before any member template is parsed.
        self.authorize_gangs(who, &req).await?;
        let mut group = validate_submission(&req)?;
        self.authorize_submission(who, &mut group).await?;
        let key = if req.idempotency_key.is_empty() {
            new_key()
        } else {
            req.idempotency_key.clone()
        };
        let live_max = match who {
            Principal::Open | Principal::Peer => None,
            Principal::Policy(i) if i.has(crate::auth::Role::Admin) => None,
            Principal::Policy(i) => Some(
                i.tenant
                    .as_ref()
                    .map_or(LIVE_GROUPS_PER_IDENTITY_DEFAULT, |t| t.live_groups_max),
            ),
            Principal::Kube(_) => Some(LIVE_GROUPS_PER_IDENTITY_DEFAULT),
        };
        if let Some(max) = live_max {
            // Refused here, a flood past the bound writes nothing to the log.
            let q = MetaQuery::Owned {
                owner: group.owner.clone(),
                key: key.clone(),
            };
            if let Ok(MetaReply::Owned { live: n, has_key }) = self.groups.meta_query_local(&q) {
                if !has_key && n >= u64::from(max) {
                    return Err(Status::resource_exhausted(format!(
                        "owner: {} has {n} gang groups that have not ended, its most; release or cancel some first",
                        group.owner
                    )));
                }
            }
        }
        if self.groups.legacy_writer() {
            // What the release before reads: no owner (its keys are not scoped).
            group.owner.clear();
        }
        let cmd = MetaCommand::Submit {
            key,
            group,
            at_ms: now_ms(),
            live_max,
        };
        let seq = match self.groups.meta(&cmd).await.map_err(|e| e.to_status())? {
            MetaReply::Submitted {
                summary: Some(summary),
                ..
            } => return Ok(crate::convert::group_status(&summary)),
            // From a meta leader that predates summaries in replies.
            MetaReply::Submitted { seq, .. } => seq,
            MetaReply::Rejected {
                reason,
                kind: RejectionKind::Conflict,
            } => return Err(Status::already_exists(reason)),
            MetaReply::Rejected {
                reason,
                kind: RejectionKind::NotFound,
            } => return Err(Status::not_found(reason)),
            MetaReply::Rejected {
                reason,
                kind: RejectionKind::Exhausted,
            } => return Err(Status::resource_exhausted(reason)),
            MetaReply::Rejected { reason, .. } => return Err(Status::invalid_argument(reason)),
            other => return Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        };
        Ok(crate::convert::group_status(&self.record(seq).await?))
    }

    /// Group `seq`, if `who` may `verb` it (PERMISSION_DENIED otherwise).
    async fn record_for(
        &self,
        who: &Principal,
        verb: Verb,
        seq: GroupSeq,
    ) -> Result<GroupSummary, Status> {
        let record = match self.record(seq).await {
            Ok(record) => record,
            // A caller that may not see every group learns nothing of ids that are not
            // its own, not even whether they exist.
            Err(e) if e.code() == tonic::Code::NotFound && !sees_every_group(who) => {
                return Err(not_its_group(who, verb, seq));
            }
            Err(e) => return Err(e),
        };
        self.may_touch(who, verb, &record).await?;
        Ok(record)
    }

    async fn may_touch(
        &self,
        who: &Principal,
        verb: Verb,
        record: &GroupSummary,
    ) -> Result<(), Status> {
        let namespaces = group_namespaces(record);
        if self
            .access
            .may_touch_group(who, verb, &record.owner, &namespaces)
            .await?
        {
            return Ok(());
        }
        Err(not_its_group(who, verb, record.seq))
    }

    /// Checks the caller's rights on a submission and records what they imply: its
    /// owner, its queue (a tenant's default when it names none), its preemption
    /// boundary. Administrators (and callers of an open replica) submit as given.
    async fn authorize_submission(
        &self,
        who: &Principal,
        group: &mut GangGroup,
    ) -> Result<(), Status> {
        group.owner = who.name().to_string();
        if who.is_admin() {
            return Ok(());
        }
        for (i, gang) in group.gangs.iter().enumerate() {
            for (j, m) in gang.members.iter().enumerate() {
                if m.spec.priority != gang.priority {
                    self.check_priority(
                        who,
                        &format!("gangs[{i}].members[{j}].priority"),
                        m.spec.priority,
                    )
                    .await?;
                }
            }
        }
        let parents = self.queue_parents().await?;
        if group.queue.is_empty() {
            group.queue = self.default_queue(who, group, &parents).await?;
        }
        if !group.queue.is_empty() {
            let Some(chain) = ancestors(&parents, &group.queue) else {
                return Err(Status::not_found(format!(
                    "queue: no queue {:?}; create it first (gangctl queues put)",
                    group.queue
                )));
            };
            if !self.access.may_use_queue(who, &group.queue, &chain).await? {
                let ask = Ask::of(Verb::Use, Resource::Queues).named(&group.queue);
                return Err(refused_field("queue", self.access.denied(who, &ask)));
            }
        }
        let across = self
            .access
            .allows(who, &Ask::of(Verb::Preempt, Resource::Queues))
            .await?;
        // No queue and no right to preempt across queues: a boundary that admits none.
        group.preempts_within = (!across).then(|| group.queue.clone());
        Ok(())
    }

    /// The gangs' namespaces and priorities as the request names them: each namespace one
    /// `who` may create groups in, each priority one it may use.
    async fn authorize_gangs(
        &self,
        who: &Principal,
        req: &SubmitGangGroupRequest,
    ) -> Result<(), Status> {
        if who.is_admin() {
            return Ok(());
        }
        for (i, gang) in req.gangs.iter().enumerate().take(GROUP_GANGS_MAX) {
            let namespace = if gang.namespace.is_empty() {
                "default"
            } else {
                gang.namespace.as_str()
            };
            let ask = Ask::of(Verb::Create, Resource::GangGroups).in_namespace(namespace);
            if !self.access.allows(who, &ask).await? {
                return Err(refused_field(
                    &format!("gangs[{i}].namespace"),
                    self.access.denied(who, &ask),
                ));
            }
            self.check_priority(who, &format!("gangs[{i}].priority"), gang.priority)
                .await?;
        }
        Ok(())
    }

    async fn check_priority(
        &self,
        who: &Principal,
        field: &str,
        priority: i32,
    ) -> Result<(), Status> {
        // The default priority needs no grant from the Kubernetes API; the policy's
        // maximum applies to every value, so a tenant may be held below 0.
        if priority <= 0 && matches!(who, Principal::Kube(_)) {
            return Ok(());
        }
        let ask = Ask::of(Verb::Use, Resource::Priorities).named(&priority.to_string());
        if self.access.allows(who, &ask).await? {
            return Ok(());
        }
        Err(refused_field(field, self.access.denied(who, &ask)))
    }

    /// The queue a submission that names none is charged to: a policy tenant's default;
    /// for a Kubernetes user, none if it may use every queue, else the queue named after
    /// its first gang's namespace. A tenant never runs outside quota: without a default,
    /// the submission is refused.
    async fn default_queue(
        &self,
        who: &Principal,
        group: &GangGroup,
        parents: &BTreeMap<String, String>,
    ) -> Result<String, Status> {
        let found = match who {
            Principal::Policy(identity) => identity
                .tenant
                .as_ref()
                .and_then(|t| t.default_queue.clone()),
            Principal::Kube(_) => {
                if self
                    .access
                    .allows(who, &Ask::of(Verb::Use, Resource::Queues))
                    .await?
                {
                    return Ok(String::new());
                }
                group
                    .gangs
                    .first()
                    .map(|g| g.namespace.clone())
                    .filter(|ns| parents.contains_key(ns))
            }
            Principal::Open | Principal::Peer => return Ok(String::new()),
        };
        found.ok_or_else(|| {
            Status::invalid_argument(format!(
                "queue: required: {} has no default queue; name one of the queues it may use",
                who_name(who)
            ))
        })
    }

    /// Every queue -> its parent (empty for a top-level queue).
    async fn queue_parents(&self) -> Result<BTreeMap<String, String>, Status> {
        match self
            .groups
            .meta_query(&MetaQuery::Queues)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Queues { queues } => Ok(queues
                .into_iter()
                .map(|q| (q.spec.name, q.spec.parent))
                .collect()),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    /// Whether `who` may see `record` (listing).
    async fn visible(&self, who: &Principal, record: &GroupSummary) -> Result<bool, Status> {
        let namespaces = group_namespaces(record);
        self.access
            .may_touch_group(who, Verb::List, &record.owner, &namespaces)
            .await
    }

    async fn visible_only(
        &self,
        who: &Principal,
        groups: Vec<GroupSummary>,
    ) -> Result<Vec<GangGroupStatus>, Status> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            if self.visible(who, &g).await? {
                out.push(crate::convert::group_status(&g));
            }
        }
        Ok(out)
    }

    async fn record(&self, seq: GroupSeq) -> Result<GroupSummary, Status> {
        match self
            .groups
            .meta_query(&MetaQuery::Group { seq })
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Group { group } => Ok(*group),
            _ => Err(Status::not_found(format!("id: no gang group {seq}"))),
        }
    }

    /// The groups changed after `after`, at most `limit` (0: the default), of those
    /// `who` may see.
    async fn list_changes(
        &self,
        who: &Principal,
        after: u64,
        limit: u32,
    ) -> Result<Response<ListGangGroupsReply>, Status> {
        let limit = match limit {
            0 => LIST_CHANGES_DEFAULT,
            n if n > LIST_CHANGES_MAX => {
                return Err(Status::invalid_argument(format!(
                    "limit: {n} is above {LIST_CHANGES_MAX}"
                )))
            }
            n => n,
        };
        match self
            .groups
            .meta_query(&MetaQuery::ChangedSince { after, limit })
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Changed {
                groups,
                stamp,
                more,
                forgotten,
            } => Ok(Response::new(ListGangGroupsReply {
                groups: self.visible_only(who, groups).await?,
                stamp,
                more,
                forgotten,
            })),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    /// A status stream for `who`, fed by the task `feed` makes from the meta group's
    /// apply feed and the stream's sender; it holds one of `who`'s stream slots while
    /// it runs.
    fn open_stream<Feed>(
        &self,
        who: &Principal,
        feed: impl FnOnce(
            gangway_raft::GroupChanges,
            tokio::sync::mpsc::Sender<Result<GangGroupStatus, Status>>,
        ) -> Feed,
    ) -> Result<Response<StatusStream>, Status>
    where
        Feed: std::future::Future<Output = ()> + Send + 'static,
    {
        let slot = self
            .streams
            .open(who.name())
            .inspect_err(|_| self.access.note_refusal(who))?;
        let (tx, rx) = tokio::sync::mpsc::channel(watch::WATCH_BUFFER);
        let changes = self
            .groups
            .host()
            .changes(META_GROUP)
            .map_err(|e| GroupError::from(e).to_status())?;
        let task = feed(changes, tx);
        tokio::spawn(async move {
            // The slot is held as long as the stream is open.
            let _slot = slot;
            task.await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn command(&self, cmd: MetaCommand) -> Result<GangGroupStatus, Status> {
        group_status(self.groups.meta(&cmd).await.map_err(|e| e.to_status())?)
    }
}

/// A meta reply about one group as the API shows it.
fn group_status(reply: MetaReply) -> Result<GangGroupStatus, Status> {
    match reply {
        MetaReply::Group { group } => Ok(crate::convert::group_status(&group)),
        MetaReply::Rejected {
            reason,
            kind: RejectionKind::NotFound,
        } => Err(Status::not_found(reason)),
        MetaReply::Rejected {
            reason,
            kind: RejectionKind::Busy,
        } => Err(Status::unavailable(reason)),
        MetaReply::Rejected { reason, .. } => Err(Status::failed_precondition(reason)),
        other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
    }
}

/// The order ReleaseMembers had before it went through meta first: shards free the
/// members (committing the group's latest transaction there first), then meta is
/// asked. Reached only through the bug switch [`failpoints::RELEASE_SHARDS_FIRST`].
async fn release_members_shards_first(
    groups: &Groups,
    record: &GroupSummary,
    names: Vec<String>,
) -> Result<MetaReply, GroupError> {
    let mut per_shard: BTreeMap<u32, Vec<MemberKey>> = BTreeMap::new();
    for name in &names {
        if let (Some(p), Ok(key)) = (
            record.placements.get(name),
            MemberKey::try_from(name.clone()),
        ) {
            per_shard.entry(p.shard).or_default().push(key);
        }
    }
    for (shard, members) in per_shard {
        if let Some(txn_id) = record.txn {
            groups.shard(shard, LedgerOp::Commit { txn_id }).await?;
        }
        let op = LedgerOp::Release {
            target: ReleaseTarget::Members(members),
        };
        groups.shard(shard, op).await?;
    }
    let cmd = MetaCommand::ReleaseMembers {
        seq: record.seq,
        members: names.clone(),
        at_ms: now_ms(),
    };
    let reply = groups.meta(&cmd).await?;
    if matches!(reply, MetaReply::Rejected { .. }) {
        return Ok(reply);
    }
    let cmd = MetaCommand::MembersReleased {
        seq: record.seq,
        members: names,
        at_ms: now_ms(),
    };
    groups.meta(&cmd).await
}

/// The namespaces of a group's gangs (`namespace/name` each).
pub(super) fn group_namespaces(record: &GroupSummary) -> Vec<&str> {
    let mut namespaces: Vec<&str> = record
        .gangs
        .iter()
        .filter_map(|g| g.split_once('/').map(|(ns, _)| ns))
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    namespaces
}

/// Whether `who` may read every group (administrators and viewers of the policy).
fn sees_every_group(who: &Principal) -> bool {
    who.is_admin()
        || who
            .identity()
            .is_some_and(|i| i.has(crate::auth::Role::Viewer))
}

fn not_its_group(who: &Principal, verb: Verb, seq: GroupSeq) -> Status {
    Status::permission_denied(format!(
        "{} may not {} gang group {seq} (API group {}, resource ganggroups): it is not one of its groups",
        who_name(who),
        verb.name(),
        access::API_GROUP
    ))
}

fn who_name(who: &Principal) -> &str {
    match who.name() {
        "" => "this caller",
        name => name,
    }
}

/// A refusal of the authorities, prefixed with the submission's field at fault.
fn refused_field(field: &str, status: Status) -> Status {
    Status::new(status.code(), format!("{field}: {}", status.message()))
}

/// `queue`'s ancestors, nearest first (`None`: no such queue).
fn ancestors(parents: &BTreeMap<String, String>, queue: &str) -> Option<Vec<String>> {
    let mut chain = Vec::new();
    let mut next = parents.get(queue)?;
    while !next.is_empty() && chain.len() < parents.len() {
        chain.push(next.clone());
        next = parents.get(next)?;
    }
    Some(chain)
}

fn invalid(field: String, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(
        gangway_core::model::ValidationError {
            path: clip_to(&field, PATH_CHARS_MAX).into_owned(),
            message: clip_to(&reason.to_string(), MESSAGE_CHARS_MAX).into_owned(),
        }
        .to_string(),
    )
}

/// Converts a submission into the model, checking every field.
pub fn validate_submission(req: &SubmitGangGroupRequest) -> Result<GangGroup, Status> {
    if req.gangs.is_empty() {
        return Err(invalid(
            "gangs".into(),
            "a gang group needs at least one gang",
        ));
    }
    if req.gangs.len() > GROUP_GANGS_MAX {
        return Err(invalid(
            "gangs".into(),
            format!("more than {GROUP_GANGS_MAX} gangs"),
        ));
    }
    let mut total = Totals::default();
    let mut gangs = Vec::with_capacity(req.gangs.len());
    for (i, g) in req.gangs.iter().enumerate() {
        gangs.push(raw_gang(&format!("gangs[{i}]"), g, &mut total)?);
    }
    if req.name.is_empty() {
        return Err(invalid(
            "name".into(),
            "required: the gang group's name (a DNS subdomain)",
        ));
    }
    let id = req.name.clone();
    let run_limit_ms = match req.run_limit_seconds {
        0 => None,
        s if s > gangway_core::model::RUN_LIMIT_MS_MAX / 1_000 => {
            return Err(invalid(
                "run_limit_seconds".into(),
                format!(
                    "{s} is more than {} (one year)",
                    gangway_core::model::RUN_LIMIT_MS_MAX / 1_000
                ),
            ))
        }
        s => Some(s * 1_000),
    };
    RawGangGroup {
        id,
        gangs,
        queue: req.queue.clone(),
        run_limit_ms,
    }
    .validate()
    .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Bytes a member adds to its group's entry besides its spec and name (keys, placement).
const MEMBER_OVERHEAD_BYTES: usize = 64;

/// What a submission's members add up to so far.
#[derive(Default)]
struct Totals {
    members: usize,
    bytes: usize,
}

fn raw_gang(at: &str, g: &GangSpec, total: &mut Totals) -> Result<RawGang, Status> {
    if g.wait_time_ms > WAIT_TIME_MS_MAX {
        return Err(invalid(
            format!("{at}.wait_time_ms"),
            format!(
                "{} is more than {WAIT_TIME_MS_MAX} (7 days)",
                g.wait_time_ms
            ),
        ));
    }
    let mut members = Vec::new();
    for (j, m) in g.members.iter().enumerate() {
        let field = format!("{at}.members[{j}]");
        let pod_names = m
            .pods
            .as_ref()
            .map(|p| p.names.as_slice())
            .unwrap_or_default();
        let pod_selector: BTreeMap<String, String> = m
            .pods
            .as_ref()
            .map(|p| {
                p.selector
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        if !pod_selector.is_empty() && !pod_names.is_empty() {
            return Err(invalid(
                format!("{field}.pods"),
                "names and selector: give one or the other",
            ));
        }
        if !pod_names.is_empty() && m.count > 1 && m.count as usize != pod_names.len() {
            return Err(invalid(
                format!("{field}.count"),
                format!(
                    "{} but pods.names names {} pods; give one or the other, or both equal",
                    m.count,
                    pod_names.len()
                ),
            ));
        }
        let count = if pod_names.is_empty() {
            m.count.max(1) as usize
        } else {
            pod_names.len()
        };
        total.members += count;
        if total.members > GROUP_MEMBERS_MAX {
            return Err(invalid(
                format!("{field}.count"),
                format!("the group would have more than {GROUP_MEMBERS_MAX} members"),
            ));
        }
        // Checked before anything is copied `count` times.
        let longest_name = pod_names.iter().map(String::len).max().unwrap_or(0);
        // Every member of the template keeps its own copy of the selector.
        let selector_bytes: usize = pod_selector.iter().map(|(k, v)| k.len() + v.len()).sum();
        let size = m.pod_json.len()
            + m.name.len().max(longest_name)
            + selector_bytes
            + MEMBER_OVERHEAD_BYTES;
        total.bytes = total.bytes.saturating_add(size.saturating_mul(count));
        if total.bytes > GROUP_SPEC_BYTES_MAX {
            return Err(invalid(
                format!("{field}.count"),
                format!(
                    "{count} copies of a {size}-byte member make the group larger than {GROUP_SPEC_BYTES_MAX} bytes"
                ),
            ));
        }
        let spec: RawPodSpec = if m.pod_json.trim().is_empty() {
            RawPodSpec::default()
        } else {
            serde_json::from_str(&m.pod_json)
                .map_err(|e| invalid(format!("{field}.pod_json"), e))?
        };
        let at = gangway_core::model::FieldPath::new(&format!("{field}.pod_json"));
        spec.validate(&at)
            .and_then(|pod| pod.within_bounds(&at))
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let binding = match m.pods {
            Some(_) => PodBinding::Named,
            None => PodBinding::Unnamed,
        };
        for k in 0..count {
            let name = match pod_names.get(k) {
                Some(pod) => pod.clone(),
                None if m.count > 1 => format!("{}-{k}", m.name),
                None => m.name.clone(),
            };
            members.push(RawMember {
                name,
                spec: spec.clone(),
                binding,
                pod_selector: pod_selector.clone(),
            });
        }
    }
    let mode = match g.mode.as_str() {
        "" => None,
        "Strict" | "NonStrict" => Some(g.mode.clone()),
        other => {
            return Err(invalid(
                format!("{at}.mode"),
                format!("{other:?} is not Strict or NonStrict"),
            ))
        }
    };
    let total_number = if g.total_number == 0 {
        None
    } else {
        Some(i64::from(g.total_number))
    };
    Ok(RawGang {
        name: g.name.clone(),
        namespace: if g.namespace.is_empty() {
            "default".into()
        } else {
            g.namespace.clone()
        },
        creation_order: 0,
        spec: RawGangSpec {
            min_member: i64::from(g.min_member),
            total_number,
            mode,
            wait_time_ms: (g.wait_time_ms > 0).then_some(g.wait_time_ms),
            priority: g.priority,
            members,
            topology: topology_of(g.topology.as_ref(), &format!("{at}.topology"))?,
        },
    })
}

/// A gang's topology constraint from its message; a slice needs both its fields.
fn topology_of(t: Option<&TopologySpec>, at: &str) -> Result<TopologyConstraint, Status> {
    let Some(t) = t else {
        return Ok(TopologyConstraint::default());
    };
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let slice = match (t.slice_key.is_empty(), t.slice_size) {
        (true, 0) => None,
        (false, size) if size > 0 => Some(TopologySlice {
            key: t.slice_key.clone(),
            size,
        }),
        _ => {
            return Err(invalid(
                format!("{at}.slice_key"),
                "slice_key and slice_size are given together (a key and a size of at least 1)",
            ))
        }
    };
    Ok(TopologyConstraint {
        required: text(&t.required),
        preferred: text(&t.preferred),
        slice,
    })
}

fn new_key() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("auto-{}-{}-{n}", now_ms(), std::process::id())
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<GangGroupStatus, Status>> + Send>>;

#[tonic::async_trait]
impl Scheduler for SchedulerService {
    async fn submit_gang_group(
        &self,
        request: Request<SubmitGangGroupRequest>,
    ) -> Result<Response<GangGroupStatus>, Status> {
        let admitted = self.access.begin(&request, access::SUBMIT).await?;
        let who = &admitted.principal;
        let answer = self.submit(who, request.into_inner()).await;
        if answer.as_ref().is_err_and(|s| {
            // PERMISSION_DENIED is counted where it is decided.
            matches!(
                s.code(),
                tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
            )
        }) {
            self.access.note_refusal(who);
        }
        answer.map(Response::new)
    }

    async fn get_gang_group(
        &self,
        request: Request<GangGroupRef>,
    ) -> Result<Response<GangGroupStatus>, Status> {
        let admitted = self.access.begin(&request, access::GET_GROUP).await?;
        let seq = request.into_inner().id;
        let record = self.record_for(&admitted.principal, Verb::Get, seq).await?;
        let mut status = crate::convert::group_status(&record);
        status.spread = self.spread(&status.placements).await;
        Ok(Response::new(status))
    }
    type WatchGangGroupStream = StatusStream;

    async fn watch_gang_group(
        &self,
        request: Request<WatchGangGroupRequest>,
    ) -> Result<Response<StatusStream>, Status> {
        let admitted = self.access.begin(&request, access::WATCH_GROUP).await?;
        let WatchGangGroupRequest {
            id: seq,
            after_version,
        } = request.into_inner();
        let first = self
            .record_for(&admitted.principal, Verb::Watch, seq)
            .await?;
        let groups = self.groups.clone();
        self.open_stream(&admitted.principal, move |changes, tx| {
            watch::watch_group(groups, seq, first, after_version, changes, tx)
        })
    }

    type WatchGangGroupsStream = StatusStream;

    async fn watch_gang_groups(
        &self,
        request: Request<WatchGangGroupsRequest>,
    ) -> Result<Response<StatusStream>, Status> {
        let admitted = self.access.begin(&request, access::WATCH_GROUPS).await?;
        let req = request.into_inner();
        if !req.namespace.is_empty() {
            gangway_core::model::names::validate_dns_label(
                &gangway_core::model::FieldPath::new("namespace"),
                &req.namespace,
            )
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let many = watch::ManyWatch {
            groups: self.groups.clone(),
            access: self.access.clone(),
            who: admitted.principal.clone(),
            namespace: req.namespace,
            queue: req.queue,
        };
        self.open_stream(&admitted.principal, move |changes, tx| {
            many.run(req.after_version, changes, tx)
        })
    }

    async fn cancel_gang_group(
        &self,
        request: Request<GangGroupRef>,
    ) -> Result<Response<GangGroupStatus>, Status> {
        let admitted = self.access.begin(&request, access::CANCEL_GROUP).await?;
        let seq = request.into_inner().id;
        if !admitted.principal.is_admin() {
            self.record_for(&admitted.principal, Verb::Delete, seq)
                .await?;
        }
        Ok(Response::new(
            self.command(MetaCommand::Cancel {
                seq,
                at_ms: now_ms(),
            })
            .await?,
        ))
    }

    async fn release_gang_group(
        &self,
        request: Request<GangGroupRef>,
    ) -> Result<Response<GangGroupStatus>, Status> {
        let admitted = self.access.begin(&request, access::RELEASE_GROUP).await?;
        let seq = request.into_inner().id;
        if !admitted.principal.is_admin() {
            self.record_for(&admitted.principal, Verb::Update, seq)
                .await?;
        }
        Ok(Response::new(
            self.command(MetaCommand::Release {
                seq,
                at_ms: now_ms(),
            })
            .await?,
        ))
    }

    async fn release_members(
        &self,
        request: Request<ReleaseMembersRequest>,
    ) -> Result<Response<GangGroupStatus>, Status> {
        let admitted = self.access.begin(&request, access::RELEASE_MEMBERS).await?;
        let req = request.into_inner();
        if req.members.is_empty() {
            return Err(Status::invalid_argument(
                "members: name at least one member",
            ));
        }
        if req.members.len() > GROUP_MEMBERS_MAX {
            return Err(Status::invalid_argument(format!(
                "members: {} named, a group has at most {GROUP_MEMBERS_MAX}",
                req.members.len()
            )));
        }
        if !admitted.principal.is_admin() {
            self.record_for(&admitted.principal, Verb::Update, req.id)
                .await?;
        }
        let reply = if self.failpoints.armed(failpoints::RELEASE_SHARDS_FIRST) {
            let record = self.record(req.id).await?;
            release_members_shards_first(&self.groups, &record, req.members).await
        } else {
            release_members(&self.groups, req.id, req.members).await
        };
        Ok(Response::new(group_status(
            reply.map_err(|e| e.to_status())?,
        )?))
    }

    async fn list_gang_groups(
        &self,
        request: Request<ListGangGroupsRequest>,
    ) -> Result<Response<ListGangGroupsReply>, Status> {
        let admitted = self.access.begin(&request, access::LIST_GROUPS).await?;
        let who = &admitted.principal;
        let req = request.into_inner();
        if let Some(after) = req.changed_after {
            return self.list_changes(who, after, req.limit).await;
        }
        match self
            .groups
            .meta_query(&MetaQuery::Summaries {
                active_only: !req.include_finished,
            })
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Summaries { groups } => Ok(Response::new(ListGangGroupsReply {
                groups: self.visible_only(who, groups).await?,
                stamp: 0,
                more: false,
                forgotten: 0,
            })),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsReply>, Status> {
        self.access.begin(&request, access::LIST_SHARDS).await?;
        let shares = match self
            .groups
            .meta_query(&MetaQuery::ShardShares)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::ShardShares { shares } => shares,
            _ => Vec::new(),
        };
        let capacities = futures::future::join_all(self.shards.ids().map(|shard| async move {
            let read = self.groups.shard_query(shard, &ShardQuery::Capacity);
            match tokio::time::timeout(Duration::from_millis(SHARD_READ_TIMEOUT_MS), read).await {
                Ok(Ok(ShardAnswer::Capacity { allocatable })) => {
                    allocatable.get(&gangway_core::model::resources::ResourceName::Cpu)
                }
                _ => 0,
            }
        }))
        .await;
        let status = self.groups.host().status(false);
        let shards = self
            .shards
            .ids()
            .map(|shard| {
                let g = status.iter().find(|g| g.group_id == u64::from(shard));
                let share = shares.iter().find(|s| s.shard == shard);
                ShardInfo {
                    shard,
                    leader: g.map(|g| g.leader).unwrap_or(0),
                    voters: g.map(|g| g.voters.clone()).unwrap_or_default(),
                    nodes: share.map(|s| s.nodes as u32).unwrap_or(0),
                    domains: share
                        .map(|s| {
                            s.domains
                                .iter()
                                .map(|(d, n)| (d.clone(), *n as u32))
                                .collect()
                        })
                        .unwrap_or_default(),
                    homes: share.map(|s| s.homes.clone()).unwrap_or_default(),
                    capacity_milli_cpu: capacities.get(shard as usize - 1).copied().unwrap_or(0),
                }
            })
            .collect();
        Ok(Response::new(ListShardsReply { shards }))
    }
}
