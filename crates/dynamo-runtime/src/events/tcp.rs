//! Brokerless event transport: each publisher listens on its own port; subscribers find
//! publishers in discovery and connect to each.
//!
//! Wire: a stream of frames `u32 BE length, envelope`, publisher → subscriber only. The
//! first frame is empty (length 0, "hello"): the publisher sends it once the subscriber's
//! queue is registered, so a subscriber counts a publisher as connected only when every
//! later event will reach it. The subscriber never writes; its side closing ends the
//! connection.
//!
//! Invariants:
//! * A publisher never blocks: a subscriber whose queue ([`super::PUBLISHER_QUEUE`]) is
//!   full loses the frame (counted in `dropped`, seen as a gap by the subscriber).
//! * A subscriber keeps one reader per publisher key in discovery; a reader whose
//!   connection drops reconnects until discovery withdraws the publisher, and keeps
//!   feeding the same merged queue (so gap detection spans reconnections).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::{Feed, PUBLISHER_QUEUE, channel_address, decode_envelope_bytes};
use crate::context::lock;
use crate::discovery::{KvStore, watch_prefix};
use crate::error::Result;

/// Reconnection delay after a failed dial (doubles up to [`MAX_BACKOFF`]): quick enough
/// that a publisher restarting on a new port is picked up within the discovery latency.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Upper bound of the reconnection delay.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A subscriber's receive buffer per publisher connection (grown for a larger frame).
const READ_CHUNK: usize = 64 * 1024;
/// Below this much free room the receive buffer is renewed before the next read.
const MIN_READ: usize = 4 * 1024;

/// The publishing side: a listener and one bounded queue per connected subscriber.
pub(crate) struct TcpPublisher {
    address: SocketAddr,
    subscribers: Mutex<Vec<mpsc::Sender<Bytes>>>,
    dropped: AtomicU64,
}

impl TcpPublisher {
    /// Bind an ephemeral port on `host` and accept subscribers until `cancel`.
    pub(crate) async fn bind(host: &str, cancel: CancellationToken) -> Result<Arc<Self>> {
        let listener = TcpListener::bind((host, 0)).await?;
        let p = Arc::new(Self {
            address: listener.local_addr()?,
            subscribers: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&p);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    () = cancel.cancelled() => return,
                };
                let Some(p) = weak.upgrade() else { return };
                match accepted {
                    Ok((sock, _)) => {
                        let (tx, rx) = mpsc::channel(PUBLISHER_QUEUE);
                        lock(&p.subscribers).push(tx);
                        tokio::spawn(serve_subscriber(sock, rx, cancel.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event plane: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(p)
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Queue one envelope for every subscriber.
    pub(crate) fn send(&self, envelope: Bytes) {
        let mut frame = BytesMut::with_capacity(4 + envelope.len());
        frame.put_u32(envelope.len() as u32);
        frame.put_slice(&envelope);
        let frame = frame.freeze();
        let mut subs = lock(&self.subscribers);
        subs.retain(|tx| match tx.try_send(frame.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    pub(crate) fn subscriber_count(&self) -> usize {
        let mut subs = lock(&self.subscribers);
        subs.retain(|tx| !tx.is_closed());
        subs.len()
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

async fn serve_subscriber(
    sock: TcpStream,
    mut rx: mpsc::Receiver<Bytes>,
    cancel: CancellationToken,
) {
    let _ = sock.set_nodelay(true);
    let (mut r, mut w) = sock.into_split();
    // Coalesce queued frames into one write, as the request plane does.
    const MAX_BATCH: usize = 256 * 1024;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut probe = [0u8; 1];
    if w.write_all(&0u32.to_be_bytes()).await.is_err() {
        return;
    }
    loop {
        let first = tokio::select! {
            f = rx.recv() => f,
            // The subscriber never writes: a read returning means it went away.
            _ = r.read(&mut probe) => None,
            () = cancel.cancelled() => None,
        };
        let Some(first) = first else { break };
        buf.extend_from_slice(&first);
        while buf.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(f) => buf.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() {
            break;
        }
        buf.clear();
    }
    let _ = w.shutdown().await;
}

/// Follow the publishers under `prefix` in discovery and feed their events into `feed`.
pub(crate) fn spawn_subscriber(
    store: Arc<dyn KvStore>,
    prefix: String,
    feed: Feed,
    max_message: usize,
) {
    let feed = Arc::new(feed);
    let mut publishers = watch_prefix(store, prefix);
    tokio::spawn(async move {
        // Per publisher key: its address, the reader's token (dialling, back-off) and the
        // reader task, aborted with the token (while connected the reader does not poll
        // the token, see `read_publisher`).
        let mut readers: HashMap<String, (String, CancellationToken, AbortHandle)> = HashMap::new();
        loop {
            let current = publishers.borrow_and_update().clone();
            let wanted: HashMap<&String, String> = current
                .iter()
                .filter_map(|(k, v)| channel_address(v).map(|a| (k, a)))
                .collect();
            readers.retain(|key, (addr, token, task)| {
                let keep = wanted.get(key) == Some(addr);
                if !keep {
                    token.cancel();
                    task.abort();
                }
                keep
            });
            for (key, addr) in wanted {
                if !readers.contains_key(key) {
                    let token = feed.cancel.child_token();
                    let task = tokio::spawn(read_publisher(
                        addr.clone(),
                        Arc::clone(&feed),
                        token.clone(),
                        max_message,
                    ));
                    readers.insert(key.clone(), (addr, token, task.abort_handle()));
                }
            }
            tokio::select! {
                r = publishers.changed() => if r.is_err() { break },
                () = feed.cancel.cancelled() => break,
                () = feed.tx.closed() => break,
            }
        }
        for (_, (_, token, task)) in readers {
            token.cancel();
            task.abort();
        }
    });
}

/// Marks one publisher connected while alive.
struct Connected<'a>(&'a Feed);

impl<'a> Connected<'a> {
    fn new(feed: &'a Feed) -> Self {
        feed.connected.send_modify(|c| *c += 1);
        Self(feed)
    }
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.connected.send_modify(|c| *c = c.saturating_sub(1));
    }
}

async fn read_publisher(
    address: String,
    feed: Arc<Feed>,
    cancel: CancellationToken,
    max_message: usize,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let dial = tokio::select! {
            r = tokio::time::timeout(MAX_BACKOFF, TcpStream::connect(&address)) => r,
            () = cancel.cancelled() => return,
        };
        let sock = match dial {
            Ok(Ok(s)) => s,
            _ => {
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {},
                    () = cancel.cancelled() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = MIN_BACKOFF;
        let _ = sock.set_nodelay(true);
        let mut sock = sock;
        // The hello is the first 4 bytes: read exactly those, frames follow.
        let hello = tokio::select! {
            r = tokio::time::timeout(MAX_BACKOFF, sock.read_u32()) => r,
            () = cancel.cancelled() => return,
        };
        if !matches!(hello, Ok(Ok(0))) {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {},
                () = cancel.cancelled() => return,
            }
            continue;
        }
        if cancel.is_cancelled() {
            return;
        }
        let connected = Connected::new(&feed);
        // While connected the token is not polled: `spawn_subscriber` aborts this task
        // when it cancels the token. Polling a cancellation future takes the token's lock,
        // and with a thousand publishers at a few dozen frames a second each, every frame
        // is a wake-up of its reader: racing the token cost a lock per frame (~4% of the
        // router's CPU in the storm bench).
        if !read_frames(&mut sock, &feed, &address, max_message).await {
            return;
        }
        drop(connected);
        // The publisher went away (or restarts); retry until discovery withdraws it.
        tokio::select! {
            () = tokio::time::sleep(MIN_BACKOFF) => {},
            () = cancel.cancelled() => return,
        }
    }
}

/// Forward the frames of one publisher connection into `feed` until the connection ends
/// (`true`: reconnect) or the feed's receiver is gone (`false`).
///
/// Frames are read straight into a shared receive buffer and handed on as slices of it
/// ([`Bytes`]), and a MessagePack envelope's payload is a slice of its frame: no per-frame
/// buffer, no copy of the payload between the socket and the subscriber (a chunk is
/// freed once the last frame read into it is dropped).
async fn read_frames(sock: &mut TcpStream, feed: &Feed, address: &str, max_message: usize) -> bool {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len > max_message {
                tracing::warn!(%address, len, "event plane: oversized frame; reconnecting");
                return true;
            }
            if buf.len() < 4 + len {
                // Room for the rest of this frame (a partial frame moves with it).
                buf.reserve(4 + len - buf.len());
                break;
            }
            buf.advance(4);
            if len == 0 {
                continue;
            }
            let frame = buf.split_to(len).freeze();
            match decode_envelope_bytes(&frame) {
                Ok(e) if e.topic == feed.topic => {
                    if feed.tx.send(e).await.is_err() {
                        return false;
                    }
                }
                Ok(_) => feed.stats.add_malformed(),
                Err(e) => {
                    feed.stats.add_malformed();
                    tracing::debug!(%address, error = %e, "event plane: malformed envelope");
                }
            }
        }
        if buf.capacity() - buf.len() < MIN_READ {
            buf.reserve(READ_CHUNK);
        }
        match sock.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}
