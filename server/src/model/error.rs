//! Validation errors and field paths.
//!
//! Owns [`ValidationError`], the single error every model validation returns, and
//! [`FieldPath`], the builder that names where in a submitted document the problem is
//! (`spec.members[2].requests.cpu`). Invariant: every error carries a non-empty path
//! unless it concerns the document as a whole. Called by every `validate` in `model/`
//! and by the engine profile validation.

use std::fmt;

/// A rejected field: where it is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    /// Dotted path of the offending field, e.g. `spec.members[2].requests.cpu`.
    pub path: String,
    /// What is wrong, e.g. `invalid quantity "-1": negative values are not allowed`.
    pub message: String,
}

impl ValidationError {
    /// Builds an error for `path` with `message`.
    pub fn new(path: &FieldPath, message: impl Into<String>) -> Self {
        Self {
            path: path.to_string(),
            message: message.into(),
        }
    }
}

/// Path of a field inside a document, built while walking it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(String);

impl FieldPath {
    /// The document root (an empty path).
    pub fn root() -> Self {
        Self(String::new())
    }

    /// A path that starts at the named top-level field.
    pub fn new(name: &str) -> Self {
        Self(name.to_string())
    }

    /// The path of field `name` under this one.
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Self(name.to_string())
        } else {
            Self(format!("{}.{}", self.0, name))
        }
    }

    /// The path of element `index` of the list at this path.
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{}]", self.0, index))
    }

    /// The path of map entry `key` under this one (dotted like a field, as Kubernetes does).
    pub fn key(&self, key: &str) -> Self {
        self.child(key)
    }

    /// Builds an error at this path.
    pub fn error(&self, message: impl Into<String>) -> ValidationError {
        ValidationError::new(self, message)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("<root>")
        } else {
            f.write_str(&self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compose_like_kubernetes() {
        let p = FieldPath::new("spec")
            .child("members")
            .index(2)
            .child("requests")
            .key("cpu");
        assert_eq!(p.to_string(), "spec.members[2].requests.cpu");
        let e = p.error("invalid quantity \"-1\"");
        assert_eq!(
            e.to_string(),
            "spec.members[2].requests.cpu: invalid quantity \"-1\""
        );
    }

    #[test]
    fn root_child_has_no_leading_dot() {
        assert_eq!(FieldPath::root().child("name").to_string(), "name");
        assert_eq!(FieldPath::root().to_string(), "<root>");
    }
}
