//! Unit tests of `peer_proof.rs`.

use super::*;

#[test]
fn a_proof_is_good_only_for_its_callee_cluster_and_secret() {
    let secret = "0123456789abcdef-secret";
    let to_two = peer_proof(secret, "gangway", 2);
    assert!(proof_accepted(&to_two, [secret], "gangway", 2));
    assert!(
        !proof_accepted(&to_two, [secret], "gangway", 3),
        "another callee"
    );
    assert!(
        !proof_accepted(&to_two, [secret], "other", 2),
        "another cluster"
    );
    assert!(!proof_accepted(
        &to_two,
        ["another-secret-value"],
        "gangway",
        2
    ));
    assert!(
        proof_accepted(&to_two, ["new-secret-value-1", secret], "gangway", 2),
        "rotation"
    );
    assert!(!to_two.contains(secret));
    assert!(!proof_accepted("not hex", [secret], "gangway", 2));
    assert!(!proof_accepted("", [secret], "gangway", 2));
}
