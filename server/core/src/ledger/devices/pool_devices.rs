//! A pool's devices as the ledger keeps them: one slice sorted by name.
//!
//! Owns [`PoolDevices`]. Invariant: sorted by device name without duplicates, so it
//! iterates and encodes exactly like the `BTreeMap<String, Device>` it replaced. Part of
//! [`super::PublishedPool`]; read by the ledger's accounting and the engine's device
//! tables.

use serde::{Deserialize, Serialize};

use crate::model::compact::{sorted_last_wins, SmallMap, Symbol};
use crate::model::device::Device;

/// A pool's devices sorted by name: each device's own name is its key, kept once.
///
/// Encodes as a map from name to device, as the `BTreeMap` it replaces did (which wrote
/// each name twice, as key and in the device); decoding names each device by its key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolDevices {
    devices: Box<[Device]>,
}

impl PoolDevices {
    /// The devices, sorted by name; of two with one name the last is kept (validated
    /// pools have none).
    pub fn of(devices: Vec<Device>) -> Self {
        Self {
            devices: sorted_last_wins(devices, |d| &d.name).into_boxed_slice(),
        }
    }

    /// The device named `name`.
    pub fn get(&self, name: &str) -> Option<&Device> {
        let i = self
            .devices
            .binary_search_by(|d| d.name.as_str().cmp(name))
            .ok()?;
        self.devices.get(i)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The devices in name order.
    pub fn values(&self) -> std::slice::Iter<'_, Device> {
        self.devices.iter()
    }

    /// The devices in name order, to change anything but their names (which order them).
    pub(crate) fn values_mut(&mut self) -> std::slice::IterMut<'_, Device> {
        self.devices.iter_mut()
    }

    /// (name, device) in name order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Symbol, &Device)> {
        self.devices.iter().map(|d| (&d.name, d))
    }

    /// The names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &Symbol> {
        self.devices.iter().map(|d| &d.name)
    }
}

impl std::ops::Index<&str> for PoolDevices {
    type Output = Device;

    /// The device named `name`; panics if there is none, as indexing a map does.
    fn index(&self, name: &str) -> &Device {
        match self.get(name) {
            Some(device) => device,
            None => panic!("no device named {name}"),
        }
    }
}

impl Serialize for PoolDevices {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.devices.len()))?;
        for device in self.devices.iter() {
            map.serialize_entry(&device.name, device)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PoolDevices {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let named: SmallMap<Symbol, Device> = SmallMap::deserialize(deserializer)?;
        Ok(Self::of(
            named
                .into_iter()
                .map(|(name, mut device)| {
                    device.name = name;
                    device
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
#[path = "pool_devices_tests.rs"]
mod tests;
