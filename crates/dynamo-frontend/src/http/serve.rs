//! The accept loop: HTTP/1 connections with a header-read timeout, a per-client connection
//! limit and a graceful drain.
//!
//! `axum::serve` has neither a header timeout nor a connection limit, so a slow sender
//! (slowloris: a few header bytes now and then) holds a connection and its task forever,
//! and one client can open connections until the process runs out of file descriptors.
//! Here each connection is served by hyper's HTTP/1 builder with a timer:
//!
//! * the request head (line and headers) must arrive within the header-read timeout, which
//!   also closes idle keep-alive connections after that long;
//! * a client address holds at most `max_connections_per_ip` connections; the next one is
//!   answered `429` with `Connection: close` and closed.
//!
//! The body-read timeout is applied where the body is read (the OpenAI handlers), as a
//! deadline for the whole body.
//!
//! Connections may be upgraded (the realtime WebSocket): an upgraded connection leaves this
//! loop's bookkeeping and lives in its own task.
//!
//! On shutdown the listener closes, idle connections close, and requests in flight (SSE
//! streams included) finish before [`serve`] returns. (hyper-util's `GracefulShutdown`
//! cannot watch upgradeable HTTP/1 connections, so the drain is a watch channel plus a
//! channel whose senders the connection tasks hold.)

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Connection limits of the listener.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnLimits {
    /// Deadline for a request head (`None`: no deadline).
    pub(super) header_read_timeout: Option<Duration>,
    /// Most open connections per client address (0: no limit).
    pub(super) max_connections_per_ip: usize,
}

/// Open connections per client address.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One open connection of a client; frees its slot when dropped.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl PeerCounts {
    /// A slot for `ip`, unless it already holds `max` connections (`max == 0`: no limit).
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let n = counts.entry(ip).or_insert(0);
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            counts: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// How long a refused connection is read from (so the client sees the 429 rather than a
/// reset caused by its unread request) before it is closed.
const REFUSE_LINGER: Duration = Duration::from_secs(1);

/// Answer a connection over the per-client limit with 429 and close it.
async fn refuse(mut tcp: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "message": format!("too many connections from this client (at most {max}); retry later"),
        "type": "rate_limit_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    // One write: head and body leave in one segment, so a client's first read sees both.
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    if tcp.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSE_LINGER, async {
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Pause after an accept error other than a failed connection (e.g. out of file
/// descriptors), so the loop does not spin; axum waits the same.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serve `router` on `listener` until `shutdown` completes, then drain.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Each connection task holds a sender; `recv` returns `None` once every task has ended.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let counts = Arc::new(PeerCounts::default());
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small SSE frames must leave at once: without TCP_NODELAY, Nagle plus the client's
        // delayed ACK adds ~40 ms to every short streamed response.
        let _ = tcp.set_nodelay(true);
        let Some(slot) = counts.take(peer.ip(), limits.max_connections_per_ip) else {
            tracing::debug!(peer = %peer, "connection refused: per-client limit");
            tokio::spawn(refuse(tcp, limits.max_connections_per_ip));
            continue;
        };
        let conn = builder
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()))
            .with_upgrades();
        let (mut stop, alive) = (stop_rx.clone(), alive_tx.clone());
        tokio::spawn(async move {
            let (_slot, _alive) = (slot, alive);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                // The flag only ever turns true (a dropped sender also means stop).
                _ = stop.changed() => {
                    // Finish the request in flight, then close.
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
}

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_slots_are_limited_per_address_and_freed_on_drop() {
        let counts = Arc::new(PeerCounts::default());
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let s1 = counts.take(a, 2).expect("first");
        let _s2 = counts.take(a, 2).expect("second");
        assert!(counts.take(a, 2).is_none());
        let _other = counts
            .take(b, 2)
            .expect("another address has its own slots");
        drop(s1);
        assert!(counts.take(a, 2).is_some());
        assert!(counts.take(a, 0).is_some(), "0: no limit");
    }
}
