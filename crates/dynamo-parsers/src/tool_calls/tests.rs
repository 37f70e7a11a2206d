use std::sync::Arc;

use super::format::param_json;
use super::*;

fn tools() -> Arc<ToolSet> {
    Arc::new(ToolSet::from_request(&[
        serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}}),
    ]))
}

#[test]
fn every_format_is_named_once() {
    for f in FORMATS {
        assert_eq!(FORMATS.iter().filter(|g| g.name == f.name).count(), 1);
    }
}

#[test]
fn parameters_follow_the_schema() {
    let t = tools();
    assert_eq!(param_json(&t, "f", "s", "12"), "\"12\"");
    assert_eq!(param_json(&t, "f", "n", "12"), "12");
    assert_eq!(param_json(&t, "f", "x", "True"), "true");
    assert_eq!(param_json(&t, "f", "x", "hi there"), "\"hi there\"");
}

#[test]
fn blank_text_between_calls_is_dropped_but_text_is_kept() {
    let mut p = ToolCallParser::new(format("hermes").unwrap(), tools(), CallPolicy::default());
    let mut out = Vec::new();
    p.feed("a<tool_call>{\"name\": \"f\"}</tool_call>\n\n<tool_call>{\"name\": \"f\", \"arguments\": {\"n\": 1}}</tool_call>\n b", &mut out);
    p.finish(&mut out);
    let start = |name: &str| ToolEvent::CallStart {
        name: name.into(),
        id: None,
    };
    assert_eq!(
        out,
        vec![
            ToolEvent::Content("a".into()),
            start("f"),
            ToolEvent::CallArgs("{}".into()),
            start("f"),
            ToolEvent::CallArgs("{\"n\": 1}".into()),
            ToolEvent::Content("\n b".into()),
        ]
    );
}
