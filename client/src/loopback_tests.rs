//! Unit tests of `loopback.rs`.

use super::*;

#[test]
fn candidates_lie_below_the_ephemeral_range() {
    assert_eq!(candidate_range(32_768), (20_768, 12_000));
    assert_eq!(candidate_range(15_000), (10_000, 5_000));
    assert_eq!(candidate_range(5_000), (10_000, 1));
}

#[test]
fn consecutive_picks_differ_and_are_bindable() {
    let a = free_port().expect("a port");
    let b = free_port().expect("a port");
    assert_ne!(a, b);
    assert!(TcpListener::bind(("127.0.0.1", a)).is_ok());
    assert!(a < ephemeral_low() || ephemeral_low() <= PORT_FLOOR);
}
