//! Binary encoding of openraft messages and stored records (postcard): compact
//! and deterministic for the same value.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A value that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct CodecError {
    what: &'static str,
    #[source]
    source: postcard::Error,
}

/// Encodes `value`; `what` names it in the error.
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|source| CodecError { what, source })
}

/// Decodes a `T`; `what` names it in the error.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    postcard::from_bytes(bytes).map_err(|source| CodecError { what, source })
}
