//! Block hashes equal the reference implementation's on the committed golden vectors
//! (`tests/data/block_hash_vectors.json`, generated once from the reference wheel).

use dynamo_kv_router::hashing::{BlockExtraInfo, BlockHashOptions, compute_block_hash_for_seq};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/block_hash_vectors.json"
    );
    let text = std::fs::read_to_string(path).expect("golden vectors file is committed");
    serde_json::from_str(&text).expect("golden vectors are valid JSON")
}

/// The generator of `generate_block_hash_vectors.py`: a 64-bit LCG reduced to a vocabulary.
fn lcg_tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % 152_064) as u32
        })
        .collect()
}

fn tokens(spec: &Value) -> Vec<u32> {
    match spec {
        Value::Array(items) => items
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .expect("u32 token")
            })
            .collect(),
        Value::Object(o) => lcg_tokens(
            o["seed"].as_u64().expect("seed"),
            o["n"].as_u64().expect("n") as usize,
        ),
        other => panic!("bad token spec {other}"),
    }
}

#[test]
fn local_hashes_equal_reference() {
    let doc = vectors();
    let cases = doc["vectors"].as_array().expect("vectors");
    assert!(cases.len() >= 80, "vectors file looks truncated");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let opts = &case["options"];
        let mm: Option<Vec<Option<BlockExtraInfo>>> = opts
            .get("block_mm_infos")
            .map(|v| serde_json::from_value(v.clone()).expect("mm infos deserialize"));
        let options = BlockHashOptions {
            block_mm_infos: mm.as_deref(),
            lora_name: opts.get("lora_name").and_then(Value::as_str),
            cache_namespace: opts.get("cache_namespace").and_then(Value::as_str),
            is_eagle: opts
                .get("is_eagle")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        let bs = case["kv_block_size"].as_u64().expect("block size") as usize;
        let got: Vec<u64> = compute_block_hash_for_seq(&tokens(&case["tokens"]), bs, &options)
            .expect("non-zero block size")
            .into_iter()
            .map(|h| h.0)
            .collect();
        assert_eq!(
            got.len() as u64,
            case["count"].as_u64().expect("count"),
            "{name}"
        );
        if let Some(expected) = case.get("expected") {
            let expected: Vec<u64> = serde_json::from_value(expected.clone()).expect("u64s");
            assert_eq!(got, expected, "{name}");
        } else {
            let head: Vec<u64> =
                serde_json::from_value(case["expected_head"].clone()).expect("u64s");
            assert_eq!(&got[..head.len()], &head[..], "{name}");
            let mut hasher = Sha256::new();
            for v in &got {
                hasher.update(v.to_le_bytes());
            }
            let digest: String = hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                digest,
                case["expected_sha256"].as_str().expect("sha"),
                "{name}"
            );
        }
    }
}
