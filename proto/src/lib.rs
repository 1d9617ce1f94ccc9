//! gangway's wire types: generated tonic/prost code for the public API
//! (`gangway.v1`), cluster administration (`gangway.admin.v1`), the
//! internal Raft transport (`gangway.raft.v1`) and the kubelet's device plugin
//! API (`v1beta1`, for gangway-agent). Generated at build time from
//! `proto/`; only `codec` is written by hand.

pub mod codec;

/// Public API: the scheduler for batch frameworks and node inventory for agents.
pub mod v1 {
    tonic::include_proto!("gangway.v1");
}

/// Cluster administration served by every replica.
pub mod admin {
    tonic::include_proto!("gangway.admin.v1");
}

/// The kubelet's device plugin API (`v1beta1`), which gangway-agent serves to and
/// calls on Kubernetes device plugins.
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Internal Raft transport between replicas.
pub mod raft {
    tonic::include_proto!("gangway.raft.v1");
}
