//! Fuzz the tool-call and reasoning parsers with arbitrary model output: no input may
//! panic, and cutting the output into arbitrary chunks must parse exactly as the whole
//! output in one chunk (the property `crates/dynamo-llm/src/parsers/tests.rs` checks on
//! generated text, here on any bytes).
//!
//! Run: `cargo +nightly fuzz run parsers` (from the repository root).
#![no_main]

use dynamo_parsers::{
    ChatParser, ParseEvent, RequestTools, reasoning_parser_names, tool_parser_names,
};
use libfuzzer_sys::fuzz_target;

/// What an output parsed into, with every call's arguments concatenated.
#[derive(Debug, Default, PartialEq)]
struct Parsed {
    reasoning: String,
    content: String,
    calls: Vec<(String, Option<String>, String)>,
}

fn run(mut p: ChatParser, pieces: &[&str]) -> Parsed {
    let mut ev = Vec::new();
    for piece in pieces {
        p.feed(piece, &mut ev);
    }
    p.finish(&mut ev);
    let mut out = Parsed::default();
    for e in ev {
        match e {
            ParseEvent::Reasoning(s) => out.reasoning.push_str(&s),
            ParseEvent::Content(s) => out.content.push_str(&s),
            ParseEvent::CallStart { name, id } => out.calls.push((name, id, String::new())),
            ParseEvent::CallArgs(a) => match out.calls.last_mut() {
                Some(c) => c.2.push_str(&a),
                None => panic!("arguments before any call start"),
            },
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    // Byte 0 picks the tool parser, byte 1 the reasoning parser (or none), byte 2 the
    // chunking seed; the rest is the output.
    let [t, r, seed, rest @ ..] = data else {
        return;
    };
    let tool_names = tool_parser_names();
    let reasoning_names = reasoning_parser_names();
    let tool = tool_names[usize::from(*t) % tool_names.len()];
    let reasoning = reasoning_names.get(usize::from(*r) % (reasoning_names.len() + 1));
    let text = String::from_utf8_lossy(rest);
    let tools = vec![
        serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
        serde_json::json!({"type": "function", "function": {"name": "search"}}),
    ];
    let req = RequestTools {
        tools: Some(&tools),
        tool_choice: None,
        parallel_tool_calls: (*seed & 0x80 != 0).then_some(false),
    };
    let mk = || ChatParser::for_request(Some(tool), reasoning.copied(), &req);
    let Some(p) = mk() else {
        return;
    };
    let whole = run(p, &[&text]);
    // Chunks of 1..=8 bytes (widened to char boundaries), sizes from a tiny LCG.
    let mut pieces = Vec::new();
    let mut state = u32::from(*seed) | 1;
    let mut at = 0;
    while at < text.len() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let mut end = (at + 1 + (state >> 16) as usize % 8).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[at..end]);
        at = end;
    }
    let chunked = run(mk().expect("same parser"), &pieces);
    assert_eq!(whole, chunked, "{tool} / {reasoning:?}: {pieces:?}");
});
