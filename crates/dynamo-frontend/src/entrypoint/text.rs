//! The terminal inputs of `run_input`: `"text"` (an interactive chat) and `"stdin"` (one
//! prompt).
//!
//! Both send OpenAI chat requests through the frontend's own router, in-process (no
//! listener), so an answer is exactly what an HTTP client would get: the same templating,
//! tokenization, routing and stop handling, for an in-process engine ([`LocalEngine`]) or
//! for discovered workers (waiting until a chat model appears).
//!
//! * `text`: reads one line at a time from stdin, streams the answer to stdout followed by a
//!   newline, and keeps the conversation (each turn sees the earlier ones) until EOF. The
//!   prompt marker goes to stderr, so stdout carries the answers only.
//! * `stdin`: reads the whole of stdin as one user message, prints the answer and returns.

use std::io::Write;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use dynamo_llm::discovery::ModelWatcher;
use dynamo_runtime::DistributedRuntime;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tower_service::Service;

use super::LocalEngine;
use crate::error::{Error, Result};
use crate::http::{FrontendConfig, HttpService};

/// Which terminal input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextInput {
    /// A chat: one message per line until EOF.
    Interactive,
    /// All of stdin is one message.
    Stdin,
}

impl TextInput {
    /// `"text"` or `"stdin"`.
    pub fn parse(input: &str) -> Option<Self> {
        match input {
            "text" => Some(Self::Interactive),
            "stdin" => Some(Self::Stdin),
            _ => None,
        }
    }
}

/// How often to look for a discovered chat model while none is there.
const MODEL_POLL: Duration = Duration::from_millis(50);

/// Run the terminal input against `local`, or against discovered workers (following
/// `config`'s namespace) when `local` is `None`. Returns at EOF or when the runtime stops.
///
/// # Errors
/// The engine cannot start; for `stdin`, the request fails.
pub async fn run(
    runtime: DistributedRuntime,
    input: TextInput,
    config: FrontendConfig,
    local: Option<&LocalEngine>,
) -> Result<()> {
    let namespace = config.namespace.clone();
    let service = HttpService::new(config);
    let model = if let Some(local) = local {
        let m = local.static_model()?;
        let name = m.name.clone();
        service.statics().add_token_model(m);
        name
    } else {
        // Route as the HTTP frontend would (KV mode included).
        service.install_kv_selector(&runtime);
        ModelWatcher::start(runtime.clone(), namespace, service.models().clone()).await;
        loop {
            let found = service
                .models()
                .list()
                .into_iter()
                .find(|m| m.card.model_type.supports_chat());
            if let Some(m) = found {
                // The card and the endpoint's instances arrive through separate watches:
                // a card seen first would send the first line to an endpoint with no
                // instance yet (a 503), so wait for one.
                tokio::select! {
                    // Its only error is the runtime shutting down: end as on EOF.
                    r = m.client.wait_for_instances() => if r.is_err() { return Ok(()) },
                    () = runtime.stopped() => return Ok(()),
                }
                break m.name.clone();
            }
            tokio::select! {
                () = tokio::time::sleep(MODEL_POLL) => {}
                () = runtime.stopped() => return Ok(()),
            }
        }
    };
    let router = service.router();
    let mut lines = stdin_lines(input);
    let mut history: Vec<serde_json::Value> = Vec::new();
    loop {
        if input == TextInput::Interactive {
            prompt_marker();
        }
        let line = tokio::select! {
            l = lines.recv() => l,
            () = runtime.stopped() => None,
        };
        let Some(line) = line else {
            return Ok(());
        };
        let text = line.trim_end_matches(['\r', '\n']);
        if input == TextInput::Interactive && text.trim().is_empty() {
            continue;
        }
        history.push(serde_json::json!({"role": "user", "content": text}));
        let mut out = std::io::stdout();
        match chat(&router, &model, &history, &mut out).await {
            Ok(answer) => {
                let _ = writeln!(out);
                let _ = out.flush();
                history.push(serde_json::json!({"role": "assistant", "content": answer}));
            }
            Err(e) if input == TextInput::Interactive => {
                let _ = writeln!(out);
                let _ = out.flush();
                let _ = writeln!(std::io::stderr(), "error: {e}");
                history.pop();
            }
            Err(e) => return Err(e),
        }
        if input == TextInput::Stdin {
            return Ok(());
        }
    }
}

fn prompt_marker() {
    let mut err = std::io::stderr();
    let _ = write!(err, "> ");
    let _ = err.flush();
}

/// Stdin lines (or, for [`TextInput::Stdin`], all of it as one item), read on a plain
/// thread: a blocking read must never hold a runtime worker, and the thread may outlive
/// the chat when the runtime stops first.
fn stdin_lines(input: TextInput) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new()
        .name("dynamo-stdin".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            match input {
                TextInput::Stdin => {
                    let mut all = String::new();
                    if std::io::Read::read_to_string(&mut stdin.lock(), &mut all).is_ok() {
                        let _ = tx.send(all);
                    }
                }
                TextInput::Interactive => {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match stdin.read_line(&mut line) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {
                                if tx.send(line.clone()).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the stdin reader");
    }
    rx
}

/// Send one streaming chat request through `router`, writing the answer's text to `out` as
/// it arrives; returns the whole answer.
///
/// # Errors
/// [`Error::Runtime`] with the frontend's error message.
pub async fn chat(
    router: &Router,
    model: &str,
    messages: &[serde_json::Value],
    out: &mut impl Write,
) -> Result<String> {
    let body = serde_json::json!({"model": model, "messages": messages, "stream": true});
    let request = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .map_err(|e| Error::Request(e.to_string()))?;
    let mut svc = router.clone();
    let response = match Service::<Request<Body>>::call(&mut svc, request).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    let status = response.status();
    let mut body = response.into_body().into_data_stream();
    if status != StatusCode::OK {
        let mut bytes = Vec::new();
        while let Some(Ok(b)) = body.next().await {
            bytes.extend_from_slice(&b);
        }
        return Err(Error::Request(error_message(status.as_u16(), &bytes)));
    }
    let mut parser = SseParser::default();
    let mut answer = String::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::Request(e.to_string()))?;
        for event in parser.push(&chunk) {
            match event {
                SseEvent::Done => return Ok(answer),
                SseEvent::Error(data) => {
                    return Err(Error::Request(error_message(500, data.as_bytes())));
                }
                SseEvent::Data(data) => {
                    let text = delta_text(&data);
                    if !text.is_empty() {
                        let _ = out.write_all(text.as_bytes());
                        let _ = out.flush();
                        answer.push_str(&text);
                    }
                }
            }
        }
    }
    Ok(answer)
}

/// The message of an OpenAI error envelope, else the raw body.
fn error_message(status: u16, body: &[u8]) -> String {
    let parsed: Option<String> = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        });
    let msg = parsed.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    format!("HTTP {status}: {msg}")
}

/// The text of a chat chunk (`choices[0].delta.content`).
fn delta_text(data: &str) -> String {
    serde_json::from_str::<serde_json::Value>(data)
        .ok()
        .and_then(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// One server-sent event of a chat stream.
#[derive(Debug, PartialEq, Eq)]
enum SseEvent {
    Data(String),
    Error(String),
    Done,
}

/// Splits an SSE byte stream into events (`\n\n`-separated; `event:` and `data:` lines).
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&raw);
            let mut name = None;
            let mut data = String::new();
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if name.as_deref() == Some("error") {
                events.push(SseEvent::Error(data));
            } else if data == "[DONE]" {
                events.push(SseEvent::Done);
            } else if !data.is_empty() {
                events.push(SseEvent::Data(data));
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::http::StaticTokenModel;
    use dynamo_llm::engines::EchoEngine;
    use dynamo_llm::model_card::{ModelInput, ModelType, RegisterModelArgs};

    #[test]
    fn sse_events_split_across_reads() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\nevent: error\ndata: {}\n\ndata: [DONE]\n\n"),
            vec![
                SseEvent::Data("{\"a\":1}".into()),
                SseEvent::Error("{}".into()),
                SseEvent::Done
            ]
        );
    }

    #[test]
    fn error_messages_come_from_the_envelope() {
        assert_eq!(
            error_message(404, br#"{"error": {"message": "no such model"}}"#),
            "HTTP 404: no such model"
        );
        assert_eq!(error_message(500, b"oops"), "HTTP 500: oops");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chat_through_the_router_echoes_the_templated_prompt() {
        let card = RegisterModelArgs {
            model_input: ModelInput::Tokens,
            model_type: ModelType::CHAT.union(ModelType::COMPLETIONS),
            model_path: concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../dynamo-llm/tests/data/tiny-model"
            )
            .into(),
            model_name: Some("echo".into()),
            ..Default::default()
        }
        .build_card()
        .expect("card");
        let service = HttpService::new(FrontendConfig::default());
        let model =
            StaticTokenModel::new(card, Arc::new(EchoEngine::new(Duration::ZERO))).expect("model");
        service.statics().add_token_model(model);
        let router = service.router();
        let mut out = Vec::new();
        let messages = [serde_json::json!({"role": "user", "content": "hello world"})];
        let answer = chat(&router, "echo", &messages, &mut out)
            .await
            .expect("answer");
        assert!(answer.contains("hello world"), "{answer:?}");
        assert_eq!(String::from_utf8(out).expect("utf8"), answer);
        let err = chat(&router, "missing", &messages, &mut Vec::new())
            .await
            .expect_err("unknown model");
        assert!(err.to_string().contains("404"), "{err}");
    }
}
