//! Reading an OpenAI request body: media type, size limit and deadline.
//!
//! * Only `application/json` (any parameters, e.g. `; charset=utf-8`) and `application/*+json`
//!   bodies are read; anything else, a missing `Content-Type` included, is answered 415.
//!   HTML forms can send `application/x-www-form-urlencoded`, `multipart/form-data` and
//!   `text/plain` across sites without a CORS preflight, so accepting any of them would let
//!   a web page make a visitor's browser start generations on a frontend it can reach. The
//!   official OpenAI clients and `curl -H 'Content-Type: application/json'` send JSON.
//! * A body over the limit is answered 413 without being kept: when `Content-Length` says
//!   so, nothing of it is stored. Up to [`DRAIN_CAP`] bytes past the limit are read and
//!   discarded first, so that a client that writes its whole body before reading (Python's
//!   `urllib`, for one) sees the 413 rather than a broken pipe. A body with a length is read
//!   into one buffer of exactly that size.
//! * The whole body must arrive within the body-read timeout (408 otherwise), so a client
//!   sending a byte now and then cannot hold a connection and its buffer forever.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;

use super::Shared;
use super::error::HttpError;

/// A handler argument: the JSON body read by [`read`] (media type, the service's size limit
/// and read deadline), or the error to answer with.
pub(super) struct JsonBody(pub(super) Result<Bytes, HttpError>);

impl FromRequest<Arc<Shared>> for JsonBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, shared: &Arc<Shared>) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let limit = shared.body_limit;
        Ok(Self(
            read(&parts.headers, body, limit, shared.body_read_timeout).await,
        ))
    }
}

/// A handler argument: a body of any media type (the handler checks it, e.g. multipart),
/// read within the service's size limit and read deadline.
pub(super) struct AnyBody(pub(super) Result<Bytes, HttpError>);

impl FromRequest<Arc<Shared>> for AnyBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, shared: &Arc<Shared>) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let limit = shared.body_limit;
        Ok(Self(
            read_limited(&parts.headers, body, limit, shared.body_read_timeout).await,
        ))
    }
}

/// Whether `headers` declare a JSON body.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// Most bytes past the limit read and discarded before a 413 is answered (see the module
/// docs): enough for clients that send a somewhat larger body; a much larger one is cut off.
pub(super) const DRAIN_CAP: u64 = 16 * 1024 * 1024;

/// Read and discard up to `max` bytes of `stream` (a discarded chunk costs no memory).
async fn drain(mut stream: axum::body::BodyDataStream, max: u64) {
    let mut seen = 0u64;
    while seen < max {
        match stream.next().await {
            Some(Ok(chunk)) => seen += chunk.len() as u64,
            _ => return,
        }
    }
}

fn too_large(limit: usize) -> HttpError {
    HttpError::new(
        413,
        format!("The request body is larger than the limit of {limit} bytes."),
    )
}

/// Check the media type, then read the body within `limit` bytes and `deadline`.
///
/// # Errors
/// 415 for a body that is not JSON, 413 over the limit, 408 past the deadline, 400 when the
/// connection fails while the body is read.
pub(super) async fn read(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Option<Duration>,
) -> Result<Bytes, HttpError> {
    if !is_json(headers) {
        let got = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| "none".to_owned(), |v| format!("`{v}`"));
        return Err(HttpError::new(
            415,
            format!("Expected request with `Content-Type: application/json` (got {got})."),
        ));
    }
    read_limited(headers, body, limit, deadline).await
}

/// Read the body within `limit` bytes and `deadline`, whatever its media type.
///
/// # Errors
/// 413 over the limit, 408 past the deadline, 400 when the connection fails meanwhile.
pub(super) async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Option<Duration>,
) -> Result<Bytes, HttpError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let collect = async {
        let mut stream = body.into_data_stream();
        if let Some(n) = declared
            && n > limit as u64
        {
            if n <= limit as u64 + DRAIN_CAP {
                drain(stream, n).await;
            }
            return Err(too_large(limit));
        }
        // A declared length is at most `limit` here: one exact allocation, no regrowth.
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                HttpError::bad_request(format!("cannot read the request body: {e}"), None)
            })?;
            if buf.len() + chunk.len() > limit {
                drop(buf);
                drain(stream, DRAIN_CAP).await;
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    match deadline {
        Some(d) => tokio::time::timeout(d, collect).await.unwrap_or_else(|_| {
            Err(HttpError::new(
                408,
                format!(
                    "The request body did not arrive within {} s.",
                    d.as_secs_f64()
                ),
            ))
        }),
        None => collect.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(ct) = ct {
            h.insert(header::CONTENT_TYPE, ct.parse().expect("header"));
        }
        h
    }

    #[test]
    fn only_json_media_types_are_read() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(is_json(&headers(Some(ok))), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
            "",
        ] {
            assert!(!is_json(&headers(Some(bad))), "{bad}");
        }
        assert!(!is_json(&headers(None)));
    }

    #[tokio::test]
    async fn limits_and_deadline_are_enforced() {
        let json = headers(Some("application/json"));
        let ok = read(&json, Body::from("{}"), 2, None).await.expect("fits");
        assert_eq!(&ok[..], b"{}");
        let e = read(&json, Body::from("{}  "), 2, None)
            .await
            .expect_err("too big");
        assert_eq!(e.status, 413);
        let e = read(&headers(Some("text/plain")), Body::from("{}"), 2, None)
            .await
            .expect_err("not json");
        assert_eq!(e.status, 415);
        // A body that never ends.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let e = read(
            &json,
            Body::from_stream(stream),
            10,
            Some(Duration::from_millis(20)),
        )
        .await
        .expect_err("deadline");
        assert_eq!(e.status, 408);
    }
}
