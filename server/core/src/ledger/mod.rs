//! Ledger: the deterministic state machines of gangway's replicated groups.
//!
//! Owns the meta group's shard map ([`meta`]) and the shard ledger
//! ([`ShardLedger`]): nodes, their devices ([`devices`]: pools, health, agent
//! links, device classes), usage, two-phase reservations, placements and bind
//! status of one shard, changed only by [`LedgerCommand`]s through
//! [`ShardLedger::apply`]. Invariants: no clock, no I/O, no randomness,
//! `BTreeMap`s only (I6: same log, same bytes); I2 after every command; bad
//! input changes nothing. The read-only [`LedgerView`] is what the engine
//! consumes; the shard ledger keeps every node's engine summary ([`NodeFit`])
//! current as commands apply and offers it in place ([`IndexedView`]), so
//! placement never rebuilds a copy of the nodes (node stamps, from a
//! process-wide counter, key the engine's caches and are not replicated
//! state); [`query`] answers the front door and the coordinator. Called by `replicated` (apply,
//! snapshot, restore), the engine (views) and the front door (queries).

pub mod command;
pub mod devices;
pub mod displace;
pub mod meta;
pub mod network;
pub mod shard;
pub mod usage;
pub mod view;

#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod displacement_tests;
#[cfg(test)]
mod network_claim_tests;
#[cfg(test)]
mod network_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod two_phase_tests;

pub use command::{
    DeviceRefusal, LedgerCommand, LedgerError, LedgerOp, LedgerReply, NodeChange, ObservedPod,
    Presence, Refusal, RefusalCause, ReleaseTarget, ReserveMember, TxnId, TxnOutcome,
    OBSERVED_GANG, OBSERVED_PODS_PER_NODE_MAX, RESERVE_HOLD_MS_MAX,
};
pub use devices::{
    AgentLink, DeviceEviction, DeviceHealth, DeviceHealthReport, EvictionCause, NodeDevices,
    PoolChange, PoolStanding, PoolWithdrawal, AGENT_GRACE_MS_DEFAULT,
};
pub use shard::{
    FinishedTxn, InvariantViolation, LeaseState, NodeEntry, NodeLease, OpenTxn, ShardLedger,
    SnapshotError, Wake, FINISHED_TXNS_MAX, REFUSALS_KEPT_MAX,
};
pub use usage::{NodeUsage, ObservedConflicts, PodSlot, SlotState, UsageSums};
pub use view::{IndexedView, LedgerView, NodeFit, NodeView};
