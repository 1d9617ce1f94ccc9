//! Topology-aware placement of one gang under its [`TopologyConstraint`].
//!
//! Owns the choice of domains for a constrained gang (the round holds that gang's
//! members only). A *required* level: the gang goes whole into one domain of it, the
//! one that holds it with the least room to spare (best fit), ties to the domain where
//! it needs the fewest domains of the level below (its preferred level, else the next
//! level of its hierarchy), within which it is then packed as a preferred gang; no domain holding it leaves every member unplaced with
//! [`FilterReason::TopologyDomainTooSmall`], naming the best domain. A *preferred*
//! level: one domain of it if any holds the gang (best fit), else the fewest domains of
//! it that together do (largest first, the last one the smallest that completes the
//! gang), taken inside one domain of a wider level of its hierarchy when that costs no
//! extra domain; if even that fails, anywhere. *Slices*: consecutive runs of
//! `size` members, each placed as a required gang of the slice's level, all within the
//! required domain if there is one; one slice that finds no domain unplaces the gang.
//! Capacities are estimated per template over every node in scope (fit counts, as
//! quotes do), then the fill decides: an estimate too rosy (templates sharing nodes)
//! rolls back and the next candidate is tried. Invariants: a placement that satisfies a
//! required level or slices is never spread over two domains of it; nothing is left
//! planned on the cluster for a gang reported unplaced. Called by
//! [`super::Placer::place_members_with`].

use super::*;
use crate::model::topology::{hierarchy_of, TopologyConstraint, TopologyHierarchy, TopologySlice};

/// What one domain of a level could hold of the round, per template.
#[derive(Debug, Clone)]
struct DomainEstimate {
    value: String,
    nodes: Vec<usize>,
    /// Copies of each template (in round order) its nodes take, one template at a time.
    capacity: Vec<u64>,
}

impl DomainEstimate {
    fn holds(&self, need: &[u64]) -> bool {
        self.capacity.iter().zip(need).all(|(c, n)| c >= n)
    }

    /// Room left over once the round is in (best fit: less is better).
    fn spare(&self, need: &[u64]) -> u64 {
        self.capacity
            .iter()
            .zip(need)
            .map(|(c, n)| c.saturating_sub(*n))
            .sum()
    }

    /// Members of the round it holds.
    fn held(&self, need: &[u64]) -> u64 {
        self.capacity
            .iter()
            .zip(need)
            .map(|(c, n)| (*c).min(*n))
            .sum()
    }

    /// The share of the round it holds, scaled: the template it holds least of counts.
    fn share(&self, need: &[u64]) -> u128 {
        self.capacity
            .iter()
            .zip(need)
            .map(|(c, n)| u128::from(*c) * 1_000_000 / u128::from((*n).max(1)))
            .min()
            .unwrap_or(0)
    }
}

/// Fewest domains of `estimates` that together hold `need`: the largest first, then
/// the one with least to spare that completes it. `None` if all of them do not.
fn fewest(estimates: &[&DomainEstimate], need: &[u64]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..estimates.len()).collect();
    order.sort_by(|&a, &b| {
        estimates[b]
            .share(need)
            .cmp(&estimates[a].share(need))
            .then(estimates[a].value.cmp(&estimates[b].value))
    });
    let mut chosen = Vec::new();
    let mut left: Vec<u64> = need.to_vec();
    for &d in &order {
        if left.iter().all(|l| *l == 0) {
            break;
        }
        // The domain with least to spare that completes what is left, if one does.
        let completing = order
            .iter()
            .filter(|i| !chosen.contains(*i))
            .filter(|&&i| estimates[i].holds(&left))
            .min_by_key(|&&i| (estimates[i].spare(&left), &estimates[i].value));
        if let Some(&last) = completing {
            chosen.push(last);
            left.iter_mut().for_each(|l| *l = 0);
            break;
        }
        if chosen.contains(&d) {
            continue;
        }
        chosen.push(d);
        for (l, c) in left.iter_mut().zip(&estimates[d].capacity) {
            *l = l.saturating_sub(*c);
        }
    }
    left.iter().all(|l| *l == 0).then_some(chosen)
}

/// Nodes of the chosen domains, ascending.
fn union(estimates: &[&DomainEstimate], chosen: &[usize]) -> Vec<usize> {
    let mut nodes: Vec<usize> = chosen
        .iter()
        .flat_map(|&d| estimates[d].nodes.iter().copied())
        .collect();
    nodes.sort_unstable();
    nodes
}

impl Round<'_, '_> {
    /// Members each template of the round needs.
    fn needs(&self) -> Vec<u64> {
        self.templates
            .iter()
            .map(|t| t.members.len() as u64)
            .collect()
    }

    /// Every domain of `key` among `scope` (ascending node positions) with what it holds.
    fn estimate(
        &mut self,
        cluster: &Cluster<'_>,
        key: &str,
        scope: &[usize],
    ) -> Vec<DomainEstimate> {
        let mut domains: BTreeMap<&str, usize> = BTreeMap::new();
        let mut out: Vec<DomainEstimate> = Vec::new();
        let mut domain_of = vec![None; cluster.len()];
        for &n in scope {
            let Some(value) = cluster.node(n).and_then(|node| node.label(key)) else {
                continue;
            };
            let d = *domains.entry(value).or_insert_with(|| {
                out.push(DomainEstimate {
                    value: value.to_string(),
                    nodes: Vec::new(),
                    capacity: vec![0; self.templates.len()],
                });
                out.len() - 1
            });
            out[d].nodes.push(n);
            if let Some(slot) = domain_of.get_mut(n) {
                *slot = Some(d);
            }
        }
        for (t, template) in self.templates.iter().enumerate() {
            let interpod = template.interpod(cluster);
            let (fits, _) = self.searcher.evaluate(
                cluster,
                template,
                &interpod,
                Scope::Only(scope),
                Extent::Exhaustive,
                &mut 0,
            );
            for fit in &fits {
                if let Some(d) = domain_of.get(fit.node).copied().flatten() {
                    out[d].capacity[t] = out[d].capacity[t].saturating_add(fit.copies);
                }
            }
            self.searcher.recycle(fits);
        }
        out.sort_by(|a, b| a.value.cmp(&b.value));
        out
    }

    /// Plans the round inside `scope` if it fits there whole; otherwise plans nothing.
    fn fill_whole(&mut self, cluster: &mut Cluster<'_>, scope: &[usize]) -> Option<Fill> {
        let fill = self.fill(cluster, Scope::Only(scope));
        if fill.failed.is_empty() {
            return Some(fill);
        }
        rollback(cluster, &fill);
        None
    }

    /// Plans the round in as few domains of `key` within `scope` as it can, whole.
    fn fill_preferred(
        &mut self,
        cluster: &mut Cluster<'_>,
        scope: &[usize],
        key: &str,
        hierarchy: Option<&TopologyHierarchy>,
    ) -> Option<Fill> {
        let need = self.needs();
        let estimates = self.estimate(cluster, key, scope);
        let mut single: Vec<&DomainEstimate> =
            estimates.iter().filter(|e| e.holds(&need)).collect();
        single.sort_by_key(|e| (e.spare(&need), e.value.clone()));
        for domain in single {
            if let Some(fill) = self.fill_whole(cluster, &domain.nodes) {
                return Some(fill);
            }
        }
        let all: Vec<&DomainEstimate> = estimates.iter().collect();
        let least = fewest(&all, &need)?;
        let mut chosen = union(&all, &least);
        // Inside one domain of a wider level, when that takes no more domains of `key`.
        let wider = hierarchy.map_or_else(Vec::new, |h| h.wider_than(key));
        for level in wider {
            let mut by_value: BTreeMap<&str, Vec<&DomainEstimate>> = BTreeMap::new();
            for e in &estimates {
                let outer = e
                    .nodes
                    .first()
                    .and_then(|&n| cluster.node(n))
                    .and_then(|node| node.label(level));
                if let Some(outer) = outer {
                    by_value.entry(outer).or_default().push(e);
                }
            }
            let mut best: Option<(u64, Vec<usize>)> = None;
            for inner in by_value.values() {
                let Some(picked) = fewest(inner, &need) else {
                    continue;
                };
                if picked.len() != least.len() {
                    continue;
                }
                let spare: u64 = picked
                    .iter()
                    .map(|&d| inner[d].capacity.iter().sum::<u64>())
                    .sum();
                if best.as_ref().is_none_or(|(s, _)| spare < *s) {
                    best = Some((spare, union(inner, &picked)));
                }
            }
            if let Some((_, nodes)) = best {
                chosen = nodes;
                break;
            }
        }
        self.fill_whole(cluster, &chosen)
    }

    /// Plans the round inside the best domain of `key` within `scope` that holds it
    /// whole, packed by `inner` (a narrower level) within it; `Err` names the best
    /// domain when none does.
    fn fill_required(
        &mut self,
        cluster: &mut Cluster<'_>,
        scope: &[usize],
        key: &str,
        inner: Option<&str>,
        hierarchy: Option<&TopologyHierarchy>,
    ) -> Result<(Fill, TopologyDomain), FilterReason> {
        let need = self.needs();
        let estimates = self.estimate(cluster, key, scope);
        let mut candidates: Vec<(u64, usize, &DomainEstimate)> = estimates
            .iter()
            .filter(|e| e.holds(&need))
            .map(|e| (e.spare(&need), 1, e))
            .collect();
        candidates.sort_by(|a, b| (a.0, &a.2.value).cmp(&(b.0, &b.2.value)));
        // Ties on room to spare go to the domain needing fewest domains of the level
        // below; only the tied best are estimated at that level (each costs a search).
        let tied = candidates
            .iter()
            .take_while(|c| Some(c.0) == candidates.first().map(|f| f.0))
            .count();
        if let (Some(inner), true) = (inner, tied > 1) {
            for candidate in candidates.iter_mut().take(tied) {
                let below = self.estimate(cluster, inner, &candidate.2.nodes);
                let refs: Vec<&DomainEstimate> = below.iter().collect();
                candidate.1 = fewest(&refs, &need).map_or(usize::MAX, |d| d.len());
            }
            candidates[..tied].sort_by(|a, b| (a.1, &a.2.value).cmp(&(b.1, &b.2.value)));
        }
        for (_, _, domain) in candidates {
            let fill = match inner {
                Some(inner) => self.fill_preferred(cluster, &domain.nodes, inner, hierarchy),
                None => self.fill_whole(cluster, &domain.nodes),
            };
            let fill = match fill {
                Some(fill) => Some(fill),
                // Packing by the level below failed where the domain as a whole may not.
                None if inner.is_some() => self.fill_whole(cluster, &domain.nodes),
                None => None,
            };
            if let Some(fill) = fill {
                let domain = TopologyDomain {
                    key: key.to_string(),
                    value: domain.value.clone(),
                };
                return Ok((fill, domain));
            }
        }
        Err(too_small(key, &estimates, &need))
    }

    /// Every member unplaced for `reason`, counted against every node.
    fn refused(&self, cluster: &Cluster<'_>, reason: FilterReason) -> Fill {
        let mut diagnosis = Diagnosis {
            nodes: cluster.len() as u64,
            ..Diagnosis::default()
        };
        diagnosis.record_many(reason, cluster.len() as u64);
        Fill {
            failed: (0..self.members.len())
                .map(|m| (m, diagnosis.clone()))
                .collect(),
            ..Fill::default()
        }
    }
}

/// Places the round (one gang's members) under `constraint`.
pub(super) fn place_constrained(
    round: &mut Round<'_, '_>,
    cluster: &mut Cluster<'_>,
    constraint: &TopologyConstraint,
) -> GangPlacement {
    let hierarchies = &round.searcher.profile.topologies;
    let all: Vec<usize> = (0..cluster.len()).collect();
    let named = |key: &Option<String>| {
        key.as_deref()
            .and_then(|k| hierarchy_of(hierarchies, k).cloned())
    };
    let hierarchy = named(&constraint.preferred).or_else(|| named(&constraint.required));
    let inner: Option<String> = constraint.preferred.clone().or_else(|| {
        let key = constraint.required.as_deref()?;
        hierarchy.as_ref()?.below(key).map(str::to_string)
    });
    if let Some(key) = constraint.required.as_deref() {
        let placed = match &constraint.slice {
            Some(slice) => place_slices_required(round, cluster, key, slice),
            None => round.fill_required(cluster, &all, key, inner.as_deref(), hierarchy.as_ref()),
        };
        return match placed {
            Ok((fill, domain)) => round.result(cluster, fill, Some(domain)),
            Err(reason) => {
                let fill = round.refused(cluster, reason);
                round.result(cluster, fill, None)
            }
        };
    }
    if let Some(slice) = &constraint.slice {
        let fill = match place_slices(round, cluster, &all, &slice.key, slice.size) {
            Ok(fill) => fill,
            Err(reason) => round.refused(cluster, reason),
        };
        return round.result(cluster, fill, None);
    }
    if let Some(key) = constraint.preferred.as_deref() {
        if let Some(fill) = round.fill_preferred(cluster, &all, key, hierarchy.as_ref()) {
            return round.result(cluster, fill, None);
        }
    }
    let fill = round.fill(cluster, Scope::All(cluster.len()));
    round.result(cluster, fill, None)
}

/// Plans the round's slices inside one domain of the required level `key`: the domains
/// that hold the whole gang, best fit first, each tried until every slice fits in one.
fn place_slices_required(
    round: &mut Round<'_, '_>,
    cluster: &mut Cluster<'_>,
    key: &str,
    slice: &TopologySlice,
) -> Result<(Fill, TopologyDomain), FilterReason> {
    let need = round.needs();
    let all: Vec<usize> = (0..cluster.len()).collect();
    let estimates = round.estimate(cluster, key, &all);
    let mut holding: Vec<&DomainEstimate> = estimates.iter().filter(|e| e.holds(&need)).collect();
    holding.sort_by_key(|e| (e.spare(&need), e.value.clone()));
    let mut last = None;
    for domain in holding {
        match place_slices(round, cluster, &domain.nodes, &slice.key, slice.size) {
            Ok(fill) => {
                let domain = TopologyDomain {
                    key: key.to_string(),
                    value: domain.value.clone(),
                };
                return Ok((fill, domain));
            }
            Err(reason) => last = Some(reason),
        }
    }
    if let Some(reason) = last {
        return Err(reason);
    }
    Err(too_small(key, &estimates, &need))
}

/// Why no domain of `key` takes the round: the need and the domain that holds most.
fn too_small(key: &str, estimates: &[DomainEstimate], need: &[u64]) -> FilterReason {
    let best = estimates
        .iter()
        .max_by(|a, b| a.held(need).cmp(&b.held(need)).then(b.value.cmp(&a.value)));
    FilterReason::TopologyDomainTooSmall {
        key: key.to_string(),
        need: need.iter().sum(),
        best: best.map(|b| b.value.clone()),
        holds: best.map_or(0, |b| b.held(need)),
    }
}

/// Plans the round's members in consecutive slices of `size`, each whole inside one
/// domain of `key` within `scope`; plans nothing if one slice finds no domain.
fn place_slices(
    round: &mut Round<'_, '_>,
    cluster: &mut Cluster<'_>,
    scope: &[usize],
    key: &str,
    size: u32,
) -> Result<Fill, FilterReason> {
    let size = usize::try_from(size).unwrap_or(usize::MAX).max(1);
    let mut whole = Fill::default();
    let members = round.members;
    for (k, chunk) in members.chunks(size).enumerate() {
        let offset = k * size;
        let templates = templates(chunk, round.classes, round.searcher.cache.as_deref_mut());
        let mut slice = Round {
            members: chunk,
            classes: round.classes,
            templates: &templates,
            searcher: Searcher {
                own: round.searcher.own,
                profile: round.searcher.profile,
                cache: round.searcher.cache.as_deref_mut(),
                spare: std::mem::take(&mut round.searcher.spare),
            },
            cursor: round.cursor,
        };
        let placed = slice.fill_required(cluster, scope, key, None, None);
        round.cursor = slice.cursor;
        round.searcher.spare = std::mem::take(&mut slice.searcher.spare);
        match placed {
            Ok((fill, _)) => {
                whole
                    .planned
                    .extend(fill.planned.into_iter().map(|(m, n)| (m + offset, n)));
                whole
                    .summaries
                    .extend(fill.summaries.into_iter().map(|(m, s)| (m + offset, s)));
            }
            Err(reason) => {
                rollback(cluster, &whole);
                return Err(reason);
            }
        }
    }
    Ok(whole)
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
