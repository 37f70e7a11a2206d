//! Decoding the KV events that engines (vLLM, SGLang, TensorRT-LLM) publish on their ZMQ
//! PUB socket, for a worker that relays them to routers.
//!
//! Wire format: a multipart message `[topic, sequence, payload]`, where `sequence` is an
//! 8-byte big-endian counter and `payload` is msgpack `[timestamp, [event, ...], dp_rank]`
//! (`dp_rank` may be absent). Each event is either a tagged array, as vLLM's msgspec
//! encoder writes it —
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//! lora_name]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]` (trailing
//! fields optional) — or a map with a `"type"` key and the same field names.
//!
//! Block hashes are integers (signed or unsigned 64-bit; reinterpreted bit for bit) or, for
//! engines that hash with SHA-256, byte strings, of which the first 8 bytes are used
//! (big-endian) consistently for stores and removes. Decoding untrusted bytes never panics.

use rmpv::Value;

use crate::error::{Error, Result};
use crate::protocols::StorageTier;
use crate::publisher::{PublishInput, StoredInput};

/// One decoded engine event.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Blocks were stored.
    BlockStored {
        /// Engine hashes of the blocks.
        block_hashes: Vec<i64>,
        /// Engine hash of the parent block.
        parent_block_hash: Option<i64>,
        /// Token ids of the blocks, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: usize,
        /// LoRA adapter name, when the engine reports it.
        lora_name: Option<String>,
        /// Storage tier.
        tier: StorageTier,
    },
    /// Blocks were removed.
    BlockRemoved {
        /// Engine hashes of the blocks.
        block_hashes: Vec<i64>,
        /// Storage tier.
        tier: StorageTier,
    },
    /// Every block was dropped.
    AllBlocksCleared,
}

/// One decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEventBatch {
    /// Engine timestamp (seconds).
    pub timestamp: f64,
    /// Events, in order.
    pub events: Vec<EngineEvent>,
    /// Data-parallel rank that produced them, when given.
    pub dp_rank: Option<u32>,
}

fn err(msg: impl Into<String>) -> Error {
    Error::Decode(format!("Failed to decode engine KV event: {}", msg.into()))
}

/// Map an engine's `medium` string to a storage tier (unknown media count as device).
pub fn medium_to_tier(medium: &str) -> StorageTier {
    match medium.to_ascii_uppercase().as_str() {
        "CPU" | "CPU_PINNED" | "CPU_TIER1" => StorageTier::HostPinned,
        "CPU_TIER2" | "DISK" | "NVME" => StorageTier::Disk,
        "EXTERNAL" | "NETWORK" | "REMOTE" | "SHARED" => StorageTier::External,
        _ => StorageTier::Device,
    }
}

/// Decode the 8-byte big-endian sequence frame of a multipart message.
///
/// # Errors
/// [`Error::Decode`] when the frame is not 8 bytes.
pub fn decode_sequence(frame: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| {
        err(format!(
            "sequence frame has {} bytes, expected 8",
            frame.len()
        ))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

fn hash(v: &Value) -> Result<i64> {
    match v {
        Value::Integer(i) => i
            .as_i64()
            .or_else(|| i.as_u64().map(|u| u as i64))
            .ok_or_else(|| err("block hash out of range")),
        Value::Binary(b) if b.len() >= 8 => {
            let mut first = [0u8; 8];
            first.copy_from_slice(&b[..8]);
            Ok(i64::from_be_bytes(first))
        }
        other => Err(err(format!("block hash must be an integer, got {other}"))),
    }
}

fn hashes(v: &Value) -> Result<Vec<i64>> {
    v.as_array()
        .ok_or_else(|| err("block_hashes must be an array"))?
        .iter()
        .map(hash)
        .collect()
}

fn opt_str(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

fn tier(v: Option<&Value>) -> StorageTier {
    v.and_then(Value::as_str)
        .map_or(StorageTier::Device, medium_to_tier)
}

/// Named fields of an event, from either encoding.
fn field<'a>(event: &'a Value, name: &str, position: usize) -> Option<&'a Value> {
    match event {
        Value::Array(items) => items.get(position),
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
    .filter(|v| !v.is_nil())
}

fn decode_event(event: &Value) -> Result<EngineEvent> {
    let tag = field(event, "type", 0)
        .and_then(Value::as_str)
        .ok_or_else(|| err("event has no type tag"))?;
    match tag {
        "BlockStored" => {
            let token_ids = field(event, "token_ids", 3)
                .and_then(Value::as_array)
                .ok_or_else(|| err("BlockStored.token_ids must be an array"))?
                .iter()
                .map(|t| {
                    t.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(|| err("token id must fit in u32"))
                })
                .collect::<Result<_>>()?;
            let block_size = field(event, "block_size", 4)
                .and_then(Value::as_u64)
                .ok_or_else(|| err("BlockStored.block_size must be an integer"))?;
            Ok(EngineEvent::BlockStored {
                block_hashes: hashes(
                    field(event, "block_hashes", 1)
                        .ok_or_else(|| err("BlockStored.block_hashes missing"))?,
                )?,
                parent_block_hash: field(event, "parent_block_hash", 2).map(hash).transpose()?,
                token_ids,
                block_size: usize::try_from(block_size).map_err(|_| err("block_size too large"))?,
                lora_name: opt_str(field(event, "lora_name", 7)),
                tier: tier(field(event, "medium", 6)),
            })
        }
        "BlockRemoved" => Ok(EngineEvent::BlockRemoved {
            block_hashes: hashes(
                field(event, "block_hashes", 1)
                    .ok_or_else(|| err("BlockRemoved.block_hashes missing"))?,
            )?,
            tier: tier(field(event, "medium", 2)),
        }),
        "AllBlocksCleared" => Ok(EngineEvent::AllBlocksCleared),
        other => Err(err(format!("unknown event type {other:?}"))),
    }
}

/// Decode one msgpack payload.
///
/// The usual shape (vLLM's tagged arrays, integer hashes, string media) is read straight
/// from the bytes without building a msgpack value tree; anything else (map-encoded
/// events, byte-string hashes, unexpected field types, malformed bytes) goes through the
/// general decoder, which also words the errors. Both give the same batch for any payload
/// the direct reader accepts.
///
/// # Errors
/// [`Error::Decode`] describing the first malformed part.
pub fn decode_engine_batch(payload: &[u8]) -> Result<EngineEventBatch> {
    if let Some(batch) = direct::decode(payload) {
        return Ok(batch);
    }
    decode_engine_batch_general(payload)
}

/// Deepest nesting of arrays and maps the general decoder reads (the payload's own array
/// counts as one). A batch nests a handful
/// of levels (batch, events, event, a block's extra keys, a key's parts); rmpv's own default (1,024)
/// recursed deep enough to overflow a 2 MiB thread stack in debug builds (a hostile
/// payload of nested one-element arrays).
const MAX_NESTING: usize = 32;
/// [`MAX_NESTING`] in rmpv's terms: its depth budget pays two for each array or map and
/// one for the scalar at the bottom (rmpv 1.3, seen in `nested_unread_fields_decode_up_to_
/// the_limit`).
const RMPV_DEPTH: usize = 2 * MAX_NESTING + 1;

/// The general decoder: the payload as a msgpack value tree, either event encoding.
fn decode_engine_batch_general(payload: &[u8]) -> Result<EngineEventBatch> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut reader, RMPV_DEPTH)
        .map_err(|e| err(e.to_string()))?
        .to_owned();
    let items = value
        .as_array()
        .ok_or_else(|| err("payload must be an array [timestamp, events, dp_rank]"))?;
    let timestamp = items
        .first()
        .and_then(|t| t.as_f64().or_else(|| t.as_i64().map(|i| i as f64)))
        .ok_or_else(|| err("timestamp must be a number"))?;
    let events = items
        .get(1)
        .and_then(Value::as_array)
        .ok_or_else(|| err("events must be an array"))?
        .iter()
        .map(decode_event)
        .collect::<Result<_>>()?;
    let dp_rank = match items.get(2) {
        None | Some(Value::Nil) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or_else(|| err("dp_rank must be a non-negative integer"))?,
        ),
    };
    Ok(EngineEventBatch {
        timestamp,
        events,
        dp_rank,
    })
}

/// A direct reader of the common payload shape: `None` for anything it does not handle
/// (the caller falls back to the general decoder), never a different answer.
mod direct {
    use super::{EngineEvent, EngineEventBatch, medium_to_tier};
    use crate::protocols::StorageTier;

    /// An integer as msgpack types it.
    #[derive(Clone, Copy)]
    enum Int {
        U(u64),
        I(i64),
    }

    impl Int {
        fn as_u64(self) -> Option<u64> {
            match self {
                Int::U(u) => Some(u),
                Int::I(i) => u64::try_from(i).ok(),
            }
        }

        /// The hash reading of [`super::hash`]: signed, or unsigned reinterpreted.
        fn as_hash(self) -> i64 {
            match self {
                Int::U(u) => u as i64,
                Int::I(i) => i,
            }
        }
    }

    struct Cursor<'a> {
        bytes: &'a [u8],
    }

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.bytes.len() < n {
                return None;
            }
            let (head, rest) = self.bytes.split_at(n);
            self.bytes = rest;
            Some(head)
        }

        /// Capacity for `n` entries that each take at least one more byte.
        fn capacity(&self, n: usize) -> usize {
            n.min(self.bytes.len())
        }

        fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
            self.take(N)?.try_into().ok()
        }

        fn peek(&self) -> Option<u8> {
            self.bytes.first().copied()
        }

        fn byte(&mut self) -> Option<u8> {
            Some(self.take(1)?[0])
        }

        /// Skip a nil; true when there was one.
        fn nil(&mut self) -> bool {
            if self.peek() == Some(0xc0) {
                self.bytes = &self.bytes[1..];
                true
            } else {
                false
            }
        }

        fn array_len(&mut self) -> Option<usize> {
            match self.byte()? {
                b @ 0x90..=0x9f => Some(usize::from(b & 0x0f)),
                0xdc => Some(usize::from(u16::from_be_bytes(self.be()?))),
                0xdd => usize::try_from(u32::from_be_bytes(self.be()?)).ok(),
                _ => None,
            }
        }

        fn int(&mut self) -> Option<Int> {
            Some(match self.byte()? {
                b @ 0x00..=0x7f => Int::U(u64::from(b)),
                b @ 0xe0..=0xff => Int::I(i64::from(b as i8)),
                0xcc => Int::U(u64::from(self.byte()?)),
                0xcd => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
                0xce => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
                0xcf => Int::U(u64::from_be_bytes(self.be()?)),
                0xd0 => Int::I(i64::from(self.byte()? as i8)),
                0xd1 => Int::I(i64::from(i16::from_be_bytes(self.be()?))),
                0xd2 => Int::I(i64::from(i32::from_be_bytes(self.be()?))),
                0xd3 => Int::I(i64::from_be_bytes(self.be()?)),
                _ => return None,
            })
        }

        fn str(&mut self) -> Option<&'a str> {
            let len = match self.byte()? {
                b @ 0xa0..=0xbf => usize::from(b & 0x1f),
                0xd9 => usize::from(self.byte()?),
                0xda => usize::from(u16::from_be_bytes(self.be()?)),
                0xdb => usize::try_from(u32::from_be_bytes(self.be()?)).ok()?,
                _ => return None,
            };
            std::str::from_utf8(self.take(len)?).ok()
        }

        /// A number read as `f64` (the timestamp).
        fn number(&mut self) -> Option<f64> {
            match self.peek()? {
                0xca => {
                    self.byte()?;
                    Some(f64::from(f32::from_be_bytes(self.be()?)))
                }
                0xcb => {
                    self.byte()?;
                    Some(f64::from_be_bytes(self.be()?))
                }
                _ => match self.int()? {
                    Int::I(i) => Some(i as f64),
                    Int::U(u) => i64::try_from(u).ok().map(|i| i as f64),
                },
            }
        }

        fn hashes(&mut self) -> Option<Vec<i64>> {
            let n = self.array_len()?;
            let mut out = Vec::with_capacity(self.capacity(n));
            for _ in 0..n {
                out.push(self.int()?.as_hash());
            }
            Some(out)
        }

        fn tokens(&mut self) -> Option<Vec<u32>> {
            let n = self.array_len()?;
            let mut out = Vec::with_capacity(self.capacity(n));
            for _ in 0..n {
                out.push(u32::try_from(self.int()?.as_u64()?).ok()?);
            }
            Some(out)
        }

        fn opt_str(&mut self) -> Option<Option<&'a str>> {
            if self.nil() {
                Some(None)
            } else {
                self.str().map(Some)
            }
        }

        fn tier(&mut self) -> Option<StorageTier> {
            Some(self.opt_str()?.map_or(StorageTier::Device, medium_to_tier))
        }

        fn event(&mut self) -> Option<EngineEvent> {
            let len = self.array_len()?;
            if len == 0 {
                return None;
            }
            match self.str()? {
                "BlockStored" if (5..=8).contains(&len) => {
                    let block_hashes = self.hashes()?;
                    let parent_block_hash = if self.nil() {
                        None
                    } else {
                        Some(self.int()?.as_hash())
                    };
                    let token_ids = self.tokens()?;
                    let block_size = usize::try_from(self.int()?.as_u64()?).ok()?;
                    if len > 5 && !self.nil() {
                        // lora_id: an integer, not used.
                        self.int()?;
                    }
                    let tier = if len > 6 {
                        self.tier()?
                    } else {
                        StorageTier::Device
                    };
                    let lora_name = if len > 7 {
                        self.opt_str()?.map(str::to_owned)
                    } else {
                        None
                    };
                    Some(EngineEvent::BlockStored {
                        block_hashes,
                        parent_block_hash,
                        token_ids,
                        block_size,
                        lora_name,
                        tier,
                    })
                }
                "BlockRemoved" if (2..=3).contains(&len) => {
                    let block_hashes = self.hashes()?;
                    let tier = if len > 2 {
                        self.tier()?
                    } else {
                        StorageTier::Device
                    };
                    Some(EngineEvent::BlockRemoved { block_hashes, tier })
                }
                "AllBlocksCleared" if len == 1 => Some(EngineEvent::AllBlocksCleared),
                _ => None,
            }
        }
    }

    /// `[timestamp, [event, ...], dp_rank?]` with tagged-array events, or `None`.
    pub(super) fn decode(payload: &[u8]) -> Option<EngineEventBatch> {
        let mut c = Cursor { bytes: payload };
        let len = c.array_len()?;
        if !(2..=3).contains(&len) {
            return None;
        }
        let timestamp = c.number()?;
        let n = c.array_len()?;
        let mut events = Vec::with_capacity(c.capacity(n));
        for _ in 0..n {
            events.push(c.event()?);
        }
        let dp_rank = if len < 3 || c.nil() {
            None
        } else {
            Some(u32::try_from(c.int()?.as_u64()?).ok()?)
        };
        Some(EngineEventBatch {
            timestamp,
            events,
            dp_rank,
        })
    }
}

impl EngineEvent {
    /// [`Self::to_publish_input`] without copying the event's token ids and hashes.
    pub fn into_publish_input(self, cache_salt: Option<&str>) -> PublishInput {
        match self {
            EngineEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                mut token_ids,
                block_size,
                lora_name,
                ..
            } => {
                let bs = block_size.max(1);
                let mut num_block_tokens: Vec<usize> =
                    token_ids.chunks(bs).map(<[u32]>::len).collect();
                num_block_tokens.resize(block_hashes.len(), 0);
                token_ids.truncate(num_block_tokens.iter().sum());
                PublishInput::Stored(StoredInput {
                    token_ids,
                    num_block_tokens,
                    block_hashes,
                    parent_hash: parent_block_hash,
                    lora_name,
                    cache_salt: cache_salt.map(str::to_owned),
                    ..Default::default()
                })
            }
            EngineEvent::BlockRemoved { block_hashes, .. } => PublishInput::Removed(block_hashes),
            EngineEvent::AllBlocksCleared => PublishInput::Cleared,
        }
    }

    /// The publisher input for this event. Stored token ids are split into blocks of the
    /// engine's `block_size` (a trailing partial block is kept and then dropped by the
    /// publisher's size check).
    pub fn to_publish_input(&self, cache_salt: Option<&str>) -> PublishInput {
        match self {
            EngineEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                ..
            } => {
                let bs = (*block_size).max(1);
                let mut num_block_tokens: Vec<usize> =
                    token_ids.chunks(bs).map(<[u32]>::len).collect();
                num_block_tokens.resize(block_hashes.len(), 0);
                let mut token_ids = token_ids.clone();
                token_ids.truncate(num_block_tokens.iter().sum());
                PublishInput::Stored(StoredInput {
                    token_ids,
                    num_block_tokens,
                    block_hashes: block_hashes.clone(),
                    parent_hash: *parent_block_hash,
                    lora_name: lora_name.clone(),
                    cache_salt: cache_salt.map(str::to_owned),
                    ..Default::default()
                })
            }
            EngineEvent::BlockRemoved { block_hashes, .. } => {
                PublishInput::Removed(block_hashes.clone())
            }
            EngineEvent::AllBlocksCleared => PublishInput::Cleared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).expect("in-memory write");
        out
    }

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&x| Value::from(x)).collect())
    }

    #[test]
    fn decodes_vllm_tagged_arrays() {
        let payload = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    ints(&[-5, 6]),
                    Value::Nil,
                    ints(&[1, 2, 3, 4, 5, 6, 7, 8]),
                    4.into(),
                    Value::Nil,
                    "CPU".into(),
                ]),
                Value::Array(vec!["BlockRemoved".into(), ints(&[6])]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
            2.into(),
        ]);
        let batch = decode_engine_batch(&encode(&payload)).expect("valid");
        assert_eq!(batch.dp_rank, Some(2));
        assert_eq!(batch.events.len(), 3);
        let EngineEvent::BlockStored {
            block_hashes,
            tier,
            block_size,
            ..
        } = &batch.events[0]
        else {
            panic!("stored first")
        };
        assert_eq!(
            (block_hashes.as_slice(), *tier, *block_size),
            (&[-5i64, 6][..], StorageTier::HostPinned, 4)
        );
        let PublishInput::Stored(s) = batch.events[0].to_publish_input(None) else {
            panic!("stored input")
        };
        assert_eq!(s.num_block_tokens, [4, 4]);
        assert_eq!(batch.events[2], EngineEvent::AllBlocksCleared);
        assert_eq!(decode_sequence(&7u64.to_be_bytes()).expect("8 bytes"), 7);
        assert!(decode_sequence(&[1, 2]).is_err());
    }

    #[test]
    fn decodes_maps_and_byte_hashes() {
        let stored = Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            (
                "block_hashes".into(),
                Value::Array(vec![Value::Binary(vec![0, 0, 0, 0, 0, 0, 0, 9, 1, 2])]),
            ),
            ("parent_block_hash".into(), 3.into()),
            ("token_ids".into(), ints(&[1, 2])),
            ("block_size".into(), 2.into()),
            ("lora_name".into(), "a".into()),
        ]);
        let payload = Value::Array(vec![Value::from(0), Value::Array(vec![stored])]);
        let batch = decode_engine_batch(&encode(&payload)).expect("valid");
        assert_eq!(batch.dp_rank, None);
        assert_eq!(
            batch.events[0],
            EngineEvent::BlockStored {
                block_hashes: vec![9],
                parent_block_hash: Some(3),
                token_ids: vec![1, 2],
                block_size: 2,
                lora_name: Some("a".into()),
                tier: StorageTier::Device,
            }
        );
    }

    #[test]
    fn malformed_payloads_are_errors() {
        for payload in [
            Value::from(1),
            Value::Array(vec![Value::F64(0.0), Value::from(3)]),
            Value::Array(vec![
                Value::F64(0.0),
                Value::Array(vec![Value::Array(vec!["Nope".into()])]),
            ]),
            Value::Array(vec![
                Value::F64(0.0),
                Value::Array(vec![Value::Array(vec![
                    "BlockStored".into(),
                    ints(&[1]),
                    Value::Nil,
                    ints(&[-1]),
                    1.into(),
                ])]),
            ]),
        ] {
            assert!(decode_engine_batch(&encode(&payload)).is_err(), "{payload}");
        }
        assert!(decode_engine_batch(&[0xc1]).is_err());
    }

    /// A field value of any of the types an engine (or a broken one) might send.
    fn any_field() -> impl Strategy<Value = Value> {
        let int = prop_oneof![
            (0u64..200).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-40i64..0).prop_map(Value::from),
        ];
        prop_oneof![
            int.clone(),
            Just(Value::Nil),
            Just(Value::from("GPU")),
            Just(Value::from("cpu_tier2")),
            Just(Value::from("lora-a")),
            Just(Value::Binary(vec![1, 2, 3, 4, 5, 6, 7, 8, 9])),
            any::<f64>().prop_map(Value::F64),
            any::<f32>().prop_map(Value::F32),
            proptest::collection::vec(int, 0..6).prop_map(Value::Array),
            proptest::collection::vec((0u64..70_000).prop_map(Value::from), 0..40)
                .prop_map(Value::Array),
            Just(Value::Array(vec![Value::Nil])),
            Just(Value::Map(vec![("type".into(), "AllBlocksCleared".into())])),
        ]
    }

    fn any_event() -> impl Strategy<Value = Value> {
        let tag = prop_oneof![
            Just(Value::from("BlockStored")),
            Just(Value::from("BlockRemoved")),
            Just(Value::from("AllBlocksCleared")),
            Just(Value::from("Other")),
            Just(Value::from(3)),
        ];
        (tag, proptest::collection::vec(any_field(), 0..9)).prop_map(|(tag, mut fields)| {
            fields.insert(0, tag);
            Value::Array(fields)
        })
    }

    fn any_payload() -> impl Strategy<Value = Value> {
        (
            any_field(),
            proptest::collection::vec(any_event(), 0..4),
            proptest::option::of(any_field()),
            0usize..3,
        )
            .prop_map(|(ts, events, dp, extra)| {
                let mut items = vec![ts, Value::Array(events)];
                items.extend(dp);
                items.extend(std::iter::repeat_n(Value::Nil, extra));
                Value::Array(items)
            })
    }

    /// Well-formed events with every field type the direct reader takes.
    fn good_event() -> impl Strategy<Value = Value> {
        let hashes = proptest::collection::vec(any::<i64>().prop_map(Value::from), 1..4);
        let tokens = proptest::collection::vec(any::<u32>().prop_map(Value::from), 0..40);
        let medium = prop_oneof![Just(Value::Nil), Just("GPU".into()), Just("CPU".into())];
        let lora = prop_oneof![Just(Value::Nil), Just("a".into())];
        let parent = prop_oneof![Just(Value::Nil), any::<u64>().prop_map(Value::from)];
        prop_oneof![
            (
                hashes.clone(),
                parent,
                tokens,
                1u64..64,
                medium.clone(),
                lora,
                5usize..=8
            )
                .prop_map(|(h, p, t, bs, m, l, len)| {
                    let mut v = vec![
                        "BlockStored".into(),
                        Value::Array(h),
                        p,
                        Value::Array(t),
                        bs.into(),
                        Value::Nil,
                        m,
                        l,
                    ];
                    v.truncate(len);
                    Value::Array(v)
                }),
            (hashes, medium).prop_map(|(h, m)| Value::Array(vec![
                "BlockRemoved".into(),
                Value::Array(h),
                m
            ])),
            Just(Value::Array(vec!["AllBlocksCleared".into()])),
        ]
    }

    #[test]
    fn the_direct_reader_takes_the_usual_shape() {
        let payload = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![Value::Array(vec![
                "BlockStored".into(),
                ints(&[-5, 6]),
                Value::Nil,
                ints(&[1, 2, 3, 4, 5, 6, 7, 8]),
                4.into(),
                Value::Nil,
                "GPU".into(),
            ])]),
            0.into(),
        ]);
        let bytes = encode(&payload);
        assert!(direct::decode(&bytes).is_some());
        assert_eq!(
            direct::decode(&bytes),
            decode_engine_batch_general(&bytes).ok()
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_engine_batch(&bytes);
        }

        /// Whatever the direct reader accepts, the general decoder decodes the same way.
        #[test]
        fn direct_reader_agrees_with_the_general_decoder(payload in any_payload()) {
            let bytes = encode(&payload);
            if let Some(batch) = direct::decode(&bytes) {
                prop_assert_eq!(Ok(batch), decode_engine_batch_general(&bytes).map_err(|e| e.to_string()));
            }
        }

        #[test]
        fn well_formed_payloads_take_the_direct_reader(
            ts in any::<f64>(),
            events in proptest::collection::vec(good_event(), 0..5),
            dp in proptest::option::of(any::<u32>()),
        ) {
            let mut items = vec![Value::F64(ts), Value::Array(events)];
            items.extend(dp.map(Value::from));
            let bytes = encode(&Value::Array(items));
            let direct = direct::decode(&bytes);
            prop_assert!(direct.is_some());
            let general = decode_engine_batch_general(&bytes).map_err(|e| e.to_string());
            // NaN timestamps compare unequal: compare the rest then.
            if ts.is_nan() {
                let (d, g) = (direct.unwrap(), general.unwrap());
                prop_assert_eq!((d.events, d.dp_rank), (g.events, g.dp_rank));
            } else {
                prop_assert_eq!(Ok(direct.unwrap()), general);
            }
        }
    }
}

#[cfg(test)]
mod hostile_inputs {
    use super::*;
    use rmpv::encode::write_value;

    #[test]
    fn huge_length_prefixes_do_not_allocate() {
        // array32 / map32 / bin32 claiming 4 billion entries with no data behind them.
        for bytes in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[0xdf, 0xff, 0xff, 0xff, 0xff][..],
            &[0xc6, 0xff, 0xff, 0xff, 0xff][..],
            &[
                0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
            ][..],
        ] {
            assert!(decode_engine_batch(bytes).is_err());
        }
        // Deep nesting.
        let deep = vec![0x91u8; 100_000];
        assert!(decode_engine_batch(&deep).is_err());
    }

    /// Fields the decoder does not read may nest (extra keys per block), up to
    /// `MAX_NESTING` levels in all; deeper is an error, not a deep recursion.
    #[test]
    fn nested_unread_fields_decode_up_to_the_limit() {
        let payload = |depth: usize| {
            // `depth` arrays: batch > events > event > the field's `depth - 3`.
            let mut extra = Value::from(7);
            for _ in 0..depth - 3 {
                extra = Value::Array(vec![extra]);
            }
            let event = Value::Array(vec![
                "BlockStored".into(),
                Value::Array(vec![5.into()]),
                Value::Nil,
                Value::Array((1..=4).map(Value::from).collect()),
                4.into(),
                Value::Nil,
                "GPU".into(),
                Value::Nil,
                extra,
            ]);
            let mut out = Vec::new();
            let batch = Value::Array(vec![Value::F64(1.0), Value::Array(vec![event])]);
            write_value(&mut out, &batch).expect("in-memory write");
            out
        };
        let batch = decode_engine_batch(&payload(MAX_NESTING)).expect("within the limit");
        assert_eq!(batch.events.len(), 1);
        let e = decode_engine_batch(&payload(MAX_NESTING + 1)).expect_err("past the limit");
        assert!(e.to_string().contains("depth"), "{e}");
    }
}
