//! Unit tests of `error.rs`.

use super::*;

#[test]
fn a_connection_broken_mid_call_is_unavailable_and_not_retried_here() {
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
    let made_here = tonic::Status::from_error(Box::new(reset));
    assert_eq!(made_here.code(), tonic::Code::Unknown);
    let e = HostError::from_peer_status(0, 1, "127.0.0.1:7001", &made_here);
    assert!(matches!(e, HostError::ConnectionLost { .. }), "{e:?}");
    assert!(!e.is_retryable(), "the request may have been applied");
    assert_eq!(e.to_status().code(), tonic::Code::Unavailable);

    // A replica whose group stopped with the request: UNAVAILABLE, not retried.
    let stopped = HostError::Fatal {
        group: 3,
        detail: "storage I/O failed".into(),
    }
    .to_status();
    assert_eq!(stopped.code(), tonic::Code::Unavailable);
    let e = HostError::from_peer_status(3, 1, "127.0.0.1:7001", &stopped);
    assert!(matches!(e, HostError::Fatal { group: 3, .. }), "{e:?}");
    assert!(!e.is_retryable(), "the request may have been applied");
    assert_eq!(e.to_status().code(), tonic::Code::Unavailable);

    // An UNKNOWN the peer itself sent is passed on as it is.
    let sent = tonic::Status::unknown("the peer's own answer");
    let e = HostError::from_peer_status(0, 1, "127.0.0.1:7001", &sent);
    assert_eq!(e.to_status().code(), tonic::Code::Unknown);
}
