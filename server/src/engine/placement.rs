//! Gang placement and quotes.
//!
//! Owns the batch placement of a gang (or a gang group, or any member list) onto the
//! nodes of a ledger view, and [`quote`]. Members with identical pod specs form one
//! template; each template's filters and scores run once per node, and its members are
//! poured into the best-scored nodes up to each node's fit count. Templates with
//! inter-pod terms are placed one member at a time instead, re-evaluated after each
//! placement, since every member changes what the next one sees. Larger templates go
//! first. When the profile names a gang topology key, the gang is first tried inside
//! single domains of that label (those estimated to hold it, best score first, tightest
//! fit next); only if none holds it is it spread over the whole view. Invariants: the
//! view is never modified; the result is deterministic (ties break by node name);
//! every member is either assigned or reported unplaced with a diagnosis. Called by the
//! shard leader (quotes, and placement within its shard) and the coordinator.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::engine::cluster::{Cluster, Nomination};
use crate::engine::filter::{filter_node, Candidate, Diagnosis, FilterReason};
use crate::engine::interpod::{Counted, InterPodState};
use crate::engine::profile::Profile;
use crate::engine::score::{score_nodes, ScoreInput};
use crate::ledger::command::ReserveMember;
use crate::ledger::view::LedgerView;
use crate::model::gang::{Gang, GangGroup, MemberKey};
use crate::model::pod::{footprint_of, PodSpec, PodSummary};
use crate::model::resources::Resources;

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
}

impl GangPlacement {
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
}

impl Template<'_> {
    /// Whether placing a member changes what the next one sees (inter-pod terms).
    fn is_interacting(&self) -> bool {
        self.spec.has_pod_affinity_terms()
    }
}

/// One feasible node for a template.
#[derive(Debug, Clone, Copy)]
struct Fit {
    node: usize,
    copies: u64,
    score: u64,
}

/// Filters and scores one template over `allowed` nodes; feasible nodes best first.
fn evaluate(
    cluster: &Cluster<'_>,
    template: &Template<'_>,
    own: &BTreeSet<MemberKey>,
    profile: &Profile,
    allowed: &[usize],
) -> (Vec<Fit>, Diagnosis) {
    let interpod = InterPodState::build(cluster, template.spec, |_, _| Counted::Yes);
    let candidate = Candidate {
        spec: template.spec,
        footprint: &template.footprint,
        own,
    };
    let mut diagnosis = Diagnosis {
        nodes: allowed.len() as u64,
        ..Diagnosis::default()
    };
    let mut feasible = Vec::new();
    let mut copies = Vec::new();
    for &idx in allowed {
        let Some(state) = cluster.nodes.get(idx) else {
            continue;
        };
        match filter_node(state, &candidate, &interpod) {
            Ok(n) => {
                feasible.push(idx);
                copies.push(n);
            }
            Err(reason) => diagnosis.record(reason),
        }
    }
    let input = ScoreInput {
        spec: template.spec,
        footprint: &template.footprint,
        interpod: &interpod,
        profile,
    };
    let scores = score_nodes(cluster, &feasible, &input);
    let mut fits: Vec<Fit> = feasible
        .into_iter()
        .zip(copies)
        .zip(scores)
        .map(|((node, copies), score)| Fit {
            node,
            copies,
            score,
        })
        .collect();
    fits.sort_by(|a, b| b.score.cmp(&a.score).then(a.node.cmp(&b.node)));
    (fits, diagnosis)
}

/// Groups members by identical spec, larger footprints first, then first appearance.
fn templates<'a>(members: &[MemberRef<'a>]) -> Vec<Template<'a>> {
    let mut out: Vec<Template<'a>> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match out.iter_mut().find(|t| t.spec == m.spec) {
            Some(t) => t.members.push(i),
            None => out.push(Template {
                spec: m.spec,
                summary: PodSummary::from_spec(m.spec),
                footprint: footprint_of(&m.spec.requests),
                members: vec![i],
            }),
        }
    }
    let size = |t: &Template<'_>| {
        let extended: u64 = t.footprint.extended.values().sum();
        (extended, t.footprint.cpu_milli, t.footprint.memory_bytes)
    };
    out.sort_by(|a, b| size(b).cmp(&size(a)).then(a.members[0].cmp(&b.members[0])));
    out
}

/// Planned member → node pairs and the members left over.
#[derive(Debug, Default)]
struct Fill {
    planned: Vec<(usize, usize)>,
    failed: Vec<(usize, Diagnosis)>,
}

/// Shared inputs of one placement round.
struct Round<'r, 'a> {
    members: &'r [MemberRef<'a>],
    templates: &'r [Template<'a>],
    own: &'r BTreeSet<MemberKey>,
    profile: &'r Profile,
}

impl Round<'_, '_> {
    /// Plans every template over `allowed` nodes.
    fn fill(&self, cluster: &mut Cluster<'_>, allowed: &[usize]) -> Fill {
        let mut fill = Fill::default();
        for template in self.templates {
            if template.is_interacting() {
                self.fill_one_by_one(cluster, template, allowed, &mut fill);
            } else {
                self.fill_by_counts(cluster, template, allowed, &mut fill);
            }
        }
        fill
    }

    fn plan(
        &self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        member: usize,
        node: usize,
        fill: &mut Fill,
    ) {
        if let Some(m) = self.members.get(member) {
            cluster.plan(node, m.key.clone(), template.summary.clone());
            fill.planned.push((member, node));
        }
    }

    fn fill_by_counts(
        &self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        allowed: &[usize],
        fill: &mut Fill,
    ) {
        let (fits, mut diagnosis) = evaluate(cluster, template, self.own, self.profile, allowed);
        let mut pending = template.members.iter().copied();
        let mut left = template.members.len() as u64;
        for fit in &fits {
            let take = fit.copies.min(left);
            for member in pending.by_ref().take(take as usize) {
                self.plan(cluster, template, member, fit.node, fill);
            }
            left -= take;
        }
        diagnosis.record_many(FilterReason::CapacityTakenByGang, fits.len() as u64);
        for member in pending {
            fill.failed.push((member, diagnosis.clone()));
        }
    }

    fn fill_one_by_one(
        &self,
        cluster: &mut Cluster<'_>,
        template: &Template<'_>,
        allowed: &[usize],
        fill: &mut Fill,
    ) {
        for &member in &template.members {
            let (fits, diagnosis) = evaluate(cluster, template, self.own, self.profile, allowed);
            match fits.first() {
                Some(best) => self.plan(cluster, template, member, best.node, fill),
                None => fill.failed.push((member, diagnosis)),
            }
        }
    }

    /// Domains of `key` estimated to hold the whole batch, best first.
    fn ranked_domains(&self, cluster: &Cluster<'_>, key: &str) -> Vec<(String, Vec<usize>)> {
        let domains = cluster.domains(key);
        if domains.len() < 2 {
            return domains.into_iter().collect();
        }
        let all: Vec<usize> = (0..cluster.nodes.len()).collect();
        let mut domain_of = vec![None; cluster.nodes.len()];
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
            let (fits, _) = evaluate(cluster, template, self.own, self.profile, &all);
            let mut capacity = vec![0u64; domains.len()];
            let mut best = vec![0u64; domains.len()];
            for fit in &fits {
                if let Some(d) = domain_of[fit.node] {
                    capacity[d] = capacity[d].saturating_add(fit.copies);
                    best[d] = best[d].max(fit.score);
                }
            }
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
        planned.sort_unstable();
        let mut failed = fill.failed;
        failed.sort_by_key(|(member, _)| *member);
        let assignments = planned
            .into_iter()
            .filter_map(|(member, node)| {
                let m = self.members.get(member)?;
                Some(ReserveMember {
                    member: m.key.clone(),
                    node: cluster.nodes.get(node)?.node.name.clone(),
                    pod: PodSummary::from_spec(m.spec),
                })
            })
            .collect();
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
        }
    }
}

/// Undoes a fill's planned pods, last first.
fn rollback(cluster: &mut Cluster<'_>, fill: &Fill) {
    for &(_, node) in fill.planned.iter().rev() {
        cluster.unplan_last(node);
    }
}

/// Places a list of members as one batch (see the module header for the strategy).
pub fn place_members<V: LedgerView + ?Sized>(
    view: &V,
    members: &[MemberRef<'_>],
    profile: &Profile,
    nominations: &[Nomination],
) -> GangPlacement {
    let mut cluster = Cluster::build(view, nominations);
    let own: BTreeSet<MemberKey> = members.iter().map(|m| m.key.clone()).collect();
    let templates = templates(members);
    let round = Round {
        members,
        templates: &templates,
        own: &own,
        profile,
    };
    if let Some(key) = profile
        .gang_topology_key
        .as_deref()
        .filter(|_| members.len() > 1)
    {
        for (value, nodes) in round.ranked_domains(&cluster, key) {
            let fill = round.fill(&mut cluster, &nodes);
            if fill.failed.is_empty() {
                let domain = TopologyDomain {
                    key: key.to_string(),
                    value,
                };
                return round.result(&cluster, fill, Some(domain));
            }
            rollback(&mut cluster, &fill);
        }
    }
    let all: Vec<usize> = (0..cluster.nodes.len()).collect();
    let fill = round.fill(&mut cluster, &all);
    round.result(&cluster, fill, None)
}

/// Places every member of a gang as one batch.
pub fn place_gang<V: LedgerView + ?Sized>(
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
    place_members(view, &members, profile, nominations)
}

/// Places every member of every gang of a group as one batch.
pub fn place_group<V: LedgerView + ?Sized>(
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
    place_members(view, &members, profile, nominations)
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
pub fn quote_many<V: LedgerView + ?Sized>(
    view: &V,
    specs: &[&PodSpec],
    profile: &Profile,
    nominations: &[Nomination],
) -> Vec<Quote> {
    let cluster = Cluster::build(view, nominations);
    let all: Vec<usize> = (0..cluster.nodes.len()).collect();
    let own = BTreeSet::new();
    specs
        .iter()
        .map(|spec| {
            let template = Template {
                spec,
                summary: PodSummary::from_spec(spec),
                footprint: footprint_of(&spec.requests),
                members: Vec::new(),
            };
            let (fits, diagnosis) = evaluate(&cluster, &template, &own, profile, &all);
            Quote {
                fit_count: fits
                    .iter()
                    .fold(0u64, |acc, f| acc.saturating_add(f.copies)),
                best_score: fits.first().map(|f| f.score),
                diagnosis,
            }
        })
        .collect()
}
