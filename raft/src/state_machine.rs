//! The contract between the Raft layer and the domain: a deterministic state
//! machine per group. gangway-raft knows nothing of scheduling; the server
//! crate implements this trait for the meta group and the shards.

/// A snapshot that cannot be restored.
#[derive(Debug, thiserror::Error)]
#[error("cannot restore the state machine: {0}")]
pub struct RestoreError(pub String);

/// Encodes a snapshot taken earlier ([`StateMachine::snapshot_writer`]).
pub type SnapshotWriter = Box<dyn FnOnce() -> Vec<u8> + Send>;

/// A replicated, deterministic state machine.
///
/// Invariant: the same sequence of `apply` calls on the same starting state
/// yields byte-identical `snapshot()` output on every replica. `apply` must not
/// read a clock, do I/O or use randomness; everything it needs is in the
/// command. A malformed command is answered with an error reply, never a panic.
pub trait StateMachine: Send + 'static {
    /// Applies the committed command at log `index` and returns the reply.
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8>;
    /// The complete state, deterministically encoded.
    fn snapshot(&self) -> Vec<u8>;
    /// The complete state as it is now, encoded by the returned writer after the
    /// state-machine lock is released (so applies go on meanwhile). A machine whose
    /// state copies cheaply returns a copy to encode; by default the state is encoded
    /// at once.
    fn snapshot_writer(&self) -> SnapshotWriter {
        let bytes = self.snapshot();
        Box::new(move || bytes)
    }
    /// Replaces the state with a snapshot produced by `snapshot`.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError>;
    /// Answers a read-only query against the current state.
    fn query(&self, query: &[u8]) -> Vec<u8>;
    /// This machine as `Any`, so the embedding server can read its own type's state
    /// without encoding a query and its answer (`RaftHost::inspect`).
    fn as_any(&self) -> &dyn std::any::Any;
    /// The check a leader runs on each command before proposing it, so a command no
    /// replica could have built takes no log index; `None` admits every command.
    fn admission(&self) -> Option<Admission> {
        None
    }
}

/// A state-free check of one command: `Err` says why it is refused. It never reads
/// the state, so it runs outside the state machine's lock and may be stricter than
/// `apply` only about commands `apply` would refuse anyway.
pub type Admission = std::sync::Arc<dyn Fn(&[u8]) -> Result<(), String> + Send + Sync>;

/// Builds the state machine of each group when a host starts.
pub type StateMachineFactory = dyn Fn(crate::GroupId) -> Box<dyn StateMachine> + Send + Sync;
