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

use std::collections::BTreeMap;
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
    /// Every named pod exists and matches its member: member → its pod's uid.
    Ready(BTreeMap<MemberKey, String>),
    /// Some pods do not exist yet (or are being deleted): nothing binds, nothing is
    /// wrong. The reason names them.
    Waiting(String),
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

/// Checks every pod `group` names against its member: `pod_of(namespace, name)` looks
/// a pod up in the informer, `scheduler` is gangway's scheduler name, and `node_of`
/// gives a member's node once placed (a pod already bound there counts as ready).
pub fn check(
    group: &GroupRecord,
    scheduler: &str,
    pod_of: impl Fn(&str, &str) -> Option<Arc<Value>>,
    node_of: impl Fn(&MemberKey) -> Option<String>,
) -> NamedPods {
    let mut ready = BTreeMap::new();
    let mut missing = Vec::new();
    let mut named = 0usize;
    for gang in &group.group.gangs {
        for m in gang.members.iter().filter(|m| m.binding.is_named()) {
            named += 1;
            let key = gang.member_key(m);
            let pod = pod_of(&gang.namespace, &m.name);
            let node = node_of(&key);
            let at = format!("{}/{}", gang.namespace, m.name);
            match check_pod(
                pod.as_deref(),
                &group.group.id,
                scheduler,
                &m.spec.requests,
                node.as_deref(),
            ) {
                PodCheck::Ready(uid) => {
                    ready.insert(key, uid);
                }
                PodCheck::Missing => missing.push(at),
                PodCheck::Refused(why) => {
                    return NamedPods::Refused {
                        why: format!(
                        "{REASON_PREFIX}pod {at} {why}; none of the group's pods is bound until it is replaced"
                    ),
                        pod: (gang.namespace.clone(), m.name.clone()),
                    }
                }
            }
        }
    }
    if missing.is_empty() {
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
    NamedPods::Waiting(format!(
        "{REASON_PREFIX}waiting for {} of its {named} named pods to be created before binding any: {}{more}",
        missing.len(),
        shown.join(", ")
    ))
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
