//! Fuzz the KV-event decoders with untrusted bytes: they must never panic, everything they
//! accept must re-encode to an equal event, and applying it must keep the tree consistent.
//!
//! Run: `cargo +nightly fuzz run decode_event` (from the repository root).
#![no_main]

use dynamo_kv_router::indexer::RadixTree;
use dynamo_kv_router::protocols::{
    decode_json_event, decode_json_event_serde, decode_json_router_event,
    decode_json_router_event_serde, decode_msgpack_router_event, encode_json_router_event, encode_msgpack_router_event,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut tree = RadixTree::default();
    // The fast JSON path must agree with serde_json on every input.
    assert_eq!(decode_json_event(data), decode_json_event_serde(data));
    assert_eq!(
        decode_json_router_event(data),
        decode_json_router_event_serde(data)
    );
    if let Ok(ev) = decode_json_event(data) {
        let _ = tree.apply_event(1, &ev);
        let _ = tree.apply_event(1, &ev);
        tree.check_invariants();
    }
    for decoded in [
        decode_json_router_event(data),
        decode_msgpack_router_event(data),
    ] {
        if let Ok(ev) = decoded {
            let json = encode_json_router_event(&ev);
            assert_eq!(
                decode_json_router_event(json.as_bytes()).ok(),
                Some(ev.clone())
            );
            let mp = encode_msgpack_router_event(&ev).expect("encodable");
            assert_eq!(decode_msgpack_router_event(&mp).ok(), Some(ev.clone()));
            let _ = tree.apply_event(ev.worker_id, &ev.event);
            tree.check_invariants();
        }
    }
});
