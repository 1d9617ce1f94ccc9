//! The binder: on every replica, for each shard it leads, binds the shard's
//! committed Kubernetes pods: the ResourceClaim allocations first (and, for devices
//! with binding conditions, the driver's word that they hold: a failure or a wait past
//! `BINDING_CONDITIONS_TIMEOUT_MS` deallocates the claim and tries again later; a pod
//! that follows a shared claim joins its `reservedFor` once the carrier's allocation is
//! written, and waits on the same conditions), then `pods/binding` with the pod's uid as
//! precondition, then records the binding in
//! the shard's log (`BindConfirmed`, batched). A new leader finds the committed but
//! unconfirmed members in its ledger and binds them again; the API server's 409
//! for a pod already on that node makes the retry a success, so each pod is bound
//! exactly once, to the node the ledger committed. Pods that are gone are left to
//! the ingest loop, which releases them. Owned by `kube::run`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, watch, Mutex, Semaphore};
use tokio::task::JoinSet;

use crate::failpoints;
use crate::kube::allocation::{self, BindingState, SliceReach};
use crate::kube::api::{self, BindOutcome, ClaimOutcome, EventType, JoinOutcome};
use crate::kube::informer::{Cache, Slot};
use crate::kube::named_pods::{self, NamedPods};
use crate::kube::objects::PodRef;
use crate::kube::KubeOptions;
use crate::observe::placement::{self as placement_metrics, Phase, PhaseTimer};
use crate::replicated::growth::ShardCount;
use crate::replicated::{now_ms, Groups};
use gangway_core::ledger::command::LEDGER_BATCH_MAX;
use gangway_core::ledger::meta::{GroupSeq, GroupState, MetaCommand, MetaQuery, MetaReply};
use gangway_core::ledger::LedgerOp;
use gangway_core::model::{clip_to, DeviceId, MemberKey, PodBinding, MESSAGE_CHARS_MAX};
use gangway_core::query::{ShardAnswer, ShardQuery, UnboundMember};

/// Period of the binder's look at its shards, in ms.
pub const BIND_POLL_MS: u64 = 20;
/// Members in flight (binding, or bound and awaiting their `BindConfirmed`) per
/// replica, as a multiple of `--bind-concurrency`: more would only queue on it.
pub const BIND_IN_FLIGHT_PER_SLOT: usize = 2;
/// Wait before a failed binding is tried again, in ms.
pub const BIND_RETRY_MS: u64 = 1_000;
/// Pods remembered as bound elsewhere (reported once each); past it the memory starts
/// over, so such a pod may be reported once more.
pub const CONFLICTS_REMEMBERED_MAX: usize = 10_000;
/// Results queued between binding tasks and the loop.
pub const BIND_RESULTS_QUEUED_MAX: usize = 4_096;
/// Longest wait for a device's binding conditions, in ms (upstream's default binding
/// timeout, 600 s); past it the binding has failed.
pub const BINDING_CONDITIONS_TIMEOUT_MS: u64 = 600_000;
/// Wait after a failed binding (claim deallocated) before it is tried again, in ms.
pub const BINDING_FAILURE_BACKOFF_MS: u64 = 5_000;
/// How long one check of a group's named pods serves its other members, in ms. A
/// group's members are looked at together: one check (and one reason written, one
/// choice proposed) serves them all, where each would otherwise check every pod of the
/// group. Far below `BIND_RETRY_MS`, so no member waits on a stale verdict.
pub const NAMED_VERDICT_REUSE_MS: u64 = 200;
/// Groups whose last named-pod verdict is remembered; past it the memory starts over.
pub const NAMED_VERDICTS_MAX: usize = 1_024;

/// Members remembered as waiting for binding conditions or backing off after a failure;
/// past it the memory starts over (a wait then counts from its next look).
pub const BINDING_WAITS_MAX: usize = 10_000;

/// Members waiting for their devices' binding conditions, and those backing off after
/// a failed binding. Kept by the replica binding them: a new shard leader starts the
/// waits again.
#[derive(Default)]
struct BindingWaits {
    since: HashMap<MemberKey, Instant>,
    failed: HashMap<MemberKey, Instant>,
}

impl BindingWaits {
    /// Whether `member` still backs off after a failure.
    fn backing_off(&mut self, member: &MemberKey) -> bool {
        let now = Instant::now();
        self.failed.retain(|_, at| {
            now.duration_since(*at) < Duration::from_millis(BINDING_FAILURE_BACKOFF_MS)
        });
        self.failed.contains_key(member)
    }

    /// Records that `member` waits; false once it has waited past the timeout.
    fn wait(&mut self, member: &MemberKey) -> bool {
        if self.since.len() >= BINDING_WAITS_MAX {
            self.since.clear();
        }
        let since = *self
            .since
            .entry(member.clone())
            .or_insert_with(Instant::now);
        since.elapsed() < Duration::from_millis(BINDING_CONDITIONS_TIMEOUT_MS)
    }

    fn failed(&mut self, member: &MemberKey) {
        self.since.remove(member);
        if self.failed.len() >= BINDING_WAITS_MAX {
            self.failed.clear();
        }
        self.failed.insert(member.clone(), Instant::now());
    }

    fn done(&mut self, member: &MemberKey) {
        self.since.remove(member);
    }
}

/// How one member's binding ended.
#[derive(Debug)]
enum Done {
    /// Bound; with the pod's uid when the member named its pod and had none.
    Bound(u32, MemberKey, Option<String>),
    Skipped(MemberKey),
    Failed(MemberKey),
}

/// Spaces API calls to at most `qps` per second (0: no limit).
pub struct Pacer {
    gap: Option<Duration>,
    next: Mutex<Instant>,
}

impl Pacer {
    /// A pacer for `qps` calls per second.
    pub fn new(qps: u32) -> Self {
        Self {
            gap: (qps > 0).then(|| Duration::from_secs(1) / qps),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits for the next slot.
    pub async fn wait(&self) {
        let Some(gap) = self.gap else { return };
        let at = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let at = (*next).max(now);
            *next = at + gap;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// Everything a binding task needs.
struct Ctx {
    client: kube::Client,
    cache: Arc<Cache>,
    opts: KubeOptions,
    pacer: Pacer,
    slots: Semaphore,
    /// Pods found bound elsewhere, with the node: reported once each.
    conflicts: std::sync::Mutex<HashMap<PodRef, String>>,
    /// Members waiting for binding conditions or backing off after a failure.
    binding: std::sync::Mutex<BindingWaits>,
    /// The replica's groups: what a group that names its pods holds, and where its
    /// binding reason is written.
    groups: Groups,
    /// Named pods refused, with the reason: reported once each.
    refused: std::sync::Mutex<HashMap<PodRef, String>>,
    /// Group → (its version, when checked, the verdict on its named pods).
    verdicts: std::sync::Mutex<HashMap<GroupSeq, (u64, Instant, NamedPods)>>,
}

/// Runs the binder until `stop` fires.
pub async fn run(
    groups: Groups,
    shards: ShardCount,
    client: kube::Client,
    cache: Arc<Cache>,
    opts: KubeOptions,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(Ctx {
        client,
        cache,
        pacer: Pacer::new(opts.bind_qps),
        slots: Semaphore::new(opts.bind_concurrency.max(1)),
        conflicts: std::sync::Mutex::new(HashMap::new()),
        binding: std::sync::Mutex::new(BindingWaits::default()),
        groups: groups.clone(),
        refused: std::sync::Mutex::new(HashMap::new()),
        verdicts: std::sync::Mutex::new(HashMap::new()),
        opts,
    });
    let (tx, mut rx) = mpsc::channel::<Done>(BIND_RESULTS_QUEUED_MAX);
    let mut tasks = JoinSet::new();
    let mut in_flight: HashSet<MemberKey> = HashSet::new();
    let mut retry_at: HashMap<MemberKey, Instant> = HashMap::new();
    let mut bound: BTreeMap<u32, Vec<(MemberKey, Option<String>)>> = BTreeMap::new();
    let in_flight_max = ctx.opts.bind_concurrency.max(1) * BIND_IN_FLIGHT_PER_SLOT;
    // Per shard: its apply feed, and whether to look even without new entries.
    let mut feeds: BTreeMap<u32, gangway_raft::GroupChanges> = BTreeMap::new();
    let mut look_again: HashSet<u32> = shards.ids().collect();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::sleep(Duration::from_millis(BIND_POLL_MS)) => {}
        }
        while let Ok(done) = rx.try_recv() {
            match done {
                Done::Bound(shard, m, uid) => bound.entry(shard).or_default().push((m, uid)),
                // A skipped member (pod gone) waits for the ingest loop to release it.
                Done::Skipped(m) | Done::Failed(m) => {
                    in_flight.remove(&m);
                    retry_at.insert(m, Instant::now() + Duration::from_millis(BIND_RETRY_MS));
                    look_again.extend(shards.ids());
                }
            }
        }
        while tasks.try_join_next().is_some() {}
        if !bound.is_empty() {
            // Confirmed members free their slots (for any shard this replica leads).
            look_again.extend(shards.ids());
        }
        confirm(&groups, &mut bound, &mut in_flight).await;
        let me = groups.host().node_id();
        let now = Instant::now();
        let retry_due = retry_at.len();
        retry_at.retain(|_, at| *at > now);
        if retry_at.len() != retry_due {
            look_again.extend(shards.ids());
        }
        for shard in shards.ids() {
            if groups.host().leader_of(u64::from(shard)) != Some(me) {
                feeds.remove(&shard);
                look_again.insert(shard);
                continue;
            }
            // A look reads the shard's whole ledger: only after new entries, a freed
            // slot or a retry coming due.
            let applied = match feeds.get_mut(&shard) {
                Some(feed) => feed.applied_since(),
                None => {
                    if let Ok(feed) = groups.host().changes(u64::from(shard)) {
                        feeds.insert(shard, feed);
                    }
                    true
                }
            };
            let asked = look_again.remove(&shard);
            if in_flight.len() >= in_flight_max {
                // Full: look once a slot frees.
                look_again.insert(shard);
                continue;
            }
            if !(applied || asked) {
                continue;
            }
            // Members in flight or waiting for a retry may come first: ask past them.
            let limit = u32::try_from(in_flight_max + retry_at.len()).unwrap_or(u32::MAX);
            let members = match groups.shard_query_local(shard, &ShardQuery::Unbound { limit }) {
                Ok(ShardAnswer::Unbound { members }) => members,
                Ok(other) => {
                    tracing::warn!(shard, answer = ?other, "unexpected answer to Unbound");
                    continue;
                }
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot read unbound members");
                    continue;
                }
            };
            for m in members {
                if in_flight.contains(&m.member) || retry_at.contains_key(&m.member) {
                    continue;
                }
                if in_flight.len() >= in_flight_max {
                    look_again.insert(shard);
                    break;
                }
                in_flight.insert(m.member.clone());
                let (ctx, tx) = (ctx.clone(), tx.clone());
                tasks.spawn(async move {
                    let key = m.member.clone();
                    let done = match bind_member(&ctx, &m).await {
                        Ok(Some(uid)) => Done::Bound(shard, key, m.pod.uid.is_none().then_some(uid)),
                        Ok(None) => Done::Skipped(key),
                        Err(e) => {
                            tracing::warn!(member = %key, node = %m.node, error = %e, "binding failed; will retry");
                            Done::Failed(key)
                        }
                    };
                    let _ = tx.send(done).await;
                });
            }
        }
    }
    tasks.shutdown().await;
}

/// Records finished bindings in their shards' logs, one batch per shard.
async fn confirm(
    groups: &Groups,
    bound: &mut BTreeMap<u32, Vec<(MemberKey, Option<String>)>>,
    in_flight: &mut HashSet<MemberKey>,
) {
    for (shard, members) in std::mem::take(bound) {
        for chunk in members.chunks(LEDGER_BATCH_MAX) {
            let ops = chunk
                .iter()
                .map(|(m, uid)| LedgerOp::BindConfirmed {
                    member: m.clone(),
                    uid: uid.clone(),
                })
                .collect();
            match groups.shard(shard, LedgerOp::Batch { ops }).await {
                Ok(_) => {
                    for (m, _) in chunk {
                        in_flight.remove(m);
                    }
                }
                Err(e) => {
                    // The bindings stand; a later look (here or on a new leader) confirms them.
                    tracing::warn!(shard, error = %e, "recording bindings failed");
                    for (m, _) in chunk {
                        in_flight.remove(m);
                    }
                }
            }
        }
    }
}

/// Binds one member: the pod of its uid, or the pod it names once every pod its group
/// names is ready. Answers the pod's uid once bound; `None` when there is nothing to
/// do now (its pod is gone or replaced, or its group's pods are not all ready).
async fn bind_member(ctx: &Ctx, m: &UnboundMember) -> Result<Option<String>, api::ApiError> {
    let (name, uid) = match (&m.pod.uid, m.pod.binding) {
        (Some(uid), _) => (m.member.member.clone(), uid.clone()),
        (None, PodBinding::Named) => match ctx.named_pod(m).await {
            Some(pod) => pod,
            None => return Ok(None),
        },
        (None, PodBinding::Unnamed) => return Ok(None),
    };
    let pod = PodRef {
        namespace: m.member.namespace.clone(),
        name,
        uid,
    };
    Ok(bind_pod(ctx, m, &pod).await?.then_some(pod.uid))
}

/// Binds `pod` as member `m`; `Ok(false)` when it is gone or replaced (nothing to do
/// here).
async fn bind_pod(ctx: &Ctx, m: &UnboundMember, pod: &PodRef) -> Result<bool, api::ApiError> {
    let pod = pod.clone();
    let Some(object) = ctx.cache.get(Slot::Pods, &pod.namespace, &pod.name) else {
        return Ok(false);
    };
    if object["metadata"]["uid"].as_str() != Some(pod.uid.as_str()) {
        return Ok(false);
    }
    if object["spec"]["nodeName"].as_str() == Some(m.node.as_str()) {
        return Ok(true);
    }
    if ctx.waits().backing_off(&m.member) {
        return Ok(false);
    }
    let _slot = ctx.slots.acquire().await;
    let _timer = PhaseTimer::start(Phase::Bind);
    let mut claims: BTreeMap<&str, Vec<&gangway_core::model::DeviceAllocation>> = BTreeMap::new();
    for d in &m.pod.devices {
        claims.entry(d.claim.as_str()).or_default().push(d);
    }
    for (claim, devices) in claims {
        let Some(object_name) = claim_object(&object, claim) else {
            tracing::warn!(pod = %pod, claim, "placed claim is not in the pod's spec or status");
            return Ok(false);
        };
        // The claim's spec is immutable, so the informer's copy says which configs apply.
        let Some(cached) = ctx
            .cache
            .get(Slot::ResourceClaims, &pod.namespace, &object_name)
        else {
            tracing::debug!(pod = %pod, claim = %object_name, "claim not in this replica's informer yet");
            return Ok(false);
        };
        let class_of = |class: &str| ctx.cache.get(Slot::DeviceClasses, "", class);
        let device_of = |id: &DeviceId| published_device(&ctx.cache, id);
        let reach_of = |id: &DeviceId| published_reach(&ctx.cache, id);
        let allocation = match allocation::allocation(
            &m.node, &cached, &class_of, &device_of, &reach_of, &devices,
        ) {
            Ok(mut allocation) => {
                if ctx.opts.failpoints.armed(failpoints::BINDER_DROPS_CONFIGS) {
                    allocation["devices"]["config"] = Value::Array(Vec::new());
                }
                if ctx.opts.failpoints.armed(failpoints::SHARE_IDS_NOT_UUIDS) {
                    name_shares(&mut allocation, &m.member, claim);
                }
                allocation
            }
            Err(e) => {
                tracing::warn!(pod = %pod, claim = %object_name, error = %e, "claim cannot be allocated yet; not binding");
                return Ok(false);
            }
        };
        ctx.pacer.wait().await;
        match api::write_claim(
            &ctx.client,
            &pod.namespace,
            &object_name,
            &allocation,
            &pod,
            Some(&cached),
        )
        .await?
        {
            ClaimOutcome::Written => {}
            ClaimOutcome::Missing => return Ok(false),
            ClaimOutcome::AllocatedElsewhere => {
                tracing::error!(pod = %pod, claim = %object_name, "claim already allocated to other devices; not binding");
                return Ok(false);
            }
        }
        if !binding_conditions_met(ctx, &pod, &object_name, &m.member, &allocation, cached).await? {
            return Ok(false);
        }
    }
    // Shared claims another pod of the gang allocated: join them once they are written.
    for share in m.pod.followed() {
        let Some(object_name) = claim_object(&object, &share.pod_claim) else {
            tracing::warn!(pod = %pod, claim = share.pod_claim, "shared claim is not in the pod's spec or status");
            return Ok(false);
        };
        let cached = ctx
            .cache
            .get(Slot::ResourceClaims, &pod.namespace, &object_name);
        let labels: BTreeMap<String, String> = ctx
            .cache
            .get(Slot::Nodes, "", &m.node)
            .and_then(|n| serde_json::from_value(n["metadata"]["labels"].clone()).ok())
            .unwrap_or_default();
        ctx.pacer.wait().await;
        let joined = api::join_claim(
            &ctx.client,
            &pod.namespace,
            &object_name,
            &pod,
            (&m.node, &labels),
            cached.as_deref(),
        )
        .await?;
        let allocation = match joined {
            JoinOutcome::Joined(allocation) => allocation,
            JoinOutcome::Missing => return Ok(false),
            JoinOutcome::NotAllocated => {
                tracing::debug!(pod = %pod, claim = %object_name, "waiting for the shared claim's carrier to allocate it");
                return Ok(false);
            }
            JoinOutcome::OtherNode => {
                tracing::error!(pod = %pod, claim = %object_name, node = %m.node, "shared claim allocated for another node; not binding");
                return Ok(false);
            }
        };
        let Some(cached) = cached else {
            return Ok(false);
        };
        if !binding_conditions_met(ctx, &pod, &object_name, &m.member, &allocation, cached).await? {
            return Ok(false);
        }
    }
    ctx.waits().done(&m.member);
    ctx.pacer.wait().await;
    match api::bind(&ctx.client, &pod, &m.node).await? {
        BindOutcome::Bound => ctx.opts.failpoints.hit(failpoints::BINDER_AFTER_BIND),
        // Bound before (and announced then): a retry's success says nothing new.
        BindOutcome::AlreadyBound => return Ok(true),
        BindOutcome::PodGone => return Ok(false),
        BindOutcome::BoundElsewhere(other) => {
            report_conflict_once(ctx, &pod, &m.node, &other);
            return Ok(false);
        }
    }
    placement_metrics::pod_bound();
    let message = format!("Successfully assigned {pod} to {}", m.node);
    ctx.event(&pod, EventType::Normal, "Scheduled", &message)
        .await;
    Ok(true)
}

impl Ctx {
    /// The pod (name, uid) member `m` stands for, once every pod its group names exists
    /// and matches its member (this replica's informer's view); none while the group
    /// waits for pods or refuses one. The group's reason says which (written when it
    /// changes), and a refused pod gets an event. Members that select pods by labels get
    /// them chosen first (`MetaCommand::ChoosePods`).
    async fn named_pod(&self, m: &UnboundMember) -> Option<(String, String)> {
        let gang = format!("{}/{}", m.member.namespace, m.member.gang);
        let record = match self
            .groups
            .meta_query_local(&MetaQuery::OwnersOf { gangs: vec![gang] })
        {
            Ok(MetaReply::Groups { mut records }) if !records.is_empty() => records.remove(0),
            _ => return None,
        };
        let placements = record.placements.to_map();
        // Only the group that holds this member on this node binds its pod (a group
        // that named the pod after this one ended waits for its own placement).
        let holds = placements
            .get(&m.member.to_string())
            .is_some_and(|p| p.node == m.node);
        if !holds || record.state != GroupState::Placed {
            return None;
        }
        if let Some(verdict) = self.recent_verdict(record.seq, record.version) {
            return match verdict {
                NamedPods::Ready(pods) => pods.get(&m.member).cloned(),
                _ => None,
            };
        }
        // The view borrows closures that are not Send: gone before the writes below.
        let verdict = {
            let pod = |ns: &str, name: &str| self.cache.get(Slot::Pods, ns, name);
            let pods_in = |ns: &str| {
                self.cache.read(Slot::Pods, |o| {
                    o.range((ns.to_string(), String::new())..)
                        .take_while(|((namespace, _), _)| namespace == ns)
                        .map(|(_, p)| p.clone())
                        .collect()
                })
            };
            let taken = |full: &str| {
                let query = MetaQuery::NamedPod {
                    pod: full.to_string(),
                };
                matches!(
                    self.groups.meta_query_local(&query),
                    Ok(MetaReply::Groups { records }) if records.iter().any(|r| r.seq != record.seq)
                )
            };
            let view = named_pods::PodView {
                scheduler: &self.opts.scheduler_name,
                pod: &pod,
                pods_in: &pods_in,
                taken: &taken,
            };
            named_pods::check(&record, &view, |key| {
                placements.get(&key.to_string()).map(|p| p.node.clone())
            })
        };
        self.remember_verdict(record.seq, record.version, &verdict);
        let reason = match &verdict {
            // Ready: only a reason of the binder's own is cleared.
            NamedPods::Ready(_) if record.reason.starts_with(named_pods::REASON_PREFIX) => "",
            NamedPods::Ready(_) => record.reason.as_str(),
            NamedPods::Waiting(why) => why.as_str(),
            NamedPods::Refused { why, .. } => why.as_str(),
            NamedPods::Choose(_) => record.reason.as_str(),
        };
        // Compared as meta keeps it, so a long reason is not written again every look.
        let reason = clip_to(reason, MESSAGE_CHARS_MAX);
        if record.reason != reason {
            let note = MetaCommand::NoteBinding {
                seq: record.seq,
                reason: reason.to_string(),
            };
            if let Err(e) = self.groups.meta(&note).await {
                tracing::debug!(group = record.seq, error = %e, "binding reason not recorded");
            }
        }
        match verdict {
            NamedPods::Ready(mut uids) => uids.remove(&m.member),
            NamedPods::Waiting(_) => None,
            NamedPods::Choose(choices) => {
                let choose = MetaCommand::ChoosePods {
                    seq: record.seq,
                    choices,
                };
                // Another shard's binder may have chosen first: meta keeps one choice.
                if let Err(e) = self.groups.meta(&choose).await {
                    tracing::debug!(group = record.seq, error = %e, "pods not chosen");
                }
                None
            }
            NamedPods::Refused { pod, why } => {
                self.report_refusal_once(&pod, &why).await;
                None
            }
        }
    }

    /// The verdict on group `seq`'s named pods, if checked at `version` within
    /// `NAMED_VERDICT_REUSE_MS`.
    fn recent_verdict(&self, seq: GroupSeq, version: u64) -> Option<NamedPods> {
        let verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        let (at_version, at, verdict) = verdicts.get(&seq)?;
        let fresh = at.elapsed() < Duration::from_millis(NAMED_VERDICT_REUSE_MS);
        (*at_version == version && fresh).then(|| verdict.clone())
    }

    fn remember_verdict(&self, seq: GroupSeq, version: u64, verdict: &NamedPods) {
        let mut verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if verdicts.len() >= NAMED_VERDICTS_MAX {
            verdicts.clear();
        }
        verdicts.insert(seq, (version, Instant::now(), verdict.clone()));
    }

    /// Records a `FailedScheduling` event on refused pod `pod` (namespace, name), once
    /// per pod and reason.
    async fn report_refusal_once(&self, pod: &(String, String), why: &str) {
        let Some(pod) = self
            .cache
            .get(Slot::Pods, &pod.0, &pod.1)
            .and_then(|o| crate::kube::objects::pod_ref(&o))
        else {
            return;
        };
        {
            let mut seen = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            if seen.get(&pod).map(String::as_str) == Some(why) {
                return;
            }
            if seen.len() >= CONFLICTS_REMEMBERED_MAX {
                seen.clear();
            }
            seen.insert(pod.clone(), why.to_string());
        }
        self.event(&pod, EventType::Warning, "FailedScheduling", why)
            .await;
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, BindingWaits> {
        self.binding.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an event on `pod`, best effort (as kube-scheduler's events are).
    async fn event(&self, pod: &PodRef, kind: EventType, reason: &str, message: &str) {
        let now = api::rfc3339(now_ms());
        let sent = api::pod_event(
            &self.client,
            &self.opts.scheduler_name,
            pod,
            kind,
            reason,
            message,
            &now,
        )
        .await;
        if let Err(e) = sent {
            tracing::debug!(pod = %pod, reason, error = %e, "event not recorded");
        }
    }
}

/// The device `id` as the newest generation of its pool publishes it (a scan of the
/// informer's slices: asked only while binding pods with devices).
fn published_device(cache: &Cache, id: &DeviceId) -> Option<Value> {
    cache.read(Slot::ResourceSlices, |slices| {
        slices
            .values()
            .filter_map(|slice| {
                let spec = &slice["spec"];
                if spec["driver"].as_str() != Some(id.driver.as_str())
                    || spec["pool"]["name"].as_str() != Some(id.pool.as_str())
                {
                    return None;
                }
                let device = spec["devices"]
                    .as_array()?
                    .iter()
                    .find(|d| d["name"].as_str() == Some(id.device.as_str()))?;
                Some((
                    spec["pool"]["generation"].as_u64().unwrap_or(0),
                    device.clone(),
                ))
            })
            .max_by_key(|(generation, _)| *generation)
            .map(|(_, device)| device)
    })
}

/// The nodes `id` is reachable from as the slices of its pool say, from its newest
/// generation (a scan of the informer's slices, as for [`published_device`]): the
/// slice's, or, where the slice chooses nodes per device, the device's own; a pool no
/// slice publishes any more counts as the pod's node only.
fn published_reach(cache: &Cache, id: &DeviceId) -> SliceReach {
    let newest = cache.read(Slot::ResourceSlices, |slices| {
        slices
            .values()
            .map(|slice| &slice["spec"])
            .filter(|spec| {
                spec["driver"].as_str() == Some(id.driver.as_str())
                    && spec["pool"]["name"].as_str() == Some(id.pool.as_str())
            })
            .max_by_key(|spec| spec["pool"]["generation"].as_u64().unwrap_or(0))
            .cloned()
    });
    let Some(spec) = newest else {
        return SliceReach::Node;
    };
    if spec["perDeviceNodeSelection"].as_bool() != Some(true) {
        return reach_of(&spec);
    }
    match published_device(cache, id) {
        Some(device) => reach_of(&device),
        None => SliceReach::Node,
    }
}

/// The reach a slice spec (or, with `perDeviceNodeSelection`, a device) states:
/// `allNodes`, a node selector's first term, else one node.
fn reach_of(object: &Value) -> SliceReach {
    if object["allNodes"].as_bool() == Some(true) {
        SliceReach::AllNodes
    } else if let Some(term) = object["nodeSelector"]["nodeSelectorTerms"]
        .as_array()
        .and_then(|terms| terms.first())
    {
        SliceReach::Term(term.clone())
    } else {
        SliceReach::Node
    }
}

/// The bug behind `SHARE_IDS_NOT_UUIDS`: each share id written as the names of its
/// allocation (member, pod claim, request), which the API server refuses.
fn name_shares(allocation: &mut Value, member: &MemberKey, claim: &str) {
    let results = allocation["devices"]["results"].as_array_mut();
    for r in results.into_iter().flatten() {
        if r["shareID"].is_string() {
            let request = r["request"].as_str().unwrap_or_default().to_string();
            r["shareID"] = Value::String(format!("{member}:{claim}:{request}"));
        }
    }
}

/// Whether the devices of claim `claim` (allocated as `allocation`) let the pod bind:
/// their binding conditions are True in the driver's status as this replica's informer
/// has seen it (else `cached`). A failure condition, or a wait past
/// `BINDING_CONDITIONS_TIMEOUT_MS`, fails the binding (see [`fail_binding`]).
async fn binding_conditions_met(
    ctx: &Ctx,
    pod: &PodRef,
    claim: &str,
    member: &MemberKey,
    allocation: &Value,
    cached: std::sync::Arc<Value>,
) -> Result<bool, api::ApiError> {
    let seen = ctx
        .cache
        .get(Slot::ResourceClaims, &pod.namespace, claim)
        .unwrap_or(cached);
    let state = if ctx
        .opts
        .failpoints
        .armed(failpoints::BINDER_IGNORES_BINDING_CONDITIONS)
    {
        BindingState::Ready
    } else {
        allocation::binding_state(allocation, &seen)
    };
    match state {
        BindingState::Ready => Ok(true),
        BindingState::Waiting { device, condition } => {
            if ctx.waits().wait(member) {
                tracing::debug!(pod = %pod, device, condition, "waiting for a binding condition");
                return Ok(false);
            }
            let why = format!(
                "binding condition {condition} of device {device} not True after {} s",
                BINDING_CONDITIONS_TIMEOUT_MS / 1_000
            );
            fail_binding(ctx, pod, claim, member, &why).await?;
            Ok(false)
        }
        BindingState::Failed { device, condition } => {
            let why = format!("device {device} reports binding failure condition {condition}");
            fail_binding(ctx, pod, claim, member, &why).await?;
            Ok(false)
        }
    }
}

/// A binding that failed its devices' conditions (or waited past the timeout), as
/// upstream's scheduler handles it: the claim is deallocated (the driver starts afresh)
/// and a Warning event says why; the member stays placed and is tried again after
/// `BINDING_FAILURE_BACKOFF_MS`, on the same devices.
async fn fail_binding(
    ctx: &Ctx,
    pod: &PodRef,
    claim: &str,
    member: &MemberKey,
    why: &str,
) -> Result<(), api::ApiError> {
    ctx.waits().failed(member);
    tracing::warn!(pod = %pod, claim, reason = why, "binding failed; claim deallocated, trying again later");
    api::clear_claim(&ctx.client, &pod.namespace, claim, pod).await?;
    let message = format!(
        "{why}; pod taken out of ResourceClaim {claim}'s reservedFor (the claim deallocated unless other pods share it), binding tried again in {} s",
        BINDING_FAILURE_BACKOFF_MS / 1_000
    );
    ctx.event(pod, EventType::Warning, "FailedBinding", &message)
        .await;
    Ok(())
}

/// Logs a pod bound to another node than the ledger's, once per pod and node (the
/// binder looks again every `BIND_RETRY_MS` until the ingest loop releases it).
fn report_conflict_once(ctx: &Ctx, pod: &PodRef, ledger: &str, api: &str) {
    let mut seen = ctx.conflicts.lock().unwrap_or_else(|p| p.into_inner());
    if seen.get(pod).map(String::as_str) == Some(api) {
        return;
    }
    if seen.len() >= CONFLICTS_REMEMBERED_MAX {
        seen.clear();
    }
    seen.insert(pod.clone(), api.to_string());
    tracing::error!(pod = %pod, ledger = %ledger, api = %api, "pod bound to another node by someone else");
}

/// The ResourceClaim object behind pod claim `claim`.
fn claim_object(pod: &Value, claim: &str) -> Option<String> {
    let entry = pod["spec"]["resourceClaims"]
        .as_array()?
        .iter()
        .find(|e| e["name"].as_str() == Some(claim))?;
    if let Some(name) = entry["resourceClaimName"].as_str() {
        return Some(name.to_string());
    }
    pod["status"]["resourceClaimStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"].as_str() == Some(claim))?["resourceClaimName"]
        .as_str()
        .map(String::from)
}
