//! The writes gangway makes to the API server, as plain REST calls: pod bindings
//! with a uid precondition, ResourceClaim status (allocation and reservedFor),
//! events, pod annotations, a preemptor's nominated node and PodGroup status. Each returns the API server's
//! answer classified the way callers act on it. Called by the binder and the
//! ingest loop.

use std::collections::BTreeMap;

use http::{Method, Request};
use serde_json::{json, Value};

use crate::kube::objects::{self, PodRef};
use gangway_core::model::error::FieldPath;
use gangway_core::model::node::Node;
use gangway_core::model::reach::NODE_NAME_FIELD;
use gangway_core::model::resources::Resources;

/// A failed API call.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status.
    #[error("{method} {path}: {code} {reason}: {message}")]
    Status {
        /// Method.
        method: String,
        /// Path.
        path: String,
        /// HTTP code.
        code: u16,
        /// Machine reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// The call did not complete (connection, timeout, decoding).
    #[error("{method} {path}: {source}")]
    Transport {
        /// Method.
        method: String,
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The request could not be built.
    #[error("bad request for {path}: {reason}")]
    Build {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
}

impl ApiError {
    /// The HTTP code of a server answer.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Sends one JSON request and decodes the JSON answer.
pub async fn call(
    client: &kube::Client,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Value, ApiError> {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("content-type", content_type)
        .header("accept", "application/json")
        .body(bytes)
        .map_err(|e| ApiError::Build {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
    client.request::<Value>(request).await.map_err(|e| match e {
        kube::Error::Api(status) => ApiError::Status {
            method: method.to_string(),
            path: path.to_string(),
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        },
        other => ApiError::Transport {
            method: method.to_string(),
            path: path.to_string(),
            source: other,
        },
    })
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

/// What a binding call found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// This call bound the pod to the node.
    Bound,
    /// The pod was bound to the node before (an earlier call, perhaps by an earlier
    /// leader, whose success was not recorded): nothing to announce again.
    AlreadyBound,
    /// The pod is gone or is another pod under the same name.
    PodGone,
    /// The pod is bound to another node (someone else bound it).
    BoundElsewhere(String),
}

/// Binds `pod` to `node` with the pod's uid as precondition; a 409 that shows the
/// pod already on `node` is success ([`BindOutcome::AlreadyBound`]).
pub async fn bind(
    client: &kube::Client,
    pod: &PodRef,
    node: &str,
) -> Result<BindOutcome, ApiError> {
    let path = format!(
        "/api/v1/namespaces/{}/pods/{}/binding",
        pod.namespace, pod.name
    );
    let body = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    match call(client, Method::POST, &path, JSON, Some(&body)).await {
        Ok(_) => Ok(BindOutcome::Bound),
        Err(e) if e.code() == Some(404) => Ok(BindOutcome::PodGone),
        Err(e) if e.code() == Some(409) => {
            let current = get(client, &pod_path(pod)).await?;
            Ok(match current {
                None => BindOutcome::PodGone,
                Some(p) if p["metadata"]["uid"].as_str() != Some(pod.uid.as_str()) => {
                    BindOutcome::PodGone
                }
                Some(p) => match p["spec"]["nodeName"].as_str() {
                    Some(n) if n == node => BindOutcome::AlreadyBound,
                    Some(n) if !n.is_empty() => BindOutcome::BoundElsewhere(n.to_string()),
                    _ => return Err(e),
                },
            })
        }
        Err(e) => Err(e),
    }
}

fn pod_path(pod: &PodRef) -> String {
    format!("/api/v1/namespaces/{}/pods/{}", pod.namespace, pod.name)
}

/// GETs one object; `None` for 404.
pub async fn get(client: &kube::Client, path: &str) -> Result<Option<Value>, ApiError> {
    match call(client, Method::GET, path, JSON, None).await {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What writing a claim's allocation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The claim holds this allocation (written now or before) and is reserved for the pod.
    Written,
    /// The claim does not exist.
    Missing,
    /// The claim is allocated to other devices already, and in use by other pods.
    AllocatedElsewhere,
}

/// Rounds of read-modify-write on a claim before giving up on conflicts.
pub const CLAIM_WRITE_ATTEMPTS_MAX: u32 = 5;

/// Writes `allocation` and `reservedFor: pod` into the status of claim `name`,
/// re-reading on a 409 (another writer changed it). `cached` (the informer's copy)
/// saves the first read: its resourceVersion makes a stale copy's write a 409, after
/// which the claim is read afresh. A copy that already shows the write is read again
/// before it is believed.
pub async fn write_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    allocation: &Value,
    pod: &PodRef,
    cached: Option<&Value>,
) -> Result<ClaimOutcome, ApiError> {
    let path = claim_path(namespace, name);
    let consumer = json!({"resource": "pods", "name": pod.name, "uid": pod.uid});
    let mut last = None;
    let mut base = cached
        .filter(|c| {
            !claim_written(c, allocation, pod) && c["metadata"]["resourceVersion"].is_string()
        })
        .cloned();
    for _ in 0..CLAIM_WRITE_ATTEMPTS_MAX {
        let fresh = match base.take() {
            Some(copy) => Some(copy),
            None => get(client, &path).await?,
        };
        let Some(mut claim) = fresh else {
            return Ok(ClaimOutcome::Missing);
        };
        let status = &mut claim["status"];
        let existing = &status["allocation"];
        let consumers = status["reservedFor"].as_array();
        let reserved = consumers.is_some_and(|r| {
            r.iter()
                .any(|c| c["uid"].as_str() == Some(pod.uid.as_str()))
        });
        let others = consumers.is_some_and(|r| {
            r.iter()
                .any(|c| c["uid"].as_str() != Some(pod.uid.as_str()))
        });
        let same = same_devices(existing, allocation);
        // An allocation reserved for no other pod is one an earlier placement made for
        // this (unbound) pod before it was released; the new placement replaces it.
        if !existing.is_null() && !same && others {
            return Ok(ClaimOutcome::AllocatedElsewhere);
        }
        if !existing.is_null() && same && reserved {
            return Ok(ClaimOutcome::Written);
        }
        // The finalizer first, as upstream's scheduler sets it: the resourceclaim
        // controller deallocates a claim that carries it once no pod is reserved any
        // more, and only then removes it.
        if existing.is_null() && !protected(&claim) {
            match protect_claim(client, &path, &claim).await {
                Ok(updated) => claim = updated,
                Err(e) if e.code() == Some(409) => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        let status = &mut claim["status"];
        let mut consumers = status["reservedFor"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let reserved = consumers
            .iter()
            .any(|c| c["uid"].as_str() == Some(pod.uid.as_str()));
        status["allocation"] = allocation.clone();
        if !reserved {
            consumers.push(consumer.clone());
        }
        status["reservedFor"] = Value::Array(consumers);
        match put_claim_status(client, &path, claim).await {
            Ok(()) => return Ok(ClaimOutcome::Written),
            Err(e) if e.code() == Some(409) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(ApiError::Build {
        path,
        reason: "no attempt made".into(),
    }))
}

/// What became of a pod joining a shared claim another pod allocated.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    /// The claim is reserved for the pod too; its allocation as it stands.
    Joined(Value),
    /// The claim does not exist.
    Missing,
    /// The claim is not allocated (yet): its carrier has not written it.
    NotAllocated,
    /// The claim's devices are not reachable from the pod's node.
    OtherNode,
}

/// Adds `pod` to the `reservedFor` of shared claim `name`, allocated by another pod,
/// once the allocation is there and reachable from `node`, re-reading on a 409.
/// `cached` (the informer's copy) saves the first read, as for [`write_claim`].
pub async fn join_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    pod: &PodRef,
    node: (&str, &BTreeMap<String, String>),
    cached: Option<&Value>,
) -> Result<JoinOutcome, ApiError> {
    let path = claim_path(namespace, name);
    let mut last = None;
    let mut base = cached
        .filter(|c| c["metadata"]["resourceVersion"].is_string())
        .cloned();
    for _ in 0..CLAIM_WRITE_ATTEMPTS_MAX {
        let (fresh, from_cache) = match base.take() {
            Some(copy) => (Some(copy), true),
            None => (get(client, &path).await?, false),
        };
        let Some(mut claim) = fresh else {
            return Ok(JoinOutcome::Missing);
        };
        let allocation = claim["status"]["allocation"].clone();
        if allocation.is_null() {
            if from_cache {
                // The informer may lag the carrier's write: read it from the server.
                continue;
            }
            return Ok(JoinOutcome::NotAllocated);
        }
        if !reachable_from(&allocation, node) {
            if from_cache {
                // A stale copy may show an earlier allocation: ask the server.
                continue;
            }
            return Ok(JoinOutcome::OtherNode);
        }
        let mut consumers = claim["status"]["reservedFor"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if consumers
            .iter()
            .any(|c| c["uid"].as_str() == Some(pod.uid.as_str()))
        {
            return Ok(JoinOutcome::Joined(allocation));
        }
        consumers.push(json!({"resource": "pods", "name": pod.name, "uid": pod.uid}));
        claim["status"]["reservedFor"] = Value::Array(consumers);
        match put_claim_status(client, &path, claim).await {
            Ok(()) => return Ok(JoinOutcome::Joined(allocation)),
            Err(e) if e.code() == Some(409) => last = Some(e),
            Err(e) if e.code() == Some(404) => return Ok(JoinOutcome::Missing),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(ApiError::Build {
        path,
        reason: "no attempt made".into(),
    }))
}

/// Whether an allocation's devices are reachable from `node` (name and labels): no
/// node selector, or a term whose every requirement holds (`metadata.name` fields and
/// label expressions; an empty term matches no node).
fn reachable_from(allocation: &Value, (node, labels): (&str, &BTreeMap<String, String>)) -> bool {
    let Some(terms) = allocation["nodeSelector"]["nodeSelectorTerms"].as_array() else {
        return true;
    };
    terms.iter().any(|term| {
        let Ok(reach) = objects::selector_term(term, &FieldPath::new("nodeSelector")) else {
            return false;
        };
        let mut named = Node::new(node, Resources::zero());
        named.labels = labels.clone().into();
        (!reach.match_fields.is_empty() || !reach.match_expressions.is_empty())
            && reach.match_expressions.iter().all(|r| !r.key.is_empty())
            && reach.match_fields.iter().all(|f| f.key == NODE_NAME_FIELD)
            && reach.admits(&named)
    })
}

/// Takes `pod` out of claim `name`'s `reservedFor` and, when no other consumer is left,
/// deallocates it (allocation and the driver's `status.devices` cleared, so the driver
/// starts afresh), re-reading on a 409. A claim already gone or unallocated is fine.
pub async fn clear_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    pod: &PodRef,
) -> Result<(), ApiError> {
    let path = claim_path(namespace, name);
    let mut last = None;
    for _ in 0..CLAIM_WRITE_ATTEMPTS_MAX {
        let Some(mut claim) = get(client, &path).await? else {
            return Ok(());
        };
        let status = &mut claim["status"];
        if status["allocation"].is_null() {
            return Ok(());
        }
        let consumers: Vec<Value> = status["reservedFor"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["uid"].as_str() != Some(pod.uid.as_str()))
            .cloned()
            .collect();
        if consumers.is_empty() {
            if let Some(fields) = status.as_object_mut() {
                fields.remove("allocation");
                fields.remove("devices");
                fields.remove("reservedFor");
            }
        } else {
            status["reservedFor"] = Value::Array(consumers);
        }
        match put_claim_status(client, &path, claim).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code() == Some(409) => last = Some(e),
            Err(e) if e.code() == Some(404) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(ApiError::Build {
        path,
        reason: "no attempt made".into(),
    }))
}

/// The finalizer upstream's scheduler puts on a claim it allocates; the resourceclaim
/// controller deallocates such a claim once it is reserved for no pod, then removes it.
pub const CLAIM_FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// Whether `claim` carries [`CLAIM_FINALIZER`].
fn protected(claim: &Value) -> bool {
    claim["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == CLAIM_FINALIZER))
}

/// Adds [`CLAIM_FINALIZER`] to `claim` (as read from `path`, its resourceVersion the
/// precondition); answers the claim as updated.
async fn protect_claim(
    client: &kube::Client,
    path: &str,
    claim: &Value,
) -> Result<Value, ApiError> {
    let mut finalizers = claim["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    finalizers.push(json!(CLAIM_FINALIZER));
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": claim["metadata"]["resourceVersion"],
    }});
    merge_patch(client, path, &patch).await
}

/// The API path of ResourceClaim `namespace/name`.
fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

/// Writes `claim` (as read from `path`, with its resourceVersion) through the status
/// subresource.
async fn put_claim_status(
    client: &kube::Client,
    path: &str,
    mut claim: Value,
) -> Result<(), ApiError> {
    // A copy from a list may lack its type; the server needs it in the body.
    claim["apiVersion"] = json!("resource.k8s.io/v1");
    claim["kind"] = json!("ResourceClaim");
    call(
        client,
        Method::PUT,
        &format!("{path}/status"),
        JSON,
        Some(&claim),
    )
    .await
    .map(|_| ())
}

/// Whether `claim` holds `allocation` and is reserved for `pod`.
fn claim_written(claim: &Value, allocation: &Value, pod: &PodRef) -> bool {
    let status = &claim["status"];
    let reserved = status["reservedFor"].as_array().is_some_and(|r| {
        r.iter()
            .any(|c| c["uid"].as_str() == Some(pod.uid.as_str()))
    });
    !status["allocation"].is_null() && same_devices(&status["allocation"], allocation) && reserved
}

/// Whether two allocations give the same devices to the same requests (with the same
/// shares). Not a comparison of whole objects: the API server leaves out empty fields
/// the binder writes (`config: []`), and every pod of a claim carried with network
/// devices writes the allocation it was placed with, which must be found equal to the
/// one stored by whichever pod bound first.
fn same_devices(a: &Value, b: &Value) -> bool {
    let picks = |v: &Value| {
        let mut out: Vec<[String; 5]> = v["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                ["request", "driver", "pool", "device", "shareID"]
                    .map(|f| r[f].as_str().unwrap_or_default().to_string())
            })
            .collect();
        out.sort();
        out
    };
    picks(a) == picks(b)
}

/// Merge-patches `patch` into the object at `path`.
pub async fn merge_patch(
    client: &kube::Client,
    path: &str,
    patch: &Value,
) -> Result<Value, ApiError> {
    call(client, Method::PATCH, path, MERGE, Some(patch)).await
}

const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// What an eviction found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The pod was marked and deleted.
    Deleted,
    /// The pod was already gone (or another pod holds its name now).
    Gone,
}

/// Evicts `pod` the way Kubernetes' taint managers do: a `DisruptionTarget` condition
/// (strategic merge, so the pod's other conditions stay) with `reason` and `message`,
/// then a delete with the pod's uid as precondition.
pub async fn evict(
    client: &kube::Client,
    pod: &PodRef,
    reason: &str,
    message: &str,
    now_rfc3339: &str,
) -> Result<EvictOutcome, ApiError> {
    // The uid in the patch makes the server refuse it (409) for a successor pod.
    let condition = json!({"metadata": {"uid": pod.uid}, "status": {"conditions": [{
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339,
    }]}});
    let status = format!("{}/status", pod_path(pod));
    match call(client, Method::PATCH, &status, STRATEGIC, Some(&condition)).await {
        Ok(current) if current["metadata"]["uid"].as_str() != Some(pod.uid.as_str()) => {
            return Ok(EvictOutcome::Gone)
        }
        Ok(_) => {}
        Err(e) if matches!(e.code(), Some(404 | 409)) => return Ok(EvictOutcome::Gone),
        Err(e) => return Err(e),
    }
    let options = json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": pod.uid},
    });
    match call(client, Method::DELETE, &pod_path(pod), JSON, Some(&options)).await {
        Ok(_) => Ok(EvictOutcome::Deleted),
        // 409: the precondition failed, so the name belongs to another pod now.
        Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(EvictOutcome::Gone),
        Err(e) => Err(e),
    }
}

/// Sets `status.nominatedNodeName` of `pod` to `node`, as kube-scheduler does for a
/// preemptor waiting for its victims to leave; false when the pod is gone (or another
/// pod holds its name now).
pub async fn nominate(client: &kube::Client, pod: &PodRef, node: &str) -> Result<bool, ApiError> {
    let patch = json!({"metadata": {"uid": pod.uid}, "status": {"nominatedNodeName": node}});
    let status = format!("{}/status", pod_path(pod));
    match call(client, Method::PATCH, &status, STRATEGIC, Some(&patch)).await {
        Ok(current) => Ok(current["metadata"]["uid"].as_str() == Some(pod.uid.as_str())),
        Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// Records a core/v1 Event about a pod.
pub async fn pod_event(
    client: &kube::Client,
    component: &str,
    pod: &PodRef,
    kind: EventType,
    reason: &str,
    message: &str,
    now_rfc3339: &str,
) -> Result<(), ApiError> {
    let path = format!("/api/v1/namespaces/{}/events", pod.namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{}.", pod.name), "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                           "namespace": pod.namespace, "uid": pod.uid},
        "reason": reason,
        "message": message,
        "type": match kind { EventType::Normal => "Normal", EventType::Warning => "Warning" },
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now_rfc3339,
        "lastTimestamp": now_rfc3339,
        "count": 1,
    });
    call(client, Method::POST, &path, JSON, Some(&body))
        .await
        .map(|_| ())
}

/// The path of a pod.
pub fn path_of(pod: &PodRef) -> String {
    pod_path(pod)
}

/// `ms` since the epoch as an RFC 3339 UTC timestamp (second precision), as
/// Kubernetes writes times.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        (rem % 3_600) / 60,
        rem % 60
    )
}

/// Milliseconds since the epoch of a Kubernetes timestamp (`2026-11-18T11:06:40Z`, the
/// form `metav1.Time` takes; a fraction of a second, if any, is dropped); `None` for
/// anything else.
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.split('.').next()?;
    let mut t = time.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (t.next()??, t.next()??, t.next()??);
    let valid = (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..=60).contains(&second);
    if !valid || year < 1970 {
        return None;
    }
    // Days from 1970-01-01 to a civil date (the inverse of `rfc3339`'s).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second;
    u64::try_from(secs).ok()?.checked_mul(1_000)
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
