//! Membership of every group: bootstrap, learners, voter changes, leadership
//! transfers and hand-overs, log compaction, and what the members are. Part of
//! [`RaftHost`]'s `impl`.

use super::*;

impl RaftHost {
    pub(super) async fn add_learner_local(
        &self,
        g: &Group,
        node: NodeId,
        addr: &str,
    ) -> Result<Outcome, HostError> {
        if addr.is_empty() {
            return Err(HostError::InvalidArgument(
                "addr: a new learner needs an address".into(),
            ));
        }
        let _one_at_a_time = g.membership.lock().await;
        let change = g.raft.add_learner(node, BasicNode::new(addr), true);
        let resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), change)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!(
                    "learner {node} did not catch up within {MEMBERSHIP_TIMEOUT_MS} ms"
                ),
            })?
            .map_err(|e| self.write_error(g, e))?;
        Ok(Outcome {
            reply: Vec::new(),
            index: resp.log_id.index,
        })
    }

    pub(super) async fn change_voters_local(
        &self,
        g: &Group,
        voters: &BTreeSet<NodeId>,
    ) -> Result<Outcome, HostError> {
        if voters.is_empty() {
            return Err(HostError::InvalidArgument(
                "voters: the new voter set is empty".into(),
            ));
        }
        let _one_at_a_time = g.membership.lock().await;
        let timed_out = || HostError::Unavailable {
            group: g.id,
            detail: format!("membership change did not commit within {MEMBERSHIP_TIMEOUT_MS} ms"),
        };
        let change = g.raft.change_membership(voters.clone(), false);
        let mut resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), change)
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| self.write_error(g, e))?;
        // The members are exactly the voters named: a learner left in place would keep
        // receiving the log (replacing voters alone keeps every learner).
        let learners: BTreeSet<NodeId> = g
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .filter(|l| !voters.contains(l))
            .collect();
        if !learners.is_empty() {
            let drop = g
                .raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(learners), false);
            resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), drop)
                .await
                .map_err(|_| timed_out())?
                .map_err(|e| self.write_error(g, e))?;
        }
        Ok(Outcome {
            reply: Vec::new(),
            index: resp.log_id.index,
        })
    }

    /// Initializes every group with `members` (id -> address) on a new cluster.
    ///
    /// Group g is initialized first by the (g mod n)-th member, so initial
    /// leaderships spread; the others step in after `BOOTSTRAP_FALLBACK_MS` if
    /// the group still has no leader (its designated member is down).
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, String>) -> Result<(), HostError> {
        if !members.contains_key(&self.node_id()) {
            return Err(HostError::InvalidArgument(format!(
                "bootstrap members must include this node ({})",
                self.node_id()
            )));
        }
        for group in self.shared.groups.now().values() {
            self.bootstrap_group(group, members).await?;
        }
        Ok(())
    }

    /// Initializes one group with `members`: at once on its designated member (group g:
    /// the (g mod n)-th), after `BOOTSTRAP_FALLBACK_MS` without a leader on the others.
    pub(super) async fn bootstrap_group(
        &self,
        group: &Arc<Group>,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<(), HostError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        let ids: Vec<NodeId> = members.keys().copied().collect();
        if ids.is_empty() {
            return Err(HostError::InvalidArgument(
                "a group needs at least one member".into(),
            ));
        }
        let designated = ids[(group.id as usize) % ids.len()];
        if designated == self.node_id() {
            return initialize(group, nodes).await;
        }
        let group = group.clone();
        let mut stop = self.shutdown_signal();
        self.own(tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(BOOTSTRAP_FALLBACK_MS)) => {}
                _ = stop.changed() => return,
            }
            if group.raft.metrics().borrow().current_leader.is_none() {
                if let Err(e) = initialize(&group, nodes).await {
                    tracing::warn!(group = group.id, error = %e, "fallback bootstrap failed");
                }
            }
        }));
        Ok(())
    }

    /// Adds `node` at `addr` as a learner of `group` (every group when `None`); waits for it to catch up.
    pub async fn add_learner(
        &self,
        group: Option<GroupId>,
        node: NodeId,
        addr: &str,
    ) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            self.routed(gid, Routed::AddLearner(node, addr.to_string()))
                .await?;
        }
        Ok(())
    }

    /// Makes `voters` the complete voter set of `group` (every group when `None`).
    pub async fn change_membership(
        &self,
        group: Option<GroupId>,
        voters: BTreeSet<NodeId>,
    ) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            self.routed(gid, Routed::ChangeVoters(voters.clone()))
                .await?;
        }
        Ok(())
    }

    pub(super) fn targets(&self, group: Option<GroupId>) -> Result<Vec<GroupId>, HostError> {
        match group {
            Some(g) => {
                self.group(g)?;
                Ok(vec![g])
            }
            None => Ok(self.group_ids()),
        }
    }

    /// Hands the leadership of `group` to voter `to`; returns the leader afterwards.
    pub async fn transfer_leader(&self, group: GroupId, to: NodeId) -> Result<NodeId, HostError> {
        let outcome = self.routed(group, Routed::Transfer(to)).await?;
        Ok(outcome.index)
    }

    /// openraft 0.9 has no leader transfer: the leader stops its heartbeats
    /// and writes, tells the other voters to hold their campaigns and the
    /// target to campaign once the lease has run out, then waits to see the
    /// target lead. See raft/README.md.
    pub(super) async fn transfer_local(
        &self,
        g: &Arc<Group>,
        to: NodeId,
    ) -> Result<Outcome, HostError> {
        let m = g.raft.metrics().borrow().clone();
        if m.current_leader != Some(self.node_id()) {
            return Err(self.not_leader(g.id, m.current_leader, None));
        }
        if to == self.node_id() {
            return Ok(Outcome {
                reply: Vec::new(),
                index: to,
            });
        }
        let membership = m.membership_config.membership().clone();
        if !membership.voter_ids().any(|v| v == to) {
            return Err(HostError::InvalidArgument(format!(
                "to_node: node {to} is not a voter of group {}",
                g.id
            )));
        }
        if g.transferring.swap(true, Ordering::AcqRel) {
            return Err(HostError::Transferring { group: g.id });
        }
        g.raft.runtime_config().heartbeat(false);
        let result = self.hand_over(g, to, &membership).await;
        g.raft.runtime_config().heartbeat(true);
        g.transferring.store(false, Ordering::Release);
        result.map(|leader| Outcome {
            reply: Vec::new(),
            index: leader,
        })
    }

    pub(super) async fn hand_over(
        &self,
        g: &Arc<Group>,
        to: NodeId,
        membership: &openraft::Membership<NodeId, BasicNode>,
    ) -> Result<NodeId, HostError> {
        let timing = &self.shared.cfg.timing;
        let hold_ms = timing.election_max_ms * 3 + timing.election_min_ms;
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group: g.id,
            node: self.node_id(),
        };
        for voter in membership.voter_ids().filter(|v| *v != self.node_id()) {
            let Some(node) = membership.get_node(&voter) else {
                continue;
            };
            let req = PrepareElectionRequest {
                envelope: Some(origin.envelope(voter)),
                candidate: to,
                hold_ms,
            };
            let sent = match self.shared.pool.channel(&node.addr) {
                Ok(ch) => transport_client(&self.shared.pool, ch, voter)
                    .prepare_election(req)
                    .await
                    .map_err(|s| s.to_string()),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                if voter == to {
                    return Err(HostError::Unavailable {
                        group: g.id,
                        detail: format!("transfer target {to}: {e}"),
                    });
                }
                tracing::warn!(group = g.id, voter, error = %e, "voter missed the transfer notice");
            }
        }
        let mut rx = g.raft.metrics();
        let wait = async {
            loop {
                let leader = rx.borrow_and_update().current_leader;
                if leader.is_some() && leader != Some(self.node_id()) {
                    return leader;
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(Duration::from_millis(TRANSFER_TIMEOUT_MS), wait).await {
            Ok(Some(leader)) => Ok(leader),
            Ok(None) => Err(Self::fatal(g.id, "raft stopped during a transfer")),
            Err(_) => Err(HostError::Unavailable {
                group: g.id,
                detail: format!("node {to} did not take over within {TRANSFER_TIMEOUT_MS} ms"),
            }),
        }
    }

    /// Builds a snapshot of `group` (every group when `None`) on this replica and purges the log it covers.
    pub async fn compact(&self, group: Option<GroupId>) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            let g = self.group(gid)?;
            let applied = g.raft.metrics().borrow().last_applied;
            g.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| Self::fatal(gid, e))?;
            let mut rx = g.raft.metrics();
            let wait = async {
                loop {
                    let snap = rx.borrow_and_update().snapshot;
                    if snap >= applied {
                        return snap;
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            };
            let snap = tokio::time::timeout(Duration::from_millis(COMPACT_TIMEOUT_MS), wait)
                .await
                .map_err(|_| HostError::Unavailable {
                    group: gid,
                    detail: "snapshot did not complete".into(),
                })?;
            if let Some(snap) = snap {
                g.raft
                    .trigger()
                    .purge_log(snap.index)
                    .await
                    .map_err(|e| Self::fatal(gid, e))?;
            }
        }
        Ok(())
    }

    /// Every member known from the groups' memberships: id -> address.
    pub fn members(&self) -> BTreeMap<NodeId, String> {
        let mut out = BTreeMap::new();
        for g in self.shared.groups.now().values() {
            let m = g.raft.metrics().borrow().membership_config.clone();
            for (id, node) in m.membership().nodes() {
                out.insert(*id, node.addr.clone());
            }
        }
        out
    }

    /// Whether `group`'s membership, as this replica sees it, is a joint one (a change
    /// of voters under way).
    pub fn membership_changing(&self, group: GroupId) -> Result<bool, HostError> {
        let g = self.group(group)?;
        let m = g.raft.metrics().borrow().membership_config.clone();
        Ok(m.membership().get_joint_config().len() > 1)
    }

    /// The voters of `group` (id -> address) as this replica's membership shows them.
    pub fn voters_of(&self, group: GroupId) -> Result<BTreeMap<NodeId, String>, HostError> {
        let g = self.group(group)?;
        let m = g.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        Ok(membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
            .collect())
    }
}
