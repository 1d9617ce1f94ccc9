//! Preemption: which lower-priority pods to evict so that a pod fits.
//!
//! Owns [`preempt`]. For a pod that fits nowhere, each node whose failure could be
//! cured by removing pods is simulated: every eligible victim unit with a member on the
//! node is removed, the pod is re-filtered, then units are reprieved one by one (highest
//! priority first) while the pod still fits. A unit is a whole gang (all members of
//! `namespace/gang`, on every node): it is eligible only if every member is committed or
//! bound (never reserved) and of strictly lower priority than the preemptor, and it is
//! evicted whole or not at all. Among candidate nodes the one chosen has the lowest
//! highest-victim priority, then the fewest victims, then the lowest priority sum, then
//! the first name. The result names the nominated node; the caller records a
//! [`crate::engine::cluster::Nomination`] so that later pods of lower or equal priority
//! leave the freed room alone. Pods with device needs are checked against the nodes'
//! devices as they are: a node whose devices cannot serve the pod is never chosen, and
//! devices held by victims are not counted as freed (conservative). Pure. The
//! scheduler does not call it: gang groups preempt through per-shard group offers
//! (`group_preemption.rs`, docs/ARCHITECTURE.md §5 rule 14); this one-pod choice and its
//! nomination are for `nominatedNodeName` once Kubernetes victims are evicted (§10).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::engine::cluster::{Cluster, Nomination, PodPhase};
use crate::engine::devices::DeviceDemand;
use crate::engine::filter::{filter_node, Candidate, Diagnosis, Probe};
use crate::engine::interpod::{Counted, InterPodState};
use crate::engine::profile::Profile;
use crate::engine::score::{score_nodes, ScoreInput};
use crate::ledger::view::LedgerView;
use crate::model::gang::{GangId, MemberKey};
use crate::model::pod::{footprint_of, PodSpec};

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Victim {
    /// The pod.
    pub member: MemberKey,
    /// Its node.
    pub node: String,
    /// Its priority.
    pub priority: i32,
}

/// Evict the victims, then the preemptor may use the nominated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionPlan {
    /// Node the preemptor is nominated to.
    pub nominated_node: String,
    /// Pods to evict (whole gangs), sorted by member.
    pub victims: Vec<Victim>,
}

/// What preemption found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptionOutcome {
    /// The pod fits without evicting anything.
    Fits {
        /// Best node.
        node: String,
    },
    /// Evict and nominate.
    Preempt(PreemptionPlan),
    /// No eviction would make room.
    Unresolvable {
        /// Why the nodes refused the pod.
        diagnosis: Diagnosis,
    },
}

/// All pods of one gang, the preemption unit.
#[derive(Debug, Clone)]
struct Unit {
    /// (node index, pod index) of every member.
    members: Vec<(usize, usize)>,
    /// Highest member priority.
    max_priority: i32,
    /// Whether it may be evicted for this preemptor.
    eligible: bool,
}

fn collect_units(cluster: &Cluster<'_>, preemptor_priority: i32) -> BTreeMap<GangId, Unit> {
    let mut units: BTreeMap<GangId, Unit> = BTreeMap::new();
    for n in 0..cluster.len() {
        for (p, pod) in cluster.pods(n).enumerate() {
            let unit = units.entry(pod.key.gang_id()).or_insert(Unit {
                members: Vec::new(),
                max_priority: i32::MIN,
                eligible: true,
            });
            unit.members.push((n, p));
            unit.max_priority = unit.max_priority.max(pod.pod.priority);
            unit.eligible &= pod.phase == PodPhase::Placed && pod.pod.priority < preemptor_priority;
        }
    }
    units
}

/// Everything one preemption attempt reads.
struct Attempt<'c, 'a> {
    cluster: &'c Cluster<'a>,
    candidate: Candidate<'c>,
    units: &'c BTreeMap<GangId, Unit>,
    /// The preemptor's device needs: a node must satisfy them as it is (victims'
    /// devices are not counted as freed, so no eviction is proposed that devices defeat).
    devices: Option<&'c DeviceDemand>,
}

/// A node where preemption works, with its victims.
#[derive(Debug, Clone)]
struct Choice {
    node: usize,
    victims: Vec<Victim>,
}

impl Choice {
    /// Lower is better: highest victim priority, victim count, priority sum, node order.
    fn rank(&self) -> (i32, usize, i64, usize) {
        let max = self
            .victims
            .iter()
            .map(|v| v.priority)
            .max()
            .unwrap_or(i32::MIN);
        let sum = self
            .victims
            .iter()
            .map(|v| i64::from(v.priority) - i64::from(i32::MIN))
            .sum();
        (max, self.victims.len(), sum, self.node)
    }
}

impl Attempt<'_, '_> {
    fn is_removed(removed: &BTreeSet<&GangId>, key: &MemberKey) -> bool {
        removed.iter().any(|g| key.is_in(g))
    }

    /// Whether the candidate fits on node `idx` once the `removed` units are gone.
    fn fits_without(&self, idx: usize, removed: &BTreeSet<&GangId>) -> bool {
        let Some(mut trimmed) = self.cluster.state(idx) else {
            return false;
        };
        for gone in self
            .cluster
            .pods(idx)
            .filter(|p| Self::is_removed(removed, &p.key))
        {
            trimmed.requested = trimmed.requested.saturating_sub(&gone.pod.footprint());
        }
        trimmed.pods.retain(|p| !Self::is_removed(removed, &p.key));
        let interpod = InterPodState::build(self.cluster, self.candidate.spec, |_, pod| {
            if Self::is_removed(removed, &pod.key) {
                Counted::No
            } else {
                Counted::Yes
            }
        });
        filter_node(&trimmed, &self.candidate, &interpod).is_ok()
    }

    /// Minimal victims on node `idx`, if evicting eligible units there makes room.
    fn try_node(&self, idx: usize) -> Option<Choice> {
        if let Some(demand) = self.devices {
            demand.fit(self.cluster, idx, 1).ok()?;
        }
        let mut on_node: Vec<(&GangId, &Unit)> = self
            .units
            .iter()
            .filter(|(_, u)| u.eligible && u.members.iter().any(|(n, _)| *n == idx))
            .collect();
        if on_node.is_empty() {
            return None;
        }
        let mut removed: BTreeSet<&GangId> = on_node.iter().map(|(g, _)| *g).collect();
        if !self.fits_without(idx, &removed) {
            return None;
        }
        on_node.sort_by(|(ga, a), (gb, b)| b.max_priority.cmp(&a.max_priority).then(ga.cmp(gb)));
        for (gang, _) in &on_node {
            removed.remove(gang);
            if !self.fits_without(idx, &removed) {
                removed.insert(gang);
            }
        }
        Some(Choice {
            node: idx,
            victims: self.victims_of(&removed),
        })
    }

    fn victims_of(&self, removed: &BTreeSet<&GangId>) -> Vec<Victim> {
        let mut victims: Vec<Victim> = removed
            .iter()
            .filter_map(|g| self.units.get(*g))
            .flat_map(|u| u.members.iter())
            .filter_map(|&(n, p)| {
                let pod = self.cluster.pods(n).nth(p)?;
                Some(Victim {
                    member: pod.key.into_owned(),
                    node: self.cluster.name(n)?.to_string(),
                    priority: pod.pod.priority,
                })
            })
            .collect();
        victims.sort();
        victims
    }
}

/// Finds where `spec` (member `member`) fits, or which pods to evict so that it does.
pub fn preempt<V: LedgerView + ?Sized>(
    view: &V,
    member: &MemberKey,
    spec: &PodSpec,
    profile: &Profile,
    nominations: &[Nomination],
) -> PreemptionOutcome {
    let cluster = Cluster::build(view, nominations);
    let own = BTreeSet::from([member.clone()]);
    let footprint = footprint_of(&spec.requests);
    let candidate = Candidate {
        spec,
        footprint: &footprint,
        own: &own,
    };
    let interpod = InterPodState::build(&cluster, spec, |_, _| Counted::Yes);
    let mut diagnosis = Diagnosis {
        nodes: cluster.len() as u64,
        ..Diagnosis::default()
    };
    let mut feasible = Vec::new();
    let mut curable = Vec::new();
    let demand = DeviceDemand::build(spec, view.device_classes());
    let probe = Probe::new(candidate, &interpod).with_devices(demand.as_ref());
    for idx in 0..cluster.len() {
        match probe.check(&cluster, idx, 1) {
            Ok(_) => feasible.push(idx),
            Err(reason) => {
                if reason.resolvable_by_preemption() {
                    curable.push(idx);
                }
                diagnosis.record(reason);
            }
        }
    }
    if !feasible.is_empty() {
        let input = ScoreInput {
            spec,
            footprint: &footprint,
            interpod: &interpod,
            profile,
        };
        let scores = score_nodes(&cluster, &feasible, &input);
        let best = feasible
            .iter()
            .zip(scores)
            .max_by(|(a, sa), (b, sb)| sa.cmp(sb).then(b.cmp(a)))
            .map(|(idx, _)| *idx);
        if let Some(name) = best.and_then(|idx| cluster.name(idx)) {
            return PreemptionOutcome::Fits {
                node: name.to_string(),
            };
        }
    }
    let units = collect_units(&cluster, spec.priority);
    let attempt = Attempt {
        cluster: &cluster,
        candidate,
        units: &units,
        devices: demand.as_ref(),
    };
    let best = curable
        .into_iter()
        .filter_map(|idx| attempt.try_node(idx))
        .min_by_key(Choice::rank);
    match best.and_then(|c| Some((cluster.name(c.node)?.to_string(), c.victims))) {
        Some((nominated_node, victims)) => PreemptionOutcome::Preempt(PreemptionPlan {
            nominated_node,
            victims,
        }),
        None => PreemptionOutcome::Unresolvable { diagnosis },
    }
}
