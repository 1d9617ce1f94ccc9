//! The scheduling part of a pod spec.
//!
//! Owns [`PodSpec`] (requests, nodeSelector, node affinity, tolerations, host ports,
//! priority, pod (anti-)affinity, labels, resource claims), the selector and toleration
//! types it is made of, [`PodSummary`] (what the ledger keeps of a placed pod, with the
//! devices allocated to its claims), and [`RawPodSpec`], the
//! Kubernetes-shaped JSON form. Invariants of a validated spec: operators carry the
//! value counts Kubernetes demands (In/NotIn ≥ 1, Exists/DoesNotExist none, Gt/Lt exactly
//! one integer), weights are within 1..=100, tolerations are well-formed, host ports are
//! unique, `requests.pods` is zero (each pod counts as one, see
//! [`PodSummary::footprint`]), and claims are valid (see [`crate::model::claim`]). Error paths use the Kubernetes JSON field names. Called by
//! gang validation, the ledger (summaries) and the engine (filters, scores).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::claim::{
    validate_claims, validate_shares, ClaimShare, DeviceAllocation, PodClaim, RawPodClaim,
};
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::{validate_label_value, validate_labels, validate_qualified_name};
use crate::model::node::TaintEffect;
use crate::model::resources::{RawResourceList, ResourceListKind, ResourceName, Resources};

/// JSON name of required (hard) affinity lists.
pub const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";
/// JSON name of preferred (soft) affinity lists.
pub const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
/// Smallest weight of a preferred term.
pub const WEIGHT_MIN: i32 = 1;
/// Largest weight of a preferred term.
pub const WEIGHT_MAX: i32 = 100;
/// Most labels (and node selector entries, and selector match labels) of one pod.
pub const POD_LABELS_MAX: usize = 256;
/// Most terms of one affinity list (node affinity's required terms, each preferred
/// list, pod affinity's and anti-affinity's lists).
pub const AFFINITY_TERMS_MAX: usize = 64;
/// Most match expressions of one term or selector.
pub const MATCH_EXPRESSIONS_MAX: usize = 64;
/// Most values of one match expression.
pub const MATCH_VALUES_MAX: usize = 256;
/// Most tolerations of one pod.
pub const TOLERATIONS_MAX: usize = 128;
/// Most host ports of one pod.
pub const HOST_PORTS_MAX: usize = 128;

/// Operator of a node selector requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeSelectorOperator {
    /// Label present with one of the values.
    In,
    /// Label absent or with none of the values.
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
    /// Label present and, as an integer, greater than the value.
    Gt,
    /// Label present and, as an integer, less than the value.
    Lt,
}

impl NodeSelectorOperator {
    /// Parses the Kubernetes spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "In" => Ok(Self::In),
            "NotIn" => Ok(Self::NotIn),
            "Exists" => Ok(Self::Exists),
            "DoesNotExist" => Ok(Self::DoesNotExist),
            "Gt" => Ok(Self::Gt),
            "Lt" => Ok(Self::Lt),
            other => Err(path.error(format!(
                "unknown operator \"{other}\": expected one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
            ))),
        }
    }
}

/// Operator of a label selector requirement (no Gt/Lt, as in Kubernetes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LabelSelectorOperator {
    /// Label present with one of the values.
    In,
    /// Label absent or with none of the values.
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
}

impl LabelSelectorOperator {
    /// Parses the Kubernetes spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "In" => Ok(Self::In),
            "NotIn" => Ok(Self::NotIn),
            "Exists" => Ok(Self::Exists),
            "DoesNotExist" => Ok(Self::DoesNotExist),
            other => Err(path.error(format!(
                "unknown operator \"{other}\": expected one of In, NotIn, Exists, DoesNotExist"
            ))),
        }
    }
}

/// One `key operator values` test against node labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeSelectorRequirement {
    /// Label key.
    pub key: String,
    /// How the label is tested.
    pub operator: NodeSelectorOperator,
    /// Values the operator uses.
    pub values: Vec<String>,
}

/// Requirements that must all hold (ANDed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeSelectorTerm {
    /// The requirements.
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

/// A preferred node selector term and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreferredSchedulingTerm {
    /// Weight in 1..=100.
    pub weight: i32,
    /// The term; an empty term matches no node (a no-op, as in Kubernetes).
    pub preference: NodeSelectorTerm,
}

/// Node affinity: hard terms (ORed) and soft weighted terms.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeAffinity {
    /// Terms of which at least one must match; `None` means no constraint.
    pub required: Option<Vec<NodeSelectorTerm>>,
    /// Weighted terms that raise a node's score.
    pub preferred: Vec<PreferredSchedulingTerm>,
}

/// One `key operator values` test against pod labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// How the label is tested.
    pub operator: LabelSelectorOperator,
    /// Values the operator uses.
    pub values: Vec<String>,
}

/// A label selector: matchLabels and matchExpressions, all ANDed; an empty one matches all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LabelSelector {
    /// Exact label matches.
    pub match_labels: BTreeMap<String, String>,
    /// Expression matches.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// A set of pods (by label) within a topology domain (by node label key).
///
/// Terms match pods of every namespace (like Kubernetes' `namespaceSelector: {}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodAffinityTerm {
    /// Pods the term is about; `None` matches no pod.
    pub label_selector: Option<LabelSelector>,
    /// Node label whose value defines the domain, e.g. `kubernetes.io/hostname`.
    pub topology_key: String,
}

/// A preferred pod affinity term and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightedPodAffinityTerm {
    /// Weight in 1..=100.
    pub weight: i32,
    /// The term.
    pub term: PodAffinityTerm,
}

/// Pod affinity or anti-affinity: hard terms (ANDed) and soft weighted terms.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodAffinity {
    /// Terms that must all hold.
    pub required: Vec<PodAffinityTerm>,
    /// Weighted terms that raise (affinity) or lower (anti-affinity) a node's score.
    pub preferred: Vec<WeightedPodAffinityTerm>,
}

impl PodAffinity {
    /// Whether there is no term at all.
    pub fn is_empty(&self) -> bool {
        self.required.is_empty() && self.preferred.is_empty()
    }
}

/// Operator of a toleration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TolerationOperator {
    /// Key and value must equal the taint's.
    Equal,
    /// Key must equal the taint's (an empty key matches every key).
    Exists,
}

impl TolerationOperator {
    /// Parses a toleration's operator; absent or empty means Equal, as in Kubernetes.
    pub fn parse(path: &FieldPath, raw: Option<&str>) -> Result<Self, ValidationError> {
        match raw {
            None | Some("") | Some("Equal") => Ok(Self::Equal),
            Some("Exists") => Ok(Self::Exists),
            Some(other) => Err(path.error(format!(
                "unknown operator \"{other}\": expected one of Equal, Exists"
            ))),
        }
    }
}

/// A toleration of taints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Toleration {
    /// Taint key; empty with `Exists` tolerates every taint.
    pub key: String,
    /// How key and value are compared.
    pub operator: TolerationOperator,
    /// Taint value compared by `Equal`.
    pub value: String,
    /// Effect tolerated; `None` tolerates every effect.
    pub effect: Option<TaintEffect>,
    /// How long a NoExecute taint is tolerated (eviction only; scheduling ignores it).
    pub toleration_seconds: Option<i64>,
}

/// Transport protocol of a host port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// Parses the Kubernetes spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "TCP" => Ok(Self::Tcp),
            "UDP" => Ok(Self::Udp),
            "SCTP" => Ok(Self::Sctp),
            other => Err(path.error(format!(
                "unknown protocol \"{other}\": expected one of TCP, UDP, SCTP"
            ))),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        };
        f.write_str(text)
    }
}

/// A port opened on the node itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostPort {
    /// Port number, 1..=65535.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// What scheduling reads of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodSpec {
    /// Summed container requests (`pods` always zero).
    pub requests: Resources,
    /// Node labels that must all match exactly.
    pub node_selector: BTreeMap<String, String>,
    /// Node affinity.
    pub node_affinity: NodeAffinity,
    /// Pod affinity.
    pub pod_affinity: PodAffinity,
    /// Pod anti-affinity.
    pub pod_anti_affinity: PodAffinity,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// Priority (higher wins).
    pub priority: i32,
    /// The pod's own labels.
    pub labels: BTreeMap<String, String>,
    /// Resource claims (DRA): devices the pod needs on its node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<PodClaim>,
    /// Whether the pod may preempt lower-priority pods.
    #[serde(default, skip_serializing_if = "PreemptionPolicy::is_default")]
    pub preemption_policy: PreemptionPolicy,
    /// ResourceClaims the pod shares with other pods; a share whose `pod_claim` is in
    /// `claims` is carried by this pod, the others are followed (placed beside their carrier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ClaimShare>,
}

/// Whether a pod may preempt lower-priority pods (Kubernetes `preemptionPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PreemptionPolicy {
    /// It may (the default).
    #[default]
    PreemptLowerPriority,
    /// It never preempts; it waits for room.
    Never,
}

impl PreemptionPolicy {
    fn is_default(&self) -> bool {
        *self == Self::PreemptLowerPriority
    }

    /// Whether the pod never preempts.
    pub fn never(&self) -> bool {
        *self == Self::Never
    }
}

impl PodSpec {
    /// Checks the rules a spec must satisfy; paths use Kubernetes JSON names under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        self.requests.validate(&path.child("requests"))?;
        if self.requests.pods != 0 {
            return Err(path
                .child("requests")
                .key("pods")
                .error("pods cannot be requested: every pod counts as one"));
        }
        validate_labels(&path.child("nodeSelector"), &self.node_selector)?;
        validate_labels(&path.child("labels"), &self.labels)?;
        let affinity = path.child("affinity");
        validate_node_affinity(&affinity.child("nodeAffinity"), &self.node_affinity)?;
        validate_pod_affinity(&affinity.child("podAffinity"), &self.pod_affinity)?;
        validate_pod_affinity(&affinity.child("podAntiAffinity"), &self.pod_anti_affinity)?;
        for (i, toleration) in self.tolerations.iter().enumerate() {
            validate_toleration(&path.child("tolerations").index(i), toleration)?;
        }
        validate_host_ports(&path.child("hostPorts"), &self.host_ports)?;
        validate_claims(&path.child("claims"), &self.claims)?;
        validate_shares(&path.child("shares"), &self.shares)
    }

    /// Checks the sizes of its lists against the bounds a client's submission is held to
    /// (labels, selectors, affinity terms and their expressions, tolerations, host ports).
    /// The front door calls it before a template is copied; the replicated state machines
    /// do not (an entry written before the bounds must replay as it was applied).
    pub fn within_bounds(&self, path: &FieldPath) -> Result<(), ValidationError> {
        at_most(
            &path.child("nodeSelector"),
            self.node_selector.len(),
            POD_LABELS_MAX,
        )?;
        at_most(&path.child("labels"), self.labels.len(), POD_LABELS_MAX)?;
        at_most(
            &path.child("tolerations"),
            self.tolerations.len(),
            TOLERATIONS_MAX,
        )?;
        at_most(
            &path.child("hostPorts"),
            self.host_ports.len(),
            HOST_PORTS_MAX,
        )?;
        let affinity = path.child("affinity");
        let node = affinity.child("nodeAffinity");
        if let Some(terms) = &self.node_affinity.required {
            let at = node.child(REQUIRED).child("nodeSelectorTerms");
            at_most(&at, terms.len(), AFFINITY_TERMS_MAX)?;
            for (i, term) in terms.iter().enumerate() {
                node_term_within_bounds(&at.index(i), term)?;
            }
        }
        let preferred = node.child(PREFERRED);
        at_most(
            &preferred,
            self.node_affinity.preferred.len(),
            AFFINITY_TERMS_MAX,
        )?;
        for (i, p) in self.node_affinity.preferred.iter().enumerate() {
            node_term_within_bounds(&preferred.index(i).child("preference"), &p.preference)?;
        }
        for (name, pod) in [
            ("podAffinity", &self.pod_affinity),
            ("podAntiAffinity", &self.pod_anti_affinity),
        ] {
            let at = affinity.child(name);
            at_most(&at.child(REQUIRED), pod.required.len(), AFFINITY_TERMS_MAX)?;
            at_most(
                &at.child(PREFERRED),
                pod.preferred.len(),
                AFFINITY_TERMS_MAX,
            )?;
            let terms = pod
                .required
                .iter()
                .enumerate()
                .map(|(i, t)| (at.child(REQUIRED).index(i), t))
                .chain(pod.preferred.iter().enumerate().map(|(i, w)| {
                    (
                        at.child(PREFERRED).index(i).child("podAffinityTerm"),
                        &w.term,
                    )
                }));
            for (term_at, term) in terms {
                if let Some(selector) = &term.label_selector {
                    let sel = term_at.child("labelSelector");
                    at_most(
                        &sel.child("matchLabels"),
                        selector.match_labels.len(),
                        POD_LABELS_MAX,
                    )?;
                    let exprs = sel.child("matchExpressions");
                    at_most(
                        &exprs,
                        selector.match_expressions.len(),
                        MATCH_EXPRESSIONS_MAX,
                    )?;
                    for (j, e) in selector.match_expressions.iter().enumerate() {
                        at_most(
                            &exprs.index(j).child("values"),
                            e.values.len(),
                            MATCH_VALUES_MAX,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The shared claims this pod carries (it names them and allocates them).
    pub fn carried_shares(&self) -> impl Iterator<Item = &ClaimShare> + '_ {
        self.shares
            .iter()
            .filter(|s| self.claims.iter().any(|c| c.name == s.pod_claim))
    }

    /// The shared claims this pod must find carried on its node (it names them and does
    /// not allocate them).
    pub fn followed_shares(&self) -> impl Iterator<Item = &ClaimShare> + '_ {
        self.shares
            .iter()
            .filter(|s| !self.claims.iter().any(|c| c.name == s.pod_claim))
    }

    /// Whether the spec has any inter-pod affinity or anti-affinity term.
    pub fn has_pod_affinity_terms(&self) -> bool {
        !self.pod_affinity.is_empty() || !self.pod_anti_affinity.is_empty()
    }
}

fn validate_node_affinity(
    path: &FieldPath,
    affinity: &NodeAffinity,
) -> Result<(), ValidationError> {
    if let Some(terms) = &affinity.required {
        let terms_path = path.child(REQUIRED).child("nodeSelectorTerms");
        if terms.is_empty() {
            return Err(terms_path.error("must have at least one term"));
        }
        for (i, term) in terms.iter().enumerate() {
            validate_node_term(&terms_path.index(i), term)?;
        }
    }
    for (i, preferred) in affinity.preferred.iter().enumerate() {
        let at = path.child(PREFERRED).index(i);
        validate_weight(&at.child("weight"), preferred.weight)?;
        validate_node_term(&at.child("preference"), &preferred.preference)?;
    }
    Ok(())
}

fn validate_node_term(path: &FieldPath, term: &NodeSelectorTerm) -> Result<(), ValidationError> {
    for (i, req) in term.match_expressions.iter().enumerate() {
        let at = path.child("matchExpressions").index(i);
        validate_qualified_name(&at.child("key"), &req.key)?;
        validate_node_values(&at.child("values"), req.operator, &req.values)?;
    }
    Ok(())
}

fn validate_node_values(
    path: &FieldPath,
    op: NodeSelectorOperator,
    values: &[String],
) -> Result<(), ValidationError> {
    match op {
        NodeSelectorOperator::In | NodeSelectorOperator::NotIn => validate_value_list(path, values),
        NodeSelectorOperator::Exists | NodeSelectorOperator::DoesNotExist => {
            validate_no_values(path, values)
        }
        NodeSelectorOperator::Gt | NodeSelectorOperator::Lt => match values {
            [only] if only.parse::<i64>().is_ok() => Ok(()),
            [only] => Err(path.index(0).error(format!(
                "invalid value \"{only}\": Gt and Lt need an integer"
            ))),
            _ => Err(path.error("Gt and Lt need exactly one value")),
        },
    }
}

fn validate_value_list(path: &FieldPath, values: &[String]) -> Result<(), ValidationError> {
    if values.is_empty() {
        return Err(path.error("In and NotIn need at least one value"));
    }
    for (i, value) in values.iter().enumerate() {
        validate_label_value(&path.index(i), value)?;
    }
    Ok(())
}

fn validate_no_values(path: &FieldPath, values: &[String]) -> Result<(), ValidationError> {
    if values.is_empty() {
        Ok(())
    } else {
        Err(path.error("Exists and DoesNotExist take no values"))
    }
}

fn validate_weight(path: &FieldPath, weight: i32) -> Result<(), ValidationError> {
    if (WEIGHT_MIN..=WEIGHT_MAX).contains(&weight) {
        Ok(())
    } else {
        Err(path.error(format!(
            "weight {weight} out of range {WEIGHT_MIN}..={WEIGHT_MAX}"
        )))
    }
}

fn validate_pod_affinity(path: &FieldPath, affinity: &PodAffinity) -> Result<(), ValidationError> {
    for (i, term) in affinity.required.iter().enumerate() {
        validate_pod_term(&path.child(REQUIRED).index(i), term)?;
    }
    for (i, weighted) in affinity.preferred.iter().enumerate() {
        let at = path.child(PREFERRED).index(i);
        validate_weight(&at.child("weight"), weighted.weight)?;
        validate_pod_term(&at.child("podAffinityTerm"), &weighted.term)?;
    }
    Ok(())
}

fn validate_pod_term(path: &FieldPath, term: &PodAffinityTerm) -> Result<(), ValidationError> {
    let key_path = path.child("topologyKey");
    if term.topology_key.is_empty() {
        return Err(key_path.error("must not be empty"));
    }
    validate_qualified_name(&key_path, &term.topology_key)?;
    match &term.label_selector {
        Some(selector) => validate_label_selector(&path.child("labelSelector"), selector),
        None => Ok(()),
    }
}

fn validate_label_selector(
    path: &FieldPath,
    selector: &LabelSelector,
) -> Result<(), ValidationError> {
    validate_labels(&path.child("matchLabels"), &selector.match_labels)?;
    for (i, req) in selector.match_expressions.iter().enumerate() {
        let at = path.child("matchExpressions").index(i);
        validate_qualified_name(&at.child("key"), &req.key)?;
        let values = at.child("values");
        match req.operator {
            LabelSelectorOperator::In | LabelSelectorOperator::NotIn => {
                validate_value_list(&values, &req.values)?
            }
            LabelSelectorOperator::Exists | LabelSelectorOperator::DoesNotExist => {
                validate_no_values(&values, &req.values)?
            }
        }
    }
    Ok(())
}

fn validate_toleration(path: &FieldPath, t: &Toleration) -> Result<(), ValidationError> {
    if t.key.is_empty() {
        if t.operator != TolerationOperator::Exists {
            return Err(path
                .child("operator")
                .error("an empty key needs operator Exists"));
        }
    } else {
        validate_qualified_name(&path.child("key"), &t.key)?;
    }
    match t.operator {
        TolerationOperator::Exists if !t.value.is_empty() => {
            return Err(path
                .child("value")
                .error("must be empty when operator is Exists"));
        }
        TolerationOperator::Equal => validate_label_value(&path.child("value"), &t.value)?,
        TolerationOperator::Exists => {}
    }
    if t.toleration_seconds.is_some() && t.effect != Some(TaintEffect::NoExecute) {
        return Err(path
            .child("tolerationSeconds")
            .error("only allowed with effect NoExecute"));
    }
    Ok(())
}

fn validate_host_ports(path: &FieldPath, ports: &[HostPort]) -> Result<(), ValidationError> {
    let mut seen = std::collections::HashSet::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let at = path.index(i);
        if port.port == 0 {
            return Err(at.child("port").error("must be within 1..=65535"));
        }
        if !seen.insert(port) {
            return Err(at.error(format!("duplicate host port {port}")));
        }
    }
    Ok(())
}

fn node_term_within_bounds(
    path: &FieldPath,
    term: &NodeSelectorTerm,
) -> Result<(), ValidationError> {
    let exprs = path.child("matchExpressions");
    at_most(&exprs, term.match_expressions.len(), MATCH_EXPRESSIONS_MAX)?;
    for (i, e) in term.match_expressions.iter().enumerate() {
        at_most(
            &exprs.index(i).child("values"),
            e.values.len(),
            MATCH_VALUES_MAX,
        )?;
    }
    Ok(())
}

/// A list or map of `len` entries where at most `max` are allowed.
fn at_most(path: &FieldPath, len: usize, max: usize) -> Result<(), ValidationError> {
    if len > max {
        return Err(path.error(format!("{len} entries, at most {max}")));
    }
    Ok(())
}

/// What the ledger keeps of a reserved or placed pod: enough for fit, ports, affinity and preemption.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSummary {
    /// Requests, without the implied pod count.
    pub requests: Resources,
    /// Priority.
    pub priority: i32,
    /// The pod's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Host ports held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
    /// Required anti-affinity terms, which later pods must respect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity: Vec<PodAffinityTerm>,
    /// Devices allocated to the pod's claims on its node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceAllocation>,
    /// The Kubernetes pod's uid, when the pod came from the API server (the binder's precondition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// ResourceClaims shared with other pods; the pod carries a share's devices when
    /// `devices` has allocations for its `pod_claim`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ClaimShare>,
    /// Which Kubernetes pod it binds when it has no uid yet (a gRPC member naming one).
    #[serde(default, skip_serializing_if = "PodBinding::is_unnamed")]
    pub binding: PodBinding,
}

/// Which Kubernetes pod a member stands for, beside the uid of a pod the ingest
/// submitted (which names it exactly).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PodBinding {
    /// None by name: a pod the ingest submitted carries its uid, and a member of a gRPC
    /// group that names no pod is never bound through the Kubernetes API.
    #[default]
    Unnamed,
    /// The pod of the member's name in its gang's namespace, which the framework that
    /// submitted the group creates (before or after submitting it); gangway learns its
    /// uid when it binds it.
    Named,
}

impl PodBinding {
    /// Whether it names no pod (the default, left out of encodings).
    pub fn is_unnamed(&self) -> bool {
        *self == PodBinding::Unnamed
    }

    /// Whether it names the member's pod.
    pub fn is_named(&self) -> bool {
        *self == PodBinding::Named
    }
}

impl PodSummary {
    /// Summarizes a spec.
    pub fn from_spec(spec: &PodSpec) -> Self {
        Self {
            requests: spec.requests.clone(),
            priority: spec.priority,
            labels: spec.labels.clone(),
            host_ports: spec.host_ports.clone(),
            anti_affinity: spec.pod_anti_affinity.required.clone(),
            devices: Vec::new(),
            uid: None,
            shares: spec.shares.clone(),
            binding: PodBinding::Unnamed,
        }
    }

    /// Whether the pod carries the devices of shared claim `claim` (`namespace/name`).
    pub fn carries(&self, claim: &str) -> bool {
        self.shares
            .iter()
            .any(|s| s.claim == claim && self.devices.iter().any(|d| d.claim == s.pod_claim))
    }

    /// The shared claims whose devices this pod carries.
    pub fn carried(&self) -> impl Iterator<Item = &ClaimShare> + '_ {
        self.shares
            .iter()
            .filter(|s| self.devices.iter().any(|d| d.claim == s.pod_claim))
    }

    /// What this pod, departing, hands to `heir` of shared claim `share` (which it
    /// carries): its allocations of the claim under the heir's own pod claim name, or
    /// `None` when the heir does not name the claim.
    pub fn handed_to(
        &self,
        share: &ClaimShare,
        heir: &PodSummary,
    ) -> Option<Vec<DeviceAllocation>> {
        let heir_claim = heir.shares.iter().find(|s| s.claim == share.claim)?;
        Some(
            self.devices
                .iter()
                .filter(|d| d.claim == share.pod_claim)
                .map(|d| DeviceAllocation {
                    claim: heir_claim.pod_claim.clone(),
                    ..d.clone()
                })
                .collect(),
        )
    }

    /// The shared claims this pod follows (names without carrying).
    pub fn followed(&self) -> impl Iterator<Item = &ClaimShare> + '_ {
        self.shares
            .iter()
            .filter(|s| !self.devices.iter().any(|d| d.claim == s.pod_claim))
    }

    /// What the pod takes from its node: its requests plus one pod slot.
    pub fn footprint(&self) -> Resources {
        footprint_of(&self.requests)
    }
}

/// Requests plus one pod slot: what a pod with these requests takes from a node.
pub fn footprint_of(requests: &Resources) -> Resources {
    let mut out = requests.clone();
    out.set(&ResourceName::Pods, 1);
    out
}

// ---------------------------------------------------------------------------------------
// Submitted (Kubernetes JSON) forms.
// ---------------------------------------------------------------------------------------

/// A node selector requirement as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawRequirement {
    /// Label key.
    pub key: String,
    /// Operator name.
    pub operator: String,
    /// Values.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A node selector term as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawNodeSelectorTerm {
    /// Requirements, ANDed.
    #[serde(default)]
    pub match_expressions: Vec<RawRequirement>,
}

/// A required node selector as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawNodeSelector {
    /// Terms, ORed.
    #[serde(default)]
    pub node_selector_terms: Vec<RawNodeSelectorTerm>,
}

/// A preferred node term as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPreferredSchedulingTerm {
    /// Weight.
    pub weight: i32,
    /// The term.
    #[serde(default)]
    pub preference: RawNodeSelectorTerm,
}

/// Node affinity as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNodeAffinity {
    /// Hard terms.
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub required: Option<RawNodeSelector>,
    /// Soft terms.
    #[serde(default, rename = "preferredDuringSchedulingIgnoredDuringExecution")]
    pub preferred: Vec<RawPreferredSchedulingTerm>,
}

/// A label selector as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawLabelSelector {
    /// Exact label matches.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expression matches.
    #[serde(default)]
    pub match_expressions: Vec<RawRequirement>,
}

/// A pod affinity term as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPodAffinityTerm {
    /// Pods the term is about.
    #[serde(default)]
    pub label_selector: Option<RawLabelSelector>,
    /// Node label defining the domain.
    #[serde(default)]
    pub topology_key: String,
}

/// A weighted pod affinity term as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawWeightedPodAffinityTerm {
    /// Weight.
    pub weight: i32,
    /// The term.
    pub pod_affinity_term: RawPodAffinityTerm,
}

/// Pod affinity or anti-affinity as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPodAffinity {
    /// Hard terms.
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub required: Vec<RawPodAffinityTerm>,
    /// Soft terms.
    #[serde(default, rename = "preferredDuringSchedulingIgnoredDuringExecution")]
    pub preferred: Vec<RawWeightedPodAffinityTerm>,
}

/// The affinity block as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawAffinity {
    /// Node affinity.
    #[serde(default)]
    pub node_affinity: Option<RawNodeAffinity>,
    /// Pod affinity.
    #[serde(default)]
    pub pod_affinity: Option<RawPodAffinity>,
    /// Pod anti-affinity.
    #[serde(default)]
    pub pod_anti_affinity: Option<RawPodAffinity>,
}

/// A toleration as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawToleration {
    /// Taint key.
    #[serde(default)]
    pub key: String,
    /// `Equal` (default) or `Exists`.
    #[serde(default)]
    pub operator: Option<String>,
    /// Taint value.
    #[serde(default)]
    pub value: String,
    /// Effect; absent tolerates every effect.
    #[serde(default)]
    pub effect: Option<String>,
    /// Seconds a NoExecute taint is tolerated.
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

/// A host port as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawHostPort {
    /// Port number.
    pub port: i64,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// A pod spec as submitted (Kubernetes field names). Unknown fields are refused: a
/// misspelt one (`requestz`) would otherwise drop a constraint without a word.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPodSpec {
    /// Requests as quantities.
    #[serde(default)]
    pub requests: RawResourceList,
    /// Exact node label matches.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity block.
    #[serde(default)]
    pub affinity: Option<RawAffinity>,
    /// Tolerations.
    #[serde(default)]
    pub tolerations: Vec<RawToleration>,
    /// Host ports.
    #[serde(default)]
    pub host_ports: Vec<RawHostPort>,
    /// Priority.
    #[serde(default)]
    pub priority: i32,
    /// Pod labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Resource claims.
    #[serde(default)]
    pub claims: Vec<RawPodClaim>,
    /// `PreemptLowerPriority` (default) or `Never`.
    #[serde(default)]
    pub preemption_policy: Option<String>,
}

impl RawPodSpec {
    /// Validates and converts into a [`PodSpec`]; errors name the field path under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<PodSpec, ValidationError> {
        let affinity = self.affinity.clone().unwrap_or_default();
        let affinity_path = path.child("affinity");
        let spec = PodSpec {
            requests: Resources::from_raw(
                &path.child("requests"),
                &self.requests,
                ResourceListKind::Requests,
            )?,
            node_selector: self.node_selector.clone(),
            node_affinity: convert_node_affinity(
                &affinity_path.child("nodeAffinity"),
                &affinity.node_affinity.unwrap_or_default(),
            )?,
            pod_affinity: convert_pod_affinity(
                &affinity_path.child("podAffinity"),
                &affinity.pod_affinity.unwrap_or_default(),
            )?,
            pod_anti_affinity: convert_pod_affinity(
                &affinity_path.child("podAntiAffinity"),
                &affinity.pod_anti_affinity.unwrap_or_default(),
            )?,
            tolerations: convert_list(
                &path.child("tolerations"),
                &self.tolerations,
                convert_toleration,
            )?,
            host_ports: convert_list(
                &path.child("hostPorts"),
                &self.host_ports,
                convert_host_port,
            )?,
            priority: self.priority,
            labels: self.labels.clone(),
            claims: convert_list(&path.child("claims"), &self.claims, |at, raw| {
                raw.convert(at)
            })?,
            preemption_policy: convert_preemption_policy(
                &path.child("preemptionPolicy"),
                self.preemption_policy.as_deref(),
            )?,
            shares: Vec::new(),
        };
        spec.validate(path)?;
        Ok(spec)
    }
}

fn convert_preemption_policy(
    path: &FieldPath,
    raw: Option<&str>,
) -> Result<PreemptionPolicy, ValidationError> {
    match raw {
        None | Some("PreemptLowerPriority") => Ok(PreemptionPolicy::PreemptLowerPriority),
        Some("Never") => Ok(PreemptionPolicy::Never),
        Some(other) => Err(ValidationError::new(
            path,
            format!(
                "{:?} is not PreemptLowerPriority or Never",
                crate::model::error::clip(other)
            ),
        )),
    }
}

fn convert_list<R, T>(
    path: &FieldPath,
    items: &[R],
    convert: impl Fn(&FieldPath, &R) -> Result<T, ValidationError>,
) -> Result<Vec<T>, ValidationError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| convert(&path.index(i), item))
        .collect()
}

fn convert_node_term(
    path: &FieldPath,
    term: &RawNodeSelectorTerm,
) -> Result<NodeSelectorTerm, ValidationError> {
    let match_expressions = convert_list(
        &path.child("matchExpressions"),
        &term.match_expressions,
        |at, req| {
            Ok(NodeSelectorRequirement {
                key: req.key.clone(),
                operator: NodeSelectorOperator::parse(&at.child("operator"), &req.operator)?,
                values: req.values.clone(),
            })
        },
    )?;
    Ok(NodeSelectorTerm { match_expressions })
}

fn convert_node_affinity(
    path: &FieldPath,
    raw: &RawNodeAffinity,
) -> Result<NodeAffinity, ValidationError> {
    let required = match &raw.required {
        Some(selector) => Some(convert_list(
            &path.child(REQUIRED).child("nodeSelectorTerms"),
            &selector.node_selector_terms,
            convert_node_term,
        )?),
        None => None,
    };
    let preferred = convert_list(&path.child(PREFERRED), &raw.preferred, |at, p| {
        Ok(PreferredSchedulingTerm {
            weight: p.weight,
            preference: convert_node_term(&at.child("preference"), &p.preference)?,
        })
    })?;
    Ok(NodeAffinity {
        required,
        preferred,
    })
}

/// Validates a label selector as submitted (errors name the field under `path`).
pub fn convert_label_selector(
    path: &FieldPath,
    raw: &RawLabelSelector,
) -> Result<LabelSelector, ValidationError> {
    let match_expressions = convert_list(
        &path.child("matchExpressions"),
        &raw.match_expressions,
        |at, req| {
            Ok(LabelSelectorRequirement {
                key: req.key.clone(),
                operator: LabelSelectorOperator::parse(&at.child("operator"), &req.operator)?,
                values: req.values.clone(),
            })
        },
    )?;
    Ok(LabelSelector {
        match_labels: raw.match_labels.clone(),
        match_expressions,
    })
}

fn convert_pod_term(
    path: &FieldPath,
    raw: &RawPodAffinityTerm,
) -> Result<PodAffinityTerm, ValidationError> {
    let label_selector = match &raw.label_selector {
        Some(selector) => Some(convert_label_selector(
            &path.child("labelSelector"),
            selector,
        )?),
        None => None,
    };
    Ok(PodAffinityTerm {
        label_selector,
        topology_key: raw.topology_key.clone(),
    })
}

fn convert_pod_affinity(
    path: &FieldPath,
    raw: &RawPodAffinity,
) -> Result<PodAffinity, ValidationError> {
    let required = convert_list(&path.child(REQUIRED), &raw.required, convert_pod_term)?;
    let preferred = convert_list(&path.child(PREFERRED), &raw.preferred, |at, w| {
        Ok(WeightedPodAffinityTerm {
            weight: w.weight,
            term: convert_pod_term(&at.child("podAffinityTerm"), &w.pod_affinity_term)?,
        })
    })?;
    Ok(PodAffinity {
        required,
        preferred,
    })
}

fn convert_toleration(
    path: &FieldPath,
    raw: &RawToleration,
) -> Result<Toleration, ValidationError> {
    let operator = TolerationOperator::parse(&path.child("operator"), raw.operator.as_deref())?;
    let effect = match raw.effect.as_deref() {
        None | Some("") => None,
        Some(text) => Some(TaintEffect::parse(&path.child("effect"), text)?),
    };
    Ok(Toleration {
        key: raw.key.clone(),
        operator,
        value: raw.value.clone(),
        effect,
        toleration_seconds: raw.toleration_seconds,
    })
}

fn convert_host_port(path: &FieldPath, raw: &RawHostPort) -> Result<HostPort, ValidationError> {
    let port = u16::try_from(raw.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            path.child("port")
                .error(format!("port {} out of range 1..=65535", raw.port))
        })?;
    let protocol = match raw.protocol.as_deref() {
        None | Some("") => Protocol::Tcp,
        Some(text) => Protocol::parse(&path.child("protocol"), text)?,
    };
    Ok(HostPort { port, protocol })
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
