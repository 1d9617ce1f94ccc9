//! Services around the shard groups that run on a shard's leader.

pub mod resolver;
pub mod warmer;
