//! Unit tests of `hostile.rs`.

use super::*;

/// A connection reset mid-call (a replica restarting) leaves the call's fate
/// unknown; only an answer the replica sent counts as served.
#[test]
fn a_call_cut_by_the_network_is_not_served() {
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    let cut = tonic::Status::from_error(Box::new(reset));
    assert!(matches!(
        Forged::judge("Propose", Err(cut)),
        Some(Forged::Unreachable(_))
    ));
    let answered = tonic::Status::unknown("transport error");
    assert!(matches!(
        Forged::judge("Propose", Err(answered)),
        Some(Forged::Served(_))
    ));
    let refused = tonic::Status::unauthenticated("peer secret required");
    assert!(Forged::judge("Propose", Err(refused)).is_none());
    assert!(matches!(
        Forged::judge("Vote", Ok(())),
        Some(Forged::Served(_))
    ));
}
