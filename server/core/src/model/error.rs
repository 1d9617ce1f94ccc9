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
    /// Builds an error for `path` with `message`, each cut to its bound: they echo
    /// submitted text, which may be megabytes long.
    pub fn new(path: &FieldPath, message: impl Into<String>) -> Self {
        Self {
            path: clip_to(&path.to_string(), PATH_CHARS_MAX).into_owned(),
            message: clip_to(&message.into(), MESSAGE_CHARS_MAX).into_owned(),
        }
    }
}

/// Longest echo of one submitted value in an error message, in characters.
pub const ECHO_CHARS_MAX: usize = 128;
/// Longest field path in an error, in characters.
pub const PATH_CHARS_MAX: usize = 256;
/// Longest error message after the path, in characters.
pub const MESSAGE_CHARS_MAX: usize = 768;

/// `text` cut to `ECHO_CHARS_MAX` characters (for quoting submitted values).
pub fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    clip_to(text, ECHO_CHARS_MAX)
}

/// `text` cut to `max` characters, saying how many bytes were left out.
pub fn clip_to(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((cut, _)) => std::borrow::Cow::Owned(format!(
            "{}… ({} more bytes)",
            &text[..cut],
            text.len() - cut
        )),
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
        // Every validation walks many paths and almost never renders one: build
        // them by copying, without the formatting machinery.
        if self.0.is_empty() {
            return Self(name.to_string());
        }
        let mut path = String::with_capacity(self.0.len() + 1 + name.len());
        path.push_str(&self.0);
        path.push('.');
        path.push_str(name);
        Self(path)
    }

    /// The path of element `index` of the list at this path.
    pub fn index(&self, index: usize) -> Self {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(index);
        let mut path = String::with_capacity(self.0.len() + 2 + digits.len());
        path.push_str(&self.0);
        path.push('[');
        path.push_str(digits);
        path.push(']');
        Self(path)
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
#[path = "error_tests.rs"]
mod tests;
