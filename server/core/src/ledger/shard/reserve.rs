//! Phase 1 of the two-phase reservation: admitting, holding and refusing reservations.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    pub(super) fn reserve(
        &mut self,
        at_ms: u64,
        txn_id: TxnId,
        members: &[ReserveMember],
        network: &[NetworkHold],
        hold: Hold,
    ) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.get(&txn_id) {
            return match hold {
                Hold::Until(_) if self.is_same_reservation(open, members, network) => {
                    Ok(LedgerReply::Reserved {
                        txn_id,
                        deadline_ms: open.deadline_ms,
                    })
                }
                _ => Err(LedgerError::TxnConflict { txn_id }),
            };
        }
        if let Some(done) = self.state.finished.get(&txn_id) {
            return Ok(finished_answer(txn_id, done, hold));
        }
        if self.holds_committed(txn_id) {
            return Ok(LedgerReply::AlreadyFinished {
                txn_id,
                outcome: TxnOutcome::Committed,
            });
        }
        validate_reservation(at_ms, txn_id, members, network, hold)?;
        let mut refusals = self.refusals(members, network, at_ms);
        refusals.extend(self.network_refusals(members, network, at_ms));
        if !refusals.is_empty() {
            refusals.truncate(REFUSALS_KEPT_MAX);
            self.finish(txn_id, TxnOutcome::Refused, at_ms, refusals.clone());
            return Ok(LedgerReply::ReserveRefused { txn_id, refusals });
        }
        let state = match hold {
            Hold::Until(_) => SlotState::Reserved { txn_id },
            Hold::CommitNow => SlotState::Committed { txn_id, at_ms },
        };
        for member in members {
            self.hold_member(member, state);
        }
        for h in network {
            self.state.network.hold(h, state);
        }
        match hold {
            Hold::Until(deadline_ms) => {
                let mut held = BTreeMap::new();
                for m in members {
                    held.insert(m.member.clone(), m.node.clone());
                }
                let open = OpenTxn {
                    members: held,
                    deadline_ms,
                    reserved_at_ms: at_ms,
                    displaced: BTreeMap::new(),
                    network: network
                        .iter()
                        .filter(|h| !matches!(h.kind(), HoldKind::Use(_)))
                        .map(NetworkHold::key)
                        .collect(),
                };
                self.state.open.insert(txn_id, open);
                Ok(LedgerReply::Reserved {
                    txn_id,
                    deadline_ms,
                })
            }
            Hold::CommitNow => {
                self.finish(txn_id, TxnOutcome::Committed, at_ms, Vec::new());
                Ok(LedgerReply::Committed { txn_id })
            }
        }
    }

    pub(super) fn is_same_reservation(
        &self,
        open: &OpenTxn,
        members: &[ReserveMember],
        network: &[NetworkHold],
    ) -> bool {
        let held = network
            .iter()
            .filter(|h| !matches!(h.kind(), HoldKind::Use(_)))
            .count();
        let same_network = held == open.network.len()
            && network.iter().all(|h| match h.kind() {
                HoldKind::Use(claim) => self.state.network.uses(&h.member, claim),
                HoldKind::Own | HoldKind::Carry(_) => {
                    open.network.contains(&h.key())
                        && self
                            .state
                            .network
                            .hold_of(&h.key())
                            .is_some_and(|slot| slot.pod.devices == h.devices)
                }
            });
        same_network
            && members.len() == open.members.len()
            && members.iter().all(|m| {
                open.members.get(&m.member) == Some(&m.node)
                    && self
                        .state
                        .nodes
                        .get(&m.node)
                        .and_then(|entry| entry.usage.pods.get(&m.member))
                        .is_some_and(|slot| same_pod_but_handed_over(&slot.pod, &m.pod))
            })
    }

    /// A preemption's first phase (rule 14): all or nothing, the victims leave their
    /// nodes, the members are reserved on the room they leave, and placeholders hold
    /// the rest of that room for the victims until the decision
    /// ([`crate::ledger::displace`]). Checked on copies of the touched nodes as they
    /// would be after, so what it holds always fits, and an ABORT always can put the
    /// victims back.
    pub(super) fn reserve_displacing(
        &mut self,
        at_ms: u64,
        txn_id: TxnId,
        members: &[ReserveMember],
        victims: &[MemberKey],
        deadline_ms: u64,
    ) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.get(&txn_id) {
            return if self.is_same_displacing(open, members, victims) {
                Ok(LedgerReply::Reserved {
                    txn_id,
                    deadline_ms: open.deadline_ms,
                })
            } else {
                Err(LedgerError::TxnConflict { txn_id })
            };
        }
        if let Some(done) = self.state.finished.get(&txn_id) {
            return Ok(finished_answer(txn_id, done, Hold::Until(deadline_ms)));
        }
        if self.index.by_txn.contains_key(&txn_id) {
            return Ok(LedgerReply::AlreadyFinished {
                txn_id,
                outcome: TxnOutcome::Committed,
            });
        }
        validate_displacing(at_ms, txn_id, members, victims, deadline_ms)?;
        let placeholders = match self.displacing_plan(txn_id, members, victims, at_ms) {
            Ok(placeholders) => placeholders,
            Err(mut refusals) => {
                refusals.truncate(REFUSALS_KEPT_MAX);
                self.finish(txn_id, TxnOutcome::Refused, at_ms, refusals.clone());
                return Ok(LedgerReply::ReserveRefused { txn_id, refusals });
            }
        };
        let mut displaced = BTreeMap::new();
        for key in victims {
            let Some(node) = self.index.locations.get(key).cloned() else {
                continue;
            };
            if let Some(slot) = self.take_member(key) {
                displaced.insert(key.clone(), DisplacedSlot { node, slot });
            }
        }
        let mut held = BTreeMap::new();
        for m in members.iter().chain(&placeholders) {
            self.hold_member(m, SlotState::Reserved { txn_id });
            held.insert(m.member.clone(), m.node.clone());
        }
        let open = OpenTxn {
            members: held,
            deadline_ms,
            reserved_at_ms: at_ms,
            displaced,
            network: BTreeSet::new(),
        };
        self.state.open.insert(txn_id, open);
        Ok(LedgerReply::Reserved {
            txn_id,
            deadline_ms,
        })
    }

    /// The placeholders a preemption needs, or why it cannot be held: the victims must
    /// be committed or bound here, and the members, then the placeholders, must fit the
    /// touched nodes without the victims.
    pub(super) fn displacing_plan(
        &self,
        txn_id: TxnId,
        members: &[ReserveMember],
        victims: &[MemberKey],
        at_ms: u64,
    ) -> Result<Vec<ReserveMember>, Vec<Refusal>> {
        let refusal = |member: &MemberKey, node: &str, cause| Refusal {
            member: member.clone(),
            node: node.to_string(),
            cause,
        };
        let mut refusals = Vec::new();
        let mut victims_by_node: BTreeMap<&str, Vec<(&MemberKey, &PodSlot)>> = BTreeMap::new();
        for key in victims {
            let node = self.index.locations.get(key);
            let slot = node.and_then(|n| self.state.nodes.get(n)?.usage.pods.get(key));
            match (node, slot) {
                (Some(node), Some(slot))
                    if matches!(
                        slot.state,
                        SlotState::Committed { .. } | SlotState::Bound { .. }
                    ) =>
                {
                    victims_by_node.entry(node).or_default().push((key, slot));
                }
                (node, _) => refusals.push(refusal(
                    key,
                    node.map_or("", String::as_str),
                    RefusalCause::VictimNotPlaced,
                )),
            }
        }
        for (node, slots) in &victims_by_node {
            if let Some(entry) = self.state.nodes.get(node) {
                if let Some((key, claim)) = split_claim(slots, &entry.usage) {
                    let cause = RefusalCause::SharedClaimSplit { claim };
                    refusals.push(refusal(key, node, cause));
                }
            }
        }
        if !refusals.is_empty() {
            return Err(refusals);
        }
        let mut after: BTreeMap<&str, NodeUsage> = BTreeMap::new();
        for (node, slots) in &victims_by_node {
            if let Some(entry) = self.state.nodes.get(node) {
                let mut usage = entry.usage.clone();
                for (key, _) in slots {
                    usage.take(key);
                }
                after.insert(node, usage);
            }
        }
        let reserved = SlotState::Reserved { txn_id };
        for m in members {
            if let Some(node) = self.index.locations.get(&m.member) {
                let cause = RefusalCause::MemberHeld { node: node.clone() };
                refusals.push(refusal(&m.member, &m.node, cause));
                continue;
            }
            let Some(entry) = self.state.nodes.get(&m.node) else {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::UnknownNode));
                continue;
            };
            if entry.node.readiness == Readiness::NotReady {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::NodeNotReady));
                continue;
            }
            if entry.moving.is_some() {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::NodeMoving));
                continue;
            }
            let usage = after
                .entry(m.node.as_str())
                .or_insert_with(|| entry.usage.clone());
            let nothing = BatchLoad::default();
            match usage.refusal_at(&entry.node.allocatable, &nothing, &m.pod, Some(at_ms)) {
                Some(cause) => refusals.push(refusal(&m.member, &m.node, cause)),
                None => usage.hold(
                    m.member.clone(),
                    PodSlot {
                        pod: m.pod.clone(),
                        state: reserved,
                    },
                ),
            }
        }
        if !refusals.is_empty() {
            return Err(refusals);
        }
        let mut placeholders = Vec::new();
        for (node, slots) in &victims_by_node {
            let (Some(entry), Some(usage)) = (self.state.nodes.get(node), after.get_mut(node))
            else {
                continue;
            };
            let victim_pods: Vec<&PodSummary> = slots.iter().map(|(_, s)| &s.pod).collect();
            let member_pods: Vec<&PodSummary> = members
                .iter()
                .filter(|m| m.node == *node)
                .map(|m| &m.pod)
                .collect();
            for (key, pod) in displace::victim_room(txn_id, node, &victim_pods, &member_pods) {
                let nothing = BatchLoad::default();
                if usage
                    .refusal_at(&entry.node.allocatable, &nothing, &pod, None)
                    .is_some()
                {
                    refusals.push(refusal(&key, node, RefusalCause::VictimRoomNotHeld));
                    continue;
                }
                let slot = PodSlot {
                    pod: pod.clone(),
                    state: reserved,
                };
                usage.hold(key.clone(), slot);
                placeholders.push(ReserveMember {
                    member: key,
                    node: node.to_string(),
                    pod,
                });
            }
        }
        if refusals.is_empty() {
            Ok(placeholders)
        } else {
            Err(refusals)
        }
    }

    pub(super) fn is_same_displacing(
        &self,
        open: &OpenTxn,
        members: &[ReserveMember],
        victims: &[MemberKey],
    ) -> bool {
        let own = open
            .members
            .keys()
            .filter(|k| !displace::is_placeholder(k))
            .count();
        own == members.len()
            && victims.len() == open.displaced.len()
            && victims.iter().all(|v| open.displaced.contains_key(v))
            && members.iter().all(|m| {
                open.members.get(&m.member) == Some(&m.node)
                    && self.slot(&m.member).is_some_and(|slot| slot.pod == m.pod)
            })
    }

    /// Puts a displaced victim back on its node, as it was.
    pub(super) fn put_back(&mut self, key: &MemberKey, displaced: DisplacedSlot) {
        let txn_id = displaced.slot.state.txn_id();
        let node = displaced.node;
        let slot = displaced.slot;
        let held = self
            .state
            .nodes
            .update(&node, |entry| entry.usage.hold(key.clone(), slot));
        if held.is_none() {
            // Corrupted state: a node with a preemption's slots cannot be removed.
            panic!("displaced victim {key} belongs to node {node}, which is gone");
        }
        self.index.locations.insert(key.clone(), node);
        if let Some(txn_id) = txn_id {
            self.index
                .by_txn
                .entry(txn_id)
                .or_default()
                .insert(key.clone());
        }
    }

    /// Forgets displaced victims that `gone` names (a release that reached this shard
    /// while they were displaced), so that an ABORT does not put them back; returns them.
    pub(super) fn forget_displaced(
        &mut self,
        gone: impl Fn(&MemberKey, &PodSlot) -> bool,
    ) -> Vec<MemberKey> {
        let mut forgotten = Vec::new();
        for open in self.state.open.values_mut() {
            let mut gone_slots = Vec::new();
            open.displaced.retain(|key, d| {
                let keep = !gone(key, &d.slot);
                if !keep {
                    forgotten.push(key.clone());
                    gone_slots.push(d.clone());
                }
                keep
            });
            for d in gone_slots {
                hand_over_displaced(&mut open.displaced, &d);
            }
        }
        forgotten
    }

    /// Every member that cannot be held, checking the batch cumulatively per node. A
    /// shared claim a member uses through the reservation's network holds is not looked
    /// for on its node ([`ShardLedger::network_refusals`] checks it), and the member may
    /// not allocate it with its node's devices as well.
    pub(super) fn refusals(
        &self,
        members: &[ReserveMember],
        network: &[NetworkHold],
        at_ms: u64,
    ) -> Vec<Refusal> {
        let mut network_claims: BTreeMap<&MemberKey, BTreeSet<&str>> = BTreeMap::new();
        for h in network {
            if let HoldKind::Carry(claim) | HoldKind::Use(claim) = h.kind() {
                network_claims.entry(&h.member).or_default().insert(claim);
            }
        }
        let mut batches: BTreeMap<&str, BatchLoad> = BTreeMap::new();
        for m in members.iter().filter(|m| !m.pod.shares.is_empty()) {
            batches
                .entry(m.node.as_str())
                .or_default()
                .expect_carrier(&m.pod);
        }
        let nothing_yet = BatchLoad::default();
        let mut out = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let batch = batches.get(m.node.as_str()).unwrap_or(&nothing_yet);
            let cause = match network_claims.get(&m.member) {
                None => self.refusal_cause(m, batch, at_ms),
                Some(claims) => match m.pod.carried().find(|s| claims.contains(s.claim.as_str())) {
                    Some(share) => Some(RefusalCause::SharedClaimCarried {
                        claim: share.claim.clone(),
                    }),
                    None => {
                        let mut on_node = m.clone();
                        on_node
                            .pod
                            .shares
                            .retain(|s| !claims.contains(s.claim.as_str()));
                        self.refusal_cause(&on_node, batch, at_ms)
                    }
                },
            };
            match cause {
                Some(cause) => out.push(Refusal {
                    member: m.member.clone(),
                    node: m.node.clone(),
                    cause,
                }),
                // Only later members see what this one takes.
                None if i + 1 < members.len() => {
                    let batch = batches.entry(m.node.as_str()).or_default();
                    match self.state.nodes.get(&m.node) {
                        Some(entry) => batch.add_counted(&m.pod, &entry.usage.devices),
                        None => batch.add(&m.pod),
                    }
                }
                None => {}
            }
        }
        out
    }

    /// Why the network holds of a reservation cannot be taken: devices taken, sick or
    /// unknown here, or (for members placed on this shard) not reachable from their node.
    pub(super) fn network_refusals(
        &self,
        members: &[ReserveMember],
        network: &[NetworkHold],
        at_ms: u64,
    ) -> Vec<Refusal> {
        let node_of = |member: &MemberKey| {
            members
                .iter()
                .find(|m| m.member == *member)
                .map(|m| m.node.as_str())
        };
        let mut out: Vec<Refusal> = self
            .state
            .network
            .refusals(network, at_ms)
            .into_iter()
            .map(|(member, cause)| Refusal {
                node: node_of(&member).unwrap_or_default().to_string(),
                member,
                cause,
            })
            .collect();
        for hold in network {
            let Some(node) = node_of(&hold.member) else {
                continue;
            };
            let Some(entry) = self.state.nodes.get(node) else {
                continue;
            };
            // A shared claim's user reaches the devices its carrier holds.
            let devices = match hold.kind() {
                HoldKind::Use(claim) => network
                    .iter()
                    .find(|h| h.kind() == HoldKind::Carry(claim))
                    .map(|h| h.devices.as_slice())
                    .or_else(|| {
                        let slot = self.state.network.claim_hold(claim)?;
                        Some(slot.pod.devices.as_slice())
                    })
                    .unwrap_or_default(),
                HoldKind::Own | HoldKind::Carry(_) => &hold.devices,
            };
            let network = &self.state.network;
            let unreachable =
                (devices.iter()).find(|a| network.out_of_reach(&a.device, &entry.node));
            if let Some(a) = unreachable {
                out.push(Refusal {
                    member: hold.member.clone(),
                    node: node.to_string(),
                    cause: RefusalCause::DeviceUnreachable {
                        device: a.device.clone(),
                    },
                });
            }
        }
        out
    }

    /// Whether a transaction that is not open holds anything here (so it committed).
    pub(super) fn holds_committed(&self, txn_id: TxnId) -> bool {
        self.index.by_txn.contains_key(&txn_id) || self.state.network.holds_any(txn_id)
    }

    pub(super) fn refusal_cause(
        &self,
        m: &ReserveMember,
        batch: &BatchLoad,
        at_ms: u64,
    ) -> Option<RefusalCause> {
        if let Some(node) = self.index.locations.get(&m.member) {
            return Some(RefusalCause::MemberHeld { node: node.clone() });
        }
        let Some(entry) = self.state.nodes.get(&m.node) else {
            return Some(RefusalCause::UnknownNode);
        };
        if entry.node.readiness == Readiness::NotReady {
            return Some(RefusalCause::NodeNotReady);
        }
        if entry.moving.is_some() {
            return Some(RefusalCause::NodeMoving);
        }
        entry
            .usage
            .refusal_at(&entry.node.allocatable, batch, &m.pod, Some(at_ms))
    }

    pub(super) fn hold_member(&mut self, m: &ReserveMember, state: SlotState) {
        let slot = PodSlot {
            pod: m.pod.clone(),
            state,
        };
        let held = self
            .state
            .nodes
            .update(&m.node, |entry| entry.usage.hold(m.member.clone(), slot));
        if held.is_none() {
            return;
        }
        self.index
            .locations
            .insert(m.member.clone(), m.node.clone());
        if !self.state.moved_members.is_empty() {
            self.state.moved_members.remove(&m.member);
        }
        if let Some(txn_id) = state.txn_id() {
            self.index
                .by_txn
                .entry(txn_id)
                .or_default()
                .insert(m.member.clone());
        }
    }
}
