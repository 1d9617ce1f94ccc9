//! Glue between gangway's ledgers and gangway-raft: each Raft group's
//! `StateMachine` decodes commands and queries (JSON), applies them to its
//! ledger, and encodes the reply. A malformed command gets a `Rejected` reply
//! and changes nothing. Group 0 is the meta group, 1..=S are shards.

use gangway_raft::{GroupId, RestoreError, StateMachine, META_GROUP};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ledger::inventory::{NodeInventory, ShardReply};
use crate::ledger::meta::{MetaReply, MetaState};

/// Encodes a command, query or reply for the Raft log.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain data types cannot fail: no maps with non-string
    // keys and no custom serializers.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Decodes a reply or query.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// The meta group's state machine.
pub struct MetaMachine {
    state: MetaState,
}

/// A shard group's state machine.
pub struct ShardMachine {
    inventory: NodeInventory,
}

/// Builds the state machine of `group` in a cluster of `shards` shards.
pub fn machine_for(group: GroupId, shards: u32) -> Box<dyn StateMachine> {
    if group == META_GROUP {
        Box::new(MetaMachine {
            state: MetaState::new(shards),
        })
    } else {
        Box::new(ShardMachine {
            inventory: NodeInventory::default(),
        })
    }
}

fn rejected_meta(e: serde_json::Error) -> Vec<u8> {
    encode(&MetaReply::Rejected {
        reason: format!("malformed meta command: {e}"),
    })
}

fn rejected_shard(e: serde_json::Error) -> Vec<u8> {
    encode(&ShardReply::Rejected {
        reason: format!("malformed shard command: {e}"),
    })
}

fn restore<T: DeserializeOwned>(snapshot: &[u8]) -> Result<T, RestoreError> {
    serde_json::from_slice(snapshot).map_err(|e| RestoreError(e.to_string()))
}

impl StateMachine for MetaMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        match decode(command) {
            Ok(cmd) => encode(&self.state.apply(&cmd)),
            Err(e) => rejected_meta(e),
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        encode(&self.state)
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.state = restore(snapshot)?;
        Ok(())
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        match decode(query) {
            Ok(q) => encode(&self.state.query(&q)),
            Err(e) => rejected_meta(e),
        }
    }
}

impl StateMachine for ShardMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        match decode(command) {
            Ok(cmd) => encode(&self.inventory.apply(&cmd)),
            Err(e) => rejected_shard(e),
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        encode(&self.inventory)
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.inventory = restore(snapshot)?;
        Ok(())
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        match decode(query) {
            Ok(q) => encode(&self.inventory.query(&q)),
            Err(e) => rejected_shard(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_command_is_rejected_and_changes_nothing() {
        let mut m = machine_for(1, 4);
        let before = m.snapshot();
        let reply: ShardReply = decode(&m.apply(1, b"{not json")).expect("reply decodes");
        assert!(matches!(reply, ShardReply::Rejected { .. }));
        assert_eq!(before, m.snapshot());
        let mut meta = machine_for(META_GROUP, 4);
        let reply: MetaReply = decode(&meta.apply(1, b"[]")).expect("reply decodes");
        assert!(matches!(reply, MetaReply::Rejected { .. }));
    }
}
