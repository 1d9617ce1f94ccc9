//! Reservations for the head of the line, the coordinator's side (docs/ARCHITECTURE.md
//! §4, "Reservations"): when one of the first groups in the order lacks room, it
//! chooses the nodes that group will find free soonest (from what is placed there and
//! when each declared it ends), records them in meta, and from then on plans every
//! other group without them unless the backfill rule (`gangway_core::plan::backfill`)
//! opens them to it. It also releases gRPC groups past their run-time limit, which the
//! rule relies on. Part of [`Coordinator`]'s `impl`.
//!
//! The reservations are meta's (a new leader's coordinator reads the same ones); this
//! keeps the copy read as each round starts, so every plan of a round sees the same
//! set. When one ends, the shards it held are counted as changed on the wake board, so
//! groups parked while its nodes were kept from them are tried again.

use std::time::Instant;

use super::*;
use crate::replicated::wake::WakeBoard;
use gangway_core::ledger::meta::{HeadReservation, RESERVATIONS_MAX, RESERVATION_TTL_MS_MAX};
use gangway_core::ledger::Wake;
use gangway_core::model::GangId;
use gangway_core::plan::backfill::{self, Candidate, ReservationMode};
use gangway_core::plan::parking::{what_helps, Helps};

/// Nodes a group may not be planned on, by shard.
pub type KeptNodes = BTreeMap<u32, Vec<String>>;

/// How long a reservation is made for when its group's start is unknown (some group on
/// its nodes declared no run-time limit), in ms; once it lapses, its group's next attempt
/// chooses again from what runs then.
pub const RESERVATION_TTL_MS: u64 = 600_000;
/// How long past its group's expected start a reservation holds, in ms: by then every
/// group on its nodes should have ended; if its group still waits, the next attempt
/// chooses again from what runs then.
pub const RESERVATION_GRACE_MS: u64 = 30_000;
/// How often a group's reservation is searched again for an earlier start, in ms.
pub const RESERVATION_REVIEW_MS: u64 = 10_000;
/// Most instants one search plans at (each one plan per shard).
pub const RESERVATION_SEARCH_INSTANTS_MAX: usize = 64;
/// How often placed gRPC groups are checked against their run-time limit, in ms.
pub const RUN_LIMIT_CHECK_MS: u64 = 250;
/// Most groups past their run-time limit read (and released) at once.
pub const OVERRUN_PER_ROUND_MAX: u32 = 256;
/// How much sooner than a reserved group's expected start a backfilled group's limit
/// must end, in ms: its placement is decided a little after it is planned, and a group
/// past its limit is released within [`RUN_LIMIT_CHECK_MS`] and a round.
pub const BACKFILL_MARGIN_MS: u64 = 1_000;
const _: () = assert!(RESERVATION_TTL_MS <= RESERVATION_TTL_MS_MAX);

/// The reservations as the current round sees them, and the mode.
pub(super) struct HeadOfLine {
    mode: ReservationMode,
    board: WakeBoard,
    /// Read from meta as the round started (and updated by the round's own writes).
    held: std::sync::Mutex<Vec<HeadReservation>>,
    /// Bug switch `coordinator-ignores-reservations`.
    ignored: bool,
    /// When placed groups were last checked against their run-time limit.
    limits_checked_at: std::sync::Mutex<Option<Instant>>,
}

impl HeadOfLine {
    pub(super) fn new(mode: ReservationMode, board: WakeBoard, ignored: bool) -> Self {
        Self {
            mode,
            board,
            held: std::sync::Mutex::new(Vec::new()),
            ignored,
            limits_checked_at: std::sync::Mutex::new(None),
        }
    }

    /// The same, counting ended reservations on `board`.
    pub(super) fn with_board(self, board: WakeBoard) -> Self {
        Self { board, ..self }
    }

    /// The same, in `mode`.
    pub(super) fn with_mode(self, mode: ReservationMode) -> Self {
        Self { mode, ..self }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<HeadReservation>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reservation `seq` holds, if any.
    pub(super) fn of(&self, seq: GroupSeq) -> Option<HeadReservation> {
        self.held().iter().find(|r| r.seq == seq).cloned()
    }

    /// The nodes `r` may not be planned on now, by shard.
    pub(super) fn kept_for(&self, r: &GroupRecord) -> KeptNodes {
        let held = self.held();
        if held.is_empty() || self.ignored {
            return KeptNodes::new();
        }
        let c = candidate(r);
        let now = now_ms() + BACKFILL_MARGIN_MS;
        let shards: BTreeSet<u32> = held.iter().flat_map(|h| h.nodes.keys().copied()).collect();
        shards
            .into_iter()
            .map(|s| (s, backfill::kept_from(&c, &held, self.mode, now, s)))
            .filter(|(_, nodes)| !nodes.is_empty())
            .collect()
    }

    /// Every reserved node, by shard: what a batch of groups is planned without (a
    /// group the rule lets in is planned again on its own).
    pub(super) fn batch_kept(&self) -> KeptNodes {
        if self.ignored {
            return KeptNodes::new();
        }
        backfill::all_reserved(&self.held())
    }

    /// Drops `seq`'s reservation from this round's copy (meta ended it); its shards count
    /// as changed.
    fn forget(&self, seq: GroupSeq) {
        let mut held = self.held();
        for h in held.iter().filter(|h| h.seq == seq) {
            for shard in h.nodes.keys() {
                self.board.note(*shard, Wake::EVERYTHING);
            }
        }
        held.retain(|h| h.seq != seq);
    }

    /// The groups holding reservations that come after `r` in the order (priority, then
    /// submission), last one last.
    pub(super) fn behind(&self, r: &GroupRecord) -> Vec<GroupSeq> {
        let key = |priority: i32, seq: GroupSeq| (-i64::from(priority), seq);
        let mine = key(r.highest_priority(), r.seq);
        let mut later: Vec<(i64, GroupSeq)> = self
            .held()
            .iter()
            .map(|h| key(h.priority, h.seq))
            .filter(|k| *k > mine)
            .collect();
        later.sort_unstable();
        later.into_iter().map(|(_, seq)| seq).collect()
    }

    /// Takes the reservations meta holds now; the shards of those that ended (or lost
    /// nodes) since count as changed, so the groups they kept out are tried again.
    fn replace(&self, now: Vec<HeadReservation>) {
        let mut held = self.held();
        for old in held.iter() {
            let still = now.iter().find(|r| r.seq == old.seq);
            for (shard, nodes) in &old.nodes {
                let kept_all = still
                    .and_then(|r| r.nodes.get(shard))
                    .is_some_and(|n| nodes.iter().all(|x| n.contains(x)));
                if !kept_all {
                    self.board.note(*shard, Wake::EVERYTHING);
                }
            }
        }
        *held = now;
    }
}

/// What the backfill rule needs of `r`.
fn candidate(r: &GroupRecord) -> Candidate {
    Candidate {
        seq: r.seq,
        priority: r.highest_priority(),
        run_limit_ms: r.group.run_limit_ms,
    }
}

/// Whether `start` is earlier than `than` (an unknown start is the latest).
fn earlier(start: Option<u64>, than: Option<u64>) -> bool {
    match (start, than) {
        (Some(a), Some(b)) => a < b,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The nodes an assignment places members on, by shard, in name order.
fn nodes_of(a: &Assignment) -> BTreeMap<u32, Vec<String>> {
    a.per_shard
        .iter()
        .map(|(shard, members)| {
            let nodes: BTreeSet<String> = members.iter().map(|m| m.node.clone()).collect();
            (*shard, nodes.into_iter().collect())
        })
        .filter(|(_, nodes): &(u32, Vec<String>)| !nodes.is_empty())
        .collect()
}

impl Coordinator {
    /// Whether reservations are on.
    pub(super) fn reserves(&self) -> bool {
        self.head_of_line.mode != ReservationMode::Off
    }

    /// As a round starts: reads the reservations meta holds (ending them all when
    /// reservations are off, as after a restart with the flag changed).
    pub(super) async fn refresh_reservations(&self) -> Result<(), GroupError> {
        let now = now_ms();
        let held = match self
            .groups
            .meta_query_local(&MetaQuery::HeadReservations { at_ms: now })?
        {
            MetaReply::HeadReservations { reservations } => reservations,
            _ => Vec::new(),
        };
        if !self.reserves() && !held.is_empty() {
            for r in &held {
                self.groups
                    .meta(&MetaCommand::EndHeadReservation {
                        seq: r.seq,
                        at_ms: now,
                    })
                    .await?;
            }
            self.head_of_line.replace(Vec::new());
            return Ok(());
        }
        self.head_of_line.replace(held);
        Ok(())
    }

    /// Every [`RUN_LIMIT_CHECK_MS`]: releases the placed gRPC groups past their run-time
    /// limit (a Kubernetes group's kubelets stop its pods at theirs, and its pods
    /// leaving free the room).
    pub(super) async fn end_overrun_groups(&self) -> Result<(), GroupError> {
        if !take_if_due(&self.head_of_line.limits_checked_at, RUN_LIMIT_CHECK_MS) {
            return Ok(());
        }
        let now = now_ms();
        let overrun = MetaQuery::Overrun {
            at_ms: now,
            limit: OVERRUN_PER_ROUND_MAX,
        };
        let MetaReply::PlacedEnds { groups } = self.groups.meta_query_local(&overrun)? else {
            return Ok(());
        };
        for g in groups.iter().filter(|g| !g.kubernetes) {
            tracing::info!(
                group = g.seq,
                "releasing a gang group past its run-time limit"
            );
            self.groups
                .meta(&MetaCommand::Release {
                    seq: g.seq,
                    at_ms: now,
                })
                .await?;
        }
        Ok(())
    }

    /// After `r` fell short for lack of room (and began no preemption): the reservation
    /// it holds from now on, made or renewed here. A group that holds none gets one when
    /// fewer than [`RESERVATIONS_MAX`] are held and some shard lacked room (not only
    /// nodes that match); one that holds one has it searched again every
    /// [`RESERVATION_REVIEW_MS`] and replaced when an earlier start is found.
    pub(super) async fn reserve_for(
        &self,
        r: &GroupRecord,
        plans: &BTreeMap<u32, GangPlacement>,
    ) -> Option<HeadReservation> {
        if !self.reserves() || !r.holds_nothing() {
            return None;
        }
        let now = now_ms();
        let existing = self.head_of_line.of(r.seq);
        match &existing {
            Some(held) if now < held.made_at_ms.saturating_add(RESERVATION_REVIEW_MS) => {
                return existing;
            }
            // Full of groups ahead of it: it waits its turn.
            None if self.head_of_line.behind(r).is_empty()
                && self.head_of_line.held().len() >= RESERVATIONS_MAX =>
            {
                return None
            }
            _ => {}
        }
        let lacks_room = what_helps(plans, self.shards.ids())
            .is_some_and(|helps| helps.values().any(|h| *h == Helps::NodesOrRoom));
        if existing.is_none() && !lacks_room {
            return None;
        }
        let found = match self.search(r).await {
            Ok(found) => found?,
            Err(e) => {
                tracing::debug!(group = r.seq, error = %e, "no reservation searched");
                return existing;
            }
        };
        let (nodes, starts_by_ms) = found;
        if let Some(old) = &existing {
            if !earlier(starts_by_ms, old.starts_by_ms) {
                return existing;
            }
        }
        if let Err(e) = self.displace_behind(r, &nodes, existing.is_some()).await {
            tracing::debug!(group = r.seq, error = %e, "reservations behind it not ended");
            return existing;
        }
        let now = now_ms();
        let expires_at_ms = match starts_by_ms {
            Some(start) => start
                .saturating_add(RESERVATION_GRACE_MS)
                .clamp(now + 1, now + RESERVATION_TTL_MS),
            None => now + RESERVATION_TTL_MS,
        };
        let reservation = HeadReservation {
            seq: r.seq,
            priority: r.highest_priority(),
            nodes,
            starts_by_ms,
            preempts_below: (preempt::may_preempt(r) && r.group.preempts_within.is_none())
                .then(|| r.highest_priority()),
            made_at_ms: now,
            expires_at_ms,
        };
        let reply = self
            .groups
            .meta(&MetaCommand::ReserveForHead {
                reservation: reservation.clone(),
            })
            .await;
        match reply {
            Ok(MetaReply::HeadReservations { .. }) => {
                tracing::info!(
                    group = r.seq,
                    nodes = reservation.node_count(),
                    starts_in_ms = starts_by_ms.map(|s| s.saturating_sub(now)),
                    "reserved room for the head of the line"
                );
                metrics::counter!("gangway_reservations_made_total").increment(1);
                let mut held = self.head_of_line.held();
                held.retain(|h| h.seq != r.seq);
                held.push(reservation.clone());
                Some(reservation)
            }
            other => {
                tracing::debug!(group = r.seq, reply = ?other, "reservation not recorded");
                existing
            }
        }
    }

    /// Ends the reservations of groups behind `r` in the order that hold any of `nodes`,
    /// and, when no slot is left for it (it `holds` none yet), the last one's: the slots
    /// go to the first groups in the order.
    async fn displace_behind(
        &self,
        r: &GroupRecord,
        nodes: &BTreeMap<u32, Vec<String>>,
        holds: bool,
    ) -> Result<(), GroupError> {
        let wanted: BTreeSet<&String> = nodes.values().flatten().collect();
        let behind = self.head_of_line.behind(r);
        let held = self.head_of_line.held().clone();
        let mut ended: Vec<GroupSeq> = held
            .iter()
            .filter(|h| behind.contains(&h.seq) && h.all_nodes().any(|n| wanted.contains(n)))
            .map(|h| h.seq)
            .collect();
        if !holds && held.len() - ended.len() >= RESERVATIONS_MAX {
            if let Some(last) = behind.iter().rev().find(|s| !ended.contains(s)) {
                ended.push(*last);
            }
        }
        for seq in ended {
            tracing::debug!(
                group = seq,
                before = r.seq,
                "reservation given to a group ahead"
            );
            self.groups
                .meta(&MetaCommand::EndHeadReservation {
                    seq,
                    at_ms: now_ms(),
                })
                .await?;
            self.head_of_line.forget(seq);
        }
        Ok(())
    }

    /// Where `r` will fit soonest, and when: the earliest declared end of the placed
    /// groups by which, with every group ending by then gone, every shard's plans place it
    /// whole (at most [`RESERVATION_SEARCH_INSTANTS_MAX`] instants, by halving); failing
    /// that, where it would go with every placed group gone, with no known start. None
    /// when it fits nowhere even then (its constraints, not room, hold it back).
    async fn search(
        &self,
        r: &GroupRecord,
    ) -> Result<Option<(BTreeMap<u32, Vec<String>>, Option<u64>)>, GroupError> {
        let MetaReply::PlacedEnds { groups: placed } =
            self.groups.meta_query_local(&MetaQuery::PlacedEnds)?
        else {
            return Ok(None);
        };
        let members = self.members_to_plan(r);
        let topologies = listed_topologies(&r.group.gangs);
        // The reservations of groups ahead of it stay out of its choice; those of groups
        // behind it give way (`displace_behind`).
        let behind = self.head_of_line.behind(r);
        let kept: KeptNodes = backfill::all_reserved(
            &self
                .head_of_line
                .held()
                .iter()
                .filter(|h| h.seq != r.seq && !behind.contains(&h.seq))
                .cloned()
                .collect::<Vec<_>>(),
        );
        let fits = |gone: Vec<GangId>| {
            let members = &members;
            let topologies = &topologies;
            let kept = &kept;
            async move {
                let plans = self.plans_without(members, &gone, topologies, kept).await;
                match assign(&r.group, &plans, &BTreeSet::new()) {
                    AssignOutcome::Ready(a) => Some(nodes_of(&a)),
                    AssignOutcome::Short { .. } => None,
                }
            }
        };
        let instants =
            backfill::search_instants(&placed, now_ms(), RESERVATION_SEARCH_INSTANTS_MAX);
        let latest = match instants.last() {
            Some(last) => fits(backfill::gone_by(&placed, *last)).await,
            None => None,
        };
        let Some(mut best) = latest else {
            let every: Vec<GangId> = placed.iter().flat_map(|p| p.gangs.clone()).collect();
            return Ok(fits(every).await.map(|nodes| (nodes, None)));
        };
        // The earliest instant that fits: ends only add room, so fitting is monotone.
        let (mut lo, mut hi) = (0usize, instants.len() - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match fits(backfill::gone_by(&placed, instants[mid])).await {
                Some(nodes) => {
                    best = nodes;
                    hi = mid;
                }
                None => lo = mid + 1,
            }
        }
        // `best` is the plan at `hi`, which always fits (the latest instant at first).
        Ok(Some((best, Some(instants[lo]))))
    }
}
