//! Parse cost per output token of every tool-call / reasoning parser family: a ~2k-token
//! output (prose, then a call whose arguments are long) fed one 4-byte token at a time,
//! as the frontend feeds detokenized text. `baseline_copy` is what the frontend does with
//! each token without a parser (copy it into an event), measured in the same run.
//! Throughput is in tokens: ns/token = 1e3 / (Melem/s).
//!
//! ```text
//! cargo bench -p dynamo-parsers --bench parsers -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_parsers::{ChatParser, ParseEvent, RequestTools};

/// Output tokens per run: the issue's 2k-token output.
const TOKENS: usize = 2048;
/// Bytes per token: English text averages about four.
const TOKEN_BYTES: usize = 4;

/// `bytes` of prose.
fn prose(bytes: usize) -> String {
    let line = "The quick brown fox jumps over the lazy dog, then checks the weather. ";
    line.repeat(bytes / line.len() + 1)[..bytes].to_owned()
}

/// The output of each family: about 3/4 prose (content or reasoning), then one call whose
/// `query` argument fills the rest.
fn outputs() -> Vec<(
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    String,
)> {
    let total = TOKENS * TOKEN_BYTES;
    let text = prose(total * 3 / 4);
    let q = prose(total / 4);
    vec![
        (
            "hermes",
            Some("hermes"),
            None,
            format!(
                "{text}<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"query\": \"{q}\"}}}}\n</tool_call>"
            ),
        ),
        (
            "llama3_json",
            Some("llama3_json"),
            None,
            format!("{{\"name\": \"search\", \"parameters\": {{\"query\": \"{text}{q}\"}}}}"),
        ),
        (
            "pythonic",
            Some("pythonic"),
            None,
            format!("[search(query='{text}{q}')]"),
        ),
        (
            "qwen3_coder",
            Some("qwen3_coder"),
            None,
            format!(
                "{text}<tool_call>\n<function=search>\n<parameter=query>\n{q}\n</parameter>\n</function>\n</tool_call>"
            ),
        ),
        (
            "deepseek_v3_1",
            Some("deepseek_v3_1"),
            None,
            format!(
                "{text}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{{\"query\": \"{q}\"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            ),
        ),
        (
            "kimi_k2",
            Some("kimi_k2"),
            None,
            format!(
                "{text}<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{{\"query\": \"{q}\"}}<|tool_call_end|><|tool_calls_section_end|>"
            ),
        ),
        (
            "harmony",
            Some("harmony"),
            Some("gpt_oss"),
            format!(
                "<|channel|>analysis<|message|>{text}<|end|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{{\"query\": \"{q}\"}}<|call|>"
            ),
        ),
        (
            "mistral",
            Some("mistral"),
            None,
            format!("{text}[TOOL_CALLS]search[ARGS]{{\"query\": \"{q}\"}}"),
        ),
        (
            "reasoning_basic",
            None,
            Some("basic"),
            format!("<think>{text}</think>{q}"),
        ),
        (
            "reasoning_deepseek_r1",
            None,
            Some("deepseek_r1"),
            format!("{text}</think>{q}"),
        ),
    ]
}

/// `s` in tokens of about `TOKEN_BYTES` bytes (cut at char boundaries).
fn tokens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < s.len() {
        let mut end = (at + TOKEN_BYTES).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[at..end]);
        at = end;
    }
    out
}

fn parsers(c: &mut Criterion) {
    let tools = vec![serde_json::json!({"type": "function", "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}})];
    let req = RequestTools {
        tools: Some(&tools),
        tool_choice: None,
        parallel_tool_calls: None,
    };
    let mut group = c.benchmark_group("parsers");
    let all = outputs();
    // The baseline: each token copied into an event, as without a parser.
    let (_, _, _, first) = &all[0];
    let toks = tokens(first);
    group.throughput(Throughput::Elements(toks.len() as u64));
    group.bench_function("baseline_copy", |b| {
        b.iter(|| {
            let mut ev = Vec::new();
            for t in &toks {
                ev.push(ParseEvent::Content(black_box(*t).to_owned()));
                black_box(&ev);
                ev.clear();
            }
        });
    });
    for (name, tool, reasoning, output) in &all {
        let toks = tokens(output);
        let fresh = || ChatParser::for_request(*tool, *reasoning, &req).expect("a parser");
        // The parse must find the call (or the reasoning): a bench of a no-op is void.
        let mut ev = Vec::new();
        let mut p = fresh();
        for t in &toks {
            p.feed(t, &mut ev);
        }
        p.finish(&mut ev);
        assert!(
            ev.iter().any(|e| matches!(e, ParseEvent::CallStart { .. }))
                || ev.iter().any(|e| matches!(e, ParseEvent::Reasoning(_))),
            "{name}: nothing parsed"
        );
        group.throughput(Throughput::Elements(toks.len() as u64));
        group.bench_function(*name, |b| {
            b.iter(|| {
                let mut p = fresh();
                let mut ev = Vec::new();
                for t in &toks {
                    p.feed(black_box(t), &mut ev);
                    black_box(&ev);
                    ev.clear();
                }
                p.finish(&mut ev);
                black_box(ev)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, parsers);
criterion_main!(benches);
