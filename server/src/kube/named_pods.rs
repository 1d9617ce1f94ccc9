//! Kubernetes pods a gRPC group names: whether the pods a framework created are all
//! there and ask what their members ask, so that the binder binds a group's named pods
//! all together or none of them (a gang whose pods are only partly created binds
//! nothing), and says why a group waits.
//!
//! A framework names its pods in the submission (`MemberSpec.pods`): each such member
//! stands for the pod of its own name in its gang's namespace. The pod must carry
//! gangway's `schedulerName` and the annotation [`ANNOTATION_GROUP`] with the group's
//! name; the ingest leaves pods so annotated to their group (no group twice), and a pod
//! of another group's, or of none, is refused rather than bound.
//!
//! Pure: the binder (`kube::binder`) passes the group's record and a lookup into its
//! informer's pods; the ingest uses [`ANNOTATION_GROUP`] and [`framework_group`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::kube::objects::pod_requests;
use gangway_core::ledger::meta::GroupRecord;
use gangway_core::model::{MemberKey, Resources};

/// The annotation a framework's pod carries: the name of the gRPC group that names it.
pub const ANNOTATION_GROUP: &str = "gangway.io/group";

/// How a group's reason starts while its named pods hold its binding back: the binder
/// clears only such a reason once they are ready (a placed group's other reasons, such as
/// whom it preempted, stay).
pub const REASON_PREFIX: &str = "not bound yet: ";

/// Named pods of one group listed in a reason, at most (the rest are counted).
pub const REASON_PODS_MAX: usize = 3;

/// The group a framework's pod says it belongs to (its [`ANNOTATION_GROUP`]).
pub fn framework_group(pod: &Value) -> Option<&str> {
    pod["metadata"]["annotations"][ANNOTATION_GROUP].as_str()
}

/// Where a group's named pods stand, as one replica's informer sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedPods {
    /// Every named pod exists and matches its member: member → its pod (name, uid).
    Ready(BTreeMap<MemberKey, (String, String)>),
    /// Some pods do not exist yet (or are being deleted): nothing binds, nothing is
    /// wrong. The reason names them.
    Waiting(String),
    /// Members that select their pods by labels have none chosen, and enough pods fit
    /// them: (member key, pod name) to record (`MetaCommand::ChoosePods`) before binding.
    Choose(Vec<(String, String)>),
    /// A pod exists that cannot be its member's: nothing binds until it is replaced.
    Refused {
        /// The pod (namespace, name).
        pod: (String, String),
        /// Why, naming the pod.
        why: String,
    },
}

/// What is wrong with one named pod, if anything.
enum PodCheck {
    Ready(String),
    Missing,
    Refused(String),
}

/// Where a check of a group's named pods looks: the replica's informer and meta.
pub struct PodView<'a> {
    /// gangway's scheduler name.
    pub scheduler: &'a str,
    /// A pod by namespace and name.
    pub pod: &'a dyn Fn(&str, &str) -> Option<Arc<Value>>,
    /// Every pod of a namespace (for members that select theirs by labels).
    pub pods_in: &'a dyn Fn(&str) -> Vec<Arc<Value>>,
    /// Whether another live group names this pod (`namespace/name`).
    pub taken: &'a dyn Fn(&str) -> bool,
}

/// Checks every pod `group` names against its member, `node_of` giving a member's node
/// once placed (a pod already bound there counts as ready). Members that select their
/// pods by labels and have none chosen yet get a choice proposed (`NamedPods::Choose`)
/// once enough pods fit them.
pub fn check(
    group: &GroupRecord,
    view: &PodView<'_>,
    node_of: impl Fn(&MemberKey) -> Option<String>,
) -> NamedPods {
    let name = group.group.id.as_str();
    let mut ready = BTreeMap::new();
    let mut missing = Vec::new();
    let mut named = 0usize;
    // Per template (namespace, selector, requests): its members with no pod chosen.
    type Template<'g> = (&'g str, &'g BTreeMap<String, String>, &'g Resources);
    let mut unchosen: Vec<(Template<'_>, Vec<String>)> = Vec::new();
    for gang in &group.group.gangs {
        for m in gang.members.iter().filter(|m| m.binding.is_named()) {
            named += 1;
            let key = gang.member_key(m);
            let Some(full) = group.pod_of(&key) else {
                let template = (gang.namespace.as_str(), &m.pod_selector, &m.spec.requests);
                match unchosen.iter_mut().find(|(t, _)| *t == template) {
                    Some((_, members)) => members.push(key.to_string()),
                    None => unchosen.push((template, vec![key.to_string()])),
                }
                continue;
            };
            let pod_name = full.rsplit('/').next().unwrap_or_default();
            let pod = (view.pod)(&gang.namespace, pod_name);
            let node = node_of(&key);
            match check_pod(pod.as_deref(), name, view.scheduler, &m.spec.requests, node.as_deref()) {
                PodCheck::Ready(uid) => {
                    ready.insert(key, (pod_name.to_string(), uid));
                }
                PodCheck::Missing => missing.push(full),
                PodCheck::Refused(why) => {
                    return NamedPods::Refused {
                        why: format!(
                            "{REASON_PREFIX}pod {full} {why}; none of the group's pods is bound until it is replaced"
                        ),
                        pod: (gang.namespace.clone(), pod_name.to_string()),
                    }
                }
            }
        }
    }
    let mut choices = Vec::new();
    let mut short_of = Vec::new();
    // Pods the group names already, and those proposed below (templates of one
    // namespace may select the same pods: each goes to one member).
    let mut chosen: BTreeSet<String> = group.named_pods().into_iter().map(|(_, p)| p).collect();
    for ((namespace, selector, requests), members) in &unchosen {
        let mut fitting: Vec<String> = (view.pods_in)(namespace)
            .iter()
            .filter(|p| selected(p, selector))
            .filter(|p| p["spec"]["nodeName"].as_str().is_none_or(str::is_empty))
            .filter(|p| {
                let fits = check_pod(Some(p.as_ref()), name, view.scheduler, requests, None);
                matches!(fits, PodCheck::Ready(_))
            })
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .filter(|pod| {
                let full = format!("{namespace}/{pod}");
                !chosen.contains(&full) && !(view.taken)(&full)
            })
            .collect();
        fitting.sort();
        if fitting.len() < members.len() {
            short_of.push(format!(
                "{} more pods in {namespace} with labels {}",
                members.len() - fitting.len(),
                labels(selector)
            ));
            continue;
        }
        for (member, pod) in members.iter().zip(fitting) {
            chosen.insert(format!("{namespace}/{pod}"));
            choices.push((member.clone(), pod));
        }
    }
    if !choices.is_empty() {
        return NamedPods::Choose(choices);
    }
    if missing.is_empty() && short_of.is_empty() {
        return NamedPods::Ready(ready);
    }
    let shown: Vec<&str> = missing
        .iter()
        .take(REASON_PODS_MAX)
        .map(String::as_str)
        .collect();
    let more = match missing.len().saturating_sub(REASON_PODS_MAX) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!(
            "waiting for {} of its {named} named pods to be created before binding any: {}{more}",
            missing.len(),
            shown.join(", ")
        ));
    }
    if !short_of.is_empty() {
        parts.push(format!("waiting for {}", short_of.join("; ")));
    }
    NamedPods::Waiting(format!("{REASON_PREFIX}{}", parts.join("; ")))
}

/// Whether pod `p` carries every label of `selector`.
fn selected(p: &Value, selector: &BTreeMap<String, String>) -> bool {
    let labels = &p["metadata"]["labels"];
    selector
        .iter()
        .all(|(k, v)| labels[k.as_str()].as_str() == Some(v.as_str()))
}

/// A label selector as `k=v,k=v`.
fn labels(selector: &BTreeMap<String, String>) -> String {
    selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One pod against its member: `group` is the group's name, `requests` the member's.
fn check_pod(
    pod: Option<&Value>,
    group: &str,
    scheduler: &str,
    requests: &Resources,
    node: Option<&str>,
) -> PodCheck {
    let Some(pod) = pod else {
        return PodCheck::Missing;
    };
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return PodCheck::Missing;
    }
    let Some(uid) = pod["metadata"]["uid"].as_str().filter(|u| !u.is_empty()) else {
        return PodCheck::Missing;
    };
    let theirs = pod["spec"]["schedulerName"]
        .as_str()
        .unwrap_or("default-scheduler");
    if theirs != scheduler {
        return PodCheck::Refused(format!(
            "has spec.schedulerName {theirs:?}, not {scheduler:?}"
        ));
    }
    match framework_group(pod) {
        Some(g) if g == group => {}
        Some(other) => {
            return PodCheck::Refused(format!(
                "says it belongs to gang group {other:?} (annotation {ANNOTATION_GROUP}), not {group:?}"
            ))
        }
        None => {
            return PodCheck::Refused(format!(
                "lacks the annotation {ANNOTATION_GROUP}: {group:?}"
            ))
        }
    }
    if pod["spec"]["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
    {
        return PodCheck::Refused(
            "lists ResourceClaims, which a member of a gRPC group cannot ask for yet".into(),
        );
    }
    match pod_requests(pod) {
        Ok(asked) if asked == *requests => {}
        Ok(asked) => {
            return PodCheck::Refused(format!(
                "requests {}, but its member asks {}",
                shown(&asked),
                shown(requests)
            ))
        }
        Err(e) => return PodCheck::Refused(format!("cannot be read: {e}")),
    }
    if let Some(bound) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        if node != Some(bound) {
            return PodCheck::Refused(format!(
                "is bound to node {bound}, not to its member's node {}",
                node.unwrap_or("(none yet)")
            ));
        }
    }
    PodCheck::Ready(uid.to_string())
}

/// Requests as Kubernetes quantities, in name order (`cpu=2, memory=1Gi`; `nothing`).
fn shown(r: &Resources) -> String {
    let q: BTreeMap<String, String> = crate::convert::quantities(r).into_iter().collect();
    if q.is_empty() {
        return "nothing".into();
    }
    q.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
#[path = "named_pods_tests.rs"]
mod tests;
