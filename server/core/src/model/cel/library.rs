//! The Kubernetes CEL libraries a selector may call (quantity, semver, list and string
//! helpers), registered into the environment. Part of `model/cel.rs`.

use super::*;

pub(super) fn function_error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

pub(super) fn quantity(s: &CelString<'_>) -> Result<QuantityVal, ExecutionError> {
    parse_nano(s.inner())
        .map(QuantityVal)
        .map_err(|e| function_error("quantity", e))
}

pub(super) fn is_quantity(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_nano(s.inner()).is_ok())
}

pub(super) fn quantity_is_greater_than(a: &QuantityVal, b: &QuantityVal) -> CelBool {
    CelBool::from(a.0 > b.0)
}

pub(super) fn quantity_is_less_than(a: &QuantityVal, b: &QuantityVal) -> CelBool {
    CelBool::from(a.0 < b.0)
}

pub(super) fn ordering_int(order: Ordering) -> CelInt {
    CelInt::from(match order {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })
}

pub(super) fn quantity_compare_to(a: &QuantityVal, b: &QuantityVal) -> CelInt {
    ordering_int(a.0.cmp(&b.0))
}

pub(super) fn quantity_add(
    a: &QuantityVal,
    b: &QuantityVal,
) -> Result<QuantityVal, ExecutionError> {
    a.0.checked_add(b.0)
        .map(QuantityVal)
        .ok_or_else(|| function_error("add", "quantity overflow"))
}

pub(super) fn quantity_sub(
    a: &QuantityVal,
    b: &QuantityVal,
) -> Result<QuantityVal, ExecutionError> {
    a.0.checked_sub(b.0)
        .map(QuantityVal)
        .ok_or_else(|| function_error("sub", "quantity overflow"))
}

pub(super) fn units_of(n: &CelInt) -> Option<i128> {
    i128::from(*n.inner()).checked_mul(NANO_PER_UNIT)
}

pub(super) fn quantity_add_int(a: &QuantityVal, b: &CelInt) -> Result<QuantityVal, ExecutionError> {
    units_of(b)
        .and_then(|b| a.0.checked_add(b))
        .map(QuantityVal)
        .ok_or_else(|| function_error("add", "quantity overflow"))
}

pub(super) fn quantity_sub_int(a: &QuantityVal, b: &CelInt) -> Result<QuantityVal, ExecutionError> {
    units_of(b)
        .and_then(|b| a.0.checked_sub(b))
        .map(QuantityVal)
        .ok_or_else(|| function_error("sub", "quantity overflow"))
}

pub(super) fn quantity_sign(a: &QuantityVal) -> CelInt {
    ordering_int(a.0.cmp(&0))
}

/// The value as an `int`, if it is whole and fits.
pub(super) fn whole_units(a: &QuantityVal) -> Option<i64> {
    if a.0 % NANO_PER_UNIT != 0 {
        return None;
    }
    i64::try_from(a.0 / NANO_PER_UNIT).ok()
}

pub(super) fn quantity_is_integer(a: &QuantityVal) -> CelBool {
    CelBool::from(whole_units(a).is_some())
}

pub(super) fn quantity_as_integer(a: &QuantityVal) -> Result<CelInt, ExecutionError> {
    whole_units(a)
        .map(CelInt::from)
        .ok_or_else(|| function_error("asInteger", "cannot convert value to integer"))
}

pub(super) fn quantity_as_approximate_float(a: &QuantityVal) -> CelDouble {
    CelDouble::from(a.0 as f64 / NANO_PER_UNIT as f64)
}

pub(super) fn semver(s: &CelString<'_>) -> Result<SemverVal, ExecutionError> {
    Semver::parse(s.inner())
        .map(SemverVal)
        .map_err(|e| function_error("semver", e))
}

pub(super) fn is_semver(s: &CelString<'_>) -> CelBool {
    CelBool::from(Semver::parse(s.inner()).is_ok())
}

pub(super) fn semver_is_greater_than(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.0.precedence(&b.0) == Ordering::Greater)
}

pub(super) fn semver_is_less_than(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.0.precedence(&b.0) == Ordering::Less)
}

pub(super) fn semver_compare_to(a: &SemverVal, b: &SemverVal) -> CelInt {
    ordering_int(a.0.precedence(&b.0))
}

pub(super) fn clamp_int(n: u64) -> CelInt {
    CelInt::from(i64::try_from(n).unwrap_or(i64::MAX))
}

pub(super) fn semver_major(a: &SemverVal) -> CelInt {
    clamp_int(a.0.major())
}

pub(super) fn semver_minor(a: &SemverVal) -> CelInt {
    clamp_int(a.0.minor())
}

pub(super) fn semver_patch(a: &SemverVal) -> CelInt {
    clamp_int(a.0.patch())
}

pub(super) fn register_kubernetes(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn quantity: (CelString) -> Result<QuantityVal>, id = "string_to_quantity")?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool, id = "is_quantity_string")?;
    cel::add_member_overload!(env, fn quantity_is_greater_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isGreaterThan", id = "quantity_is_greater_than")?;
    cel::add_member_overload!(env, fn quantity_is_less_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isLessThan", id = "quantity_is_less_than")?;
    cel::add_member_overload!(env, fn quantity_compare_to: (QuantityVal, QuantityVal) -> CelInt,
        name = "compareTo", id = "quantity_compare_to")?;
    cel::add_member_overload!(env, fn quantity_add: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        name = "add", id = "quantity_add")?;
    cel::add_member_overload!(env, fn quantity_add_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "add", id = "quantity_add_int")?;
    cel::add_member_overload!(env, fn quantity_sub: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        name = "sub", id = "quantity_sub")?;
    cel::add_member_overload!(env, fn quantity_sub_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "sub", id = "quantity_sub_int")?;
    cel::add_member_overload!(env, fn quantity_sign: (QuantityVal) -> CelInt,
        name = "sign", id = "quantity_sign")?;
    cel::add_member_overload!(env, fn quantity_is_integer: (QuantityVal) -> CelBool,
        name = "isInteger", id = "quantity_is_integer")?;
    cel::add_member_overload!(env, fn quantity_as_integer: (QuantityVal) -> Result<CelInt>,
        name = "asInteger", id = "quantity_as_integer")?;
    cel::add_member_overload!(env, fn quantity_as_approximate_float: (QuantityVal) -> CelDouble,
        name = "asApproximateFloat", id = "quantity_as_approximate_float")?;
    cel::add_overload!(env, fn semver: (CelString) -> Result<SemverVal>, id = "string_to_semver")?;
    cel::add_overload!(env, fn is_semver: (CelString) -> CelBool, id = "is_semver_string")?;
    cel::add_member_overload!(env, fn semver_is_greater_than: (SemverVal, SemverVal) -> CelBool,
        name = "isGreaterThan", id = "semver_is_greater_than")?;
    cel::add_member_overload!(env, fn semver_is_less_than: (SemverVal, SemverVal) -> CelBool,
        name = "isLessThan", id = "semver_is_less_than")?;
    cel::add_member_overload!(env, fn semver_compare_to: (SemverVal, SemverVal) -> CelInt,
        name = "compareTo", id = "semver_compare_to")?;
    cel::add_member_overload!(env, fn semver_major: (SemverVal) -> CelInt,
        name = "major", id = "semver_major")?;
    cel::add_member_overload!(env, fn semver_minor: (SemverVal) -> CelInt,
        name = "minor", id = "semver_minor")?;
    cel::add_member_overload!(env, fn semver_patch: (SemverVal) -> CelInt,
        name = "patch", id = "semver_patch")?;
    cel::add_member_overload!(env, fn list_includes_string: (CelList, CelString) -> CelBool,
        name = "includes", id = "list_includes_string")?;
    cel::add_member_overload!(env, fn list_includes_int: (CelList, CelInt) -> CelBool,
        name = "includes", id = "list_includes_int")?;
    cel::add_member_overload!(env, fn list_includes_bool: (CelList, CelBool) -> CelBool,
        name = "includes", id = "list_includes_bool")?;
    cel::add_member_overload!(env, fn list_includes_semver: (CelList, SemverVal) -> CelBool,
        name = "includes", id = "list_includes_semver")?;
    cel::add_member_overload!(env, fn string_includes: (CelString, CelString) -> CelBool,
        name = "includes", id = "string_includes")?;
    cel::add_member_overload!(env, fn int_includes: (CelInt, CelInt) -> CelBool,
        name = "includes", id = "int_includes")?;
    cel::add_member_overload!(env, fn bool_includes: (CelBool, CelBool) -> CelBool,
        name = "includes", id = "bool_includes")?;
    cel::add_member_overload!(env, fn semver_includes: (SemverVal, SemverVal) -> CelBool,
        name = "includes", id = "semver_includes")?;
    Ok(())
}

/// Whether a list attribute holds `value` (an item equal to it).
pub(super) fn list_holds(list: &CelList<'_>, value: &dyn Val) -> CelBool {
    CelBool::from(list.iter().any(|item| item.equals(value)))
}

pub(super) fn list_includes_string(list: &CelList<'_>, value: &CelString<'_>) -> CelBool {
    list_holds(list, value)
}

pub(super) fn list_includes_int(list: &CelList<'_>, value: &CelInt) -> CelBool {
    list_holds(list, value)
}

pub(super) fn list_includes_bool(list: &CelList<'_>, value: &CelBool) -> CelBool {
    list_holds(list, value)
}

pub(super) fn list_includes_semver(list: &CelList<'_>, value: &SemverVal) -> CelBool {
    list_holds(list, value)
}

pub(super) fn string_includes(a: &CelString<'_>, b: &CelString<'_>) -> CelBool {
    CelBool::from(a.equals(b))
}

pub(super) fn int_includes(a: &CelInt, b: &CelInt) -> CelBool {
    CelBool::from(a.equals(b))
}

pub(super) fn bool_includes(a: &CelBool, b: &CelBool) -> CelBool {
    CelBool::from(a.equals(b))
}

pub(super) fn semver_includes(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.equals(b))
}

/// Attribute and capacity maps of a device by domain, as selectors see them (for tests
/// and diagnostics).
pub fn domains_of(driver: &str, device: &Device) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in device.attributes.keys().chain(device.capacity.keys()) {
        let (domain, id) = split_qualified(driver, name);
        out.entry(domain.to_string())
            .or_default()
            .push(id.to_string());
    }
    out
}
