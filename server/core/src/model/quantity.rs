//! Kubernetes resource quantities.
//!
//! Owns parsing of quantity strings exactly as `k8s.io/apimachinery/pkg/api/resource`
//! accepts them: an optional sign, a decimal number (`1`, `1.5`, `.5`, `1.`), and one
//! suffix: binary SI (`Ki` … `Ei`), decimal SI (`n`, `u`, `m`, ``, `k`, `M`, `G`, `T`,
//! `P`, `E`) or a decimal exponent (`e3`, `E-2`). Conversions round up, like
//! Kubernetes' `Value()` and `MilliValue()`. Invariants: a parsed [`Quantity`] is never
//! negative (`-0` is zero), and conversions never overflow silently: a value that does
//! not fit in `u64` is an error. [`parse_nano`] gives the signed, exact nano-unit value
//! Kubernetes stores (device capacities, counters, CEL quantities). Deliberate
//! strictness beyond Kubernetes: a sign or a dot with no digit at all (`"-"`, `"."`)
//! is rejected. Called by model validation and the CEL library.

use std::fmt;

/// Largest number of significant mantissa digits accepted (fits in a `u128`).
const MANTISSA_DIGITS_MAX: usize = 38;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantityErrorKind {
    /// The string is empty.
    Empty,
    /// The string does not follow the quantity grammar.
    Malformed,
    /// The value is below zero.
    Negative,
    /// The value does not fit in the target unit as an unsigned 64-bit integer.
    OutOfRange,
    /// The value has a fractional part where only whole numbers are allowed.
    NotWhole,
}

impl fmt::Display for QuantityErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Empty => "empty quantity",
            Self::Malformed => {
                "expected a number with an optional suffix (m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent such as e3)"
            }
            Self::Negative => "negative values are not allowed",
            Self::OutOfRange => "value out of range",
            Self::NotWhole => "must be a whole number",
        };
        f.write_str(text)
    }
}

/// A quantity string that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity \"{input}\": {kind}")]
pub struct QuantityError {
    /// The string as given.
    pub input: String,
    /// Why it was refused.
    pub kind: QuantityErrorKind,
}

/// A parsed, non-negative quantity: `mantissa × 10^exp10 × 2^exp2`, kept exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    mantissa: u128,
    exp10: i64,
    exp2: u32,
}

/// The suffix that scales a quantity's number.
#[derive(Debug, Clone, Copy)]
struct Scale {
    exp10: i64,
    exp2: u32,
}

impl Quantity {
    /// Parses a Kubernetes quantity string; negative values are refused.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let fail = |kind| QuantityError {
            input: input.to_string(),
            kind,
        };
        if input.is_empty() {
            return Err(fail(QuantityErrorKind::Empty));
        }
        let (sign, rest) = split_sign(input);
        let (int_digits, frac_digits, suffix) =
            split_number(rest).ok_or(fail(QuantityErrorKind::Malformed))?;
        let scale = parse_suffix(suffix).ok_or(fail(QuantityErrorKind::Malformed))?;
        let (mantissa, exp10) =
            mantissa_of(int_digits, frac_digits).ok_or(fail(QuantityErrorKind::OutOfRange))?;
        if mantissa != 0 && sign == Sign::Negative {
            return Err(fail(QuantityErrorKind::Negative));
        }
        let exp10 = exp10
            .checked_add(scale.exp10)
            .ok_or(fail(QuantityErrorKind::OutOfRange))?;
        Ok(Self {
            mantissa,
            exp10,
            exp2: scale.exp2,
        })
    }

    /// Whether the value is above zero but below one nano-unit (`1n`), the smallest
    /// amount Kubernetes stores: conversions would round it up to a whole unit.
    pub fn is_below_one_nano(&self) -> bool {
        if self.mantissa == 0 {
            return false;
        }
        let Some(exp) = self.exp10.checked_add(9) else {
            return true;
        };
        if exp >= 0 {
            return false;
        }
        let Some(numerator) = pow2_times(self.mantissa, self.exp2) else {
            return false;
        };
        match i64::try_from(exp.unsigned_abs()).ok().and_then(pow10) {
            Some(one) => numerator < one,
            None => true,
        }
    }

    /// The value in units of `10^-decimals`, rounded up (3 gives milli-units).
    pub fn scaled_ceil(&self, decimals: u32) -> Option<u64> {
        u64::try_from(self.scaled_ceil_wide(decimals)?).ok()
    }

    /// [`Quantity::scaled_ceil`] with a 128-bit result.
    pub fn scaled_ceil_wide(&self, decimals: u32) -> Option<u128> {
        if self.mantissa == 0 {
            return Some(0);
        }
        let numerator = pow2_times(self.mantissa, self.exp2)?;
        let exp = self.exp10.checked_add(i64::from(decimals))?;
        if exp >= 0 {
            numerator.checked_mul(pow10(exp)?)
        } else {
            Some(ceil_div_pow10(numerator, exp.unsigned_abs()))
        }
    }

    /// Whether the quantity was written with a binary suffix (`Ki` … `Ei`).
    pub fn is_binary(&self) -> bool {
        self.exp2 > 0
    }

    /// Whether the value has no fractional part.
    pub fn is_whole(&self) -> bool {
        if self.exp10 >= 0 || self.mantissa == 0 {
            return true;
        }
        // mantissa × 2^exp2 / (2^k × 5^k) is whole iff 5^k divides the mantissa and the
        // powers of two cover 2^k; checked this way nothing can overflow.
        let k = self.exp10.unsigned_abs();
        let Some(five_k) = u32::try_from(k).ok().and_then(|k| 5u128.checked_pow(k)) else {
            return false;
        };
        let twos = u64::from(self.mantissa.trailing_zeros()) + u64::from(self.exp2);
        self.mantissa % five_k == 0 && twos >= k
    }
}

/// Nano-units (10^-9) per unit.
pub const NANO_PER_UNIT: i128 = 1_000_000_000;
/// Largest value, in units, of a quantity written with a binary suffix; Kubernetes caps
/// larger ones to it.
const BINARY_UNITS_MAX: i128 = i64::MAX as i128;

/// Parses a possibly negative quantity in nano-units (10^-9), exactly as Kubernetes
/// stores it: the magnitude rounded up to nano precision, a binary-suffixed magnitude
/// capped at 2^63-1 units. Values beyond `i128` nano-units (about 1.7 × 10^29 units)
/// are refused as out of range.
pub fn parse_nano(input: &str) -> Result<i128, QuantityError> {
    let fail = |kind| QuantityError {
        input: input.to_string(),
        kind,
    };
    let (sign, rest) = split_sign(input);
    if rest.starts_with(['+', '-']) {
        return Err(fail(QuantityErrorKind::Malformed));
    }
    let q = Quantity::parse(rest).map_err(|e| fail(e.kind))?;
    let magnitude = q
        .scaled_ceil_wide(9)
        .and_then(|n| i128::try_from(n).ok())
        .ok_or(fail(QuantityErrorKind::OutOfRange))?;
    let cap = BINARY_UNITS_MAX * NANO_PER_UNIT;
    let magnitude = if q.is_binary() && magnitude > cap {
        cap
    } else {
        magnitude
    };
    Ok(match sign {
        Sign::Negative => -magnitude,
        Sign::Positive => magnitude,
    })
}

/// Parses `input` and returns it in milli-units, rounded up (`"500m"` → 500, `"1.5"` → 1500).
pub fn parse_milli(input: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(input)?;
    q.scaled_ceil(3).ok_or_else(|| QuantityError {
        input: input.to_string(),
        kind: QuantityErrorKind::OutOfRange,
    })
}

/// Parses `input` and returns it in whole units, rounded up (`"2Gi"` → 2147483648).
pub fn parse_units(input: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(input)?;
    q.scaled_ceil(0).ok_or_else(|| QuantityError {
        input: input.to_string(),
        kind: QuantityErrorKind::OutOfRange,
    })
}

/// Parses `input` as a whole count (extended resources, pods): fractions are refused.
pub fn parse_whole_units(input: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(input)?;
    if !q.is_whole() {
        return Err(QuantityError {
            input: input.to_string(),
            kind: QuantityErrorKind::NotWhole,
        });
    }
    parse_units(input)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sign {
    Positive,
    Negative,
}

fn split_sign(input: &str) -> (Sign, &str) {
    if let Some(rest) = input.strip_prefix('-') {
        (Sign::Negative, rest)
    } else if let Some(rest) = input.strip_prefix('+') {
        (Sign::Positive, rest)
    } else {
        (Sign::Positive, input)
    }
}

/// Splits `digits[.digits]suffix`; at least one digit is required.
fn split_number(s: &str) -> Option<(&str, &str, &str)> {
    let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (int_digits, rest) = s.split_at(int_end);
    let (frac_digits, suffix) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            after_dot.split_at(frac_end)
        }
        None => ("", rest),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return None;
    }
    Some((int_digits, frac_digits, suffix))
}

fn parse_suffix(suffix: &str) -> Option<Scale> {
    let decimal = |exp10| Some(Scale { exp10, exp2: 0 });
    let binary = |exp2| Some(Scale { exp10: 0, exp2 });
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => parse_exponent(suffix).map(|exp10| Scale { exp10, exp2: 0 }),
    }
}

/// `e3`, `E-2`, `e+4`: a decimal exponent with at least one digit.
fn parse_exponent(suffix: &str) -> Option<i64> {
    let body = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    let (negative, digits) = match body.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, body.strip_prefix('+').unwrap_or(body)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude: i64 = digits.parse().ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// Joins integer and fraction digits into an exact mantissa and a power of ten.
fn mantissa_of(int_digits: &str, frac_digits: &str) -> Option<(u128, i64)> {
    let joined: String = int_digits.chars().chain(frac_digits.chars()).collect();
    let significant = joined.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some((0, 0));
    }
    let trailing_zeros = (significant.len() - trimmed.len()) as i64;
    if trimmed.len() > MANTISSA_DIGITS_MAX {
        return None;
    }
    let mantissa: u128 = trimmed.parse().ok()?;
    Some((mantissa, trailing_zeros - frac_digits.len() as i64))
}

fn pow2_times(value: u128, exp2: u32) -> Option<u128> {
    let factor = 1u128.checked_shl(exp2)?;
    value.checked_mul(factor)
}

fn pow10(exp: i64) -> Option<u128> {
    let exp = u32::try_from(exp).ok()?;
    10u128.checked_pow(exp)
}

/// `ceil(numerator / 10^exp)`; a divisor beyond `u128` leaves a value in (0, 1), so 1.
fn ceil_div_pow10(numerator: u128, exp: u64) -> u128 {
    match i64::try_from(exp).ok().and_then(pow10) {
        Some(divisor) => numerator / divisor + u128::from(numerator % divisor != 0),
        None => u128::from(numerator != 0),
    }
}

#[cfg(test)]
#[path = "quantity_tests.rs"]
mod tests;
