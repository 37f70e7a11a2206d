//! Per-request CPU cost of the frontend's model work on the tiny model: parsing, templating
//! and tokenizing a chat request, and detokenizing plus stop-checking 16 output tokens.
//!
//! ```text
//! cargo bench -p dynamo-llm --bench preprocess
//! ```

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_llm::preprocessor::{LLMEngineOutput, Preprocessor, openai};

const BODY: &[u8] = br#"{"model": "tiny", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a story about a dragon who learned to count tokens."}
], "max_tokens": 16, "stream": true, "stop": ["The end"]}"#;

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

criterion_group!(benches, preprocess);
criterion_main!(benches);
