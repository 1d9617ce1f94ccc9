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

/// A peer that accepts connections and never answers: the call's own timeout
/// expires on this side (tonic reports it as CANCELLED, with its transport error).
async fn call_a_silent_peer() -> tonic::Status {
    use gangway_proto::raft::raft_transport_client::RaftTransportClient;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let mut req = tonic::Request::new(gangway_proto::raft::ProposeManyRequest::default());
    req.set_timeout(std::time::Duration::from_millis(100));
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        RaftTransportClient::new(channel).propose_many(req),
    )
    .await
    .expect("the call's own timeout ends it");
    held.abort();
    answer.expect_err("a silent peer answers nothing")
}

#[tokio::test]
async fn a_peer_that_does_not_answer_in_time_is_a_deadline_not_a_cancellation() {
    let timed_out = call_a_silent_peer().await;
    assert_eq!(timed_out.code(), tonic::Code::Cancelled, "{timed_out:?}");
    let e = HostError::from_peer_status(0, 1, "127.0.0.1:7001", &timed_out);
    assert!(matches!(e, HostError::PeerTimedOut { .. }), "{e:?}");
    assert!(!e.is_retryable(), "the request may have been applied");
    let status = e.to_status();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("127.0.0.1:7001"), "{status:?}");

    // A CANCELLED the peer itself sent is passed on as it is.
    let sent = tonic::Status::cancelled("the peer's own answer");
    let e = HostError::from_peer_status(0, 1, "127.0.0.1:7001", &sent);
    assert_eq!(e.to_status().code(), tonic::Code::Cancelled);
}
