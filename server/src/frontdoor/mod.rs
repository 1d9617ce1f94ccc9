//! gangway's public gRPC services, served by every replica; requests are
//! validated here and routed to the owning Raft group's leader.

pub mod admin;
pub mod devices;
pub mod inventory;
pub mod queues;
pub mod scheduler;
pub mod shard_admin;
pub mod watch;
