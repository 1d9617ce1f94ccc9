//! The election gate: who may campaign in a group, and when.
//!
//! openraft 0.9 has no pre-vote. Without this gate, a replica cut off from its
//! peers keeps starting elections, and each one raises its term. When the link
//! heals, that higher term makes the healthy leaders step down: a second
//! outage, after the first one has ended. Here every replica pings each peer
//! every [`REACH_PING_MS`]; a peer counts as reachable while a ping answered
//! within the last [`REACH_WINDOW_MS`]. A ping needs both directions, so
//! one-way loss counts as unreachable. The gate also carries a leader
//! transfer's hold (a voter that promised its vote to the transfer target).
//!
//! Pings also say who should campaign, and when. Each answer carries, per
//! group, the peer's last log id and the leader it hears (one that answered
//! its pings and said it leads). From those ([`decide`]):
//! - While a voter in reach hears a leader, this replica does not campaign.
//!   This is what pre-vote gives: a replica back from a pause, whose election
//!   timer fired while it slept, would otherwise depose a healthy leader.
//! - Once nobody in reach hears a leader, only the voter with the longest log
//!   in reach (the lowest id among equals) campaigns. Left to openraft's
//!   timers, the follower whose timer fires first campaigns even when a peer
//!   holds a longer log; that peer refuses its vote, the two split the next
//!   term, and the group stays leaderless for two or three election timeouts.
//! - That voter campaigns as soon as the leader lease has surely run out on
//!   every voter, instead of a random election timeout after it. A vote given
//!   or seen in the meantime restarts the wait (an election is under way, and
//!   campaigning over it would depose its winner).
//!
//! Invariants: elections are enabled in a group only while self plus reachable
//! voters form a majority, no transfer hold runs and no voter in reach hears a
//! leader; a restraint in favour of a longer log lasts at most
//! [`GateTiming::restraint_max_ms`] of silence, so a designated candidate that
//! never campaigns cannot stall the group. A leader transfer's own election is
//! started directly and is not gated. Owned by the host (`RaftHost::start`
//! spawns the ping and gate loops; they stop at shutdown).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::types::{GroupId, LogId, NodeId, Vote};

/// Interval between pings to each peer, and between gate updates.
pub const REACH_PING_MS: u64 = 50;
/// A peer is reachable while it answered a ping this recently; also a ping's timeout.
pub const REACH_WINDOW_MS: u64 = 200;
/// Margin past the leader lease before the designated voter campaigns: covers a
/// heartbeat that reached a peer up to one ping interval after the leader last
/// answered this replica, plus scheduling delay.
pub const CAMPAIGN_SLACK_MS: u64 = 150;

/// What a peer said of one group in a ping answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerGroupView {
    /// The peer's last log id in the group.
    pub(crate) last_log: Option<LogId>,
    /// The leader the peer hears (itself if it leads).
    pub(crate) leader: Option<NodeId>,
}

/// A peer's last ping answer.
struct Answer {
    at: Instant,
    groups: BTreeMap<GroupId, PeerGroupView>,
}

impl Answer {
    /// Whether it came within the window before `now`.
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) <= Duration::from_millis(REACH_WINDOW_MS)
    }
}

/// Which peers answered pings, when, and what they said.
#[derive(Default)]
pub(crate) struct Reachability {
    answered: Mutex<HashMap<NodeId, Answer>>,
    in_flight: Mutex<HashSet<NodeId>>,
}

impl Reachability {
    /// Records that `peer` answered a ping now, with its view of each group.
    pub(crate) fn answered(&self, peer: NodeId, groups: BTreeMap<GroupId, PeerGroupView>) {
        if let Ok(mut a) = self.answered.lock() {
            a.insert(
                peer,
                Answer {
                    at: Instant::now(),
                    groups,
                },
            );
        }
    }

    /// When `peer` last answered a ping.
    pub(crate) fn last_answer(&self, peer: NodeId) -> Option<Instant> {
        self.answered.lock().ok()?.get(&peer).map(|a| a.at)
    }

    /// Whether `peer` is reachable and said it leads `group`.
    pub(crate) fn leads(&self, peer: NodeId, group: GroupId, now: Instant) -> bool {
        self.answered.lock().is_ok_and(|a| {
            a.get(&peer).is_some_and(|ans| {
                ans.fresh(now)
                    && ans
                        .groups
                        .get(&group)
                        .is_some_and(|v| v.leader == Some(peer))
            })
        })
    }

    /// The reachable peers' views of `group` (a peer that did not report the
    /// group is left out).
    pub(crate) fn views(&self, group: GroupId, now: Instant) -> Vec<(NodeId, PeerGroupView)> {
        let Ok(a) = self.answered.lock() else {
            return Vec::new();
        };
        a.iter()
            .filter(|(_, ans)| ans.fresh(now))
            .filter_map(|(peer, ans)| ans.groups.get(&group).map(|v| (*peer, *v)))
            .collect()
    }

    /// Marks a ping to `peer` as started; false if one is already in flight.
    pub(crate) fn start_ping(&self, peer: NodeId) -> bool {
        self.in_flight
            .lock()
            .map(|mut f| f.insert(peer))
            .unwrap_or(false)
    }

    /// Marks the ping to `peer` as ended.
    pub(crate) fn end_ping(&self, peer: NodeId) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.remove(&peer);
        }
    }
}

/// Whether `me`, with the reachable voters, is a majority of `voters` (always
/// true for a replica that is no voter: it never campaigns anyway).
pub(crate) fn majority_reachable(
    me: NodeId,
    voters: &[NodeId],
    reachable: impl Fn(NodeId) -> bool,
) -> bool {
    if !voters.contains(&me) {
        return true;
    }
    let reach = voters
        .iter()
        .filter(|v| **v == me || reachable(**v))
        .count();
    reach * 2 > voters.len()
}

/// This replica's part in a group, as the gate sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// It leads the group.
    Leader,
    /// It is campaigning.
    Candidate,
    /// It follows (or is a learner, or is stopping).
    Follower,
}

/// The timing the gate decides with, all in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateTiming {
    /// openraft's leader lease (its election timeout max): how long a voter
    /// refuses other candidates after last hearing its leader.
    pub(crate) lease_ms: u64,
    /// How long, from the leader going silent, a shorter log defers to a
    /// longer one; after that every voter campaigns on its own timer.
    pub(crate) restraint_max_ms: u64,
}

impl GateTiming {
    /// The gate's timing for a group whose election timeout max is `election_max_ms`.
    pub(crate) fn for_election_max(election_max_ms: u64) -> Self {
        Self {
            lease_ms: election_max_ms,
            restraint_max_ms: 3 * election_max_ms,
        }
    }
}

/// Everything the gate knows of one group on this replica.
#[derive(Debug, Clone)]
pub(crate) struct GateInput {
    /// This replica.
    pub(crate) me: NodeId,
    /// The group's voters.
    pub(crate) voters: Vec<NodeId>,
    /// This replica's last log id in the group.
    pub(crate) last_log: Option<LogId>,
    /// Its role.
    pub(crate) role: Role,
    /// The reachable peers and what they said of the group.
    pub(crate) peers: Vec<(NodeId, PeerGroupView)>,
    /// A leader transfer asked this voter not to campaign for now.
    pub(crate) held: bool,
    /// How long this replica has gone without hearing a leader (None: it hears one).
    pub(crate) leader_silent_ms: Option<u64>,
}

/// Why elections are enabled or not in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateReason {
    /// This replica may campaign.
    MayCampaign,
    /// Self plus reachable voters are no majority.
    OutOfReach,
    /// A leader transfer asked this voter to hold.
    TransferHold,
    /// A voter in reach hears this leader.
    LeaderHeard(NodeId),
    /// The leader is silent and this peer holds a longer log (or an equal one and a lower id).
    DefersTo(NodeId),
}

/// The gate's verdict for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateDecision {
    /// Whether openraft's election timer may start elections.
    pub(crate) enable: bool,
    /// Whether to start an election now, ahead of the timer.
    pub(crate) campaign_now: bool,
    /// Why `enable` is what it is.
    pub(crate) reason: GateReason,
}

/// Decides whether this replica may campaign in a group, and whether it should
/// campaign right away. Pure: the host gathers the input each tick.
pub(crate) fn decide(input: &GateInput, timing: GateTiming) -> GateDecision {
    let in_reach = majority_reachable(input.me, &input.voters, |p| {
        input.peers.iter().any(|(q, _)| *q == p)
    });
    let voter_peers = || {
        input
            .peers
            .iter()
            .filter(|(p, _)| *p != input.me && input.voters.contains(p))
    };
    let heard = voter_peers()
        .filter_map(|(_, v)| v.leader)
        .find(|l| *l != input.me);
    // openraft grants a vote only to a candidate whose last log id is at least
    // the voter's own; among equals the lowest id goes first.
    let mine = (input.last_log, std::cmp::Reverse(input.me));
    let longer = voter_peers()
        .filter(|(p, v)| (v.last_log, std::cmp::Reverse(*p)) > mine)
        .max_by_key(|(p, v)| (v.last_log, std::cmp::Reverse(*p)))
        .map(|(p, _)| *p);
    let silent_ms = input.leader_silent_ms;
    let restrained_by = longer.filter(|_| silent_ms.is_some_and(|ms| ms < timing.restraint_max_ms));
    let reason = if !in_reach {
        GateReason::OutOfReach
    } else if input.held {
        GateReason::TransferHold
    } else if let Some(l) = heard {
        GateReason::LeaderHeard(l)
    } else if let Some(p) = restrained_by {
        GateReason::DefersTo(p)
    } else {
        GateReason::MayCampaign
    };
    let enable = reason == GateReason::MayCampaign;
    let campaign_now = enable
        && longer.is_none()
        && input.role == Role::Follower
        && input.voters.contains(&input.me)
        && input.voters.len() > 1
        && silent_ms.is_some_and(|ms| ms >= timing.lease_ms + CAMPAIGN_SLACK_MS);
    GateDecision {
        enable,
        campaign_now,
        reason,
    }
}

/// The gate's memory per group, so openraft is told only of changes.
#[derive(Default)]
pub(crate) struct GateState {
    /// The last `enable` given to openraft.
    pub(crate) enabled: BTreeMap<GroupId, bool>,
    /// When this replica last heard the group's leader (or first looked).
    pub(crate) heard_at: BTreeMap<GroupId, Instant>,
    /// Since when a majority of each group's voters has been out of reach, and whether
    /// that was logged (only once it lasted [`crate::host::PEER_SILENT_WARN_MS`]).
    pub(crate) unreachable: BTreeMap<GroupId, (Instant, bool)>,
    /// Groups whose leader this replica has heard, with more than one voter, since it
    /// started: before that the group is forming, and its gate's changes are routine
    /// (logged at debug).
    pub(crate) led: BTreeSet<GroupId>,
    /// When this replica last campaigned ahead of its timer.
    pub(crate) campaigned_at: BTreeMap<GroupId, Instant>,
    /// The last vote seen per group, and when it was first seen.
    votes: BTreeMap<GroupId, (Vote, Instant)>,
}

impl GateState {
    /// At most one early campaign per group per lease: if it failed, openraft's
    /// own timer retries.
    pub(crate) fn may_campaign_again(
        &self,
        group: GroupId,
        now: Instant,
        timing: GateTiming,
    ) -> bool {
        self.campaigned_at.get(&group).is_none_or(|at| {
            now.saturating_duration_since(*at) >= Duration::from_millis(timing.lease_ms)
        })
    }

    /// When `group`'s vote last changed, given that it is `vote` now.
    pub(crate) fn vote_changed_at(&mut self, group: GroupId, vote: Vote, now: Instant) -> Instant {
        let seen = self.votes.entry(group).or_insert((vote, now));
        if seen.0 != vote {
            *seen = (vote, now);
        }
        seen.1
    }
}

#[cfg(test)]
#[path = "reachability_tests.rs"]
mod tests;
