//! Requests routed to a group's leader: writes and reads run here when this replica
//! leads, forwarded to the leader otherwise, with bounded retries while leadership
//! moves. Part of [`RaftHost`]'s `impl`.

use super::*;

impl RaftHost {
    /// Commits `command` in `group` (on its leader, wherever it is) and returns the reply.
    ///
    /// A retried attempt whose first reply was lost may apply the command
    /// twice: commands must be idempotent (carry their own ids).
    pub async fn write(&self, group: GroupId, command: Vec<u8>) -> Result<Outcome, HostError> {
        self.routed(group, Routed::Write(command)).await
    }

    /// Answers `query` from `group`'s state machine, linearizably.
    pub async fn read(&self, group: GroupId, query: Vec<u8>) -> Result<Outcome, HostError> {
        self.routed(group, Routed::Read(query)).await
    }

    /// Answers `query` from this replica's copy of `group`, possibly stale.
    pub fn read_local(&self, group: GroupId, query: &[u8]) -> Result<Outcome, HostError> {
        let g = self.group(group)?;
        let inner = g.sm.lock();
        Ok(Outcome {
            reply: inner.sm.query(query),
            index: inner.last_applied.map(|l| l.index).unwrap_or(0),
        })
    }

    /// Runs `f` on this replica's copy of `group`'s state machine (possibly stale), as
    /// `read_local` answers a query but without encoding one or its answer.
    pub fn inspect_local<R>(
        &self,
        group: GroupId,
        f: impl FnOnce(&dyn std::any::Any) -> R,
    ) -> Result<R, HostError> {
        let g = self.group(group)?;
        let inner = g.sm.lock();
        Ok(f(inner.sm.as_any()))
    }

    /// Runs `f` on `group`'s state machine linearizably, when this replica leads the
    /// group: the typed form of `read` for a server reading its own state machines on
    /// the leader. Anywhere else it answers `NotLeader` (with the leader, if known)
    /// and the caller reads through `read`. `f` runs on the blocking pool, as queries do.
    pub async fn inspect<R, F>(&self, group: GroupId, f: F) -> Result<R, HostError>
    where
        R: Send + 'static,
        F: FnOnce(&dyn std::any::Any) -> R + Send + 'static,
    {
        let g = self.group(group)?;
        let leader = g.raft.metrics().borrow().current_leader;
        if leader != Some(self.node_id()) {
            return Err(self.not_leader(group, leader, None));
        }
        self.confirm_leader(&g).await?;
        self.on_blocking_pool(group, move |host| host.inspect_local(group, f))
            .await
    }

    /// Runs a read of `group` on tokio's blocking pool: a query may be long (a plan over
    /// a large shard), and the async workers keep serving streams and heartbeats meanwhile.
    pub(super) async fn on_blocking_pool<R: Send + 'static>(
        &self,
        group: GroupId,
        read: impl FnOnce(&RaftHost) -> Result<R, HostError> + Send + 'static,
    ) -> Result<R, HostError> {
        let host = self.clone();
        tokio::task::spawn_blocking(move || read(&host))
            .await
            .map_err(|e| Self::fatal(group, format!("query task failed: {e}")))?
    }

    pub(crate) async fn routed(&self, group: GroupId, op: Routed) -> Result<Outcome, HostError> {
        self.group(group)?;
        let deadline = Instant::now() + Duration::from_millis(ROUTE_TIMEOUT_MS);
        let mut delay = ROUTE_BACKOFF_MIN_MS;
        loop {
            let result = match self.run_local(group, &op).await {
                Err(HostError::NotLeader {
                    leader: Some((id, addr)),
                    ..
                }) if id != self.node_id() => match op {
                    // A transfer or membership change moves leadership itself: it must
                    // not be abandoned when the leader changes under it.
                    Routed::Write(_) | Routed::Read(_) => {
                        self.run_remote_while_leader(group, id, &addr, &op).await
                    }
                    _ => self.run_remote(group, id, &addr, &op).await,
                },
                other => other,
            };
            match result {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tracing::debug!(group, error = %e, "retrying routed request");
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    delay = (delay * 2).min(ROUTE_BACKOFF_MAX_MS);
                }
                other => return other,
            }
        }
    }

    /// Runs `op` on `leader`, giving up as soon as this replica stops believing in
    /// that leader: a paused or cut-off leader answers nothing until the attempt
    /// times out, while the rest of the group has already elected another one.
    pub(super) async fn run_remote_while_leader(
        &self,
        group: GroupId,
        leader: NodeId,
        addr: &str,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        let mut metrics = self.group(group)?.raft.metrics();
        let replaced = async move {
            loop {
                if metrics.borrow_and_update().current_leader != Some(leader) {
                    return;
                }
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            result = self.run_remote(group, leader, addr, op) => result,
            () = replaced => Err(HostError::Unavailable {
                group,
                detail: format!("leader {leader} was replaced while the request was in flight"),
            }),
        }
    }

    /// Runs `op` on this replica, which must lead `group`.
    pub(crate) async fn run_local(
        &self,
        group: GroupId,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        let g = self.group(group)?;
        match op {
            Routed::Write(cmd) => self.write_local(&g, cmd.clone()).await,
            Routed::Read(q) => self.read_leader(&g, q).await,
            Routed::AddLearner(node, addr) => self.add_learner_local(&g, *node, addr).await,
            Routed::ChangeVoters(voters) => self.change_voters_local(&g, voters).await,
            Routed::Transfer(to) => self.transfer_local(&g, *to).await,
        }
    }

    /// A not-leader error with the leader's address, taken from the
    /// membership when openraft did not supply it.
    pub(super) fn not_leader(
        &self,
        group: GroupId,
        leader: Option<NodeId>,
        node: Option<BasicNode>,
    ) -> HostError {
        let addr = node.map(|n| n.addr).or_else(|| {
            let id = leader?;
            let g = self.shared.groups.now().get(&group).cloned()?;
            let m = g.raft.metrics().borrow().membership_config.clone();
            m.membership().get_node(&id).map(|n| n.addr.clone())
        });
        HostError::NotLeader {
            group,
            node: self.node_id(),
            leader: leader.zip(addr),
        }
    }

    pub(super) fn fatal(group: GroupId, e: impl std::fmt::Display) -> HostError {
        HostError::Fatal {
            group,
            detail: e.to_string(),
        }
    }

    pub(super) async fn write_local(&self, g: &Group, cmd: Vec<u8>) -> Result<Outcome, HostError> {
        if g.transferring.load(Ordering::Acquire) {
            return Err(HostError::Transferring { group: g.id });
        }
        if let Some(admit) = &g.admission {
            admit(&cmd).map_err(|reason| {
                HostError::InvalidArgument(format!(
                    "group {} refused the command before proposing it: {reason}",
                    g.id
                ))
            })?;
        }
        let waiting = g
            .proposer
            .propose(cmd)
            .await
            .map_err(|_| Self::fatal(g.id, "the group's write queue is closed"))?;
        let res = tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), waiting)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!("no commit within {ATTEMPT_TIMEOUT_MS} ms"),
            })?
            .map_err(|_| Self::fatal(g.id, "the write was dropped by a stopping group"))?;
        match res {
            Ok((reply, index)) => Ok(Outcome { reply, index }),
            Err(e) => Err(self.write_error(g, e)),
        }
    }

    pub(super) async fn read_leader(&self, g: &Group, query: &[u8]) -> Result<Outcome, HostError> {
        self.confirm_leader(g).await?;
        let group = g.id;
        let query = query.to_vec();
        self.on_blocking_pool(group, move |host| host.read_local(group, &query))
            .await
    }

    /// Confirms that this replica still leads `g` after the caller's read arrived (a
    /// quorum answered a check begun after it), so its state holds every write
    /// acknowledged before.
    pub(super) async fn confirm_leader(&self, g: &Group) -> Result<(), HostError> {
        let closed = || HostError::Unavailable {
            group: g.id,
            detail: "the host is shutting down".to_string(),
        };
        // A read may wait for the check under way when it arrived, then its own.
        let wait = Duration::from_millis(2 * ATTEMPT_TIMEOUT_MS);
        let confirmed = async {
            let rx = g.read_gate.confirm().await.map_err(|_| closed())?;
            Ok::<_, HostError>(rx.await)
        };
        let res = tokio::time::timeout(wait, confirmed)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!(
                    "no quorum confirmed the leader within {} ms",
                    2 * ATTEMPT_TIMEOUT_MS
                ),
            })??
            .map_err(|_| closed())?;
        match res {
            Ok(()) => Ok(()),
            Err(CheckFailed::TimedOut) => Err(HostError::Unavailable {
                group: g.id,
                detail: format!("no quorum confirmed the leader within {ATTEMPT_TIMEOUT_MS} ms"),
            }),
            Err(CheckFailed::Refused(RaftError::APIError(
                CheckIsLeaderError::ForwardToLeader(f),
            ))) => Err(self.not_leader(g.id, f.leader_id, f.leader_node)),
            Err(CheckFailed::Refused(RaftError::APIError(
                CheckIsLeaderError::QuorumNotEnough(e),
            ))) => Err(HostError::Unavailable {
                group: g.id,
                detail: e.to_string(),
            }),
            Err(CheckFailed::Refused(RaftError::Fatal(e))) => Err(Self::fatal(g.id, e)),
        }
    }

    /// Maps openraft's write error, for commands and membership changes alike.
    pub(super) fn write_error(
        &self,
        g: &Group,
        e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
    ) -> HostError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                self.not_leader(g.id, f.leader_id, f.leader_node)
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                HostError::Membership {
                    group: g.id,
                    detail: e.to_string(),
                }
            }
            RaftError::Fatal(e) => Self::fatal(g.id, e),
        }
    }

    pub(super) async fn run_remote(
        &self,
        group: GroupId,
        leader: NodeId,
        addr: &str,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        // Writes go through the group's forwarder, which owns its calls' channels.
        let channel = || {
            self.shared
                .pool
                .channel(addr)
                .map_err(|e| HostError::Unavailable { group, detail: e })
        };
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group,
            node: self.node_id(),
        };
        let envelope = Some(origin.envelope(leader));
        let peer_err =
            |s: tonic::Status| HostError::from_peer_status(group, self.node_id(), addr, &s);
        let timeout = Duration::from_millis(ATTEMPT_TIMEOUT_MS + 500);
        match op {
            Routed::Write(cmd) => {
                let g = self.group(group)?;
                g.forwarder.forward(leader, addr, cmd.clone()).await
            }
            Routed::Read(q) => {
                let mut req = tonic::Request::new(ReadRequest {
                    envelope,
                    query: q.clone(),
                });
                req.set_timeout(timeout);
                let reply = transport_client(&self.shared.pool, channel()?, leader)
                    .read(req)
                    .await
                    .map_err(peer_err)?;
                let r = reply.into_inner();
                Ok(Outcome {
                    reply: r.reply,
                    index: r.applied_index,
                })
            }
            Routed::AddLearner(node, node_addr) => {
                let req = pb::AddLearnerRequest {
                    group_id: Some(group),
                    node_id: *node,
                    addr: node_addr.clone(),
                };
                admin_client(&self.shared.pool, channel()?, leader)
                    .add_learner(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: 0,
                })
            }
            Routed::ChangeVoters(voters) => {
                let req = pb::ChangeMembershipRequest {
                    group_id: Some(group),
                    voters: voters.iter().copied().collect(),
                };
                admin_client(&self.shared.pool, channel()?, leader)
                    .change_membership(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: 0,
                })
            }
            Routed::Transfer(to) => {
                let req = pb::TransferLeaderRequest {
                    group_id: group,
                    to_node: *to,
                };
                let r = admin_client(&self.shared.pool, channel()?, leader)
                    .transfer_leader(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: r.into_inner().leader,
                })
            }
        }
    }
}
