//! Loopback port picking for tools that start local gangway processes (the
//! benches, the test harness, the chaos supervisor).
//!
//! A port found by binding `127.0.0.1:0` comes from the kernel's ephemeral
//! range, the same range outgoing connections draw their source ports from:
//! between releasing the probe and the child binding it, any connection on the
//! machine may take it ("Address already in use"). Ports handed out here lie
//! just below the ephemeral range, where the kernel never assigns source ports,
//! and each process walks its own offset so parallel test binaries rarely probe
//! the same port.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Linux's default low end of `ip_local_port_range`, used when it cannot be read.
const EPHEMERAL_LOW_DEFAULT: u16 = 32_768;
/// How many ports below the ephemeral range are candidates.
const CANDIDATE_PORTS: u16 = 12_000;
/// Lowest port ever handed out (keeps clear of well-known and registered services).
const PORT_FLOOR: u16 = 10_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port that was free a moment ago and lies outside the kernel's
/// ephemeral range; falls back to a kernel-chosen port if none is.
pub fn free_port() -> std::io::Result<u16> {
    let (low, span) = candidate_range(ephemeral_low());
    let offset = std::process::id().wrapping_mul(7_919) % u32::from(span);
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low + ((offset + step) % u32::from(span)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The candidate ports: `CANDIDATE_PORTS` below `ephemeral_low`, not under `PORT_FLOOR`.
fn candidate_range(ephemeral_low: u16) -> (u16, u16) {
    let low = ephemeral_low
        .saturating_sub(CANDIDATE_PORTS)
        .max(PORT_FLOOR);
    let span = ephemeral_low.saturating_sub(low).max(1);
    (low, span)
}

fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_LOW_DEFAULT)
}

#[cfg(test)]
#[path = "loopback_tests.rs"]
mod tests;
