//! Crash points at protocol steps, for fault tests only. `gangway serve`
//! honours them only when started with `--test-failpoints` and the
//! environment names them (`GANGWAY_TEST_FAILPOINTS=a,b`); a production
//! config cannot arm them by accident. With `GANGWAY_TEST_FAILPOINT_DIR` set, a
//! point fires once per cluster: the first process to create its marker file
//! there crashes, the others pass.
//!
//! A firing point aborts the process at once (no cleanup), as SIGKILL would.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The coordinator has every reservation and has not written its decision.
pub const AFTER_RESERVE: &str = "coordinator-after-reserve";
/// The coordinator wrote COMMIT and has not told the participants.
pub const AFTER_DECIDE: &str = "coordinator-after-decide";
/// The coordinator has every displacing reservation of a preemption and has not
/// written its decision (the victims are Preempting, the shards hold their room).
pub const PREEMPTION_AFTER_RESERVE: &str = "coordinator-preemption-after-reserve";
/// The coordinator wrote a preemption's COMMIT and has not told the participants.
pub const PREEMPTION_AFTER_DECIDE: &str = "coordinator-preemption-after-decide";
/// A replica applied a multi-shard reservation and has not answered it. The
/// first replica to apply an entry is, in practice, the shard leader (it
/// applies as soon as the entry commits; followers learn of the commit later).
pub const PARTICIPANT_AFTER_RESERVE: &str = "participant-after-reserve";
/// A shard leader bound a pod through the Kubernetes API and has not recorded
/// the binding in its ledger.
pub const BINDER_AFTER_BIND: &str = "binder-after-bind";
/// A deliberate protocol bug, for checking the checker: the coordinator tells
/// the participants COMMIT without writing its decision first. Never correct.
pub const COORDINATOR_SKIPS_DECISION: &str = "coordinator-skips-decision";

/// A fixed protocol bug, back for checking the checker: a NonStrict group planned
/// again plans the members it already holds, so a shard that fits the whole group
/// reserves them a second time (placed twice across shards; refused as held on one).
pub const REPLAN_HELD_MEMBERS: &str = "coordinator-replans-held-members";
/// A fixed protocol bug, back for checking the checker: ReleaseMembers frees the
/// members on their shards (committing the group's latest transaction there first)
/// before meta has agreed, so a refusal by meta leaves slots freed that meta still
/// lists, and an aborted transaction can be committed.
pub const RELEASE_SHARDS_FIRST: &str = "release-members-shards-first";

/// A fixed security bug, back for checking the checker: the Raft transport serves
/// every caller the client services serve, so a client can propose ledger commands.
pub const RAFT_TRANSPORT_OPEN: &str = "raft-transport-open-to-clients";

/// A fixed protocol bug, back for checking the checker: meta forgets a decided
/// transaction whether or not its participants acknowledged it (as it once did past
/// 50,000 decisions; armed, it keeps none, so a bounded run reaches the bound). A
/// participant that missed the decision then finds no record, and its resolver's
/// ABORT tombstone makes it abort a transaction meta committed.
pub const META_FORGETS_UNACKED: &str = "meta-forgets-unacknowledged-decisions";

/// A fixed protocol bug, back for checking the checker: meta returns a preemption's
/// victims to Placed as soon as it records ABORT, while a participant that has not
/// applied it still holds their room displaced (rule 14; found by the two-phase model,
/// `random_preemptions_find_victims_returned_before_their_abort_is_delivered`).
pub const META_RETURNS_VICTIMS_AT_ABORT: &str = "meta-returns-victims-at-abort";

/// A fixed liveness bug, back for checking the checks: plans evaluate every selector
/// themselves, under the shard's state-machine lock, however costly (no warmer), so one
/// slow selector stalls every plan and write of its shard.
pub const SELECTORS_INLINE: &str = "selectors-evaluated-inline";

/// A missing step, back for checking the checks: the binder binds a preemptor's pods
/// as soon as the preemption commits, while its victims' pods may still run on the
/// node (the ledger lists them as unbound whatever `ShardQuery::PreemptionVictims`
/// still holds), so a node runs victims and preemptor at once.
pub const BIND_BEFORE_VICTIMS_LEAVE: &str = "binder-binds-before-victims-leave";

/// A fixed bug, back for checking the checks: the binder writes claim allocations
/// without configs (`devices.config: []`), as it once did, so a DRA driver never sees
/// the opaque parameters of the claim or its DeviceClass.
pub const BINDER_DROPS_CONFIGS: &str = "binder-drops-allocation-configs";

/// A fixed bug, back for checking the checks: every pod another scheduler bound
/// carries the devices of its claims, shared or not (as it once did), so of two pods
/// sharing a claim the second's copy is refused as a conflict and counts nothing; when
/// the first goes, the devices look free while the second still uses them.
pub const OBSERVED_CLAIMS_PER_POD: &str = "observed-claims-counted-per-pod";

/// A fixed bug, back for checking the checks: the binder binds a pod as soon as its
/// claim is allocated, without waiting for its devices' binding conditions (as it once
/// did), so a pod may start before the driver attached its device.
pub const BINDER_IGNORES_BINDING_CONDITIONS: &str = "binder-ignores-binding-conditions";

/// A tempting design, switched on for checking the checks: when the pod carrying a shared claim's
/// devices leaves its node, the ledger frees them although the claim's other pods
/// still run there, so another pod can be given them; for a claim carried with
/// network-attached devices, any of its pods leaving frees them on every shard.
pub const SHARED_CLAIMS_FREED_WITH_CARRIER: &str = "ledger-frees-shared-claims-with-their-carrier";

/// A fixed bug, back for checking the checks: a shared device's share id is written
/// as the names of its allocation (member, claim, request), as it once was; the API
/// server takes only a UUID there, so the claim is never written and the pod never binds.
pub const SHARE_IDS_NOT_UUIDS: &str = "binder-writes-share-ids-that-are-not-uuids";

/// A tempting shortcut, switched on for checking the checks: network-attached devices
/// that other schedulers' claims hold are not recorded on the shards, so gangway gives
/// them out again.
pub const OTHER_SCHEDULERS_NETWORK_CLAIMS_IGNORED: &str =
    "ingest-ignores-other-schedulers-network-claims";

/// A fixed bug, back for checking the checks: the ingest leaves a pool offered after
/// its ResourceSlices are all deleted (as it once did), so gangway gives out devices
/// whose driver is gone.
pub const SLICELESS_POOLS_OFFERED: &str = "ingest-offers-pools-without-slices";

/// A tempting shortcut, switched on for checking the checks: the meta group charges a
/// group's queue without asking whether it has room, as a scheduler whose quota check
/// ran before (and apart from) the decision would, so queues pass their max (I8).
pub const META_ADMITS_OVER_QUOTA: &str = "meta-admits-over-quota";

/// A fixed liveness bug, back for checking its test: the coordinator's window of
/// pending groups keeps queued groups that wait out their backoff, so enough groups that
/// fit nowhere at the head of the queue keep every group behind them from being read.
pub const PENDING_KEEPS_BACKED_OFF: &str = "pending-keeps-backed-off-groups";

/// The coordinator has a shard move's parcels from its sources and has not had the
/// target adopt them (the nodes are on no shard's table until a coordinator resumes).
pub const MOVE_AFTER_HANDOFF: &str = "coordinator-move-after-handoff";

/// A bug switch: meta seals a shard move while a transaction on its shards is in
/// flight, so a decision delivered to a source after its nodes left frees nothing there
/// and the target keeps the slots for ever (I5).
pub const MOVE_SEALS_IN_FLIGHT: &str = "meta-seals-moves-in-flight";

/// A bug switch for checking the checks: meta takes a gang a Placed group declares
/// as free, so a second live group declaring it is accepted (I4).
pub const META_ADMITS_TWINS_OF_PLACED: &str = "meta-admits-twins-of-placed-groups";

/// A bug switch for checking the checks: every authenticated caller may do everything,
/// as before identities had roles (the permission matrix must catch it).
pub const AUTHORIZATION_OFF: &str = "access-allows-every-caller";

/// A fixed bug, back for checking its test: a shard's plan says it read its members'
/// labels even where no filter did, so members that differ only in labels (an Indexed
/// Job's pods) never take each other's slots, and a gang spread over shards collides on
/// the same members and never reaches minMember.
pub const PLANS_READ_EVERY_LABEL: &str = "plans-read-every-label";

/// A fixed bug, back for checking the checks: the ingest takes no notice of Kubernetes'
/// own PodGroups (as before it read them), so each pod naming one is scheduled alone and
/// a gang that does not fit binds in part.
pub const KUBERNETES_POD_GROUPS_IGNORED: &str = "ingest-ignores-kubernetes-pod-groups";

/// A bug switch for checking the checks: the coordinator's plans leave out the gangs'
/// topology constraints, so a gang that must lie in one rack lands on any nodes (I9).
pub const PLANS_IGNORE_TOPOLOGY: &str = "coordinator-plans-without-topology";

/// A switch for comparing with blind retries: the coordinator never parks a group that
/// fit nowhere, so every such group is planned again at each backoff expiry (the
/// behaviour before event-driven requeueing; `gangway bench parked` measures both).
pub const PARKING_OFF: &str = "coordinator-never-parks";
/// Bug switch: the coordinator plans every group as if no node were reserved, so the
/// groups behind a reserved one take its room as it frees (`server/tests/reservations.rs`
/// catches it).
pub const RESERVATIONS_IGNORED: &str = "coordinator-ignores-reservations";

/// Every crash point and bug switch a test may name.
pub const ALL: [&str; 32] = [
    AFTER_RESERVE,
    AFTER_DECIDE,
    PREEMPTION_AFTER_RESERVE,
    PREEMPTION_AFTER_DECIDE,
    PARTICIPANT_AFTER_RESERVE,
    BINDER_AFTER_BIND,
    COORDINATOR_SKIPS_DECISION,
    REPLAN_HELD_MEMBERS,
    RELEASE_SHARDS_FIRST,
    RAFT_TRANSPORT_OPEN,
    META_FORGETS_UNACKED,
    META_RETURNS_VICTIMS_AT_ABORT,
    SELECTORS_INLINE,
    BIND_BEFORE_VICTIMS_LEAVE,
    BINDER_DROPS_CONFIGS,
    OBSERVED_CLAIMS_PER_POD,
    BINDER_IGNORES_BINDING_CONDITIONS,
    SHARED_CLAIMS_FREED_WITH_CARRIER,
    SHARE_IDS_NOT_UUIDS,
    OTHER_SCHEDULERS_NETWORK_CLAIMS_IGNORED,
    SLICELESS_POOLS_OFFERED,
    META_ADMITS_OVER_QUOTA,
    PENDING_KEEPS_BACKED_OFF,
    MOVE_AFTER_HANDOFF,
    MOVE_SEALS_IN_FLIGHT,
    META_ADMITS_TWINS_OF_PLACED,
    AUTHORIZATION_OFF,
    PLANS_READ_EVERY_LABEL,
    KUBERNETES_POD_GROUPS_IGNORED,
    PLANS_IGNORE_TOPOLOGY,
    PARKING_OFF,
    RESERVATIONS_IGNORED,
];

/// The armed crash points of a process.
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    armed: BTreeSet<String>,
    once_dir: Option<PathBuf>,
}

impl Failpoints {
    /// No crash points (production).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// The points named by the environment.
    pub fn from_env() -> Self {
        let armed = std::env::var("GANGWAY_TEST_FAILPOINTS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let once_dir = std::env::var_os("GANGWAY_TEST_FAILPOINT_DIR").map(PathBuf::from);
        let points = Self { armed, once_dir };
        for unknown in points.unknown() {
            eprintln!("gangway: GANGWAY_TEST_FAILPOINTS names {unknown:?}, which is no crash point or bug switch; known: {}", ALL.join(", "));
        }
        points
    }

    /// Armed names that are no crash point or bug switch (a typo arms nothing).
    pub fn unknown(&self) -> Vec<&str> {
        self.armed
            .iter()
            .map(String::as_str)
            .filter(|n| !ALL.contains(n))
            .collect()
    }

    /// Whether `name` is armed (for bug switches, which alter a step instead of crashing).
    pub fn armed(&self, name: &str) -> bool {
        self.armed.contains(name)
    }

    /// Crashes the process if `name` is armed (and not yet fired elsewhere).
    pub fn hit(&self, name: &str) {
        if !self.armed.contains(name) {
            return;
        }
        if let Some(dir) = &self.once_dir {
            let marker = dir.join(name);
            if std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&marker)
                .is_err()
            {
                return;
            }
        }
        eprintln!("gangway: failpoint {name} fired: aborting the process");
        std::process::abort();
    }
}

#[cfg(test)]
#[path = "failpoints_tests.rs"]
mod tests;
