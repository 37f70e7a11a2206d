//! Per-request CPU cost of the frontend's model work on the tiny model: parsing, templating
//! and tokenizing a chat request, and detokenizing plus stop-checking 16 output tokens; and
//! the per-phase costs of the serving hot path (issue 19): the request-plane encoding of
//! the preprocessed request, decoding 16 worker items, detokenizing 16 tokens (through the
//! tokenizer and through the per-id byte table) and formatting 16 SSE chunks (through the
//! chunk structs and `serde_json`, and through the direct writer).
//!
//! Tokenisation is measured through `Preprocessor::encode` (the fast path of
//! `preprocessor/fast_encode.rs` for this tokenizer) and through the tokenizer's own
//! `encode_fast`, for the chat prompt and a long (about 10k-token) text.
//!
//! ```text
//! cargo bench -p dynamo-llm --bench preprocess
//! ```

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_llm::engines::Annotated;
use dynamo_llm::preprocessor::{LLMEngineOutput, OutputProcessor, Preprocessor, openai};
use dynamo_runtime::transport::codec;

const BODY: &[u8] = br#"{"model": "tiny", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a story about a dragon who learned to count tokens."}
], "max_tokens": 16, "stream": true, "stop": ["The end"]}"#;

/// The request of `benches/bench_frontend.py` (no stop strings).
const BENCH_BODY: &[u8] = br#"{"model": "tiny", "messages": [{"role": "user", "content": "Tell me about routing."}], "max_tokens": 16, "stream": true}"#;

fn preprocess(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model");
    let pre = Preprocessor::from_model_dir(&dir, "tiny").expect("tiny model");
    let output_ids = pre
        .encode(
            "Once upon a time there was a small model that answered every question politely. Hello! How are you today?",
            false,
        )
        .expect("encode");
    let output_ids = &output_ids[..16];

    c.bench_function("parse_template_tokenize_chat", |b| {
        b.iter(|| {
            let req = openai::parse_chat_request(black_box(BODY)).expect("parse");
            black_box(pre.preprocess_chat(&req).expect("preprocess"))
        });
    });

    let req = openai::parse_chat_request(BODY).expect("parse");
    c.bench_function("parse_chat", |b| {
        b.iter(|| black_box(openai::parse_chat_request(black_box(BODY)).expect("parse")));
    });
    c.bench_function("render_chat_template", |b| {
        b.iter(|| black_box(pre.render_chat(&req).expect("render")));
    });
    let prompt = pre.render_chat(&req).expect("render");
    c.bench_function("tokenize_prompt", |b| {
        b.iter(|| black_box(pre.encode(black_box(&prompt), false).expect("encode")));
    });
    // The same prompt through the tokenizer's own `encode_fast` (what `encode` did before
    // `fast_encode.rs`), and a long (about 10k-token) prompt both ways.
    c.bench_function("tokenize_prompt_tokenizer", |b| {
        b.iter(|| {
            black_box(
                pre.tokenizer()
                    .encode_fast(black_box(prompt.as_str()), false),
            )
        });
    });
    let long = "The quick brown fox, 42 times over, jumps; it's the routing's cache that counts!\n"
        .repeat(400);
    c.bench_function("tokenize_long_prompt", |b| {
        b.iter(|| black_box(pre.encode(black_box(&long), false).expect("encode")));
    });
    c.bench_function("tokenize_long_prompt_tokenizer", |b| {
        b.iter(|| black_box(pre.tokenizer().encode_fast(black_box(long.as_str()), false)));
    });
    let wire = pre.preprocess_chat(&req).expect("preprocess");
    c.bench_function("detokenize_16_tokens_with_stop_string", |b| {
        b.iter(|| {
            let mut p = pre.output_processor(&wire);
            let mut n = 0;
            for &id in output_ids {
                let out = p
                    .process(&LLMEngineOutput {
                        token_ids: vec![id],
                        ..Default::default()
                    })
                    .expect("process");
                n += out.text.len();
            }
            black_box(n)
        });
    });
}

fn hot_path(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model");
    let pre = Preprocessor::from_model_dir(&dir, "tiny").expect("tiny model");
    assert!(pre.wait_token_bytes(), "byte-level tokenizer");
    let output_ids = pre
        .encode(
            "Once upon a time there was a small model that answered every question politely. Hello! How are you today?",
            false,
        )
        .expect("encode");
    let output_ids = &output_ids[..16];
    let req = openai::parse_chat_request(BENCH_BODY).expect("parse");
    c.bench_function("hot/parse_template_tokenize_chat", |b| {
        b.iter(|| {
            let req = openai::parse_chat_request(black_box(BENCH_BODY)).expect("parse");
            black_box(pre.preprocess_chat(&req).expect("preprocess"))
        });
    });
    let wire = pre.preprocess_chat(&req).expect("preprocess");
    c.bench_function("hot/request_plane_encode_request", |b| {
        b.iter(|| black_box(codec::encode(black_box(&wire)).expect("encode")));
    });
    let items: Vec<Vec<u8>> = output_ids
        .iter()
        .map(|&id| {
            codec::encode(&Annotated::data(LLMEngineOutput {
                token_ids: vec![id],
                ..Default::default()
            }))
            .expect("encode")
        })
        .collect();
    c.bench_function("hot/request_plane_decode_16_items", |b| {
        b.iter(|| {
            let mut n = 0;
            for item in &items {
                let a: Annotated<LLMEngineOutput> = codec::decode(black_box(item)).expect("decode");
                n += a.data.map_or(0, |d| d.token_ids.len());
            }
            black_box(n)
        });
    });
    let detokenize = |mut p: OutputProcessor| {
        let mut n = 0;
        for &id in output_ids {
            let out = p
                .process(&LLMEngineOutput {
                    token_ids: vec![id],
                    ..Default::default()
                })
                .expect("process");
            n += out.text.len();
        }
        n
    };
    c.bench_function("hot/detokenize_16_tokens_tokenizer", |b| {
        b.iter(|| {
            let p = OutputProcessor::new(&wire, Some(std::sync::Arc::clone(pre.tokenizer())));
            black_box(detokenize(p))
        });
    });
    c.bench_function("hot/detokenize_16_tokens_table", |b| {
        b.iter(|| black_box(detokenize(pre.output_processor(&wire))));
    });
    let texts: Vec<String> = output_ids
        .iter()
        .map(|&id| pre.tokenizer().decode(&[id], true).expect("decode"))
        .collect();
    let factory = openai::ResponseFactory::new("chatcmpl-0123456789abcdef0123456789abcdef", "tiny");
    c.bench_function("hot/sse_format_16_chunks_serde", |b| {
        b.iter(|| {
            let mut frame = Vec::new();
            for (i, t) in texts.iter().enumerate() {
                let chunk = factory.chat_chunk_at(0, Some(t.clone()), i == 0, None);
                let json = serde_json::to_vec(&chunk).expect("json");
                let mut sse = Vec::with_capacity(json.len() + 8);
                sse.extend_from_slice(b"data: ");
                sse.extend_from_slice(&json);
                sse.extend_from_slice(b"\n\n");
                frame.extend_from_slice(&sse);
            }
            black_box(frame)
        });
    });
    c.bench_function("hot/sse_format_16_chunks_writer", |b| {
        b.iter(|| {
            let writer = openai::SseChunkWriter::chat(&factory);
            let mut frame = Vec::with_capacity(512);
            for (i, t) in texts.iter().enumerate() {
                writer.write(&mut frame, 0, t, i == 0, None);
            }
            black_box(frame)
        });
    });
}

criterion_group!(benches, preprocess, hot_path);
criterion_main!(benches);
