//! Gang placement and quotes.
//!
//! Owns the batch placement of a gang (or a gang group, or any member list) onto the
//! nodes of a ledger view, [`Placer`] (the same with a round-robin search cursor kept
//! across calls, as kube-scheduler keeps one) and [`quote`]. Members with identical pod
//! specs form one template; each template's filters and scores run once per node
//! searched, and its members are poured into the best-scored nodes up to each node's
//! fit count. Templates with inter-pod terms are placed one member at a time instead,
//! re-evaluated after each placement, since every member changes what the next one
//! sees. Larger templates go first. A template's node search follows the profile's
//! `percentageOfNodesToScore` (see [`crate::engine::search`]): it visits nodes
//! round-robin from the cursor and stops once it has found that many feasible nodes
//! *and* room for all the template's members, so sampling never leaves a member
//! unplaced that the searched nodes could hold; 100 searches every node. When the
//! profile names a gang topology key, the gang is first tried inside single domains of
//! that label (those estimated, over every node, to hold it, best score first, tightest
//! fit next); only if none holds it is it spread over the whole view. Quotes always
//! look at every node. Templates with resource claims (or device-served extended
//! resources) have their devices chosen in the same pass as their node (see
//! [`crate::engine::devices`]): each node's fit count is how many copies its devices
//! can serve one after the other, and every member poured into a node gets its own
//! allocation there, recorded in its reservation's pod summary. Invariants: the view is
//! never modified; the result is deterministic for a given view, inputs and cursor
//! (ties break by node name); every member is either assigned or reported unplaced with
//! a diagnosis; no two members of a round are given the same exclusive device. Called by the
//! shard leader (quotes, and placement within its shard) and the coordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::cache::FitCache;
use crate::engine::cluster::{Cluster, Nomination};
use crate::engine::devices::DeviceDemand;
use crate::engine::filter::{Candidate, Diagnosis, FilterReason, Probe};
use crate::engine::interpod::{Counted, InterPodState};
use crate::engine::profile::Profile;
use crate::engine::score::{RawScore, ScoreInput, Scorer};
use crate::engine::search::{feasible_nodes_to_find, Scope};
use crate::ledger::command::{NetworkHold, ReserveMember};
use crate::ledger::network::NetworkPools;
use crate::ledger::view::LedgerView;
use crate::model::claim::DeviceAllocation;
use crate::model::device::DeviceClass;
use crate::model::gang::{Gang, GangGroup, MemberKey};
use crate::model::pod::{footprint_of, PodSpec, PodSummary};
use crate::model::resources::Resources;
use crate::model::topology::TopologyConstraint;

mod topology;

/// The topology constraints of the gangs being placed, by gang (absent: none).
pub type GangTopologies = BTreeMap<(String, String), TopologyConstraint>;

/// The constraints of `gangs` that ask something, by (namespace, name).
pub fn topologies_of<'g>(gangs: impl IntoIterator<Item = &'g Gang>) -> GangTopologies {
    gangs
        .into_iter()
        .filter(|g| !g.topology.is_none())
        .map(|g| ((g.namespace.clone(), g.name.clone()), g.topology.clone()))
        .collect()
}

/// A member to place: its key and its spec.
#[derive(Debug, Clone, Copy)]
pub struct MemberRef<'a> {
    /// The member's key.
    pub key: &'a MemberKey,
    /// Its spec.
    pub spec: &'a PodSpec,
}

/// A topology domain: a node label key and one of its values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyDomain {
    /// Label key.
    pub key: String,
    /// Label value.
    pub value: String,
}

/// A member that could not be placed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unplaced {
    /// The member.
    pub member: MemberKey,
    /// What the nodes said.
    pub diagnosis: Diagnosis,
}

/// The outcome of placing a batch of members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangPlacement {
    /// Placed members, ready to reserve, in input order.
    pub assignments: Vec<ReserveMember>,
    /// Members that found no node, in input order.
    pub unplaced: Vec<Unplaced>,
    /// The single domain the batch was packed into, if it was.
    pub domain: Option<TopologyDomain>,
    /// The network-attached devices of the placed members (their `assignments` list
    /// only the devices of their nodes), held on every shard (docs/ARCHITECTURE.md §5,
    /// rule 15).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<NetworkHold>,
    /// Whether the plan read its members' labels (`Read` from peers that do not say).
    #[serde(default, skip_serializing_if = "MemberLabels::is_read")]
    pub member_labels: MemberLabels,
}

/// Whether a plan's feasibility depended on its members' own labels. When no filter read
/// them (no member has pod affinity terms, no pod on the shard has required
/// anti-affinity terms, no nomination names a member), members that differ only in
/// labels (an Indexed Job's completion index, a StatefulSet's pod name) are
/// interchangeable in it: a slot planned for one may go to another (`plan::assign`).
/// Only scores could differ then (other pods' preferred terms), never what fits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberLabels {
    /// A filter may have read them.
    #[default]
    Read,
    /// No filter read them.
    Unread,
}

impl MemberLabels {
    /// Whether this is `Read`.
    pub fn is_read(&self) -> bool {
        *self == Self::Read
    }
}

impl GangPlacement {
    /// A placement of nothing.
    pub fn empty() -> Self {
        Self {
            assignments: Vec::new(),
            unplaced: Vec::new(),
            domain: None,
            network: Vec::new(),
            member_labels: MemberLabels::Read,
        }
    }

    /// Whether every member was placed.
    pub fn is_complete(&self) -> bool {
        self.unplaced.is_empty()
    }
}

/// How many copies of a template fit, and the best node score among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// Copies that fit across all nodes, each node counted on its own.
    pub fit_count: u64,
    /// Best weighted score of a feasible node (`None` if none is feasible).
    pub best_score: Option<u64>,
    /// Why the infeasible nodes failed.
    pub diagnosis: Diagnosis,
}

/// Members sharing one pod spec.
struct Template<'a> {
    spec: &'a PodSpec,
    summary: PodSummary,
    footprint: Resources,
    /// Indexes into the member list.
    members: Vec<usize>,
    /// Its device needs (claims, device-served extended resources), if any.
    demand: Option<Arc<DeviceDemand>>,
}

impl Template<'_> {
    /// Whether placing a member changes what the next one sees (inter-pod terms).
    fn is_interacting(&self) -> bool {
        self.spec.has_pod_affinity_terms()
    }

    /// Its inter-pod state over `cluster`, every pod counted.
    fn interpod(&self, cluster: &Cluster<'_>) -> InterPodState {
        InterPodState::build(cluster, self.spec, |_, _| Counted::Yes)
    }
}

/// One feasible node for a template.
#[derive(Debug, Clone, Copy)]
struct Fit {
    node: usize,
    copies: u64,
    raw: RawScore,
    score: u64,
}

/// How far a node search goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extent {
    /// Every node in scope, copies uncapped (quotes, domain ranking).
    Exhaustive,
    /// Round-robin from the cursor until the profile's share of feasible nodes is found
    /// and, together, they hold `need` copies (or the scope runs out).
    Sampled { need: u64 },
}

/// The template-independent inputs of a search.
struct Searcher<'r> {
    own: &'r BTreeSet<MemberKey>,
    profile: &'r Profile,
    /// Results kept across calls, if the caller keeps them.
    cache: Option<&'r mut FitCache>,
    /// A list to fill next, kept to spare an allocation per search.
    spare: Vec<Fit>,
}

impl Searcher<'_> {
    /// Gives back a list of fits for the next search to reuse.
    fn recycle(&mut self, fits: Vec<Fit>) {
        if fits.capacity() > self.spare.capacity() {
            self.spare = fits;
        }
    }

    /// Filters and scores one template over `scope`; feasible nodes in search order.
    ///
    /// A sampled search starts at `cursor` and leaves it after the last node it visited.
    fn evaluate(
        &mut self,
        cluster: &Cluster<'_>,
        template: &Template<'_>,
        interpod: &InterPodState,
        scope: Scope<'_>,
        extent: Extent,
        cursor: &mut usize,
    ) -> (Vec<Fit>, Diagnosis) {
        let candidate = Candidate {
            spec: template.spec,
            footprint: &template.footprint,
            own: self.own,
        };
        let demand = template.demand.as_deref();
        let probe = Probe::new(candidate, interpod).with_devices(demand);
        let scorer = Scorer::new(ScoreInput {
            spec: template.spec,
            footprint: &template.footprint,
            interpod,
            profile: self.profile,
        })
        .with_devices(demand, cluster.network().is_some());
        // A network-attached device is one for every node: taking it on one node changes
        // what the others can do, which no node's stamp records.
        let reaches_network = demand.is_some() && cluster.network().is_some();
        let fit_only = probe.reads_node_only()
            && scorer.reads_fit_only()
            && !cluster.has_nominations()
            && !reaches_network;
        let classes: &[DeviceClass] = demand.map_or(&[], DeviceDemand::classes);
        let mut slot = match self.cache.as_deref_mut() {
            Some(cache) if fit_only => {
                Some(cache.template_for(template.spec, self.profile, classes, cluster.len()))
            }
            _ => None,
        };
        let len = scope.len();
        let (to_find, need, first) = match extent {
            Extent::Exhaustive => (usize::MAX, u64::MAX, 0),
            Extent::Sampled { need } => (
                feasible_nodes_to_find(self.profile.percentage_of_nodes_to_score, len),
                need,
                scope.first_position(*cursor),
            ),
        };
        let mut diagnosis = Diagnosis {
            nodes: len as u64,
            ..Diagnosis::default()
        };
        let mut fits = std::mem::take(&mut self.spare);
        fits.clear();
        fits.reserve(to_find.min(len));
        let mut held = 0u64;
        let mut processed = 0;
        while processed < len {
            let node = scope.node_at_step(first, processed);
            processed += 1;
            // A result kept for this very node state, if any; otherwise judge the node
            // now, and keep the result when it depends on the node's summary alone.
            let stamp = match slot {
                Some(_) => cluster.stamp(node),
                None => None,
            };
            let hit = match (&slot, stamp) {
                (Some(slot), Some(stamp)) => slot.get(node, stamp),
                _ => None,
            };
            let copies = match hit {
                Some(hit) if hit.copies > 0 => {
                    let copies = hit.copies.min(need);
                    let mut raw = RawScore::local_only(hit.local);
                    raw.devices = u64::from(hit.devices);
                    fits.push(Fit {
                        node,
                        copies,
                        raw,
                        score: 0,
                    });
                    copies
                }
                Some(hit) => {
                    diagnosis.record(hit.refusal());
                    continue;
                }
                None => {
                    let planned_fit;
                    let fit = if cluster.has_planned(node) {
                        let Some(fit) = cluster.fit(node) else {
                            continue;
                        };
                        planned_fit = fit;
                        &planned_fit
                    } else {
                        match cluster.base_fit(node) {
                            Some(fit) => fit,
                            None => continue,
                        }
                    };
                    let (slot, stamp) = match (slot.as_mut(), stamp) {
                        (Some(slot), Some(stamp)) => (Some(slot), stamp),
                        _ => (None, 0),
                    };
                    // What is kept is uncapped; what is used now is capped at `need`.
                    let cap = if slot.is_some() { u64::MAX } else { need };
                    let scored = probe.check_fit_scored(cluster, node, fit, cap);
                    let device_score = scored.as_ref().map_or(0, |(_, score)| *score);
                    let outcome = scored.map(|(copies, _)| copies);
                    let raw = match outcome {
                        Ok(_) => {
                            let mut raw = scorer.raw_fit(cluster, node, fit);
                            raw.devices = u64::from(device_score);
                            raw
                        }
                        Err(_) => RawScore::default(),
                    };
                    if let Some(slot) = slot {
                        slot.put_scored(node, stamp, fit, &outcome, raw.local, device_score);
                    }
                    match outcome {
                        Ok(copies) => {
                            let copies = copies.min(need);
                            fits.push(Fit {
                                node,
                                copies,
                                raw,
                                score: 0,
                            });
                            copies
                        }
                        Err(reason) => {
                            diagnosis.record(reason);
                            continue;
                        }
                    }
                }
            };
            held = held.saturating_add(copies);
            if fits.len() >= to_find && held >= need {
                break;
            }
        }
        if let Extent::Sampled { .. } = extent {
            *cursor = scope.cursor_after(first, processed, *cursor);
        }
        let normalizer = scorer.normalizer(fits.iter().map(|fit| &fit.raw));
        for fit in &mut fits {
            fit.score = normalizer.total(&fit.raw);
        }
        (fits, diagnosis)
    }
}

/// Best score first, then node order (name order).
fn best_first(a: &Fit, b: &Fit) -> std::cmp::Ordering {
    b.score.cmp(&a.score).then(a.node.cmp(&b.node))
}

/// The best fit, if any.
fn best(fits: &[Fit]) -> Option<&Fit> {
    fits.iter().min_by(|a, b| best_first(a, b))
}

/// Groups members by identical spec, larger footprints first, then first appearance;
/// device needs are resolved against `classes` (through `cache` when kept).
fn templates<'a>(
    members: &[MemberRef<'a>],
    classes: &BTreeMap<String, DeviceClass>,
    mut cache: Option<&mut FitCache>,
) -> Vec<Template<'a>> {
    let mut out: Vec<Template<'a>> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match out.iter_mut().find(|t| t.spec == m.spec) {
            Some(t) => t.members.push(i),
            None => out.push(Template {
                spec: m.spec,
                summary: PodSummary::from_spec(m.spec),
                footprint: footprint_of(&m.spec.requests),
                members: vec![i],
                demand: match cache.as_deref_mut() {
                    Some(cache) => cache.demand(m.spec, classes),
                    None => DeviceDemand::build(m.spec, classes).map(Arc::new),
                },
            }),
        }
    }
    let size = |t: &Template<'_>| {
        let extended: u64 = t.footprint.extended.values().sum();
        (extended, t.footprint.cpu_milli, t.footprint.memory_bytes)
    };
    out.sort_by(|a, b| size(b).cmp(&size(a)).then(a.members[0].cmp(&b.members[0])));
    if out
        .iter()
        .any(|t| t.spec.followed_shares().next().is_some())
    {
        out = carriers_first(out);
    }
    out
}

/// `templates` reordered so that a shared claim's carrier goes before the pods that
/// follow it to its node (a carrier may follow another claim itself); otherwise in
/// the given order. Pods whose claims follow each other in a cycle keep their order.
fn carriers_first(mut left: Vec<Template<'_>>) -> Vec<Template<'_>> {
    let carries = |t: &Template<'_>, claim: &str| t.spec.carried_shares().any(|s| s.claim == claim);
    let mut ordered = Vec::with_capacity(left.len());
    while !left.is_empty() {
        let ready = (0..left.len()).find(|&i| {
            left[i].spec.followed_shares().all(|f| {
                left.iter()
                    .enumerate()
                    .all(|(j, other)| j == i || !carries(other, &f.claim))
            })
        });
        ordered.push(left.remove(ready.unwrap_or(0)));
    }
    ordered
}

/// Planned member → node pairs and the members left over.
#[derive(Debug, Default)]
struct Fill {
    planned: Vec<(usize, usize)>,
    failed: Vec<(usize, Diagnosis)>,
    /// Summaries of planned members with device allocations, by member.
    summaries: BTreeMap<usize, PodSummary>,
}

/// Shared inputs of one placement round.
struct Round<'r, 'a> {
    members: &'r [MemberRef<'a>],
    /// The view's device classes (templates of a part of the round resolve against them).
    classes: &'r BTreeMap<String, DeviceClass>,
    templates: &'r [Template<'a>],
    searcher: Searcher<'r>,
    /// Where the next sampled search starts.
    cursor: usize,
}

impl Round<'_, '_> {
    /// Plans every template over the `scope` nodes.
    fn fill(&mut self, cluster: &mut Cluster<'_>, scope: Scope<'_>) -> Fill {
        let mut fill = Fill::default();
        for template in self.templates {
            if template.is_interacting() {
                self.fill_one_by_one(cluster, template, scope, &mut fill);
            } else {
                self.fill_by_counts(cluster, template, scope, &mut fill);
            }
        }
        fill
    }

    /// Plans `member` on `node` (allocating its devices there); `Err` says why it cannot.
    fn plan(
        &self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        member: usize,
        node: usize,
        fill: &mut Fill,
    ) -> Result<(), FilterReason> {
        let Some(m) = self.members.get(member) else {
            return Ok(());
        };
        let summary = match &template.demand {
            None => template.summary.clone(),
            Some(demand) => {
                let summary = demand.allocate(cluster, node, m.key, &template.summary)?;
                fill.summaries.insert(member, summary.clone());
                summary
            }
        };
        cluster.plan(node, m.key.clone(), summary);
        fill.planned.push((member, node));
        Ok(())
    }

    /// Plans `member` on `node` with the summary its devices were allocated in.
    fn place_as(
        &self,
        cluster: &mut Cluster<'_>,
        member: usize,
        node: usize,
        summary: PodSummary,
        fill: &mut Fill,
    ) {
        if let Some(m) = self.members.get(member) {
            fill.summaries.insert(member, summary.clone());
            cluster.plan(node, m.key.clone(), summary);
            fill.planned.push((member, node));
        }
    }

    fn fill_by_counts(
        &mut self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        scope: Scope<'_>,
        fill: &mut Fill,
    ) {
        let interpod = template.interpod(cluster);
        let need = template.members.len() as u64;
        let (mut fits, mut diagnosis) = self.searcher.evaluate(
            cluster,
            template,
            &interpod,
            scope,
            Extent::Sampled { need },
            &mut self.cursor,
        );
        if need > 1 {
            fits.sort_unstable_by(best_first);
        } else if let Some(at) =
            best(&fits).and_then(|b| fits.iter().position(|f| f.node == b.node))
        {
            fits.swap(0, at);
        }
        let mut pending = template.members.iter().copied();
        let mut left = need;
        let mut refused = Vec::new();
        for fit in &fits {
            if left == 0 {
                break;
            }
            let take = fit.copies.min(left);
            let batch: Vec<usize> = pending.by_ref().take(take as usize).collect();
            match &template.demand {
                // Devices for the node's members in one search, one after the other.
                Some(demand) => {
                    let keys: Vec<&MemberKey> = batch
                        .iter()
                        .filter_map(|&m| self.members.get(m).map(|r| r.key))
                        .collect();
                    let summaries =
                        match demand.allocate_each(cluster, fit.node, &keys, &template.summary) {
                            Ok(summaries) => summaries,
                            Err(reason) => {
                                diagnosis.record(reason);
                                Vec::new()
                            }
                        };
                    let mut summaries = summaries.into_iter();
                    for member in batch {
                        match summaries.next() {
                            Some(summary) => {
                                self.place_as(cluster, member, fit.node, summary, fill)
                            }
                            None => {
                                diagnosis.record(FilterReason::CannotAllocateDevices);
                                refused.push(member);
                            }
                        }
                    }
                }
                None => {
                    for member in batch {
                        if let Err(reason) = self.plan(cluster, template, member, fit.node, fill) {
                            diagnosis.record(reason);
                            refused.push(member);
                        }
                    }
                }
            }
            left -= take;
        }
        diagnosis.record_many(FilterReason::CapacityTakenByGang, fits.len() as u64);
        self.searcher.recycle(fits);
        for member in refused.into_iter().chain(pending) {
            fill.failed.push((member, diagnosis.clone()));
        }
    }

    fn fill_one_by_one(
        &mut self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        scope: Scope<'_>,
        fill: &mut Fill,
    ) {
        // Every placement is counted in as it happens, as a rebuild would count it.
        let mut interpod = template.interpod(cluster);
        for &member in &template.members {
            let (fits, diagnosis) = self.searcher.evaluate(
                cluster,
                template,
                &interpod,
                scope,
                Extent::Sampled { need: 1 },
                &mut self.cursor,
            );
            let chosen = best(&fits).map(|fit| fit.node);
            self.searcher.recycle(fits);
            match chosen {
                Some(node) => match self.plan(cluster, template, member, node, fill) {
                    Ok(()) => {
                        if let Some(n) = cluster.node(node) {
                            interpod.update(n, &template.summary, template.spec, 1);
                        }
                    }
                    Err(reason) => {
                        let mut diagnosis = diagnosis;
                        diagnosis.record(reason);
                        fill.failed.push((member, diagnosis));
                    }
                },
                None => fill.failed.push((member, diagnosis)),
            }
        }
    }

    /// Domains of `key` estimated to hold the whole batch, best first.
    ///
    /// The estimate looks at every node, whatever the profile's percentage of nodes to
    /// score: it decides where the gang goes, not which nodes it takes there.
    fn ranked_domains(&mut self, cluster: &Cluster<'_>, key: &str) -> Vec<(String, Vec<usize>)> {
        let domains = match self.searcher.cache.as_deref_mut() {
            Some(cache) => cache.domains(cluster, key),
            None => cluster.domains(key),
        };
        if domains.len() < 2 {
            return domains.into_iter().collect();
        }
        let mut domain_of = vec![None; cluster.len()];
        for (d, nodes) in domains.values().enumerate() {
            for &n in nodes {
                domain_of[n] = Some(d);
            }
        }
        // Per domain: (holds every template, summed best score, spare capacity).
        let mut holds = vec![true; domains.len()];
        let mut score = vec![0u64; domains.len()];
        let mut spare = vec![0u64; domains.len()];
        for template in self.templates {
            let interpod = template.interpod(cluster);
            let (fits, _) = self.searcher.evaluate(
                cluster,
                template,
                &interpod,
                Scope::All(cluster.len()),
                Extent::Exhaustive,
                &mut 0,
            );
            let mut capacity = vec![0u64; domains.len()];
            let mut best = vec![0u64; domains.len()];
            for fit in &fits {
                if let Some(d) = domain_of[fit.node] {
                    capacity[d] = capacity[d].saturating_add(fit.copies);
                    best[d] = best[d].max(fit.score);
                }
            }
            self.searcher.recycle(fits);
            let need = template.members.len() as u64;
            for d in 0..domains.len() {
                holds[d] &= capacity[d] >= need;
                score[d] = score[d].saturating_add(best[d]);
                spare[d] = spare[d].saturating_add(capacity[d].saturating_sub(need));
            }
        }
        let mut ranked: Vec<(usize, (String, Vec<usize>))> = domains
            .into_iter()
            .enumerate()
            .filter(|(d, _)| holds[*d])
            .collect();
        ranked.sort_by(|(a, _), (b, _)| {
            score[*b]
                .cmp(&score[*a])
                .then(spare[*a].cmp(&spare[*b]))
                .then(a.cmp(b))
        });
        ranked.into_iter().map(|(_, domain)| domain).collect()
    }

    fn result(
        &self,
        cluster: &Cluster<'_>,
        fill: Fill,
        domain: Option<TopologyDomain>,
    ) -> GangPlacement {
        let mut planned = fill.planned;
        let mut summaries = fill.summaries;
        planned.sort_unstable();
        let mut failed = fill.failed;
        failed.sort_by_key(|(member, _)| *member);
        let mut assignments: Vec<ReserveMember> = planned
            .into_iter()
            .filter_map(|(member, node)| {
                let m = self.members.get(member)?;
                Some(ReserveMember {
                    member: m.key.clone(),
                    node: cluster.name(node)?.to_string(),
                    pod: summaries
                        .remove(&member)
                        .unwrap_or_else(|| PodSummary::from_spec(m.spec)),
                })
            })
            .collect();
        let network = match cluster.network() {
            Some(pools) => split_network_devices(&mut assignments, pools),
            None => Vec::new(),
        };
        let unplaced = failed
            .into_iter()
            .filter_map(|(member, diagnosis)| {
                Some(Unplaced {
                    member: self.members.get(member)?.key.clone(),
                    diagnosis,
                })
            })
            .collect();
        GangPlacement {
            assignments,
            unplaced,
            domain,
            network,
            member_labels: MemberLabels::Read,
        }
    }
}

/// Moves the members' network-attached devices out of their summaries (which keep the
/// devices of their nodes) into holds, in member order: a member's own, and a shared
/// claim's under the claim for the member that carries it; then each member that
/// follows a claim carried with network devices (here or held already) uses it.
pub fn split_network_devices(
    assignments: &mut [ReserveMember],
    pools: &NetworkPools,
) -> Vec<NetworkHold> {
    let mut holds = Vec::new();
    for m in assignments.iter_mut() {
        let (network, local): (Vec<_>, Vec<_>) = std::mem::take(&mut m.pod.devices)
            .into_iter()
            .partition(|a| pools.has_pool_of(&a.device));
        m.pod.devices = local;
        let mut own = Vec::new();
        let mut shared: BTreeMap<String, Vec<DeviceAllocation>> = BTreeMap::new();
        for a in network {
            match m.pod.shares.iter().find(|s| s.pod_claim == a.claim) {
                Some(share) => shared.entry(share.claim.clone()).or_default().push(a),
                None => own.push(a),
            }
        }
        if !own.is_empty() {
            holds.push(NetworkHold {
                member: m.member.clone(),
                devices: own,
                claim: None,
            });
        }
        for (claim, devices) in shared {
            holds.push(NetworkHold {
                member: m.member.clone(),
                devices,
                claim: Some(claim),
            });
        }
    }
    let carried: BTreeSet<(MemberKey, String)> = holds
        .iter()
        .filter_map(|h| Some((h.member.clone(), h.claim.clone()?)))
        .collect();
    for m in assignments.iter() {
        for share in m.pod.followed() {
            let carries = carried.contains(&(m.member.clone(), share.claim.clone()));
            let network = carried.iter().any(|(_, c)| *c == share.claim)
                || pools.claim_hold(&share.claim).is_some();
            if !carries && network {
                holds.push(NetworkHold {
                    member: m.member.clone(),
                    devices: Vec::new(),
                    claim: Some(share.claim.clone()),
                });
            }
        }
    }
    holds
}

/// The members split into what is placed together: each constrained gang alone, and
/// the runs of members between them.
fn units<'m, 'a>(
    members: &'m [MemberRef<'a>],
    topologies: &'m GangTopologies,
) -> Vec<(Vec<MemberRef<'a>>, Option<&'m TopologyConstraint>)> {
    if topologies.is_empty() {
        return vec![(members.to_vec(), None)];
    }
    let mut units: Vec<(Vec<MemberRef<'a>>, Option<&'m TopologyConstraint>)> = Vec::new();
    let mut gang_unit: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    // A gang's members come one after the other: its constraint is looked up once.
    let mut last: Option<((&str, &str), Option<&'m TopologyConstraint>)> = None;
    for m in members {
        let gang = (m.key.namespace.as_str(), m.key.gang.as_str());
        let constraint = match last {
            Some((g, c)) if g == gang => c,
            _ => {
                let c = topologies
                    .get(&(gang.0.to_string(), gang.1.to_string()))
                    .filter(|c| !c.is_none());
                last = Some((gang, c));
                c
            }
        };
        match constraint {
            Some(c) => match gang_unit.get(&gang) {
                Some(&u) => units[u].0.push(*m),
                None => {
                    gang_unit.insert(gang, units.len());
                    units.push((vec![*m], Some(c)));
                }
            },
            None => match units.last_mut() {
                Some((unit, None)) => unit.push(*m),
                _ => units.push((vec![*m], None)),
            },
        }
    }
    units
}

/// The placements of the units as one, in the members' order.
fn join(members: &[MemberRef<'_>], parts: Vec<GangPlacement>) -> GangPlacement {
    if parts.len() == 1 {
        if let Some(only) = parts.into_iter().next() {
            return only;
        }
        return GangPlacement::empty();
    }
    let position: BTreeMap<&MemberKey, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.key, i))
        .collect();
    let at = |key: &MemberKey| position.get(key).copied().unwrap_or(usize::MAX);
    let mut out = GangPlacement::empty();
    for part in parts {
        out.assignments.extend(part.assignments);
        out.unplaced.extend(part.unplaced);
        out.network.extend(part.network);
        if out.domain.is_none() {
            out.domain = part.domain;
        }
    }
    out.assignments.sort_by_key(|a| at(&a.member));
    out.unplaced.sort_by_key(|u| at(&u.member));
    out
}

/// Undoes a fill's planned pods, last first.
fn rollback(cluster: &mut Cluster<'_>, fill: &Fill) {
    for &(_, node) in fill.planned.iter().rev() {
        cluster.unplan_last(node);
    }
}

/// The placement engine with what kube-scheduler keeps between scheduling cycles: the
/// node where the last search stopped, where the next one starts (round-robin).
///
/// A shard leader keeps one and places through it; the free functions
/// ([`place_members`], …) are a single call of a placer starting at the first node.
/// Results depend only on the view, the inputs and this cursor. A placer also keeps,
/// per pod template, results that depend on a node's summary alone, and each node's
/// gang topology domain, both checked against the view's node stamps before use (see
/// [`crate::engine::cache`]); they make repeated placements fast and never change a
/// result. Memory: 32 bytes per node for each of the last few templates placed, plus a
/// search buffer of up to 56 bytes per node searched.
#[derive(Debug, Clone)]
pub struct Placer {
    next_start: usize,
    /// Template results kept across calls (`None`: a single call, nothing kept).
    cache: Option<FitCache>,
    /// A list of fits to reuse.
    spare: Vec<Fit>,
}

impl Placer {
    /// A placer whose first search starts at the first node.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A placer whose next search starts at node position `node` (modulo the node count).
    pub fn starting_at(node: usize) -> Self {
        Self {
            next_start: node,
            cache: Some(FitCache::default()),
            spare: Vec::new(),
        }
    }

    /// A placer that keeps no results between calls, starting at node position `node`.
    pub(crate) fn uncached(node: usize) -> Self {
        Self {
            next_start: node,
            cache: None,
            spare: Vec::new(),
        }
    }

    /// Node position where the next search starts.
    pub fn next_start(&self) -> usize {
        self.next_start
    }

    /// Places a list of members as one batch (see the module header for the strategy).
    pub fn place_members<V: LedgerView + ?Sized>(
        &mut self,
        view: &V,
        members: &[MemberRef<'_>],
        profile: &Profile,
        nominations: &[Nomination],
    ) -> GangPlacement {
        self.place_members_with(view, members, profile, nominations, &GangTopologies::new())
    }

    /// Places a list of members as one batch, each gang of `topologies` under its
    /// constraint: such a gang is placed on its own (`placement::topology`), in the
    /// order its first member comes; the members between them are placed together.
    pub fn place_members_with<V: LedgerView + ?Sized>(
        &mut self,
        view: &V,
        members: &[MemberRef<'_>],
        profile: &Profile,
        nominations: &[Nomination],
        topologies: &GangTopologies,
    ) -> GangPlacement {
        let mut cluster = Cluster::build(view, nominations);
        // Only nominations look at who is being placed.
        let own: BTreeSet<MemberKey> = if cluster.has_nominations() {
            members.iter().map(|m| m.key.clone()).collect()
        } else {
            BTreeSet::new()
        };
        let labels = match cluster.has_anti_affinity
            || cluster.has_nominations()
            || members.iter().any(|m| m.spec.has_pod_affinity_terms())
        {
            true => MemberLabels::Read,
            false => MemberLabels::Unread,
        };
        let units = units(members, topologies);
        let mut parts = Vec::with_capacity(units.len());
        for (unit, constraint) in &units {
            let templates = templates(unit, view.device_classes(), self.cache.as_mut());
            let mut round = Round {
                members: unit,
                classes: view.device_classes(),
                templates: &templates,
                searcher: Searcher {
                    own: &own,
                    profile,
                    cache: self.cache.as_mut(),
                    spare: std::mem::take(&mut self.spare),
                },
                cursor: self.next_start,
            };
            parts.push(match constraint {
                Some(constraint) => {
                    topology::place_constrained(&mut round, &mut cluster, constraint)
                }
                None => place_round(&mut round, &mut cluster),
            });
            self.next_start = round.cursor;
            self.spare = round.searcher.spare;
        }
        let mut placement = join(members, parts);
        placement.member_labels = labels;
        placement
    }

    /// Places every member of a gang as one batch.
    pub fn place_gang<V: LedgerView + ?Sized>(
        &mut self,
        view: &V,
        gang: &Gang,
        profile: &Profile,
        nominations: &[Nomination],
    ) -> GangPlacement {
        let keys: Vec<MemberKey> = gang.members.iter().map(|m| gang.member_key(m)).collect();
        let members: Vec<MemberRef<'_>> = gang
            .members
            .iter()
            .zip(&keys)
            .map(|(m, key)| MemberRef { key, spec: &m.spec })
            .collect();
        let topologies = topologies_of([gang]);
        self.place_members_with(view, &members, profile, nominations, &topologies)
    }

    /// Places every member of every gang of a group as one batch.
    pub fn place_group<V: LedgerView + ?Sized>(
        &mut self,
        view: &V,
        group: &GangGroup,
        profile: &Profile,
        nominations: &[Nomination],
    ) -> GangPlacement {
        let pairs: Vec<(MemberKey, &PodSpec)> = group
            .gangs
            .iter()
            .flat_map(|g| g.members.iter().map(move |m| (g.member_key(m), &m.spec)))
            .collect();
        let members: Vec<MemberRef<'_>> = pairs
            .iter()
            .map(|(key, spec)| MemberRef { key, spec })
            .collect();
        let topologies = topologies_of(&group.gangs);
        self.place_members_with(view, &members, profile, nominations, &topologies)
    }
}

impl Default for Placer {
    fn default() -> Self {
        Self::new()
    }
}

/// Packs the round into the best domain that holds it, or spreads it over every node.
fn place_round(round: &mut Round<'_, '_>, cluster: &mut Cluster<'_>) -> GangPlacement {
    let profile = round.searcher.profile;
    if let Some(key) = profile
        .gang_topology_key
        .as_deref()
        .filter(|_| round.members.len() > 1)
    {
        for (value, nodes) in round.ranked_domains(cluster, key) {
            let fill = round.fill(cluster, Scope::Only(&nodes));
            if fill.failed.is_empty() {
                let domain = TopologyDomain {
                    key: key.to_string(),
                    value,
                };
                return round.result(cluster, fill, Some(domain));
            }
            rollback(cluster, &fill);
        }
    }
    let fill = round.fill(cluster, Scope::All(cluster.len()));
    round.result(cluster, fill, None)
}

/// Places a list of members as one batch (see the module header for the strategy).
pub fn place_members<V: LedgerView + ?Sized>(
    view: &V,
    members: &[MemberRef<'_>],
    profile: &Profile,
    nominations: &[Nomination],
) -> GangPlacement {
    Placer::uncached(0).place_members(view, members, profile, nominations)
}

/// Places every member of a gang as one batch.
pub fn place_gang<V: LedgerView + ?Sized>(
    view: &V,
    gang: &Gang,
    profile: &Profile,
    nominations: &[Nomination],
) -> GangPlacement {
    Placer::uncached(0).place_gang(view, gang, profile, nominations)
}

/// Places every member of every gang of a group as one batch.
pub fn place_group<V: LedgerView + ?Sized>(
    view: &V,
    group: &GangGroup,
    profile: &Profile,
    nominations: &[Nomination],
) -> GangPlacement {
    Placer::uncached(0).place_group(view, group, profile, nominations)
}

/// Quotes one template: how many copies fit and the best score.
pub fn quote<V: LedgerView + ?Sized>(
    view: &V,
    spec: &PodSpec,
    profile: &Profile,
    nominations: &[Nomination],
) -> Quote {
    quote_many(view, &[spec], profile, nominations)
        .pop()
        .unwrap_or(Quote {
            fit_count: 0,
            best_score: None,
            diagnosis: Diagnosis::default(),
        })
}

/// Quotes several templates against one copy of the view (one batched quote).
///
/// Quotes look at every node, whatever the profile's percentage of nodes to score.
pub fn quote_many<V: LedgerView + ?Sized>(
    view: &V,
    specs: &[&PodSpec],
    profile: &Profile,
    nominations: &[Nomination],
) -> Vec<Quote> {
    let cluster = Cluster::build(view, nominations);
    let own = BTreeSet::new();
    let mut searcher = Searcher {
        own: &own,
        profile,
        cache: None,
        spare: Vec::new(),
    };
    specs
        .iter()
        .map(|spec| {
            let template = Template {
                spec,
                summary: PodSummary::from_spec(spec),
                footprint: footprint_of(&spec.requests),
                members: Vec::new(),
                demand: DeviceDemand::build(spec, view.device_classes()).map(Arc::new),
            };
            let interpod = template.interpod(&cluster);
            let (fits, diagnosis) = searcher.evaluate(
                &cluster,
                &template,
                &interpod,
                Scope::All(cluster.len()),
                Extent::Exhaustive,
                &mut 0,
            );
            let quote = Quote {
                fit_count: fits
                    .iter()
                    .fold(0u64, |acc, f| acc.saturating_add(f.copies)),
                best_score: best(&fits).map(|f| f.score),
                diagnosis,
            };
            searcher.recycle(fits);
            quote
        })
        .collect()
}
