//! Unit tests of `cel.rs`.

use super::*;
use crate::model::device::{DeviceCapacity, DeviceQuantity};

const DRIVER: &str = "gpu.example.com";

fn gpu(model: &str, memory: &str) -> Device {
    let mut d = Device::new("gpu-0");
    d.attributes
        .insert("model".into(), AttributeValue::String(model.into()));
    d.attributes
        .insert("cores".into(), AttributeValue::Int(128));
    d.attributes.insert(
        "driverVersion".into(),
        AttributeValue::Version("1.2.3".into()),
    );
    d.attributes
        .insert("numa.example.com/node".into(), AttributeValue::Int(1));
    d.capacity.insert(
        "memory".into(),
        DeviceCapacity::fixed(DeviceQuantity::parse(memory).expect("quantity")),
    );
    d
}

fn eval(expr: &str, device: &Device) -> Result<bool, String> {
    let selector = compile_selector(expr)?;
    selector.matches(DRIVER, device).map_err(|e| e.to_string())
}

/// List attributes (DRAListTypeAttributes): `includes` on lists and scalars alike
/// (so a selector survives a driver moving an attribute from one to the other),
/// CEL's `in` and size on lists, and `includes` refused at compile time where its
/// argument is a list or map.
#[test]
fn list_attributes_and_includes() {
    let mut d = gpu("a100", "40Gi");
    d.attributes.insert(
        "models".into(),
        AttributeValue::Strings(vec!["a100".into(), "a100-sxm".into()].into()),
    );
    d.attributes.insert(
        "numa.example.com/nodes".into(),
        AttributeValue::Ints(vec![0, 1].into()),
    );
    d.attributes
        .insert("flags".into(), AttributeValue::Bools(vec![true].into()));
    d.attributes.insert(
        "firmware".into(),
        AttributeValue::Versions(vec!["1.2.3".into(), "2.0.0".into()].into()),
    );
    let attr = |name: &str| format!(r#"device.attributes["gpu.example.com"].{name}"#);
    let yes = [
        format!(r#"{}.includes("a100-sxm")"#, attr("models")),
        format!(r#"{}.includes("a100")"#, attr("model")),
        r#"device.attributes["numa.example.com"].nodes.includes(1)"#.to_string(),
        r#"device.attributes["numa.example.com"].node.includes(1)"#.to_string(),
        format!("{}.includes(true)", attr("flags")),
        format!(r#"{}.includes(semver("2.0.0"))"#, attr("firmware")),
        format!(r#"{}.includes(semver("1.2.3"))"#, attr("driverVersion")),
        format!(r#""a100" in {}"#, attr("models")),
        format!("size({}) == 2", attr("models")),
        format!(r#"{}.exists(v, v.startsWith("a100-"))"#, attr("models")),
    ];
    for expr in &yes {
        assert_eq!(eval(expr, &d), Ok(true), "{expr}");
    }
    let no = [
        format!(r#"{}.includes("h100")"#, attr("models")),
        format!(r#"{}.includes("h100")"#, attr("model")),
        r#"device.attributes["numa.example.com"].nodes.includes(2)"#.to_string(),
        format!(r#"{}.includes(semver("3.0.0"))"#, attr("firmware")),
    ];
    for expr in &no {
        assert_eq!(eval(expr, &d), Ok(false), "{expr}");
    }
    for bad in [
        format!(r#"{}.includes(["a100"])"#, attr("models")),
        format!(r#"{}.includes({{"a": 1}})"#, attr("models")),
    ] {
        assert!(compile_selector(&bad).is_err(), "{bad} compiles");
    }
}

#[test]
fn kubernetes_shapes_and_quantities() {
    let d = gpu("a100", "40Gi");
    let yes = [
        r#"device.driver == "gpu.example.com""#,
        r#"device.attributes["gpu.example.com"].model == "a100""#,
        r#"device.attributes["gpu.example.com"].cores > 64"#,
        r#"device.attributes["numa.example.com"].node == 1"#,
        r#"device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("16Gi"))"#,
        r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) == 0"#,
        r#"device.capacity["gpu.example.com"].memory == quantity("42949672960")"#,
        r#"quantity("1") == quantity("1000m")"#,
        r#"quantity("1.5").add(1).isGreaterThan(quantity("2"))"#,
        r#"quantity("-1").sign() == -1 && quantity("2k").asInteger() == 2000"#,
        r#"!quantity("1500m").isInteger() && quantity("1500m").asApproximateFloat() == 1.5"#,
        r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.2.0"))"#,
        r#"device.attributes["gpu.example.com"].driverVersion == semver("1.2.3+build")"#,
        r#"device.attributes["gpu.example.com"].driverVersion.major() == 1"#,
        r#""model" in device.attributes["gpu.example.com"]"#,
        r#"!("model" in device.attributes["other.example.com"])"#,
        r#"!has(device.attributes["gpu.example.com"].missing)"#,
        r#"device.attributes["gpu.example.com"].model.startsWith("a1")"#,
        r#"isQuantity("1Gi") && !isQuantity("1GB") && isSemver("1.0.0")"#,
        r#"device.allowMultipleAllocations == false"#,
    ];
    for expr in yes {
        assert_eq!(eval(expr, &d), Ok(true), "{expr}");
    }
    assert_eq!(
        eval(
            r#"device.capacity["gpu.example.com"].memory.isLessThan(quantity("16Gi"))"#,
            &d
        ),
        Ok(false)
    );
}

#[test]
fn missing_keys_are_runtime_errors() {
    let d = gpu("a100", "40Gi");
    let err = eval(r#"device.attributes["gpu.example.com"].missing == "x""#, &d)
        .expect_err("missing attribute");
    assert!(err.contains("missing"), "{err}");
    assert!(eval(r#"device.attributes["other.example.com"].model == "x""#, &d).is_err());
    assert!(eval(r#"quantity("bad") == quantity("1")"#, &d).is_err());
}

#[test]
fn deep_nesting_is_refused_not_a_crash() {
    let cases = [
        format!("{}true{}", "(".repeat(4_000), ")".repeat(4_000)),
        format!("{}true", "!".repeat(9_000)),
        format!("{}1{}", "[".repeat(4_000), "]".repeat(4_000)),
        format!(
            "\"{}\" == \"x\" && {}true{}",
            "(".repeat(100),
            "(".repeat(33),
            ")".repeat(33)
        ),
    ];
    for expr in cases {
        let Err(err) = compile_selector(&expr) else {
            panic!("too deep: {}", crate::model::clip(&expr));
        };
        assert!(err.contains("deeper"), "{err}");
    }
    // Brackets inside strings do not count; long flat chains are fine (the parser
    // balances them), as are member chains up to the type check's depth.
    assert!(compile_selector(&format!("\"{}\" == \"x\"", "(".repeat(100))).is_ok());
    assert!(compile_selector(&format!("true{}", " && true".repeat(1_200))).is_ok());
    let chain = format!("device{}.driver == \"x\"", ".attributes[\"a\"]".repeat(300));
    assert!(compile_selector(&chain).is_err(), "300 nested selections");
}

#[test]
fn a_costly_selector_is_refused_with_its_cost() {
    let items: Vec<String> = (0..400).map(|i| i.to_string()).collect();
    let r = format!("[{}]", items.join(","));
    let expr = format!("{r}.exists(a, {r}.exists(b, {r}.exists(c, a + b + c == 0)))");
    let err = compile_selector(&expr).expect_err("costly");
    assert!(
        err.contains("estimated cost") && err.contains("1000000"),
        "{err}"
    );
}

#[test]
fn compile_errors_and_non_bool_results() {
    let bad = [
        ("device.driver ==", "compilation failed"),
        ("device.driver", "must evaluate to bool"),
        ("1 + 2", "must evaluate to bool"),
        (r#"quantity("1Gi")"#, "must evaluate to bool"),
        ("nodes.size() > 1", "undeclared reference to 'nodes'"),
        ("device.name == 'x'", "undefined field 'name'"),
        ("frobnicate(device)", "undeclared reference to 'frobnicate'"),
        (r#"quantity("1") < quantity("2")"#, "no matching overload"),
        (r#"device.driver > 1"#, "no matching overload"),
        ("", "must not be empty"),
    ];
    for (expr, want) in bad {
        let err = compile_selector(expr).expect_err(expr);
        assert!(err.contains(want), "{expr}: {err}");
    }
    // Unknown until run time: accepted, as Kubernetes accepts `any`.
    assert!(compile_selector(r#"device.attributes["a.b"].c"#).is_ok());
}

#[test]
fn compiled_selectors_are_cached() {
    let a = compile_selector("device.driver == 'x'").expect("compiles");
    let b = compile_selector("device.driver == 'x'").expect("compiles");
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.source(), "device.driver == 'x'");
    let domains = domains_of(DRIVER, &gpu("a", "1Gi"));
    assert_eq!(domains.get("numa.example.com").map(Vec::len), Some(1));
}
