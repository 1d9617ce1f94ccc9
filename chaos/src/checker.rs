//! The invariants of docs/ARCHITECTURE.md §6, checked over a drill's history and the
//! cluster's final state (read after every fault healed and the workload
//! quiesced). Pure: the runner gathers [`FinalState`]; nothing here does I/O.
//!
//! I1 no device with two owners; I2 no node overcommitted; I3 no gang group
//! partly placed, and the ledger holds exactly what placed groups say; I4 every
//! acknowledged submission (and release, cancel) is there, and a group that ended
//! Preempted names a preemptor of higher priority that was placed; I5 no reservation
//! outlives its deadline; I6 replicas' state hashes are equal; I7 every fault is
//! followed by a successful placement within [`RECOVERY_MAX_MS`]; I9 a placed gang with a
//! required topology level has its members on nodes sharing one value of that label.

use std::collections::{BTreeMap, BTreeSet};

use gangway_proto::v1::{GangGroupStatus, NodeInfo};
use serde::Serialize;

use crate::history::{Entry, Event, GangShape};
use crate::workload::{placed_of, TERMINAL};

/// Longest acceptable time from a fault (or its heal) to the next placement.
pub const RECOVERY_MAX_MS: u64 = 30_000;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// I1 .. I7, I9.
    pub invariant: String,
    /// What was seen.
    pub detail: String,
}

fn violation(invariant: &str, detail: String) -> Violation {
    Violation {
        invariant: invariant.to_string(),
        detail,
    }
}

/// One replica's view of one Raft group at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHash {
    /// Group id.
    pub group: u64,
    /// Applied index.
    pub applied: u64,
    /// State hash at that index.
    pub hash: String,
}

/// What the cluster held after the drill.
#[derive(Debug, Clone, Default)]
pub struct FinalState {
    /// Every gang group, finished ones included.
    pub groups: Vec<GangGroupStatus>,
    /// Every node with its ledger entry.
    pub nodes: Vec<NodeInfo>,
    /// Each replica's groups (None: the replica did not answer).
    pub replicas: BTreeMap<u64, Option<Vec<GroupHash>>>,
    /// Problems met while reading it (they are violations too).
    pub unreadable: Vec<Violation>,
}

/// Recovery of one fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovery {
    /// Fault id.
    pub fault: u64,
    /// Kind.
    pub what: String,
    /// Whether the fault took a group leader.
    pub leader_lost: bool,
    /// From the fault (one lost replica) or its heal, to the next placement; None: none seen.
    pub ms: Option<u64>,
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Recovery per fault.
    pub recoveries: Vec<Recovery>,
}

/// Checks every invariant.
pub fn check(history: &[Entry], fin: &FinalState) -> Verdict {
    let mut v = fin.unreadable.clone();
    let ops = Ops::from(history);
    check_devices(fin, &mut v);
    check_capacity(fin, &mut v);
    check_groups(&ops, fin, &mut v);
    check_topology(&ops, fin, &mut v);
    check_acknowledged(&ops, fin, &mut v);
    check_preempted(&ops, fin, &mut v);
    check_refusals(&ops, &mut v);
    check_reservations(fin, &mut v);
    check_hashes(fin, &mut v);
    let recoveries = recoveries(history);
    for r in &recoveries {
        if r.ms.is_none_or(|ms| ms > RECOVERY_MAX_MS) {
            v.push(violation(
                "I7",
                format!(
                    "no placement within {RECOVERY_MAX_MS} ms of fault {} ({})",
                    r.fault, r.what
                ),
            ));
        }
    }
    Verdict {
        violations: v,
        recoveries,
    }
}

/// Operations of the history, by id.
#[derive(Default)]
struct Ops {
    invokes: BTreeMap<u64, (u64, Event)>,
    results: BTreeMap<u64, (u64, Event)>,
}

impl Ops {
    fn from(history: &[Entry]) -> Self {
        let mut ops = Ops::default();
        for e in history {
            match &e.event {
                Event::Invoke { op, .. } => {
                    ops.invokes.insert(*op, (e.t_ms, e.event.clone()));
                }
                Event::Ok { op, .. } | Event::Fail { op, .. } | Event::Unknown { op, .. } => {
                    ops.results.insert(*op, (e.t_ms, e.event.clone()));
                }
                _ => {}
            }
        }
        ops
    }

    /// Gang shapes by idempotency key.
    fn shapes(&self) -> BTreeMap<String, Vec<GangShape>> {
        self.invokes
            .values()
            .filter_map(|(_, e)| match e {
                Event::Invoke { f, key, gangs, .. } if f == "place" => {
                    Some((key.clone(), gangs.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// (op, f, group) of every acknowledged operation on a known group.
    fn acknowledged(&self) -> Vec<(u64, String, u64, String)> {
        let mut out = Vec::new();
        for (op, (_, result)) in &self.results {
            let (Event::Ok { group, state, .. }, Some((_, Event::Invoke { f, .. }))) =
                (result, self.invokes.get(op))
            else {
                continue;
            };
            out.push((*op, f.clone(), *group, state.clone()));
        }
        out
    }

    /// Whether a cancel of group `id` was invoked.
    fn cancelled(&self, id: u64) -> bool {
        self.invokes.values().any(|(_, e)| {
            matches!(e, Event::Invoke { f, key, .. } if f == "cancel" && *key == id.to_string())
        })
    }

    /// Members named by release_members calls, by group (acknowledged or not).
    fn released_members(&self) -> BTreeMap<u64, BTreeSet<String>> {
        let mut out: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for (_, e) in self.invokes.values() {
            if let Event::Invoke {
                f, key, members, ..
            } = e
            {
                if f == "release_members" {
                    if let Ok(id) = key.parse() {
                        out.entry(id).or_default().extend(members.iter().cloned());
                    }
                }
            }
        }
        out
    }
}

fn check_devices(fin: &FinalState, v: &mut Vec<Violation>) {
    for n in &fin.nodes {
        let name = n.node.as_ref().map_or("?", |s| s.name.as_str());
        for d in &n.devices {
            if d.held_by.len() > 1 {
                v.push(violation(
                    "I1",
                    format!(
                        "device {}/{}/{} on {name} has {} owners: {:?}",
                        d.driver,
                        d.pool,
                        d.name,
                        d.held_by.len(),
                        d.held_by
                    ),
                ));
            }
        }
    }
    let mut owners: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for g in fin.groups.iter().filter(|g| holds(&g.state)) {
        for p in placed_of(g) {
            for d in p.devices {
                owners
                    .entry(format!("{}:{d}", p.node))
                    .or_default()
                    .push(g.id);
            }
        }
    }
    for (device, groups) in owners {
        if groups.len() > 1 {
            v.push(violation(
                "I1",
                format!("device {device} is placed for groups {groups:?}"),
            ));
        }
    }
}

/// A Kubernetes quantity in thousandths (cpu "1500m" = 1500, "2" = 2000) or bytes.
pub fn quantity(text: &str) -> Option<u128> {
    let units: [(&str, u128); 9] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("m", 1),
    ];
    for (suffix, mult) in units {
        if let Some(n) = text.strip_suffix(suffix) {
            let n: u128 = n.parse().ok()?;
            return Some(if suffix == "m" { n } else { n * mult * 1000 });
        }
    }
    text.parse::<u128>().ok().map(|n| n * 1000)
}

fn check_capacity(fin: &FinalState, v: &mut Vec<Violation>) {
    for n in &fin.nodes {
        let Some(spec) = &n.node else { continue };
        for (resource, used) in &n.requested {
            let Some(used_q) = quantity(used) else {
                v.push(violation(
                    "I2",
                    format!("{}: requested {resource}={used} cannot be read", spec.name),
                ));
                continue;
            };
            let cap = spec.allocatable.get(resource).and_then(|a| quantity(a));
            match cap {
                Some(cap) if used_q <= cap => {}
                Some(_) => v.push(violation(
                    "I2",
                    format!(
                        "{} is overcommitted: {resource} requested {used}, allocatable {}",
                        spec.name, spec.allocatable[resource]
                    ),
                )),
                None if used_q == 0 => {}
                None => v.push(violation(
                    "I2",
                    format!("{} holds {resource}={used} it does not offer", spec.name),
                )),
            }
        }
    }
}

/// States in which a group holds what its placements say.
fn holds(state: &str) -> bool {
    state == "Placed"
}

/// A live group's placements: a Placed group's, and those a NonStrict group holds
/// while it waits for the rest (Queued).
fn live_placements(g: &GangGroupStatus) -> bool {
    holds(&g.state) || g.state == "Queued"
}

/// Every member a live group lists that the ledger does not hold on that node, and
/// every member two live groups list. Read groups first, then nodes: slots exist
/// before meta lists them. The drill runs this before it cancels what still waits,
/// since a cancel frees what a wrong refusal left behind.
pub fn live_placements_missing(groups: &[GangGroupStatus], nodes: &[NodeInfo]) -> Vec<Violation> {
    let held: BTreeSet<(String, String)> = nodes
        .iter()
        .filter_map(|n| n.node.as_ref().map(|spec| (n, spec)))
        .flat_map(|(n, spec)| {
            n.pod_slots
                .iter()
                .filter(|s| s.state != "Observed")
                .map(|s| (s.member.clone(), spec.name.clone()))
        })
        .collect();
    let mut v = Vec::new();
    let mut owner: BTreeMap<String, u64> = BTreeMap::new();
    for g in groups.iter().filter(|g| live_placements(g)) {
        for p in placed_of(g) {
            if let Some(other) = owner.insert(p.member.clone(), g.id) {
                v.push(violation(
                    "I3",
                    format!("{} is listed by live groups {other} and {}", p.member, g.id),
                ));
            }
            if !held.contains(&(p.member.clone(), p.node.clone())) {
                v.push(violation(
                    "I3",
                    format!(
                        "group {} ({}) lists {} on {}, but the ledger does not hold it",
                        g.id, g.state, p.member, p.node
                    ),
                ));
            }
        }
    }
    v
}

/// Operations that must be refused (hostile probes) and were acknowledged.
///
/// A duplicate gang must be refused only while the group declaring it is live, and a
/// client cannot see the instant its submission took effect: an accepted twin is a
/// violation when its declarer is known to have been live after the twin's answer
/// ([`declarer_live_after`]), since a group that ended stays ended (ARCHITECTURE I4).
fn check_refusals(ops: &Ops, v: &mut Vec<Violation>) {
    for (op, (answered_ms, result)) in &ops.results {
        let Some((_, Event::Invoke { f, key, gangs, .. })) = ops.invokes.get(op) else {
            continue;
        };
        if !crate::hostile::MUST_FAIL.contains(&f.as_str()) {
            continue;
        }
        let Event::Ok { state, group, .. } = result else {
            continue;
        };
        let mut detail = format!(
            "{f} {key:?} (operation {op}) must be refused, but was accepted: group {group}, {state}"
        );
        if f == crate::hostile::F_PLACE_DUPLICATE_GANG {
            match declarer_live_after(ops, gangs, *answered_ms) {
                Some(live) => detail.push_str(&format!(
                    "; the declaring group {} was live after it: operation {} ({}) at {} ms answered {}",
                    live.group, live.op, live.f, live.at_ms, live.state
                )),
                // The declarer may have ended (preempted, timed out) before the twin
                // took effect: accepting it was right.
                None => continue,
            }
        }
        let invariant = if f == crate::hostile::F_RAFT_AS_CLIENT {
            "I3"
        } else {
            "I4"
        };
        v.push(violation(invariant, detail));
    }
}

/// An operation that found a group live.
struct LiveSighting {
    group: u64,
    op: u64,
    f: String,
    at_ms: u64,
    state: String,
}

/// An operation invoked after `after_ms` on a group that declared one of `gangs`
/// (acknowledged placements) that found it live: it answered a state that is not an
/// end, or it is the group's first release or cancel and answered the end it makes
/// (so the group was live when it took effect).
fn declarer_live_after(ops: &Ops, gangs: &[GangShape], after_ms: u64) -> Option<LiveSighting> {
    let names: BTreeSet<&str> = gangs.iter().map(|g| g.name.as_str()).collect();
    let shapes = ops.shapes();
    let declarers: BTreeSet<u64> = ops
        .acknowledged()
        .into_iter()
        .filter(|(op, f, _, _)| {
            f == "place"
                && ops.invokes.get(op).is_some_and(|(_, e)| {
                    matches!(e, Event::Invoke { key, .. }
                        if shapes.get(key).is_some_and(|gs| gs.iter().any(|g| names.contains(g.name.as_str()))))
                })
        })
        .map(|(_, _, group, _)| group)
        .collect();
    for group in declarers {
        let id = group.to_string();
        let on_group = |e: &Event| matches!(e, Event::Invoke { key, .. } if *key == id);
        let first_end_call = ops
            .invokes
            .values()
            .filter(|(_, e)| on_group(e))
            .filter_map(|(t, e)| match e {
                Event::Invoke { f, .. } if f == "release" || f == "cancel" => Some(*t),
                _ => None,
            })
            .min();
        for (op, (t, invoke)) in &ops.invokes {
            let Event::Invoke { f, .. } = invoke else {
                continue;
            };
            if *t <= after_ms || !on_group(invoke) {
                continue;
            }
            let Some((_, Event::Ok { state, .. })) = ops.results.get(op) else {
                continue;
            };
            let ended_it = first_end_call == Some(*t)
                && matches!(
                    (f.as_str(), state.as_str()),
                    ("release", "Released") | ("cancel", "Cancelled")
                );
            if !TERMINAL.contains(&state.as_str()) || ended_it {
                return Some(LiveSighting {
                    group,
                    op: *op,
                    f: f.clone(),
                    at_ms: *t,
                    state: state.clone(),
                });
            }
        }
    }
    None
}

/// I9: the members of a gang with a required level were placed on nodes of one domain,
/// in every placement the history answered and in the final state's groups.
fn check_topology(ops: &Ops, fin: &FinalState, v: &mut Vec<Violation>) {
    let labels: BTreeMap<&str, &std::collections::HashMap<String, String>> = fin
        .nodes
        .iter()
        .filter_map(|n| n.node.as_ref().map(|s| (s.name.as_str(), &s.labels)))
        .collect();
    let mut seen: Vec<(String, &[GangShape], Vec<crate::history::Placed>)> = Vec::new();
    for (op, (_, result)) in &ops.results {
        let (Some((_, Event::Invoke { f, gangs, .. })), Event::Ok { group, placed, .. }) =
            (ops.invokes.get(op), result)
        else {
            continue;
        };
        if f == "place" && !placed.is_empty() {
            seen.push((format!("group {group} (op {op})"), gangs, placed.clone()));
        }
    }
    let shapes = ops.shapes();
    for g in fin.groups.iter().filter(|g| !g.placements.is_empty()) {
        if let Some(gangs) = shapes.get(&g.idempotency_key) {
            let what = format!("group {} ({} at the end)", g.id, g.state);
            seen.push((what, gangs.as_slice(), placed_of(g)));
        }
    }
    for (what, gangs, placed) in seen {
        for gang in gangs {
            let Some(key) = &gang.required else { continue };
            let prefix = format!("{}/", gang.name);
            let domains: BTreeSet<Option<&String>> = placed
                .iter()
                .filter(|p| p.member.starts_with(&prefix))
                .map(|p| labels.get(p.node.as_str()).and_then(|l| l.get(key)))
                .collect();
            if domains.len() > 1 {
                v.push(violation(
                    "I9",
                    format!(
                        "{what}: gang {} (required {key}) spread over {domains:?}",
                        gang.name
                    ),
                ));
            }
        }
    }
}

fn check_groups(ops: &Ops, fin: &FinalState, v: &mut Vec<Violation>) {
    let shapes = ops.shapes();
    let released = ops.released_members();
    let mut placed: BTreeSet<(String, String)> = BTreeSet::new();
    for g in &fin.groups {
        if !holds(&g.state) && !TERMINAL.contains(&g.state.as_str()) && g.state != "Queued" {
            v.push(violation(
                "I3",
                format!(
                    "group {} ({}) is still {} after the drill quiesced",
                    g.id, g.name, g.state
                ),
            ));
        }
        // A finished group keeps its last placements as a record; the ledger
        // comparison below shows whether anything is still held for it.
        if !live_placements(g) {
            continue;
        }
        let members = placed_of(g);
        for p in &members {
            placed.insert((p.member.clone(), p.node.clone()));
        }
        if !holds(&g.state) {
            continue;
        }
        let Some(gangs) = shapes.get(&g.idempotency_key) else {
            continue;
        };
        let gone = released.get(&g.id).cloned().unwrap_or_default();
        for gang in gangs {
            let prefix = format!("{}/", gang.name);
            let here = members
                .iter()
                .filter(|p| p.member.starts_with(&prefix))
                .count() as u32;
            let left = gone.iter().filter(|m| m.starts_with(&prefix)).count() as u32;
            if here + left < gang.min_member {
                v.push(violation(
                    "I3",
                    format!(
                        "group {} is Placed with {here} of gang {}'s members (min {}, {left} released)",
                        g.id, gang.name, gang.min_member
                    ),
                ));
            }
        }
    }
    let mut held: BTreeSet<(String, String)> = BTreeSet::new();
    for n in &fin.nodes {
        let Some(spec) = &n.node else { continue };
        for slot in n.pod_slots.iter().filter(|s| s.state != "Observed") {
            held.insert((slot.member.clone(), spec.name.clone()));
        }
    }
    for (member, node) in held.difference(&placed) {
        v.push(violation(
            "I3",
            format!("the ledger holds {member} on {node}, but no placed group has it there"),
        ));
    }
    for (member, node) in placed.difference(&held) {
        v.push(violation(
            "I3",
            format!("a placed group has {member} on {node}, but the ledger does not hold it"),
        ));
    }
}

fn check_acknowledged(ops: &Ops, fin: &FinalState, v: &mut Vec<Violation>) {
    let by_id: BTreeMap<u64, &GangGroupStatus> = fin.groups.iter().map(|g| (g.id, g)).collect();
    let mut ids_by_key: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for g in &fin.groups {
        ids_by_key
            .entry(&g.idempotency_key)
            .or_default()
            .insert(g.id);
    }
    for (key, ids) in &ids_by_key {
        if ids.len() > 1 {
            v.push(violation(
                "I4",
                format!("idempotency key {key:?} made {} groups: {ids:?}", ids.len()),
            ));
        }
    }
    let keys = ops.shapes();
    for (op, f, group, answered) in ops.acknowledged() {
        if group == 0 {
            // Pods bound through Kubernetes: the client never learns a group id;
            // `check_kube` covers them.
            continue;
        }
        let Some(g) = by_id.get(&group) else {
            v.push(violation(
                "I4",
                format!("operation {op} ({f}) was acknowledged for group {group}, which is gone"),
            ));
            continue;
        };
        match f.as_str() {
            "place" => {
                let key_known = ops.invokes.get(&op).is_some_and(
                    |(_, e)| matches!(e, Event::Invoke { key, .. } if *key == g.idempotency_key),
                );
                if !key_known || !keys.contains_key(&g.idempotency_key) {
                    v.push(violation(
                        "I4",
                        format!(
                            "placement {op} was acknowledged as group {group}, whose key is {:?}",
                            g.idempotency_key
                        ),
                    ));
                }
            }
            // A release or cancel of a group that had already ended (timed out, say)
            // answers its final state and changes nothing.
            "release" | "cancel"
                if TERMINAL.contains(&answered.as_str()) && g.state == answered => {}
            // A release of a group already cancelled (or cancelled meanwhile) leaves it so.
            "release" if g.state != "Released" && !ops.cancelled(group) => v.push(violation(
                "I4",
                format!(
                    "release {op} of group {group} was acknowledged, but it is {}",
                    g.state
                ),
            )),
            "cancel" if !matches!(g.state.as_str(), "Cancelled" | "Released") => v.push(violation(
                "I4",
                format!(
                    "cancel {op} of group {group} was acknowledged, but it is {}",
                    g.state
                ),
            )),
            _ => {}
        }
    }
}

/// The preemptor a Preempted group's reason names ("preempted by gang group N (...)").
pub fn preemptor_of(reason: &str) -> Option<u64> {
    let rest = reason.strip_prefix("preempted by gang group ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Every group that ended Preempted names a preemptor that exists, was submitted at a
/// higher priority, and was placed (it is not left waiting or timed out).
fn check_preempted(ops: &Ops, fin: &FinalState, v: &mut Vec<Violation>) {
    let shapes = ops.shapes();
    // Kubernetes gangs are submitted by gangway's ingest under keys of its own: their
    // priority is found by gang name.
    let by_gang: BTreeMap<&str, i32> = shapes
        .values()
        .flatten()
        .map(|x| (x.name.as_str(), x.priority))
        .collect();
    let by_id: BTreeMap<u64, &GangGroupStatus> = fin.groups.iter().map(|g| (g.id, g)).collect();
    let priority = |g: &GangGroupStatus| {
        shapes
            .get(&g.idempotency_key)
            .and_then(|gangs| gangs.iter().map(|x| x.priority).max())
            .or_else(|| {
                g.gangs
                    .iter()
                    .filter_map(|name| by_gang.get(name.as_str()).copied())
                    .max()
            })
            .unwrap_or(0)
    };
    for g in fin.groups.iter().filter(|g| g.state == "Preempted") {
        let Some(by) = preemptor_of(&g.reason).and_then(|id| by_id.get(&id)) else {
            v.push(violation(
                "I4",
                format!(
                    "group {} ended Preempted, naming no preemptor that exists: {:?}",
                    g.id, g.reason
                ),
            ));
            continue;
        };
        if priority(by) <= priority(g) {
            v.push(violation(
                "I4",
                format!(
                    "group {} (priority {}) was preempted by group {} of priority {}",
                    g.id,
                    priority(g),
                    by.id,
                    priority(by)
                ),
            ));
        }
        if matches!(by.state.as_str(), "Queued" | "Placing" | "TimedOut") {
            v.push(violation(
                "I4",
                format!(
                    "group {} was preempted by group {}, which is {} (never placed)",
                    g.id, by.id, by.state
                ),
            ));
        }
    }
}

fn check_reservations(fin: &FinalState, v: &mut Vec<Violation>) {
    for n in &fin.nodes {
        let Some(spec) = &n.node else { continue };
        for slot in n.pod_slots.iter().filter(|s| s.state == "Reserved") {
            v.push(violation(
                "I5",
                format!(
                    "{} on {} is still reserved by transaction {} after its deadline",
                    slot.member, spec.name, slot.txn
                ),
            ));
        }
    }
}

fn check_hashes(fin: &FinalState, v: &mut Vec<Violation>) {
    let mut seen: BTreeMap<u64, BTreeMap<(u64, String), Vec<u64>>> = BTreeMap::new();
    for (id, groups) in &fin.replicas {
        let Some(groups) = groups else {
            v.push(violation(
                "I6",
                format!("replica {id} did not report its state hash"),
            ));
            continue;
        };
        for g in groups {
            seen.entry(g.group)
                .or_default()
                .entry((g.applied, g.hash.clone()))
                .or_default()
                .push(*id);
        }
    }
    for (group, states) in seen {
        if states.len() > 1 {
            let detail: Vec<String> = states
                .iter()
                .map(|((applied, hash), ids)| {
                    format!(
                        "replicas {ids:?} at {applied}: {}",
                        &hash[..hash.len().min(12)]
                    )
                })
                .collect();
            v.push(violation(
                "I6",
                format!(
                    "group {group} differs between replicas: {}",
                    detail.join("; ")
                ),
            ));
        }
    }
}

/// The binder drill's checks over what the API server shows: no pod bound
/// twice, no gang partly bound, and every bound pod held as Bound by the ledger
/// on the node it is bound to.
pub fn check_kube(view: &crate::kube_workload::ApiView, fin: &FinalState) -> Vec<Violation> {
    let mut v = Vec::new();
    for (pod, nodes) in &view.bindings {
        if nodes.len() > 1 {
            v.push(violation(
                "I3",
                format!("pod {pod} was bound {} times: {nodes:?}", nodes.len()),
            ));
        }
    }
    for (node, revision, cpu) in view.over_capacity() {
        v.push(violation(
            "I2",
            format!(
                "node {node} held pods requesting {cpu} CPUs of {} at API revision {revision} (a pod bound before the one it replaced was gone)",
                crate::kube_workload::KUBE_NODE_CPUS
            ),
        ));
    }
    for (gang, bound, pods) in view.partly_bound() {
        v.push(violation(
            "I3",
            format!("gang {gang} is partly bound: {bound} of {pods} pods"),
        ));
    }
    let mut slots: BTreeMap<String, (String, String)> = BTreeMap::new();
    for n in &fin.nodes {
        let Some(spec) = &n.node else { continue };
        for s in &n.pod_slots {
            slots.insert(s.member.clone(), (spec.name.clone(), s.state.clone()));
        }
    }
    for (pod, (gang, node)) in &view.pods {
        let Some(node) = node else { continue };
        let member = format!("{}/{gang}/{pod}", crate::kube_workload::KUBE_NAMESPACE);
        match slots.get(&member) {
            Some((n, state)) if n == node && state == "Bound" => {}
            Some((n, state)) => v.push(violation(
                "I3",
                format!("pod {pod} is bound to {node}, but the ledger has it {state} on {n}"),
            )),
            None => v.push(violation(
                "I3",
                format!("pod {pod} is bound to {node}, but the ledger does not hold it"),
            )),
        }
    }
    v
}

/// Recovery of every fault: from the fault (one replica lost) or its heal to
/// the first acknowledged placement invoked after that point.
pub fn recoveries(history: &[Entry]) -> Vec<Recovery> {
    let mut faults: BTreeMap<u64, (u64, String, bool, bool)> = BTreeMap::new();
    let mut heals: BTreeMap<u64, u64> = BTreeMap::new();
    for e in history {
        match &e.event {
            Event::Fault {
                fault,
                what,
                led,
                single_replica,
                ..
            } => {
                faults.insert(
                    *fault,
                    (e.t_ms, what.clone(), !led.is_empty(), *single_replica),
                );
            }
            Event::Heal { fault } => {
                heals.insert(*fault, e.t_ms);
            }
            _ => {}
        }
    }
    let placed = placements(history);
    faults
        .into_iter()
        .map(|(fault, (at, what, leader_lost, single))| {
            let from = if single {
                at
            } else {
                heals.get(&fault).copied().unwrap_or(at)
            };
            let ms = first_placement_after(&placed, from).map(|t1| t1 - from);
            Recovery {
                fault,
                what,
                leader_lost,
                ms,
            }
        })
        .collect()
}

/// (invoked, acknowledged) times of every acknowledged placement, in history order.
pub fn placements(history: &[Entry]) -> Vec<(u64, u64)> {
    let mut invoked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut placed = Vec::new();
    for e in history {
        match &e.event {
            Event::Invoke { op, f, .. } if f == "place" => {
                invoked.insert(*op, e.t_ms);
            }
            Event::Ok { op, state, .. } if state == "Placed" => {
                if let Some(t0) = invoked.get(op) {
                    placed.push((*t0, e.t_ms));
                }
            }
            _ => {}
        }
    }
    placed
}

/// When the first placement invoked at or after `from` was acknowledged.
pub fn first_placement_after(placed: &[(u64, u64)], from: u64) -> Option<u64> {
    placed
        .iter()
        .filter(|(t0, _)| *t0 >= from)
        .map(|(_, t1)| *t1)
        .min()
}

/// The p-th percentile (0..=100) of `values` (nearest rank), None when empty.
pub fn percentile(values: &[u64], p: u64) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p as usize * sorted.len()).div_ceil(100)).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
