//! Filter and score results of pod templates, kept across placement calls.
//!
//! Owns [`FitCache`], kept by a [`crate::engine::placement::Placer`]. Some templates
//! are judged on a node's [`NodeFit`] summary alone: no nodeSelector or required node
//! affinity, no extended resource requests, no host ports, no inter-pod filter or
//! preferred inter-pod score in play, no preferred node affinity, built-in fit
//! resources, and no nominations in the cluster (the searcher decides this per call).
//! On a node whose summary carries no condition or taint flag, such a template's filter
//! outcome and node-local score are then a function of (template, profile, summary).
//! Templates with device needs (claims) are judged on the summary and the node's
//! devices, also named by its stamp, and on the device classes they name: their
//! entries are kept per (template, profile, classes), with the device score and the
//! "cannot allocate all claims" refusal.
//! The cache keeps them per node position with the node's stamp
//! ([`crate::ledger::view::IndexedView`]): a stamp names one state of one node, so an
//! entry is used only while the node at that position is in exactly the state it was
//! computed from. Invariant: a hit returns exactly what recomputing would, so the cache
//! changes speed, never results. Bounded to [`CACHED_TEMPLATES_MAX`] templates, the
//! least recently used evicted first; 32 bytes per node and template. The same stamps
//! keep each node's value of the gang topology label ([`FitCache::domains`]), so a
//! gang's domains are regrouped without reading the labels of unchanged nodes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::engine::cluster::Cluster;
use crate::engine::devices::{needs_devices, DeviceDemand};
use crate::engine::filter::FilterReason;
use crate::engine::profile::Profile;
use crate::ledger::view::NodeFit;
use crate::model::device::DeviceClass;
use crate::model::pod::PodSpec;
use crate::model::resources::ResourceName;

/// Most templates whose results are kept.
pub const CACHED_TEMPLATES_MAX: usize = 8;

/// One template's results on one node position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    /// Stamp of the node state they were computed from; 0 when empty.
    stamp: u64,
    /// Copies that fit (uncapped), or 0 when the node is refused.
    copies: u64,
    /// Weighted node-local score.
    local: u64,
    /// Device score (firstAvailable preference).
    devices: u32,
    /// The dimension that is short, or [`DEVICES_SHORT`], when refused.
    short: u8,
}

/// The `short` code of "cannot allocate all claims".
const DEVICES_SHORT: u8 = 4;

/// A template's results by node position.
#[derive(Debug, Clone)]
struct TemplateEntries {
    spec: PodSpec,
    profile: Profile,
    /// The device classes the template names, as they were.
    classes: Vec<DeviceClass>,
    last_use: u64,
    entries: Vec<Entry>,
}

/// Each node position's value of one label, valid while the node's stamp is.
#[derive(Clone, Default)]
struct DomainEntries {
    key: String,
    /// Per position: the stamp, and the value's index in `values` (or [`NO_VALUE`]).
    of: Vec<(u64, u32)>,
    values: Vec<String>,
    ids: BTreeMap<String, u32>,
}

/// A node without the label.
const NO_VALUE: u32 = u32::MAX;
/// Distinct values kept beyond the node count before the value list starts afresh.
const SPARE_VALUES: usize = 1024;

/// A template's resolved device needs, kept across calls.
#[derive(Debug, Clone)]
struct KeptDemand {
    spec: PodSpec,
    demand: Arc<DeviceDemand>,
    last_use: u64,
}

/// Results of fit-only templates per node position, valid while the node's stamp is.
#[derive(Clone, Default)]
pub struct FitCache {
    templates: Vec<TemplateEntries>,
    uses: u64,
    domains: DomainEntries,
    /// Device needs of recent templates (with the qualifying devices they keep per node).
    demands: Vec<KeptDemand>,
}

impl fmt::Debug for FitCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FitCache")
            .field("templates", &self.templates.len())
            .field("domain_key", &self.domains.key)
            .finish()
    }
}

/// A kept filter outcome and node-local score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Copies that fit (uncapped), or 0 when the node is refused.
    pub copies: u64,
    /// Weighted node-local score.
    pub local: u64,
    /// Device score.
    pub devices: u32,
    short: u8,
}

impl Hit {
    /// Why the node is refused (meaningful when `copies` is 0).
    pub fn refusal(&self) -> FilterReason {
        if self.short == DEVICES_SHORT {
            return FilterReason::CannotAllocateDevices;
        }
        FilterReason::Insufficient(dim_name(self.short))
    }

    /// The filter outcome.
    pub fn outcome(&self) -> Result<u64, FilterReason> {
        if self.copies > 0 {
            Ok(self.copies)
        } else {
            Err(self.refusal())
        }
    }
}

impl FitCache {
    /// The entries of `spec` under `profile`, sized for `nodes` positions.
    pub fn template(
        &mut self,
        spec: &PodSpec,
        profile: &Profile,
        nodes: usize,
    ) -> TemplateSlot<'_> {
        self.template_for(spec, profile, &[], nodes)
    }

    /// The entries of `spec` under `profile` with the device classes `classes` (those
    /// the template names, as they are now), sized for `nodes` positions.
    pub fn template_for(
        &mut self,
        spec: &PodSpec,
        profile: &Profile,
        classes: &[DeviceClass],
        nodes: usize,
    ) -> TemplateSlot<'_> {
        self.uses += 1;
        let at = match self.templates.iter().position(|t| {
            t.spec == *spec && t.profile == *profile && t.classes.as_slice() == classes
        }) {
            Some(at) => at,
            None => self.add(spec, profile, classes),
        };
        let template = &mut self.templates[at];
        template.last_use = self.uses;
        if template.entries.len() != nodes {
            template.entries.resize(nodes, Entry::default());
        }
        TemplateSlot {
            entries: &mut template.entries,
        }
    }

    fn add(&mut self, spec: &PodSpec, profile: &Profile, classes: &[DeviceClass]) -> usize {
        let fresh = TemplateEntries {
            spec: spec.clone(),
            profile: profile.clone(),
            classes: classes.to_vec(),
            last_use: self.uses,
            entries: Vec::new(),
        };
        if self.templates.len() < CACHED_TEMPLATES_MAX {
            self.templates.push(fresh);
            return self.templates.len() - 1;
        }
        let oldest = self
            .templates
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| t.last_use)
            .map_or(0, |(i, _)| i);
        self.templates[oldest] = fresh;
        oldest
    }

    /// Number of templates kept.
    pub fn templates(&self) -> usize {
        self.templates.len()
    }

    /// The device needs of `spec` under `classes`: the kept ones while they resolve the
    /// same way (they keep each node's qualifying devices), else freshly built. At most
    /// [`CACHED_TEMPLATES_MAX`] are kept, the least recently used replaced first.
    pub fn demand(
        &mut self,
        spec: &PodSpec,
        classes: &BTreeMap<String, DeviceClass>,
    ) -> Option<Arc<DeviceDemand>> {
        if !needs_devices(spec, classes) {
            return None;
        }
        self.uses += 1;
        let uses = self.uses;
        if let Some(kept) = self.demands.iter_mut().find(|k| k.spec == *spec) {
            if kept.demand.resolves_same(spec, classes) {
                kept.last_use = uses;
                return Some(Arc::clone(&kept.demand));
            }
        }
        let demand = Arc::new(DeviceDemand::build(spec, classes)?);
        let fresh = KeptDemand {
            spec: spec.clone(),
            demand: Arc::clone(&demand),
            last_use: uses,
        };
        match self.demands.iter().position(|k| k.spec == *spec) {
            Some(at) => self.demands[at] = fresh,
            None if self.demands.len() < CACHED_TEMPLATES_MAX => self.demands.push(fresh),
            None => {
                let oldest = self
                    .demands
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, k)| k.last_use)
                    .map_or(0, |(i, _)| i);
                self.demands[oldest] = fresh;
            }
        }
        Some(demand)
    }

    /// [`Cluster::domains`]: node positions grouped by their value of label `key`,
    /// reading the labels only of nodes whose stamp changed since the last call.
    pub fn domains(&mut self, cluster: &Cluster<'_>, key: &str) -> BTreeMap<String, Vec<usize>> {
        let cache = &mut self.domains;
        let nodes = cluster.len();
        if cache.key != key || cache.values.len() > nodes + SPARE_VALUES {
            *cache = DomainEntries {
                key: key.to_string(),
                ..DomainEntries::default()
            };
        }
        cache.of.resize(nodes, (0, NO_VALUE));
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); cache.values.len()];
        for i in 0..nodes {
            let stamp = cluster.stamp(i);
            let id = match (stamp, cache.of.get(i)) {
                (Some(stamp), Some(&(seen, id))) if seen == stamp && stamp != 0 => id,
                _ => {
                    let id = match cluster.node(i).and_then(|node| node.label(key)) {
                        Some(value) => cache.intern(value),
                        None => NO_VALUE,
                    };
                    if let (Some(stamp), Some(slot)) = (stamp, cache.of.get_mut(i)) {
                        *slot = (stamp, id);
                    }
                    id
                }
            };
            if id == NO_VALUE {
                continue;
            }
            let id = id as usize;
            if groups.len() <= id {
                groups.resize(id + 1, Vec::new());
            }
            groups[id].push(i);
        }
        groups
            .into_iter()
            .enumerate()
            .filter(|(_, nodes)| !nodes.is_empty())
            .filter_map(|(id, nodes)| Some((cache.values.get(id)?.clone(), nodes)))
            .collect()
    }
}

impl DomainEntries {
    fn intern(&mut self, value: &str) -> u32 {
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        let id = u32::try_from(self.values.len()).unwrap_or(NO_VALUE);
        if id != NO_VALUE {
            self.values.push(value.to_string());
            self.ids.insert(value.to_string(), id);
        }
        id
    }
}

/// One template's entries, for one search.
pub struct TemplateSlot<'c> {
    entries: &'c mut Vec<Entry>,
}

impl TemplateSlot<'_> {
    /// The result at `idx` if it was computed for the node state named `stamp`.
    #[inline]
    pub fn get(&self, idx: usize, stamp: u64) -> Option<Hit> {
        let entry = self
            .entries
            .get(idx)
            .filter(|e| e.stamp == stamp && stamp != 0)?;
        Some(Hit {
            copies: entry.copies,
            local: entry.local,
            devices: entry.devices,
            short: entry.short,
        })
    }

    /// Keeps the result at `idx` computed for the node state named `stamp` on summary
    /// `fit`; only results that depend on the summary alone are kept (no condition or
    /// taint flag on the node, an outcome that is a fit or a built-in shortfall).
    pub fn put(
        &mut self,
        idx: usize,
        stamp: u64,
        fit: &NodeFit,
        outcome: &Result<u64, FilterReason>,
        local: u64,
    ) {
        self.put_scored(idx, stamp, fit, outcome, local, 0);
    }

    /// [`TemplateSlot::put`] with the node's device score; "cannot allocate all
    /// claims" is kept too.
    pub fn put_scored(
        &mut self,
        idx: usize,
        stamp: u64,
        fit: &NodeFit,
        outcome: &Result<u64, FilterReason>,
        local: u64,
        devices: u32,
    ) {
        if fit.has(NodeFit::NODE_FILTERED | NodeFit::SOFT_TAINTS) {
            return;
        }
        let (copies, short) = match outcome {
            Ok(copies) if *copies > 0 => (*copies, 0),
            Err(FilterReason::Insufficient(name)) => match dim_of(name) {
                Some(d) => (0, d),
                None => return,
            },
            Err(FilterReason::CannotAllocateDevices) => (0, DEVICES_SHORT),
            _ => return,
        };
        if let Some(entry) = self.entries.get_mut(idx) {
            *entry = Entry {
                stamp,
                copies,
                local,
                devices,
                short,
            };
        }
    }
}

fn dim_of(name: &ResourceName) -> Option<u8> {
    match name {
        ResourceName::Cpu => Some(0),
        ResourceName::Memory => Some(1),
        ResourceName::Pods => Some(2),
        ResourceName::EphemeralStorage => Some(3),
        ResourceName::Extended(_) => None,
    }
}

fn dim_name(d: u8) -> ResourceName {
    match d {
        0 => ResourceName::Cpu,
        1 => ResourceName::Memory,
        2 => ResourceName::Pods,
        _ => ResourceName::EphemeralStorage,
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
