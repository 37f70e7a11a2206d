//! KV-cache events: what engines report about the blocks they store and evict.
//!
//! The types mirror the reference wire format exactly (JSON via `serde_json`, msgpack via
//! `rmp-serde`):
//!
//! ```text
//! RouterEvent  { worker_id: u64, storage_tier: "device"|"host_pinned"|"disk"|"external"
//!                (default "device"), event: KvCacheEvent }
//! KvCacheEvent { event_id: u64, data: KvCacheEventData, dp_rank: u32 (default 0) }
//! KvCacheEventData (externally tagged, snake_case):
//!   {"stored": {"parent_hash": u64|null, "start_position"?: u32|null,
//!               "blocks": [{"block_hash": u64, "tokens_hash": u64, "mm_extra_info"?: {...}|null}]}}
//!   {"removed": {"block_hashes": [u64]}}
//!   "cleared"
//! ```
//!
//! * `block_hash` ([`ExternalSequenceBlockHash`]) is the engine's own hash of the block *and
//!   its prefix*; it is an opaque key used for parent links and removal.
//! * `tokens_hash` ([`LocalBlockHash`](crate::hashing::LocalBlockHash)) is the router's
//!   content hash of the block alone; the radix tree is navigated with it.
//! * Hashes are unsigned 64-bit on the wire, as in the reference: a negative JSON integer is a
//!   decoding error. Engines that produce signed hashes convert them bit for bit with
//!   [`ExternalSequenceBlockHash::from_i64`] before building events.
//! * Unknown object fields are ignored; structs also decode from positional arrays (what
//!   `serde` does for every derived struct), which is how positional msgpack arrives.
//!
//! Decoding untrusted bytes ([`decode_json_event`], [`decode_msgpack_router_event`], ...)
//! never panics: malformed input, unknown variants and missing fields become
//! [`Error::Decode`] carrying the decoder's message.
//!
//! ```
//! use dynamo_kv_router::protocols::{decode_json_event, KvCacheEventData};
//!
//! let ev = decode_json_event(
//!     br#"{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":7,"tokens_hash":9}]}}}"#,
//! )?;
//! assert_eq!(ev.dp_rank, 0);
//! assert!(matches!(ev.data, KvCacheEventData::Stored(_)));
//! # Ok::<(), dynamo_kv_router::Error>(())
//! ```

mod events;
mod fast_json;

use crate::error::{Error, Result};

pub use events::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier, WorkerWithDpRank,
};

fn decode_error(what: &str, err: impl std::fmt::Display) -> Error {
    Error::Decode(format!("Failed to deserialize {what}: {err}"))
}

/// Decode one JSON `KvCacheEvent` (the bytes `RadixTree.apply_event` receives).
///
/// # Errors
/// [`Error::Decode`] with the message `Failed to deserialize KvCacheEvent: <serde message>`.
pub fn decode_json_event(bytes: &[u8]) -> Result<KvCacheEvent> {
    // Canonical events take a hand-written fast path (about twice as fast on 64-block
    // stores); anything else, including every invalid input, goes through serde_json.
    if let Some(ev) = fast_json::decode_event(bytes) {
        return Ok(ev);
    }
    decode_json_event_serde(bytes)
}

/// [`decode_json_event`] without the fast path (the reference decoder; tests compare the
/// two).
///
/// # Errors
/// As [`decode_json_event`].
#[doc(hidden)]
pub fn decode_json_event_serde(bytes: &[u8]) -> Result<KvCacheEvent> {
    serde_json::from_slice(bytes).map_err(|e| decode_error("KvCacheEvent", e))
}

/// Decode one JSON `RouterEvent` (an event-plane message or a dump line).
///
/// # Errors
/// [`Error::Decode`] on malformed input.
pub fn decode_json_router_event(bytes: &[u8]) -> Result<RouterEvent> {
    // The event plane carries one of these per KV event: canonical ones take the fast path
    // (as `decode_json_event`), anything else serde_json.
    if let Some(ev) = fast_json::decode_router_event(bytes) {
        return Ok(ev);
    }
    decode_json_router_event_serde(bytes)
}

/// [`decode_json_router_event`] without the fast path (tests compare the two).
///
/// # Errors
/// As [`decode_json_router_event`].
#[doc(hidden)]
pub fn decode_json_router_event_serde(bytes: &[u8]) -> Result<RouterEvent> {
    serde_json::from_slice(bytes).map_err(|e| decode_error("RouterEvent", e))
}

/// Decode one msgpack `RouterEvent` (positional arrays or named maps).
///
/// # Errors
/// [`Error::Decode`] on malformed input.
pub fn decode_msgpack_router_event(bytes: &[u8]) -> Result<RouterEvent> {
    rmp_serde::from_slice(bytes).map_err(|e| decode_error("RouterEvent", e))
}

/// Encode a `RouterEvent` as JSON (the reference's event-plane JSON codec).
pub fn encode_json_router_event(event: &RouterEvent) -> String {
    // Serializing these plain structs into a String cannot fail: every key is a string and
    // every value is an integer, a string, a sequence or a nested struct.
    serde_json::to_string(event).unwrap_or_default()
}

/// Encode a `RouterEvent` as positional msgpack (the reference's msgpack codec).
///
/// # Errors
/// [`Error::Decode`] is never produced; encoding errors cannot occur for these types but are
/// reported as [`Error::Encode`] rather than panicking.
pub fn encode_msgpack_router_event(event: &RouterEvent) -> Result<Vec<u8>> {
    rmp_serde::to_vec(event).map_err(|e| Error::Encode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_stored_event_decodes_with_defaults() {
        let ev = decode_json_event(
            br#"{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":0,"tokens_hash":0}]}}}"#,
        )
        .expect("valid event");
        assert_eq!(ev.event_id, 1);
        assert_eq!(ev.dp_rank, 0);
        let KvCacheEventData::Stored(s) = ev.data else {
            panic!("expected stored")
        };
        assert_eq!(s.parent_hash, None);
        assert_eq!(s.start_position, None);
        assert_eq!(s.blocks, vec![KvCacheStoredBlockData::new(0, 0)]);
    }

    #[test]
    fn cleared_and_removed_shapes() {
        let ev =
            decode_json_event(br#"{"event_id":3,"data":"cleared","dp_rank":2}"#).expect("cleared");
        assert_eq!(ev.data, KvCacheEventData::Cleared);
        assert_eq!(ev.dp_rank, 2);
        let ev = decode_json_event(
            br#"{"event_id":4,"data":{"removed":{"block_hashes":[1,18446744073709551615]}}}"#,
        )
        .expect("removed");
        assert_eq!(
            ev.data,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: vec![
                    ExternalSequenceBlockHash(1),
                    ExternalSequenceBlockHash::from_i64(-1)
                ]
            })
        );
    }

    #[test]
    fn malformed_input_is_a_decode_error_with_the_serde_message() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "EOF while parsing"),
            (br#"{"event_id":1,"data":"foo"}"#, "unknown variant `foo`"),
            (br#"{"event_id":1}"#, "missing field `data`"),
            (br#"{"event_id":-1,"data":"cleared"}"#, "expected u64"),
            (
                br#"{"event_id":1,"data":"removed"}"#,
                "expected newtype variant",
            ),
            (
                br#"{"event_id":1,"data":"cleared"} x"#,
                "trailing characters",
            ),
        ];
        for (bytes, needle) in cases {
            let err = decode_json_event(bytes).expect_err("must fail");
            let msg = err.to_string();
            assert!(
                msg.starts_with("Failed to deserialize KvCacheEvent: ") && msg.contains(needle),
                "{msg}"
            );
        }
    }

    #[test]
    fn router_event_round_trips_through_json_and_msgpack() {
        let ev = RouterEvent {
            worker_id: u64::MAX,
            storage_tier: StorageTier::HostPinned,
            event: KvCacheEvent {
                event_id: 9,
                dp_rank: 3,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: Some(ExternalSequenceBlockHash(5)),
                    start_position: Some(4),
                    blocks: vec![KvCacheStoredBlockData::new(1, 2)],
                }),
            },
        };
        let json = encode_json_router_event(&ev);
        assert!(json.contains(r#""storage_tier":"host_pinned""#), "{json}");
        assert_eq!(decode_json_router_event(json.as_bytes()).expect("json"), ev);
        let mp = encode_msgpack_router_event(&ev).expect("encode");
        assert_eq!(decode_msgpack_router_event(&mp).expect("msgpack"), ev);
        for ev in [
            KvCacheEventData::Cleared,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: vec![ExternalSequenceBlockHash(7)],
            }),
        ] {
            let ev = RouterEvent {
                worker_id: 1,
                storage_tier: StorageTier::Device,
                event: KvCacheEvent {
                    event_id: 1,
                    dp_rank: 0,
                    data: ev,
                },
            };
            let mp = encode_msgpack_router_event(&ev).expect("encode");
            assert_eq!(decode_msgpack_router_event(&mp).expect("decode"), ev);
        }
    }

    #[test]
    fn storage_tier_defaults_to_device() {
        let ev =
            decode_json_router_event(br#"{"worker_id":1,"event":{"event_id":0,"data":"cleared"}}"#)
                .expect("router event");
        assert_eq!(ev.storage_tier, StorageTier::Device);
        assert_eq!(ev.worker(), WorkerWithDpRank::new(1, 0));
    }

    /// JSON texts of events in many spellings: key orders, whitespace, optional fields,
    /// nulls, and byte-level mutations of them.
    fn event_texts() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let ws = prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r")];
        let num = prop_oneof![
            (0u64..20).prop_map(|v| v.to_string()),
            any::<u64>().prop_map(|v| v.to_string()),
            Just("18446744073709551616".to_owned()),
            Just("-1".to_owned()),
            Just("1.0".to_owned()),
            Just("01".to_owned()),
            Just("1e3".to_owned()),
            Just("null".to_owned()),
        ];
        let block = (
            num.clone(),
            num.clone(),
            any::<bool>(),
            any::<bool>(),
            ws.clone(),
        )
            .prop_map(|(b, t, mm, swap, w)| {
                let mut fields = vec![
                    format!(r#""block_hash"{w}:{w}{b}"#),
                    format!(r#""tokens_hash":{t}"#),
                ];
                if mm {
                    fields.push(r#""mm_extra_info":null"#.to_owned());
                }
                if swap {
                    fields.reverse();
                }
                format!("{{{w}{}{w}}}", fields.join(&format!("{w},")))
            });
        let data = prop_oneof![
            Just(r#""cleared""#.to_owned()),
            Just(r#"{"cleared":null}"#.to_owned()),
            proptest::collection::vec(num.clone(), 0..4)
                .prop_map(|hs| format!(r#"{{"removed":{{"block_hashes":[{}]}}}}"#, hs.join(","))),
            (
                num.clone(),
                proptest::collection::vec(block, 0..4),
                any::<bool>(),
                num.clone()
            )
                .prop_map(|(p, bs, sp, s)| {
                    let start = if sp {
                        format!(r#","start_position":{s}"#)
                    } else {
                        String::new()
                    };
                    format!(
                        r#"{{"stored":{{"parent_hash":{p}{start},"blocks":[{}]}}}}"#,
                        bs.join(",")
                    )
                }),
        ];
        (
            num.clone(),
            data,
            proptest::option::of(num),
            any::<bool>(),
            ws,
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..2),
        )
            .prop_map(|(id, data, dp, swap, w, muts)| {
                let mut fields = vec![
                    format!(r#""event_id":{id}"#),
                    format!(r#""data"{w}:{data}"#),
                ];
                if let Some(dp) = dp {
                    fields.push(format!(r#""dp_rank":{dp}"#));
                }
                if swap {
                    fields.rotate_left(1);
                }
                let mut bytes = format!("{w}{{{}}}{w}", fields.join(",")).into_bytes();
                for (pos, byte) in muts {
                    let n = bytes.len();
                    bytes[pos % n] = byte;
                }
                bytes
            })
    }

    #[test]
    fn canonical_spellings_take_the_fast_path() {
        let texts: &[&[u8]] = &[
            br#"{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":0,"tokens_hash":0}]}}}"#,
            // Python's json.dumps default separators.
            br#"{"event_id": 1, "data": {"stored": {"parent_hash": 5, "blocks": [{"block_hash": 1, "tokens_hash": 2}, {"block_hash": 3, "tokens_hash": 4}]}}, "dp_rank": 2}"#,
            br#"{"data":{"removed":{"block_hashes":[1,2,18446744073709551615]}},"event_id":7}"#,
            br#" {"event_id":1,"data":"cleared","dp_rank":4294967295} "#,
        ];
        for t in texts {
            let fast = fast_json::decode_event(t).expect("fast path");
            assert_eq!(Ok(fast), decode_json_event_serde(t));
        }
        let slow: &[&[u8]] = &[
            br#"{"event_id":1,"data":"cleared","dp_rank":4294967296}"#,
            br#"{"event_id":1,"event_id":2,"data":"cleared"}"#,
            br#"{"event_id":01,"data":"cleared"}"#,
            br#"{"event_id":1,"data":"cleared","extra":1}"#,
            br#"{"event_id":1,"data":{"cleared":null}}"#,
        ];
        for t in slow {
            assert!(fast_json::decode_event(t).is_none());
        }
    }

    /// JSON texts of router events: an event text (see [`event_texts`]) wrapped with a
    /// worker id and maybe a storage tier, in either order, then maybe mutated.
    fn router_event_texts() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let tier = prop_oneof![
            Just(None),
            Just(Some(r#""device""#)),
            Just(Some(r#""host_pinned""#)),
            Just(Some(r#""disk""#)),
            Just(Some(r#""external""#)),
            Just(Some(r#""gpu""#)),
            Just(Some("null")),
        ];
        let id = prop_oneof![
            any::<u64>().prop_map(|v| v.to_string()),
            Just("-3".to_owned()),
            Just("1.5".to_owned()),
        ];
        (
            id,
            tier,
            event_texts(),
            any::<bool>(),
            proptest::option::of((any::<usize>(), any::<u8>())),
        )
            .prop_map(|(id, tier, event, swap, m)| {
                let event = String::from_utf8_lossy(&event).into_owned();
                let mut fields = vec![format!(r#""worker_id":{id}"#)];
                if let Some(t) = tier {
                    fields.push(format!(r#""storage_tier": {t}"#));
                }
                fields.push(format!(r#""event":{event}"#));
                if swap {
                    fields.reverse();
                }
                let mut bytes = format!("{{{}}}", fields.join(",")).into_bytes();
                if let Some((pos, byte)) = m {
                    let n = bytes.len();
                    bytes[pos % n] = byte;
                }
                bytes
            })
    }

    #[test]
    fn canonical_router_events_take_the_fast_path() {
        let ev = RouterEvent {
            worker_id: u64::MAX,
            storage_tier: StorageTier::HostPinned,
            event: KvCacheEvent {
                event_id: 3,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: Some(ExternalSequenceBlockHash(9)),
                    start_position: Some(4),
                    blocks: vec![KvCacheStoredBlockData::new(1, 2)],
                }),
                dp_rank: 1,
            },
        };
        let text = encode_json_router_event(&ev);
        assert_eq!(
            fast_json::decode_router_event(text.as_bytes()),
            Some(ev.clone())
        );
        assert_eq!(decode_json_router_event(text.as_bytes()), Ok(ev));
        let no_tier = br#"{"worker_id":1,"event":{"event_id":0,"data":"cleared"}}"#;
        let fast = fast_json::decode_router_event(no_tier).expect("fast path");
        assert_eq!(fast.storage_tier, StorageTier::Device);
        assert_eq!(Ok(fast), decode_json_router_event_serde(no_tier));
        let slow: &[&[u8]] = &[
            br#"{"worker_id":1,"event":{"event_id":0,"data":"cleared"},"x":1}"#,
            br#"{"worker_id":1,"worker_id":2,"event":{"event_id":0,"data":"cleared"}}"#,
            br#"{"worker_id":1,"storage_tier":"Device","event":{"event_id":0,"data":"cleared"}}"#,
        ];
        for slow in slow {
            assert!(fast_json::decode_router_event(slow).is_none());
        }
    }

    proptest::proptest! {
        #[test]
        fn fast_json_router_path_agrees_with_serde(text in router_event_texts()) {
            let serde = decode_json_router_event_serde(&text);
            if let Some(fast) = fast_json::decode_router_event(&text) {
                proptest::prop_assert_eq!(Ok(fast), serde.clone(), "{}", String::from_utf8_lossy(&text));
            }
            proptest::prop_assert_eq!(decode_json_router_event(&text), serde);
        }

        #[test]
        fn fast_json_path_agrees_with_serde(text in event_texts()) {
            let serde = decode_json_event_serde(&text);
            if let Some(fast) = fast_json::decode_event(&text) {
                proptest::prop_assert_eq!(Ok(fast), serde.clone(), "{}", String::from_utf8_lossy(&text));
            }
            proptest::prop_assert_eq!(decode_json_event(&text), serde);
        }

        #[test]
        fn decoders_never_panic_on_random_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode_json_event(&bytes);
            let _ = decode_json_router_event(&bytes);
            let _ = decode_msgpack_router_event(&bytes);
        }
    }
}
