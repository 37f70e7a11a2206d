//! `POST /v1/embeddings`: OpenAI's embeddings API over workers registered with
//! `ModelType.Embedding`.
//!
//! Input: a string, a list of strings, a list of token ids or a list of token-id lists
//! (at most [`MAX_INPUTS`] inputs). For `ModelInput::Tokens` workers the frontend
//! tokenizes text inputs and sends `{"model", "token_ids": [[...]], "dimensions",
//! "annotations"}` (the reference's fields); the
//! worker answers `{"embeddings": [[...]], "prompt_tokens", "total_tokens"}`.
//! `ModelInput::Text` workers receive the OpenAI body (with `encoding_format` forced to
//! `float`) and answer either that engine shape or an OpenAI embeddings response.
//! `encoding_format: "base64"` is applied here: little-endian `f32`s, base64-encoded, as
//! OpenAI's clients decode them. `dimensions` is passed to the worker, and a longer vector
//! is truncated to it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use dynamo_llm::model_card::ModelType;
use serde_json::{Map, Value, json};

use super::Shared;
use super::error::HttpError;
use super::request_body::JsonBody;
use super::respond::json_response;
use super::surfaces::{self, Record, Surface};

/// The most inputs one request may carry (OpenAI's limit).
pub(super) const MAX_INPUTS: usize = 2048;

const SURFACE: Surface = Surface {
    path: "/v1/embeddings",
    label: "embeddings",
    flag: ModelType::EMBEDDING,
};

/// The inputs of a request.
#[derive(Debug, PartialEq)]
pub(super) enum Inputs {
    Text(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Text(v) => v.len(),
            Self::Tokens(v) => v.len(),
        }
    }
}

fn invalid_input(msg: &str) -> HttpError {
    HttpError::bad_request(format!("invalid 'input': {msg}"), Some("input".into()))
}

fn token_id(v: &Value) -> Result<u32, HttpError> {
    v.as_u64()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| invalid_input("token ids must be integers in 0..2^32"))
}

fn token_list(v: &[Value]) -> Result<Vec<u32>, HttpError> {
    if v.is_empty() {
        return Err(invalid_input("a token list must not be empty"));
    }
    v.iter().map(token_id).collect()
}

/// Parse `input` as OpenAI accepts it.
pub(super) fn parse_input(v: Option<&Value>) -> Result<Inputs, HttpError> {
    let inputs = match v {
        None | Some(Value::Null) => {
            return Err(HttpError::bad_request(
                "missing required parameter: 'input'",
                Some("input".into()),
            ));
        }
        Some(Value::String(s)) => Inputs::Text(vec![s.clone()]),
        Some(Value::Array(items)) => match items.first() {
            None => return Err(invalid_input("the list must not be empty")),
            Some(Value::String(_)) => Inputs::Text(
                items
                    .iter()
                    .map(|i| {
                        i.as_str().map(str::to_owned).ok_or_else(|| {
                            invalid_input("a list of strings must hold only strings")
                        })
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(Value::Number(_)) => Inputs::Tokens(vec![token_list(items)?]),
            Some(Value::Array(_)) => Inputs::Tokens(
                items
                    .iter()
                    .map(|i| match i {
                        Value::Array(t) => token_list(t),
                        _ => Err(invalid_input("a list of token lists must hold only lists")),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => {
                return Err(invalid_input(
                    "expected a string, a list of strings or token ids",
                ));
            }
        },
        Some(_) => {
            return Err(invalid_input(
                "expected a string, a list of strings or token ids",
            ));
        }
    };
    if let Inputs::Text(t) = &inputs
        && t.iter().any(String::is_empty)
    {
        return Err(invalid_input("strings must not be empty"));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(invalid_input(&format!(
            "at most {MAX_INPUTS} inputs per request, got {}",
            inputs.len()
        )));
    }
    Ok(inputs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    Base64,
}

/// The validated options of a request.
#[derive(Debug)]
struct Options {
    encoding: Encoding,
    dimensions: Option<u32>,
}

fn parse_options(body: &Map<String, Value>) -> Result<Options, HttpError> {
    let encoding = match body.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(_) => {
            return Err(HttpError::bad_request(
                "'encoding_format' must be \"float\" or \"base64\"",
                Some("encoding_format".into()),
            ));
        }
    };
    let dimensions = match surfaces::opt_uint(body, "dimensions")? {
        None => None,
        Some(d) if d >= 1 && d <= u64::from(u32::MAX) => u32::try_from(d).ok(),
        Some(_) => {
            return Err(HttpError::bad_request(
                "'dimensions' must be a positive integer",
                Some("dimensions".into()),
            ));
        }
    };
    if let Some(u) = body.get("user")
        && !(u.is_string() || u.is_null())
    {
        return Err(HttpError::bad_request(
            "'user' must be a string",
            Some("user".into()),
        ));
    }
    Ok(Options {
        encoding,
        dimensions,
    })
}

/// Embeddings and token counts folded from the worker's items.
#[derive(Debug, Default, PartialEq)]
struct Output {
    embeddings: Vec<Vec<f64>>,
    prompt_tokens: u64,
    total_tokens: u64,
}

/// One embedding of the worker's output: a list of numbers, or (as workers written for the
/// reference send it) a base64 string of little-endian `f32`s.
fn vector(v: &Value) -> Result<Vec<f64>, HttpError> {
    if let Some(text) = v.as_str() {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()
            .filter(|b| b.len() % 4 == 0)
            .ok_or_else(|| {
                HttpError::internal(
                    "malformed worker output: an embedding string is not base64 of f32s",
                )
            })?;
        return Ok(bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect());
    }
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
        .ok_or_else(|| {
            HttpError::internal(
                "malformed worker output: an embedding is neither a list of numbers nor base64",
            )
        })
}

/// Fold the worker's items: the engine shape `{"embeddings", "prompt_tokens",
/// "total_tokens"}` or an OpenAI response `{"data": [{"embedding", "index"}], "usage"}`.
fn fold(items: &[Value]) -> Result<Output, HttpError> {
    let mut out = Output::default();
    for item in items {
        if let Some(e) = item.get("embeddings").and_then(Value::as_array) {
            for v in e {
                out.embeddings.push(vector(v)?);
            }
            out.prompt_tokens += item
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            out.total_tokens += item
                .get("total_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        } else if let Some(data) = item.get("data").and_then(Value::as_array) {
            let mut indexed = Vec::with_capacity(data.len());
            for (i, d) in data.iter().enumerate() {
                let index = d.get("index").and_then(Value::as_u64).unwrap_or(i as u64);
                let e = d.get("embedding").ok_or_else(|| {
                    HttpError::internal("malformed worker output: a data item has no embedding")
                })?;
                indexed.push((index, vector(e)?));
            }
            indexed.sort_by_key(|(i, _)| *i);
            out.embeddings.extend(indexed.into_iter().map(|(_, v)| v));
            let usage = item.get("usage");
            let count = |k: &str| {
                usage
                    .and_then(|u| u.get(k))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            };
            out.prompt_tokens += count("prompt_tokens");
            out.total_tokens += count("total_tokens");
        } else {
            return Err(HttpError::internal(
                "malformed worker output: expected 'embeddings' or 'data'",
            ));
        }
    }
    Ok(out)
}

/// Standard base64 (with padding) of `bytes`.
pub(super) fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `embedding` value of one vector in `encoding`.
fn encode_vector(v: &[f64], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(v),
        Encoding::Base64 => {
            // OpenAI's base64 embeddings are little-endian f32s.
            #[expect(clippy::cast_possible_truncation, reason = "the wire format is f32")]
            let bytes: Vec<u8> = v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect();
            Value::String(base64(&bytes))
        }
    }
}

fn response(model: &str, out: Output, options: &Options) -> Value {
    let data: Vec<Value> = out
        .embeddings
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if let Some(d) = options.dimensions {
                v.truncate(d as usize);
            }
            json!({
                "object": "embedding",
                "index": index,
                "embedding": encode_vector(&v, options.encoding),
            })
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {
            "prompt_tokens": out.prompt_tokens,
            "total_tokens": out.total_tokens.max(out.prompt_tokens),
        },
    })
}

/// The token ids of `inputs` for a `ModelInput::Tokens` model (its tokenizer, special
/// tokens added), each at most the model's context length.
pub(super) fn token_ids(
    entry: &dynamo_llm::discovery::ModelEntry,
    inputs: Inputs,
) -> Result<Vec<Vec<u32>>, HttpError> {
    let token_ids = match (inputs, entry.preprocessor.as_ref()) {
        (Inputs::Tokens(t), _) => t,
        (Inputs::Text(texts), Some(pre)) => texts
            .iter()
            .map(|t| pre.encode(t, true))
            .collect::<dynamo_llm::Result<Vec<_>>>()?,
        (Inputs::Text(_), None) => {
            return Err(HttpError::internal("the model has no tokenizer"));
        }
    };
    let limit = entry.card.context_length;
    if limit > 0
        && let Some((i, t)) = token_ids
            .iter()
            .enumerate()
            .find(|(_, t)| t.len() > limit as usize)
    {
        return Err(invalid_input(&format!(
            "input {i} has {} tokens, more than the model's context length {limit}",
            t.len()
        )));
    }
    Ok(token_ids)
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), SURFACE.label);
    let result = handle(&shared, body, &mut record).await;
    record.finish(result)
}

async fn handle(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let mut req = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, SURFACE)?;
    let inputs = parse_input(req.get("input"))?;
    let options = parse_options(&req)?;
    let count = inputs.len();
    let items = if entry.preprocessor.is_some() {
        let token_ids = token_ids(&entry, inputs)?;
        // The reference's field set (it also sends `mdc_sum`, which our cards lack):
        // `dimensions` is always present, null when the client gave none.
        let wire = json!({
            "model": model,
            "token_ids": token_ids,
            "dimensions": options.dimensions,
            "annotations": [],
        });
        record.begin(&model);
        surfaces::call_worker(shared, &entry, &wire).await?
    } else {
        // Text workers get the client's body; the frontend does the base64 encoding.
        req.insert("encoding_format".into(), Value::String("float".into()));
        record.begin(&model);
        surfaces::call_worker(shared, &entry, &req).await?
    };
    let out = fold(&items)?;
    if out.embeddings.len() != count {
        return Err(HttpError::internal(format!(
            "the worker returned {} embeddings for {count} inputs",
            out.embeddings.len()
        )));
    }
    Ok(json_response(&response(&model, out, &options)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_as_openai_accepts_them() {
        assert_eq!(
            parse_input(Some(&json!("a"))).ok(),
            Some(Inputs::Text(vec!["a".into()]))
        );
        assert_eq!(
            parse_input(Some(&json!(["a", "b"]))).ok(),
            Some(Inputs::Text(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            parse_input(Some(&json!([1, 2]))).ok(),
            Some(Inputs::Tokens(vec![vec![1, 2]]))
        );
        assert_eq!(
            parse_input(Some(&json!([[1], [2, 3]]))).ok(),
            Some(Inputs::Tokens(vec![vec![1], vec![2, 3]]))
        );
        for bad in [
            json!(null),
            json!(3),
            json!([]),
            json!([""]),
            json!(["a", 1]),
            json!([1, "a"]),
            json!([-1]),
            json!([[]]),
            json!([[1], 2]),
            json!([1.5]),
            json!({"a": 1}),
        ] {
            let e = parse_input(Some(&bad)).expect_err(&bad.to_string());
            assert_eq!(e.status, 400, "{bad}");
        }
        let many: Vec<&str> = vec!["x"; MAX_INPUTS + 1];
        assert!(parse_input(Some(&json!(many))).is_err());
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&1.0f32.to_le_bytes()), "AACAPw==");
    }

    #[test]
    fn worker_vectors_may_be_base64_f32s_as_the_reference_sends_them() {
        let floats: Vec<u8> = [1.0f32, -0.5]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let v = vector(&Value::String(base64(&floats))).expect("base64 vector");
        assert_eq!(v, vec![1.0, -0.5]);
        assert_eq!(vector(&json!([0.25, 2])).expect("list"), vec![0.25, 2.0]);
        assert!(
            vector(&Value::String("AAA".into())).is_err(),
            "not whole f32s"
        );
        assert!(vector(&Value::String("!!".into())).is_err(), "not base64");
        assert!(vector(&json!({"x": 1})).is_err());
    }

    #[test]
    fn worker_items_fold_in_either_shape() {
        let engine =
            json!({"embeddings": [[1.0, 2.0], [3.0, 4.0]], "prompt_tokens": 3, "total_tokens": 3});
        let openai = json!({"data": [{"index": 1, "embedding": [3.0, 4.0]}, {"index": 0, "embedding": [1.0, 2.0]}],
                            "usage": {"prompt_tokens": 3, "total_tokens": 3}});
        let want = Output {
            embeddings: vec![vec![1.0, 2.0], vec![3.0, 4.0]],
            prompt_tokens: 3,
            total_tokens: 3,
        };
        assert_eq!(fold(&[engine]).ok(), Some(want));
        assert_eq!(fold(&[openai]).ok().map(|o| o.embeddings.len()), Some(2));
        assert!(fold(&[json!({"x": 1})]).is_err());
        assert!(fold(&[json!({"embeddings": [["a"]]})]).is_err());
    }

    #[test]
    fn options_are_validated() {
        let opts = |v: Value| parse_options(v.as_object().expect("object"));
        assert!(opts(json!({"encoding_format": "base64", "dimensions": 4})).is_ok());
        assert!(opts(json!({"encoding_format": "int8"})).is_err());
        assert!(opts(json!({"dimensions": 0})).is_err());
        assert!(opts(json!({"dimensions": "4"})).is_err());
        assert!(opts(json!({"user": 3})).is_err());
    }
}
