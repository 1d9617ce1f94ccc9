//! The API server's audit log, read back: the control plane writes one JSON line per
//! completed write of the kinds tests reason about (bindings, claim status, pod and
//! event writes), so a test can count bindings per pod and order a claim's status
//! write before its pod's binding, as the real server saw them.

use std::path::Path;

use serde_json::Value;

/// The audit policy the API server runs with: requests of bindings (to see the
/// node), metadata of the other writes tests look at, nothing else.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Request
    verbs: ["create"]
    resources: [{group: "", resources: ["pods/binding"]}]
  - level: Metadata
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - {group: "", resources: ["pods", "pods/status", "events"]}
      - {group: "resource.k8s.io", resources: ["resourceclaims", "resourceclaims/status"]}
      - {group: "scheduling.x-k8s.io", resources: ["podgroups/status"]}
      - {group: "scheduling.sigs.k8s.io", resources: ["podgroups/status"]}
  - level: Metadata
    verbs: ["create"]
    resources:
      - {group: "authentication.k8s.io", resources: ["tokenreviews"]}
      - {group: "authorization.k8s.io", resources: ["subjectaccessreviews"]}
  - level: None
"#;

/// One completed request.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    /// create, update, patch, delete.
    pub verb: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource ("" if none).
    pub subresource: String,
    /// Namespace ("" if cluster-scoped).
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// HTTP code answered.
    pub code: u16,
    /// When the request arrived (RFC 3339 with microseconds; sorts as text).
    pub received: String,
    /// When the answer was complete.
    pub completed: String,
    /// Who made it.
    pub user: String,
    /// The request body, where the policy keeps it.
    pub request: Option<Value>,
}

/// One successful `pods/binding`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Node bound to.
    pub node: String,
    /// When the binding request arrived.
    pub received: String,
}

/// Every entry of the log at `path` (lines that do not parse are skipped: the
/// last one may be half-written while the server runs).
pub fn read(path: &Path) -> Vec<AuditEntry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(parse).collect()
}

fn parse(line: &str) -> Option<AuditEntry> {
    let event: Value = serde_json::from_str(line).ok()?;
    if event["stage"] != "ResponseComplete" {
        return None;
    }
    let object = &event["objectRef"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some(AuditEntry {
        verb: text(&event["verb"]),
        resource: text(&object["resource"]),
        subresource: text(&object["subresource"]),
        namespace: text(&object["namespace"]),
        name: text(&object["name"]),
        code: event["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(0),
        received: text(&event["requestReceivedTimestamp"]),
        completed: text(&event["stageTimestamp"]),
        user: text(&event["user"]["username"]),
        request: event.get("requestObject").cloned(),
    })
}

/// The successful bindings among `entries`, in the order they arrived.
pub fn bindings(entries: &[AuditEntry]) -> Vec<Binding> {
    let mut out: Vec<Binding> = entries
        .iter()
        .filter(|e| e.resource == "pods" && e.subresource == "binding" && e.verb == "create")
        .filter(|e| (200..300).contains(&e.code))
        .map(|e| Binding {
            namespace: e.namespace.clone(),
            pod: e.name.clone(),
            node: e
                .request
                .as_ref()
                .and_then(|r| r["target"]["name"].as_str())
                .unwrap_or_default()
                .to_string(),
            received: e.received.clone(),
        })
        .collect();
    out.sort_by(|a, b| a.received.cmp(&b.received));
    out
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
