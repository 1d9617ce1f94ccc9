//! Snapshots: encoding the state and restoring it.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    /// The replicated state in the default (binary) format; identical states give
    /// identical bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_as(WireFormat::Binary)
    }

    /// The replicated state in `format`; identical states give identical bytes.
    pub fn snapshot_as(&self, format: WireFormat) -> Vec<u8> {
        // Every map key is a string or an integer, so encoding cannot fail.
        format
            .encode(&self.state)
            .expect("ledger state always encodes")
    }

    /// Rebuilds a ledger from [`ShardLedger::snapshot`] bytes (either format of
    /// `wire`), checking every invariant.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let stored: StoredState =
            wire::decode(bytes).map_err(|e| SnapshotError::Decode(e.to_string()))?;
        if stored.format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format {
                found: stored.format,
            });
        }
        let state = stored.into_state()?;
        let index = Indexes::build(&state);
        let ledger = Self {
            state,
            index,
            hand_over: HandOver::default(),
        };
        ledger.check_invariants()?;
        Ok(ledger)
    }
}
