//! The object store of the API server double: every object by kind, namespace and
//! name, one resourceVersion counter for all of them (as etcd's revision), and a
//! bounded history of changes per kind that watches replay from.
//!
//! Invariants: resourceVersions only grow; every stored object carries its current
//! resourceVersion, uid and creationTimestamp; a kind's history holds every change
//! after `compacted_rv` in order. Called by the HTTP layer and by tests directly.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Map, Value};

/// Changes kept per kind for watches to resume from (older ones get 410 Gone).
pub const HISTORY_EVENTS_DEFAULT: usize = 50_000;

/// One kind the double serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    /// API group ("" for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name in URLs.
    pub plural: &'static str,
    /// Kind name in objects.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether `status` is a subresource (the main resource's writes leave it alone).
    pub status_subresource: bool,
}

impl Kind {
    /// `apiVersion` of its objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
) -> Kind {
    Kind {
        group,
        version,
        plural,
        kind,
        namespaced,
        status_subresource,
    }
}

/// Core v1 Pods.
pub const PODS: Kind = kind("", "v1", "pods", "Pod", true, true);
/// Core v1 Nodes.
pub const NODES: Kind = kind("", "v1", "nodes", "Node", false, true);
/// Core v1 Events.
pub const EVENTS: Kind = kind("", "v1", "events", "Event", true, false);
/// scheduler-plugins PodGroups.
pub const POD_GROUPS_SIGS: Kind = kind(
    "scheduling.sigs.k8s.io",
    "v1alpha1",
    "podgroups",
    "PodGroup",
    true,
    true,
);
/// scheduler-plugins PodGroups (the newer group).
pub const POD_GROUPS_X: Kind = kind(
    "scheduling.x-k8s.io",
    "v1alpha1",
    "podgroups",
    "PodGroup",
    true,
    true,
);
/// Kubernetes' own PodGroups (the v1.36 gang API; the real server's tests use it, the
/// double does not serve it).
pub const POD_GROUPS_K8S: Kind = kind(
    "scheduling.k8s.io",
    "v1alpha2",
    "podgroups",
    "PodGroup",
    true,
    true,
);
/// Kubernetes' Workloads (the v1.36 gang API; not served by the double).
pub const WORKLOADS: Kind = kind(
    "scheduling.k8s.io",
    "v1alpha2",
    "workloads",
    "Workload",
    true,
    false,
);
/// Volcano's PodGroups (not served by the double).
pub const POD_GROUPS_VOLCANO: Kind = kind(
    "scheduling.volcano.sh",
    "v1beta1",
    "podgroups",
    "PodGroup",
    true,
    true,
);
/// Kueue's Topologies (cluster-scoped; not served by the double).
pub const KUEUE_TOPOLOGIES: Kind = kind(
    "kueue.x-k8s.io",
    "v1beta1",
    "topologies",
    "Topology",
    false,
    false,
);
/// batch/v1 Jobs (not served by the double).
pub const JOBS: Kind = kind("batch", "v1", "jobs", "Job", true, true);
/// DRA ResourceSlices.
pub const RESOURCE_SLICES: Kind = kind(
    "resource.k8s.io",
    "v1",
    "resourceslices",
    "ResourceSlice",
    false,
    false,
);
/// DRA DeviceClasses.
pub const DEVICE_CLASSES: Kind = kind(
    "resource.k8s.io",
    "v1",
    "deviceclasses",
    "DeviceClass",
    false,
    false,
);
/// DRA ResourceClaims.
pub const RESOURCE_CLAIMS: Kind = kind(
    "resource.k8s.io",
    "v1",
    "resourceclaims",
    "ResourceClaim",
    true,
    true,
);
/// DRA ResourceClaimTemplates.
pub const RESOURCE_CLAIM_TEMPLATES: Kind = kind(
    "resource.k8s.io",
    "v1",
    "resourceclaimtemplates",
    "ResourceClaimTemplate",
    true,
    false,
);

/// Every kind served.
pub const KINDS: &[Kind] = &[
    PODS,
    NODES,
    EVENTS,
    POD_GROUPS_SIGS,
    POD_GROUPS_X,
    RESOURCE_SLICES,
    DEVICE_CLASSES,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
];

/// The kind served at `group`/`version`/`plural`.
pub fn kind_at(group: &str, version: &str, plural: &str) -> Option<Kind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

/// An API error, shaped as the server's `Status` reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine reason (`NotFound`, `Conflict`, `AlreadyExists`, `Expired`, `BadRequest`, `Invalid`).
    pub reason: &'static str,
    /// Message for people.
    pub message: String,
}

impl ApiError {
    /// An error with this code, reason and message.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    /// 404.
    pub fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural),
        )
    }

    /// 409 Conflict.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410: the resourceVersion is older than the kept history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object the server sends.
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed (the object as it was last).
    Deleted,
}

impl EventType {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion it produced.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// The object after (or, deleted, before) the change.
    pub object: Value,
    /// The object before a modification (watches with selectors compare both).
    pub previous: Option<Value>,
}

#[derive(Debug, Default)]
struct KindStore {
    objects: BTreeMap<(String, String), Value>,
    history: VecDeque<Change>,
    compacted_rv: u64,
}

/// Which objects a list or watch selects.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// `field=value` / `field!=value` tests on dotted paths.
    pub fields: Vec<(String, bool, String)>,
    /// Label tests: (key, Some((equal, value))) or (key, None) for existence, negated by the bool.
    pub labels: Vec<(String, LabelTest)>,
}

/// One label test.
#[derive(Debug, Clone)]
pub enum LabelTest {
    /// `k=v` (true) or `k!=v` (false).
    Value(bool, String),
    /// `k` (true) or `!k` (false).
    Exists(bool),
}

impl Selector {
    /// Parses `fieldSelector` and `labelSelector` query values.
    pub fn parse(
        namespace: Option<String>,
        fields: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Self, ApiError> {
        let mut sel = Selector {
            namespace,
            ..Default::default()
        };
        for term in fields.unwrap_or("").split(',').filter(|t| !t.is_empty()) {
            let (path, equal, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector term {term:?}"
                )));
            };
            sel.fields
                .push((path.trim().to_string(), equal, value.trim().to_string()));
        }
        for term in labels.unwrap_or("").split(',').filter(|t| !t.is_empty()) {
            let term = term.trim();
            if term.contains(" in ") || term.contains(" notin ") || term.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "label selector term {term:?}: set-based terms are not supported by this test server"
                )));
            }
            let test = if let Some((k, v)) = term.split_once("!=") {
                (k, LabelTest::Value(false, v.to_string()))
            } else if let Some((k, v)) = term.split_once("==") {
                (k, LabelTest::Value(true, v.to_string()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, LabelTest::Value(true, v.to_string()))
            } else if let Some(k) = term.strip_prefix('!') {
                (k, LabelTest::Exists(false))
            } else {
                (term, LabelTest::Exists(true))
            };
            sel.labels.push((test.0.trim().to_string(), test.1));
        }
        Ok(sel)
    }

    /// Whether `object` is selected.
    pub fn matches(&self, object: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if object["metadata"]["namespace"].as_str() != Some(ns.as_str()) {
                return false;
            }
        }
        let fields_ok = self.fields.iter().all(|(path, equal, value)| {
            let actual = field_text(object, path);
            (actual == *value) == *equal
        });
        let labels = &object["metadata"]["labels"];
        let labels_ok = self.labels.iter().all(|(key, test)| {
            let actual = labels.get(key).and_then(Value::as_str);
            match test {
                LabelTest::Value(equal, v) => (actual == Some(v.as_str())) == *equal,
                LabelTest::Exists(present) => actual.is_some() == *present,
            }
        });
        fields_ok && labels_ok
    }
}

fn field_text(object: &Value, path: &str) -> String {
    let mut at = object;
    for part in path.split('.') {
        at = &at[part];
    }
    match at {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Every object of every kind, a revision counter and per-kind history.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    uids: u64,
    kinds: BTreeMap<Kind, KindStore>,
    history_max: usize,
    clock: fn() -> String,
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a (year, month, day) date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl Default for Store {
    fn default() -> Self {
        Self::new(HISTORY_EVENTS_DEFAULT)
    }
}

impl Store {
    /// An empty store keeping `history_max` changes per kind.
    pub fn new(history_max: usize) -> Self {
        Self {
            rv: 1,
            uids: 0,
            kinds: BTreeMap::new(),
            history_max: history_max.max(1),
            clock: now_rfc3339,
        }
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.rv
    }

    fn key(kind: &Kind, namespace: Option<&str>, name: &str) -> (String, String) {
        let ns = if kind.namespaced {
            namespace.unwrap_or("default").to_string()
        } else {
            String::new()
        };
        (ns, name.to_string())
    }

    fn record(&mut self, kind: Kind, change: EventType, object: Value, previous: Option<Value>) {
        let rv = self.rv;
        let limit = self.history_max;
        let store = self.kinds.entry(kind).or_default();
        store.history.push_back(Change {
            rv,
            kind: change,
            object,
            previous,
        });
        while store.history.len() > limit {
            if let Some(old) = store.history.pop_front() {
                store.compacted_rv = old.rv;
            }
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// One object.
    pub fn get(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.stored(kind, namespace, name).cloned()
    }

    /// The stored object, or 404.
    fn stored(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<&Value, ApiError> {
        self.kinds
            .get(kind)
            .and_then(|s| s.objects.get(&Self::key(kind, namespace, name)))
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Selected objects and the revision the list is consistent at.
    pub fn list(&self, kind: &Kind, selector: &Selector) -> (Vec<Value>, u64) {
        let items = self
            .kinds
            .get(kind)
            .map(|s| {
                s.objects
                    .values()
                    .filter(|o| selector.matches(o))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (items, self.rv)
    }

    /// Creates an object (409 AlreadyExists if the name is taken).
    pub fn create(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request("body: expected a JSON object"));
        }
        let meta = &mut object["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        let name = match meta["name"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta["generateName"].as_str() {
                Some(prefix) => {
                    self.uids += 1;
                    format!("{prefix}{:05x}", self.uids)
                }
                None => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "metadata.name: Required value",
                    ))
                }
            },
        };
        let key = Self::key(kind, namespace.or(meta["namespace"].as_str()), &name);
        if self
            .kinds
            .get(kind)
            .is_some_and(|s| s.objects.contains_key(&key))
        {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.plural),
            ));
        }
        self.uids += 1;
        let rv = self.next_rv();
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.uids);
        meta["name"] = json!(name);
        if kind.namespaced {
            meta["namespace"] = json!(key.0);
        }
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!((self.clock)());
        meta["generation"] = json!(1);
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        self.kinds
            .entry(*kind)
            .or_default()
            .objects
            .insert(key, object.clone());
        self.record(*kind, EventType::Added, object.clone(), None);
        Ok(object)
    }

    /// Applies `edit` to a stored object and stores the result under a new revision;
    /// `expected_rv` (from the body's metadata) must match the stored one if given.
    pub fn update(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        expected_rv: Option<&str>,
        edit: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let key = Self::key(kind, namespace, name);
        let current = &self.stored(kind, namespace, name)?.clone();
        if let Some(rv) = expected_rv.filter(|rv| !rv.is_empty()) {
            if current["metadata"]["resourceVersion"].as_str() != Some(rv) {
                return Err(ApiError::conflict(format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    kind.plural
                )));
            }
        }
        let mut next = current.clone();
        edit(&mut next)?;
        // Identity fields never change through an update.
        for field in ["uid", "name", "namespace", "creationTimestamp"] {
            next["metadata"][field] = current["metadata"][field].clone();
        }
        if next == *current {
            return Ok(next);
        }
        let rv = self.next_rv();
        next["metadata"]["resourceVersion"] = json!(rv.to_string());
        if next.get("spec") != current.get("spec") {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        let previous = self
            .kinds
            .get_mut(kind)
            .and_then(|store| store.objects.insert(key, next.clone()));
        self.record(*kind, EventType::Modified, next.clone(), previous);
        Ok(next)
    }

    /// Deletes an object; `uid` and `rv` preconditions must match if given.
    pub fn delete(
        &mut self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
        rv: Option<&str>,
    ) -> Result<Value, ApiError> {
        let key = Self::key(kind, namespace, name);
        let current = self.stored(kind, namespace, name)?;
        if let Some(uid) = uid {
            let actual = current["metadata"]["uid"].as_str().unwrap_or("");
            if actual != uid {
                return Err(ApiError::conflict(format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                )));
            }
        }
        if let Some(rv) = rv {
            let actual = current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("");
            if actual != rv {
                return Err(ApiError::conflict(format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                )));
            }
        }
        let mut gone = match self
            .kinds
            .get_mut(kind)
            .and_then(|s| s.objects.remove(&key))
        {
            Some(v) => v,
            None => return Err(ApiError::not_found(kind, name)),
        };
        let rv = self.next_rv();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(*kind, EventType::Deleted, gone.clone(), None);
        Ok(gone)
    }

    /// Changes of `kind` after `since_rv` that `selector` selects, or 410 if some were compacted.
    pub fn changes_since(
        &self,
        kind: &Kind,
        since_rv: u64,
        selector: &Selector,
    ) -> Result<Vec<Change>, ApiError> {
        let Some(store) = self.kinds.get(kind) else {
            return Ok(Vec::new());
        };
        if since_rv < store.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {since_rv} ({})",
                store.compacted_rv + 1
            )));
        }
        let start = store.history.partition_point(|c| c.rv <= since_rv);
        Ok(store
            .history
            .iter()
            .skip(start)
            .filter(|c| selector.matches(&c.object))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
