//! Unit tests of `cel_cost.rs`.

use super::*;

fn cost(expr: &str) -> Result<u64, String> {
    let program = cel::Program::compile(expr).map_err(|e| e.to_string())?;
    check(program.expression())
}

fn range(n: usize) -> String {
    let items: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("[{}]", items.join(","))
}

#[test]
fn plain_selectors_are_cheap() {
    for expr in [
            "device.driver == \"gpu.example.com\"",
            "device.attributes[\"gpu.example.com\"].model == \"a100\" && device.capacity[\"gpu.example.com\"].memory.compareTo(quantity(\"40Gi\")) >= 0",
            "device.attributes[\"gpu.example.com\"].exists(k, k.startsWith(\"m\"))",
        ] {
            let c = cost(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert!(c < 1_000, "{expr}: {c}");
        }
}

#[test]
fn nested_loops_multiply_and_three_over_400_are_refused() {
    let r = range(100);
    let one = cost(&format!("{r}.exists(a, a == 99)")).expect("one loop");
    assert!((100..1_000).contains(&one), "{one}");
    let two = cost(&format!("{r}.exists(a, {r}.exists(b, a + b == 198))")).expect("two");
    assert!(two > 90 * one, "{two} vs {one}");
    let r = range(400);
    let three = format!("{r}.exists(a, {r}.exists(b, {r}.exists(c, a + b + c == 0)))");
    let err = cost(&three).expect_err("64 million iterations");
    assert!(err.contains("exceeds the budget of 1000000"), "{err}");
}

#[test]
fn growth_through_strings_and_accumulators_is_bounded_or_refused() {
    // Each replace multiplies the length by ten: six of them make a megabyte.
    let mut expr = "device.driver".to_string();
    for _ in 0..6 {
        expr = format!("{expr}.replace(\"a\", \"aaaaaaaaaa\")");
    }
    let err = cost(&format!("{expr}.size() > 0")).expect_err("ten to the sixth");
    assert!(err.contains("exceeds the budget"), "{err}");
    // map() builds a list as long as its range.
    let r = range(100);
    let mapped = cost(&format!("{r}.map(x, x * 2).exists(y, y == 4)")).expect("map");
    assert!(mapped < 10_000, "{mapped}");
}
