//! Peers and elections: pinging peers and gating elections on what they report,
//! balancing leaderships over live nodes, and recording the members seen. Part of
//! [`RaftHost`]'s `impl`.

use super::*;

impl RaftHost {
    /// Called on every voter but the leader during a transfer.
    pub(crate) fn prepare_election(
        &self,
        group: GroupId,
        candidate: NodeId,
        hold_ms: u64,
    ) -> Result<(), HostError> {
        let g = self.group(group)?;
        let lease_ms = self.shared.cfg.timing.election_max_ms;
        let mut stop = self.shutdown_signal();
        if candidate == self.node_id() {
            self.own(tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(lease_ms + 50)) => {}
                    _ = stop.changed() => return,
                }
                if let Err(e) = g.raft.trigger().elect().await {
                    tracing::warn!(group = g.id, error = %e, "could not start the handed-over election");
                }
            }));
        } else {
            // The election gate lifts the hold once it has passed.
            if let Ok(mut hold) = g.election_hold_until.lock() {
                *hold = Some(Instant::now() + Duration::from_millis(hold_ms));
            }
            g.raft.runtime_config().elect(false);
        }
        Ok(())
    }

    /// Pings every peer every [`REACH_PING_MS`] (one ping in flight per peer, each
    /// bounded by [`REACH_WINDOW_MS`]) and records who answered, with what.
    pub(super) async fn ping_peers(self) {
        let mut stop = self.shutdown_signal();
        let mut tick = tokio::time::interval(Duration::from_millis(REACH_PING_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let started = Instant::now();
        let mut silent = BTreeSet::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            self.log_silent_peers(started, &mut silent);
            for (peer, addr) in self.members() {
                if peer == self.node_id() || !self.shared.reach.start_ping(peer) {
                    continue;
                }
                let host = self.clone();
                // Not owned: each ping ends within REACH_WINDOW_MS on its own.
                tokio::spawn(async move {
                    if let Some(views) = host.ping(peer, &addr).await {
                        host.shared.reach.answered(peer, views);
                    }
                    host.shared.reach.end_ping(peer);
                });
            }
        }
    }

    /// Logs a peer that stopped answering pings for `PEER_SILENT_WARN_MS` (once, at
    /// WARN) and its return (INFO). Short silences are normal (a restart, an election)
    /// and are not logged; openraft's own replication errors are off by default.
    pub(super) fn log_silent_peers(&self, started: Instant, silent: &mut BTreeSet<NodeId>) {
        let bound = Duration::from_millis(PEER_SILENT_WARN_MS);
        for (peer, addr) in self.members() {
            if peer == self.node_id() {
                continue;
            }
            let since = self.shared.reach.last_answer(peer).unwrap_or(started);
            let quiet = since.elapsed();
            if quiet >= bound && silent.insert(peer) {
                tracing::warn!(peer, %addr, silent_ms = quiet.as_millis() as u64, "peer does not answer");
            } else if quiet < bound && silent.remove(&peer) {
                tracing::info!(peer, %addr, "peer answers again");
            }
        }
    }

    /// `peer`'s view of each group if it answers a ping in time (a peer too old to
    /// know the call answers Unimplemented: it is reachable, with no views).
    pub(super) async fn ping(
        &self,
        peer: NodeId,
        addr: &str,
    ) -> Option<BTreeMap<GroupId, PeerGroupView>> {
        let group = self.shared.groups.now().keys().next().copied()?;
        let channel = self.shared.pool.channel(addr).ok()?;
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group,
            node: self.node_id(),
        };
        let window = Duration::from_millis(REACH_WINDOW_MS);
        let mut req = tonic::Request::new(pb_raft::PingRequest {
            envelope: Some(origin.envelope(peer)),
        });
        req.set_timeout(window);
        let mut client = transport_client(&self.shared.pool, channel, peer);
        match tokio::time::timeout(window, client.ping(req)).await {
            Ok(Ok(reply)) => Some(
                reply
                    .into_inner()
                    .groups
                    .iter()
                    .map(|v| (v.group, peer_group_view(v)))
                    .collect(),
            ),
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Some(BTreeMap::new()),
            _ => None,
        }
    }

    /// What this replica tells a pinging peer about each group.
    pub(crate) fn group_views(&self) -> Vec<pb_raft::GroupView> {
        let now = Instant::now();
        self.shared
            .groups
            .now()
            .values()
            .map(|g| {
                let last = g.last_log.get();
                let (state, leader) = {
                    let m = g.raft.metrics();
                    let m = m.borrow();
                    (m.state, m.current_leader)
                };
                pb_raft::GroupView {
                    group: g.id,
                    has_last_log: last.is_some(),
                    last_log_term: last.map_or(0, |l| l.leader_id.term),
                    last_log_node: last.map_or(0, |l| l.leader_id.node_id),
                    last_log_index: last.map_or(0, |l| l.index),
                    leader: self.heard_leader(g.id, state, leader, now).unwrap_or(0),
                }
            })
            .collect()
    }

    /// The leader this replica hears in `group`, given its `state` and
    /// `current_leader` there: itself if it leads, else its leader if that one
    /// answered a ping within the window and said it leads.
    pub(super) fn heard_leader(
        &self,
        group: GroupId,
        state: openraft::ServerState,
        current_leader: Option<NodeId>,
        now: Instant,
    ) -> Option<NodeId> {
        if state == openraft::ServerState::Leader {
            return Some(self.node_id());
        }
        current_leader.filter(|l| *l != self.node_id() && self.shared.reach.leads(*l, group, now))
    }

    /// Decides, every [`REACH_PING_MS`], who may campaign in each group and starts
    /// an election ahead of openraft's timer when this replica should lead next
    /// (see the `reachability` module).
    pub(super) async fn gate_elections(self) {
        let mut stop = self.shutdown_signal();
        let mut state = GateState::default();
        let timing = GateTiming::for_election_max(self.shared.cfg.timing.election_max_ms);
        let mut tick = tokio::time::interval(Duration::from_millis(REACH_PING_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            for (gid, g) in self.shared.groups.now().iter() {
                let input = self.gate_input(g, now, &mut state);
                let decision = decide(&input, timing);
                if state.enabled.get(gid) != Some(&decision.enable) {
                    g.raft.runtime_config().elect(decision.enable);
                    let was = state.enabled.insert(*gid, decision.enable);
                    if was.is_some() {
                        let forming = !state.led.contains(gid);
                        log_gate_change(*gid, decision.reason, forming);
                    }
                }
                report_reach(*gid, decision.reason, now, &mut state);
                if decision.campaign_now && state.may_campaign_again(*gid, now, timing) {
                    state.campaigned_at.insert(*gid, now);
                    tracing::info!(
                        group = gid,
                        silent_ms = input.leader_silent_ms.unwrap_or(0),
                        "election gate: the leader is silent and this replica holds the longest log in reach; campaigning"
                    );
                    let trigger = g.raft.trigger();
                    let elect = trigger.elect();
                    match tokio::time::timeout(Duration::from_millis(REACH_WINDOW_MS), elect).await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(group = gid, error = %e, "could not campaign"),
                        Err(_) => {
                            tracing::warn!(group = gid, "raft did not take the campaign in time")
                        }
                    }
                }
            }
        }
    }

    /// Gathers the gate's input for `g`, tracking when it last heard its leader.
    pub(super) fn gate_input(&self, g: &Group, now: Instant, state: &mut GateState) -> GateInput {
        let (state_now, current_leader, vote, voters) = {
            let m = g.raft.metrics();
            let m = m.borrow();
            let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
            (m.state, m.current_leader, m.vote, voters)
        };
        let me = self.node_id();
        let role = match state_now {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Candidate => Role::Candidate,
            _ => Role::Follower,
        };
        // A vote given or taken restarts the wait, as it restarts openraft's timer: an
        // election is under way, and campaigning over it would depose the winner.
        let voted = state.vote_changed_at(g.id, vote, now);
        let leader_silent_ms = match self.heard_leader(g.id, state_now, current_leader, now) {
            Some(l) => {
                // Heard as of the leader's last ping answer (now, for itself).
                let at = if l == me {
                    now
                } else {
                    self.shared.reach.last_answer(l).unwrap_or(now)
                };
                state.heard_at.insert(g.id, at);
                // A lone voter leading itself is a cluster still being formed.
                if voters.len() > 1 {
                    state.led.insert(g.id);
                }
                None
            }
            None => {
                let heard = *state.heard_at.entry(g.id).or_insert(now);
                let since = heard.max(voted);
                Some(now.saturating_duration_since(since).as_millis() as u64)
            }
        };
        let held = g
            .election_hold_until
            .lock()
            .ok()
            .and_then(|h| *h)
            .is_some_and(|until| until > now);
        GateInput {
            me,
            voters,
            last_log: g.last_log.get(),
            role,
            peers: self.shared.reach.views(g.id, now),
            held,
            leader_silent_ms,
        }
    }

    /// Moves group leaderships so no live replica leads more than ceil(groups / live).
    pub async fn balance(&self) -> Result<pb::BalanceReply, HostError> {
        let live = self.live_nodes().await;
        let mut leaders = BTreeMap::new();
        let mut voters = BTreeMap::new();
        for (gid, g) in self.shared.groups.now().iter() {
            let m = g.raft.metrics().borrow().clone();
            leaders.insert(*gid, m.current_leader);
            voters.insert(
                *gid,
                m.membership_config
                    .membership()
                    .voter_ids()
                    .collect::<BTreeSet<_>>(),
            );
        }
        let moves = balance::plan(&leaders, &voters, &live);
        let runs = moves.iter().map(|m| async move {
            let res = self.transfer_leader(m.group, m.to).await;
            if let Err(e) = &res {
                tracing::warn!(group = m.group, to = m.to, error = %e, "leadership transfer failed");
            }
            pb::Transfer { group_id: m.group, from_node: m.from, to_node: m.to, done: matches!(res, Ok(l) if l == m.to) }
        });
        let transfers = futures::future::join_all(runs).await;
        let mut leaders_per_node = BTreeMap::<u64, u32>::new();
        for g in self.shared.groups.now().values() {
            if let Some(l) = g.raft.metrics().borrow().current_leader {
                *leaders_per_node.entry(l).or_default() += 1;
            }
        }
        Ok(pb::BalanceReply {
            transfers,
            leaders_per_node: leaders_per_node.into_iter().collect(),
        })
    }

    /// The status member `id` at `addr` reports of itself, asked as a peer (this
    /// replica's certificate and a proof made for that member: never a client's token).
    pub async fn member_status(
        &self,
        id: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<pb::StatusReply, String> {
        let ch = self.shared.pool.channel(addr)?;
        let mut req = tonic::Request::new(pb::StatusRequest {
            include_state_hash: false,
        });
        req.set_timeout(timeout);
        let mut client = admin_client(&self.shared.pool, ch, id);
        match tokio::time::timeout(timeout, client.status(req)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    }

    /// Members (from every group's membership) that answer a status probe.
    pub(super) async fn live_nodes(&self) -> BTreeSet<NodeId> {
        let members = self.members();
        let probes = members.into_iter().map(|(id, addr)| async move {
            if id == self.node_id() {
                return Some(id);
            }
            let ch = self.shared.pool.channel(&addr).ok()?;
            let mut req = tonic::Request::new(pb::StatusRequest {
                include_state_hash: false,
            });
            req.set_timeout(Duration::from_millis(PROBE_TIMEOUT_MS));
            admin_client(&self.shared.pool, ch, id)
                .status(req)
                .await
                .ok()
                .map(|_| id)
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    pub(super) async fn auto_balance(self) {
        let period = Duration::from_millis(self.shared.cfg.timing.balance_interval_ms);
        let mut stop = self.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.changed() => return,
            }
            if self.leader_of(crate::META_GROUP) != Some(self.node_id()) || !self.needs_balance() {
                continue;
            }
            match self.balance().await {
                Ok(r) => tracing::info!(transfers = r.transfers.len(), "leaderships balanced"),
                Err(e) => tracing::warn!(error = %e, "leader balancing failed"),
            }
        }
    }

    pub(super) fn needs_balance(&self) -> bool {
        let mut count = BTreeMap::<NodeId, usize>::new();
        let mut voters = BTreeSet::new();
        for g in self.shared.groups.now().values() {
            let m = g.raft.metrics().borrow().clone();
            voters.extend(m.membership_config.membership().voter_ids());
            if let Some(l) = m.current_leader {
                *count.entry(l).or_default() += 1;
            }
        }
        let max = balance::leaders_max(self.shared.groups.now().len(), voters.len());
        count.values().any(|c| *c > max)
    }

    /// Records, every `MEMBERS_SEEN_PERIOD_MS`, the members this replica saw store Raft state.
    pub(super) async fn record_members_seen(self) {
        let mut stop = self.shutdown_signal();
        let mut tick = tokio::time::interval(Duration::from_millis(MEMBERS_SEEN_PERIOD_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let me = self.node_id();
            let groups: Vec<GroupParticipation> = self
                .shared
                .groups
                .now()
                .values()
                .map(|g| {
                    let m = g.raft.metrics().borrow().clone();
                    GroupParticipation {
                        leading: m.current_leader == Some(me),
                        acknowledged: m
                            .replication
                            .iter()
                            .flatten()
                            .filter(|(_, matched)| matched.is_some())
                            .map(|(id, _)| *id)
                            .collect(),
                        applied_from: m.current_leader.filter(|_| m.last_applied.is_some()),
                    }
                })
                .collect();
            let seen = participants(me, &groups);
            let host = self.clone();
            let recorded =
                tokio::task::spawn_blocking(move || host.shared.members_seen.record(&seen)).await;
            match recorded {
                Ok(Ok(new)) if !new.is_empty() => {
                    tracing::debug!(members = ?new, "recorded members that stored Raft state")
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot record the members seen"),
                Err(e) => tracing::warn!(error = %e, "members-seen task failed"),
            }
        }
    }
}

/// Logs a majority of `group`'s voters out of reach once it has lasted
/// [`PEER_SILENT_WARN_MS`], and its return after that: a blip of a few pings (a peer
/// starting, a leader moving) is routine and logged by the gate at debug only.
fn report_reach(group: GroupId, reason: GateReason, now: Instant, state: &mut GateState) {
    let bound = Duration::from_millis(PEER_SILENT_WARN_MS);
    if reason == GateReason::OutOfReach {
        let (since, reported) = state.unreachable.entry(group).or_insert((now, false));
        let lasted = now.saturating_duration_since(*since);
        if !*reported && lasted >= bound {
            *reported = true;
            tracing::info!(
                group,
                ms = lasted.as_millis() as u64,
                "election gate: a majority of voters has been out of reach; no election here"
            );
        }
    } else if let Some((since, true)) = state.unreachable.remove(&group) {
        tracing::info!(
            group,
            ms = now.saturating_duration_since(since).as_millis() as u64,
            "election gate: a majority of voters is in reach again"
        );
    }
}
