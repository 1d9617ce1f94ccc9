//! A ResourceClaim's `status.allocation` as DRA drivers and the kubelet read it.
//!
//! Owns [`allocation`]: from the devices gangway placed for one pod claim, the claim
//! object (its spec is immutable) and the DeviceClasses, the allocation the binder
//! writes: one result per device (request, driver, pool, device, admin access, the
//! request's tolerations, share id and consumed capacity of a shared device), the node
//! selector of the node, and the configs that apply to the allocated requests. A driver
//! reads its opaque parameters only from these configs, and the device taint eviction
//! controller reads tolerations only from the results, so leaving either out makes a
//! real driver prepare with defaults and a tolerating pod be evicted.
//!
//! Config rules, as `resource.k8s.io/v1` defines them: for each request of the claim in
//! spec order (the chosen sub-request of a firstAvailable one, named `request/sub`), the
//! configs of its DeviceClass with source `FromClass`, added once per class with the
//! names of every request served by that class; then each config of the claim with
//! source `FromClaim` when it names no request, or names an allocated request or the
//! chosen sub-request (once, where upstream repeats a config once per request it names;
//! drivers read the set).
//!
//! Binding conditions: a device that publishes `bindingConditions` (a fabric-attached
//! GPU the driver must attach first) carries them and its `bindingFailureConditions`
//! into its result; [`binding_state`] says whether the pod may be bound yet, from the
//! conditions the driver writes in the claim's `status.devices`. Invariants: pure (no
//! I/O); the same inputs give the same JSON, so a retried write compares equal. Called
//! by the binder.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use gangway_core::model::claim::{AdminAccess, DeviceAllocation, DeviceToleration};
use gangway_core::model::device::DeviceId;
use gangway_core::model::pod::TolerationOperator;

/// Why no allocation can be written yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// A request's DeviceClass is not known (deleted since placement, or not yet seen).
    #[error("request \"{request}\" names DeviceClass {class}, which does not exist")]
    ClassMissing {
        /// The request (or `request/sub`).
        request: String,
        /// The class.
        class: String,
    },
}

/// Which nodes the slice publishing a device serves, as the allocation's node selector
/// needs it.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceReach {
    /// One node (`nodeName`), or the slice is not known any more: the pod's node.
    Node,
    /// Every node (`allNodes`).
    AllNodes,
    /// The nodes of one node selector term (`nodeSelector.nodeSelectorTerms[0]`).
    Term(Value),
}

/// The source of a config in an allocation result.
const FROM_CLASS: &str = "FromClass";
/// The source of a config in an allocation result.
const FROM_CLAIM: &str = "FromClaim";

/// The allocation of `devices` (one pod claim's, on `node`) for the claim object
/// `claim`, with the classes `class_of` answers, the devices as their slices publish
/// them (`device_of`, for their binding conditions) and the nodes those slices serve
/// (`reach_of`, for the node selector).
pub fn allocation(
    node: &str,
    claim: &Value,
    class_of: &dyn Fn(&str) -> Option<Arc<Value>>,
    device_of: &dyn Fn(&DeviceId) -> Option<Value>,
    reach_of: &dyn Fn(&DeviceId) -> SliceReach,
    devices: &[&DeviceAllocation],
) -> Result<Value, AllocationError> {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| {
            let mut r = result(d);
            if let Some(published) = device_of(&d.device) {
                for field in ["bindingConditions", "bindingFailureConditions"] {
                    if published[field].as_array().is_some_and(|c| !c.is_empty()) {
                        r[field] = published[field].clone();
                    }
                }
            }
            r
        })
        .collect();
    let config = configs(claim, class_of, devices)?;
    let mut out = json!({"devices": {"results": results, "config": config}});
    if let Some(selector) = node_selector(node, reach_of, devices) {
        out["nodeSelector"] = selector;
    }
    Ok(out)
}

/// The nodes the allocated devices are reachable from, as upstream's allocator writes
/// them: a device of one node restricts the allocation to that node; otherwise the
/// requirements of every network-attached device's selector term, merged into one term
/// (each requirement once); none when every device serves all nodes (the pod may run
/// anywhere).
fn node_selector(
    node: &str,
    reach_of: &dyn Fn(&DeviceId) -> SliceReach,
    devices: &[&DeviceAllocation],
) -> Option<Value> {
    let mut fields: Vec<Value> = Vec::new();
    let mut expressions: Vec<Value> = Vec::new();
    let only_node = || {
        json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}
        ]}]})
    };
    if devices.is_empty() {
        return Some(only_node());
    }
    for d in devices {
        match reach_of(&d.device) {
            SliceReach::Node => return Some(only_node()),
            SliceReach::AllNodes => {}
            SliceReach::Term(term) => {
                let add = |have: &mut Vec<Value>, field: &str| {
                    for req in term[field].as_array().into_iter().flatten() {
                        if !have.contains(req) {
                            have.push(req.clone());
                        }
                    }
                };
                add(&mut fields, "matchFields");
                add(&mut expressions, "matchExpressions");
            }
        }
    }
    if fields.is_empty() && expressions.is_empty() {
        return None;
    }
    let mut term = Map::new();
    if !expressions.is_empty() {
        term.insert("matchExpressions".into(), Value::Array(expressions));
    }
    if !fields.is_empty() {
        term.insert("matchFields".into(), Value::Array(fields));
    }
    Some(json!({"nodeSelectorTerms": [Value::Object(term)]}))
}

/// Whether a pod may be bound once its claim holds `allocation`: every binding
/// condition of its devices must be `True` in the claim's `status.devices` (written by
/// the driver), and no binding failure condition may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingState {
    /// Nothing to wait for.
    Ready,
    /// A device's binding condition is not `True` yet.
    Waiting {
        /// The device (`driver/pool/device`).
        device: String,
        /// The condition.
        condition: String,
    },
    /// A device's binding failure condition is `True`.
    Failed {
        /// The device (`driver/pool/device`).
        device: String,
        /// The condition.
        condition: String,
    },
}

/// Where binding stands for `allocation`, given the claim as last seen (see
/// [`BindingState`]); failure conditions are looked at first, as upstream does.
pub fn binding_state(allocation: &Value, claim: &Value) -> BindingState {
    let mut waiting = None;
    for r in allocation["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let id = format!(
            "{}/{}/{}",
            r["driver"].as_str().unwrap_or_default(),
            r["pool"].as_str().unwrap_or_default(),
            r["device"].as_str().unwrap_or_default()
        );
        let status = claim["status"]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| {
                d["driver"] == r["driver"] && d["pool"] == r["pool"] && d["device"] == r["device"]
            });
        let is_true = |condition: &str| {
            status.is_some_and(|d| {
                d["conditions"].as_array().into_iter().flatten().any(|c| {
                    c["type"].as_str() == Some(condition) && c["status"].as_str() == Some("True")
                })
            })
        };
        let names = |field: &str| -> Vec<String> {
            r[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        };
        if let Some(condition) = names("bindingFailureConditions")
            .into_iter()
            .find(|c| is_true(c))
        {
            return BindingState::Failed {
                device: id,
                condition,
            };
        }
        if waiting.is_none() {
            if let Some(condition) = names("bindingConditions").into_iter().find(|c| !is_true(c)) {
                waiting = Some(BindingState::Waiting {
                    device: id,
                    condition,
                });
            }
        }
    }
    waiting.unwrap_or(BindingState::Ready)
}

/// One device's entry in `status.allocation.devices.results`.
fn result(d: &DeviceAllocation) -> Value {
    let mut r = json!({
        "request": d.request,
        "driver": d.device.driver,
        "pool": d.device.pool,
        "device": d.device.device,
    });
    if d.admin_access == AdminAccess::Enabled {
        r["adminAccess"] = json!(true);
    }
    if !d.tolerations.is_empty() {
        r["tolerations"] = Value::Array(d.tolerations.iter().map(toleration).collect());
    }
    if let Some(share) = &d.share_id {
        r["shareID"] = json!(share);
    }
    if !d.consumed_capacity.is_empty() {
        let consumed: Map<String, Value> = d
            .consumed_capacity
            .iter()
            .map(|(name, amount)| (name.clone(), json!(amount.to_string())))
            .collect();
        r["consumedCapacity"] = Value::Object(consumed);
    }
    r
}

/// A device toleration in the API's spelling.
fn toleration(t: &DeviceToleration) -> Value {
    let mut v = json!({"operator": match t.operator {
        TolerationOperator::Equal => "Equal",
        TolerationOperator::Exists => "Exists",
    }});
    if !t.key.is_empty() {
        v["key"] = json!(t.key);
    }
    if !t.value.is_empty() {
        v["value"] = json!(t.value);
    }
    if let Some(effect) = t.effect {
        v["effect"] = json!(format!("{effect:?}"));
    }
    if let Some(seconds) = t.toleration_seconds {
        v["tolerationSeconds"] = json!(seconds);
    }
    v
}

/// The configs that apply to the allocated requests (see the module header).
fn configs(
    claim: &Value,
    class_of: &dyn Fn(&str) -> Option<Arc<Value>>,
    devices: &[&DeviceAllocation],
) -> Result<Vec<Value>, AllocationError> {
    // Allocated request → the chosen sub-request, if it is a firstAvailable one.
    let mut chosen: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for d in devices {
        match d.request.split_once('/') {
            Some((main, sub)) => chosen.insert(main, Some(sub)),
            None => chosen.insert(d.request.as_str(), None),
        };
    }
    let spec = &claim["spec"]["devices"];
    let mut out: Vec<Value> = Vec::new();
    // Class → the positions of its configs in `out`.
    let mut class_configs: BTreeMap<String, std::ops::Range<usize>> = BTreeMap::new();
    for request in spec["requests"].as_array().into_iter().flatten() {
        let Some(main) = request["name"].as_str() else {
            continue;
        };
        let Some(sub) = chosen.get(main) else {
            continue;
        };
        let Some((class, name)) = request_class(request, main, *sub) else {
            continue;
        };
        if let Some(range) = class_configs.get(&class) {
            for config in &mut out[range.clone()] {
                if let Some(names) = config["requests"].as_array_mut() {
                    names.push(json!(name));
                }
            }
            continue;
        }
        let object = class_of(&class).ok_or_else(|| AllocationError::ClassMissing {
            request: name.clone(),
            class: class.clone(),
        })?;
        let start = out.len();
        for config in object["spec"]["config"].as_array().into_iter().flatten() {
            let mut entry = without_requests(config);
            entry.insert("source".into(), json!(FROM_CLASS));
            entry.insert("requests".into(), json!([name]));
            out.push(Value::Object(entry));
        }
        class_configs.insert(class, start..out.len());
    }
    for config in spec["config"].as_array().into_iter().flatten() {
        let names: Vec<&str> = config["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let applies = names.is_empty()
            || names.iter().any(|n| match n.split_once('/') {
                None => chosen.contains_key(n),
                Some((main, sub)) => chosen.get(main) == Some(&Some(sub)),
            });
        if applies {
            let mut entry = without_requests(config);
            entry.insert("source".into(), json!(FROM_CLAIM));
            if !names.is_empty() {
                entry.insert("requests".into(), json!(names));
            }
            out.push(Value::Object(entry));
        }
    }
    Ok(out)
}

/// The class a request was served from and the name results use for it: the request's
/// own, or its chosen sub-request's (`request/sub`).
fn request_class(request: &Value, main: &str, sub: Option<&str>) -> Option<(String, String)> {
    match sub {
        None => {
            let class = request["exactly"]["deviceClassName"].as_str()?;
            Some((class.to_string(), main.to_string()))
        }
        Some(sub) => {
            let class = request["firstAvailable"]
                .as_array()?
                .iter()
                .find(|s| s["name"].as_str() == Some(sub))?["deviceClassName"]
                .as_str()?;
            Some((class.to_string(), format!("{main}/{sub}")))
        }
    }
}

/// A config entry's fields other than `requests` (the device configuration itself).
fn without_requests(config: &Value) -> Map<String, Value> {
    let mut fields = config.as_object().cloned().unwrap_or_default();
    fields.remove("requests");
    fields.remove("source");
    fields
}

#[cfg(test)]
#[path = "allocation_tests.rs"]
mod tests;
