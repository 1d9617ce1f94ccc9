//! Domain model: the types scheduling reads, and their validation.
//!
//! Owns nodes, pod specs, gangs and gang groups, the shared resource vector, Kubernetes
//! quantities and the naming rules, and the DRA model: devices, pools, device classes,
//! resource claims and their allocations, with CEL selectors and semver versions. Every submitted document has a `Raw*` form
//! (Kubernetes JSON field names, strings for enums and quantities) whose `validate`
//! returns the domain type or a [`ValidationError`] naming the field path. Domain types
//! are plain data (serde; `BTreeMap`s, or the sorted [`SmallMap`] for the small maps
//! every node carries) so the ledger can log and snapshot them deterministically.
//! Called by the front door, the kube adapter, the ledger and the engine.

pub mod cel;
pub mod cel_cost;
pub mod claim;
pub mod compact;
pub mod device;
pub mod error;
pub mod gang;
pub mod names;
pub mod node;
pub mod node_allocation;
pub mod pod;
pub mod quantity;
pub mod queue;
pub mod reach;
pub mod resources;
pub mod selectors;
pub mod semver;
pub mod topology;

pub use claim::{
    AdminAccess, AllocationMode, ConstraintRule, DeviceAllocation, DeviceConstraint, DeviceRequest,
    DeviceToleration, ExactRequest, PodClaim, RawPodClaim, RequestSpec, SubRequest,
};
pub use compact::{SmallMap, Symbol, SymbolTable};
pub use device::{
    AllocationSharing, AttributeValue, CelSelector, CounterConsumption, CounterSet, Device,
    DeviceCapacity, DeviceClass, DeviceId, DeviceQuantity, DeviceTaint, DeviceTaintEffect,
    RawDeviceClass, RawResourcePool, ResourcePool,
};
pub use error::{clip, clip_to, FieldPath, ValidationError, MESSAGE_CHARS_MAX, PATH_CHARS_MAX};
pub use gang::{
    Gang, GangGroup, GangId, GangMode, Member, MemberKey, RawGang, RawGangGroup, RUN_LIMIT_MS_MAX,
};
pub use node::{Node, RawNode, Readiness, Schedulability, Taint, TaintEffect};
pub use pod::{
    HostPort, LabelSelector, LabelSelectorOperator, LabelSelectorRequirement, NodeAffinity,
    NodeSelectorOperator, NodeSelectorRequirement, NodeSelectorTerm, PodAffinity, PodAffinityTerm,
    PodBinding, PodSpec, PodSummary, PreferredSchedulingTerm, Protocol, RawPodSpec, Toleration,
    TolerationOperator, WeightedPodAffinityTerm,
};
pub use quantity::{Quantity, QuantityError};
pub use queue::{Limits, QueueSpec};
pub use resources::{ResourceName, Resources};
pub use topology::{LearnedHierarchies, TopologyConstraint, TopologyHierarchy, TopologySlice};
