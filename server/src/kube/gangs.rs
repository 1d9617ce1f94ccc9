//! Gang recognition: which pending pods form which gang, and when a gang (or a
//! GangGroup of gangs) has enough ready members to be submitted. Reads Kubernetes' own
//! PodGroups (`scheduling.k8s.io/v1alpha2`, named by a pod's
//! `spec.schedulingGroup.podGroupName`), Volcano's (`scheduling.volcano.sh/v1beta1`,
//! named by the annotation `scheduling.k8s.io/group-name`), the PodGroups of
//! scheduler-plugins (`scheduling.x-k8s.io` and `scheduling.sigs.k8s.io`), the labels
//! and annotations Koordinator accepts, and Kueue's plain pod groups, each gang with its
//! topology constraint ([`crate::kube::topology`]); works out the status each PodGroup API shows
//! ([`pod_group_status`], [`pod_group_scheduled`], [`volcano_status`]), which the ingest
//! writes. Pure: the ingest loop passes the informers' objects in and gets submissions,
//! statuses and per-pod problems out.
//!
//! Invariants: a pod is in at most one submission; a submission's idempotency key is
//! a function of its pods' uids only, so re-deriving it after a failover finds the
//! group already accepted; an invalid pod is reported and left out, never blocking
//! pods that are fine (its gang waits for enough valid members instead).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::kube::objects::{PodProblem, PodRef};
use crate::kube::pod_index::Arrival;
use crate::kube::topology::{kubernetes_topology, kueue_topology, volcano_topology};
use gangway_core::model::gang::DEFAULT_WAIT_TIME_MS;
use gangway_core::model::{Gang, GangGroup, GangId, GangMode, Member, PodSpec, TopologyConstraint};

/// scheduler-plugins' pod label naming the PodGroup (scheduling.x-k8s.io).
pub const LABEL_POD_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// The older scheduler-plugins / Koordinator label naming the PodGroup.
pub const LABEL_POD_GROUP_SIGS: &str = "pod-group.scheduling.sigs.k8s.io";
/// Koordinator's annotation naming the PodGroup.
pub const ANNOTATION_POD_GROUP_NAME: &str = "pod-group.scheduling.sigs.k8s.io/name";
/// Koordinator's annotation with the PodGroup's minimum.
pub const ANNOTATION_POD_GROUP_MIN: &str = "pod-group.scheduling.sigs.k8s.io/min-available";
/// Koordinator gang annotations.
pub const GANG_PREFIX: &str = "gang.scheduling.koordinator.sh/";
/// Volcano's pod annotation naming its PodGroup (`scheduling.volcano.sh`).
pub const ANNOTATION_VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";
/// Volcano's pod annotation naming the task of its job the pod belongs to.
pub const ANNOTATION_VOLCANO_TASK: &str = "volcano.sh/task-spec";
/// Kueue's pod label naming a plain pod group.
pub const LABEL_KUEUE_POD_GROUP: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue's pod annotation with the pod group's size.
pub const ANNOTATION_KUEUE_POD_GROUP_TOTAL: &str = "kueue.x-k8s.io/pod-group-total-count";
/// Marks a pod whose gang timed out (Koordinator's spelling).
pub const ANNOTATION_TIMEOUT: &str = "gang.scheduling.koordinator.sh/timeout";

/// How a pod is scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// On its own.
    Single,
    /// As a member of a gang.
    Gang(GangParams),
}

/// A gang's parameters as its pods (or PodGroup) declare them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangParams {
    /// The gang.
    pub id: GangId,
    /// minMember.
    pub min_member: u32,
    /// totalNumber, if declared.
    pub total_number: Option<u32>,
    /// Strict or NonStrict.
    pub mode: GangMode,
    /// Wait time in ms.
    pub wait_time_ms: u64,
    /// The other gangs of its GangGroup.
    pub group: BTreeSet<GangId>,
    /// How its bound pods count toward minMember.
    pub match_policy: MatchPolicy,
    /// The priority its PodGroup declares (`spec.priority` of a Kubernetes PodGroup);
    /// none: its pods' highest.
    pub priority: Option<i32>,
    /// Its pods join a gang others of which are bound already: submitted as a gang of
    /// its own ([`topped_up`]), since the gang's first group still declares the gang.
    pub top_up: bool,
    /// Where its pods may go in the cluster's topology.
    pub topology: TopologyConstraint,
}

impl GangParams {
    /// A Strict gang `id` of `min_member` in no GangGroup, with no declared priority.
    fn strict(id: GangId, min_member: u32, wait_time_ms: u64, match_policy: MatchPolicy) -> Self {
        Self {
            id,
            min_member,
            total_number: None,
            mode: GangMode::Strict,
            wait_time_ms,
            group: BTreeSet::new(),
            match_policy,
            priority: None,
            top_up: false,
            topology: TopologyConstraint::default(),
        }
    }
}

impl MatchPolicy {
    /// How many of a gang's `bound` pods count toward its minMember.
    pub fn credit(self, bound: BoundPods) -> u32 {
        match self {
            MatchPolicy::OnceSatisfied => bound.ever,
            MatchPolicy::OnlyWaiting => 0,
            MatchPolicy::WaitingAndRunning => bound.running,
        }
    }
}

/// The name under which pods joining gang `id` (others of which are bound) are submitted
/// in the group of key `key`: a gang belongs to one live group at a time (I4), and the
/// gang's first group lives on while its pods run. A function of the group's key, so
/// the ingest recognises the gang again after a failover.
pub fn topped_up(id: &GangId, key: &str) -> GangId {
    let hex = key.strip_prefix("kube:").unwrap_or(key);
    let suffix = &hex[..hex.len().min(TOP_UP_SUFFIX_LEN)];
    // A DNS subdomain, as gang names are: cut the base to fit, at a character boundary.
    let mut end = id
        .name
        .len()
        .min(GANG_NAME_LEN_MAX.saturating_sub(suffix.len() + 1));
    while !id.name.is_char_boundary(end) {
        end -= 1;
    }
    let base = id.name[..end].trim_end_matches(['-', '.']);
    GangId::new(id.namespace.clone(), format!("{base}.{suffix}"))
}

/// Hex digits of a group's key in the name of a gang that tops up another.
const TOP_UP_SUFFIX_LEN: usize = 8;
/// The longest gang name (a DNS subdomain).
const GANG_NAME_LEN_MAX: usize = 253;

/// How a gang's bound pods count toward its minMember when more pods arrive
/// (Koordinator's `match-policy` annotation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatchPolicy {
    /// Once minMember pods were bound (even if some finished since), later pods go alone.
    #[default]
    OnceSatisfied,
    /// Only pending pods count: later pods wait until minMember of them are pending.
    OnlyWaiting,
    /// Pending and running pods count: later pods need minMember minus the running ones.
    WaitingAndRunning,
}

/// A gang's bound pods: `running` not finished, `ever` including finished ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoundPods {
    /// Bound and not finished.
    pub running: u32,
    /// Bound, finished or not.
    pub ever: u32,
}

/// Applies each gang's match policy to its pending pods: returns the gangs already
/// satisfied (their pods go one by one), and lowers minMember (and totalNumber) of
/// `waiting-and-running` gangs by their running pods.
pub fn apply_match_policies(
    ready: &mut [ReadyPod],
    bound: &BTreeMap<GangId, BoundPods>,
) -> BTreeSet<GangId> {
    let mut satisfied = BTreeSet::new();
    for pod in ready.iter_mut() {
        let Identity::Gang(params) = &mut pod.identity else {
            continue;
        };
        let counted = bound.get(&params.id).copied().unwrap_or_default();
        let credit = params.match_policy.credit(counted);
        if credit >= params.min_member {
            satisfied.insert(params.id.clone());
        } else if params.match_policy == MatchPolicy::WaitingAndRunning && credit > 0 {
            params.top_up = true;
            params.group.clear();
            params.min_member -= credit;
            params.total_number = params
                .total_number
                .map(|t| t.saturating_sub(credit).max(params.min_member));
        }
    }
    satisfied
}

/// PodGroups by (namespace, name).
pub type PodGroupIndex = BTreeMap<(String, String), std::sync::Arc<Value>>;

/// Which API a pod's PodGroup belongs to: a pod names one kind, never two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodGroupApi {
    /// Kubernetes' own (`scheduling.k8s.io/v1alpha2`), named by `spec.schedulingGroup`.
    Kubernetes,
    /// scheduler-plugins' CRDs (either API group), named by a label or annotation.
    SchedulerPlugins,
    /// Volcano's CRD (`scheduling.volcano.sh/v1beta1`), named by the annotation
    /// `scheduling.k8s.io/group-name`.
    Volcano,
}

/// The PodGroups known, by API.
#[derive(Debug, Clone, Default)]
pub struct PodGroups {
    /// Kubernetes' own.
    pub kubernetes: PodGroupIndex,
    /// scheduler-plugins' (both API groups).
    pub plugins: PodGroupIndex,
    /// Volcano's.
    pub volcano: PodGroupIndex,
    /// The node label of each of Volcano's network tiers, tier 1 first
    /// ([`crate::kube::topology::volcano_tiers`]).
    pub volcano_tiers: Vec<String>,
}

/// Kubernetes' PodGroup condition that says whether the group's scheduling
/// requirement is met.
pub const CONDITION_POD_GROUP_SCHEDULED: &str = "PodGroupScheduled";

/// The annotation `key` of `pod` (or any object), if it has one.
pub(crate) fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

fn label<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["labels"][key].as_str()
}

fn count(field: &str, text: &str) -> Result<u32, PodProblem> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            PodProblem::Invalid(format!(
                "annotation {field}: \"{text}\" is not a positive integer"
            ))
        })
}

/// A Go duration as Koordinator accepts it (`30s`, `10m`, `1h30m`, `1500ms`), in ms.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let per_unit: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return None,
        };
        total = total.checked_add(value.checked_mul(per_unit)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

fn gang_ref(namespace: &str, text: &str) -> Result<GangId, PodProblem> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => Ok(GangId::new(ns, name)),
        None if !text.is_empty() => Ok(GangId::new(namespace, text)),
        _ => Err(PodProblem::Invalid(format!(
            "annotation {GANG_PREFIX}groups: \"{text}\" is not namespace/name"
        ))),
    }
}

/// The Koordinator keys of `object` (a pod or a PodGroup) laid over `params`.
fn koordinator_overrides(
    object: &Value,
    namespace: &str,
    params: &mut GangParams,
) -> Result<(), PodProblem> {
    let key = |k: &str| format!("{GANG_PREFIX}{k}");
    if let Some(text) = annotation(object, &key("min-available")) {
        params.min_member = count(&key("min-available"), text)?;
    }
    if let Some(text) = annotation(object, &key("total-number")) {
        params.total_number = Some(count(&key("total-number"), text)?);
    }
    if let Some(text) = annotation(object, &key("mode")) {
        params.mode = match text {
            "Strict" => GangMode::Strict,
            "NonStrict" => GangMode::NonStrict,
            other => {
                return Err(PodProblem::Invalid(format!(
                    "annotation {}: unknown mode \"{other}\": expected Strict or NonStrict",
                    key("mode")
                )))
            }
        };
    }
    if let Some(text) = annotation(object, &key("waiting-time")) {
        params.wait_time_ms = parse_duration_ms(text)
            .filter(|ms| *ms > 0)
            .ok_or_else(|| {
                PodProblem::Invalid(format!(
                    "annotation {}: \"{text}\" is not a duration such as 30s or 10m",
                    key("waiting-time")
                ))
            })?;
    }
    if let Some(text) = annotation(object, &key("match-policy")) {
        params.match_policy = match text {
            "once-satisfied" => MatchPolicy::OnceSatisfied,
            "only-waiting" => MatchPolicy::OnlyWaiting,
            "waiting-and-running" => MatchPolicy::WaitingAndRunning,
            other => {
                return Err(PodProblem::Invalid(format!(
                    "annotation {}: unknown policy \"{other}\": expected once-satisfied, only-waiting or waiting-and-running",
                    key("match-policy")
                )))
            }
        };
    }
    if let Some(text) = annotation(object, &key("groups")) {
        let list: Vec<String> = serde_json::from_str(text).map_err(|e| {
            PodProblem::Invalid(format!(
                "annotation {}: not a JSON list of \"namespace/name\" strings: {e}",
                key("groups")
            ))
        })?;
        params.group = list
            .iter()
            .map(|g| gang_ref(namespace, g))
            .collect::<Result<_, _>>()?;
        params.group.remove(&params.id);
    }
    if let Some(total) = params.total_number {
        if total < params.min_member {
            return Err(PodProblem::Invalid(format!(
                "annotation {}: {total} is less than min-available {}",
                key("total-number"),
                params.min_member
            )));
        }
    }
    Ok(())
}

/// A Strict gang `namespace/name` of `min_member` with the Koordinator keys of `object`
/// (a pod or a PodGroup) laid over it.
fn declared(
    object: &Value,
    namespace: &str,
    name: &str,
    min_member: u32,
    wait_time_ms: u64,
) -> Result<GangParams, PodProblem> {
    let mut params = GangParams::strict(
        GangId::new(namespace, name),
        min_member,
        wait_time_ms,
        MatchPolicy::default(),
    );
    koordinator_overrides(object, namespace, &mut params)?;
    Ok(params)
}

/// How the pods of Kubernetes' PodGroup `namespace/name` are scheduled: a `gang` policy
/// is a Strict gang of `minCount` that waits as long as it takes (kube-scheduler retries
/// such a gang until it fits) and counts its running pods toward `minCount` (a pod
/// re-created by its Job joins the running ones); a `basic` policy leaves its pods alone.
/// A gang's topology constraint keeps it in one domain of its key; a `basic` PodGroup's
/// is refused by name rather than ignored (gangway places such pods one by one).
fn kubernetes_pod_group(
    namespace: &str,
    name: &str,
    group: &Value,
) -> Result<Identity, PodProblem> {
    let what = format!("PodGroup {namespace}/{name}");
    let spec = &group["spec"];
    let topology = kubernetes_topology(&what, spec)?;
    let policy = &spec["schedulingPolicy"];
    if policy["gang"].is_object() {
        let min = &policy["gang"]["minCount"];
        let min_member = min
            .as_u64()
            .and_then(|m| u32::try_from(m).ok())
            .filter(|m| *m >= 1)
            .ok_or_else(|| {
                PodProblem::Invalid(format!(
                    "{what}: spec.schedulingPolicy.gang.minCount {min} is not a positive integer"
                ))
            })?;
        let priority = match &spec["priority"] {
            Value::Null => None,
            p => Some(
                p.as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| {
                        PodProblem::Invalid(format!(
                            "{what}: spec.priority {p} is not a 32-bit integer"
                        ))
                    })?,
            ),
        };
        let mut params = GangParams {
            priority,
            topology,
            ..GangParams::strict(
                GangId::new(namespace, name),
                min_member,
                0,
                MatchPolicy::WaitingAndRunning,
            )
        };
        koordinator_overrides(group, namespace, &mut params)?;
        return Ok(Identity::Gang(params));
    }
    if policy["basic"].is_object() {
        if !topology.is_none() {
            return Err(PodProblem::Invalid(format!(
                "{what}: spec.schedulingConstraints.topology needs schedulingPolicy.gang (a basic PodGroup's pods are placed one by one)"
            )));
        }
        return Ok(Identity::Single);
    }
    Err(PodProblem::Invalid(format!(
        "{what}: spec.schedulingPolicy sets neither gang nor basic"
    )))
}

fn pod_group_params(namespace: &str, name: &str, group: &Value) -> Result<GangParams, PodProblem> {
    let min = group["spec"]["minMember"].as_i64().unwrap_or(1);
    let min_member = u32::try_from(min).ok().filter(|m| *m >= 1).ok_or_else(|| {
        PodProblem::Invalid(format!(
            "PodGroup {namespace}/{name}: spec.minMember {min} is not a positive integer"
        ))
    })?;
    let wait_time_ms = group["spec"]["scheduleTimeoutSeconds"]
        .as_u64()
        .map(|s| s.saturating_mul(1_000))
        .filter(|ms| *ms > 0)
        .unwrap_or(DEFAULT_WAIT_TIME_MS);
    declared(group, namespace, name, min_member, wait_time_ms)
}

/// The PodGroup a pod names and its API: Kubernetes' `spec.schedulingGroup.podGroupName`
/// first (an immutable field of the pod), else scheduler-plugins' label or annotation
/// (either API group's spelling).
pub fn pod_group_ref(pod: &Value) -> Option<(PodGroupApi, &str)> {
    if let Some(name) = pod["spec"]["schedulingGroup"]["podGroupName"].as_str() {
        return Some((PodGroupApi::Kubernetes, name));
    }
    if let Some(name) = annotation(pod, ANNOTATION_VOLCANO_GROUP) {
        return Some((PodGroupApi::Volcano, name));
    }
    label(pod, LABEL_POD_GROUP)
        .or_else(|| label(pod, LABEL_POD_GROUP_SIGS))
        .or_else(|| annotation(pod, ANNOTATION_POD_GROUP_NAME))
        .or_else(|| annotation(pod, LABEL_POD_GROUP_SIGS))
        .map(|name| (PodGroupApi::SchedulerPlugins, name))
}

/// The PodGroup a pod names, of either API.
pub fn pod_group_name(pod: &Value) -> Option<&str> {
    pod_group_ref(pod).map(|(_, name)| name)
}

/// The status scheduler-plugins shows for a PodGroup of `min_member` whose pods are
/// `pods`: counts by pod state and the phase they add up to.
pub fn pod_group_status(min_member: u64, pods: &[&Value]) -> Value {
    let count = |f: &dyn Fn(&Value) -> bool| pods.iter().filter(|p| f(p)).count() as u64;
    let phase_is = |p: &Value, want: &str| p["status"]["phase"].as_str() == Some(want);
    let scheduled = count(&|p| {
        p["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
    });
    let running = count(&|p| phase_is(p, "Running"));
    let succeeded = count(&|p| phase_is(p, "Succeeded"));
    let failed = count(&|p| phase_is(p, "Failed"));
    let phase = if succeeded >= min_member {
        "Finished"
    } else if failed > 0 && running + succeeded < min_member {
        "Failed"
    } else if running + succeeded >= min_member {
        "Running"
    } else if scheduled >= min_member {
        "Scheduled"
    } else {
        "Pending"
    };
    serde_json::json!({
        "phase": phase, "scheduled": scheduled, "running": running,
        "succeeded": succeeded, "failed": failed,
    })
}

/// The gang a pod of Volcano's PodGroup `namespace/name` belongs to: the whole PodGroup,
/// a Strict gang of `minMember` (default 1) that waits until it fits and counts its
/// running pods, as Volcano's gang plugin does; or, where `minTaskMember` names tasks, the
/// gang of the pod's task (`volcano.sh/task-spec`), `NAME.TASK` of that task's minimum,
/// in one GangGroup with the other tasks' gangs, so every task reaches its minimum in one
/// decision. A task without a minimum, or a `minMember` more than the tasks' minimums add
/// up to, is refused by name (gangway cannot ask the rest of any task).
fn volcano_pod_group(
    pod: &Value,
    namespace: &str,
    name: &str,
    group: &Value,
    tiers: &[String],
) -> Result<GangParams, PodProblem> {
    let what = format!("PodGroup {namespace}/{name} (scheduling.volcano.sh)");
    let spec = &group["spec"];
    let topology = volcano_topology(&what, spec, tiers)?;
    let positive = |field: &str, v: &Value| {
        v.as_u64()
            .and_then(|m| u32::try_from(m).ok())
            .ok_or_else(|| {
                PodProblem::Invalid(format!("{what}: {field} {v} is not a whole number"))
            })
    };
    let min_member = match &spec["minMember"] {
        Value::Null => 1,
        v => positive("spec.minMember", v)?.max(1),
    };
    let mut params = GangParams {
        topology,
        ..GangParams::strict(
            GangId::new(namespace, name),
            min_member,
            0,
            MatchPolicy::WaitingAndRunning,
        )
    };
    let Some(tasks) = spec["minTaskMember"].as_object().filter(|t| !t.is_empty()) else {
        return Ok(params);
    };
    let mut minimums = BTreeMap::new();
    for (task, min) in tasks {
        let min = positive(&format!("spec.minTaskMember.{task}"), min)?;
        if min > 0 {
            minimums.insert(task.as_str(), min);
        }
    }
    let sum: u32 = minimums.values().sum();
    if min_member > sum {
        return Err(PodProblem::Invalid(format!(
            "{what}: spec.minMember {min_member} is more than spec.minTaskMember adds up to ({sum}); gangway needs each pod counted toward one task's minimum"
        )));
    }
    let task = annotation(pod, ANNOTATION_VOLCANO_TASK).ok_or_else(|| {
        PodProblem::Invalid(format!(
            "{what} sets spec.minTaskMember, but the pod has no annotation {ANNOTATION_VOLCANO_TASK} naming its task"
        ))
    })?;
    let Some(min) = minimums.get(task) else {
        return Err(PodProblem::Invalid(format!(
            "{what}: task \"{task}\" (annotation {ANNOTATION_VOLCANO_TASK}) has no spec.minTaskMember entry; give it one"
        )));
    };
    let task_gang = |t: &str| GangId::new(namespace, format!("{name}.{t}"));
    params.id = task_gang(task);
    params.min_member = *min;
    params.group = minimums
        .keys()
        .filter(|t| **t != task)
        .map(|t| task_gang(t))
        .collect();
    Ok(params)
}

/// What Kubernetes' `PodGroupScheduled` condition says of a PodGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupScheduled {
    /// `True`, reason `Scheduled`: `minCount` of its pods are bound.
    Scheduled,
    /// `False`, reason `Unschedulable`: gangway tried and could not place the gang.
    Unschedulable(String),
}

impl GroupScheduled {
    /// The condition's status, reason and message as kube-scheduler writes them.
    pub fn condition(&self) -> (&'static str, &'static str, &str) {
        match self {
            Self::Scheduled => ("True", "Scheduled", ""),
            Self::Unschedulable(why) => ("False", "Unschedulable", why),
        }
    }
}

/// The `PodGroupScheduled` condition of a Kubernetes PodGroup of `min_count` whose pods
/// are `pods`, given why gangway last failed to place its gang; none before anything
/// is known (no attempt yet), and no `Unschedulable` once `min_count` pods are bound.
pub fn pod_group_scheduled(
    min_count: u64,
    pods: &[&Value],
    unschedulable: Option<&str>,
) -> Option<GroupScheduled> {
    let bound = pods
        .iter()
        .filter(|p| {
            p["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        })
        .count() as u64;
    if bound >= min_count {
        return Some(GroupScheduled::Scheduled);
    }
    unschedulable.map(|why| GroupScheduled::Unschedulable(why.to_string()))
}

/// The `status.conditions` of Kubernetes PodGroup `group` with its `PodGroupScheduled`
/// condition set to `now`; none when the condition already says so. The transition
/// time moves only when the status does, as upstream's condition helpers keep it.
pub fn with_scheduled_condition(group: &Value, now: &GroupScheduled, at: &str) -> Option<Value> {
    let (status, reason, message) = now.condition();
    let mut conditions: Vec<Value> = group["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let old = conditions
        .iter()
        .position(|c| c["type"] == CONDITION_POD_GROUP_SCHEDULED);
    let transition = match old.map(|i| &conditions[i]) {
        Some(c) if c["status"] == status && c["reason"] == reason && c["message"] == message => {
            return None;
        }
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => Value::String(at.to_string()),
    };
    let condition = serde_json::json!({
        "type": CONDITION_POD_GROUP_SCHEDULED, "status": status, "reason": reason,
        "message": message, "lastTransitionTime": transition,
    });
    match old {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    Some(Value::Array(conditions))
}

/// The `status` Volcano shows for a PodGroup of `min_member` whose pods are `pods`, given
/// why gangway last failed to place it: counts, a phase (`Running` once `minMember` pods
/// are bound, `Completed` once that many succeeded and none runs, `Unknown` while only some
/// are bound, else `Pending`) and one condition, `Scheduled` or `Unschedulable`
/// (`NotEnoughResources`), whose transition time moves only with its type. `current` is
/// the PodGroup's status now.
pub fn volcano_status(
    min_member: u64,
    pods: &[&Value],
    unschedulable: Option<&str>,
    current: &Value,
    at: &str,
) -> Value {
    let counts = pod_group_status(min_member, pods);
    let number = |f: &str| counts[f].as_u64().unwrap_or(0);
    let (scheduled, running, succeeded) =
        (number("scheduled"), number("running"), number("succeeded"));
    let phase = if succeeded >= min_member && running == 0 {
        "Completed"
    } else if scheduled >= min_member {
        "Running"
    } else if scheduled > 0 {
        "Unknown"
    } else {
        "Pending"
    };
    let condition = if scheduled >= min_member {
        Some((
            "Scheduled",
            "tasks in gang are ready to be scheduled",
            String::new(),
        ))
    } else {
        unschedulable.map(|why| ("Unschedulable", "NotEnoughResources", why.to_string()))
    };
    let conditions = match condition {
        None => current["conditions"].clone(),
        Some((kind, reason, message)) => {
            let since = current["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == kind))
                .map(|c| c["lastTransitionTime"].clone())
                .unwrap_or_else(|| Value::String(at.to_string()));
            serde_json::json!([{
                "type": kind, "status": "True", "reason": reason, "message": message,
                "transitionID": "", "lastTransitionTime": since,
            }])
        }
    };
    serde_json::json!({
        "phase": phase, "running": running, "succeeded": succeeded,
        "failed": number("failed"), "conditions": conditions,
    })
}

/// How `pod` is to be scheduled, given the PodGroups known; a gang takes Kueue's
/// pod-set topology annotations of its pods over what its PodGroup says.
pub fn identify(pod: &Value, pod_groups: &PodGroups) -> Result<Identity, PodProblem> {
    let mut identity = identify_gang(pod, pod_groups)?;
    if let Identity::Gang(params) = &mut identity {
        if let Some(topology) = kueue_topology(pod)? {
            params.topology = topology;
        }
    }
    Ok(identity)
}

/// The gang (or none) `pod` belongs to, by the first PodGroup API or annotations it uses.
fn identify_gang(pod: &Value, pod_groups: &PodGroups) -> Result<Identity, PodProblem> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    // The PodGroup `name` of `index`, or `absent()` saying which one the pod waits for.
    let find = |index: &'_ PodGroupIndex, name: &str, absent: &dyn Fn() -> PodProblem| {
        index
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(absent)
    };
    match pod_group_ref(pod) {
        Some((PodGroupApi::Kubernetes, name)) => {
            let group = find(&pod_groups.kubernetes, name, &|| {
                PodProblem::Missing(format!(
                "waiting for PodGroup {namespace}/{name} (scheduling.k8s.io), named by spec.schedulingGroup.podGroupName, to be created"
            ))
            })?;
            kubernetes_pod_group(namespace, name, &group)
        }
        Some((PodGroupApi::Volcano, name)) => {
            let group = find(&pod_groups.volcano, name, &|| {
                PodProblem::Waiting(format!(
                    "waiting for PodGroup {namespace}/{name} (scheduling.volcano.sh)"
                ))
            })?;
            volcano_pod_group(pod, namespace, name, &group, &pod_groups.volcano_tiers)
                .map(Identity::Gang)
        }
        Some((PodGroupApi::SchedulerPlugins, name)) => {
            if let Some(min) = annotation(pod, ANNOTATION_POD_GROUP_MIN) {
                // Koordinator's lightweight form: the pod declares the PodGroup's minimum itself.
                let min_member = count(ANNOTATION_POD_GROUP_MIN, min)?;
                return declared(pod, namespace, name, min_member, DEFAULT_WAIT_TIME_MS)
                    .map(Identity::Gang);
            }
            let group = find(&pod_groups.plugins, name, &|| {
                PodProblem::Waiting(format!("waiting for PodGroup {namespace}/{name}"))
            })?;
            pod_group_params(namespace, name, &group).map(Identity::Gang)
        }
        None => koordinator_identity(pod, namespace),
    }
}

/// A pod that names no PodGroup: a Koordinator gang by its annotations, else a Kueue
/// pod group by its label, else alone.
fn koordinator_identity(pod: &Value, namespace: &str) -> Result<Identity, PodProblem> {
    let Some(name) = annotation(pod, &format!("{GANG_PREFIX}name")) else {
        return kueue_pod_group(pod, namespace);
    };
    let min = annotation(pod, &format!("{GANG_PREFIX}min-available")).ok_or_else(|| {
        PodProblem::Invalid(format!(
            "annotation {GANG_PREFIX}min-available: required with {GANG_PREFIX}name"
        ))
    })?;
    let min_member = count(&format!("{GANG_PREFIX}min-available"), min)?;
    declared(pod, namespace, name, min_member, DEFAULT_WAIT_TIME_MS).map(Identity::Gang)
}

/// A pod of a Kueue plain pod group (label `kueue.x-k8s.io/pod-group-name`): a Strict
/// gang of the annotation `kueue.x-k8s.io/pod-group-total-count`, as Kueue admits the
/// group whole; else alone.
fn kueue_pod_group(pod: &Value, namespace: &str) -> Result<Identity, PodProblem> {
    let Some(name) = label(pod, LABEL_KUEUE_POD_GROUP) else {
        return Ok(Identity::Single);
    };
    let total = annotation(pod, ANNOTATION_KUEUE_POD_GROUP_TOTAL).ok_or_else(|| {
        PodProblem::Invalid(format!(
            "annotation {ANNOTATION_KUEUE_POD_GROUP_TOTAL}: required with label {LABEL_KUEUE_POD_GROUP}"
        ))
    })?;
    let min_member = count(ANNOTATION_KUEUE_POD_GROUP_TOTAL, total)?;
    let mut params = GangParams::strict(
        GangId::new(namespace, name),
        min_member,
        0,
        MatchPolicy::WaitingAndRunning,
    );
    params.total_number = Some(min_member);
    Ok(Identity::Gang(params))
}

/// A pending pod ready to be a member: its identity, spec and how it is scheduled.
#[derive(Debug, Clone)]
pub struct ReadyPod {
    /// The pod.
    pub pod: PodRef,
    /// Its scheduling spec.
    pub spec: PodSpec,
    /// Alone or in a gang.
    pub identity: Identity,
    /// When it arrived.
    pub arrival: Arrival,
    /// Its `activeDeadlineSeconds`, in ms (None: not set).
    pub run_limit_ms: Option<u64>,
}

/// The run-time limit of a group of `pods`: the longest of theirs when every one has
/// one (`activeDeadlineSeconds`; a kubelet counts it from the pod's start), else none.
fn run_limit_of<'a>(pods: impl IntoIterator<Item = &'a ReadyPod>) -> Option<u64> {
    pods.into_iter()
        .map(|p| p.run_limit_ms)
        .try_fold(0u64, |longest, limit| Some(longest.max(limit?)))
        .filter(|ms| (1..=gangway_core::model::RUN_LIMIT_MS_MAX).contains(ms))
}

/// One gang group to submit and the pods in it.
#[derive(Debug, Clone)]
pub struct Submission {
    /// Idempotency key (a function of the pods' uids).
    pub key: String,
    /// The group.
    pub group: GangGroup,
    /// Its pods.
    pub pods: Vec<PodRef>,
}

/// A group of `gangs` for `pods`; `top_ups` name the gangs that join others of their
/// gang already bound, renamed by the group's key ([`topped_up`]).
fn submission(
    mut gangs: Vec<Gang>,
    pods: Vec<PodRef>,
    top_ups: &BTreeSet<GangId>,
    run_limit_ms: Option<u64>,
) -> Submission {
    let mut uids: Vec<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
    uids.sort_unstable();
    let digest = Sha256::digest(uids.join(",").as_bytes());
    let hex = hex::encode(&digest[..10]);
    let key = format!("kube:{hex}");
    for gang in &mut gangs {
        let id = GangId::new(gang.namespace.clone(), gang.name.clone());
        if top_ups.contains(&id) {
            gang.name = topped_up(&id, &key).name;
        }
    }
    Submission {
        key,
        group: GangGroup {
            queue: String::new(),
            id: format!("kube-{hex}"),
            gangs,
            run_limit_ms,
            ..Default::default()
        },
        pods,
    }
}

fn gang_of(id: &GangId, params: Option<&GangParams>, pods: &[&ReadyPod]) -> Gang {
    let topology = params.map(|p| p.topology.clone()).unwrap_or_default();
    let (min_member, total, mode, wait, declared_priority) = match params {
        Some(p) => (
            p.min_member,
            p.total_number
                .unwrap_or(pods.len() as u32)
                .max(pods.len() as u32),
            p.mode,
            p.wait_time_ms,
            p.priority,
        ),
        None => (1, 1, GangMode::Strict, 0, None),
    };
    Gang {
        name: id.name.clone(),
        namespace: id.namespace.clone(),
        min_member,
        total_number: total,
        mode,
        wait_time_ms: wait,
        priority: declared_priority
            .unwrap_or_else(|| pods.iter().map(|p| p.spec.priority).max().unwrap_or(0)),
        creation_order: 0,
        members: pods
            .iter()
            .map(|p| Member {
                name: p.pod.name.clone(),
                spec: p.spec.clone(),
                uid: Some(p.pod.uid.clone()),
                binding: Default::default(),
                pod_selector: Default::default(),
            })
            .collect(),
        topology,
    }
}

/// The submissions the ready pods make. `satisfied` names gangs that already
/// reached minMember once: their later pods go one by one, as single pods.
pub fn submissions(ready: &[ReadyPod], satisfied: &BTreeSet<GangId>) -> Vec<Submission> {
    let mut out = Vec::new();
    let mut gangs: BTreeMap<GangId, (GangParams, Vec<&ReadyPod>)> = BTreeMap::new();
    for pod in ready {
        match &pod.identity {
            Identity::Gang(params) if !satisfied.contains(&params.id) => {
                gangs
                    .entry(params.id.clone())
                    .or_insert_with(|| (params.clone(), Vec::new()))
                    .1
                    .push(pod);
            }
            Identity::Gang(params) => {
                // Its gang reached minMember once: it goes alone, under a name of its own.
                out.push(submission(
                    vec![gang_of(&params.id, None, &[pod])],
                    vec![pod.pod.clone()],
                    &BTreeSet::from([params.id.clone()]),
                    run_limit_of([pod]),
                ));
            }
            Identity::Single => {
                let id = GangId::new(pod.pod.namespace.clone(), pod.pod.name.clone());
                out.push(submission(
                    vec![gang_of(&id, None, &[pod])],
                    vec![pod.pod.clone()],
                    &BTreeSet::new(),
                    run_limit_of([pod]),
                ));
            }
        }
    }
    let complete = |id: &GangId| {
        gangs
            .get(id)
            .is_some_and(|(p, pods)| pods.len() as u64 >= u64::from(p.min_member))
    };
    let mut taken: BTreeSet<GangId> = BTreeSet::new();
    for (id, (params, _)) in &gangs {
        if taken.contains(id) {
            continue;
        }
        let mut members: BTreeSet<GangId> = params.group.clone();
        members.insert(id.clone());
        if !members.iter().all(complete) {
            continue;
        }
        let mut group_gangs = Vec::new();
        let mut pods = Vec::new();
        let mut group_pods: Vec<&ReadyPod> = Vec::new();
        let mut top_ups = BTreeSet::new();
        for gid in &members {
            if let Some((p, list)) = gangs.get(gid) {
                if p.top_up {
                    top_ups.insert(gid.clone());
                }
                let cap = p.total_number.map(|t| t as usize).unwrap_or(list.len());
                let list: Vec<&ReadyPod> = list.iter().take(cap).copied().collect();
                pods.extend(list.iter().map(|r| r.pod.clone()));
                group_pods.extend(list.iter().copied());
                group_gangs.push(gang_of(gid, Some(p), &list));
            }
            taken.insert(gid.clone());
        }
        let run_limit_ms = run_limit_of(group_pods);
        out.push(submission(group_gangs, pods, &top_ups, run_limit_ms));
    }
    // Groups go in the order their first pod arrived, as kube-scheduler's queue takes
    // pods (a gang's seq, its place in the queue, must not depend on being a gang).
    let arrival: BTreeMap<&str, &Arrival> = ready
        .iter()
        .map(|r| (r.pod.uid.as_str(), &r.arrival))
        .collect();
    out.sort_by_cached_key(|s| {
        s.pods
            .iter()
            .filter_map(|p| arrival.get(p.uid.as_str()).copied())
            .min()
            .cloned()
    });
    out
}

#[cfg(test)]
#[path = "gangs_tests.rs"]
mod tests;
