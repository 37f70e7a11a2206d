//! The request plane's payload codec: MessagePack, as the reference's request plane
//! (its instances advertise `request_plane_codec: "msgpack"`).
//!
//! Request bodies (`REQUEST` and `ITEM` payloads after the header) and response envelopes
//! (`DATA` payloads: a map `{"data": item, "id"?, "event"?, "comment"?}`) are MessagePack.
//! Structs travel as maps keyed by field name ([`rmp_serde::to_vec_named`]), so a Rust
//! struct and a Python dict with the same keys are the same bytes, and `bytes` values travel
//! as MessagePack `bin`. The request header and error frames stay JSON: they are produced
//! and read by the runtime only, never by handlers.
//!
//! Besides the serde entry points ([`encode`], [`decode`]), the low-level writers and
//! [`Reader`] let other layers (the Python bindings) convert their own values straight to
//! and from bytes, and [`parse_envelope`] reads a response envelope without decoding its
//! item.

use std::ops::Range;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// The codec name an instance advertises in its discovery entry.
pub const CODEC_NAME: &str = "msgpack";

/// Encode a request body or response envelope.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    // Most bodies are one token's response (50-120 bytes): from an empty buffer the
    // encoder grew it through 8, 16, 32, 64 and 128 bytes, five allocations for one.
    encode_with_capacity(value, 128)
}

/// [`encode`] into a buffer of `capacity` bytes first (a request whose size is known
/// roughly, such as a prompt of so many tokens).
pub fn encode_with_capacity<T: Serialize + ?Sized>(value: &T, capacity: usize) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(capacity);
    rmp_serde::encode::write_named(&mut buf, value).map_err(|e| Error::Codec(e.to_string()))?;
    Ok(buf)
}

/// [`encode`] appending to `buf` (a caller that encodes item after item reuses one buffer).
pub fn encode_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<()> {
    rmp_serde::encode::write_named(buf, value).map_err(|e| Error::Codec(e.to_string()))
}

/// Decode a request body or response envelope.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    rmp_serde::from_slice(bytes).map_err(|e| Error::Codec(e.to_string()))
}

/// Append an unsigned integer in its most compact form.
pub fn write_u64(buf: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        buf.push(v as u8);
    } else if let Ok(v) = u8::try_from(v) {
        buf.extend_from_slice(&[0xcc, v]);
    } else if let Ok(v) = u16::try_from(v) {
        buf.push(0xcd);
        buf.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = u32::try_from(v) {
        buf.push(0xce);
        buf.extend_from_slice(&v.to_be_bytes());
    } else {
        buf.push(0xcf);
        buf.extend_from_slice(&v.to_be_bytes());
    }
}

/// Append a signed integer in its most compact form.
pub fn write_i64(buf: &mut Vec<u8>, v: i64) {
    if let Ok(u) = u64::try_from(v) {
        write_u64(buf, u);
    } else if v >= -32 {
        buf.push(v as i8 as u8);
    } else if let Ok(v) = i8::try_from(v) {
        buf.extend_from_slice(&[0xd0, v as u8]);
    } else if let Ok(v) = i16::try_from(v) {
        buf.push(0xd1);
        buf.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = i32::try_from(v) {
        buf.push(0xd2);
        buf.extend_from_slice(&v.to_be_bytes());
    } else {
        buf.push(0xd3);
        buf.extend_from_slice(&v.to_be_bytes());
    }
}

/// A length header: `fix | n` below 16, else the 16- or 32-bit form (`wide16`, `wide16 + 1`).
fn write_len(buf: &mut Vec<u8>, n: usize, fix: u8, wide16: u8) {
    if n < 16 {
        buf.push(fix | n as u8);
    } else if let Ok(n) = u16::try_from(n) {
        buf.push(wide16);
        buf.extend_from_slice(&n.to_be_bytes());
    } else {
        buf.push(wide16 + 1);
        buf.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Append a string.
pub fn write_str(buf: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        buf.push(0xa0 | n as u8);
    } else if let Ok(n) = u8::try_from(n) {
        buf.extend_from_slice(&[0xd9, n]);
    } else if let Ok(n) = u16::try_from(n) {
        buf.push(0xda);
        buf.extend_from_slice(&n.to_be_bytes());
    } else {
        buf.push(0xdb);
        buf.extend_from_slice(&(n as u32).to_be_bytes());
    }
    buf.extend_from_slice(s.as_bytes());
}

/// Append a byte string (`bin`).
pub fn write_bin(buf: &mut Vec<u8>, b: &[u8]) {
    let n = b.len();
    if let Ok(n) = u8::try_from(n) {
        buf.extend_from_slice(&[0xc4, n]);
    } else if let Ok(n) = u16::try_from(n) {
        buf.push(0xc5);
        buf.extend_from_slice(&n.to_be_bytes());
    } else {
        buf.push(0xc6);
        buf.extend_from_slice(&(n as u32).to_be_bytes());
    }
    buf.extend_from_slice(b);
}

/// Append a map header for `n` entries.
pub fn write_map_len(buf: &mut Vec<u8>, n: usize) {
    write_len(buf, n, 0x80, 0xde);
}

/// Append an array header for `n` items.
pub fn write_array_len(buf: &mut Vec<u8>, n: usize) {
    write_len(buf, n, 0x90, 0xdc);
}

/// Append `nil`.
pub fn write_nil(buf: &mut Vec<u8>) {
    buf.push(0xc0);
}

/// Append a boolean.
pub fn write_bool(buf: &mut Vec<u8>, b: bool) {
    buf.push(if b { 0xc3 } else { 0xc2 });
}

/// Append a 64-bit float.
pub fn write_f64(buf: &mut Vec<u8>, f: f64) {
    buf.push(0xcb);
    buf.extend_from_slice(&f.to_be_bytes());
}

/// A cursor over MessagePack bytes (for walking a value without building a tree).
#[derive(Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

/// The next value: a scalar, or the header of a container (whose items follow).
#[derive(Debug, PartialEq)]
pub enum Head<'a> {
    /// `nil`.
    Nil,
    /// A boolean.
    Bool(bool),
    /// A negative integer (or a non-negative one in a signed form).
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    /// A float (32-bit ones widened).
    Float(f64),
    /// A string's bytes (UTF-8 unchecked).
    Str(&'a [u8]),
    /// A byte string.
    Bin(&'a [u8]),
    /// An array of this many items.
    Array(usize),
    /// A map of this many entries.
    Map(usize),
    /// An extension value (skipped).
    Ext,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `b`.
    pub fn new(b: &'a [u8]) -> Self {
        Self { b, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| Error::Codec("truncated MessagePack value".into()))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len(&mut self, bytes: u8) -> Result<usize> {
        Ok(match bytes {
            1 => usize::from(self.u8()?),
            2 => usize::from(u16::from_be_bytes(self.be()?)),
            _ => u32::from_be_bytes(self.be()?) as usize,
        })
    }

    /// Offset of the next value.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left to read (an upper bound for any item count read from the input).
    pub fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    /// Read the next value's head.
    pub fn head(&mut self) -> Result<Head<'a>> {
        let m = self.u8()?;
        Ok(match m {
            0x00..=0x7f => Head::UInt(u64::from(m)),
            0x80..=0x8f => Head::Map(usize::from(m & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(m & 0x0f)),
            0xa0..=0xbf => Head::Str(self.take(usize::from(m & 0x1f))?),
            0xc0 => Head::Nil,
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (m - 0xc4))?;
                Head::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (m - 0xc7))?;
                self.take(n + 1)?;
                Head::Ext
            }
            0xca => Head::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Head::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Head::UInt(u64::from(self.u8()?)),
            0xcd => Head::UInt(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Head::UInt(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Head::UInt(u64::from_be_bytes(self.be()?)),
            0xd0 => Head::Int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Head::Int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Head::Int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Head::Int(i64::from_be_bytes(self.be()?)),
            0xd4..=0xd8 => {
                self.take(1 + (1 << (m - 0xd4)))?;
                Head::Ext
            }
            0xd9..=0xdb => {
                let n = self.len(1 << (m - 0xd9))?;
                Head::Str(self.take(n)?)
            }
            0xdc | 0xdd => Head::Array(self.len(2 << (m - 0xdc))?),
            0xde | 0xdf => Head::Map(self.len(2 << (m - 0xde))?),
            0xe0..=0xff => Head::Int(i64::from(m as i8)),
            0xc1 => return Err(Error::Codec("invalid MessagePack marker 0xc1".into())),
        })
    }

    /// Skip one value (iteratively: nesting depth costs no stack).
    pub fn skip(&mut self) -> Result<()> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            match self.head()? {
                Head::Array(n) => pending = pending.saturating_add(n),
                Head::Map(n) => pending = pending.saturating_add(n.saturating_mul(2)),
                _ => {}
            }
        }
        Ok(())
    }

    fn text(&mut self) -> Result<Option<String>> {
        match self.head()? {
            Head::Str(s) => Ok(Some(String::from_utf8_lossy(s).into_owned())),
            Head::Nil => Ok(None),
            _ => Err(Error::Codec("expected a string".into())),
        }
    }
}

/// A response envelope `{"data"?, "id"?, "event"?, "comment"?}` with `data` left as a byte
/// range of the payload (decoded later by whoever knows its type, e.g. into Python objects
/// while holding the GIL).
#[derive(Debug, Default, PartialEq)]
pub struct Envelope {
    /// Where the item is (absent, or `nil`: a pure annotation).
    pub data: Option<Range<usize>>,
    /// The item id.
    pub id: Option<String>,
    /// The event name (`"error"`: an error item).
    pub event: Option<String>,
    /// Comments (the message of an error item).
    pub comment: Option<Vec<String>>,
}

/// Parse a response envelope.
pub fn parse_envelope(bytes: &[u8]) -> Result<Envelope> {
    let mut r = Reader::new(bytes);
    let Head::Map(n) = r.head()? else {
        return Err(Error::Codec("a response item must be a map".into()));
    };
    let mut env = Envelope::default();
    for _ in 0..n {
        let key = match r.head()? {
            Head::Str(k) => k,
            _ => {
                r.skip()?;
                continue;
            }
        };
        match key {
            b"data" => {
                let start = r.pos;
                if r.b.get(start) == Some(&0xc0) {
                    r.pos += 1;
                } else {
                    r.skip()?;
                    env.data = Some(start..r.pos);
                }
            }
            b"id" => env.id = r.text()?,
            b"event" => env.event = r.text()?,
            b"comment" => match r.head()? {
                Head::Array(m) => {
                    let mut c = Vec::with_capacity(m.min(bytes.len()));
                    for _ in 0..m {
                        c.push(r.text()?.unwrap_or_default());
                    }
                    env.comment = Some(c);
                }
                Head::Nil => {}
                _ => return Err(Error::Codec("comment is not an array".into())),
            },
            _ => r.skip()?,
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Finish {
        Stop,
        Length,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Out {
        token_ids: Vec<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        finish: Option<Finish>,
        extra: serde_json::Value,
    }

    #[test]
    fn structs_are_maps_keyed_by_field_name() {
        let v = Out {
            token_ids: vec![1, 70_000],
            text: None,
            finish: Some(Finish::Length),
            extra: serde_json::json!({"a": [1, -2, 1.5, null, true]}),
        };
        let bytes = encode(&v).unwrap();
        // A map with three keys (the skipped `text` is absent), not an array.
        assert_eq!(bytes[0], 0x83);
        let back: Out = decode(&bytes).unwrap();
        assert_eq!(back, v);
        // Generic view: what a Python handler sees.
        let generic = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        assert_eq!(generic["finish"], rmpv::Value::from("Length"));
        assert_eq!(generic["token_ids"][1], rmpv::Value::from(70_000));
    }

    #[test]
    fn maps_written_by_other_encoders_decode_into_structs() {
        // As a Python handler writes it: compact ints, a unit variant as a string, a
        // missing optional field, an unknown key.
        let mut m = Vec::new();
        rmpv::encode::write_value(
            &mut m,
            &rmpv::Value::Map(vec![
                ("token_ids".into(), rmpv::Value::Array(vec![5.into()])),
                ("finish".into(), "Stop".into()),
                ("extra".into(), rmpv::Value::Nil),
                ("unknown".into(), rmpv::Value::Binary(vec![0, 1])),
            ]),
        )
        .unwrap();
        let out: Out = decode(&m).unwrap();
        assert_eq!(out.token_ids, vec![5]);
        assert_eq!(out.finish, Some(Finish::Stop));
        assert_eq!(out.extra, serde_json::Value::Null);
    }

    #[test]
    fn malformed_bytes_are_a_codec_error() {
        assert!(matches!(decode::<Out>(b"\xc1"), Err(Error::Codec(_))));
        assert!(matches!(
            decode::<Out>(b"{\"token_ids\":[]}"),
            Err(Error::Codec(_))
        ));
    }

    fn enc(v: &rmpv::Value) -> Vec<u8> {
        let mut b = Vec::new();
        rmpv::encode::write_value(&mut b, v).unwrap();
        b
    }

    #[test]
    fn integers_use_the_compact_forms_a_reference_encoder_uses() {
        for v in [
            0i64,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u32::MAX as i64,
            i64::MAX,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32_768,
            -32_769,
            i32::MIN as i64,
            i64::MIN,
        ] {
            let mut ours = Vec::new();
            write_i64(&mut ours, v);
            assert_eq!(ours, enc(&rmpv::Value::from(v)), "{v}");
            let mut r = Reader::new(&ours);
            match r.head().unwrap() {
                Head::Int(i) => assert_eq!(i, v),
                Head::UInt(u) => assert_eq!(u as i64, v),
                _ => panic!("not an int"),
            }
        }
        let mut ours = Vec::new();
        write_u64(&mut ours, u64::MAX);
        assert_eq!(ours, enc(&rmpv::Value::from(u64::MAX)));
    }

    #[test]
    fn strings_bins_and_containers_match_rmpv() {
        for n in [0usize, 31, 32, 255, 256, 70_000] {
            let s = "x".repeat(n);
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            assert_eq!(ours, enc(&rmpv::Value::from(s.as_str())));
            let b = vec![7u8; n];
            let mut ours = Vec::new();
            write_bin(&mut ours, &b);
            assert_eq!(ours, enc(&rmpv::Value::Binary(b)));
        }
        for n in [0usize, 15, 16, 70_000] {
            let mut ours = Vec::new();
            write_len(&mut ours, n, 0x90, 0xdc);
            ours.extend(std::iter::repeat_n(0xc0, n));
            assert_eq!(ours, enc(&rmpv::Value::Array(vec![rmpv::Value::Nil; n])));
        }
    }

    #[test]
    fn envelopes_expose_data_as_a_range_and_annotations_as_text() {
        let payload = enc(&rmpv::Value::Map(vec![
            ("id".into(), "7".into()),
            (
                "data".into(),
                rmpv::Value::Map(vec![("a".into(), rmpv::Value::Array(vec![1.into()]))]),
            ),
            ("event".into(), "tick".into()),
            (
                "comment".into(),
                rmpv::Value::Array(vec!["x".into(), "y".into()]),
            ),
            ("other".into(), rmpv::Value::Binary(vec![1, 2])),
        ]));
        let env = parse_envelope(&payload).unwrap();
        let data = env.data.clone().unwrap();
        assert_eq!(
            rmpv::decode::read_value(&mut &payload[data]).unwrap(),
            rmpv::Value::Map(vec![("a".into(), rmpv::Value::Array(vec![1.into()]))])
        );
        assert_eq!(env.id.as_deref(), Some("7"));
        assert_eq!(env.event.as_deref(), Some("tick"));
        assert_eq!(env.comment, Some(vec!["x".into(), "y".into()]));
        // `data: nil` is no data.
        let nil = enc(&rmpv::Value::Map(vec![("data".into(), rmpv::Value::Nil)]));
        assert_eq!(parse_envelope(&nil).unwrap(), Envelope::default());
    }

    #[test]
    fn truncated_or_foreign_payloads_are_errors_not_panics() {
        assert!(parse_envelope(b"{\"data\":1}").is_err());
        assert!(parse_envelope(b"\x81\xa4data").is_err());
        assert!(parse_envelope(b"\x81\xa4data\xdd\xff\xff\xff\xff").is_err());
        assert!(parse_envelope(b"\x81\xa4data\xc1").is_err());
        let mut r = Reader::new(b"\xdb\xff\xff\xff\xff");
        assert!(r.skip().is_err());
    }

    proptest::proptest! {
        /// Untrusted bytes never panic the reader, and where a reference decoder (rmpv)
        /// reads a value, skipping it ends exactly where rmpv stopped.
        #[test]
        fn skipping_agrees_with_rmpv_on_any_bytes(bytes in proptest::collection::vec(
            proptest::prelude::any::<u8>(), 0..64,
        )) {
            let _ = parse_envelope(&bytes);
            let _ = Reader::new(&bytes).skip();
            // rmpv reads the reserved marker 0xc1 as nil; we refuse it. Compare the rest.
            let bytes: Vec<u8> = bytes.iter().map(|&b| if b == 0xc1 { 0xc0 } else { b }).collect();
            let mut ours = Reader::new(&bytes);
            let skipped = ours.skip();
            let mut theirs = &bytes[..];
            if rmpv::decode::read_value(&mut theirs).is_ok() {
                proptest::prop_assert!(skipped.is_ok());
                proptest::prop_assert_eq!(ours.position(), bytes.len() - theirs.len());
            }
        }
    }
}
