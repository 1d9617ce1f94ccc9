//! The web view's HTML: pure functions from the views `read` builds (and the time
//! `now_ms`, passed in) to markup. maud escapes every value, so names and reasons
//! from clients cannot inject markup. Each panel is a fragment the page embeds at
//! first render and the browser fetches again when its event arrives; ids and
//! `data-*` attributes here are what the page script and the browser test look for.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gangway_proto::admin::{GroupStatus, QueueStatus as ApiQueueStatus};
use gangway_proto::v1::{GangGroupStatus, NodeInfo};
use maud::{html, Markup, DOCTYPE};

use super::read::{ClusterView, FleetView, QueuesView, TxnsView};
use gangway_core::ledger::meta::Decision;
use gangway_core::model::quantity::parse_nano;

/// Rows a gangs section shows before it says how many more there are.
pub const UI_ROWS_MAX: usize = 200;

/// A page of the web view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Replicas and Raft groups.
    Cluster,
    /// Nodes and devices.
    Fleet,
    /// Gang groups.
    Gangs,
    /// Queues.
    Queues,
    /// Reservations and decisions.
    Txns,
}

impl Page {
    const ALL: [Page; 5] = [
        Page::Cluster,
        Page::Fleet,
        Page::Gangs,
        Page::Queues,
        Page::Txns,
    ];

    fn path(self) -> &'static str {
        match self {
            Page::Cluster => "/ui",
            Page::Fleet => "/ui/fleet",
            Page::Gangs => "/ui/gangs",
            Page::Queues => "/ui/queues",
            Page::Txns => "/ui/txns",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Page::Cluster => "Cluster",
            Page::Fleet => "Fleet",
            Page::Gangs => "Gangs",
            Page::Queues => "Queues",
            Page::Txns => "Transactions",
        }
    }
}

/// A whole page: header, tabs and `panels` (each a live fragment).
pub fn page(page: Page, replica: u64, panels: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "gangway · " (page.title()) }
                link rel="stylesheet" href="/ui/assets/ui.css";
                script src="/ui/assets/htmx.min.js" {}
                script src="/ui/assets/htmx-ext-sse.min.js" {}
                script src="/ui/assets/ui.js" {}
            }
            body hx-ext="sse" sse-connect="/ui/events" data-page=(page.title()) {
                header {
                    span.brand { "gangway" }
                    nav {
                        @for p in Page::ALL {
                            a href=(p.path()) class=[(p == page).then_some("on")] { (p.title()) }
                        }
                    }
                    span.replica { "replica " (replica) }
                    span #live title="live updates" {}
                }
                main { (panels) }
            }
        }
    }
}

/// A panel wrapper: refreshed from `source` whenever event `event` arrives.
pub fn live(id: &str, event: &str, source: &str, include: Option<&str>, body: Markup) -> Markup {
    html! {
        section id=(id) hx-get=(source) hx-trigger={ "sse:" (event) } hx-swap="innerHTML"
            hx-include=[include] {
            (body)
        }
    }
}

/// A panel that could not be read.
pub fn unreadable(what: &str, why: &str) -> Markup {
    html! { p.error { "cannot read " (what) ": " (why) } }
}

fn ago(now_ms: u64, then_ms: u64) -> String {
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

fn group_name(id: u64) -> String {
    if id == 0 {
        "meta".into()
    } else {
        format!("shard {id}")
    }
}

/// The cluster panel: members with health and readiness, then every Raft group with
/// its leader, term, commit index and each member's lag behind the leader.
pub fn cluster(view: &ClusterView) -> Markup {
    let answered: BTreeMap<u64, &gangway_proto::admin::StatusReply> = view
        .members
        .iter()
        .filter_map(|m| m.status.as_ref().ok().map(|s| (m.id, s)))
        .collect();
    let group_ids: BTreeSet<u64> = answered
        .values()
        .flat_map(|s| s.groups.iter().map(|g| g.group_id))
        .collect();
    html! {
        h2 { "Replicas" }
        table.members {
            tr { th { "replica" } th { "address" } th { "health" } th { "ready" } th { "leads" } }
            @for m in &view.members {
                tr data-replica=(m.id) {
                    td { (m.id) @if m.id == view.this { " (this one)" } }
                    td { (m.addr) }
                    @match &m.status {
                        Ok(s) => {
                            td.ok { "up" }
                            @let missing: Vec<String> = s.groups.iter()
                                .filter(|g| g.leader == 0 || g.role == "shutdown")
                                .map(|g| group_name(g.group_id)).collect();
                            @if missing.is_empty() { td.ok { "ready" } }
                            @else { td.warn { "no leader known for " (missing.join(", ")) } }
                            @let leads = s.groups.iter().filter(|g| g.role == "leader").count();
                            td { (leads) @if leads == 1 { " group" } @else { " groups" } }
                        }
                        Err(e) => { td.bad colspan="3" { "unreachable: " (e) } }
                    }
                }
            }
        }
        h2 { "Raft groups" }
        table.groups {
            tr {
                th { "group" } th { "leader" } th { "term" } th { "commit index" }
                @for m in &view.members { th { "lag of " (m.id) } }
            }
            @for gid in &group_ids {
                @let leader = leader_status(&answered, *gid);
                tr data-group=(gid) data-leader=(leader.map_or(0, |(id, _)| id)) {
                    td { (group_name(*gid)) }
                    @match leader {
                        Some((id, g)) => {
                            td.leader { "replica " (id) }
                            td { (g.term) }
                            td { (g.committed_index) }
                            @for m in &view.members {
                                td { (lag_text(g, m.id)) }
                            }
                        }
                        None => {
                            td.warn { "none (election)" }
                            td { (max_term(&answered, *gid)) }
                            td { "–" }
                            @for _m in &view.members { td { "–" } }
                        }
                    }
                }
            }
        }
    }
}

/// The status a group's leader gives of it, if the leader answered.
fn leader_status<'a>(
    answered: &BTreeMap<u64, &'a gangway_proto::admin::StatusReply>,
    group: u64,
) -> Option<(u64, &'a GroupStatus)> {
    answered.iter().find_map(|(id, s)| {
        s.groups
            .iter()
            .find(|g| g.group_id == group && g.role == "leader")
            .map(|g| (*id, g))
    })
}

fn max_term(answered: &BTreeMap<u64, &gangway_proto::admin::StatusReply>, group: u64) -> u64 {
    answered
        .values()
        .flat_map(|s| s.groups.iter())
        .filter(|g| g.group_id == group)
        .map(|g| g.term)
        .max()
        .unwrap_or(0)
}

fn lag_text(leader: &GroupStatus, member: u64) -> String {
    match leader.matched.get(&member) {
        Some(0) => "nothing yet".into(),
        Some(next) => {
            let lag = (leader.last_log_index + 1).saturating_sub(*next);
            match lag {
                0 => "0".into(),
                1 => "1 entry".into(),
                _ => format!("{lag} entries"),
            }
        }
        None if leader.voters.contains(&member) => "unknown".into(),
        None => "not a member".into(),
    }
}

/// Used and total of a node's GPU-like resource: published devices, or else the
/// counted extended resources (names with a `/`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Devices (or units) in all.
    pub total: u64,
    /// Held by a member.
    pub held: u64,
    /// Reported unhealthy.
    pub unhealthy: u64,
}

/// What a node offers and holds of devices.
pub fn device_counts(node: &NodeInfo) -> DeviceCounts {
    if !node.devices.is_empty() {
        return DeviceCounts {
            total: node.devices.len() as u64,
            held: node
                .devices
                .iter()
                .filter(|d| !d.held_by.is_empty())
                .count() as u64,
            unhealthy: node.devices.iter().filter(|d| d.unhealthy).count() as u64,
        };
    }
    let Some(spec) = &node.node else {
        return DeviceCounts::default();
    };
    let mut counts = DeviceCounts::default();
    for (name, amount) in &spec.allocatable {
        if name.contains('/') && !name.starts_with("hugepages") {
            counts.total += units(amount);
            counts.held += node.requested.get(name).map_or(0, |q| units(q));
        }
    }
    counts
}

fn units(q: &str) -> u64 {
    parse_nano(q).map_or(0, |n| (n.max(0) / 1_000_000_000) as u64)
}

fn amount(q: &str) -> f64 {
    parse_nano(q).map_or(0.0, |n| n as f64 / 1e9)
}

/// Fraction of `resource` the node's pods request (0 when it has none).
fn used_fraction(node: &NodeInfo, resource: &str) -> f64 {
    let total = node
        .node
        .as_ref()
        .and_then(|s| s.allocatable.get(resource))
        .map_or(0.0, |q| amount(q));
    let used = node.requested.get(resource).map_or(0.0, |q| amount(q));
    if total <= 0.0 {
        0.0
    } else {
        (used / total).clamp(0.0, 1.0)
    }
}

/// The heat of a node's cell: 0 (all free) to 4 (all held), by devices when it has
/// them, else by cpu.
fn heat(node: &NodeInfo, devices: DeviceCounts) -> u8 {
    let fraction = if devices.total > 0 {
        devices.held as f64 / devices.total as f64
    } else {
        used_fraction(node, "cpu")
    };
    match fraction {
        f if f <= 0.0 => 0,
        f if f < 0.34 => 1,
        f if f < 0.67 => 2,
        f if f < 1.0 => 3,
        _ => 4,
    }
}

fn is_fenced(node: &NodeInfo) -> bool {
    node.node.as_ref().is_some_and(|s| {
        s.unschedulable
            || s.not_ready
            || s.taints
                .iter()
                .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    })
}

/// The fleet panel: a summary line, then per shard and topology domain (the hierarchy's
/// domains above the host, widest first, "b0 › b0-r03"; else the topology label's) a
/// grid of node cells coloured by how much of their devices (or cpu) is held.
pub fn fleet(view: &FleetView, leaders: &BTreeMap<u64, u64>) -> Markup {
    let mut by_shard: BTreeMap<u32, BTreeMap<String, Vec<&NodeInfo>>> = BTreeMap::new();
    let mut totals = DeviceCounts::default();
    let mut fenced = 0usize;
    for node in &view.nodes {
        let domain = domain_of(view, node);
        by_shard
            .entry(node.shard)
            .or_default()
            .entry(domain)
            .or_default()
            .push(node);
        let c = device_counts(node);
        totals.total += c.total;
        totals.held += c.held;
        totals.unhealthy += c.unhealthy;
        fenced += usize::from(is_fenced(node));
    }
    html! {
        p.summary #fleet-summary data-nodes=(view.nodes.len()) {
            (view.nodes.len()) " nodes on " (view.shards) " shards · devices: "
            b { (totals.total.saturating_sub(totals.held)) } " free, "
            b { (totals.held) } " held, "
            b { (totals.unhealthy) } " unhealthy · "
            (fenced) " nodes tainted, cordoned or not ready"
        }
        p.legend {
            span.cell.h0 {} " free " span.cell.h2 {} " partly held " span.cell.h4 {} " all held "
            span.cell.h0.u {} " unhealthy device " span.cell.h0.x {} " tainted or not ready"
        }
        @for (shard, reason) in &view.unreadable {
            p.error { "shard " (shard) " cannot be read: " (reason) }
        }
        @for shard in 1..=view.shards {
            @let domains = by_shard.get(&shard);
            div.shard data-shard=(shard) {
                h3 {
                    "shard " (shard) " · "
                    (domains.map_or(0, |d| d.values().map(Vec::len).sum::<usize>())) " nodes · leader "
                    @match leaders.get(&u64::from(shard)) {
                        Some(l) => { "replica " (l) }
                        None => { "unknown" }
                    }
                }
                @if let Some(domains) = domains {
                    @for (domain, nodes) in domains {
                        div.domain {
                            span.dname { (domain) }
                            div.grid {
                                @for node in nodes { (cell(node)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A node's row in the fleet grid: its domain at each hierarchy level, else its
/// topology label's value.
fn domain_of(view: &FleetView, node: &NodeInfo) -> String {
    let labels = node.node.as_ref().map(|n| &n.labels);
    let value = |key: &String| labels.and_then(|l| l.get(key)).cloned();
    if !view.topology_levels.is_empty() {
        let path: Vec<String> = view
            .topology_levels
            .iter()
            .map(|k| value(k).unwrap_or_else(|| "-".into()))
            .collect();
        return path.join(" › ");
    }
    view.topology_label
        .as_ref()
        .and_then(value)
        .unwrap_or_else(|| "(no domain)".into())
}

fn cell(node: &NodeInfo) -> Markup {
    let name = node.node.as_ref().map_or("", |s| s.name.as_str());
    let c = device_counts(node);
    let class = format!(
        "cell h{}{}{}",
        heat(node, c),
        if c.unhealthy > 0 { " u" } else { "" },
        if is_fenced(node) { " x" } else { "" }
    );
    html! {
        i class=(class) data-n=(name)
            title={ (name) " · devices " (c.held) "/" (c.total) " held · cpu " (percent(used_fraction(node, "cpu"))) } {}
    }
}

fn percent(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// One node: resources, devices with holders, pods, agent link and lease.
pub fn node(node: Option<&NodeInfo>, name: &str, now_ms: u64) -> Markup {
    let Some(n) = node else {
        return html! { p.error { "node " (name) " is not registered" } };
    };
    let spec = n.node.clone().unwrap_or_default();
    let resources: BTreeSet<&String> = spec.allocatable.keys().chain(n.requested.keys()).collect();
    html! {
        div #node-detail data-node=(spec.name) hx-get={ "/ui/panel/node?name=" (spec.name) }
            hx-trigger="sse:fleet" hx-swap="outerHTML" {
            h3 { (spec.name) " · shard " (n.shard) }
            p {
                @if spec.unschedulable { span.warn { "cordoned " } }
                @if spec.not_ready { span.warn { "not ready " } }
                "lease: "
                @if n.lease_until_ms == 0 { "no heartbeat yet" }
                @else if n.lease_until_ms > now_ms { "renewed, lapses in " (ago(n.lease_until_ms, now_ms)) }
                @else { span.warn { "lapsed " (ago(now_ms, n.lease_until_ms)) " ago" } }
                @if !n.agent.is_empty() { " · device agent: " (n.agent) }
            }
            @if !spec.taints.is_empty() {
                p { "taints: "
                    @for t in &spec.taints { code { (t.key) "=" (t.value) ":" (t.effect) } " " }
                }
            }
            p.labels {
                @for (k, v) in &spec.labels { code { (k) "=" (v) } " " }
            }
            table {
                tr { th { "resource" } th { "requested" } th { "allocatable" } }
                @for r in resources {
                    tr { td { (r) } td { (n.requested.get(r).map_or("0", String::as_str)) }
                         td { (spec.allocatable.get(r).map_or("–", String::as_str)) } }
                }
            }
            @if !n.devices.is_empty() {
                table.devices {
                    tr { th { "device" } th { "health" } th { "held by" } }
                    @for d in &n.devices {
                        tr {
                            td { (d.driver) "/" (d.pool) "/" (d.name) }
                            td class=(if d.unhealthy { "bad" } else { "ok" }) {
                                @if d.unhealthy { "unhealthy" } @else { "healthy" }
                                @if d.withdrawn { " (withdrawn)" }
                            }
                            td { (d.held_by.join(", ")) }
                        }
                    }
                }
            }
            table.pods {
                tr { th { "pod (namespace/gang/member)" } th { "state" } th { "transaction" } }
                @for p in &n.pod_slots {
                    tr { td { (p.member) } td { (p.state) } td { (p.txn) } }
                }
                @if n.pod_slots.is_empty() { tr { td colspan="3" { "no pods" } } }
            }
        }
    }
}

/// Filters of the gangs panel.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct GangFilter {
    /// Only groups with a gang in this namespace (empty: all).
    #[serde(default)]
    pub namespace: String,
    /// Only groups of this queue (empty: all).
    #[serde(default)]
    pub queue: String,
}

impl GangFilter {
    fn keeps(&self, g: &GangGroupStatus) -> bool {
        (self.queue.is_empty() || g.queue == self.queue)
            && (self.namespace.is_empty()
                || g.gangs.iter().any(|gang| {
                    gang.split_once('/')
                        .is_some_and(|(ns, _)| ns == self.namespace)
                }))
    }
}

fn is_waiting(state: &str) -> bool {
    matches!(state, "Queued" | "Placing" | "Preempting")
}

fn is_holding(state: &str) -> bool {
    matches!(state, "Placed" | "Releasing")
}

/// The gangs panel: a filter, then waiting groups in queue order with why they wait,
/// placed groups (newest first) with members → nodes → devices, and ended ones, newest
/// first.
pub fn gangs(groups: &[GangGroupStatus], filter: &GangFilter, now_ms: u64) -> Markup {
    let namespaces: BTreeSet<&str> = groups
        .iter()
        .flat_map(|g| {
            g.gangs
                .iter()
                .filter_map(|n| n.split_once('/').map(|(ns, _)| ns))
        })
        .collect();
    let queues: BTreeSet<&str> = groups
        .iter()
        .map(|g| g.queue.as_str())
        .filter(|q| !q.is_empty())
        .collect();
    let kept: Vec<&GangGroupStatus> = groups.iter().filter(|g| filter.keeps(g)).collect();
    let waiting: Vec<&&GangGroupStatus> = kept.iter().filter(|g| is_waiting(&g.state)).collect();
    // The read is in queue order (priority first); these two lists go by submission,
    // newest first.
    let mut holding: Vec<&&GangGroupStatus> =
        kept.iter().filter(|g| is_holding(&g.state)).collect();
    holding.sort_by_key(|g| std::cmp::Reverse(g.id));
    let mut ended: Vec<&&GangGroupStatus> = kept
        .iter()
        .filter(|g| !is_waiting(&g.state) && !is_holding(&g.state))
        .collect();
    ended.sort_by_key(|g| std::cmp::Reverse(g.id));
    html! {
        form #gang-filter hx-get="/ui/panel/gangs" hx-target="#p-gangs" hx-trigger="change" {
            label { "namespace "
                select name="namespace" {
                    option value="" { "all" }
                    @for ns in &namespaces { option value=(ns) selected[filter.namespace == *ns] { (ns) } }
                }
            }
            label { " queue "
                select name="queue" {
                    option value="" { "all" }
                    @for q in &queues { option value=(q) selected[filter.queue == *q] { (q) } }
                }
            }
            span.counts { " " (waiting.len()) " waiting · " (holding.len()) " placed · " (ended.len()) " ended" }
        }
        h2 { "Waiting, in queue order" }
        table #waiting {
            tr { th { "#" } th { "group" } th { "gangs" } th { "members" } th { "queue" } th { "state" }
                 th { "attempts" } th { "waiting for" } th { "why it waits" } }
            @for (i, g) in waiting.iter().take(UI_ROWS_MAX).enumerate() {
                tr data-group=(g.id) data-name=(g.name) data-state=(g.state) {
                    td { (i + 1) } td { (g.id) " " b { (g.name) } } td { (g.gangs.join(", ")) }
                    td { (g.members) } td { (g.queue) } td { (g.state) } td { (g.attempts) }
                    td { (ago(now_ms, g.submitted_at_ms)) }
                    td.reason { (waiting_reason(g)) }
                }
            }
        }
        (more(waiting.len()))
        h2 { "Placed, newest first" }
        table #placed {
            tr { th { "group" } th { "gangs" } th { "queue" } th { "state" } th { "members → nodes → devices" } }
            @for g in holding.iter().take(UI_ROWS_MAX) {
                tr data-group=(g.id) data-name=(g.name) data-state=(g.state) {
                    td { (g.id) " " b { (g.name) } } td { (g.gangs.join(", ")) } td { (g.queue) } td { (g.state) }
                    td { (placements(g)) }
                }
            }
        }
        (more(holding.len()))
        h2 { "Ended, newest first" }
        table #ended {
            tr { th { "group" } th { "gangs" } th { "how" } th { "why" } }
            @for g in ended.iter().take(UI_ROWS_MAX) {
                tr data-group=(g.id) data-name=(g.name) data-state=(g.state) {
                    td { (g.id) " " b { (g.name) } } td { (g.gangs.join(", ")) }
                    td class=(ended_class(&g.state)) { (g.state) } td { (g.reason) }
                }
            }
        }
        (more(ended.len()))
    }
}

fn ended_class(state: &str) -> &'static str {
    match state {
        "TimedOut" | "Preempted" => "warn",
        _ => "",
    }
}

fn more(n: usize) -> Markup {
    html! {
        @if n > UI_ROWS_MAX {
            p.more { (n - UI_ROWS_MAX) " more not shown; filter by namespace or queue to narrow" }
        }
    }
}

/// Why a waiting group waits, in words: its recorded reason, split per member
/// template where it names several, or what it is waiting for when it has none yet.
fn waiting_reason(g: &GangGroupStatus) -> Markup {
    let reason = g.reason.trim();
    if reason.is_empty() {
        let text = match (g.state.as_str(), g.attempts) {
            ("Placing", _) => "a reservation is being decided",
            ("Preempting", _) => "lower-priority gangs are leaving to make room",
            (_, 0) => "not tried yet: waiting for its turn in the queue",
            _ => "waiting for capacity",
        };
        return html! { (text) };
    }
    let parts: Vec<&str> = reason
        .split("; ")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    html! {
        @if parts.len() == 1 { (parts[0]) }
        @else { ul { @for p in parts { li { (p) } } } }
    }
}

fn placements(g: &GangGroupStatus) -> Markup {
    let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in &g.placements {
        let devices: Vec<String> = p
            .devices
            .iter()
            .map(|d| format!("{}/{}", d.pool, d.device))
            .collect();
        let member = if devices.is_empty() {
            format!("{}/{}", p.gang, p.member)
        } else {
            format!("{}/{} [{}]", p.gang, p.member, devices.join(", "))
        };
        by_node.entry(p.node.as_str()).or_default().push(member);
    }
    html! {
        details {
            summary { (g.placements.len()) " members on " (by_node.len()) " nodes" }
            ul.placements {
                @for (node, members) in &by_node {
                    li { a.node href="#" data-n=(node) { (node) } " ← " (members.join(", ")) }
                }
            }
        }
    }
}

/// A queue's fair share of each resource: its weight's part of its parent's pool
/// (the recorded capacity at the top, a parent's max where set, else the parent's own
/// fair share), idle siblings counted.
pub fn fair_shares(
    queues: &[ApiQueueStatus],
    capacity: &BTreeMap<String, String>,
) -> HashMap<String, BTreeMap<String, f64>> {
    let spec_of = |q: &ApiQueueStatus| q.spec.clone().unwrap_or_default();
    let mut children: BTreeMap<String, Vec<gangway_proto::admin::QueueSpec>> = BTreeMap::new();
    for q in queues {
        let s = spec_of(q);
        children.entry(s.parent.clone()).or_default().push(s);
    }
    let top: BTreeMap<String, f64> = capacity
        .iter()
        .map(|(r, q)| (r.clone(), amount(q)))
        .collect();
    let mut out = HashMap::new();
    let mut stack: Vec<(String, BTreeMap<String, f64>)> = vec![(String::new(), top)];
    while let Some((parent, pool)) = stack.pop() {
        let Some(siblings) = children.get(&parent) else {
            continue;
        };
        let weight = |s: &gangway_proto::admin::QueueSpec| f64::from(s.weight.max(1));
        let total: f64 = siblings.iter().map(weight).sum();
        for s in siblings {
            let share: BTreeMap<String, f64> = pool
                .iter()
                .map(|(r, p)| {
                    let fair = p * weight(s) / total;
                    let capped = s.max.get(r).map_or(fair, |m| fair.min(amount(m)));
                    (r.clone(), capped)
                })
                .collect();
            let own_pool: BTreeMap<String, f64> = share
                .iter()
                .map(|(r, f)| (r.clone(), s.max.get(r).map_or(*f, |m| amount(m))))
                .collect();
            out.insert(s.name.clone(), share);
            stack.push((s.name.clone(), own_pool));
        }
    }
    out
}

fn queue_depths(queues: &[ApiQueueStatus]) -> HashMap<String, usize> {
    let parents: HashMap<String, String> = queues
        .iter()
        .filter_map(|q| q.spec.as_ref())
        .map(|s| (s.name.clone(), s.parent.clone()))
        .collect();
    parents
        .keys()
        .map(|name| {
            let mut depth = 0;
            let mut at = name.clone();
            while let Some(p) = parents.get(&at).filter(|p| !p.is_empty()) {
                depth += 1;
                at = p.clone();
                if depth > parents.len() {
                    break;
                }
            }
            (name.clone(), depth)
        })
        .collect()
}

/// The queues panel: per queue and resource, usage against min, max and fair share.
pub fn queues(view: &QueuesView) -> Markup {
    let fair = fair_shares(&view.queues, &view.capacity);
    let depths = queue_depths(&view.queues);
    html! {
        @if view.capacity.is_empty() {
            p { "cluster capacity: not recorded yet" }
        } @else {
            p { "cluster capacity: "
                @for (r, q) in &view.capacity { code { (r) " " (q) } " " } }
        }
        @if view.fair_share_half_life_ms > 0 {
            p #fair-share { "fair share over time: half-life " (plain(view.fair_share_half_life_ms as f64 / 1_000.0))
                " s; the order measures a queue by its usage now plus its decayed usage" }
        }
        @if view.queues.is_empty() {
            p { "no queues: groups are admitted in submission order (gangctl queues put to make one)" }
        }
        @if !view.reservations.is_empty() {
            table #reservations {
                tr { th { "reserved for" } th { "priority" } th { "nodes" } th { "expected start" } th { "lapses in" } }
                @for r in &view.reservations {
                    tr data-group=(r.seq) {
                        td { "gang group " (r.seq) }
                        td { (r.priority) }
                        td title=(r.all_nodes().cloned().collect::<Vec<_>>().join(" ")) {
                            (r.node_count()) " on shard "
                            (r.nodes.keys().map(u32::to_string).collect::<Vec<_>>().join(", "))
                        }
                        td { @match r.starts_by_ms {
                            Some(at) => { "in " (at.saturating_sub(view.read_at_ms).div_ceil(1_000)) " s" }
                            None => { "unknown (a group there declared no run-time limit)" }
                        } }
                        td { (r.expires_at_ms.saturating_sub(view.read_at_ms).div_ceil(1_000)) " s" }
                    }
                }
            }
        }
        table #queues {
            tr { th { "queue" } th { "weight" } th { "waiting" } th { "admitted" }
                 th { "usage against min · max · fair share" } }
            @for q in &view.queues {
                @let s = q.spec.clone().unwrap_or_default();
                @let names: BTreeSet<&String> = s.min.keys().chain(s.max.keys()).chain(q.usage.keys()).collect();
                tr data-queue=(s.name) {
                    td style={ "padding-left:" (depths.get(&s.name).copied().unwrap_or(0) * 16 + 4) "px" } {
                        b { (s.name) }
                        @if !s.managed_by.is_empty() { br; small { (s.managed_by) } }
                    }
                    td { (s.weight.max(1)) } td { (q.queued) } td { (q.admitted) }
                    td {
                        @for r in names {
                            @let used = q.usage.get(r).map_or(0.0, |v| amount(v));
                            @let max = s.max.get(r).map(|v| amount(v));
                            @let f = fair.get(&s.name).and_then(|m| m.get(r)).copied();
                            @let scale = max.or(f).unwrap_or(used).max(used).max(1e-9);
                            div.qres {
                                code { (r) } " "
                                span.bar title={ (r) " used " (q.usage.get(r).map_or("0", String::as_str)) } {
                                    span.fill style={ "width:" (format!("{:.1}", (used / scale * 100.0).min(100.0))) "%" } {}
                                    @if let Some(m) = s.min.get(r) {
                                        span.min style={ "left:" (format!("{:.1}", (amount(m) / scale * 100.0).min(100.0))) "%" } {}
                                    }
                                }
                                " " (show(r, used))
                                " · min " (s.min.get(r).map_or("–".to_string(), |v| show(r, amount(v))))
                                @if let Some(l) = s.lend.get(r) { " (lends " (show(r, amount(l))) ")" }
                                " · max " (s.max.get(r).map_or("–".to_string(), |v| show(r, amount(v))))
                                " · fair " (f.map_or("–".to_string(), |v| show(r, v)))
                                @if view.fair_share_half_life_ms > 0 {
                                    " · decayed " (show(r, q.decayed_usage.get(r).map_or(0.0, |v| amount(v))))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An amount of `resource` for people: bytes in binary units, counts and cores plainly.
fn show(resource: &str, v: f64) -> String {
    let bytes = ["memory", "storage", "hugepages"]
        .iter()
        .any(|k| resource.contains(k));
    if bytes {
        const UNITS: [(&str, f64); 4] = [
            ("Ti", 1_099_511_627_776.0),
            ("Gi", 1_073_741_824.0),
            ("Mi", 1_048_576.0),
            ("Ki", 1_024.0),
        ];
        for (unit, size) in UNITS {
            if v >= size {
                return format!("{}{unit}", plain(v / size));
            }
        }
    }
    plain(v)
}

fn plain(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// The transactions panel: open reservations with their age, decisions some
/// participant still has to apply (recovery), and the newest decisions.
pub fn txns(view: &TxnsView, now_ms: u64) -> Markup {
    html! {
        h2 { "Open reservations" }
        @for (shard, reason) in &view.unreadable {
            p.error { "shard " (shard) " cannot be read: " (reason) }
        }
        table #open {
            tr { th { "shard" } th { "transaction" } th { "hold expires" } }
            @for (shard, txn, deadline) in &view.open {
                tr { td { (shard) } td { (txn) }
                     td { @if *deadline > now_ms { "in " (ago(*deadline, now_ms)) } @else { span.warn { "expired " (ago(now_ms, *deadline)) " ago" } } } }
            }
            @if view.open.is_empty() { tr { td colspan="3" { "none" } } }
        }
        h2 { "Recovery in progress" }
        table #undelivered {
            tr { th { "transaction" } th { "decision" } th { "shards still to apply it" } }
            @for u in &view.undelivered {
                tr { td { (u.txn) } td { (decision_name(Some(u.decision))) }
                     td { (u.shards.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")) } }
            }
            @if view.undelivered.is_empty() { tr { td colspan="3" { "none: every decision reached its shards" } } }
        }
        h2 { "Recent decisions" }
        table #recent {
            tr { th { "transaction" } th { "group" } th { "shards" } th { "decision" } th { "age" } th { "still to apply" } }
            @for t in &view.recent {
                tr {
                    td { (t.txn) }
                    td { @if let Some(g) = t.group { (g) " " (view.group_names.get(&g).map_or("", String::as_str)) } }
                    td { (t.participants.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")) }
                    td { (decision_name(t.decision))
                         @if !t.victims.is_empty() { " (preempts " (t.victims.len()) ")" } }
                    td { (ago(now_ms, t.began_at_ms)) }
                    td { (t.unacked.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")) }
                }
            }
        }
    }
}

fn decision_name(d: Option<Decision>) -> &'static str {
    match d {
        Some(Decision::Commit) => "commit",
        Some(Decision::Abort) => "abort",
        None => "undecided",
    }
}

/// The login page shown when the replica requires a token.
pub fn login(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "gangway · sign in" } link rel="stylesheet" href="/ui/assets/ui.css"; }
            body {
                header { span.brand { "gangway" } }
                main {
                    form.login method="post" action="/ui/login" {
                        p { "This replica requires a token (one of its --auth-tokens-file)." }
                        @if let Some(e) = error { p.error { (e) } }
                        input type="password" name="token" autocomplete="current-password" placeholder="token";
                        button type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
