//! Name and label syntax checks.
//!
//! Owns the Kubernetes naming rules the model enforces: DNS-1123 labels (namespaces),
//! DNS-1123 subdomains (node, gang and member names), qualified names (label keys,
//! extended resource names) and label values. Invariant: a name accepted here never
//! contains `/` unless it is a qualified name, so member keys built from accepted names
//! are unambiguous. Called by model validation.

use crate::model::error::{FieldPath, ValidationError};

/// Longest DNS-1123 label (namespaces, label names, label values).
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (node, gang and member names, key prefixes).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Checks a DNS-1123 label: lowercase alphanumerics and `-`, alphanumeric at both ends.
pub fn validate_dns_label(path: &FieldPath, value: &str) -> Result<(), ValidationError> {
    if is_dns_label(value) {
        Ok(())
    } else {
        Err(path.error(format!(
            "invalid name \"{value}\": must be a DNS-1123 label (at most {DNS1123_LABEL_MAX} lowercase alphanumeric characters or '-', starting and ending with an alphanumeric)"
        )))
    }
}

/// Checks a DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters.
pub fn validate_dns_subdomain(path: &FieldPath, value: &str) -> Result<(), ValidationError> {
    if is_dns_subdomain(value) {
        Ok(())
    } else {
        Err(path.error(format!(
            "invalid name \"{value}\": must be a DNS-1123 subdomain (at most {DNS1123_SUBDOMAIN_MAX} lowercase alphanumeric characters, '-' or '.', starting and ending with an alphanumeric)"
        )))
    }
}

/// Checks a qualified name such as `app`, `topology.kubernetes.io/zone` or `nvidia.com/gpu`.
pub fn validate_qualified_name(path: &FieldPath, value: &str) -> Result<(), ValidationError> {
    if is_qualified_name(value) {
        Ok(())
    } else {
        Err(path.error(format!(
            "invalid key \"{value}\": must be a qualified name (an optional DNS subdomain prefix and '/', then at most {DNS1123_LABEL_MAX} alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric)"
        )))
    }
}

/// Checks a label value: empty, or at most 63 alphanumerics, `-`, `_`, `.` with alphanumeric ends.
pub fn validate_label_value(path: &FieldPath, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || is_name_part(value) {
        Ok(())
    } else {
        Err(path.error(format!(
            "invalid label value \"{value}\": must be empty or at most {DNS1123_LABEL_MAX} alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )))
    }
}

/// Checks every key and value of a label map.
pub fn validate_labels<K: AsRef<str>, V: AsRef<str>>(
    path: &FieldPath,
    labels: impl IntoIterator<Item = (K, V)>,
) -> Result<(), ValidationError> {
    for (key, value) in labels {
        let (key, value) = (key.as_ref(), value.as_ref());
        let entry = path.key(key);
        validate_qualified_name(&entry, key)?;
        validate_label_value(&entry, value)?;
    }
    Ok(())
}

/// Whether `value` is a DNS-1123 label.
pub fn is_dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= DNS1123_LABEL_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && alnum_ends(value)
}

/// Whether `value` is a DNS-1123 subdomain.
pub fn is_dns_subdomain(value: &str) -> bool {
    !value.is_empty() && value.len() <= DNS1123_SUBDOMAIN_MAX && value.split('.').all(is_dns_label)
}

/// Whether `value` is a qualified name (a label key: an optional DNS subdomain and `/`, then a name).
pub fn is_qualified_name(value: &str) -> bool {
    match value.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name_part(name),
        None => is_name_part(value),
    }
}

fn is_name_part(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= DNS1123_LABEL_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && alnum_ends(value)
}

fn alnum_ends(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric(),
        _ => false,
    }
}

#[cfg(test)]
#[path = "names_tests.rs"]
mod tests;
