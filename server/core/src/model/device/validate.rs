//! Checks of devices and pools as a driver publishes them: reach, counters, attributes,
//! capacities, taints, and the names Kubernetes allows. Every error names its field.
//! Part of `model/device.rs`.

use super::*;

/// Checks that the devices of a pool serving `reach` say where they are reachable
/// exactly when the pool lets each device say (`perDeviceNodeSelection`); errors
/// name the device (under `path`, the pool's spec). A node's pool has no reach.
pub fn validate_device_reach(
    path: &FieldPath,
    reach: Option<&PoolReach>,
    devices: &[Device],
) -> Result<(), ValidationError> {
    let per_device = reach == Some(&PoolReach::PerDevice);
    for (i, device) in devices.iter().enumerate() {
        let at = || path.child("devices").index(i);
        match (per_device, &device.reach) {
            (true, None) => {
                return Err(at().error(
                    "must set one of nodeName, nodeSelector or allNodes (perDeviceNodeSelection)",
                ))
            }
            (false, Some(_)) => return Err(at().error(
                "nodeName, nodeSelector and allNodes are for slices with perDeviceNodeSelection",
            )),
            _ => {}
        }
    }
    Ok(())
}

/// [`ResourcePool::validate`] on a pool's parts.
pub fn validate_pool(
    path: &FieldPath,
    driver: &str,
    name: &str,
    devices: &[Device],
    counter_sets: &[CounterSet],
) -> Result<(), ValidationError> {
    validate_driver_name(&path.child("driver"), driver)?;
    validate_pool_name(&path.child("pool").child("name"), name)?;
    let sets_path = path.child("sharedCounters");
    if counter_sets.len() > COUNTER_SETS_MAX {
        return Err(sets_path.error(format!(
            "at most {COUNTER_SETS_MAX} counter sets, got {}",
            counter_sets.len()
        )));
    }
    let mut sets: BTreeMap<&str, &CounterSet> = BTreeMap::new();
    for (i, set) in counter_sets.iter().enumerate() {
        let at = sets_path.index(i);
        validate_dns_label(&at.child("name"), &set.name)?;
        if sets.insert(&set.name, set).is_some() {
            return Err(at
                .child("name")
                .error(format!("duplicate counter set name \"{}\"", set.name)));
        }
        validate_counters(&at.child("counters"), &set.counters)?;
    }
    let devices_path = path.child("devices");
    if devices.len() > POOL_DEVICES_MAX {
        return Err(devices_path.error(format!(
            "at most {POOL_DEVICES_MAX} devices per pool, got {}",
            devices.len()
        )));
    }
    let mut names = BTreeSet::new();
    for (i, device) in devices.iter().enumerate() {
        let at = || devices_path.index(i);
        if !names.insert(device.name.as_str()) {
            return Err(at()
                .child("name")
                .error(format!("duplicate device name \"{}\"", device.name)));
        }
        validate_device(&at, device, &sets)?;
    }
    Ok(())
}

pub(super) fn validate_counters(
    path: &FieldPath,
    counters: &BTreeMap<String, DeviceQuantity>,
) -> Result<(), ValidationError> {
    if counters.is_empty() {
        return Err(path.error("must name at least one counter"));
    }
    if counters.len() > COUNTERS_PER_SET_MAX {
        return Err(path.error(format!(
            "at most {COUNTERS_PER_SET_MAX} counters, got {}",
            counters.len()
        )));
    }
    for name in counters.keys() {
        validate_c_identifier(&path.key(name), name)?;
    }
    Ok(())
}

/// Runs `check` without building a path; only when it fails is it run again with
/// `path()`, so that valid input builds no path strings.
pub(super) fn lazily(
    path: impl Fn() -> FieldPath,
    check: impl Fn(&FieldPath) -> Result<(), ValidationError>,
) -> Result<(), ValidationError> {
    match check(&FieldPath::root()) {
        Ok(()) => Ok(()),
        Err(_) => check(&path()),
    }
}

pub(super) fn validate_device(
    path: &dyn Fn() -> FieldPath,
    device: &Device,
    sets: &BTreeMap<&str, &CounterSet>,
) -> Result<(), ValidationError> {
    lazily(
        || path().child("name"),
        |p| validate_dns_label(p, &device.name),
    )?;
    match device.reach.as_deref() {
        None => {}
        Some(PoolReach::PerDevice) => {
            return Err(path().error("a device's own reach is nodeName, nodeSelector or allNodes"))
        }
        Some(reach) => reach.validate(&path())?,
    }
    let named = device.attributes.len() + device.capacity.len();
    if named > DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX {
        return Err(path().error(format!(
            "at most {DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX} attributes and capacities per device, got {named}"
        )));
    }
    for (name, value) in &device.attributes {
        lazily(
            || path().child("attributes").key(name),
            |at| {
                validate_attribute_name(at, name)?;
                validate_attribute_value(at, value)
            },
        )?;
    }
    let values: usize = device
        .attributes
        .values()
        .map(AttributeValue::value_count)
        .sum();
    if values > DEVICE_ATTRIBUTE_VALUES_MAX {
        return Err(path().child("attributes").error(format!(
            "at most {DEVICE_ATTRIBUTE_VALUES_MAX} attribute values per device (list items count one each), got {values}"
        )));
    }
    for (name, capacity) in &device.capacity {
        lazily(
            || path().child("capacity").key(name),
            |at| {
                validate_attribute_name(at, name)?;
                validate_capacity(at, capacity)
            },
        )?;
    }
    let consumes = || path().child("consumesCounters");
    if device.consumes_counters.len() > CONSUMED_COUNTER_SETS_MAX {
        return Err(consumes().error(format!(
            "at most {CONSUMED_COUNTER_SETS_MAX} counter sets per device, got {}",
            device.consumes_counters.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (i, use_) in device.consumes_counters.iter().enumerate() {
        let at = || consumes().index(i);
        let Some(set) = sets.get(use_.counter_set.as_str()) else {
            return Err(at().child("counterSet").error(format!(
                "counter set \"{}\" is not declared by the pool",
                use_.counter_set
            )));
        };
        if !seen.insert(use_.counter_set.as_str()) {
            return Err(at()
                .child("counterSet")
                .error(format!("counter set \"{}\" listed twice", use_.counter_set)));
        }
        lazily(
            || at().child("counters"),
            |p| validate_counters(p, &use_.counters),
        )?;
        for name in use_.counters.keys() {
            if !set.counters.contains_key(name) {
                return Err(at().child("counters").key(name).error(format!(
                    "counter \"{name}\" is not in counter set \"{}\"",
                    set.name
                )));
            }
        }
    }
    let taints = || path().child("taints");
    if device.taints.len() > DEVICE_TAINTS_MAX {
        return Err(taints().error(format!(
            "at most {DEVICE_TAINTS_MAX} taints per device, got {}",
            device.taints.len()
        )));
    }
    for (i, taint) in device.taints.iter().enumerate() {
        lazily(|| taints().index(i), |p| validate_device_taint(p, taint))?;
        if device.taints[..i]
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect)
        {
            return Err(taints().index(i).error(format!(
                "duplicate taint \"{}\" with effect {}",
                taint.key, taint.effect
            )));
        }
    }
    Ok(())
}

/// Checks one device taint.
pub fn validate_device_taint(path: &FieldPath, taint: &DeviceTaint) -> Result<(), ValidationError> {
    validate_qualified_name(&path.child("key"), &taint.key)?;
    validate_label_value(&path.child("value"), &taint.value)
}

pub(super) fn validate_attribute_value(
    path: &FieldPath,
    value: &AttributeValue,
) -> Result<(), ValidationError> {
    let long = |at: FieldPath, s: &str| {
        if s.len() > ATTRIBUTE_VALUE_LENGTH_MAX {
            Err(at.error(format!("longer than {ATTRIBUTE_VALUE_LENGTH_MAX} bytes")))
        } else {
            Ok(())
        }
    };
    let version = |at: FieldPath, v: &str| Semver::parse(v).map(|_| ()).map_err(|e| at.error(e));
    let list = |field: &str, len: usize| {
        if len == 0 {
            Err(path.child(field).error("must not be empty"))
        } else {
            Ok(())
        }
    };
    match value {
        AttributeValue::String(s) => long(path.child("string"), s),
        AttributeValue::Version(v) => version(path.child("version"), v),
        AttributeValue::Int(_) | AttributeValue::Bool(_) => Ok(()),
        AttributeValue::Ints(l) => list("ints", l.len()),
        AttributeValue::Bools(l) => list("bools", l.len()),
        AttributeValue::Strings(l) => {
            list("strings", l.len())?;
            for (i, s) in l.iter().enumerate() {
                long(path.child("strings").index(i), s)?;
            }
            Ok(())
        }
        AttributeValue::Versions(l) => {
            list("versions", l.len())?;
            for (i, v) in l.iter().enumerate() {
                version(path.child("versions").index(i), v)?;
            }
            Ok(())
        }
    }
}

pub(super) fn validate_capacity(
    path: &FieldPath,
    capacity: &DeviceCapacity,
) -> Result<(), ValidationError> {
    let Some(policy) = &capacity.request_policy else {
        return Ok(());
    };
    let at = path.child("requestPolicy");
    if let Some(default) = policy.default {
        if default > capacity.value {
            return Err(at.child("default").error(format!(
                "default {default} exceeds the capacity {}",
                capacity.value
            )));
        }
    }
    match &policy.valid {
        CapacityValidity::Any => Ok(()),
        CapacityValidity::Values(values) => {
            let values_path = at.child("validValues");
            if values.is_empty() || values.len() > POLICY_VALID_VALUES_MAX {
                return Err(
                    values_path.error(format!("must list 1 to {POLICY_VALID_VALUES_MAX} values"))
                );
            }
            if values.windows(2).any(|w| w[0] >= w[1]) {
                return Err(values_path.error("must be strictly ascending"));
            }
            if values.iter().any(|v| *v > capacity.value) {
                return Err(values_path.error("values may not exceed the capacity"));
            }
            match policy.default {
                Some(d) if !values.contains(&d) => Err(at
                    .child("default")
                    .error("default must be one of the valid values")),
                _ => Ok(()),
            }
        }
        CapacityValidity::Range { min, max, step } => {
            let range = at.child("validRange");
            if *min > capacity.value {
                return Err(range.child("min").error("min exceeds the capacity"));
            }
            if let Some(max) = max {
                if max < min || *max > capacity.value {
                    return Err(range
                        .child("max")
                        .error("max must be within min and the capacity"));
                }
            }
            if let Some(step) = step {
                if step.nano() == 0 {
                    return Err(range.child("step").error("step must be positive"));
                }
            }
            match policy.default {
                Some(d) if capacity.consumed_by(Some(d)) != Some(d) => Err(at
                    .child("default")
                    .error("default must be a valid amount of the range")),
                _ => Ok(()),
            }
        }
    }
}

/// Checks a driver name: a DNS subdomain of at most [`DRIVER_NAME_LENGTH_MAX`] bytes.
pub fn validate_driver_name(path: &FieldPath, name: &str) -> Result<(), ValidationError> {
    if name.len() > DRIVER_NAME_LENGTH_MAX {
        return Err(path.error(format!(
            "driver name is longer than {DRIVER_NAME_LENGTH_MAX} characters"
        )));
    }
    validate_dns_subdomain(path, name)
}

/// Checks a pool name: DNS subdomains separated by `/`, at most [`POOL_NAME_LENGTH_MAX`] bytes.
pub fn validate_pool_name(path: &FieldPath, name: &str) -> Result<(), ValidationError> {
    if name.is_empty() || name.len() > POOL_NAME_LENGTH_MAX {
        return Err(path.error(format!(
            "pool name must have 1 to {POOL_NAME_LENGTH_MAX} characters"
        )));
    }
    for part in name.split('/') {
        validate_dns_subdomain(path, part)?;
    }
    Ok(())
}

/// Checks a C identifier of at most [`ATTRIBUTE_ID_LENGTH_MAX`] bytes.
pub(super) fn validate_c_identifier(path: &FieldPath, id: &str) -> Result<(), ValidationError> {
    let mut bytes = id.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && id.len() <= ATTRIBUTE_ID_LENGTH_MAX
    {
        Ok(())
    } else {
        Err(path.error(format!(
            "invalid name \"{id}\": must be a C identifier of at most {ATTRIBUTE_ID_LENGTH_MAX} characters"
        )))
    }
}

/// Checks an attribute or capacity name: `id` or `domain/id` (domain a DNS subdomain
/// of at most 63 characters, id a C identifier).
pub fn validate_attribute_name(path: &FieldPath, name: &str) -> Result<(), ValidationError> {
    match name.split_once('/') {
        Some((domain, id)) => {
            if domain.len() > DNS1123_LABEL_MAX {
                return Err(path.error(format!(
                    "domain \"{domain}\" is longer than {DNS1123_LABEL_MAX} characters"
                )));
            }
            validate_dns_subdomain(path, domain)?;
            validate_c_identifier(path, id)
        }
        None => validate_c_identifier(path, name),
    }
}
