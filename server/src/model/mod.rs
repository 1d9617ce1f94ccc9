//! Domain model: the types scheduling reads, and their validation.
//!
//! Owns nodes, pod specs, gangs and gang groups, the shared resource vector, Kubernetes
//! quantities and the naming rules. Every submitted document has a `Raw*` form
//! (Kubernetes JSON field names, strings for enums and quantities) whose `validate`
//! returns the domain type or a [`ValidationError`] naming the field path. Domain types
//! are plain data (serde, `BTreeMap`s only) so the ledger can log and snapshot them
//! deterministically. Called by the front door, the kube adapter, the ledger and the
//! engine.

pub mod error;
pub mod gang;
pub mod names;
pub mod node;
pub mod pod;
pub mod quantity;
pub mod resources;

pub use error::{FieldPath, ValidationError};
pub use gang::{Gang, GangGroup, GangId, GangMode, Member, MemberKey, RawGang, RawGangGroup};
pub use node::{Node, RawNode, Readiness, Schedulability, Taint, TaintEffect};
pub use pod::{
    HostPort, LabelSelector, LabelSelectorOperator, LabelSelectorRequirement, NodeAffinity,
    NodeSelectorOperator, NodeSelectorRequirement, NodeSelectorTerm, PodAffinity, PodAffinityTerm,
    PodSpec, PodSummary, PreferredSchedulingTerm, Protocol, RawPodSpec, Toleration,
    TolerationOperator, WeightedPodAffinityTerm,
};
pub use quantity::{Quantity, QuantityError};
pub use resources::{ResourceName, Resources};
