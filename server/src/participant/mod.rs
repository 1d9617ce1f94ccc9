//! The participant side of the two-phase reservation, run on every shard this replica
//! leads: resolving reservations that outlived their deadline, and ticking the ledger's
//! clock.

pub mod resolver;
