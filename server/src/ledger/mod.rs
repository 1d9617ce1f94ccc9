//! The deterministic state machines of gangway's Raft groups: no clock, no
//! I/O, no randomness; ordered maps only, so the same commands give
//! byte-identical snapshots on every replica. Called by `replicated` (the
//! glue to gangway-raft) and read by the front door through queries.

pub mod inventory;
pub mod meta;
