//! Unit tests of `proxy.rs`.

use super::*;

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.write_all(b"ping").await.ok()?;
    let mut buf = [0u8; 4];
    tokio::time::timeout(within, s.read_exact(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(start.elapsed())
}

#[tokio::test]
async fn passes_delays_cuts_silently_and_closes_stalled_connections_on_heal() {
    let proxy = LinkProxy::start(echo_server().await).await.expect("proxy");
    let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert!(round_trip(&mut s, Duration::from_secs(2)).await.is_some());

    proxy.set(LinkMode::Delay(150));
    let rtt = round_trip(&mut s, Duration::from_secs(2))
        .await
        .expect("delayed");
    // Both directions are delayed.
    assert!(rtt >= Duration::from_millis(300), "{rtt:?}");

    proxy.set(LinkMode::Cut);
    assert!(round_trip(&mut s, Duration::from_millis(300))
        .await
        .is_none());
    // A cut is silence: a new connection is accepted, then nothing flows.
    let mut fresh = TcpStream::connect(proxy.addr()).await.expect("accepted");
    assert!(round_trip(&mut fresh, Duration::from_millis(200))
        .await
        .is_none());

    proxy.set(LinkMode::Pass);
    // The stalled connection is closed; a new one works.
    let mut buf = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert!(round_trip(&mut again, Duration::from_secs(2))
        .await
        .is_some());
}
