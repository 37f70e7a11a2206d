//! Frame codec (see `docs/design/request_plane.md`).
//!
//! ```text
//! u32 BE  length of everything after this field (= 9 + payload length)
//! u8      frame type
//! u64 BE  stream id (chosen by the caller, unique per connection)
//! ...     payload
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Caller → worker: open a stream. Payload: `u16 BE path_len, path, u32 BE header_len,
/// header JSON, body`.
pub const REQUEST: u8 = 1;
/// Caller → worker: one request item of a bidirectional stream.
pub const ITEM: u8 = 2;
/// Caller → worker: no more request items.
pub const INPUT_END: u8 = 3;
/// Caller → worker: stop generating (graceful).
pub const STOP: u8 = 4;
/// Caller → worker: kill (stop without draining).
pub const KILL: u8 = 5;
/// Caller → worker: `u32 BE` more items may be sent.
pub const CREDIT: u8 = 6;
/// Worker → caller: the request was accepted; a response stream follows.
pub const ACK: u8 = 16;
/// Worker → caller: one response item.
pub const DATA: u8 = 17;
/// Worker → caller: the final frame of a complete stream.
pub const END: u8 = 18;
/// Worker → caller: the stream ends with an error (JSON `WireError`).
pub const ERROR: u8 = 19;
/// Worker → caller, stream 0: keep-alive of the NATS request plane (no TCP connection
/// tells the caller the worker is gone).
pub const PING: u8 = 20;

/// Bytes between the length field and the payload.
pub const HEADER_LEN: usize = 9;

/// One decoded frame.
#[derive(Debug)]
pub struct Frame {
    /// Frame type.
    pub kind: u8,
    /// Stream id.
    pub stream: u64,
    /// Payload.
    pub payload: Bytes,
}

/// What [`read_frame`] produced.
#[derive(Debug)]
pub enum Read {
    /// A frame.
    Frame(Frame),
    /// A frame whose payload exceeded the limit; its bytes were skipped.
    TooLarge {
        /// Frame type.
        kind: u8,
        /// Stream id.
        stream: u64,
        /// Payload size.
        size: usize,
    },
    /// Clean end of the connection.
    Eof,
}

/// Encode a frame with a payload made of `parts` (concatenated).
pub fn encode(kind: u8, stream: u64, parts: &[&[u8]]) -> Bytes {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut buf = BytesMut::with_capacity(4 + HEADER_LEN + len);
    buf.put_u32((HEADER_LEN + len) as u32);
    buf.put_u8(kind);
    buf.put_u64(stream);
    for p in parts {
        buf.put_slice(p);
    }
    buf.freeze()
}

/// Append one frame with `payload` to `buf`.
pub fn encode_into(buf: &mut BytesMut, kind: u8, stream: u64, payload: &[u8]) {
    buf.reserve(4 + HEADER_LEN + payload.len());
    buf.put_u32((HEADER_LEN + payload.len()) as u32);
    buf.put_u8(kind);
    buf.put_u64(stream);
    buf.put_slice(payload);
}

/// Read one frame; payloads over `max` bytes are skipped and reported.
///
/// One allocation per frame: for a connection's stream of frames, [`FrameReader`] reads
/// them through one shared buffer instead.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Read> {
    let len = match r.read_u32().await {
        Ok(n) => n as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Read::Eof),
        Err(e) => return Err(e),
    };
    check_len(len)?;
    let kind = r.read_u8().await?;
    let stream = r.read_u64().await?;
    let size = len - HEADER_LEN;
    if size > max {
        let skipped =
            tokio::io::copy(&mut (&mut *r).take(size as u64), &mut tokio::io::sink()).await?;
        if skipped != size as u64 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(Read::TooLarge { kind, stream, size });
    }
    let mut payload = BytesMut::zeroed(size);
    r.read_exact(&mut payload).await?;
    Ok(Read::Frame(Frame {
        kind,
        stream,
        payload: payload.freeze(),
    }))
}

fn check_len(len: usize) -> std::io::Result<()> {
    if len < HEADER_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame length {len} is shorter than the frame header"),
        ));
    }
    Ok(())
}

/// Bytes a [`FrameReader`] asks the socket for at once.
const READ_CHUNK: usize = 64 * 1024;
/// Below this much free room, the next read starts a new chunk.
const MIN_READ: usize = 4 * 1024;

/// Reads a connection's frames through one receive buffer: a payload is a slice of the
/// chunk it arrived in ([`Bytes`]), so a read that brings many frames (a worker streaming
/// tokens of many requests) costs one allocation, not one per frame, and a frame is
/// parsed without a call per header field. A chunk is freed when the last payload read
/// into it is dropped; payloads are consumed as they arrive (decoded, handed to a
/// handler), so at most a few chunks are alive per connection.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max: usize,
    /// An oversized frame being skipped: its type, stream, size and bytes still to drop.
    skipping: Option<(u8, u64, usize, usize)>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Frames of `inner`; payloads over `max` bytes are skipped and reported.
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            max,
            skipping: None,
        }
    }

    /// The next frame ([`Read::Eof`] at a clean end of the connection; a connection that
    /// ends inside a frame is an `UnexpectedEof` error).
    pub async fn next(&mut self) -> std::io::Result<Read> {
        loop {
            if let Some(read) = self.parse()? {
                return Ok(read);
            }
            if self.buf.capacity() - self.buf.len() < MIN_READ {
                self.buf.reserve(READ_CHUNK);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() && self.skipping.is_none() {
                    Ok(Read::Eof)
                } else {
                    Err(std::io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    /// A frame complete in the buffer, taken out of it.
    fn parse(&mut self) -> std::io::Result<Option<Read>> {
        if let Some((kind, stream, size, left)) = self.skipping {
            let n = left.min(self.buf.len());
            self.buf.advance(n);
            if n < left {
                self.skipping = Some((kind, stream, size, left - n));
                return Ok(None);
            }
            self.skipping = None;
            return Ok(Some(Read::TooLarge { kind, stream, size }));
        }
        if self.buf.len() < 4 + HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        check_len(len)?;
        let size = len - HEADER_LEN;
        if size > self.max {
            let kind = self.buf[4];
            let stream = u64::from_be_bytes(self.buf[5..13].try_into().expect("8 bytes"));
            self.buf.advance(4 + HEADER_LEN);
            self.skipping = Some((kind, stream, size, size));
            return self.parse();
        }
        if self.buf.len() < 4 + len {
            // Room for the rest of this frame (its partial bytes move with it).
            self.buf.reserve(4 + len - self.buf.len());
            return Ok(None);
        }
        let kind = self.buf[4];
        let stream = u64::from_be_bytes(self.buf[5..13].try_into().expect("8 bytes"));
        self.buf.advance(4 + HEADER_LEN);
        let payload = self.buf.split_to(size).freeze();
        Ok(Some(Read::Frame(Frame {
            kind,
            stream,
            payload,
        })))
    }
}

/// Split a request payload into `(path, header JSON, body)`.
pub fn split_request(p: &Bytes) -> Option<(String, Bytes, Bytes)> {
    let plen = usize::from(u16::from_be_bytes(p.get(0..2)?.try_into().ok()?));
    let path = std::str::from_utf8(p.get(2..2 + plen)?).ok()?.to_owned();
    let at = 2 + plen;
    let hlen = u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?) as usize;
    let hstart = at + 4;
    if p.len() < hstart + hlen {
        return None;
    }
    Some((
        path,
        p.slice(hstart..hstart + hlen),
        p.slice(hstart + hlen..),
    ))
}

/// Build a request payload prefix (`path` and `header`); the body follows.
pub fn request_prefix(path: &str, header: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(6 + path.len() + header.len());
    v.extend_from_slice(&(path.len() as u16).to_be_bytes());
    v.extend_from_slice(path.as_bytes());
    v.extend_from_slice(&(header.len() as u32).to_be_bytes());
    v.extend_from_slice(header);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_skipped() {
        let mut wire = Vec::new();
        let prefix = request_prefix("ns/c/e", br#"{"id":"x"}"#);
        wire.extend_from_slice(&encode(REQUEST, 7, &[&prefix, b"body"]));
        wire.extend_from_slice(&encode(DATA, 8, &[&[0u8; 100]]));
        wire.extend_from_slice(&encode(END, 9, &[]));
        let mut r = &wire[..];
        let Read::Frame(f) = read_frame(&mut r, 64).await.unwrap() else {
            panic!("expected a frame")
        };
        assert_eq!((f.kind, f.stream), (REQUEST, 7));
        let (path, header, body) = split_request(&f.payload).unwrap();
        assert_eq!(path, "ns/c/e");
        assert_eq!(&header[..], br#"{"id":"x"}"#);
        assert_eq!(&body[..], b"body");
        match read_frame(&mut r, 64).await.unwrap() {
            Read::TooLarge { kind, stream, size } => {
                assert_eq!((kind, stream, size), (DATA, 8, 100))
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            read_frame(&mut r, 64).await.unwrap(),
            Read::Frame(Frame {
                kind: END,
                stream: 9,
                ..
            })
        ));
        assert!(matches!(read_frame(&mut r, 64).await.unwrap(), Read::Eof));
    }

    /// Hands out at most `step` bytes per read, so frames straddle reads.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self
                .step
                .min(self.data.len() - self.at)
                .min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// Frames sent: type, stream, payload.
    type Sent = Vec<(u8, u64, Vec<u8>)>;

    fn sample_wire() -> (Vec<u8>, Sent) {
        let mut wire = Vec::new();
        let mut sent = Vec::new();
        for i in 0..200u64 {
            // Sizes from empty to several read chunks, one oversized every 50 frames.
            let size = match i % 50 {
                49 => 3000,
                n if n % 7 == 0 => (n as usize) * 1500,
                n => n as usize,
            };
            let payload: Vec<u8> = (0..size).map(|b| (b as u64 ^ i) as u8).collect();
            let kind = (i % 5) as u8 + 1;
            wire.extend_from_slice(&encode(kind, i, &[&payload]));
            sent.push((kind, i, payload));
        }
        (wire, sent)
    }

    #[tokio::test]
    async fn frame_reader_matches_read_frame_whatever_the_read_sizes() {
        let (wire, sent) = sample_wire();
        for step in [1, 3, 13, 4096, 100_000, usize::MAX] {
            let mut reader = FrameReader::new(
                Trickle {
                    data: wire.clone(),
                    at: 0,
                    step,
                },
                2999,
            );
            let mut plain = &wire[..];
            for (kind, stream, payload) in &sent {
                let got = reader.next().await.unwrap();
                let want = read_frame(&mut plain, 2999).await.unwrap();
                match (got, want) {
                    (Read::Frame(g), Read::Frame(w)) => {
                        assert_eq!((g.kind, g.stream), (*kind, *stream), "step {step}");
                        assert_eq!(&g.payload[..], &payload[..], "step {step}");
                        assert_eq!(g.payload, w.payload);
                    }
                    (
                        Read::TooLarge {
                            kind: k,
                            stream: s,
                            size,
                        },
                        Read::TooLarge { .. },
                    ) => {
                        assert_eq!((k, s, size), (*kind, *stream, payload.len()));
                    }
                    (g, w) => panic!("step {step}: {g:?} against {w:?}"),
                }
            }
            assert!(matches!(reader.next().await.unwrap(), Read::Eof));
        }
    }

    #[tokio::test]
    async fn frame_reader_reports_truncation_and_short_lengths() {
        let whole = encode(DATA, 1, &[b"payload"]);
        for cut in 1..whole.len() {
            let mut reader = FrameReader::new(&whole[..cut], usize::MAX);
            let err = reader.next().await.unwrap_err();
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::UnexpectedEof,
                "cut at {cut}"
            );
        }
        // An oversized frame cut short is an error too, not a skipped frame.
        let mut reader = FrameReader::new(&whole[..whole.len() - 1], 2);
        assert!(reader.next().await.is_err());
        let mut short = 3u32.to_be_bytes().to_vec();
        short.extend_from_slice(&[0; 16]);
        let err = FrameReader::new(&short[..], usize::MAX)
            .next()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn malformed_request_payloads_are_rejected() {
        assert!(split_request(&Bytes::from_static(b"\x00")).is_none());
        assert!(split_request(&Bytes::from_static(b"\x00\x05ab")).is_none());
    }
}
