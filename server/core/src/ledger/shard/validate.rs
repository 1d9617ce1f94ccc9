//! The checks of a ledger command that need no state (`admit`): batches within bounds
//! and not nested, reservations, network holds, claims, deadlines, displacements and
//! observed pods well formed. What passes may still be refused by `apply`.

use super::*;

/// The checks of `cmd` that need no state: a batch within bounds and not nested,
/// a reservation that is well formed. What passes may still be refused by `apply`.
pub fn admit(cmd: &LedgerCommand) -> Result<(), LedgerError> {
    match &cmd.op {
        LedgerOp::Batch { ops } if ops.len() > LEDGER_BATCH_MAX => {
            Err(LedgerError::BatchTooLarge { ops: ops.len() })
        }
        LedgerOp::Batch { ops } if ops.iter().any(|op| matches!(op, LedgerOp::Batch { .. })) => {
            Err(LedgerError::NestedBatch)
        }
        LedgerOp::VictimsGone { members } if members.len() > LEDGER_BATCH_MAX => {
            Err(LedgerError::BatchTooLarge { ops: members.len() })
        }
        LedgerOp::Reserve {
            txn_id,
            members,
            deadline_ms,
            network,
        } => validate_reservation(
            cmd.at_ms,
            *txn_id,
            members,
            network,
            Hold::Until(*deadline_ms),
        ),
        LedgerOp::ReserveAndCommit {
            txn_id,
            members,
            network,
        } => validate_reservation(cmd.at_ms, *txn_id, members, network, Hold::CommitNow),
        LedgerOp::ReserveDisplacing {
            txn_id,
            members,
            victims,
            deadline_ms,
        } => validate_displacing(cmd.at_ms, *txn_id, members, victims, *deadline_ms),
        LedgerOp::FenceNodes { nodes, .. } if nodes.len() > MOVE_NODES_MAX => {
            Err(LedgerError::MoveTooLarge { nodes: nodes.len() })
        }
        LedgerOp::Adopt { parcel } if parcel.nodes.len() > MOVE_NODES_MAX => {
            Err(LedgerError::MoveTooLarge {
                nodes: parcel.nodes.len(),
            })
        }
        _ => Ok(()),
    }
}

pub(super) fn validate_reservation(
    at_ms: u64,
    txn_id: TxnId,
    members: &[ReserveMember],
    network: &[NetworkHold],
    hold: Hold,
) -> Result<(), LedgerError> {
    if members.is_empty() && network.is_empty() {
        return Err(LedgerError::EmptyReservation { txn_id });
    }
    validate_network_holds(txn_id, network)?;
    validate_claim_users(txn_id, members, network)?;
    if let Hold::Until(deadline_ms) = hold {
        validate_deadline(at_ms, txn_id, deadline_ms)?;
    }
    let mut seen = BTreeSet::new();
    for m in members {
        if members.len() > 1 && !seen.insert(&m.member) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: m.member.clone(),
            });
        }
        validate_summary(txn_id, m)?;
    }
    Ok(())
}

/// Checks a reservation's network holds: bounded, members valid and distinct, each
/// holding at least one valid allocation.
pub(super) fn validate_network_holds(
    txn_id: TxnId,
    network: &[NetworkHold],
) -> Result<(), LedgerError> {
    if network.len() > LEDGER_BATCH_MAX {
        return Err(LedgerError::BatchTooLarge { ops: network.len() });
    }
    let mut seen = BTreeSet::new();
    for hold in network {
        let invalid = |message: String| LedgerError::InvalidMember {
            txn_id,
            member: hold.member.clone(),
            message,
        };
        hold.member.validate().map_err(|e| invalid(e.to_string()))?;
        if hold.member.gang == CLAIM_GANG || hold.member.gang == OBSERVED_GANG {
            return Err(invalid(format!(
                "gang {} is reserved for gangway's own keys",
                hold.member.gang
            )));
        }
        if !seen.insert((&hold.member, &hold.claim)) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: hold.member.clone(),
            });
        }
        if let Some(claim) = &hold.claim {
            if let Err(e) = validate_shares(
                &FieldPath::new("network").child("claim"),
                &[crate::model::claim::ClaimShare {
                    pod_claim: "claim".into(),
                    claim: claim.clone(),
                }],
            ) {
                return Err(invalid(e.to_string()));
            }
        } else if hold.devices.is_empty() {
            return Err(invalid("its network hold names no device".into()));
        }
        validate_allocations(&FieldPath::new("network").child("devices"), &hold.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

/// Checks that each shared claim a reservation's network holds carry or use is shared
/// by the member's pod, for the members placed on this shard (the others' own shards
/// check theirs).
pub(super) fn validate_claim_users(
    txn_id: TxnId,
    members: &[ReserveMember],
    network: &[NetworkHold],
) -> Result<(), LedgerError> {
    for hold in network {
        let (HoldKind::Carry(claim) | HoldKind::Use(claim)) = hold.kind() else {
            continue;
        };
        let Some(m) = members.iter().find(|m| m.member == hold.member) else {
            continue;
        };
        if !m.pod.shares.iter().any(|s| s.claim == claim) {
            return Err(LedgerError::InvalidMember {
                txn_id,
                member: hold.member.clone(),
                message: format!(
                    "network.claim: its pod does not share ResourceClaim {claim} (pod.shares)"
                ),
            });
        }
    }
    Ok(())
}

/// Checks other schedulers' network holds: bounded, keyed as observed, distinct, each
/// with valid allocations.
pub(super) fn validate_observed_network_holds(holds: &[NetworkHold]) -> Result<(), LedgerError> {
    if holds.len() > OBSERVED_NETWORK_HOLDS_MAX {
        return Err(LedgerError::BatchTooLarge { ops: holds.len() });
    }
    let mut seen = BTreeSet::new();
    for hold in holds {
        let invalid = |message: String| LedgerError::InvalidObservedPod {
            node: String::new(),
            message: format!("network hold {}: {message}", hold.member),
        };
        hold.member.validate().map_err(|e| invalid(e.to_string()))?;
        if hold.member.gang != OBSERVED_GANG {
            return Err(invalid(format!("must be keyed in gang {OBSERVED_GANG}")));
        }
        if !seen.insert(&hold.member) {
            return Err(invalid("listed twice".into()));
        }
        if hold.devices.is_empty() {
            return Err(invalid("names no device".into()));
        }
        validate_allocations(&FieldPath::new("devices"), &hold.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

/// A deadline after the command's time and at most [`RESERVE_HOLD_MS_MAX`] after it.
pub(super) fn validate_deadline(
    at_ms: u64,
    txn_id: TxnId,
    deadline_ms: u64,
) -> Result<(), LedgerError> {
    if deadline_ms <= at_ms {
        return Err(LedgerError::DeadlinePassed {
            txn_id,
            deadline_ms,
            at_ms,
        });
    }
    if deadline_ms - at_ms > RESERVE_HOLD_MS_MAX {
        return Err(LedgerError::HoldTooLong {
            txn_id,
            deadline_ms,
            at_ms,
        });
    }
    Ok(())
}

/// Checks a preemption's reservation: what a reservation needs (members may be empty
/// when victims are not), victims distinct, valid, not placeholders and not members.
pub(super) fn validate_displacing(
    at_ms: u64,
    txn_id: TxnId,
    members: &[ReserveMember],
    victims: &[MemberKey],
    deadline_ms: u64,
) -> Result<(), LedgerError> {
    if victims.is_empty() && members.is_empty() {
        return Err(LedgerError::EmptyReservation { txn_id });
    }
    validate_deadline(at_ms, txn_id, deadline_ms)?;
    for m in members {
        if displace::is_placeholder(&m.member) {
            return Err(LedgerError::InvalidMember {
                txn_id,
                member: m.member.clone(),
                message: "a member may not be keyed as a placeholder".into(),
            });
        }
    }
    if !members.is_empty() {
        validate_reservation(at_ms, txn_id, members, &[], Hold::Until(deadline_ms))?;
    }
    let mut seen = BTreeSet::new();
    for v in victims {
        let bad = v.validate().is_err()
            || displace::is_placeholder(v)
            || members.iter().any(|m| m.member == *v);
        if bad || !seen.insert(v) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: v.clone(),
            });
        }
    }
    Ok(())
}

/// Checks an observed pod list: bounded, keys valid and distinct, summaries sane.
pub(super) fn validate_observed(node: &str, pods: &[ObservedPod]) -> Result<(), LedgerError> {
    let invalid = |message: String| LedgerError::InvalidObservedPod {
        node: node.to_string(),
        message,
    };
    if pods.len() > OBSERVED_PODS_PER_NODE_MAX {
        return Err(invalid(format!(
            "pods: {} on one node, at most {OBSERVED_PODS_PER_NODE_MAX}",
            pods.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (i, p) in pods.iter().enumerate() {
        let key = p.member_key();
        key.validate()
            .map_err(|e| invalid(format!("pods[{i}]: {e}")))?;
        if !seen.insert(key) {
            return Err(invalid(format!("pods[{i}].uid: {} listed twice", p.uid)));
        }
        let at = FieldPath::new("pods").index(i).child("pod");
        validate_allocations(&at.child("devices"), &p.pod.devices)
            .map_err(|e| invalid(e.to_string()))?;
        // Another scheduler's pods carry what their claims hold (a shared claim's once,
        // by the caller's choice); carrying and following is for gangway's own pods.
        if !p.pod.shares.is_empty() {
            return Err(invalid(format!(
                "{}: an observed pod lists no shared claims",
                at.child("shares")
            )));
        }
        p.pod
            .requests
            .validate(&at.child("requests"))
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

pub(super) fn validate_summary(txn_id: TxnId, m: &ReserveMember) -> Result<(), LedgerError> {
    let invalid = |message: String| LedgerError::InvalidMember {
        txn_id,
        member: m.member.clone(),
        message,
    };
    m.member.validate().map_err(|e| invalid(e.to_string()))?;
    if !m.pod.devices.is_empty() {
        validate_allocations(&FieldPath::new("pod").child("devices"), &m.pod.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    if !m.pod.shares.is_empty() {
        validate_shares(&FieldPath::new("pod").child("shares"), &m.pod.shares)
            .map_err(|e| invalid(e.to_string()))?;
    }
    // Only extended resources can be invalid, and only errors need the path.
    if m.pod.requests.extended.is_empty() && m.pod.requests.pods == 0 {
        return Ok(());
    }
    let path = FieldPath::new("pod").child("requests");
    m.pod
        .requests
        .validate(&path)
        .map_err(|e| invalid(e.to_string()))?;
    if m.pod.requests.pods != 0 {
        return Err(invalid(format!(
            "{path}.pods: every pod counts as one; leave it zero"
        )));
    }
    Ok(())
}
