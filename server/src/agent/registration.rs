//! What a device plugin's registration must satisfy before gangway-agent talks to it,
//! as the kubelet checks it: the API version, and an extended resource name (a
//! qualified name `domain/name`, not in a `kubernetes.io` domain). Pure; called by the
//! agent's `Registration` service for every `Register`.

/// The device plugin API versions the agent speaks.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1beta1"];
/// Longest name part of a qualified name (after the `/`).
const NAME_PART_LENGTH_MAX: usize = 63;
/// Longest prefix of a qualified name, `requests.` included (a DNS subdomain).
const PREFIX_LENGTH_MAX: usize = 253;

/// Why a registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// The plugin speaks a version the agent does not.
    #[error("requested API version {0:?} is not supported; supported: {SUPPORTED_VERSIONS:?}")]
    Version(String),
    /// The resource name is not an extended resource name.
    #[error("resource_name: {name:?} is not an extended resource name ({why})")]
    ResourceName {
        /// The name sent.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The endpoint is not a socket file name in the plugin directory.
    #[error(
        "endpoint: {0:?} must be a file name in the device plugin directory (no '/', not empty)"
    )]
    Endpoint(String),
}

/// Checks a registration's version, resource name and endpoint.
pub fn check(version: &str, resource_name: &str, endpoint: &str) -> Result<(), RegistrationError> {
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(RegistrationError::Version(version.to_string()));
    }
    check_resource_name(resource_name).map_err(|why| RegistrationError::ResourceName {
        name: resource_name.to_string(),
        why,
    })?;
    if endpoint.is_empty() || endpoint.contains('/') || endpoint == "." || endpoint == ".." {
        return Err(RegistrationError::Endpoint(endpoint.to_string()));
    }
    Ok(())
}

/// Whether `name` is an extended resource name: `domain/name`, the domain a DNS
/// subdomain outside `kubernetes.io`, the name a qualified-name part; the kubelet
/// checks `requests.<name>` the same way.
fn check_resource_name(name: &str) -> Result<(), String> {
    let Some((domain, part)) = name.split_once('/') else {
        return Err("it needs a domain prefix, as in vendor.com/gpu".into());
    };
    if name.contains("kubernetes.io/") {
        return Err("the kubernetes.io domain is reserved".into());
    }
    if name.starts_with("requests.") {
        return Err("it may not start with requests.".into());
    }
    if part.contains('/') {
        return Err("it may hold one '/' only".into());
    }
    let prefix = format!("requests.{domain}");
    if prefix.len() > PREFIX_LENGTH_MAX || !is_dns_subdomain(&prefix) {
        return Err(format!("{domain:?} is not a lowercase DNS subdomain"));
    }
    if part.is_empty() || part.len() > NAME_PART_LENGTH_MAX || !is_name_part(part) {
        return Err(format!(
            "{part:?} must be 1-{NAME_PART_LENGTH_MAX} characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    })
}

fn is_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    bytes.iter().all(inner)
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
#[path = "registration_tests.rs"]
mod tests;
