//! Semantic versions (semver 2.0.0), as device `version` attributes and CEL's `semver()`.
//!
//! Owns [`Semver`]: strict parsing of `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]` (no
//! leading zeros in numeric identifiers, no empty identifiers, no `v` prefix), and
//! precedence as the specification defines it (build metadata ignored, a pre-release
//! ranks below its release, numeric identifiers below alphanumeric ones). Invariant: a
//! parsed version prints back exactly as it was written. Called by device validation
//! and the CEL library (`semver`, `isSemver`, `compareTo`, …).

use std::cmp::Ordering;
use std::fmt;

/// Longest version string accepted, in bytes (Kubernetes' attribute value limit).
pub const VERSION_LENGTH_MAX: usize = 64;

/// One dot-separated pre-release identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PreRelease {
    /// Digits only: compared numerically.
    Numeric(u64),
    /// Anything else: compared as ASCII text.
    Alphanumeric(String),
}

/// A parsed semantic version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<PreRelease>,
    text: String,
}

impl Semver {
    /// Parses a strict semver 2.0.0 string; the error says what is wrong.
    pub fn parse(input: &str) -> Result<Self, String> {
        if input.len() > VERSION_LENGTH_MAX {
            return Err(format!(
                "version is longer than {VERSION_LENGTH_MAX} characters"
            ));
        }
        let (rest, build) = match input.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (input, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let parts: Vec<&str> = core.split('.').collect();
        let [major, minor, patch] = parts.as_slice() else {
            return Err(format!(
                "invalid version \"{input}\": expected MAJOR.MINOR.PATCH"
            ));
        };
        let number = |part: &str| -> Result<u64, String> {
            numeric(part).ok_or_else(|| {
                format!(
                    "invalid version \"{input}\": \"{part}\" is not a number without leading zeros"
                )
            })
        };
        let mut out = Self {
            major: number(major)?,
            minor: number(minor)?,
            patch: number(patch)?,
            pre: Vec::new(),
            text: input.to_string(),
        };
        if let Some(pre) = pre {
            for id in pre.split('.') {
                if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                    return Err(format!(
                        "invalid version \"{input}\": bad pre-release identifier \"{id}\""
                    ));
                }
                if id.bytes().all(|b| b.is_ascii_digit()) {
                    let n = numeric(id).ok_or_else(|| {
                        format!(
                            "invalid version \"{input}\": pre-release \"{id}\" has a leading zero"
                        )
                    })?;
                    out.pre.push(PreRelease::Numeric(n));
                } else {
                    out.pre.push(PreRelease::Alphanumeric(id.to_string()));
                }
            }
        }
        if let Some(build) = build {
            let valid = build.split('.').all(|id| {
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
            if !valid {
                return Err(format!(
                    "invalid version \"{input}\": bad build metadata \"{build}\""
                ));
            }
        }
        Ok(out)
    }

    /// The major version.
    pub fn major(&self) -> u64 {
        self.major
    }

    /// The minor version.
    pub fn minor(&self) -> u64 {
        self.minor
    }

    /// The patch version.
    pub fn patch(&self) -> u64 {
        self.patch
    }

    /// Precedence order (build metadata ignored).
    pub fn precedence(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| compare_pre(&self.pre, &other.pre))
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A numeric identifier: digits only, no leading zero unless it is `0`.
fn numeric(part: &str) -> Option<u64> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if part.len() > 1 && part.starts_with('0') {
        return None;
    }
    part.parse().ok()
}

fn compare_pre(a: &[PreRelease], b: &[PreRelease]) -> Ordering {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => return Ordering::Equal,
        (true, false) => return Ordering::Greater,
        (false, true) => return Ordering::Less,
        (false, false) => {}
    }
    for (x, y) in a.iter().zip(b) {
        let order = match (x, y) {
            (PreRelease::Numeric(x), PreRelease::Numeric(y)) => x.cmp(y),
            (PreRelease::Numeric(_), PreRelease::Alphanumeric(_)) => Ordering::Less,
            (PreRelease::Alphanumeric(_), PreRelease::Numeric(_)) => Ordering::Greater,
            (PreRelease::Alphanumeric(x), PreRelease::Alphanumeric(y)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
#[path = "semver_tests.rs"]
mod tests;
