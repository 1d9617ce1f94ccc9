//! Gang groups as people and programs write them: a YAML file format for
//! `gangctl submit -f`, and typed builders for batch frameworks. Both produce
//! the `SubmitGangGroupRequest` the Scheduler API takes; the server validates
//! every field again.
//!
//! ```yaml
//! name: train-llm
//! idempotencyKey: train-llm-001      # optional; the same key never makes a second group
//! queue: team-a                      # optional; the queue charged (it must exist)
//! gangs:
//!   - name: workers
//!     namespace: team-a
//!     minMember: 8
//!     mode: Strict                   # or NonStrict
//!     waitTime: 10m                  # 0 or absent: the server's default
//!     priority: 100
//!     topology:                      # optional; node label keys of topology levels
//!       required: example.com/block  # every member in one block
//!       preferred: example.com/rack  # in as few racks as possible
//!       slice: {key: example.com/nvlink, size: 4}  # each 4 members in one NVLink domain
//!     members:
//!       - name: worker
//!         count: 8
//!         pod:
//!           requests: {cpu: "4", memory: 16Gi}
//!           nodeSelector: {topology.kubernetes.io/zone: zone-a}
//! ```

use gangway_proto::v1::{
    GangSpec, KubernetesPods, MemberSpec, SubmitGangGroupRequest, TopologySpec,
};
use serde::Deserialize;

/// A group file that cannot be used; the message names the line or field.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not valid YAML, or not the expected shape.
    #[error("{0}")]
    Yaml(String),
    /// A field with a bad value.
    #[error("{field}: {reason}")]
    Field {
        /// Path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupFile {
    name: String,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    /// The longest it runs once placed, as a duration (`90s`, `10m`).
    #[serde(default)]
    run_limit: Option<String>,
    gangs: Vec<GangFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GangFile {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    min_member: u32,
    #[serde(default)]
    total_number: Option<u32>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    wait_time: Option<String>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    topology: Option<TopologyFile>,
    members: Vec<MemberFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TopologyFile {
    #[serde(default)]
    required: Option<String>,
    #[serde(default)]
    preferred: Option<String>,
    #[serde(default)]
    slice: Option<SliceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SliceFile {
    key: String,
    size: u32,
}

impl TopologyFile {
    fn to_spec(&self) -> TopologySpec {
        TopologySpec {
            required: self.required.clone().unwrap_or_default(),
            preferred: self.preferred.clone().unwrap_or_default(),
            slice_key: self
                .slice
                .as_ref()
                .map(|s| s.key.clone())
                .unwrap_or_default(),
            slice_size: self.slice.as_ref().map_or(0, |s| s.size),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MemberFile {
    #[serde(default)]
    name: String,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    pod: Option<serde_json::Value>,
    /// Set: the members stand for Kubernetes pods (`{}`: named as the members).
    #[serde(default)]
    kubernetes_pods: Option<PodsFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodsFile {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    selector: std::collections::HashMap<String, String>,
}

/// Parses a duration such as `30s`, `10m`, `1h`, `500ms` or a bare number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits.parse().ok()?;
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// Reads a group file.
pub fn from_yaml(text: &str) -> Result<SubmitGangGroupRequest, SpecError> {
    let file: GroupFile =
        serde_saphyr::from_str(text).map_err(|e| SpecError::Yaml(e.to_string()))?;
    let mut gangs = Vec::new();
    for (i, g) in file.gangs.iter().enumerate() {
        let at = format!("gangs[{i}]");
        let wait_time_ms = match &g.wait_time {
            None => 0,
            Some(w) => parse_duration_ms(w).ok_or_else(|| SpecError::Field {
                field: format!("{at}.waitTime"),
                reason: format!("{w:?} is not a duration like 30s, 10m or 1h"),
            })?,
        };
        let members = g
            .members
            .iter()
            .map(|m| MemberSpec {
                name: m.name.clone(),
                count: m.count.unwrap_or(1),
                pod_json: m.pod.as_ref().map(|p| p.to_string()).unwrap_or_default(),
                pods: m.kubernetes_pods.as_ref().map(|p| KubernetesPods {
                    names: p.names.clone(),
                    selector: p.selector.clone(),
                }),
            })
            .collect();
        gangs.push(GangSpec {
            name: g.name.clone(),
            namespace: g.namespace.clone().unwrap_or_default(),
            min_member: g.min_member,
            total_number: g.total_number.unwrap_or(0),
            mode: g.mode.clone().unwrap_or_default(),
            wait_time_ms,
            priority: g.priority,
            members,
            topology: g.topology.as_ref().map(TopologyFile::to_spec),
        });
    }
    let run_limit_seconds = match &file.run_limit {
        None => 0,
        Some(text) => match parse_duration_ms(text) {
            Some(ms) if ms >= 1_000 && ms % 1_000 == 0 => ms / 1_000,
            _ => {
                return Err(SpecError::Field {
                    field: "runLimit".into(),
                    reason: format!(
                        "{text:?} is not a whole number of seconds like 90s, 10m or 1h"
                    ),
                })
            }
        },
    };
    Ok(SubmitGangGroupRequest {
        idempotency_key: file.idempotency_key.unwrap_or_default(),
        name: file.name,
        gangs,
        queue: file.queue.unwrap_or_default(),
        run_limit_seconds,
    })
}

/// Builds a gang group in code.
#[derive(Debug, Default, Clone)]
pub struct GangGroupBuilder {
    request: SubmitGangGroupRequest,
}

impl GangGroupBuilder {
    /// A group called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            request: SubmitGangGroupRequest {
                name: name.into(),
                ..Default::default()
            },
        }
    }

    /// Sets the idempotency key (retries with the same key never make a second group).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.request.idempotency_key = key.into();
        self
    }

    /// Charges the group to `queue` (which must exist).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.request.queue = queue.into();
        self
    }

    /// Declares the longest the group runs once placed (whole seconds; gangway releases
    /// it when that passes): what lets it backfill room reserved for a group ahead.
    pub fn run_limit(mut self, limit: std::time::Duration) -> Self {
        self.request.run_limit_seconds = limit.as_secs();
        self
    }

    /// Adds a gang.
    pub fn gang(mut self, gang: GangBuilder) -> Self {
        self.request.gangs.push(gang.spec);
        self
    }

    /// The request to submit.
    pub fn build(self) -> SubmitGangGroupRequest {
        self.request
    }
}

/// Builds one gang.
#[derive(Debug, Clone)]
pub struct GangBuilder {
    spec: GangSpec,
}

impl GangBuilder {
    /// A Strict gang `namespace/name` that needs `min_member` members placed together.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, min_member: u32) -> Self {
        Self {
            spec: GangSpec {
                name: name.into(),
                namespace: namespace.into(),
                min_member,
                mode: "Strict".into(),
                ..Default::default()
            },
        }
    }

    /// NonStrict: placed members accumulate until minMember is reached.
    pub fn non_strict(mut self) -> Self {
        self.spec.mode = "NonStrict".into();
        self
    }

    /// Gives up if still unplaced this long after submission.
    pub fn wait_time_ms(mut self, ms: u64) -> Self {
        self.spec.wait_time_ms = ms;
        self
    }

    /// Queue priority (higher first).
    pub fn priority(mut self, priority: i32) -> Self {
        self.spec.priority = priority;
        self
    }

    /// Every member in one domain of the node label `key` (one rack, say), or none placed.
    pub fn required_topology(mut self, key: impl Into<String>) -> Self {
        self.spec
            .topology
            .get_or_insert_with(Default::default)
            .required = key.into();
        self
    }

    /// Members in as few domains of the node label `key` as possible.
    pub fn preferred_topology(mut self, key: impl Into<String>) -> Self {
        self.spec
            .topology
            .get_or_insert_with(Default::default)
            .preferred = key.into();
        self
    }

    /// Members in consecutive slices of `size`, each in one domain of the node label `key`.
    pub fn topology_slices(mut self, key: impl Into<String>, size: u32) -> Self {
        let topology = self.spec.topology.get_or_insert_with(Default::default);
        topology.slice_key = key.into();
        topology.slice_size = size;
        self
    }

    /// Adds `count` members named `name-0..` with the given pod spec (Kubernetes JSON field names).
    pub fn members(mut self, name: impl Into<String>, count: u32, pod: serde_json::Value) -> Self {
        self.spec.members.push(MemberSpec {
            name: name.into(),
            count,
            pod_json: pod.to_string(),
            pods: None,
        });
        self
    }

    /// Adds `count` members standing for the Kubernetes pods `name-0..` (`name` alone
    /// for one) in the gang's namespace, which the framework creates with gangway's
    /// `schedulerName` and the annotation `gangway.io/group` set to the group's name;
    /// gangway binds them once all of the group's named pods exist and match.
    pub fn kubernetes_pods(
        mut self,
        name: impl Into<String>,
        count: u32,
        pod: serde_json::Value,
    ) -> Self {
        self.spec.members.push(MemberSpec {
            name: name.into(),
            count,
            pod_json: pod.to_string(),
            pods: Some(KubernetesPods::default()),
        });
        self
    }

    /// Adds `count` members (`name-0..`) standing for any `count` Kubernetes pods of the
    /// gang's namespace with every label of `selector` (as [`GangBuilder::kubernetes_pods`]
    /// otherwise): once that many exist, gangway picks them in name order and keeps the
    /// choice.
    pub fn kubernetes_pods_selected(
        mut self,
        name: impl Into<String>,
        count: u32,
        selector: &[(&str, &str)],
        pod: serde_json::Value,
    ) -> Self {
        self.spec.members.push(MemberSpec {
            name: name.into(),
            count,
            pod_json: pod.to_string(),
            pods: Some(KubernetesPods {
                names: Vec::new(),
                selector: selector
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
        });
        self
    }

    /// Adds one member per Kubernetes pod in `names`, each named as its pod (as
    /// [`GangBuilder::kubernetes_pods`]).
    pub fn kubernetes_pods_named(mut self, names: &[&str], pod: serde_json::Value) -> Self {
        self.spec.members.push(MemberSpec {
            name: String::new(),
            count: 0,
            pod_json: pod.to_string(),
            pods: Some(KubernetesPods {
                names: names.iter().map(|n| n.to_string()).collect(),
                selector: Default::default(),
            }),
        });
        self
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
