//! The coordinator's pure decisions: which reservation each placed member becomes
//! (`assign`), which groups a preemption takes (`victims`) within disruption budgets
//! (`budgets`), which nodes move between shards (`rebalance`), what a decision
//! means to a participant and whether its replies show it applied (`decision`), and
//! whether a group that fit nowhere is parked and what wakes it (`parking`), and which
//! groups may use nodes reserved for the head of the line (`backfill`). The
//! coordinator (gangway-server) runs them and performs what they return.

pub mod assign;
pub mod backfill;
pub mod budgets;
pub mod decision;
pub mod parking;
pub mod rebalance;
pub mod victims;
