//! Frame codec (see `docs/request_plane.md`).
//!
//! ```text
//! u32 BE  length of everything after this field (= 9 + payload length)
//! u8      frame type
//! u64 BE  stream id (chosen by the caller, unique per connection)
//! ...     payload
//! ```

use bytes::{BufMut, Bytes, BytesMut};
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
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Read> {
    let len = match r.read_u32().await {
        Ok(n) => n as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Read::Eof),
        Err(e) => return Err(e),
    };
    if len < HEADER_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame length {len} is shorter than the frame header"),
        ));
    }
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

    #[test]
    fn malformed_request_payloads_are_rejected() {
        assert!(split_request(&Bytes::from_static(b"\x00")).is_none());
        assert!(split_request(&Bytes::from_static(b"\x00\x05ab")).is_none());
    }
}
