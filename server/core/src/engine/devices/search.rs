//! The search: a bounded backtracking allocation of every request of a pod's claims
//! over the node's candidate devices, honouring constraints and shared counters. Part
//! of `engine/devices.rs`.

use super::*;

/// The search ran out of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Abort;

/// What one constraint has seen so far in the current allocation.
#[derive(Debug, Clone, Default)]
pub(super) struct ConstraintSeen {
    pub(super) values: Vec<AttributeValue>,
}

/// Backtracking allocation of one pod's claims on one node, over held + planned +
/// earlier copies.
pub(super) struct Search<'t, 'a, 'd> {
    pub(super) table: &'t Table<'a>,
    pub(super) claims: &'t [ClaimRef<'d>],
    pub(super) candidates: &'t NodeCandidates,
    /// Flattened request → claim position.
    pub(super) claim_of: Vec<usize>,
    /// Extra holders per slot (planned, earlier copies, current picks).
    pub(super) holders: Vec<u32>,
    /// Extra consumption per slot, parallel to the device's capacity.
    pub(super) consumed: Vec<Vec<DeviceQuantity>>,
    /// Extra counter use, by counter position.
    pub(super) counters: Vec<DeviceQuantity>,
    /// Devices per claim in the current allocation.
    pub(super) claim_devices: Vec<u32>,
    /// Per claim, per constraint.
    pub(super) seen: Vec<Vec<ConstraintSeen>>,
    pub(super) picks: Vec<Pick>,
    /// Chosen alternative per flattened request.
    pub(super) chosen: Vec<usize>,
    /// Per claim, the one source its devices come from (claims of
    /// [`ClaimReach::OneSource`] only, while it is being allocated).
    pub(super) source: Vec<Option<DeviceSource>>,
    /// Whether the table has network-attached devices.
    pub(super) has_network: bool,
    pub(super) steps: u64,
}

impl<'t, 'a, 'd> Search<'t, 'a, 'd> {
    pub(super) fn new(
        table: &'t Table<'a>,
        claims: &'t [ClaimRef<'d>],
        candidates: &'t NodeCandidates,
    ) -> Self {
        let claim_of: Vec<usize> = claims
            .iter()
            .enumerate()
            .flat_map(|(c, claim)| std::iter::repeat_n(c, claim.requests.len()))
            .collect();
        Self {
            table,
            claims,
            candidates,
            chosen: vec![0; claim_of.len()],
            claim_of,
            holders: vec![0; table.slots.len()],
            consumed: table
                .slots
                .iter()
                .map(|s| vec![DeviceQuantity::ZERO; s.device.capacity.len()])
                .collect(),
            counters: vec![DeviceQuantity::ZERO; table.counters.len()],
            claim_devices: vec![0; claims.len()],
            seen: claims
                .iter()
                .map(|c| vec![ConstraintSeen::default(); c.constraints.len()])
                .collect(),
            picks: Vec::new(),
            source: vec![None; claims.len()],
            has_network: table
                .slots
                .iter()
                .any(|s| s.source == DeviceSource::Network),
            steps: 0,
        }
    }

    /// Counts allocations planned earlier in the round as taken.
    pub(super) fn preload<'p>(&mut self, planned: impl Iterator<Item = &'p DeviceAllocation>) {
        for a in planned {
            if a.admin_access == AdminAccess::Enabled {
                continue;
            }
            let Some(slot) = self.table.position(&a.device) else {
                continue;
            };
            let amounts: Vec<DeviceQuantity> = self.table.slots[slot]
                .device
                .capacity
                .keys()
                .map(|name| {
                    a.consumed_capacity
                        .get(name.as_str())
                        .copied()
                        .unwrap_or_default()
                })
                .collect();
            self.take(slot, &amounts);
        }
    }

    pub(super) fn in_use(&self, slot: usize) -> bool {
        self.table.slots[slot].base_holders + self.holders[slot] > 0
    }

    pub(super) fn take(&mut self, slot: usize, amounts: &[DeviceQuantity]) {
        if !self.in_use(slot) {
            for &(pos, amount) in &self.table.slots[slot].counters {
                self.counters[pos] = self.counters[pos]
                    .checked_add(&amount)
                    .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
            }
        }
        self.holders[slot] += 1;
        for (q, amount) in self.consumed[slot].iter_mut().zip(amounts) {
            *q = q
                .checked_add(amount)
                .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
        }
    }

    pub(super) fn untake(&mut self, slot: usize, amounts: &[DeviceQuantity]) {
        self.holders[slot] = self.holders[slot].saturating_sub(1);
        for (q, amount) in self.consumed[slot].iter_mut().zip(amounts) {
            *q = q.saturating_sub(amount);
        }
        if !self.in_use(slot) {
            for &(pos, amount) in &self.table.slots[slot].counters {
                self.counters[pos] = self.counters[pos].saturating_sub(&amount);
            }
        }
    }

    /// One more allocation of every claim beside everything counted so far; its picks
    /// stay counted (so the next call allocates the next copy).
    pub(super) fn allocate(&mut self) -> Result<Option<Vec<Pick>>, Abort> {
        self.picks.clear();
        self.steps = 0;
        for n in &mut self.claim_devices {
            *n = 0;
        }
        for source in &mut self.source {
            *source = None;
        }
        for claim in &mut self.seen {
            for seen in claim.iter_mut() {
                seen.values.clear();
            }
        }
        if self.request(0)? {
            Ok(Some(self.picks.clone()))
        } else {
            Ok(None)
        }
    }

    /// The firstAvailable preference of the current picks; where the cluster has
    /// network-attached pools (`network`), then, at a lower rank, how few network
    /// devices they take: a node that serves a pod from its own devices leaves the
    /// network's, which many nodes can use, to pods that have nothing else (gangway's
    /// addition to DynamicResources scoring; upstream scores firstAvailable only).
    pub(super) fn score(&self, network: bool) -> u32 {
        let preference = self.preference();
        if !network {
            return preference;
        }
        let taken = self
            .picks
            .iter()
            .filter(|p| self.table.slots[p.slot].source == DeviceSource::Network)
            .count();
        let taken = u32::try_from(taken).map_or(NETWORK_PICKS_SCORED_MAX, |n| {
            n.min(NETWORK_PICKS_SCORED_MAX)
        });
        preference
            .saturating_mul(NETWORK_PICKS_SCORED_MAX + 1)
            .saturating_add(NETWORK_PICKS_SCORED_MAX - taken)
    }

    /// The firstAvailable preference of the current picks.
    pub(super) fn preference(&self) -> u32 {
        let mut score = 0;
        for (r, &alternative) in self.chosen.iter().enumerate() {
            if let Some((_, request)) = flat_request(self.claims, r) {
                if request.prioritized {
                    let index = u32::try_from(alternative).unwrap_or(u32::MAX);
                    score += FIRST_AVAILABLE_SCORE_BASE.saturating_sub(index);
                }
            }
        }
        score
    }

    pub(super) fn request(&mut self, r: usize) -> Result<bool, Abort> {
        let claims = self.claims;
        let Some((claim, _)) = flat_request(claims, r) else {
            return Ok(true);
        };
        let c = self.claim_of[r];
        let first = r == 0 || self.claim_of[r - 1] != c;
        if !(first && claim.reach == ClaimReach::OneSource) {
            return self.alternatives(r);
        }
        // The node's devices first, else the network-attached ones.
        for source in [DeviceSource::Node, DeviceSource::Network] {
            if source == DeviceSource::Network && !self.has_network {
                continue;
            }
            self.source[c] = Some(source);
            if self.alternatives(r)? {
                return Ok(true);
            }
        }
        self.source[c] = None;
        Ok(false)
    }

    /// Tries each alternative of request `r` in order.
    pub(super) fn alternatives(&mut self, r: usize) -> Result<bool, Abort> {
        let claims = self.claims;
        let Some((_, need)) = flat_request(claims, r) else {
            return Ok(true);
        };
        for a in 0..need.alternatives.len() {
            self.chosen[r] = a;
            if self.device(r, a, 0, 0)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Picks device `k` of request `r`, alternative `a`, among candidates from `from`.
    pub(super) fn device(
        &mut self,
        r: usize,
        a: usize,
        k: usize,
        from: usize,
    ) -> Result<bool, Abort> {
        let candidates: &'t NodeCandidates = self.candidates;
        let Some(list) = candidates.lists.get(r).and_then(|l| l.get(a)) else {
            return Ok(false);
        };
        let claims = self.claims;
        let Some((_, need)) = flat_request(claims, r) else {
            return Ok(false);
        };
        let Some(alternative) = need.alternatives.get(a) else {
            return Ok(false);
        };
        let source = self.source[self.claim_of[r]];
        let table = self.table;
        let admits = |pos: usize| source.is_none_or(|s| table.slots[list[pos]].source == s);
        let (wanted, every) = match alternative.mode {
            AllocationMode::ExactCount(n) => (n as usize, false),
            AllocationMode::All => ((0..list.len()).filter(|&p| admits(p)).count(), true),
        };
        if wanted == 0 {
            return Ok(false);
        }
        if k == wanted {
            return self.request(r + 1);
        }
        let range = if every {
            match (from..list.len()).find(|&p| admits(p)) {
                Some(pos) => pos..pos + 1,
                None => return Ok(false),
            }
        } else {
            from..list.len()
        };
        for pos in range {
            if !every && list.len() - pos < wanted - k {
                break;
            }
            if !admits(pos) {
                continue;
            }
            self.steps += 1;
            if self.steps > SEARCH_STEPS_MAX {
                return Err(Abort);
            }
            let slot = list[pos];
            if self.try_take(r, alternative, slot).is_some() {
                if self.device(r, a, k + 1, pos + 1)? {
                    return Ok(true);
                }
                self.release_last();
            }
        }
        Ok(false)
    }

    /// Takes `slot` for request `r` if it is free enough, has counters left and keeps
    /// the claim's constraints; records the pick.
    pub(super) fn try_take(
        &mut self,
        r: usize,
        alternative: &Alternative,
        slot: usize,
    ) -> Option<()> {
        let claim = self.claim_of[r];
        if self.claim_devices[claim] >= CLAIM_DEVICES_MAX {
            return None;
        }
        let table = self.table;
        let s = &table.slots[slot];
        let mut amounts = Vec::new();
        if alternative.admin == AdminAccess::Disabled {
            match s.device.sharing {
                AllocationSharing::Exclusive => {
                    if self.in_use(slot) {
                        return None;
                    }
                }
                AllocationSharing::Shared => {
                    for (i, (name, capacity)) in s.device.capacity.iter().enumerate() {
                        let requested = requested_of(s.driver, name, &alternative.capacity);
                        let amount = capacity.consumed_by(requested)?;
                        let total = s.base_consumed[i]
                            .checked_add(&self.consumed[slot][i])?
                            .checked_add(&amount)?;
                        if total > capacity.value {
                            return None;
                        }
                        amounts.push(amount);
                    }
                }
            }
            if !self.in_use(slot) {
                for &(pos, amount) in &s.counters {
                    let counter = table.counters[pos];
                    let used = counter
                        .used
                        .checked_add(&self.counters[pos])?
                        .checked_add(&amount)?;
                    if used > counter.total {
                        return None;
                    }
                }
            }
        }
        let claims = self.claims;
        let (claim_ref, need) = flat_request(claims, r)?;
        let sub = alternative.sub.as_deref();
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if !constraint.applies(&need.name, sub) {
                continue;
            }
            let value = s.device.attribute(s.driver, constraint.attribute())?;
            let seen = &self.seen[claim][c].values;
            // Values are sets (a scalar is a set of one, DRAListTypeAttributes): matched
            // devices share a value, distinct ones none pairwise.
            let ok = match constraint.rule {
                ConstraintRule::MatchAttribute(_) => {
                    seen.is_empty()
                        || value
                            .items()
                            .into_iter()
                            .any(|item| seen.iter().all(|v| v.holds(item)))
                }
                ConstraintRule::DistinctAttribute(_) => !seen.iter().any(|v| v.overlaps(value)),
            };
            if !ok {
                return None;
            }
        }
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if constraint.applies(&need.name, sub) {
                if let Some(value) = s.device.attribute(s.driver, constraint.attribute()) {
                    self.seen[claim][c].values.push(value.clone());
                }
            }
        }
        if alternative.admin == AdminAccess::Disabled {
            self.take(slot, &amounts);
        }
        self.claim_devices[claim] += 1;
        self.picks.push(Pick {
            request: r,
            alternative: self.chosen[r],
            slot,
            consumed: amounts,
        });
        Some(())
    }

    /// Undoes the last pick.
    pub(super) fn release_last(&mut self) {
        let Some(pick) = self.picks.pop() else {
            return;
        };
        let claim = self.claim_of[pick.request];
        self.claim_devices[claim] = self.claim_devices[claim].saturating_sub(1);
        let claims = self.claims;
        let Some((claim_ref, need)) = flat_request(claims, pick.request) else {
            return;
        };
        let Some(alternative) = need.alternatives.get(pick.alternative) else {
            return;
        };
        let sub = alternative.sub.as_deref();
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if constraint.applies(&need.name, sub) {
                self.seen[claim][c].values.pop();
            }
        }
        if alternative.admin == AdminAccess::Disabled {
            self.untake(pick.slot, &pick.consumed);
        }
    }
}
