use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;

use super::detokenizer::{IncrementalDecoder, TokenBytes};
use super::openai::{parse_chat_request, parse_completion_request};
use super::*;

fn tiny() -> Preprocessor {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model");
    Preprocessor::from_model_dir(&dir, "tiny").expect("tiny model")
}

fn chat(body: &str) -> ChatCompletionRequest {
    parse_chat_request(body.as_bytes()).expect(body)
}

#[test]
fn eos_ids_come_from_generation_config_config_and_template() {
    let pre = tiny();
    let im_end = pre.tokenizer().token_to_id("<|im_end|>").expect("im_end");
    let eot = pre.tokenizer().token_to_id("<|endoftext|>").expect("eot");
    assert_eq!(pre.eos_token_ids(), [im_end, eot]);
}

#[test]
fn chat_request_is_templated_and_tokenized() {
    let pre = tiny();
    let req = chat(
        r#"{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hello!"}]}],"stop":"END","temperature":0.5,"max_tokens":5}"#,
    );
    let prompt = pre.render_chat(&req).expect("render");
    assert_eq!(
        prompt,
        "<|endoftext|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
    let wire = pre.preprocess_chat(&req).expect("preprocess");
    assert_eq!(wire.token_ids, pre.encode(&prompt, false).expect("encode"));
    assert_eq!(
        wire.token_ids[0],
        pre.tokenizer().token_to_id("<|endoftext|>").expect("bos")
    );
    assert_eq!(
        wire.stop_conditions.stop.as_deref(),
        Some(&["END".to_owned()][..])
    );
    assert_eq!(wire.stop_conditions.max_tokens, Some(5));
    assert_eq!(wire.sampling_options.temperature, Some(0.5));
    assert_eq!(wire.model, "tiny");
    assert!(wire.mdc_sum.is_some());
}

#[test]
fn template_rejection_is_a_400() {
    let pre = tiny();
    let req = chat(r#"{"model":"tiny","messages":[{"role":"function","content":"x"}]}"#);
    let err = pre.preprocess_chat(&req).expect_err("unknown role");
    assert_eq!(err.http_status(), 400);
    assert!(err.to_string().contains("unknown role: function"), "{err}");
}

#[test]
fn context_length_is_enforced() {
    let pre = tiny();
    let req = chat(r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}]}"#);
    let wire = pre.preprocess_chat(&req).expect("ok");
    // Without max_tokens: the model's max_new_tokens (256), which fits the context; the
    // room left in the context without one (a_chat_request_without_max_tokens_... and
    // without_max_new_tokens_... below).
    assert_eq!(
        wire.stop_conditions.max_tokens,
        Some(256),
        "defaults to the model's max_new_tokens"
    );
    let req =
        chat(r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":9000}"#);
    let err = pre.preprocess_chat(&req).expect_err("too long");
    assert!(
        err.to_string().contains("maximum context length is 8192"),
        "{err}"
    );
    assert_eq!(err.http_status(), 400);
}

/// Prompts far longer than the context are refused by the piecewise count ("at least"),
/// whichever part of the request holds the text; a long prompt that fits is tokenised as a
/// whole, as before.
#[test]
fn prompts_longer_than_the_context_are_refused_before_whole_tokenisation() {
    let pre = tiny();
    let long = "hello world ".repeat(200_000);
    let body = serde_json::json!({"model": "tiny", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": long}]},
    ]});
    let err = pre
        .preprocess_chat(&chat(&body.to_string()))
        .expect_err("too long");
    assert!(err.to_string().contains("at least"), "{err}");
    assert_eq!(err.http_status(), 400);
    // Text the message count does not see (tools) is counted on the rendered prompt.
    let body = serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": long}}]});
    let template_with_tools = pre.preprocess_chat(&chat(&body.to_string()));
    // The tiny template ignores tools: the prompt is short and fits.
    assert!(template_with_tools.is_ok());
    let r = parse_completion_request(
        serde_json::json!({"model": "tiny", "prompt": long})
            .to_string()
            .as_bytes(),
    )
    .expect("parse");
    let err = pre.preprocess_completion(&r).expect_err("too long");
    assert!(err.to_string().contains("at least"), "{err}");
    assert_eq!(
        err,
        Error::request(err.to_string(), Some("prompt")),
        "names the prompt"
    );
    // Just under the piecewise threshold: tokenised whole, exact count in the message.
    let fits = "hello ".repeat(1000);
    let r = parse_completion_request(
        serde_json::json!({"model": "tiny", "prompt": fits})
            .to_string()
            .as_bytes(),
    )
    .expect("parse");
    assert!(pre.preprocess_completion(&r).is_ok());
}

#[test]
fn completion_prompts() {
    let pre = tiny();
    let r = parse_completion_request(br#"{"model":"tiny","prompt":"Hello"}"#).expect("parse");
    let wire = pre.preprocess_completion(&r).expect("ok");
    assert_eq!(
        wire.stop_conditions.max_tokens,
        Some(DEFAULT_COMPLETION_MAX_TOKENS)
    );
    assert_eq!(
        pre.tokenizer().decode(&wire.token_ids, false).expect("dec"),
        "Hello"
    );
    let r = parse_completion_request(br#"{"model":"tiny","prompt":[5,6,7],"max_tokens":3}"#)
        .expect("parse");
    assert_eq!(
        pre.preprocess_completion(&r).expect("ok").token_ids,
        [5, 6, 7]
    );
    let r = parse_completion_request(br#"{"model":"tiny","prompt":[999999]}"#).expect("parse");
    assert!(
        pre.preprocess_completion(&r)
            .expect_err("oov")
            .to_string()
            .contains("vocabulary")
    );
}

#[test]
fn openai_client_fields_are_accepted() {
    // What the official `openai` client and common tools send.
    let req = chat(
        r#"{"model":"m","messages":[{"role":"developer","content":"x"},{"role":"user","content":"y","name":"bob"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","content":"r","tool_call_id":"1"}],
        "stream":true,"stream_options":{"include_usage":true},"n":1,"logprobs":false,"top_logprobs":0,"user":"u",
        "store":false,"metadata":{"a":"b"},"parallel_tool_calls":true,"tools":[],"tool_choice":"auto",
        "response_format":{"type":"text"},"seed":1,"frequency_penalty":0,"presence_penalty":0,
        "logit_bias":{"5":1},"max_completion_tokens":10,"service_tier":"auto","top_k":5,"ignore_eos":true,
        "chat_template_kwargs":{"enable_thinking":false},"nvext":{"annotations":["x"]}}"#,
    );
    assert!(req.include_usage() && req.is_stream());
    assert_eq!(req.max_output_tokens(), Some(10));
    assert_eq!(req.ext().top_k, Some(5));
    let r = parse_completion_request(br#"{"model":"m","prompt":"x","echo":false,"best_of":1,"logprobs":0,"suffix":"","user":"u","stream":false}"#);
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn invalid_requests_name_the_parameter() {
    for (body, param, needle) in [
        (
            r#"{"model":"m","messages":[],"bogus":1}"#,
            "bogus",
            "Unrecognized request argument supplied: bogus",
        ),
        (r#"{"model":"m","messages":[]}"#, "messages", "too short"),
        (
            r#"{"model":"m"}"#,
            "messages",
            "Missing required parameter: 'messages'",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
            "temperature",
            "temperature",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}"#,
            "top_p",
            "top_p",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":129}"#,
            "n",
            "n must be between 1 and 128, got 129",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
            "max_tokens",
            "at least 1",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
            "stream_options",
            "only allowed",
        ),
    ] {
        let err = parse_chat_request(body.as_bytes()).expect_err(body);
        let Error::InvalidRequest { message, param: p } = &err else {
            panic!("{err:?}")
        };
        assert!(message.contains(needle), "{body}: {message}");
        assert_eq!(p.as_deref(), Some(param), "{body}");
        assert_eq!(err.http_status(), 400);
        assert_eq!(
            err.openai_error_body()["error"]["type"],
            "invalid_request_error"
        );
    }
    let err = parse_chat_request(b"{not json").expect_err("syntax");
    assert!(
        err.to_string().contains("could not parse the JSON body"),
        "{err}"
    );
    assert!(parse_completion_request(br#"{"model":"m","prompt":["a","b"]}"#).is_err());
    assert!(parse_completion_request(br#"{"model":"m","prompt":"a","suffix":"x"}"#).is_err());
}

fn run(
    pre: &Preprocessor,
    req: &PreprocessedRequest,
    ids: &[u32],
) -> (String, Option<FinishReason>, u32) {
    let mut p = pre.output_processor(req);
    let mut text = String::new();
    let mut finish = None;
    for &id in ids {
        let o = p
            .process(&LLMEngineOutput {
                token_ids: vec![id],
                ..Default::default()
            })
            .expect("process");
        text.push_str(&o.text);
        if o.finish_reason.is_some() {
            finish = o.finish_reason;
            break;
        }
    }
    if finish.is_none()
        && let Some(o) = p.end_of_stream().expect("eos")
    {
        text.push_str(&o.text);
        finish = o.finish_reason;
    }
    (text, finish, p.completion_tokens())
}

#[test]
fn stop_strings_across_token_boundaries() {
    let pre = tiny();
    let ids = pre
        .encode("Hello! How are you today? I am fine", false)
        .expect("enc");
    assert!(ids.len() > 5);
    let mut req = PreprocessedRequest {
        token_ids: vec![1],
        ..Default::default()
    };
    // "you tod" spans several tokens (" you", " today").
    req.stop_conditions.stop = Some(vec!["you tod".into()]);
    let (text, finish, _) = run(&pre, &req, &ids);
    assert_eq!(text, "Hello! How are ");
    assert_eq!(finish, Some(FinishReason::Stop));
    req.sampling_options.include_stop_str_in_output = Some(true);
    let (text, _, _) = run(&pre, &req, &ids);
    assert_eq!(text, "Hello! How are you tod");
    // A stop string that never completes does not swallow text.
    req.stop_conditions.stop = Some(vec!["fine!".into()]);
    let (text, finish, n) = run(&pre, &req, &ids);
    assert_eq!(text, "Hello! How are you today? I am fine");
    assert_eq!((finish, n as usize), (Some(FinishReason::Stop), ids.len()));
}

#[test]
fn eos_and_max_tokens() {
    let pre = tiny();
    let ids = pre.encode("Hello! How are you", false).expect("enc");
    let im_end = pre.tokenizer().token_to_id("<|im_end|>").expect("im_end");
    let mut req = PreprocessedRequest {
        token_ids: vec![1],
        eos_token_ids: pre.eos_token_ids().to_vec(),
        ..Default::default()
    };
    let mut with_eos = ids.clone();
    with_eos.push(im_end);
    with_eos.extend(&ids);
    let (text, finish, n) = run(&pre, &req, &with_eos);
    assert_eq!(
        (text.as_str(), finish.clone(), n as usize),
        ("Hello! How are you", Some(FinishReason::Eos), ids.len() + 1)
    );
    req.stop_conditions.ignore_eos = Some(true);
    let (text, _, _) = run(&pre, &req, &with_eos);
    assert_eq!(text, "Hello! How are youHello! How are you");
    req.stop_conditions.max_tokens = Some(2);
    let (text, finish, n) = run(&pre, &req, &with_eos);
    assert_eq!((finish, n), (Some(FinishReason::Length), 2));
    assert_eq!(text, pre.tokenizer().decode(&ids[..2], true).expect("dec"));
    req.stop_conditions = StopConditions {
        min_tokens: Some(100),
        ..Default::default()
    };
    req.stop_conditions.ignore_eos = None;
    let (_, finish, n) = run(&pre, &req, &with_eos);
    assert_eq!(
        (finish, n as usize),
        (Some(FinishReason::Stop), with_eos.len()),
        "min_tokens suppresses eos"
    );
}

#[test]
fn worker_finish_reason_and_text_only_workers() {
    let pre = tiny();
    let req = PreprocessedRequest {
        token_ids: vec![1],
        ..Default::default()
    };
    let mut p = pre.output_processor(&req);
    let o = p
        .process(&LLMEngineOutput {
            token_ids: pre.encode("Hi", false).expect("enc"),
            finish_reason: Some(FinishReason::Length),
            ..Default::default()
        })
        .expect("ok");
    assert_eq!(
        (o.text.as_str(), o.finish_reason),
        ("Hi", Some(FinishReason::Length))
    );
    assert!(p.is_finished());
    assert_eq!(
        p.process(&LLMEngineOutput {
            token_ids: vec![5],
            ..Default::default()
        })
        .expect("ok")
        .text,
        ""
    );
    let mut req = PreprocessedRequest::default();
    req.stop_conditions.stop = Some(vec!["XY".into()]);
    let mut p = OutputProcessor::new(&req, None);
    assert_eq!(
        p.process(&LLMEngineOutput {
            text: Some("abX".into()),
            ..Default::default()
        })
        .expect("ok")
        .text,
        "ab"
    );
    let o = p
        .process(&LLMEngineOutput {
            text: Some("Yc".into()),
            ..Default::default()
        })
        .expect("ok");
    assert_eq!(
        (o.text.as_str(), o.finish_reason),
        ("", Some(FinishReason::Stop))
    );
}

#[test]
fn multibyte_characters_split_across_tokens_are_never_emitted_half() {
    let pre = tiny();
    let text = "Grüße 日本語 🙂🚀 ok";
    let ids = pre.encode(text, false).expect("enc");
    let mut d = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), true, &[]);
    let mut out = String::new();
    let mut empty_steps = 0;
    for &id in &ids {
        let delta = d.step(&[id]).expect("step");
        assert!(!delta.contains('\u{FFFD}'), "{delta:?}");
        empty_steps += usize::from(delta.is_empty());
        out.push_str(&delta);
    }
    out.push_str(&d.flush().expect("flush"));
    assert_eq!(out, text);
    assert!(
        empty_steps > 0,
        "the tiny tokenizer splits some characters across tokens"
    );
}

#[test]
fn prompts_encode_the_same_before_and_after_the_fast_encoder_is_decided() {
    let pre = tiny();
    let text = "<|im_start|>user\nTell me about routing, twice!<|im_end|>\n<|im_start|>assistant\n";
    // Possibly still on the tokenizer's path here (the check runs in the background).
    let early = pre.encode(text, false).expect("encode");
    assert!(
        pre.wait_fast_encoder(),
        "the tiny tokenizer's shape is the fast encoder's"
    );
    assert!(matches!(pre.fast_encoder.get(), Some(Some(_))));
    let fast = pre.encode(text, false).expect("encode");
    let expected = pre.tokenizer().encode_fast(text, false).expect("tokenizer");
    assert_eq!(fast, expected.get_ids());
    assert_eq!(early, fast);
}

#[test]
fn the_byte_table_is_built_for_byte_level_tokenizers_only() {
    let pre = tiny();
    assert!(
        pre.wait_token_bytes(),
        "the tiny tokenizer is byte-level BPE"
    );
    let table = TokenBytes::build(pre.tokenizer()).expect("table");
    assert_eq!(table.len(), pre.tokenizer().get_vocab_size(true));
    // Every id, special or not, decodes as the tokenizer decodes it alone.
    for id in 0..table.len() as u32 {
        for skip in [false, true] {
            let mut mine = Vec::new();
            table.append(id, skip, &mut mine);
            assert_eq!(
                String::from_utf8_lossy(&mine),
                pre.tokenizer().decode(&[id], skip).expect("decode"),
                "id {id}"
            );
        }
    }
    // Ids past the vocabulary decode to nothing, as the tokenizer's decode drops them.
    let mut past = Vec::new();
    table.append(u32::MAX, true, &mut past);
    assert!(past.is_empty());
    // A decoder that is not byte-level gets no table.
    let mut other = (**pre.tokenizer()).clone();
    other.with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::default()));
    assert!(TokenBytes::build(&other).is_none());
}

#[test]
fn table_and_tokenizer_decoders_give_the_same_deltas_for_split_characters() {
    let pre = tiny();
    let table = TokenBytes::build(pre.tokenizer()).map(Arc::new);
    let text = "Grüße 日本語 🙂🚀 ok <|im_end|> done";
    let ids = pre.encode(text, false).expect("enc");
    for skip in [false, true] {
        let mut slow = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), skip, &[]);
        let mut fast = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), skip, &[])
            .with_table(table.clone());
        for &id in &ids {
            assert_eq!(
                fast.step(&[id]).expect("fast"),
                slow.step(&[id]).expect("slow")
            );
        }
        assert_eq!(fast.flush().expect("fast"), slow.flush().expect("slow"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn table_deltas_equal_tokenizer_deltas(ids in proptest::collection::vec(0u32..720, 0..40), chunk in 1usize..4, skip in any::<bool>()) {
        let pre = tiny();
        let table = TokenBytes::build(pre.tokenizer()).map(Arc::new);
        prop_assert!(table.is_some());
        let mut slow = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), skip, &[]);
        let mut fast = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), skip, &[]).with_table(table);
        for c in ids.chunks(chunk) {
            prop_assert_eq!(fast.step(c).expect("fast"), slow.step(c).expect("slow"));
        }
        prop_assert_eq!(fast.flush().expect("fast"), slow.flush().expect("slow"));
    }

    #[test]
    fn deltas_concatenate_to_the_full_decode(ids in proptest::collection::vec(0u32..699, 0..40), chunk in 1usize..4) {
        let pre = tiny();
        let mut d = IncrementalDecoder::new(Arc::clone(pre.tokenizer()), true, &[]);
        let mut out = String::new();
        for c in ids.chunks(chunk) {
            out.push_str(&d.step(c).expect("step"));
        }
        out.push_str(&d.flush().expect("flush"));
        prop_assert_eq!(out, pre.tokenizer().decode(&ids, true).expect("decode"));
    }

    #[test]
    fn stop_matcher_equals_naive_search(text in "[ab ]{0,30}", cuts in proptest::collection::vec(0usize..30, 0..6), stop in "[ab]{1,3}") {
        let mut m = super::detokenizer::StopStringMatcher::new([stop.clone()], false);
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        let mut out = String::new();
        let mut matched = false;
        for w in bounds.windows(2) {
            let r = m.push(&text[w[0]..w[1]]);
            out.push_str(&r.text);
            if r.matched.is_some() { matched = true; break; }
        }
        if !matched { out.push_str(&m.flush()); }
        let want = text.find(&stop).map_or(text.as_str(), |p| &text[..p]);
        prop_assert_eq!(out.as_str(), want);
        prop_assert_eq!(matched, text.contains(&stop));
    }
}

#[test]
fn responses_carry_refusal_cached_tokens_and_one_index_per_choice() {
    use super::openai::{OpenAiFinishReason, ResponseFactory, Usage};
    let f = ResponseFactory::new("chatcmpl-x", "m");
    // Cached tokens are reported when known and never exceed the prompt.
    let usage = Usage::new(10, 4).with_cached(Some(16));
    let chat = serde_json::to_value(f.chat_response_choices(
        vec![
            ("a".into(), Some(OpenAiFinishReason::Stop)),
            ("b".into(), Some(OpenAiFinishReason::Length)),
        ],
        usage,
    ))
    .unwrap();
    assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
    assert_eq!(chat["choices"][1]["index"], 1);
    assert_eq!(chat["choices"][1]["message"]["content"], "b");
    let message = chat["choices"][0]["message"].as_object().unwrap();
    assert!(message.contains_key("refusal") && message["refusal"].is_null());
    let unknown = serde_json::to_value(Usage::new(10, 4).with_cached(None)).unwrap();
    assert!(unknown.get("prompt_tokens_details").is_none());
    let chunk = serde_json::to_value(f.completion_chunk_at(3, "t".into(), None)).unwrap();
    assert_eq!(chunk["choices"][0]["index"], 3);
    let chunk = serde_json::to_value(f.chat_chunk_at(2, Some("t".into()), true, None)).unwrap();
    assert_eq!(chunk["choices"][0]["index"], 2);
    assert_eq!(chunk["choices"][0]["delta"]["role"], "assistant");
}

/// Values of the wrong shape are refused naming the field; the legal shapes next to them
/// (vLLM's `top_k: -1`, an assistant turn with only `tool_calls`) are accepted.
#[test]
fn fields_of_the_wrong_shape_are_refused_by_name() {
    let user = r#"[{"role":"user","content":"hi"}]"#;
    for (extra, param) in [
        (r#""top_k":-2"#, "top_k"),
        (r#""response_format":"json""#, "response_format"),
        (r#""response_format":{"schema":{}}"#, "response_format.type"),
        (r#""tool_choice":5"#, "tool_choice"),
        (r#""tool_choice":"sometimes""#, "tool_choice"),
        (r#""nvext":[1]"#, "nvext"),
    ] {
        let body = format!(r#"{{"model":"tiny","messages":{user},{extra}}}"#);
        match parse_chat_request(body.as_bytes()) {
            Err(Error::InvalidRequest { param: p, .. }) => {
                assert_eq!(p.as_deref(), Some(param), "{body}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    for role in ["user", "system", "developer", "tool"] {
        let body = format!(
            r#"{{"model":"tiny","messages":[{{"role":"user","content":"a"}},{{"role":"{role}","content":null}}]}}"#
        );
        match parse_chat_request(body.as_bytes()) {
            Err(Error::InvalidRequest { param: p, .. }) => {
                assert_eq!(p.as_deref(), Some("messages.[1].content"), "{body}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    let completion = br#"{"model":"tiny","prompt":"a","top_k":-5}"#;
    assert!(parse_completion_request(completion).is_err());
    for ok in [
        format!(r#"{{"model":"tiny","messages":{user},"top_k":-1}}"#),
        format!(r#"{{"model":"tiny","messages":{user},"top_k":0,"nvext":{{"annotations":[]}}}}"#),
        format!(r#"{{"model":"tiny","messages":{user},"response_format":{{"type":"json_object"}}}}"#),
        format!(r#"{{"model":"tiny","messages":{user},"tool_choice":"auto"}}"#),
        format!(
            r#"{{"model":"tiny","messages":{user},"tools":[{{"type":"function","function":{{"name":"f"}}}}],"tool_choice":{{"type":"function","function":{{"name":"f"}}}}}}"#
        ),
        r#"{"model":"tiny","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}]}"#.to_owned(),
    ] {
        parse_chat_request(ok.as_bytes()).expect(&ok);
    }
}

/// Templates read an earlier call's arguments as a mapping; text that is no JSON object
/// stays text.
#[test]
fn earlier_tool_call_arguments_reach_the_template_as_objects() {
    let mut message = serde_json::json!({
        "role": "assistant",
        "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Oslo\", \"n\": {\"d\": [1]}}"}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1, 2]"}},
            {"id": "4", "type": "function", "function": {"name": "k", "arguments": {"already": true}}}
        ]
    });
    arguments_as_objects(&mut message);
    let arguments: Vec<&Json> = message["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| &c["function"]["arguments"])
        .collect();
    assert_eq!(
        arguments,
        [
            &serde_json::json!({"city": "Oslo", "n": {"d": [1]}}),
            &Json::String("not json".into()),
            &Json::String("[1, 2]".into()),
            &serde_json::json!({"already": true}),
        ]
    );
    let mut user = serde_json::json!({"role": "user", "content": "x"});
    arguments_as_objects(&mut user);
    assert_eq!(user, serde_json::json!({"role": "user", "content": "x"}));
}

/// A `tool_choice` no output could satisfy is refused, as by OpenAI.
#[test]
fn tool_choice_that_needs_tools_is_refused_without_them() {
    let msgs = r#""messages":[{"role":"user","content":"x"}]"#;
    let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{}}}]"#;
    for bad in [
        format!(r#"{{"model":"m",{msgs},"tool_choice":"required"}}"#),
        format!(r#"{{"model":"m",{msgs},"tools":[],"tool_choice":"required"}}"#),
        format!(
            r#"{{"model":"m",{msgs},"tool_choice":{{"type":"function","function":{{"name":"f"}}}}}}"#
        ),
        format!(
            r#"{{"model":"m",{msgs},{tools},"tool_choice":{{"type":"function","function":{{"name":"g"}}}}}}"#
        ),
    ] {
        let err = parse_chat_request(bad.as_bytes()).expect_err(&bad);
        assert_eq!(err.http_status(), 400, "{bad}");
        assert!(err.to_string().contains("'tool_choice'"), "{err}");
    }
    for good in [
        format!(r#"{{"model":"m",{msgs},"tool_choice":"auto"}}"#),
        format!(r#"{{"model":"m",{msgs},"tools":[],"tool_choice":"none"}}"#),
        format!(r#"{{"model":"m",{msgs},{tools},"tool_choice":"required"}}"#),
        format!(
            r#"{{"model":"m",{msgs},{tools},"tool_choice":{{"type":"function","function":{{"name":"f"}}}}}}"#
        ),
    ] {
        parse_chat_request(good.as_bytes()).expect(&good);
    }
}

/// `tool_choice: none` keeps `tools` out of the template unless the card says otherwise.
#[test]
fn tool_choice_none_drops_tools_unless_the_card_keeps_them() {
    let mut pre = tiny();
    pre.template = Some(
        ChatTemplate::new(
            "{% if tools %}[{{ tools | length }} tools]{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
            &serde_json::json!({}),
        )
        .expect("template"),
    );
    let tools = r#""tools":[{"type":"function","function":{"name":"f"}}]"#;
    let req = |choice: &str| {
        chat(&format!(
            r#"{{"model":"tiny","messages":[{{"role":"user","content":"q"}}],{tools},"tool_choice":"{choice}"}}"#
        ))
    };
    assert!(pre.exclude_tools_when_none, "the card default");
    assert_eq!(pre.render_chat(&req("auto")).expect("render"), "[1 tools]q");
    assert_eq!(pre.render_chat(&req("none")).expect("render"), "q");
    pre.exclude_tools_when_none = false;
    assert_eq!(pre.render_chat(&req("none")).expect("render"), "[1 tools]q");
}

/// The SSE writer's bytes are `serde_json`'s for the chunk structs, byte for byte.
#[test]
fn written_sse_chunks_equal_serialised_chunk_structs() {
    use openai::{OpenAiFinishReason as F, ResponseFactory, SseChunkWriter};
    let sse = |v: &[u8]| [b"data: ".as_slice(), v, b"\n\n".as_slice()].concat();
    let factories = [
        ResponseFactory::new("chatcmpl-1234", "tiny"),
        ResponseFactory::new("id \"quoted\" \\ \u{1}", "Qwen/Qwen3-0.6B é"),
    ];
    let texts = [
        "",
        "hello",
        " world\n",
        "\"q\" \\ \t \u{0} \u{1f} é 日本 🙂",
        "</s>",
    ];
    let finishes = [
        None,
        Some(F::Stop),
        Some(F::Length),
        Some(F::ToolCalls),
        Some(F::ContentFilter),
    ];
    for factory in &factories {
        let chat = SseChunkWriter::chat(factory);
        let completion = SseChunkWriter::completion(factory);
        for text in texts {
            for finish in finishes {
                for index in [0, 7, 10, 4_294_967_295] {
                    for first in [false, true] {
                        let mut out = Vec::new();
                        chat.write(&mut out, index, text, first, finish);
                        let want =
                            factory.chat_chunk_at(index, Some(text.to_owned()), first, finish);
                        let want = sse(&serde_json::to_vec(&want).expect("json"));
                        assert_eq!(
                            String::from_utf8_lossy(&out),
                            String::from_utf8_lossy(&want)
                        );
                    }
                    // Appends after what the frame holds already.
                    let mut out = b"data: [earlier]\n\n".to_vec();
                    completion.write(&mut out, index, text, true, finish);
                    let want = factory.completion_chunk_at(index, text.to_owned(), finish);
                    let want = [
                        b"data: [earlier]\n\n".to_vec(),
                        sse(&serde_json::to_vec(&want).expect("json")),
                    ]
                    .concat();
                    assert_eq!(
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&want)
                    );
                }
            }
        }
    }
}

/// The tiny model's directory copied into `dir`, with its `generation_config.json` replaced
/// by `gen_config`.
fn tiny_with_generation_config(dir: &Path, gen_config: &str) -> Preprocessor {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model");
    for entry in std::fs::read_dir(&src).expect("tiny model dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
    }
    std::fs::write(dir.join("generation_config.json"), gen_config).expect("write");
    Preprocessor::from_model_dir(dir, "tiny").expect("tiny model copy")
}

#[test]
fn a_chat_request_without_max_tokens_gets_the_models_max_new_tokens() {
    let pre = tiny();
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}]}"#;
    // tiny-model/generation_config.json: "max_new_tokens": 256.
    let wire = pre.preprocess_chat(&chat(body)).expect("preprocess");
    assert_eq!(wire.stop_conditions.max_tokens, Some(256));
    // What the request asks for wins, within the context.
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":1000}"#;
    let wire = pre.preprocess_chat(&chat(body)).expect("preprocess");
    assert_eq!(wire.stop_conditions.max_tokens, Some(1000));
    // Completions keep OpenAI's own default.
    let wire = pre
        .preprocess_completion(
            &parse_completion_request(br#"{"model":"tiny","prompt":"Hi"}"#).expect("parse"),
        )
        .expect("preprocess");
    assert_eq!(
        wire.stop_conditions.max_tokens,
        Some(DEFAULT_COMPLETION_MAX_TOKENS)
    );
}

#[test]
fn without_max_new_tokens_the_default_is_the_room_left_in_the_context() {
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}]}"#;
    let tmp = tempfile::tempdir().expect("tmp");
    let pre = tiny_with_generation_config(tmp.path(), r#"{"eos_token_id": [2, 0]}"#);
    let wire = pre.preprocess_chat(&chat(body)).expect("preprocess");
    let prompt = u32::try_from(wire.token_ids.len()).expect("len");
    // config.json: max_position_embeddings 8192.
    assert_eq!(wire.stop_conditions.max_tokens, Some(8192 - prompt));

    // A default larger than the room is capped by it, not refused.
    let tmp = tempfile::tempdir().expect("tmp");
    let pre = tiny_with_generation_config(
        tmp.path(),
        r#"{"eos_token_id": [2, 0], "max_new_tokens": 100000}"#,
    );
    let wire = pre.preprocess_chat(&chat(body)).expect("preprocess");
    assert_eq!(wire.stop_conditions.max_tokens, Some(8192 - prompt));
}
