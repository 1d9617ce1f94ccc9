use std::collections::BTreeMap;

use super::*;
use crate::model::device::AttributeValue;
use crate::wire::{self, WireFormat};

fn device(name: &str, model: &str) -> Device {
    let mut d = Device::new(name);
    d.attributes
        .insert("model".into(), AttributeValue::String(model.into()));
    d
}

#[test]
fn pool_devices_encode_as_the_map_by_name_they_replace_and_decode_back() {
    let devices = vec![
        device("gpu-1", "b"),
        device("gpu-0", "a"),
        device("gpu-2", "c"),
    ];
    let pool = PoolDevices::of(devices.clone());
    let map: BTreeMap<String, Device> = devices
        .into_iter()
        .map(|d| (d.name.to_string(), d))
        .collect();
    assert_eq!(
        pool.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
        ["gpu-0", "gpu-1", "gpu-2"]
    );
    assert_eq!(pool.get("gpu-1"), map.get("gpu-1"));
    assert!(pool.get("gpu-9").is_none());
    for format in [WireFormat::Binary, WireFormat::Json] {
        let bytes = format.encode(&pool).expect("encodes");
        assert_eq!(bytes, format.encode(&map).expect("encodes"), "{format:?}");
        let back: PoolDevices = wire::decode(&bytes).expect("decodes");
        assert_eq!(back, pool);
    }
}

#[test]
fn of_two_devices_with_one_name_the_last_is_kept() {
    let pool = PoolDevices::of(vec![device("gpu-0", "first"), device("gpu-0", "last")]);
    assert_eq!(pool.len(), 1);
    assert_eq!(
        pool["gpu-0"].attributes.get("model"),
        Some(&AttributeValue::String("last".into()))
    );
}
