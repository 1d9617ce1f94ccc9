//! Peer proofs: how a replica shows a peer that it holds the cluster's peer secret
//! without ever sending the secret. Every call a replica makes to another carries, in
//! [`PEER_PROOF_HEADER`], HMAC-SHA256 of the cluster id and the *callee's* node id,
//! keyed by the secret. The callee recomputes it for its own id. A proof is therefore
//! good only at the replica it was made for: a process an operator (or an attacker
//! with an admin's credentials) adds as a learner receives proofs for its own id,
//! which no real replica accepts, and never the secret. Pure; used by the network
//! (sending) and by `gangway-server`'s gates (checking).

use ring::hmac;

use crate::types::NodeId;

/// Metadata key carrying the proof on every call a replica makes to a peer.
pub const PEER_PROOF_HEADER: &str = "x-gangway-peer-proof";
/// Metadata key of the secret itself, as releases before peer proofs sent it: sent and
/// accepted only by a replica writing for the first rollout of an upgrade, so replicas
/// of both releases talk while it lasts.
pub const LEGACY_PEER_SECRET_HEADER: &str = "x-gangway-peer-secret";

/// Domain separation: a proof is never the HMAC of anything else gangway signs.
const PROOF_CONTEXT: &[u8] = b"gangway peer proof v1\0";

fn message(cluster_id: &str, to: NodeId) -> Vec<u8> {
    let mut m = Vec::with_capacity(PROOF_CONTEXT.len() + cluster_id.len() + 9);
    m.extend_from_slice(PROOF_CONTEXT);
    m.extend_from_slice(cluster_id.as_bytes());
    m.push(0);
    m.extend_from_slice(&to.to_be_bytes());
    m
}

/// The proof for a call to node `to` of cluster `cluster_id`, as hex.
pub fn peer_proof(secret: &str, cluster_id: &str, to: NodeId) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hex::encode(hmac::sign(&key, &message(cluster_id, to)).as_ref())
}

/// Whether `proof` (hex) was made with one of `secrets` for node `own` of
/// `cluster_id` (compared in constant time).
pub fn proof_accepted<'a>(
    proof: &str,
    secrets: impl IntoIterator<Item = &'a str>,
    cluster_id: &str,
    own: NodeId,
) -> bool {
    let Ok(tag) = hex::decode(proof) else {
        return false;
    };
    let msg = message(cluster_id, own);
    secrets.into_iter().any(|secret| {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        hmac::verify(&key, &msg, &tag).is_ok()
    })
}

#[cfg(test)]
#[path = "peer_proof_tests.rs"]
mod tests;
