//! Services around the shard groups that run on a shard's leader.

pub mod growth;
pub mod resolver;
pub mod warmer;
