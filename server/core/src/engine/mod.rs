//! Placement engine: pure functions over a ledger view.
//!
//! Owns filtering (node conditions, selectors and node affinity, taints, host ports,
//! resources with nominations, inter-pod affinity, device allocation for resource
//! claims), scoring (resource-fit strategies, balanced allocation, node affinity, taint
//! toleration, inter-pod affinity, firstAvailable device preference, weighted by a
//! [`Profile`]), the node search (kube-scheduler's percentageOfNodesToScore and its
//! round-robin start), gang placement as one batch with topology-domain packing,
//! quotes, gang-aware preemption with nominations, and benchmark workloads. Invariants: nothing here mutates a ledger, reads a clock or draws
//! randomness; equal inputs give equal outputs, ties broken by node name (a
//! [`Placer`]'s search cursor counts as an input). Called by shard leaders (quote,
//! place, preempt), shard queries and the coordinator's plans.

pub mod bench;
pub mod cache;
pub mod cluster;
pub mod devices;
pub mod filter;
pub mod group_preemption;
pub mod interpod;
pub mod placement;
pub mod preemption;
pub mod profile;
pub mod score;
pub mod search;
pub mod taints;
pub mod topology_bench;

#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod tests;

pub use cluster::{Cluster, Nomination};
pub use devices::{DeviceDemand, DeviceFit};
pub use filter::{Diagnosis, FilterReason};
pub use placement::{
    place_gang, place_group, place_members, quote, quote_many, GangPlacement, MemberLabels,
    MemberRef, Placer, Quote, TopologyDomain, Unplaced,
};
pub use preemption::{preempt, PreemptionOutcome, PreemptionPlan, Victim};
pub use profile::{PluginWeight, Profile, ResourceWeight, ScorePlugin, ShapePoint};
