//! Media surfaces: `POST /v1/images/generations` and `POST /v1/images/edits`
//! (multipart; `ModelType.Images`), `POST
//! /v1/audio/speech` (`ModelType.Audios`), `POST /v1/videos` and `POST /v1/videos/stream`
//! (`ModelType.Videos`). The frontend validates OpenAI's body, sends it to a worker and
//! shapes the answer; the worker contracts are in `docs/design/frontend_surfaces.md`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use dynamo_llm::model_card::ModelType;
use serde_json::{Map, Value, json};

use super::Shared;
use super::engine::decode_item;
use super::error::HttpError;
use super::request_body::{AnyBody, JsonBody};
use super::respond::{DONE, json_response, sse_data, sse_headers};
use super::surfaces::{self, Record, Surface, bad};

/// The longest prompt or speech input accepted, in characters (OpenAI's image limit).
pub(super) const MAX_PROMPT_CHARS: usize = 32_000;
/// The longest speech input, in characters (OpenAI's limit).
pub(super) const MAX_SPEECH_CHARS: usize = 4096;

const IMAGES: Surface = Surface {
    path: "/v1/images/generations",
    label: "images",
    flag: ModelType::IMAGES,
};
const IMAGES_EDITS: Surface = Surface {
    path: "/v1/images/edits",
    label: "images_edits",
    flag: ModelType::IMAGES,
};
const SPEECH: Surface = Surface {
    path: "/v1/audio/speech",
    label: "audio_speech",
    flag: ModelType::AUDIOS,
};
const VIDEOS: Surface = Surface {
    path: "/v1/videos",
    label: "videos",
    flag: ModelType::VIDEOS,
};

/// A required non-empty string of at most `max` characters.
fn text_field(body: &Map<String, Value>, key: &str, max: usize) -> Result<String, HttpError> {
    match body.get(key) {
        Some(Value::String(s)) if !s.is_empty() => {
            let n = s.chars().count();
            if n > max {
                Err(bad(
                    format!("'{key}' is {n} characters long, more than {max}"),
                    key,
                ))
            } else {
                Ok(s.clone())
            }
        }
        None | Some(Value::Null) => Err(bad(format!("missing required parameter: '{key}'"), key)),
        Some(_) => Err(bad(format!("'{key}' must be a non-empty string"), key)),
    }
}

/// An optional string field restricted to `allowed`.
fn choice<'a>(
    body: &Map<String, Value>,
    key: &str,
    allowed: &[&'a str],
) -> Result<Option<&'a str>, HttpError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => allowed
            .iter()
            .find(|a| **a == s.as_str())
            .copied()
            .map(Some)
            .ok_or_else(|| {
                bad(
                    format!("'{key}' must be one of {}", allowed.join(", ")),
                    key,
                )
            }),
        Some(_) => Err(bad(format!("'{key}' must be a string"), key)),
    }
}

/// `size` as `WIDTHxHEIGHT` (or `auto`).
fn size(body: &Map<String, Value>) -> Result<(), HttpError> {
    match body.get("size") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s == "auto" => Ok(()),
        Some(Value::String(s)) => {
            let ok = s.split_once('x').is_some_and(|(w, h)| {
                matches!((w.parse::<u32>(), h.parse::<u32>()), (Ok(w), Ok(h)) if w > 0 && h > 0)
            });
            if ok {
                Ok(())
            } else {
                Err(bad("'size' must be WIDTHxHEIGHT, e.g. 1024x1024", "size"))
            }
        }
        Some(_) => Err(bad("'size' must be a string", "size")),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /v1/images/generations`.
pub(super) async fn images(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), IMAGES.label);
    let result = handle_images(&shared, body, &mut record).await;
    record.finish(result)
}

async fn handle_images(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let req = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, IMAGES)?;
    text_field(&req, "prompt", MAX_PROMPT_CHARS)?;
    let n = match surfaces::opt_uint(&req, "n")? {
        None => 1,
        Some(n @ 1..=10) => n,
        Some(_) => return Err(bad("'n' must be between 1 and 10", "n")),
    };
    choice(&req, "response_format", &["url", "b64_json"])?;
    size(&req)?;
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &req).await?;
    images_response(&items, n)
}

/// The images response of the worker's items, which must hold `n` images.
fn images_response(items: &[Value], n: u64) -> Result<Response, HttpError> {
    let mut data = Vec::new();
    for item in items {
        let d = item.get("data").and_then(Value::as_array).ok_or_else(|| {
            HttpError::internal("malformed worker output: expected a 'data' list")
        })?;
        data.extend(d.iter().cloned());
    }
    if data.len() as u64 != n {
        return Err(HttpError::internal(format!(
            "the worker returned {} images for n = {n}",
            data.len()
        )));
    }
    let created = items
        .first()
        .and_then(|i| i.get("created"))
        .and_then(Value::as_u64)
        .unwrap_or_else(now_secs);
    Ok(json_response(&json!({"created": created, "data": data})))
}

/// One part of a `multipart/form-data` body.
#[derive(Debug, PartialEq)]
struct Part {
    name: String,
    filename: Option<String>,
    data: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A `name="value"` parameter of a `Content-Disposition` header.
fn disposition_param(header: &str, key: &str) -> Option<String> {
    header.split(';').map(str::trim).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The boundary of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';').map(str::trim);
    if !params.next()?.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// Parse a `multipart/form-data` body (RFC 7578): the parts in order. A small parser
/// instead of axum's `multipart` feature: the route needs whole small bodies only.
fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, HttpError> {
    let malformed =
        |what: &str| HttpError::bad_request(format!("malformed multipart body: {what}"), None);
    let delim = format!("--{boundary}");
    let next_delim = format!("\r\n--{boundary}");
    let mut pos =
        find(body, delim.as_bytes(), 0).ok_or_else(|| malformed("no boundary"))? + delim.len();
    let mut parts = Vec::new();
    loop {
        match body.get(pos..pos + 2) {
            Some(b"--") => return Ok(parts),
            Some(b"\r\n") => pos += 2,
            _ => return Err(malformed("bad boundary line")),
        }
        let head_end =
            find(body, b"\r\n\r\n", pos).ok_or_else(|| malformed("part headers never end"))?;
        let head = std::str::from_utf8(&body[pos..head_end])
            .map_err(|_| malformed("part headers are not UTF-8"))?;
        let disposition = head
            .split("\r\n")
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v.trim())
            })
            .ok_or_else(|| malformed("a part has no Content-Disposition"))?;
        let name = disposition_param(disposition, "name")
            .ok_or_else(|| malformed("a part has no name"))?;
        let filename = disposition_param(disposition, "filename");
        let start = head_end + 4;
        let end = find(body, next_delim.as_bytes(), start)
            .ok_or_else(|| malformed("a part never ends"))?;
        parts.push(Part {
            name,
            filename,
            data: body[start..end].to_vec(),
        });
        pos = end + next_delim.len();
    }
}

/// The most images one edit request may carry.
pub(super) const MAX_EDIT_IMAGES: usize = 16;

/// `POST /v1/images/edits` (`multipart/form-data`): the worker receives `{"model",
/// "prompt", "image": [base64], "mask"?: base64, "n"?, "size"?, "response_format"?}` and
/// answers as for generations.
pub(super) async fn image_edits(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    AnyBody(body): AnyBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), "images_edits");
    let result = handle_edits(&shared, &headers, body, &mut record).await;
    record.finish(result)
}

async fn handle_edits(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let boundary = boundary(ct).ok_or_else(|| {
        HttpError::new(
            415,
            "/v1/images/edits takes multipart/form-data with a boundary",
        )
    })?;
    let parts = parse_multipart(&body, &boundary)?;
    let mut req = Map::new();
    let mut images = Vec::new();
    for part in parts {
        match part.name.as_str() {
            "image" | "image[]" => {
                if part.data.is_empty() {
                    return Err(bad("an 'image' file is empty", "image"));
                }
                images.push(Value::String(super::embeddings::base64(&part.data)));
            }
            "mask" => {
                req.insert(
                    "mask".into(),
                    Value::String(super::embeddings::base64(&part.data)),
                );
            }
            name => {
                if part.filename.is_some() {
                    return Err(bad(format!("unexpected file field '{name}'"), name));
                }
                let text = String::from_utf8(part.data)
                    .map_err(|_| bad(format!("'{name}' is not UTF-8 text"), name))?;
                let value = match name {
                    "n" => json!(
                        text.trim()
                            .parse::<u64>()
                            .map_err(|_| bad("'n' must be an integer", "n"))?
                    ),
                    _ => Value::String(text),
                };
                req.insert(name.to_owned(), value);
            }
        }
    }
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, IMAGES_EDITS)?;
    text_field(&req, "prompt", MAX_PROMPT_CHARS)?;
    if images.is_empty() {
        return Err(bad("missing required file: 'image'", "image"));
    }
    if images.len() > MAX_EDIT_IMAGES {
        return Err(bad(
            format!("at most {MAX_EDIT_IMAGES} images per request"),
            "image",
        ));
    }
    let n = match surfaces::opt_uint(&req, "n")? {
        None => 1,
        Some(n @ 1..=10) => n,
        Some(_) => return Err(bad("'n' must be between 1 and 10", "n")),
    };
    choice(&req, "response_format", &["url", "b64_json"])?;
    size(&req)?;
    req.insert("image".into(), Value::Array(images));
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &req).await?;
    images_response(&items, n)
}

/// The MIME type of a speech `response_format`.
fn audio_mime(format: &str) -> &'static str {
    match format {
        "opus" => "audio/ogg",
        "aac" => "audio/aac",
        "flac" => "audio/flac",
        "wav" => "audio/wav",
        "pcm" => "audio/pcm",
        _ => "audio/mpeg",
    }
}

/// Decode standard base64 (padding optional); `None` on any invalid character.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    ENGINE.decode(s).ok()
}

/// `POST /v1/audio/speech`: the worker answers `{"audio": base64, "content_type"?}`;
/// the client gets the raw audio bytes.
pub(super) async fn speech(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), SPEECH.label);
    let result = handle_speech(&shared, body, &mut record).await;
    record.finish(result)
}

async fn handle_speech(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let req = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, SPEECH)?;
    text_field(&req, "input", MAX_SPEECH_CHARS)?;
    text_field(&req, "voice", 256)?;
    let format = choice(
        &req,
        "response_format",
        &["mp3", "opus", "aac", "flac", "wav", "pcm"],
    )?
    .unwrap_or("mp3");
    match req.get("speed") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_f64().is_some_and(|s| (0.25..=4.0).contains(&s)) => {}
        Some(_) => return Err(bad("'speed' must be a number from 0.25 to 4.0", "speed")),
    }
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &req).await?;
    let audio = items[0]
        .get("audio")
        .and_then(Value::as_str)
        .and_then(base64_decode)
        .ok_or_else(|| HttpError::internal("malformed worker output: expected base64 'audio'"))?;
    let mime = items[0]
        .get("content_type")
        .and_then(Value::as_str)
        .map_or_else(|| audio_mime(format).to_owned(), str::to_owned);
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, mime)], audio).into_response())
}

fn validate_video(req: &Map<String, Value>) -> Result<(), HttpError> {
    text_field(req, "prompt", MAX_PROMPT_CHARS)?;
    size(req)?;
    match req.get("seconds") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.parse::<u32>().is_ok_and(|n| n > 0) => Ok(()),
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => Ok(()),
        Some(_) => Err(bad("'seconds' must be a positive integer", "seconds")),
    }
}

/// `POST /v1/videos`: the worker's video object, answered as JSON.
pub(super) async fn videos(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), VIDEOS.label);
    let result = handle_videos(&shared, body, &mut record).await;
    record.finish(result)
}

async fn handle_videos(
    shared: &Shared,
    body: Result<Bytes, HttpError>,
    record: &mut Record,
) -> Result<Response, HttpError> {
    let body = body?;
    let req = surfaces::json_object(&body)?;
    let model = surfaces::model_field(&req)?;
    let entry = surfaces::lookup(shared, &model, VIDEOS)?;
    validate_video(&req)?;
    record.begin(&model);
    let items = surfaces::call_worker(shared, &entry, &req).await?;
    let mut video = items[0].clone();
    if let Some(o) = video.as_object_mut() {
        o.entry("object").or_insert_with(|| json!("video"));
        o.entry("model").or_insert_with(|| json!(model));
        o.entry("created_at").or_insert_with(|| json!(now_secs()));
    }
    Ok(json_response(&video))
}

/// `POST /v1/videos/stream`: each worker item is one server-sent event, then `[DONE]`.
/// Validation and routing errors are answered before the stream starts.
pub(super) async fn videos_stream(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut record = Record::new(Arc::clone(&shared), "videos_stream");
    let opened = async {
        let body = body?;
        let req = surfaces::json_object(&body)?;
        let model = surfaces::model_field(&req)?;
        let entry = surfaces::lookup(&shared, &model, VIDEOS)?;
        validate_video(&req)?;
        record.begin(&model);
        surfaces::open_worker(&shared, &entry, &req).await
    }
    .await;
    let stream = match opened {
        Ok(s) => s,
        Err(e) => return record.finish(Err(e)),
    };
    // The stream owns the record: the request counts as in flight until it ends, and a
    // client that goes away drops both (stopping the worker).
    let events = futures_util::stream::unfold(Some((stream, record)), |state| async move {
        let (mut stream, record) = state?;
        let error_event = |e: &HttpError| {
            let mut out = b"event: error\n".to_vec();
            out.extend_from_slice(&sse_data(e.body().to_string().as_bytes()));
            Bytes::from(out)
        };
        match stream.next().await {
            Some(Ok(bytes)) => match decode_item::<Value>(&bytes) {
                Ok(Some(v)) => {
                    let json = serde_json::to_vec(&v).unwrap_or_default();
                    Some((
                        Ok::<_, Infallible>(Bytes::from(sse_data(&json))),
                        Some((stream, record)),
                    ))
                }
                Ok(None) => Some((Ok(Bytes::new()), Some((stream, record)))),
                Err(e) => {
                    let out = error_event(&e);
                    drop(record.finish(Err(e)));
                    Some((Ok(out), None))
                }
            },
            None => {
                drop(record.finish(Ok(StatusCode::OK.into_response())));
                Some((Ok(Bytes::from_static(DONE)), None))
            }
            Some(Err(e)) => {
                let e = HttpError::internal(format!("stream ended with an error: {e}"));
                let out = error_event(&e);
                drop(record.finish(Err(e)));
                Some((Ok(out), None))
            }
        }
    });
    sse_headers(Body::from_stream(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_what_the_embeddings_encoder_writes() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"RIFF\x00\xffwav"] {
            let s = super::super::embeddings::base64(data);
            assert_eq!(base64_decode(&s).as_deref(), Some(data));
        }
        assert!(base64_decode("a$==").is_none());
        assert!(base64_decode("abcde").is_none());
    }

    #[test]
    fn multipart_bodies_parse_into_parts() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nblue\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\
Content-Type: image/png\r\n\r\n\x89PNG\r\n--x\r\n--XyZ--\r\n";
        let parts = parse_multipart(body, "XyZ").expect("parses");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "prompt");
        assert_eq!(parts[0].data, b"blue");
        assert_eq!(parts[1].filename.as_deref(), Some("a.png"));
        assert_eq!(parts[1].data, b"\x89PNG\r\n--x");
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some("XyZ")
        );
        assert!(boundary("application/json").is_none());
        assert!(parse_multipart(b"--XyZ\r\nno headers end", "XyZ").is_err());
        assert!(parse_multipart(b"nothing", "XyZ").is_err());
    }

    #[test]
    fn sizes_and_choices_are_checked() {
        let obj = |v: Value| v.as_object().cloned().expect("object");
        assert!(size(&obj(json!({"size": "256x256"}))).is_ok());
        assert!(size(&obj(json!({"size": "auto"}))).is_ok());
        for bad in [json!("256"), json!("0x5"), json!("ax5"), json!(5)] {
            assert!(size(&obj(json!({ "size": bad }))).is_err(), "{bad}");
        }
        assert!(choice(&obj(json!({"f": "wav"})), "f", &["wav"]).is_ok());
        assert!(choice(&obj(json!({"f": "ogg"})), "f", &["wav"]).is_err());
    }
}
