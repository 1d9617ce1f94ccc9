//! What a node's device plugin answered when its devices were given to a member: the
//! container pieces (environment, mounts, device nodes, annotations, CDI devices) a
//! batch framework needs to run the member there. gangway-agent reports one per
//! member and device-plugin resource; the meta group keeps it with the member's
//! placement, and the group's status shows it. Plain data with bounds, so a plugin's
//! answer cannot grow the replicated state without limit. Called by the front door
//! (validation), the meta group and the agent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::error::{FieldPath, ValidationError};

/// Most entries in each of an allocation's lists and maps.
pub const ALLOCATION_ENTRIES_MAX: usize = 256;
/// Longest string in an allocation.
pub const ALLOCATION_TEXT_MAX: usize = 4_096;
/// Most device-plugin resources one member reports allocations for.
pub const ALLOCATIONS_PER_MEMBER_MAX: usize = 16;
/// Most bytes of text in one allocation, all fields together: what one member's
/// allocations may add to the replicated state and to every read of its group.
pub const ALLOCATION_BYTES_MAX: usize = 64 * 1024;

/// Host path prefixes allocations may name unless the replica is configured otherwise
/// (`--allocation-host-path-prefix`): device nodes, vendor libraries and tools, runtime
/// sockets, plugin state.
pub const HOST_PATH_PREFIXES_DEFAULT: [&str; 5] = ["/dev/", "/opt/", "/run/", "/usr/", "/var/lib/"];
/// Host paths no allocation may name, whatever the prefixes: raw memory and I/O ports.
pub const HOST_PATHS_REFUSED: [&str; 3] = ["/dev/mem", "/dev/kmem", "/dev/port"];

fn absolute(path: &FieldPath, value: &str) -> Result<(), ValidationError> {
    if !value.starts_with('/') || value.split('/').any(|c| c == "..") {
        return Err(path.error(format!(
            "{:?}: an absolute path without \"..\"",
            crate::model::error::clip(value)
        )));
    }
    Ok(())
}

/// `value` with empty and `.` components dropped (`/dev//./mem` is `/dev/mem`).
fn normal_path(value: &str) -> String {
    let parts: Vec<&str> = value
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

fn host_path(path: &FieldPath, value: &str, prefixes: &[String]) -> Result<(), ValidationError> {
    absolute(path, value)?;
    // Compared as the kernel reads it: `//` and `/./` change nothing there.
    let normal = normal_path(value);
    if HOST_PATHS_REFUSED.contains(&normal.as_str()) {
        return Err(path.error(format!("{normal} is never given to a container")));
    }
    if !prefixes.iter().any(|p| normal.starts_with(p.as_str())) {
        return Err(path.error(format!(
            "{:?} is not under an allowed prefix ({}; --allocation-host-path-prefix)",
            crate::model::error::clip(value),
            prefixes.join(", ")
        )));
    }
    Ok(())
}

/// Whether `name` is an environment variable name Kubernetes takes.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The driver name serving a device-plugin resource: `vendor.example/gpu` is served by
/// `gpu.vendor.example` (the device stream's pool and device class).
pub fn driver_for(resource: &str) -> Option<String> {
    let (domain, name) = resource.split_once('/')?;
    Some(format!("{}.{domain}", name.to_ascii_lowercase()))
}

/// The device name gangway gives a plugin's device id: lowercase, every character
/// outside `[a-z0-9-]` as `-`, and no leading or trailing `-`.
pub fn device_name(id: &str) -> String {
    let mapped: String = id
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    mapped.trim_matches('-').to_string()
}

/// A bind mount a plugin asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationMount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// A device node a plugin asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationDevice {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions (`r`, `w`, `m`).
    #[serde(default)]
    pub permissions: String,
}

/// One device-plugin resource's allocation for one member on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocation {
    /// The extended resource (`vendor.example/gpu`).
    pub resource: String,
    /// The plugin's ids of the devices allocated (those gangway chose).
    pub device_ids: Vec<String>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<AllocationMount>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<AllocationDevice>,
    /// Container annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

impl NodeAllocation {
    /// Checks every bound, naming the field at fault.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        if self.resource.is_empty() {
            return Err(path.child("resource").error("required"));
        }
        text(&path.child("resource"), &self.resource)?;
        count(&path.child("device_ids"), self.device_ids.len())?;
        if self.device_ids.is_empty() {
            return Err(path.child("device_ids").error("at least one device"));
        }
        for id in &self.device_ids {
            text(&path.child("device_ids"), id)?;
        }
        count(&path.child("envs"), self.envs.len())?;
        count(&path.child("annotations"), self.annotations.len())?;
        for (field, map) in [("envs", &self.envs), ("annotations", &self.annotations)] {
            for (k, v) in map {
                text(&path.child(field).key(k), k)?;
                text(&path.child(field).key(k), v)?;
            }
        }
        count(&path.child("mounts"), self.mounts.len())?;
        for m in &self.mounts {
            text(&path.child("mounts"), &m.container_path)?;
            text(&path.child("mounts"), &m.host_path)?;
        }
        count(&path.child("devices"), self.devices.len())?;
        for d in &self.devices {
            text(&path.child("devices"), &d.container_path)?;
            text(&path.child("devices"), &d.host_path)?;
            text(&path.child("devices"), &d.permissions)?;
        }
        count(&path.child("cdi_devices"), self.cdi_devices.len())?;
        for c in &self.cdi_devices {
            text(&path.child("cdi_devices"), c)?;
        }
        let bytes = self.bytes();
        if bytes > ALLOCATION_BYTES_MAX {
            return Err(path.error(format!(
                "{bytes} bytes of text, at most {ALLOCATION_BYTES_MAX}"
            )));
        }
        Ok(())
    }

    /// Checks what the allocation would give a container on its host: every mount and
    /// device node an absolute host path under one of `prefixes` (none of them a
    /// [`HOST_PATHS_REFUSED`] device), no `..`, absolute container paths, device
    /// permissions among `r`, `w`, `m`, and environment names as Kubernetes takes them.
    pub fn validate_host_access(
        &self,
        path: &FieldPath,
        prefixes: &[String],
    ) -> Result<(), ValidationError> {
        for (i, m) in self.mounts.iter().enumerate() {
            let at = path.child("mounts").index(i);
            host_path(&at.child("host_path"), &m.host_path, prefixes)?;
            absolute(&at.child("container_path"), &m.container_path)?;
        }
        for (i, d) in self.devices.iter().enumerate() {
            let at = path.child("devices").index(i);
            host_path(&at.child("host_path"), &d.host_path, prefixes)?;
            absolute(&at.child("container_path"), &d.container_path)?;
            if d.permissions.is_empty()
                || d.permissions.len() > 3
                || !d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
            {
                return Err(at
                    .child("permissions")
                    .error(format!("{:?}: any of r, w, m", d.permissions)));
            }
        }
        for name in self.envs.keys() {
            if !is_env_name(name) {
                return Err(path.child("envs").key(name).error(
                    "an environment variable name is letters, digits, '_', '-' or '.', not starting with a digit",
                ));
            }
        }
        Ok(())
    }

    /// Bytes of text over every field.
    pub fn bytes(&self) -> usize {
        let map =
            |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        self.resource.len()
            + self.device_ids.iter().map(String::len).sum::<usize>()
            + map(&self.envs)
            + map(&self.annotations)
            + self
                .mounts
                .iter()
                .map(|m| m.container_path.len() + m.host_path.len())
                .sum::<usize>()
            + self
                .devices
                .iter()
                .map(|d| d.container_path.len() + d.host_path.len() + d.permissions.len())
                .sum::<usize>()
            + self.cdi_devices.iter().map(String::len).sum::<usize>()
    }
}

fn count(path: &FieldPath, n: usize) -> Result<(), ValidationError> {
    if n > ALLOCATION_ENTRIES_MAX {
        return Err(path.error(format!("{n} entries, at most {ALLOCATION_ENTRIES_MAX}")));
    }
    Ok(())
}

fn text(path: &FieldPath, s: &str) -> Result<(), ValidationError> {
    if s.len() > ALLOCATION_TEXT_MAX {
        return Err(path.error(format!("{} bytes, at most {ALLOCATION_TEXT_MAX}", s.len())));
    }
    Ok(())
}

#[cfg(test)]
#[path = "node_allocation_tests.rs"]
mod tests;
