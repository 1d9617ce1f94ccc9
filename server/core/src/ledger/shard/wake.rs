//! What an applied shard operation may have done for groups parked because they fit
//! nowhere (docs/ARCHITECTURE.md §4, "Parking"): changed the nodes themselves (a node
//! added or changed, its readiness or lease coming back, devices published or turning
//! healthy, device taints changed, a device class added, a fence lifted, nodes
//! adopted), or freed room (a transaction aborted or released, victims gone, observed
//! pods leaving, observed network holds replaced, a commit giving back a preemption's
//! placeholders). Every operation is classified here by name, so a new one must be.
//! Pure: the shard's state machine counts the wakes for its replica's coordinator;
//! nothing here is replicated state.

use super::*;

/// What one applied operation (or batch) may have done for a parked group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wake {
    /// A node, its devices, or a device class changed in a way that could let a node
    /// pass filters it failed.
    pub nodes: bool,
    /// Room on some node may have grown.
    pub room: bool,
}

impl Wake {
    /// Both kinds of change at once.
    pub const EVERYTHING: Wake = Wake {
        nodes: true,
        room: true,
    };
    /// A change to the nodes only.
    pub const NODES: Wake = Wake {
        nodes: true,
        room: false,
    };
    /// Room freed only.
    pub const ROOM: Wake = Wake {
        nodes: false,
        room: true,
    };
    /// Nothing that could help.
    pub const NOTHING: Wake = Wake {
        nodes: false,
        room: false,
    };

    fn or(self, other: Wake) -> Wake {
        Wake {
            nodes: self.nodes || other.nodes,
            room: self.room || other.room,
        }
    }
}

/// Whether a node can take pods, as far as heartbeats change it.
type Schedulable = Option<(Readiness, Option<LeaseState>)>;

impl ShardLedger {
    /// Applies `cmd` as [`Self::apply`] does, and says what it may have done for
    /// groups parked because they fit nowhere.
    pub fn apply_noting_wake(&mut self, cmd: &LedgerCommand) -> (LedgerReply, Wake) {
        let ops: Vec<&LedgerOp> = match &cmd.op {
            LedgerOp::Batch { ops } => ops.iter().collect(),
            op => vec![op],
        };
        let before: Vec<Schedulable> = ops.iter().map(|op| self.schedulable(op)).collect();
        let reply = self.apply(cmd);
        let replies: Vec<&LedgerReply> = match (&cmd.op, &reply) {
            (LedgerOp::Batch { .. }, LedgerReply::Batch { replies }) => replies.iter().collect(),
            // A batch refused whole changed nothing.
            (LedgerOp::Batch { .. }, _) => Vec::new(),
            (_, reply) => vec![reply],
        };
        let wake = ops
            .iter()
            .zip(replies)
            .zip(before)
            .fold(Wake::default(), |wake, ((op, reply), before)| {
                wake.or(self.wake_of(op, reply, before))
            });
        (reply, wake)
    }

    /// A heartbeat's node's readiness and lease before it applies.
    fn schedulable(&self, op: &LedgerOp) -> Schedulable {
        match op {
            LedgerOp::NodeHeartbeat { node, .. } => self
                .node(node)
                .map(|e| (e.node.readiness, e.lease.map(|l| l.state))),
            _ => None,
        }
    }

    fn wake_of(&self, op: &LedgerOp, reply: &LedgerReply, before: Schedulable) -> Wake {
        const NODES: Wake = Wake::NODES;
        const ROOM: Wake = Wake::ROOM;
        const NOTHING: Wake = Wake::NOTHING;
        if matches!(reply, LedgerReply::Rejected { .. }) {
            return NOTHING;
        }
        match op {
            LedgerOp::RegisterNode { .. } | LedgerOp::AddNode { .. } => match reply {
                LedgerReply::NodeRegistered {
                    change: NodeChange::Unchanged,
                    ..
                } => NOTHING,
                _ => NODES,
            },
            LedgerOp::NodeHeartbeat { node, .. } => {
                let after = self
                    .node(node)
                    .map(|e| (e.node.readiness, e.lease.map(|l| l.state)));
                if after == before {
                    NOTHING
                } else {
                    NODES
                }
            }
            LedgerOp::PublishPool { .. }
            | LedgerOp::PublishNetworkPool { .. }
            | LedgerOp::SetDeviceHealth { .. }
            | LedgerOp::SetDeviceTaints { .. }
            | LedgerOp::AgentConnected { .. }
            | LedgerOp::PutDeviceClass { .. }
            | LedgerOp::UnfenceNodes { .. }
            | LedgerOp::Adopt { .. } => NODES,
            LedgerOp::SetObservedPods { .. } => match reply {
                LedgerReply::ObservedPodsSet { removed: 0, .. } => NOTHING,
                _ => ROOM,
            },
            LedgerOp::Abort { .. }
            | LedgerOp::Release { .. }
            | LedgerOp::VictimsGone { .. }
            | LedgerOp::SetObservedNetworkHolds { .. }
            | LedgerOp::Commit { .. } => ROOM,
            // These take room, fence, hand over, remove or only record: none helps.
            LedgerOp::RemoveNode { .. }
            | LedgerOp::Reserve { .. }
            | LedgerOp::ReserveAndCommit { .. }
            | LedgerOp::ReserveDisplacing { .. }
            | LedgerOp::BindConfirmed { .. }
            | LedgerOp::Tick
            | LedgerOp::WithdrawPool { .. }
            | LedgerOp::AgentDisconnected { .. }
            | LedgerOp::RemoveDeviceClass { .. }
            | LedgerOp::FenceNodes { .. }
            | LedgerOp::HandOff { .. }
            | LedgerOp::DropParcel { .. } => NOTHING,
            LedgerOp::Batch { .. } => Wake::EVERYTHING,
        }
    }
}

#[cfg(test)]
#[path = "wake_tests.rs"]
mod tests;
