//! HTTP errors in OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status.
    pub status: u16,
    /// Message.
    pub message: String,
    /// The offending parameter.
    pub param: Option<String>,
}

impl HttpError {
    /// Any status.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            param,
        }
    }

    /// 404 for an unknown model.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: 404,
            message: format!(
                "The model `{model}` does not exist. GET /v1/models lists the models served here."
            ),
            param: Some("model".into()),
        }
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, message)
    }

    /// Every worker is over its busy thresholds: 529 (the reference's current answer), or
    /// the status in `DYN_HTTP_OVERLOAD_STATUS_CODE` (e.g. 503, as older versions).
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(overload_status(), message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// OpenAI's error type for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            s if (400..500).contains(&s) => "invalid_request_error",
            503 | 529 => "service_unavailable",
            _ => "internal_server_error",
        }
    }

    /// The envelope.
    pub fn body(&self) -> serde_json::Value {
        // A 404 is about a model only when it names the `model` parameter; unknown routes
        // and disabled endpoints are plain `not_found`.
        let code = match self.status {
            404 if self.param.as_deref() == Some("model") => "model_not_found".into(),
            404 => "not_found".into(),
            405 => "method_not_allowed".into(),
            _ => serde_json::Value::Null,
        };
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": code,
            }
        })
    }
}

/// The status of [`HttpError::overloaded`], read once from `DYN_HTTP_OVERLOAD_STATUS_CODE`
/// (4xx or 5xx; anything else keeps the default 529).
fn overload_status() -> u16 {
    static STATUS: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *STATUS.get_or_init(|| {
        std::env::var("DYN_HTTP_OVERLOAD_STATUS_CODE")
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|s| (400..600).contains(s))
            .unwrap_or(529)
    })
}

impl From<dynamo_llm::Error> for HttpError {
    fn from(e: dynamo_llm::Error) -> Self {
        let param = match &e {
            dynamo_llm::Error::InvalidRequest { param, .. } => param.clone(),
            dynamo_llm::Error::Template(_) => Some("messages".into()),
            _ => None,
        };
        Self {
            status: e.http_status(),
            message: e.to_string(),
            param,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.body().to_string();
        (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}
