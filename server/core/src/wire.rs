//! The replicated encoding: how every command, query, reply and snapshot of the meta
//! group and the shards is written as bytes (into the Raft log, a snapshot, or an
//! answer sent to another replica), and read back.
//!
//! Two formats, told apart by the first byte:
//! - **binary** (written by default): the version byte [`BINARY_V1`], then the value in
//!   MessagePack with field names (self-describing, so optional fields, flattened and
//!   tagged enums decode as they do from JSON);
//! - **JSON**, the format gangway wrote before the binary one. JSON text never starts
//!   with a byte ≥ 0x80, so a log, snapshot or reply written by an older replica is
//!   still read, and a cluster restarts on the data dir it wrote before the upgrade.
//!
//! A byte ≥ 0x80 other than a known version is refused (a newer gangway wrote it), never
//! guessed at. Invariant: for one format, the same value always gives the same bytes
//! (maps are ordered), so replicas' snapshots of the same state are byte-identical.
//! Called by `replicated` (state machines and the typed group client) and the ledgers'
//! snapshots.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// First byte of a value in binary format version 1.
pub const BINARY_V1: u8 = 0xB1;
/// Bytes of an encoded value shown in a decoding error.
const PREVIEW_BYTES_MAX: usize = 16;

/// The format a replica writes. Every replica reads both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireFormat {
    /// The version byte, then MessagePack with field names.
    #[default]
    Binary,
    /// JSON text, as written before the binary format: for a rolling upgrade from a
    /// release that reads only JSON (docs/ARCHITECTURE.md §3, "Encoding").
    Json,
}

/// A format name that is neither `binary` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a wire format (binary or json)")]
pub struct UnknownWireFormat(pub String);

impl std::str::FromStr for WireFormat {
    type Err = UnknownWireFormat;

    /// A format by its name, in any case.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        WireFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| UnknownWireFormat(text.to_string()))
    }
}

/// A value that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// JSON encoding or decoding failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Binary encoding failed.
    #[error("binary encoding: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// Binary decoding failed.
    #[error("binary (version 1) decoding: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// Bytes follow the binary value (JSON refuses trailing text the same way).
    #[error("binary (version 1): {count} bytes after the value")]
    Trailing {
        /// How many.
        count: usize,
    },
    /// The first byte names no format this replica knows.
    #[error(
        "unknown encoding: first byte {first:#04x} is neither JSON nor binary version 1 \
         ({BINARY_V1:#04x}); written by a newer gangway? (starts {preview})"
    )]
    UnknownVersion {
        /// The first byte.
        first: u8,
        /// The first bytes, in hex.
        preview: String,
    },
}

impl WireFormat {
    /// Encodes `value` in this format.
    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, WireError> {
        match self {
            WireFormat::Json => Ok(serde_json::to_vec(value)?),
            WireFormat::Binary => {
                let mut out = Vec::with_capacity(64);
                out.push(BINARY_V1);
                rmp_serde::encode::write_named(&mut out, value)?;
                Ok(out)
            }
        }
    }

    /// Every format, in the order `--wire-format` lists them.
    pub const ALL: [WireFormat; 2] = [WireFormat::Binary, WireFormat::Json];

    /// What the format is, as `--wire-format`'s help says it.
    pub fn summary(self) -> &'static str {
        match self {
            WireFormat::Binary => "The version byte, then MessagePack with field names",
            WireFormat::Json => {
                "JSON text, as written before the binary format: for a rolling upgrade from a release that reads only JSON"
            }
        }
    }

    /// The format's name, as `--wire-format` takes it.
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::Binary => "binary",
            WireFormat::Json => "json",
        }
    }

    /// The format `bytes` are in (`None`: an unknown version byte). Empty bytes read as
    /// JSON, whose decoder names the error.
    pub fn of(bytes: &[u8]) -> Option<WireFormat> {
        match bytes.first() {
            Some(&BINARY_V1) => Some(WireFormat::Binary),
            Some(&b) if b >= 0x80 => None,
            _ => Some(WireFormat::Json),
        }
    }
}

/// Decodes a value written in either format.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    match WireFormat::of(bytes) {
        Some(WireFormat::Binary) => {
            let mut rest = &bytes[1..];
            let value = T::deserialize(&mut rmp_serde::Deserializer::new(&mut rest))?;
            match rest.len() {
                0 => Ok(value),
                count => Err(WireError::Trailing { count }),
            }
        }
        Some(WireFormat::Json) => Ok(serde_json::from_slice(bytes)?),
        None => Err(WireError::UnknownVersion {
            first: bytes[0],
            preview: hex::encode(&bytes[..bytes.len().min(PREVIEW_BYTES_MAX)]),
        }),
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
