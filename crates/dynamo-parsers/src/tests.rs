//! Golden transcripts (`tests/data/parser_goldens.json`, shared with the end-to-end
//! tests) and the chunking property: any split of an output into pieces parses the same
//! as the whole output in one piece.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

const GOLDENS: &str = include_str!("../../../tests/data/parser_goldens.json");

/// What an output parsed into: reasoning, content, calls (name, arguments value, id).
#[derive(Debug, Clone, PartialEq)]
struct Parsed {
    reasoning: String,
    content: String,
    calls: Vec<(String, Value, Option<String>)>,
}

/// [`Parsed`] while it is collected: arguments as text.
#[derive(Debug, Clone, Default, PartialEq)]
struct Raw {
    reasoning: String,
    content: String,
    calls: Vec<(String, String, Option<String>)>,
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

fn run(p: ChatParser, pieces: &[&str]) -> Parsed {
    let out = run_raw(p, pieces);
    Parsed {
        reasoning: out.reasoning,
        content: out.content,
        calls: out
            .calls
            .into_iter()
            .map(|(n, a, id)| (n, arguments_value(&a), id))
            .collect(),
    }
}

/// The events of an output fed in `pieces`, collected as text.
fn run_raw(mut p: ChatParser, pieces: &[&str]) -> Raw {
    let mut events = Vec::new();
    for piece in pieces {
        p.feed(piece, &mut events);
    }
    p.finish(&mut events);
    let mut out = Raw::default();
    for e in events {
        match e {
            ParseEvent::Reasoning(s) => out.reasoning.push_str(&s),
            ParseEvent::Content(s) => out.content.push_str(&s),
            ParseEvent::CallStart { name, id } => out.calls.push((name, String::new(), id)),
            ParseEvent::CallArgs(a) => out
                .calls
                .last_mut()
                .expect("arguments follow a call start")
                .1
                .push_str(&a),
        }
    }
    out
}

/// Arguments as a JSON value; text that is not JSON (a call cut short after its
/// arguments began streaming) as a string.
fn arguments_value(a: &str) -> Value {
    serde_json::from_str(a).unwrap_or_else(|_| Value::String(a.to_owned()))
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
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap_or_default();
        let output = case["output"].as_str().expect("output");
        let want = expected(case);
        let got = run(parser_for(&tools, case), &[output]);
        if got != want {
            failures.push(format!("{name}: got {got:?}"));
            continue;
        }
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
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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

/// Feed `output` char by char; each event with the byte offset (in `output`) of the end
/// of the piece that produced it.
fn timed_events(mut p: ChatParser, output: &str) -> Vec<(usize, ParseEvent)> {
    let mut timed = Vec::new();
    let mut ev = Vec::new();
    for (i, c) in output.char_indices() {
        p.feed(&output[i..i + c.len_utf8()], &mut ev);
        timed.extend(ev.drain(..).map(|e| (i + c.len_utf8(), e)));
    }
    p.finish(&mut ev);
    timed.extend(ev.drain(..).map(|e| (output.len() + 1, e)));
    timed
}

/// The formats whose arguments stream.
const STREAMING: &[&str] = &[
    "hermes",
    "qwen25",
    "default",
    "llama3_json",
    "mistral",
    "deepseek_v3",
    "deepseek_v3_1",
    "kimi_k2",
    "phi4",
    "jamba",
    "nemotron_deci",
    "harmony",
];

#[test]
fn names_go_out_first_and_arguments_stream_as_they_arrive() {
    let (tools, cases) = goldens();
    let mut streamed = 0;
    for case in &cases {
        let name = case["name"].as_str().unwrap_or_default();
        let output = case["output"].as_str().expect("output");
        let parser = case["tool_parser"].as_str().unwrap_or_default();
        if !STREAMING.contains(&parser) {
            continue;
        }
        let timed = timed_events(parser_for(&tools, case), output);
        for (k, (at, e)) in timed.iter().enumerate() {
            let ParseEvent::CallStart { name: f, .. } = e else {
                continue;
            };
            let args: Vec<&(usize, ParseEvent)> = timed[k + 1..]
                .iter()
                .take_while(|(_, e)| matches!(e, ParseEvent::CallArgs(_)))
                .collect();
            let text: String = args
                .iter()
                .map(|(_, e)| match e {
                    ParseEvent::CallArgs(a) => a.as_str(),
                    _ => "",
                })
                .collect();
            if !text.starts_with('{') || text.len() < 3 || !output.contains(&text) {
                // Arguments written as a JSON string: sent whole at the end.
                continue;
            }
            // The name goes out when the arguments' `{` arrives, and they follow a
            // character at a time.
            let open = output[..*at].rfind('{').expect("the arguments' brace");
            assert_eq!(
                *at,
                open + 1,
                "case {name}: call {f} starts at {at}, its arguments at {open}"
            );
            assert_eq!(
                args.len(),
                text.chars().count(),
                "case {name}: call {f} pieces {args:?}"
            );
            streamed += 1;
        }
    }
    assert!(streamed >= 20, "{streamed} streamed calls");
}

#[test]
fn leading_text_that_cannot_be_a_call_is_released_at_once() {
    let (tools, _) = goldens();
    let tools = tools.as_array().expect("tools").clone();
    let mk = |parser| {
        ChatParser::for_request(
            Some(parser),
            None,
            &RequestTools {
                tools: Some(&tools),
                tool_choice: None,
                parallel_tool_calls: None,
            },
        )
        .expect("parser")
    };
    for (parser, first, judged) in [
        ("pythonic", "[1", "]"),
        ("default", "[", "1] is"),
        ("llama3_json", "{", "x"),
        ("llama3_json", "{\"name\": \"rm", "_rf\""),
        ("pythonic", "[rm_rf", "("),
    ] {
        let mut p = mk(parser);
        let mut ev = Vec::new();
        p.feed(first, &mut ev);
        assert!(ev.is_empty(), "{parser} {first:?}: {ev:?}");
        p.feed(judged, &mut ev);
        assert_eq!(
            ev,
            vec![ParseEvent::Content(format!("{first}{judged}"))],
            "{parser}"
        );
    }
    // A possible call is held until it is judged.
    let mut p = mk("pythonic");
    let mut ev = Vec::new();
    p.feed("[search(", &mut ev);
    p.feed("query='x'", &mut ev);
    assert!(ev.is_empty(), "{ev:?}");
}

/// Pieces of every format's markup, for text that exercises all the parsers' states.
const SOUP: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_calls>",
    "</tool_calls>",
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<think>",
    "</think>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "functools",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "function",
    "```json\n",
    "```",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.get_weather:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|channel|>",
    "analysis",
    "final",
    "commentary to=functions.search",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|start|>",
    "<function=get_weather>",
    "<parameter=city>",
    "</parameter>",
    "</function>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<invoke name=\"search\">",
    "<parameter name=\"query\">",
    "</invoke>",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<｜DSML｜function_calls>",
    "<｜DSML｜invoke name=\"search\">",
    "{\"name\": \"get_weather\", \"arguments\": ",
    "{\"name\": \"rm\", \"parameters\": ",
    "{\"city\": \"x\"}",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    ",",
    ";",
    "get_weather(",
    "city='a'",
    ")",
    "search",
    " ",
    "\n",
    "é",
    "東",
    "🗼",
    "◁think▷",
    "◁/think▷",
    "[THINK]",
    "[/THINK]",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// What the fuzz target checks, on markup soup: no panic, and any chunking parses
    /// exactly as one chunk, for every tool parser with every reasoning parser (or none)
    /// and with `parallel_tool_calls: false`.
    #[test]
    fn markup_soup_chunks_like_one_chunk(
        parser in prop::sample::select(tool_parser_names()),
        reasoning in prop::option::of(prop::sample::select(reasoning_parser_names())),
        words in prop::collection::vec(prop::sample::select(SOUP), 0..40),
        sizes in prop::collection::vec(1usize..10, 0..48),
        single in any::<bool>(),
    ) {
        let text: String = words.concat();
        let (tools, _) = goldens();
        let tools = tools.as_array().expect("tools").clone();
        let req = RequestTools {
            tools: Some(&tools),
            tool_choice: None,
            parallel_tool_calls: single.then_some(false),
        };
        let mk = || ChatParser::for_request(Some(parser), reasoning, &req).expect("parser");
        let whole = run_raw(mk(), &[&text]);
        prop_assert_eq!(run_raw(mk(), &split(&text, &sizes)), whole);
    }

    #[test]
    fn any_chunking_parses_like_one_chunk(
        index in 0usize..1000,
        sizes in prop::collection::vec(1usize..12, 0..64),
    ) {
        let (tools, cases) = goldens();
        let case = &cases[index % cases.len()];
        let output = case["output"].as_str().expect("output");
        let pieces = split(output, &sizes);
        // Exact text: the concatenated argument pieces of a streamed call are the
        // arguments of the output parsed whole (not merely the same JSON value).
        let whole = run_raw(parser_for(&tools, case), &[output]);
        prop_assert_eq!(run_raw(parser_for(&tools, case), &pieces), whole);
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
        let whole = run_raw(mk(), &[&text]);
        prop_assert_eq!(run_raw(mk(), &split(&text, &sizes)), whole.clone());
        // Without calls, every character comes back (reasoning or content), save the
        // markers themselves.
        if whole.calls.is_empty() {
            let back = format!("{}{}", whole.reasoning, whole.content);
            prop_assert!(back.len() <= text.len());
        }
    }

    /// Text that holds no marker comes back exactly, as content, whatever the parser
    /// and the chunking: including text that starts like a leading call (`[`, `{`,
    /// `{"name": "`) and blanks.
    #[test]
    fn text_without_markers_comes_back_exactly(
        parser in prop::sample::select(tool_parser_names()),
        text in "(\\[|\\{| \\[|\n\\{\"name\": \"|\\[search)?[a-z0-9 \n{}\\[\\]():,;\"'=_.é東-]{0,40}",
        sizes in prop::collection::vec(1usize..8, 0..32),
    ) {
        // Letters alone can spell these two markers; nothing else in the alphabet can
        // make one (every other marker has `<`, `|`, `◁` or capitals).
        prop_assume!(!text.contains("functools") && !text.contains("Here is my"));
        let (tools, _) = goldens();
        let tools = tools.as_array().expect("tools").clone();
        let mk = || ChatParser::for_request(Some(parser), Some("basic"), &RequestTools {
            tools: Some(&tools), tool_choice: None, parallel_tool_calls: None,
        }).expect("parser");
        for pieces in [vec![text.as_str()], split(&text, &sizes)] {
            let got = run_raw(mk(), &pieces);
            if got.calls.is_empty() {
                prop_assert_eq!(&got.reasoning, "");
                prop_assert_eq!(&got.content, &text);
            }
        }
    }
}
