//! Gangs, gang groups and member identities.
//!
//! Owns [`Gang`] (pods that start together: minMember, totalNumber, Strict/NonStrict,
//! waitTime, priority, creation order, members), [`GangGroup`] (gangs placed together),
//! the keys that name them ([`GangId`], [`MemberKey`]) and their submitted JSON forms.
//! Invariants of a validated gang: 1 <= minMember <= totalNumber, at least one member,
//! no more members than totalNumber, unique member names, valid member specs. A group has
//! at least one gang and no gang twice. Called by the front door (validation), the queue
//! and the engine (placement), and the ledger (member keys).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::{validate_dns_label, validate_dns_subdomain, validate_labels};
use crate::model::pod::{PodBinding, PodSpec, RawPodSpec};
use crate::model::topology::TopologyConstraint;

/// Wait time used when a submission names none (Koordinator's default, 600 s).
pub const DEFAULT_WAIT_TIME_MS: u64 = 600_000;

/// Identity of a gang: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GangId {
    /// Namespace.
    pub namespace: String,
    /// Gang name.
    pub name: String,
}

impl GangId {
    /// Builds a gang id.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for GangId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A member key string that is not `namespace/gang/member`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid member key \"{0}\": expected namespace/gang/member")]
pub struct MemberKeyError(pub String);

/// Identity of one gang member (one pod): `namespace/gang/member`.
///
/// Serialized as that string, so it can key JSON maps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MemberKey {
    /// Namespace.
    pub namespace: String,
    /// Gang name.
    pub gang: String,
    /// Member name.
    pub member: String,
}

impl MemberKey {
    /// Builds a member key.
    pub fn new(
        namespace: impl Into<String>,
        gang: impl Into<String>,
        member: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            gang: gang.into(),
            member: member.into(),
        }
    }

    /// Checks that every part is non-empty and free of `/`, so the string form round-trips.
    pub fn validate(&self) -> Result<(), MemberKeyError> {
        let parts = [&self.namespace, &self.gang, &self.member];
        if parts.iter().all(|p| !p.is_empty() && !p.contains('/')) {
            Ok(())
        } else {
            Err(MemberKeyError(self.to_string()))
        }
    }

    /// The gang this member belongs to.
    pub fn gang_id(&self) -> GangId {
        GangId::new(self.namespace.clone(), self.gang.clone())
    }

    /// Whether this member belongs to `gang`.
    pub fn is_in(&self, gang: &GangId) -> bool {
        self.namespace == gang.namespace && self.gang == gang.name
    }
}

impl fmt::Display for MemberKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.gang, self.member)
    }
}

impl From<MemberKey> for String {
    fn from(key: MemberKey) -> Self {
        key.to_string()
    }
}

impl TryFrom<String> for MemberKey {
    type Error = MemberKeyError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let mut parts = text.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(ns), Some(gang), Some(member), None)
                if !ns.is_empty() && !gang.is_empty() && !member.is_empty() =>
            {
                Ok(Self::new(ns, gang, member))
            }
            _ => Err(MemberKeyError(text)),
        }
    }
}

/// How a gang accumulates placed members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GangMode {
    /// One failure aborts the whole gang group.
    Strict,
    /// Placed members accumulate until minMember is reached or waitTime passes.
    NonStrict,
}

impl GangMode {
    /// Parses the Koordinator spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "Strict" => Ok(Self::Strict),
            "NonStrict" => Ok(Self::NonStrict),
            other => Err(path.error(format!(
                "unknown mode \"{other}\": expected one of Strict, NonStrict"
            ))),
        }
    }
}

/// One member of a gang: a named pod spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Member (pod) name, unique in the gang.
    pub name: String,
    /// Its scheduling spec.
    pub spec: PodSpec,
    /// The Kubernetes pod's uid, for members that came from the API server (the
    /// binding's precondition: a pod recreated under the same name is not bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The Kubernetes pod it stands for by name, for a gRPC member that names one.
    #[serde(default, skip_serializing_if = "PodBinding::is_unnamed")]
    pub binding: PodBinding,
    /// With `binding` Named: the labels of the pods it may stand for, any of them (meta
    /// records the one chosen); empty: the pod of its own name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_selector: BTreeMap<String, String>,
}

/// A gang: pods that are placed all together or not at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gang {
    /// Gang name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Members that must be placed for the gang to start.
    pub min_member: u32,
    /// Members the gang will have once all have arrived.
    pub total_number: u32,
    /// Strict or NonStrict accumulation.
    pub mode: GangMode,
    /// How long placed members may wait for the rest, in milliseconds.
    pub wait_time_ms: u64,
    /// Queue priority (higher first).
    pub priority: i32,
    /// Creation order supplied by the caller (earlier first among equal priorities).
    pub creation_order: u64,
    /// Members that have arrived so far.
    pub members: Vec<Member>,
    /// Where its members may go in the cluster's topology (none: anywhere).
    #[serde(default, skip_serializing_if = "TopologyConstraint::is_none")]
    pub topology: TopologyConstraint,
}

impl Gang {
    /// The gang's identity.
    pub fn id(&self) -> GangId {
        GangId::new(self.namespace.clone(), self.name.clone())
    }

    /// The key of `member` in this gang.
    pub fn member_key(&self, member: &Member) -> MemberKey {
        MemberKey::new(
            self.namespace.clone(),
            self.name.clone(),
            member.name.clone(),
        )
    }

    /// Checks the gang invariants; paths use the submitted JSON names under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_subdomain(&path.child("name"), &self.name)?;
        validate_dns_label(&path.child("namespace"), &self.namespace)?;
        let spec = path.child("spec");
        if self.min_member < 1 {
            return Err(spec.child("minMember").error("must be at least 1"));
        }
        if self.min_member > self.total_number {
            return Err(spec.child("minMember").error(format!(
                "minMember {} exceeds totalNumber {}",
                self.min_member, self.total_number
            )));
        }
        self.topology.validate(&spec.child("topology"))?;
        self.validate_members(&spec.child("members"))
    }

    fn validate_members(&self, path: &FieldPath) -> Result<(), ValidationError> {
        if self.members.is_empty() {
            return Err(path.error("a gang needs at least one member"));
        }
        if self.members.len() as u64 > u64::from(self.total_number) {
            return Err(path.error(format!(
                "{} members exceed totalNumber {}",
                self.members.len(),
                self.total_number
            )));
        }
        let mut seen = BTreeSet::new();
        for (i, member) in self.members.iter().enumerate() {
            let at = path.index(i);
            validate_dns_subdomain(&at.child("name"), &member.name)?;
            if !seen.insert(member.name.as_str()) {
                return Err(at
                    .child("name")
                    .error(format!("duplicate member name \"{}\"", member.name)));
            }
            member.spec.validate(&at)?;
        }
        Ok(())
    }
}

/// Longest owner name, in bytes (a Kubernetes ServiceAccount's username, prefixed, fits).
pub const OWNER_BYTES_MAX: usize = 512;

/// Gangs placed together: none is bound until every one reaches its minMember.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangGroup {
    /// Group id.
    pub id: String,
    /// The gangs.
    pub gangs: Vec<Gang>,
    /// The queue charged for its members (empty: none; the group is limited by no
    /// quota).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    /// Who submitted it: an identity's name (empty: the Kubernetes ingest, or a caller
    /// of a replica that requires no credentials). Its idempotency keys are its own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The preemption boundary: only groups charged to this queue or a queue under it
    /// may be its victims by priority (empty: none may; absent: any group of lower
    /// priority, as for administrators and Kubernetes pods). A queue's reclaim of its
    /// `min` is not bounded by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempts_within: Option<String>,
    /// The longest it runs once placed, in ms (None: not declared): a gRPC group is
    /// released when it passes, a Kubernetes group's pods are stopped by their kubelets
    /// (`activeDeadlineSeconds`). What lets it backfill room reserved for a group ahead
    /// of it (docs/ARCHITECTURE.md §4, "Reservations").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_limit_ms: Option<u64>,
}

/// Longest run-time limit a group may declare, in ms (one year).
pub const RUN_LIMIT_MS_MAX: u64 = 365 * 24 * 3_600 * 1_000;

impl GangGroup {
    /// Checks the group and every gang in it.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_subdomain(&path.child("id"), &self.id)?;
        if !self.queue.is_empty() {
            validate_dns_label(&path.child("queue"), &self.queue)?;
        }
        if let Some(q) = self.preempts_within.as_ref().filter(|q| !q.is_empty()) {
            validate_dns_label(&path.child("preemptsWithin"), q)?;
        }
        if self.owner.len() > OWNER_BYTES_MAX || self.owner.chars().any(char::is_control) {
            return Err(path.child("owner").error(format!(
                "at most {OWNER_BYTES_MAX} bytes without control characters"
            )));
        }
        if let Some(limit) = self.run_limit_ms {
            if limit == 0 || limit > RUN_LIMIT_MS_MAX {
                return Err(path.child("runLimitMs").error(format!(
                    "{limit} is not between 1 and {RUN_LIMIT_MS_MAX} (one year)"
                )));
            }
        }
        let gangs = path.child("gangs");
        if self.gangs.is_empty() {
            return Err(gangs.error("a gang group needs at least one gang"));
        }
        let mut seen = BTreeSet::new();
        let mut pods = BTreeSet::new();
        for (i, gang) in self.gangs.iter().enumerate() {
            let at = gangs.index(i);
            gang.validate(&at)?;
            if !seen.insert(gang.id()) {
                return Err(at.error(format!("duplicate gang {}", gang.id())));
            }
            for (j, m) in gang.members.iter().enumerate() {
                let at_member = at.child("members").index(j);
                if !m.pod_selector.is_empty() {
                    if m.binding != PodBinding::Named {
                        return Err(at_member.error("a pod selector without Kubernetes pods"));
                    }
                    validate_labels(&at_member.child("podSelector"), &m.pod_selector)?;
                    continue;
                }
                if m.binding == PodBinding::Named && !pods.insert((&gang.namespace, &m.name)) {
                    return Err(at.child("members").index(j).error(format!(
                        "pod {}/{} is named by two members of the group",
                        gang.namespace, m.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The Kubernetes pods its members name by name (`namespace/name`), in gang then
    /// member order (members that select theirs by labels are left out: meta records
    /// their choice, `GroupRecord::named_pods`).
    pub fn named_pods(&self) -> impl Iterator<Item = (MemberKey, String)> + '_ {
        self.gangs.iter().flat_map(|g| {
            g.members
                .iter()
                .filter(|m| m.binding == PodBinding::Named && m.pod_selector.is_empty())
                .map(move |m| (g.member_key(m), format!("{}/{}", g.namespace, m.name)))
        })
    }
}

/// A member as submitted: its name beside the pod spec fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawMember {
    /// Member name.
    pub name: String,
    /// Pod spec fields.
    #[serde(flatten)]
    pub spec: RawPodSpec,
    /// The Kubernetes pod it stands for by name (gRPC submissions only).
    #[serde(skip)]
    pub binding: PodBinding,
    /// The labels of the pods it may stand for instead (gRPC submissions only).
    #[serde(skip)]
    pub pod_selector: BTreeMap<String, String>,
}

/// A gang spec as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawGangSpec {
    /// minMember (signed so that a negative value gets a field error).
    pub min_member: i64,
    /// totalNumber; absent means the number of members.
    #[serde(default)]
    pub total_number: Option<i64>,
    /// `Strict` (default) or `NonStrict`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Wait time in milliseconds; absent means [`DEFAULT_WAIT_TIME_MS`].
    #[serde(default)]
    pub wait_time_ms: Option<u64>,
    /// Priority.
    #[serde(default)]
    pub priority: i32,
    /// Members.
    #[serde(default)]
    pub members: Vec<RawMember>,
    /// Topology constraint (none: anywhere).
    #[serde(default)]
    pub topology: TopologyConstraint,
}

/// A gang as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawGang {
    /// Gang name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Creation order assigned by the caller.
    #[serde(default)]
    pub creation_order: u64,
    /// The spec.
    pub spec: RawGangSpec,
}

impl RawGang {
    /// Validates and converts into a [`Gang`]; errors name the field path.
    pub fn validate(&self) -> Result<Gang, ValidationError> {
        self.validate_at(&FieldPath::root())
    }

    /// Like [`RawGang::validate`], with paths under `path`.
    pub fn validate_at(&self, path: &FieldPath) -> Result<Gang, ValidationError> {
        let spec = path.child("spec");
        let min_member = count_field(&spec.child("minMember"), self.spec.min_member)?;
        let total_number = match self.spec.total_number {
            Some(n) => count_field(&spec.child("totalNumber"), n)?,
            None => u32::try_from(self.spec.members.len())
                .map_err(|_| spec.child("members").error("too many members"))?,
        };
        let mode = match self.spec.mode.as_deref() {
            None => GangMode::Strict,
            Some(text) => GangMode::parse(&spec.child("mode"), text)?,
        };
        let members = self
            .spec
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let at = spec.child("members").index(i);
                Ok(Member {
                    name: m.name.clone(),
                    spec: m.spec.validate(&at)?,
                    uid: None,
                    binding: m.binding,
                    pod_selector: m.pod_selector.clone(),
                })
            })
            .collect::<Result<Vec<_>, ValidationError>>()?;
        let gang = Gang {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            min_member,
            total_number,
            mode,
            wait_time_ms: self.spec.wait_time_ms.unwrap_or(DEFAULT_WAIT_TIME_MS),
            priority: self.spec.priority,
            creation_order: self.creation_order,
            members,
            topology: self.spec.topology.clone(),
        };
        gang.validate(path)?;
        Ok(gang)
    }
}

fn count_field(path: &FieldPath, value: i64) -> Result<u32, ValidationError> {
    u32::try_from(value).map_err(|_| path.error(format!("{value} out of range 0..={}", u32::MAX)))
}

/// A gang group as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawGangGroup {
    /// Group id.
    pub id: String,
    /// Gangs.
    #[serde(default)]
    pub gangs: Vec<RawGang>,
    /// The queue charged for its members (empty: none).
    #[serde(default)]
    pub queue: String,
    /// The longest it runs once placed, in ms (None: not declared).
    #[serde(default)]
    pub run_limit_ms: Option<u64>,
}

impl RawGangGroup {
    /// Validates and converts into a [`GangGroup`]; errors name the field path.
    pub fn validate(&self) -> Result<GangGroup, ValidationError> {
        let root = FieldPath::root();
        let gangs = self
            .gangs
            .iter()
            .enumerate()
            .map(|(i, g)| g.validate_at(&root.child("gangs").index(i)))
            .collect::<Result<Vec<_>, ValidationError>>()?;
        let group = GangGroup {
            queue: self.queue.clone(),
            id: self.id.clone(),
            gangs,
            run_limit_ms: self.run_limit_ms,
            ..Default::default()
        };
        group.validate(&root)?;
        Ok(group)
    }
}

#[cfg(test)]
impl Gang {
    /// Tests: a gang of `members` members named `m0`, `m1`, … with empty pod specs, no
    /// waitTime, priority or creation order.
    pub fn with_members(
        namespace: &str,
        name: &str,
        members: u32,
        min_member: u32,
        mode: GangMode,
    ) -> Self {
        Gang {
            name: name.into(),
            namespace: namespace.into(),
            min_member,
            total_number: members,
            mode,
            wait_time_ms: 0,
            priority: 0,
            creation_order: 0,
            members: (0..members)
                .map(|i| Member {
                    name: format!("m{i}"),
                    spec: PodSpec::default(),
                    uid: None,
                    binding: Default::default(),
                    pod_selector: Default::default(),
                })
                .collect(),
            topology: Default::default(),
        }
    }
}

#[cfg(test)]
#[path = "gang_tests.rs"]
mod tests;
