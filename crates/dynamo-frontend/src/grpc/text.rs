//! Text models over KServe tensors, as the reference maps them: a `text_input` BYTES
//! tensor of one element becomes an OpenAI completions request (`prompt`), the answer's
//! text comes back as a `text_output` BYTES tensor with a `finish_reason` BYTES tensor.
//!
//! Inputs: `text_input` (required), `stream` (BOOL; `streaming` is accepted too); and, a
//! superset of the reference, `stream`/`streaming` and the sampling fields of [`SAMPLING`]
//! as request parameters too (the reference ignores parameters). A tensor wins over a
//! parameter of the same name.

use bytes::Bytes;

use super::proto::model_infer_request::InferInputTensor;
use super::proto::model_infer_response::InferOutputTensor;
use super::proto::{InferTensorContents, ModelInferRequest, ModelInferResponse};
use super::tensor::{FlattenTensor, ParamValue, params_from_kserve, tensor_from_kserve};

/// OpenAI completion fields a request may set through a tensor or a parameter.
pub const SAMPLING: [&str; 12] = [
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "n",
];

/// A parsed text request.
#[derive(Debug, Clone, PartialEq)]
pub struct TextRequest {
    /// The OpenAI completions body sent to the model (always streaming).
    pub body: serde_json::Map<String, serde_json::Value>,
    /// The client asked for one response per chunk.
    pub stream: bool,
    /// The client sent raw contents (answered raw as well).
    pub raw: bool,
}

fn supported() -> String {
    let mut names = vec!["'text_input'".to_owned(), "'stream'".to_owned()];
    names.extend(SAMPLING.iter().map(|s| format!("'{s}'")));
    names.join(", ")
}

/// One JSON value of a one-element tensor.
fn scalar(input: &InferInputTensor, raw: Option<&Bytes>) -> Result<serde_json::Value, String> {
    let t = tensor_from_kserve(input, raw).map_err(|e| e.0)?;
    if t.data.len() != 1 {
        return Err(format!(
            "Expected '{}' to have one element, got shape {:?}",
            input.name, input.shape
        ));
    }
    let v = serde_json::to_value(&t.data).map_err(|e| e.to_string())?;
    let value = v
        .get("values")
        .and_then(|vals| vals.get(0))
        .cloned()
        .unwrap_or_default();
    Ok(match t.data {
        FlattenTensor::Bytes(b) => {
            serde_json::Value::String(String::from_utf8_lossy(&b[0].0).into_owned())
        }
        _ => value,
    })
}

fn param_json(p: ParamValue) -> serde_json::Value {
    match p {
        ParamValue::Bool(b) => b.into(),
        ParamValue::Int64(i) => i.into(),
        ParamValue::Uint64(u) => u.into(),
        ParamValue::Double(d) => d.into(),
        ParamValue::String(s) => s.into(),
    }
}

/// Parse a text request for `model`.
///
/// # Errors
/// The message of an `INVALID_ARGUMENT`, naming the input.
pub fn parse(req: &ModelInferRequest, model: &str) -> Result<TextRequest, String> {
    let raw = &req.raw_input_contents;
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(format!(
            "raw_input_contents has {} entries for {} inputs",
            raw.len(),
            req.inputs.len()
        ));
    }
    let mut body = serde_json::Map::new();
    body.insert("model".into(), model.into());
    // Parameters first: tensors of the same name win.
    let mut stream = false;
    for (k, v) in params_from_kserve(&req.parameters) {
        if SAMPLING.contains(&k.as_str()) {
            body.insert(k, param_json(v));
        } else if k == "stream" || k == "streaming" {
            match v {
                ParamValue::Bool(b) => stream = b,
                _ => return Err(format!("Expected parameter '{k}' to be a bool")),
            }
        }
    }
    let mut prompt = None;
    for (i, input) in req.inputs.iter().enumerate() {
        let raw_i = raw.get(i);
        match input.name.as_str() {
            "text_input" => {
                if input.datatype != "BYTES" {
                    return Err(format!(
                        "Expected 'text_input' to be of type BYTES for string input, got {:?}",
                        input.datatype
                    ));
                }
                let t = tensor_from_kserve(input, raw_i).map_err(|e| e.0)?;
                match t.data {
                    FlattenTensor::Bytes(mut b) if b.len() == 1 => {
                        let text = String::from_utf8(std::mem::take(&mut b[0].0))
                            .map_err(|_| "'text_input' is not valid UTF-8".to_owned())?;
                        prompt = Some(text);
                    }
                    _ => {
                        return Err(format!(
                            "Expected 'text_input' to have shape [1], got {:?}",
                            input.shape
                        ));
                    }
                }
            }
            "stream" | "streaming" => {
                stream = matches!(scalar(input, raw_i)?, serde_json::Value::Bool(true));
            }
            name if SAMPLING.contains(&name) => {
                body.insert(name.to_owned(), scalar(input, raw_i)?);
            }
            other => {
                return Err(format!(
                    "Invalid input name: {other}, supported inputs are {}",
                    supported()
                ));
            }
        }
    }
    let prompt = prompt.ok_or_else(|| "Missing required input: 'text_input'".to_owned())?;
    body.insert("prompt".into(), prompt.into());
    body.insert("stream".into(), true.into());
    if !req.id.is_empty() {
        // The reference hands the request id to the engine as the OpenAI `user`.
        body.insert("user".into(), req.id.clone().into());
    }
    Ok(TextRequest {
        body,
        stream,
        raw: !raw.is_empty(),
    })
}

fn bytes_output(
    name: &str,
    value: &[u8],
    raw: bool,
    contents: &mut Vec<Bytes>,
) -> InferOutputTensor {
    let mut out = InferOutputTensor {
        name: name.into(),
        datatype: "BYTES".into(),
        shape: vec![1],
        ..Default::default()
    };
    if raw {
        let mut buf = Vec::with_capacity(value.len() + 4);
        let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(value);
        contents.push(Bytes::from(buf));
    } else {
        out.contents = Some(InferTensorContents {
            bytes_contents: vec![value.to_vec()],
            ..Default::default()
        });
    }
    out
}

/// The response carrying `text` (and `finish_reason`, empty while streaming).
pub fn response(
    model: &str,
    id: &str,
    text: &str,
    finish_reason: Option<&str>,
    raw: bool,
) -> ModelInferResponse {
    let mut contents = Vec::new();
    let outputs = vec![
        bytes_output("text_output", text.as_bytes(), raw, &mut contents),
        bytes_output(
            "finish_reason",
            finish_reason.unwrap_or("").as_bytes(),
            raw,
            &mut contents,
        ),
    ];
    ModelInferResponse {
        model_name: model.into(),
        model_version: "1".into(),
        id: id.into(),
        outputs,
        raw_output_contents: contents,
        ..Default::default()
    }
}

/// Text and finish reason of one OpenAI completion chunk (first choice).
pub fn chunk_text(chunk: &serde_json::Value) -> (String, Option<String>) {
    let choice = chunk.get("choices").and_then(|c| c.get(0));
    let text = choice
        .and_then(|c| c.get("text"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let finish = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    (text, finish)
}

/// One server-sent event of the completions stream.
#[derive(Debug, PartialEq)]
pub enum SseEvent {
    /// A chunk (its JSON).
    Data(serde_json::Value),
    /// `data: [DONE]`.
    Done,
    /// An `event: error` with its envelope's message.
    Error(String),
}

/// Splits a server-sent-event byte stream into events.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feed bytes; the complete events they finish.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = self.buf.drain(..end + 2).collect();
            let frame = String::from_utf8_lossy(&frame[..end]);
            let mut is_error = false;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    is_error = e.trim() == "error";
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            if data.is_empty() {
                continue;
            }
            if is_error {
                let v: serde_json::Value = serde_json::from_str(&data).unwrap_or_default();
                let msg = v
                    .pointer("/error/message")
                    .and_then(serde_json::Value::as_str)
                    .map_or(data.clone(), str::to_owned);
                events.push(SseEvent::Error(msg));
            } else if data == "[DONE]" {
                events.push(SseEvent::Done);
            } else {
                match serde_json::from_str(&data) {
                    Ok(v) => events.push(SseEvent::Data(v)),
                    Err(e) => events.push(SseEvent::Error(format!("malformed chunk: {e}"))),
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_input(text: &[u8]) -> (InferInputTensor, Bytes) {
        let mut raw = (text.len() as u32).to_le_bytes().to_vec();
        raw.extend_from_slice(text);
        (
            InferInputTensor {
                name: "text_input".into(),
                datatype: "BYTES".into(),
                shape: vec![1],
                ..Default::default()
            },
            Bytes::from(raw),
        )
    }

    #[test]
    fn text_input_becomes_a_streaming_completions_body() {
        let (t, raw) = text_input(b"Hello");
        let mut max = InferInputTensor {
            name: "max_tokens".into(),
            datatype: "INT32".into(),
            shape: vec![1],
            ..Default::default()
        };
        max.contents = None;
        let req = ModelInferRequest {
            id: "r1".into(),
            inputs: vec![t, max],
            raw_input_contents: vec![raw, Bytes::from(7i32.to_le_bytes().to_vec())],
            parameters: [(
                "temperature".to_owned(),
                super::super::proto::InferParameter {
                    parameter_choice: Some(
                        super::super::proto::infer_parameter::ParameterChoice::DoubleParam(0.5),
                    ),
                },
            )]
            .into(),
            ..Default::default()
        };
        let parsed = parse(&req, "m").expect("parse");
        assert_eq!(
            serde_json::Value::Object(parsed.body),
            serde_json::json!({"model": "m", "prompt": "Hello", "stream": true, "user": "r1", "max_tokens": 7, "temperature": 0.5})
        );
        assert!(!parsed.stream && parsed.raw);
    }

    #[test]
    fn bad_text_inputs_are_named() {
        let (mut t, raw) = text_input(b"x");
        t.datatype = "INT32".into();
        let req = ModelInferRequest {
            inputs: vec![t],
            raw_input_contents: vec![raw],
            ..Default::default()
        };
        assert!(parse(&req, "m").unwrap_err().contains("'text_input'"));
        let req = ModelInferRequest::default();
        assert_eq!(
            parse(&req, "m").unwrap_err(),
            "Missing required input: 'text_input'"
        );
        let (mut t, raw) = text_input(b"x");
        t.name = "wrong".into();
        let req = ModelInferRequest {
            inputs: vec![t],
            raw_input_contents: vec![raw],
            ..Default::default()
        };
        assert!(
            parse(&req, "m")
                .unwrap_err()
                .starts_with("Invalid input name: wrong")
        );
    }

    fn bool_param(b: bool) -> super::super::proto::InferParameter {
        super::super::proto::InferParameter {
            parameter_choice: Some(
                super::super::proto::infer_parameter::ParameterChoice::BoolParam(b),
            ),
        }
    }

    #[test]
    fn stream_parameter_is_honoured_and_a_tensor_wins() {
        let (t, raw) = text_input(b"x");
        for name in ["stream", "streaming"] {
            let req = ModelInferRequest {
                inputs: vec![t.clone()],
                raw_input_contents: vec![raw.clone()],
                parameters: [(name.to_owned(), bool_param(true))].into(),
                ..Default::default()
            };
            let parsed = parse(&req, "m").expect("parse");
            assert!(parsed.stream, "{name}");
            // The parameter never reaches the completions body as a sampling field.
            assert_eq!(parsed.body["stream"], serde_json::Value::Bool(true));
        }
        // A `stream` tensor set to false overrides a `stream` parameter set to true.
        let off = InferInputTensor {
            name: "stream".into(),
            datatype: "BOOL".into(),
            shape: vec![1],
            ..Default::default()
        };
        let req = ModelInferRequest {
            inputs: vec![t.clone(), off],
            raw_input_contents: vec![raw.clone(), Bytes::from_static(&[0])],
            parameters: [("stream".to_owned(), bool_param(true))].into(),
            ..Default::default()
        };
        assert!(!parse(&req, "m").expect("parse").stream);
        // A non-bool `stream` parameter is refused, named.
        let req = ModelInferRequest {
            inputs: vec![t],
            raw_input_contents: vec![raw],
            parameters: [(
                "stream".to_owned(),
                super::super::proto::InferParameter {
                    parameter_choice: Some(
                        super::super::proto::infer_parameter::ParameterChoice::StringParam(
                            "yes".into(),
                        ),
                    ),
                },
            )]
            .into(),
            ..Default::default()
        };
        assert!(parse(&req, "m").unwrap_err().contains("'stream'"));
    }

    #[test]
    fn sse_frames_split_across_reads() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"choices\":[{\"text\":\"a\"").is_empty());
        let ev = p.feed(b",\"finish_reason\":null}]}\n\ndata: [DONE]\n\n");
        assert_eq!(ev.len(), 2);
        let SseEvent::Data(v) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(chunk_text(v), ("a".into(), None));
        assert_eq!(ev[1], SseEvent::Done);
        let ev = p.feed(b"event: error\ndata: {\"error\":{\"message\":\"boom\"}}\n\n");
        assert_eq!(ev, vec![SseEvent::Error("boom".into())]);
    }
}
