//! Unit tests of `lib.rs`.

use super::*;

#[test]
fn a_connection_broken_mid_call_is_unavailable() {
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
    let ClientError::Rpc(status) = ClientError::from(tonic::Status::from_error(Box::new(reset)))
    else {
        panic!("an RPC error");
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    let ClientError::Rpc(status) = ClientError::from(tonic::Status::unknown("the server said so"))
    else {
        panic!("an RPC error");
    };
    assert_eq!(status.code(), tonic::Code::Unknown, "{status}");
}
