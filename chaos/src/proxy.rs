//! One direction of one peer link: a TCP proxy on 127.0.0.1 that replica A
//! dials to reach replica B (`--test-peer-route`). The supervisor owns one per
//! ordered pair, so a link can be cut one way, or delayed, without touching
//! the other direction.
//!
//! A cut is silence, as in a real partition: bytes stop flowing but nothing is
//! reset, so peers find out only by their own timeouts. When the link heals,
//! connections that stalled during the cut are closed (their peers reconnect),
//! as a long outage ends TCP connections; idle ones live on.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Bytes read from a socket at a time.
const CHUNK_BYTES_MAX: usize = 16 * 1024;
/// Chunks in flight per direction of one connection (delayed or held by a cut).
const CHUNKS_QUEUED_MAX: usize = 256;

/// What a link does with the bytes sent over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMode {
    /// Bytes pass at once.
    Pass,
    /// Bytes pass after this many ms.
    Delay(u64),
    /// Nothing passes; connections stall.
    Cut,
}

/// A running link proxy.
pub struct LinkProxy {
    addr: SocketAddr,
    mode: watch::Sender<LinkMode>,
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(LinkMode::Pass);
        let task = tokio::spawn(accept_loop(listener, target, rx));
        Ok(Self { addr, mode, task })
    }

    /// The address the dialling replica is given.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what the link does, for existing and new connections.
    pub fn set(&self, mode: LinkMode) {
        self.mode.send_replace(mode);
    }

    /// The link's current mode.
    pub fn mode(&self) -> LinkMode {
        *self.mode.borrow()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<LinkMode>) {
    // Connections are owned by the accept loop's set, so aborting it closes them all.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((inbound, _)) => {
                    conns.spawn(connection(inbound, target, mode.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Waits while the link is cut; `Err` if it was (the connection must then close).
async fn pass_or_close(mode: &mut watch::Receiver<LinkMode>) -> Result<u64, ()> {
    let mut was_cut = false;
    loop {
        let current = *mode.borrow_and_update();
        match current {
            LinkMode::Cut => {
                was_cut = true;
                mode.changed().await.map_err(|_| ())?;
            }
            _ if was_cut => return Err(()),
            LinkMode::Pass => return Ok(0),
            LinkMode::Delay(ms) => return Ok(ms),
        }
    }
}

async fn connection(inbound: TcpStream, target: SocketAddr, mut mode: watch::Receiver<LinkMode>) {
    if pass_or_close(&mut mode).await.is_err() {
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::select! {
        _ = pump(in_read, out_write, mode.clone()) => {}
        _ = pump(out_read, in_write, mode) => {}
    }
}

/// Copies one direction: a reader stamps each chunk with when it may be sent, a
/// writer sends it then, unless the link is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_QUEUED_MAX);
    let delays = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK_BYTES_MAX];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let delay = match *delays.borrow() {
                LinkMode::Delay(ms) => ms,
                _ => 0,
            };
            let due = Instant::now() + Duration::from_millis(delay);
            if tx.send((due, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            if pass_or_close(&mut mode).await.is_err() {
                return;
            }
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    // The direction ends when either side does; the caller then closes both sockets.
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
