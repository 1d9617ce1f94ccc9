//! gangway-raft: a multi-raft host on openraft with sled storage and a gRPC
//! transport. One process hosts a replica of many Raft groups; each group runs
//! a domain `StateMachine` supplied by the caller. Nothing here knows about
//! scheduling, and no openraft type leaves this crate.
//!
//! Entry point: `RaftHost::start(config, store, factory)`, then serve
//! `transport_service()` and `admin_service()` on the process's gRPC server,
//! then `bootstrap(members)` on a new cluster.

// openraft's StorageError and RPCError are large by its design; boxing them
// here would only add a conversion on every storage and network call.
#![allow(clippy::result_large_err)]

mod admin;
mod balance;
mod codec;
pub mod error;
mod forwarder;
mod host;
mod log_store;
mod members_seen;
mod metrics;
mod network;
pub mod peer_proof;
mod proposer;
mod reachability;
mod read_gate;
mod service;
mod sm_store;
pub mod snapshot_cadence;
pub mod state_machine;
pub mod storage;
mod types;

pub use admin::AdminService;
pub use balance::{leaders_max, plan as plan_balance, Move};
pub use error::HostError;
pub use host::{
    GroupChanges, HostConfig, Outcome, PeerSecurity, RaftHost, RaftTiming, SharedToken,
    TransportStart,
};
pub use members_seen::holds_raft_state;
pub use peer_proof::{peer_proof, proof_accepted, LEGACY_PEER_SECRET_HEADER, PEER_PROOF_HEADER};
pub use service::TransportService;
pub use state_machine::{
    Admission, RestoreError, SnapshotWriter, StateMachine, StateMachineFactory,
};
pub use types::{GroupId, NodeId, META_GROUP};
