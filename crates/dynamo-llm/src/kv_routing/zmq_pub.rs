//! The server side of the project's minimal ZMQ (ZMTP 3.0, NULL security): a PUB socket
//! and an engine-style KV-event publisher with a replay (ROUTER) socket, written on the
//! framing and handshake helpers of [`super::zmq`].
//!
//! * [`PubSocket`] binds a TCP port, accepts SUB peers (libzmq / pyzmq or this project's
//!   [`super::zmq::SubConnection`]), tracks each peer's subscriptions (messages `\x01topic`
//!   / `\x00topic`, or 3.1 `SUBSCRIBE` / `CANCEL` commands) and sends each message to the
//!   peers whose subscription is a prefix of its first frame. A peer that falls more than
//!   [`SEND_HWM`] messages behind loses messages (PUB semantics, libzmq's high-water mark).
//! * [`EnginePublisher`] numbers messages like a vLLM engine — `[topic, seq (8-byte
//!   big-endian, from 0), payload]` — and, with a replay port, keeps the last
//!   `buffer` payloads in a ring served on a ROUTER socket with vLLM's replay protocol:
//!   a request `["", start_seq]` from a DEALER (or REQ) peer is answered with
//!   `["", topic, seq, payload]` for every buffered message with `seq >= start_seq`, then
//!   `["", topic, -1 (8 bytes), ""]`. There is no separate "too old" marker (as in vLLM and
//!   the reference's mocker): when the buffer no longer holds `start_seq` the answer starts
//!   later (or is empty), which the requester sees.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::zmq::{REPLAY_END, encode_message, handshake, read_message};

/// Messages queued per subscriber before new ones are dropped for it.
pub const SEND_HWM: usize = 100_000;

/// Default number of messages kept for replay (vLLM's `buffer_steps`).
pub const DEFAULT_REPLAY_BUFFER: usize = 10_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Bind `host:port` (port 0: any free port) for a tokio listener.
fn bind(host: &str, port: u16) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind((host, port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Accept connections on `listener` (on `handle`) until `stop` fires, serving each with
/// the task `serve(stream, stop)`.
fn accept_loop<F, Fut>(
    handle: &tokio::runtime::Handle,
    listener: std::net::TcpListener,
    stop: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    handle.spawn(async move {
        let Ok(listener) = TcpListener::from_std(listener) else {
            return;
        };
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                () = stop.cancelled() => return,
            };
            if let Ok((stream, _)) = conn {
                tokio::spawn(serve(stream, stop.clone()));
            }
        }
    });
}

struct Peer {
    subscriptions: Arc<Mutex<Vec<Vec<u8>>>>,
    tx: mpsc::Sender<Arc<[u8]>>,
}

/// A ZMQ PUB socket (see the module docs). Dropping it (or [`PubSocket::close`]) closes
/// the listener and every connection.
pub struct PubSocket {
    address: SocketAddr,
    peers: Arc<Mutex<Vec<Peer>>>,
    stop: CancellationToken,
}

impl PubSocket {
    /// Bind `host:port` (0: a free port) and accept subscribers on `handle`.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub fn bind(handle: &tokio::runtime::Handle, host: &str, port: u16) -> std::io::Result<Self> {
        let std_listener = bind(host, port)?;
        let address = std_listener.local_addr()?;
        let peers: Arc<Mutex<Vec<Peer>>> = Arc::default();
        let stop = CancellationToken::new();
        let p = peers.clone();
        accept_loop(handle, std_listener, stop.clone(), move |stream, s| {
            serve_subscriber(stream, p.clone(), s)
        });
        Ok(Self {
            address,
            peers,
            stop,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Send one multipart message to every subscriber whose subscription matches its
    /// first frame. Never blocks.
    pub fn send<B: AsRef<[u8]>>(&self, parts: &[B]) {
        let topic = parts.first().map_or(&[][..], |p| p.as_ref());
        let mut peers = lock(&self.peers);
        if peers.is_empty() {
            return;
        }
        let wire: Arc<[u8]> = encode_message(parts).into();
        peers.retain(|p| {
            if p.tx.is_closed() {
                return false;
            }
            let wanted = lock(&p.subscriptions).iter().any(|s| topic.starts_with(s));
            if wanted {
                // Full: this subscriber is too slow and loses the message (PUB's HWM).
                let _ = p.tx.try_send(wire.clone());
            }
            true
        });
    }

    /// Close the listener and all connections.
    pub fn close(&self) {
        self.stop.cancel();
    }
}

impl Drop for PubSocket {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Apply a subscription message body (`\x01topic` / `\x00topic`) or a 3.1 command body
/// (`\x09SUBSCRIBE topic` / `\x06CANCEL topic`).
fn apply_subscription(subs: &Mutex<Vec<Vec<u8>>>, add: bool, topic: &[u8]) {
    let mut subs = lock(subs);
    if add {
        subs.push(topic.to_vec());
    } else if let Some(i) = subs.iter().position(|s| s == topic) {
        subs.swap_remove(i);
    }
}

fn apply_subscription_command(subs: &Mutex<Vec<Vec<u8>>>, body: &[u8]) {
    if let Some(topic) = body.strip_prefix(b"\x09SUBSCRIBE") {
        apply_subscription(subs, true, topic);
    } else if let Some(topic) = body.strip_prefix(b"\x06CANCEL") {
        apply_subscription(subs, false, topic);
    }
}

/// Read a subscriber's subscriptions until it goes away.
async fn read_subscriptions<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    subs: &Mutex<Vec<Vec<u8>>>,
) -> std::io::Result<()> {
    loop {
        let message = read_message(reader, |cmd| apply_subscription_command(subs, cmd)).await?;
        if let Some(body) = message.first()
            && message.len() == 1
            && let Some((&kind, topic)) = body.split_first()
            && kind <= 1
        {
            apply_subscription(subs, kind == 1, topic);
        }
    }
}

async fn serve_subscriber(
    mut stream: TcpStream,
    peers: Arc<Mutex<Vec<Peer>>>,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let ok = tokio::select! {
        r = handshake(&mut stream, "PUB") => r.is_ok(),
        () = stop.cancelled() => false,
    };
    if !ok {
        return;
    }
    let subscriptions: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let (tx, mut rx) = mpsc::channel::<Arc<[u8]>>(SEND_HWM);
    lock(&peers).push(Peer {
        subscriptions: subscriptions.clone(),
        tx,
    });
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    let reading = read_subscriptions(&mut reader, &subscriptions);
    // Writes queued messages, coalescing what is already queued into one write.
    let writing = async move {
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        while let Some(first) = rx.recv().await {
            buf.clear();
            buf.extend_from_slice(&first);
            while buf.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok(more) => buf.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            write_half.write_all(&buf).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        _ = reading => {}
        _ = writing => {}
        () = stop.cancelled() => {}
    }
}

/// The replay ring: the last `capacity` `(seq, payload)` pairs, contiguous in `seq`.
struct Ring {
    capacity: usize,
    items: VecDeque<(u64, Arc<[u8]>)>,
}

impl Ring {
    fn push(&mut self, seq: u64, payload: Arc<[u8]>) {
        if self.items.len() >= self.capacity {
            self.items.pop_front();
        }
        self.items.push_back((seq, payload));
    }

    /// The buffered entries with `seq >= start`.
    fn from(&self, start: u64) -> Vec<(u64, Arc<[u8]>)> {
        let Some(&(first, _)) = self.items.front() else {
            return Vec::new();
        };
        let skip = usize::try_from(start.saturating_sub(first)).unwrap_or(usize::MAX);
        self.items.iter().skip(skip).cloned().collect()
    }
}

struct Numbered {
    next_seq: u64,
}

/// An engine-style KV-event publisher: a PUB socket sending `[topic, seq, payload]` and an
/// optional replay ROUTER socket (see the module docs).
pub struct EnginePublisher {
    topic: Vec<u8>,
    pub_socket: PubSocket,
    state: Mutex<Numbered>,
    ring: Option<Arc<Mutex<Ring>>>,
    replay_address: Option<SocketAddr>,
    stop: CancellationToken,
}

impl EnginePublisher {
    /// Bind the PUB socket on `host:port` and, with `replay_port`, the replay socket on
    /// `host:replay_port` keeping the last `replay_buffer` messages (0: a free port, for
    /// either). Sockets are served on `handle`.
    ///
    /// # Errors
    /// A port cannot be bound (the message names which).
    pub fn bind(
        handle: &tokio::runtime::Handle,
        host: &str,
        port: u16,
        replay_port: Option<u16>,
        replay_buffer: usize,
        topic: &[u8],
    ) -> std::io::Result<Self> {
        // The PUB socket first: on a replay bind error, dropping it closes it.
        let pub_socket = PubSocket::bind(handle, host, port).map_err(|e| {
            std::io::Error::new(e.kind(), format!("ZMQ PUB bind to {host}:{port}: {e}"))
        })?;
        let stop = CancellationToken::new();
        let (ring, replay_address) = match replay_port {
            Some(rp) => {
                let std_listener = bind(host, rp).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("ZMQ replay bind to {host}:{rp}: {e}"))
                })?;
                let address = std_listener.local_addr()?;
                let ring = Arc::new(Mutex::new(Ring {
                    capacity: replay_buffer.max(1),
                    items: VecDeque::new(),
                }));
                let (r, t) = (ring.clone(), topic.to_vec());
                accept_loop(handle, std_listener, stop.clone(), move |stream, s| {
                    serve_replay(stream, r.clone(), t.clone(), s)
                });
                (Some(ring), Some(address))
            }
            None => (None, None),
        };
        Ok(Self {
            topic: topic.to_vec(),
            pub_socket,
            state: Mutex::new(Numbered { next_seq: 0 }),
            ring,
            replay_address,
            stop,
        })
    }

    /// The PUB socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.pub_socket.local_addr()
    }

    /// The replay socket's address, when there is one.
    pub fn replay_addr(&self) -> Option<SocketAddr> {
        self.replay_address
    }

    /// Number, buffer and send one payload; returns its sequence number.
    pub fn publish(&self, payload: Vec<u8>) -> u64 {
        let mut st = lock(&self.state);
        let seq = st.next_seq;
        st.next_seq += 1;
        let payload: Arc<[u8]> = payload.into();
        if let Some(ring) = &self.ring {
            lock(ring).push(seq, payload.clone());
        }
        self.pub_socket
            .send(&[&self.topic[..], &seq.to_be_bytes()[..], &payload[..]]);
        seq
    }

    /// Number and buffer a payload without sending it (tests: a message lost on PUB).
    pub fn skip(&self, payload: Vec<u8>) -> u64 {
        let mut st = lock(&self.state);
        let seq = st.next_seq;
        st.next_seq += 1;
        if let Some(ring) = &self.ring {
            lock(ring).push(seq, payload.into());
        }
        seq
    }

    /// Close every socket.
    pub fn close(&self) {
        self.stop.cancel();
        self.pub_socket.close();
    }
}

impl Drop for EnginePublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// Answer replay requests on one connection until it closes.
async fn answer_replays(
    stream: &mut TcpStream,
    ring: &Mutex<Ring>,
    topic: &[u8],
) -> std::io::Result<()> {
    handshake(stream, "ROUTER").await?;
    let (read_half, mut write_half) = stream.split();
    let mut reader = BufReader::new(read_half);
    loop {
        let request = read_message(&mut reader, |_| {}).await?;
        // `["", start_seq]` from a DEALER or REQ peer: the sequence is last.
        let Some(start) = request
            .last()
            .and_then(|f| <[u8; 8]>::try_from(f.as_slice()).ok())
            .map(u64::from_be_bytes)
        else {
            tracing::debug!(frames = request.len(), "malformed replay request ignored");
            continue;
        };
        let entries = lock(ring).from(start);
        let mut out = Vec::new();
        for (seq, payload) in &entries {
            out.extend_from_slice(&encode_message(&[
                &[][..],
                topic,
                &seq.to_be_bytes()[..],
                &payload[..],
            ]));
            if out.len() >= 256 * 1024 {
                write_half.write_all(&out).await?;
                out.clear();
            }
        }
        out.extend_from_slice(&encode_message(&[
            &[][..],
            topic,
            &REPLAY_END.to_be_bytes()[..],
            &[][..],
        ]));
        write_half.write_all(&out).await?;
    }
}

async fn serve_replay(
    mut stream: TcpStream,
    ring: Arc<Mutex<Ring>>,
    topic: Vec<u8>,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let work = answer_replays(&mut stream, &ring, &topic);
    tokio::select! {
        _ = work => {}
        () = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::zmq::{SubConnection, request_replay};
    use super::*;

    #[tokio::test]
    async fn publishes_numbered_messages_and_replays_the_ring() {
        let handle = tokio::runtime::Handle::current();
        let p = EnginePublisher::bind(&handle, "127.0.0.1", 0, Some(0), 3, b"").unwrap();
        let address = p.local_addr().to_string();
        let mut sub = SubConnection::connect(&address, b"").await.unwrap();
        // The subscription reaches the publisher asynchronously: publish until it arrives.
        let first = loop {
            p.publish(b"hello".to_vec());
            match tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
                Ok(m) => break m.unwrap(),
                Err(_) => continue,
            }
        };
        assert_eq!(first.len(), 3);
        assert_eq!(first[2], b"hello");
        let seq0 = u64::from_be_bytes(first[1].as_slice().try_into().unwrap());
        let skipped = p.skip(b"lost".to_vec());
        let last = p.publish(b"after".to_vec());
        let next = sub.recv().await.unwrap();
        assert_eq!(
            u64::from_be_bytes(next[1].as_slice().try_into().unwrap()),
            last
        );
        assert!(last > seq0);
        let replay = p.replay_addr().unwrap().to_string();
        let got = request_replay(&replay, skipped, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            got,
            vec![(skipped, b"lost".to_vec()), (last, b"after".to_vec())]
        );
        // The ring keeps 3 messages: an old start is answered from the oldest kept one.
        let got = request_replay(&replay, 0, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, last - 2);
        // Beyond the newest: empty.
        let got = request_replay(&replay, last + 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn topic_prefixes_filter_messages() {
        let handle = tokio::runtime::Handle::current();
        let s = PubSocket::bind(&handle, "127.0.0.1", 0).unwrap();
        let address = s.local_addr().to_string();
        let mut sub = SubConnection::connect(&address, b"kv").await.unwrap();
        loop {
            s.send(&[b"other".as_slice(), b"x".as_slice()]);
            s.send(&[b"kv-events".as_slice(), b"y".as_slice()]);
            if let Ok(m) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
                assert_eq!(m.unwrap(), vec![b"kv-events".to_vec(), b"y".to_vec()]);
                break;
            }
        }
    }
}
