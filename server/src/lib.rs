//! gangway-server: the scheduler's services around gangway-core (the model, ledgers,
//! engine and plans). `replicated` binds the ledgers to Raft groups,
//! `frontdoor` serves the public gRPC API, `replica` runs one replica,
//! `serve` and `dev` are the process entry points, `observe` the HTTP
//! endpoints and metrics, `bench` the benchmarks.

pub mod agent;
pub mod auth;
pub mod bench;
pub mod bootstrap;
pub mod config;
pub mod convert;
pub mod coordinator;
pub mod datadir;
pub mod dev;
pub mod failpoints;
pub mod frontdoor;
pub mod kube;
pub mod observe;
pub mod participant;
pub mod replica;
pub mod replicated;
pub mod scheduler_config;
pub mod security;
pub mod serve;
pub mod webview;
