//! The coordinator's pure decisions: which reservation each placed member becomes
//! (`assign`), which groups a preemption takes (`victims`) within disruption budgets
//! (`budgets`), which nodes move between shards (`rebalance`), and what a decision
//! means to a participant and whether its replies show it applied (`decision`). The
//! coordinator (gangway-server) runs them and performs what they return.

pub mod assign;
pub mod budgets;
pub mod decision;
pub mod rebalance;
pub mod victims;
