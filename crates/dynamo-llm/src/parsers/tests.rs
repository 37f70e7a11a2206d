//! Golden transcripts (`tests/data/parser_goldens.json`, shared with the end-to-end
//! tests) and the chunking property: any split of an output into pieces parses the same
//! as the whole output in one piece.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

const GOLDENS: &str = include_str!("../../../../tests/data/parser_goldens.json");

/// What an output parsed into: reasoning, content, calls (name, arguments value, id).
#[derive(Debug, Clone, PartialEq)]
struct Parsed {
    reasoning: String,
    content: String,
    calls: Vec<(String, Value, Option<String>)>,
}

fn goldens() -> (Value, Vec<Value>) {
    let v: Value = serde_json::from_str(GOLDENS).expect("valid goldens");
    let cases = v["cases"].as_array().expect("cases").clone();
    (v["tools"].clone(), cases)
}

fn parser_for(tools: &Value, case: &Value) -> ChatParser {
    let tools = tools.as_array().expect("tools");
    ChatParser::for_request(
        case["tool_parser"].as_str(),
        case["reasoning_parser"].as_str(),
        &RequestTools {
            tools: Some(tools),
            tool_choice: None,
            parallel_tool_calls: None,
        },
    )
    .expect("a parser")
}

fn run(mut p: ChatParser, pieces: &[&str]) -> Parsed {
    let mut events = Vec::new();
    for piece in pieces {
        p.feed(piece, &mut events);
    }
    p.finish(&mut events);
    let mut out = Parsed {
        reasoning: String::new(),
        content: String::new(),
        calls: Vec::new(),
    };
    for e in events {
        match e {
            ParseEvent::Reasoning(s) => out.reasoning.push_str(&s),
            ParseEvent::Content(s) => out.content.push_str(&s),
            ParseEvent::Call(c) => out.calls.push((
                c.name,
                serde_json::from_str(&c.arguments).expect("arguments are JSON"),
                c.id,
            )),
        }
    }
    out
}

fn expected(case: &Value) -> Parsed {
    Parsed {
        reasoning: case["reasoning"].as_str().unwrap_or_default().to_owned(),
        content: case["content"].as_str().unwrap_or_default().to_owned(),
        calls: case["calls"]
            .as_array()
            .expect("calls")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_owned(),
                    c["arguments"].clone(),
                    c["id"].as_str().map(str::to_owned),
                )
            })
            .collect(),
    }
}

/// `s` cut at the given sizes (rounded to char boundaries).
fn split<'a>(s: &'a str, sizes: &[usize]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut at = 0;
    for &n in sizes {
        if at >= s.len() {
            break;
        }
        let mut end = (at + n).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&s[at..end]);
        at = end;
    }
    if at < s.len() {
        pieces.push(&s[at..]);
    }
    pieces
}

#[test]
fn goldens_parse_whole_and_char_by_char() {
    let (tools, cases) = goldens();
    for case in &cases {
        let name = case["name"].as_str().unwrap_or_default();
        let output = case["output"].as_str().expect("output");
        let want = expected(case);
        let got = run(parser_for(&tools, case), &[output]);
        assert_eq!(got, want, "case {name}, one piece");
        let chars: Vec<&str> = output
            .char_indices()
            .map(|(i, c)| &output[i..i + c.len_utf8()])
            .collect();
        assert_eq!(
            run(parser_for(&tools, case), &chars),
            want,
            "case {name}, char by char"
        );
    }
}

#[test]
fn every_name_resolves_and_unknown_names_list_the_known_ones() {
    for n in tool_parser_names() {
        assert!(check_tool_parser(n).is_ok(), "{n}");
    }
    for n in reasoning_parser_names() {
        assert!(check_reasoning_parser(n).is_ok(), "{n}");
    }
    let e = check_tool_parser("nope").unwrap_err();
    assert!(e.contains("hermes") && e.contains("nope"), "{e}");
    let e = check_reasoning_parser("nope").unwrap_err();
    assert!(e.contains("deepseek_r1"), "{e}");
}

#[test]
fn tool_choice_and_parallel_calls() {
    let (tools, _) = goldens();
    let tools = tools.as_array().expect("tools").clone();
    let two = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"b\"}}</tool_call>";
    let mk = |choice: Option<Value>, parallel: Option<bool>, parser: Option<&str>| {
        ChatParser::for_request(
            parser,
            None,
            &RequestTools {
                tools: Some(&tools),
                tool_choice: choice.as_ref(),
                parallel_tool_calls: parallel,
            },
        )
    };
    // `none`: no parsing at all.
    assert!(mk(Some(Value::from("none")), None, Some("hermes")).is_none());
    // `auto` without a parser: no parsing.
    assert!(mk(None, None, None).is_none());
    // `required` without a parser: the default format.
    let p = mk(Some(Value::from("required")), None, None).expect("parser");
    assert_eq!(run(p, &[two]).calls.len(), 2);
    // `parallel_tool_calls: false`: the first call only; later sections are content.
    let p = mk(None, Some(false), Some("hermes")).expect("parser");
    let got = run(p, &[two]);
    assert_eq!(got.calls.len(), 1);
    assert!(got.content.contains("search"));
    // A named function: calls to others are content; the finish reason stays `stop`.
    let named = serde_json::json!({"type": "function", "function": {"name": "search"}});
    let mut p = mk(Some(named), None, Some("hermes")).expect("parser");
    let mut ev = Vec::new();
    p.feed(two, &mut ev);
    p.finish(&mut ev);
    assert_eq!(p.calls(), 1);
    assert!(!p.finished_with_calls());
    // No tools declared: output is text whatever the parser.
    let none = ChatParser::for_request(
        Some("hermes"),
        None,
        &RequestTools {
            tools: None,
            tool_choice: None,
            parallel_tool_calls: None,
        },
    );
    assert!(none.is_none());
}

#[test]
fn content_streams_before_the_output_ends() {
    let (tools, _) = goldens();
    let tools = tools.as_array().expect("tools").clone();
    let mut p = ChatParser::for_request(
        Some("hermes"),
        Some("basic"),
        &RequestTools {
            tools: Some(&tools),
            tool_choice: None,
            parallel_tool_calls: None,
        },
    )
    .expect("parser");
    let mut ev = Vec::new();
    p.feed("Hello wor", &mut ev);
    assert_eq!(ev, vec![ParseEvent::Content("Hello wor".into())]);
    ev.clear();
    // Only a possible marker start is held back.
    p.feed("ld <tool", &mut ev);
    assert_eq!(ev, vec![ParseEvent::Content("ld ".into())]);
    ev.clear();
    p.feed("s> here", &mut ev);
    assert_eq!(ev, vec![ParseEvent::Content("<tools> here".into())]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_chunking_parses_like_one_chunk(
        index in 0usize..1000,
        sizes in prop::collection::vec(1usize..12, 0..64),
    ) {
        let (tools, cases) = goldens();
        let case = &cases[index % cases.len()];
        let output = case["output"].as_str().expect("output");
        let whole = run(parser_for(&tools, case), &[output]);
        let pieces = split(output, &sizes);
        prop_assert_eq!(run(parser_for(&tools, case), &pieces), whole);
    }

    #[test]
    fn arbitrary_text_is_never_lost(
        parser in prop::sample::select(tool_parser_names()),
        text in "(<tool_call>|</tool_call>|<think>|</think>|\\{\"name\": \"search\", \"arguments\": \\{\\}\\}|\\[|\\]|[a-z ]|<\\||\\|>|functools|\\[TOOL_CALLS\\]){0,24}",
        sizes in prop::collection::vec(1usize..8, 0..32),
    ) {
        let (tools, _) = goldens();
        let tools = tools.as_array().expect("tools").clone();
        let mk = || ChatParser::for_request(Some(parser), Some("basic"), &RequestTools {
            tools: Some(&tools), tool_choice: None, parallel_tool_calls: None,
        }).expect("parser");
        let whole = run(mk(), &[&text]);
        prop_assert_eq!(run(mk(), &split(&text, &sizes)), whole.clone());
        // Without calls, every character comes back (reasoning or content), save the
        // markers themselves.
        if whole.calls.is_empty() {
            let back = format!("{}{}", whole.reasoning, whole.content);
            prop_assert!(back.len() <= text.len());
        }
    }
}
