//! `POST /v1/rerank` (Cohere/Jina-style), `POST /v1/classify` and `POST /v1/pooling`:
//! scoring surfaces whose worker computes and whose frontend validates and shapes.
//!
//! Rerank goes to `ModelType.Classify` models (rerankers are cross-encoders, i.e.
//! sequence classifiers): the worker receives the validated body and answers
//! `{"scores": [one per document]}` (or `{"results": [{"index", "relevance_score"}]}`);
//! the frontend sorts, applies `top_n` and adds the documents. Classify and pooling send
//! the client's body (plus `token_ids` for `ModelInput::Tokens` workers) and answer the
//! worker's `data` list in OpenAI's list envelope. See `docs/design/frontend_surfaces.md`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use dynamo_llm::model_card::ModelType;
use serde_json::{Map, Value, json};

use super::Shared;
use super::embeddings::{self, Inputs};
use super::error::HttpError;
use super::request_body::JsonBody;
use super::respond::json_response;
use super::surfaces::{self, Record, Surface, bad};

/// The most documents one rerank request may carry.
pub(super) const MAX_DOCUMENTS: usize = 1000;

const RERANK: Surface = Surface {
    path: "/v1/rerank",
    label: "rerank",
    flag: ModelType::CLASSIFY,
};
const CLASSIFY: Surface = Surface {
    path: "/v1/classify",
    label: "classify",
    flag: ModelType::CLASSIFY,
};
const POOLING: Surface = Surface {
    path: "/v1/pooling",
    label: "pooling",
    flag: ModelType::POOLING,
};

/// The documents' texts: strings or `{"text": ...}` objects.
fn documents(v: Option<&Value>) -> Result<Vec<String>, HttpError> {
    let Some(Value::Array(items)) = v else {
        return Err(match v {
            None | Some(Value::Null) => bad("missing required parameter: 'documents'", "documents"),
            Some(_) => bad("'documents' must be a list", "documents"),
        });
    };
    if items.is_empty() {
        return Err(bad("'documents' must not be empty", "documents"));
    }
    if items.len() > MAX_DOCUMENTS {
        return Err(bad(
            format!(
                "at most {MAX_DOCUMENTS} documents per request, got {}",
                items.len()
            ),
            "documents",
        ));
    }
    items
        .iter()
        .map(|d| match d {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => o
                .get("text")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| bad("a document object needs a string 'text'", "documents")),
            _ => Err(bad(
                "each document must be a string or {\"text\": ...}",
                "documents",
            )),
        })
        .collect()
}

/// The scores of the worker's answer, one per document.
fn scores(items: &[Value], n: usize) -> Result<Vec<f64>, HttpError> {
    let malformed = |what: &str| HttpError::internal(format!("malformed worker output: {what}"));
    let mut out = vec![None; n];
    let mut next = 0;
    for item in items {
        if let Some(s) = item.get("scores").and_then(Value::as_array) {
            for v in s {
                let slot = out
                    .get_mut(next)
                    .ok_or_else(|| malformed("too many scores"))?;
                *slot = Some(
                    v.as_f64()
                        .ok_or_else(|| malformed("a score is not a number"))?,
                );
                next += 1;
            }
        } else if let Some(r) = item.get("results").and_then(Value::as_array) {
            for v in r {
                let i = v
                    .get("index")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| malformed("a result has no index"))?;
                let s = v
                    .get("relevance_score")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| malformed("a result has no relevance_score"))?;
                let slot = usize::try_from(i)
                    .ok()
                    .and_then(|i| out.get_mut(i))
                    .ok_or_else(|| malformed("a result index is out of range"))?;
                *slot = Some(s);
            }
        } else {
            return Err(malformed("expected 'scores' or 'results'"));
        }
    }
    out.into_iter()
        .collect::<Option<Vec<f64>>>()
        .ok_or_else(|| malformed("not every document was scored"))
}

fn usage_tokens(items: &[Value]) -> u64 {
    items
        .iter()
        .filter_map(|i| i.get("usage").and_then(|u| u.get("total_tokens")))
        .filter_map(Value::as_u64)
        .sum()
}

/// `POST /v1/rerank`.
pub(super) async fn rerank(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), RERANK.label);
    let result = handle_rerank(&shared, body, &mut record).await;
    record.finish(result)
}

async fn handle_rerank(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let req = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, RERANK)?;
    let query = match req.get("query") {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        None | Some(Value::Null) => {
            return Err(bad("missing required parameter: 'query'", "query"));
        }
        Some(_) => return Err(bad("'query' must be a non-empty string", "query")),
    };
    let docs = documents(req.get("documents"))?;
    let top_n = match surfaces::opt_uint(&req, "top_n")? {
        Some(0) => return Err(bad("'top_n' must be at least 1", "top_n")),
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(docs.len()),
        None => docs.len(),
    };
    let return_documents = surfaces::opt_bool(&req, "return_documents")?.unwrap_or(false);
    let wire = json!({"model": model, "query": query, "documents": docs});
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &wire).await?;
    let scores = scores(&items, docs.len())?;
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
    let results: Vec<Value> = order
        .into_iter()
        .take(top_n)
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if return_documents {
                r["document"] = json!({"text": docs[i]});
            }
            r
        })
        .collect();
    Ok(json_response(&json!({
        "id": format!("rerank-{}", dynamo_runtime::Context::default().id()),
        "object": "rerank",
        "model": model,
        "results": results,
        "usage": {"total_tokens": usage_tokens(&items)},
    })))
}

/// `POST /v1/classify`.
pub(super) async fn classify(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), CLASSIFY.label);
    let result = handle_inputs(&shared, body, &mut record, CLASSIFY).await;
    record.finish(result)
}

/// `POST /v1/pooling`.
pub(super) async fn pooling(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), POOLING.label);
    let result = handle_inputs(&shared, body, &mut record, POOLING).await;
    record.finish(result)
}

/// Classify and pooling: `input` as embeddings accept it; one `data` item per input.
async fn handle_inputs(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
    surface: Surface,
) -> Result<Response, HttpError> {
    let body = body?;
    let mut req: Map<String, Value> = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, surface)?;
    let inputs: Inputs = embeddings::parse_input(req.get("input"))?;
    let count = inputs.len();
    if entry.is_tokens() {
        let ids = embeddings::token_ids(&entry, inputs)?;
        req.insert("token_ids".into(), json!(ids));
    }
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &req).await?;
    let mut data = Vec::with_capacity(count);
    for item in &items {
        let d = item.get("data").and_then(Value::as_array).ok_or_else(|| {
            HttpError::internal("malformed worker output: expected a 'data' list")
        })?;
        data.extend(d.iter().cloned());
    }
    if data.len() != count {
        return Err(HttpError::internal(format!(
            "the worker returned {} results for {count} inputs",
            data.len()
        )));
    }
    let prompt_tokens: u64 = items
        .iter()
        .filter_map(|i| i.get("usage").and_then(|u| u.get("prompt_tokens")))
        .filter_map(Value::as_u64)
        .sum();
    let prefix = if surface.label == "classify" {
        "classify"
    } else {
        "pool"
    };
    Ok(json_response(&json!({
        "id": format!("{prefix}-{}", dynamo_runtime::Context::default().id()),
        "object": "list",
        "created": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens.max(usage_tokens(&items)),
            "completion_tokens": 0,
        },
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_strings_or_text_objects() {
        assert_eq!(
            documents(Some(&json!(["a", {"text": "b"}]))).ok(),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        for bad in [
            json!(null),
            json!("a"),
            json!([]),
            json!([1]),
            json!([{"t": "x"}]),
        ] {
            assert!(documents(Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn scores_come_as_a_list_or_indexed_results() {
        assert_eq!(
            scores(&[json!({"scores": [0.5, 0.25]})], 2).ok(),
            Some(vec![0.5, 0.25])
        );
        let r = json!({"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]});
        assert_eq!(scores(&[r], 2).ok(), Some(vec![0.1, 0.9]));
        assert!(scores(&[json!({"scores": [0.5]})], 2).is_err());
        assert!(scores(&[json!({"scores": [0.5, 1, 2]})], 2).is_err());
        assert!(scores(&[json!({"nope": 1})], 1).is_err());
    }
}
