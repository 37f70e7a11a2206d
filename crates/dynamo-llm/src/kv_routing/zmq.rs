//! Relay mode: a minimal ZMQ SUB client (ZMTP 3.0, NULL security) that reads an engine's KV
//! events from its PUB socket (vLLM / SGLang format, decoded by
//! `dynamo_kv_router::engine_events`) and republishes them through a [`KvEventPublisher`].
//!
//! Only what a SUB socket needs is implemented: the greeting, the NULL handshake
//! (`READY` with `Socket-Type=SUB`), one subscription message and reading multipart
//! messages (commands such as heartbeats are skipped). Written here rather than pulling a
//! ZMQ crate: about 150 lines against a dependency tree of async runtimes and codecs.
//! The connection is re-dialled (100 ms, backing off to 2 s) until the publisher stops;
//! engine messages sent while disconnected are lost (PUB semantics), which routers
//! recover from through the worker-local indexer.

use std::sync::Weak;
use std::time::Duration;

use dynamo_kv_router::engine_events::decode_engine_batch;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::KvEventPublisher;

/// Largest frame accepted from the engine.
const MAX_FRAME: u64 = 64 * 1024 * 1024;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

fn io_err(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// The 64-byte ZMTP 3.0 greeting of a NULL-mechanism client.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3; // major
    g[11] = 0; // minor: 3.0 subscriptions are messages, accepted by 3.1 peers too
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn short_frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(body.len() + 9);
    if body.len() > 255 {
        f.push(flags | FLAG_LONG);
        f.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        f.push(flags);
        f.push(body.len() as u8);
    }
    f.extend_from_slice(body);
    f
}

fn ready_command() -> Vec<u8> {
    let mut body = Vec::new();
    body.push(5);
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(b"SUB");
    short_frame(FLAG_COMMAND, &body)
}

/// Read one frame: `(flags, body)`.
async fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let flags = s.read_u8().await?;
    let size = if flags & FLAG_LONG != 0 {
        s.read_u64().await?
    } else {
        u64::from(s.read_u8().await?)
    };
    if size > MAX_FRAME {
        return Err(io_err(format!("frame of {size} bytes exceeds the limit")));
    }
    let mut body = vec![0u8; size as usize];
    s.read_exact(&mut body).await?;
    Ok((flags, body))
}

/// Connect, handshake and subscribe to `topic`.
async fn connect(address: &str, topic: &[u8]) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(address).await?;
    s.set_nodelay(true)?;
    s.write_all(&greeting()).await?;
    let mut peer = [0u8; 64];
    s.read_exact(&mut peer).await?;
    if peer[0] != 0xFF || peer[9] != 0x7F || peer[10] < 3 {
        return Err(io_err("not a ZMTP 3 peer"));
    }
    if &peer[12..16] != b"NULL" {
        return Err(io_err("the engine's socket requires a security mechanism"));
    }
    s.write_all(&ready_command()).await?;
    let (flags, body) = read_frame(&mut s).await?;
    if flags & FLAG_COMMAND == 0 || body.get(1..6) != Some(b"READY".as_slice()) {
        return Err(io_err("expected READY from the engine"));
    }
    let mut sub = Vec::with_capacity(topic.len() + 1);
    sub.push(1);
    sub.extend_from_slice(topic);
    s.write_all(&short_frame(0, &sub)).await?;
    Ok(s)
}

/// Read messages until the connection breaks, `stop` fires or `on_message` returns false.
async fn pump<F: FnMut(Vec<Vec<u8>>) -> bool>(
    s: &mut TcpStream,
    on_message: &mut F,
    stop: &CancellationToken,
) -> std::io::Result<()> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    loop {
        let (flags, body) = tokio::select! {
            f = read_frame(s) => f?,
            () = stop.cancelled() => return Ok(()),
        };
        if flags & FLAG_COMMAND != 0 {
            continue;
        }
        parts.push(body);
        if flags & FLAG_MORE != 0 {
            if parts.len() > 16 {
                return Err(io_err("too many message parts"));
            }
            continue;
        }
        if !on_message(std::mem::take(&mut parts)) {
            return Ok(());
        }
    }
}

/// Forward one engine message (`[topic, sequence, payload]`; older engines:
/// `[topic, payload]`; the payload is last) to `publisher`. False once it is gone.
fn forward_kv_batch(message: Vec<Vec<u8>>, publisher: &Weak<KvEventPublisher>) -> bool {
    let Some(payload) = message.last() else {
        return true;
    };
    let Some(publisher) = publisher.upgrade() else {
        return false;
    };
    match decode_engine_batch(payload) {
        Ok(batch) => {
            let inputs: Vec<_> = batch
                .events
                .iter()
                .map(|e| e.to_publish_input(None))
                .collect();
            if publisher.publish_batch(&inputs).is_err() {
                // One bad event must not drop its neighbours.
                for input in &inputs {
                    if let Err(e) = publisher.publish_batch(std::slice::from_ref(input)) {
                        tracing::warn!(error = %e, "engine KV event dropped");
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "malformed engine KV event batch"),
    }
    true
}

/// Relay `endpoint` (`tcp://host:port`) to `publisher` until it stops.
pub(crate) async fn relay(
    endpoint: String,
    topic: String,
    publisher: Weak<KvEventPublisher>,
    stop: CancellationToken,
) {
    let alive = publisher.clone();
    subscribe_loop(
        endpoint,
        topic.into_bytes(),
        stop,
        move || alive.strong_count() > 0,
        move |message| forward_kv_batch(message, &publisher),
    )
    .await;
}

/// Subscribe to the ZMQ PUB socket at `endpoint` (`tcp://host:port`; `*` means loopback)
/// with the `topic` prefix and hand every multipart message to `on_message`, re-dialling
/// after a lost connection (the publisher restarted) while `alive()` holds, until `stop`
/// fires or `on_message` returns false.
pub(crate) async fn subscribe_loop<A, F>(
    endpoint: String,
    topic: Vec<u8>,
    stop: CancellationToken,
    alive: A,
    on_message: F,
) where
    A: Fn() -> bool,
    F: FnMut(Vec<Vec<u8>>) -> bool,
{
    subscribe_loop_observed(endpoint, topic, stop, alive, on_message, |_| {}).await;
}

/// The state of a subscriber's connection, as reported to [`subscribe_loop_observed`]'s
/// `on_link` (the selection service shows it in a worker's catalog record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Handshake done and subscribed.
    Connected,
    /// A connection attempt failed or an established connection broke (the reason).
    Down(String),
}

/// [`subscribe_loop`], also reporting each connect, failed attempt and lost connection
/// to `on_link`.
pub(crate) async fn subscribe_loop_observed<A, F, L>(
    endpoint: String,
    topic: Vec<u8>,
    stop: CancellationToken,
    alive: A,
    mut on_message: F,
    mut on_link: L,
) where
    A: Fn() -> bool,
    F: FnMut(Vec<Vec<u8>>) -> bool,
    L: FnMut(LinkState),
{
    let address = endpoint
        .strip_prefix("tcp://")
        .unwrap_or(&endpoint)
        .replace('*', "127.0.0.1");
    let mut backoff = Duration::from_millis(100);
    while !stop.is_cancelled() && alive() {
        let attempt = tokio::select! {
            c = connect(&address, &topic) => c,
            () = stop.cancelled() => return,
        };
        match attempt {
            Ok(mut s) => {
                backoff = Duration::from_millis(100);
                on_link(LinkState::Connected);
                match pump(&mut s, &mut on_message, &stop).await {
                    Err(e) => {
                        tracing::debug!(endpoint = %endpoint, error = %e, "engine ZMQ connection lost");
                        on_link(LinkState::Down(format!("connection lost: {e}")));
                    }
                    Ok(()) => on_link(LinkState::Down("subscriber stopped".to_owned())),
                }
            }
            Err(e) => {
                tracing::debug!(endpoint = %endpoint, error = %e, "engine ZMQ connect failed");
                on_link(LinkState::Down(format!("connect failed: {e}")));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_and_ready_layout() {
        let g = greeting();
        assert_eq!(g.len(), 64);
        assert_eq!(
            (g[0], g[9], g[10], &g[12..16]),
            (0xFF, 0x7F, 3, b"NULL".as_slice())
        );
        let r = ready_command();
        assert_eq!(r[0], FLAG_COMMAND);
        assert_eq!(usize::from(r[1]), r.len() - 2);
        assert_eq!(&r[3..8], b"READY");
        assert!(r.ends_with(b"\x00\x00\x00\x03SUB"));
        let long = short_frame(0, &[7u8; 300]);
        assert_eq!(long[0], FLAG_LONG);
        assert_eq!(u64::from_be_bytes(long[1..9].try_into().unwrap()), 300);
    }
}
