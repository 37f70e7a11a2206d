//! A minimal ZMQ (ZMTP 3.0, NULL security) client and the relay built on it.
//!
//! * [`SubConnection`]: a SUB socket's connection to an engine's PUB socket (vLLM / SGLang
//!   KV events, decoded by `dynamo_kv_router::engine_events`); [`subscribe_loop`] and
//!   [`subscribe_loop_observed`] re-dial it (100 ms, backing off to 2 s) and hand every
//!   message to a callback; [`relay`] republishes the KV events through a
//!   [`KvEventPublisher`].
//! * [`request_replay`]: a DEALER request to an engine's replay (ROUTER) socket, vLLM's
//!   protocol: the request is `["", start_seq]` (8-byte big-endian), each answer
//!   `["", (topic,) seq, payload]` for the buffered messages from `start_seq` on, then the
//!   sentinel `seq = -1` with an empty payload.
//! * The framing and handshake helpers are shared with the server side
//!   (`super::zmq_pub`: PUB and ROUTER sockets).
//!
//! Only what these sockets need is implemented: the greeting, the NULL handshake (`READY`
//! with `Socket-Type`), subscriptions as messages (ZMTP 3.0; `SUBSCRIBE` commands of 3.1
//! peers are understood by the server) and multipart messages (other commands, such as
//! heartbeats, are skipped). Written here rather than pulling a ZMQ crate: a few hundred
//! lines against a dependency tree of async runtimes and codecs. Engine messages sent while
//! a SUB connection is down are lost (PUB semantics): the selection listener repairs such
//! gaps through the replay socket, routers through the worker-local indexer.

use std::sync::Weak;
use std::time::Duration;

use dynamo_kv_router::engine_events::decode_engine_batch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::KvEventPublisher;

/// Largest frame accepted from a peer.
pub(crate) const MAX_FRAME: u64 = 64 * 1024 * 1024;
/// Most frames in one message.
const MAX_PARTS: usize = 16;
pub(crate) const FLAG_MORE: u8 = 0x01;
pub(crate) const FLAG_LONG: u8 = 0x02;
pub(crate) const FLAG_COMMAND: u8 = 0x04;

pub(crate) fn io_err(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// The 64-byte ZMTP 3.0 greeting of a NULL-mechanism peer (client or server: `as-server`
/// is 0 for NULL).
pub(crate) fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3; // major
    g[11] = 0; // minor: 3.0 subscriptions are messages, accepted by 3.1 peers too
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Append one frame to `out`.
pub(crate) fn put_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

fn short_frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(body.len() + 9);
    put_frame(&mut f, flags, body);
    f
}

/// A multipart message as wire bytes.
pub(crate) fn encode_message<B: AsRef<[u8]>>(parts: &[B]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.as_ref().len() + 9).sum();
    let mut out = Vec::with_capacity(len);
    for (i, p) in parts.iter().enumerate() {
        let more = if i + 1 < parts.len() { FLAG_MORE } else { 0 };
        put_frame(&mut out, more, p.as_ref());
    }
    out
}

/// The `READY` command announcing `socket_type` (`SUB`, `PUB`, `DEALER`, `ROUTER`).
pub(crate) fn ready_command(socket_type: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(5);
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    short_frame(FLAG_COMMAND, &body)
}

/// Read one frame: `(flags, body)`.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(s: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
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

/// Read one multipart message, skipping commands other than those `on_command` wants
/// (it gets each command's body; a subscription command is a SUBSCRIBE / CANCEL).
pub(crate) async fn read_message<R: AsyncRead + Unpin>(
    s: &mut R,
    mut on_command: impl FnMut(&[u8]),
) -> std::io::Result<Vec<Vec<u8>>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    loop {
        let (flags, body) = read_frame(s).await?;
        if flags & FLAG_COMMAND != 0 {
            on_command(&body);
            continue;
        }
        parts.push(body);
        if flags & FLAG_MORE == 0 {
            return Ok(parts);
        }
        if parts.len() >= MAX_PARTS {
            return Err(io_err("too many message parts"));
        }
    }
}

/// Exchange greetings and `READY` commands on a fresh connection (either side), as a
/// `socket_type` socket.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    socket_type: &str,
) -> std::io::Result<()> {
    s.write_all(&greeting()).await?;
    let mut peer = [0u8; 64];
    s.read_exact(&mut peer).await?;
    if peer[0] != 0xFF || peer[9] != 0x7F || peer[10] < 3 {
        return Err(io_err("not a ZMTP 3 peer"));
    }
    if &peer[12..16] != b"NULL" {
        return Err(io_err("the peer requires a security mechanism"));
    }
    s.write_all(&ready_command(socket_type)).await?;
    let (flags, body) = read_frame(s).await?;
    if flags & FLAG_COMMAND == 0 || body.get(1..6) != Some(b"READY".as_slice()) {
        return Err(io_err("expected READY from the peer"));
    }
    Ok(())
}

/// `tcp://host:port` (`*` meaning loopback) as a socket address to dial.
pub fn dial_address(endpoint: &str) -> String {
    endpoint
        .strip_prefix("tcp://")
        .unwrap_or(endpoint)
        .replace('*', "127.0.0.1")
}

/// Read buffer of a SUB connection (grown for a larger message).
const SUB_BUFFER: usize = 256 * 1024;

/// A SUB socket's connection to one PUB socket.
///
/// Bytes are read into one buffer and messages are parsed in place, so a subscriber can
/// take every message that has already arrived in one go ([`Self::fill`], then
/// [`Self::next_buffered`] until `None`) without copying frames.
pub struct SubConnection {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Start of the unparsed bytes in `buf`.
    start: usize,
    /// Frame ranges of the message last returned by `next_buffered`.
    parts: Vec<(usize, usize)>,
}

/// Where the next frame in `bytes` lies: `(flags, body start, body end)`, or `None` when
/// it has not fully arrived.
fn frame_at(bytes: &[u8], at: usize) -> std::io::Result<Option<(u8, usize, usize)>> {
    let Some(&flags) = bytes.get(at) else {
        return Ok(None);
    };
    let (size, header) = if flags & FLAG_LONG != 0 {
        let Some(len) = bytes.get(at + 1..at + 9) else {
            return Ok(None);
        };
        let mut be = [0u8; 8];
        be.copy_from_slice(len);
        (u64::from_be_bytes(be), 9)
    } else {
        let Some(&len) = bytes.get(at + 1) else {
            return Ok(None);
        };
        (u64::from(len), 2)
    };
    if size > MAX_FRAME {
        return Err(io_err(format!("frame of {size} bytes exceeds the limit")));
    }
    let body = at + header;
    let end = body + size as usize;
    Ok((end <= bytes.len()).then_some((flags, body, end)))
}

/// The frames of one message, borrowed from a [`SubConnection`]'s buffer.
pub struct Frames<'a> {
    buf: &'a [u8],
    parts: &'a [(usize, usize)],
}

impl<'a> Frames<'a> {
    /// Number of frames (at least one).
    #[expect(
        clippy::len_without_is_empty,
        reason = "a parsed message always has a frame: is_empty would always be false"
    )]
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Frame `i`.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let &(b, e) = self.parts.get(i)?;
        Some(&self.buf[b..e])
    }

    /// The last frame (the payload of an engine message).
    pub fn last(&self) -> Option<&'a [u8]> {
        self.get(self.parts.len().checked_sub(1)?)
    }

    /// Every frame, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let buf = self.buf;
        self.parts.iter().map(move |&(b, e)| &buf[b..e])
    }
}

impl SubConnection {
    /// Connect to `address` (`host:port`), handshake and subscribe to `topic`.
    pub async fn connect(address: &str, topic: &[u8]) -> std::io::Result<Self> {
        let mut s = TcpStream::connect(address).await?;
        s.set_nodelay(true)?;
        handshake(&mut s, "SUB").await?;
        let mut sub = Vec::with_capacity(topic.len() + 1);
        sub.push(1);
        sub.extend_from_slice(topic);
        s.write_all(&short_frame(0, &sub)).await?;
        Ok(Self {
            stream: s,
            buf: Vec::with_capacity(SUB_BUFFER),
            start: 0,
            parts: Vec::with_capacity(4),
        })
    }

    /// Wait for more bytes from the publisher (at least one).
    ///
    /// # Errors
    /// The connection broke or the publisher closed it.
    pub async fn fill(&mut self) -> std::io::Result<()> {
        if self.start > 0 {
            // Keep only the unparsed tail (a partial message), at the front.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.is_empty() && self.buf.capacity() > 4 * SUB_BUFFER {
            // A large message has gone: give its memory back.
            self.buf.shrink_to(SUB_BUFFER);
        }
        if self.buf.capacity() - self.buf.len() < SUB_BUFFER / 4 {
            self.buf.reserve(SUB_BUFFER);
        }
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the publisher closed the connection",
            ));
        }
        Ok(())
    }

    /// The next message that has fully arrived, its frames borrowed from the buffer
    /// (commands such as heartbeats are skipped); `None` until [`Self::fill`] brings more.
    ///
    /// # Errors
    /// A frame over the size limit or a message with too many parts (the connection
    /// cannot be read further).
    pub fn next_buffered(&mut self) -> std::io::Result<Option<Frames<'_>>> {
        let mut at = self.start;
        self.parts.clear();
        loop {
            let Some((flags, body, end)) = frame_at(&self.buf, at)? else {
                return Ok(None);
            };
            at = end;
            if flags & FLAG_COMMAND != 0 {
                if self.parts.is_empty() {
                    // Commands between messages are consumed with them.
                    self.start = at;
                }
                continue;
            }
            self.parts.push((body, end));
            if flags & FLAG_MORE == 0 {
                break;
            }
            if self.parts.len() >= MAX_PARTS {
                return Err(io_err("too many message parts"));
            }
        }
        self.start = at;
        Ok(Some(Frames {
            buf: &self.buf,
            parts: &self.parts,
        }))
    }

    /// The next message (commands such as heartbeats are skipped).
    pub async fn recv(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        loop {
            if let Some(m) = self.next_buffered()? {
                return Ok(m.iter().map(<[u8]>::to_vec).collect());
            }
            self.fill().await?;
        }
    }
}

/// Read messages until the connection breaks, `stop` fires or `on_message` returns false.
async fn pump<F: FnMut(Vec<Vec<u8>>) -> bool>(
    s: &mut SubConnection,
    on_message: &mut F,
    stop: &CancellationToken,
) -> std::io::Result<()> {
    loop {
        let message = tokio::select! {
            m = s.recv() => m?,
            () = stop.cancelled() => return Ok(()),
        };
        if !on_message(message) {
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
pub enum LinkState {
    /// Handshake done and subscribed.
    Connected,
    /// A connection attempt failed or an established connection broke (the reason).
    Down(String),
}

/// The re-dial delays of a subscriber: 100 ms, doubling up to 2 s, reset on success.
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// The first delay (100 ms).
    pub fn new() -> Self {
        Self(Duration::from_millis(100))
    }

    /// Back to the first delay, after a successful connection.
    pub fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }

    /// Sleep for the current delay (false when `stop` fired meanwhile) and double it.
    pub async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = stop.cancelled() => false,
        }
    }
}

/// [`subscribe_loop`], also reporting each connect, failed attempt and lost connection
/// to `on_link`.
pub async fn subscribe_loop_observed<A, F, L>(
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
    let address = dial_address(&endpoint);
    let mut backoff = Backoff::new();
    while !stop.is_cancelled() && alive() {
        let attempt = tokio::select! {
            c = SubConnection::connect(&address, &topic) => c,
            () = stop.cancelled() => return,
        };
        match attempt {
            Ok(mut s) => {
                backoff.reset();
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
        if !backoff.wait(&stop).await {
            return;
        }
    }
}

/// The sequence number that ends a replay answer (-1 as a signed 64-bit integer).
pub(crate) const REPLAY_END: u64 = u64::MAX;

/// Most messages accepted in one replay answer.
pub(crate) const MAX_REPLAY_MESSAGES: usize = 1_000_000;

/// Ask the replay (ROUTER) socket at `address` (`host:port`) for the buffered messages
/// from `start_seq` on: `(seq, payload)` in the order sent, up to the end sentinel. The
/// answer may start after `start_seq` (the buffer no longer holds it) or be empty.
///
/// # Errors
/// Connection failures, a malformed answer, or no end sentinel within `timeout`.
pub async fn request_replay(
    address: &str,
    start_seq: u64,
    timeout: Duration,
) -> std::io::Result<Vec<(u64, Vec<u8>)>> {
    let work = async {
        let mut s = TcpStream::connect(address).await?;
        s.set_nodelay(true)?;
        handshake(&mut s, "DEALER").await?;
        s.write_all(&encode_message(&[&[][..], &start_seq.to_be_bytes()[..]]))
            .await?;
        let mut s = BufReader::with_capacity(256 * 1024, s);
        let mut out = Vec::new();
        loop {
            let mut parts = read_message(&mut s, |_| {}).await?;
            if parts.len() < 2 {
                return Err(io_err("replay answer has fewer than 2 frames"));
            }
            let payload = parts.pop().unwrap_or_default();
            let seq_frame = parts.pop().unwrap_or_default();
            let seq = u64::from_be_bytes(
                seq_frame
                    .as_slice()
                    .try_into()
                    .map_err(|_| io_err("replay sequence frame is not 8 bytes"))?,
            );
            if seq == REPLAY_END {
                return Ok(out);
            }
            if out.len() >= MAX_REPLAY_MESSAGES {
                return Err(io_err("replay answer too long"));
            }
            out.push((seq, payload));
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "replay timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages split across reads at every kind of boundary, a command between messages
    /// and a frame larger than the read buffer all come out whole and in order.
    #[tokio::test]
    async fn buffered_reader_reassembles_messages() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let big = vec![7u8; SUB_BUFFER + 12_345];
        let mut expected: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut wire = Vec::new();
        for i in 0..200u32 {
            let parts = vec![
                b"".to_vec(),
                u64::from(i).to_be_bytes().to_vec(),
                vec![i as u8; (i as usize * 7) % 400],
            ];
            wire.extend_from_slice(&encode_message(&parts));
            expected.push(parts);
            if i == 50 {
                wire.extend_from_slice(&short_frame(FLAG_COMMAND, b"\x04PING"));
            }
            if i == 120 {
                let parts = vec![b"t".to_vec(), big.clone()];
                wire.extend_from_slice(&encode_message(&parts));
                expected.push(parts);
            }
        }
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            handshake(&mut s, "PUB").await.unwrap();
            let _subscription = read_frame(&mut s).await.unwrap();
            // Odd-sized writes, flushed one by one: frames split everywhere.
            for chunk in wire.chunks(997) {
                s.write_all(chunk).await.unwrap();
                s.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            s
        });
        let mut sub = SubConnection::connect(&address, b"").await.unwrap();
        for want in &expected {
            assert_eq!(&sub.recv().await.unwrap(), want);
        }
        let s = server.await.unwrap();
        drop(s);
        assert!(
            sub.recv().await.is_err(),
            "a closed publisher ends the connection"
        );
    }

    #[test]
    fn greeting_and_ready_layout() {
        let g = greeting();
        assert_eq!(g.len(), 64);
        assert_eq!(
            (g[0], g[9], g[10], &g[12..16]),
            (0xFF, 0x7F, 3, b"NULL".as_slice())
        );
        let r = ready_command("SUB");
        assert_eq!(r[0], FLAG_COMMAND);
        assert_eq!(usize::from(r[1]), r.len() - 2);
        assert_eq!(&r[3..8], b"READY");
        assert!(r.ends_with(b"\x00\x00\x00\x03SUB"));
        let long = short_frame(0, &[7u8; 300]);
        assert_eq!(long[0], FLAG_LONG);
        assert_eq!(u64::from_be_bytes(long[1..9].try_into().unwrap()), 300);
        let m = encode_message(&[b"a".as_slice(), b"bc".as_slice()]);
        assert_eq!(m, [FLAG_MORE, 1, b'a', 0, 2, b'b', b'c']);
    }
}
