//! Errors of the LLM layer (model cards, preprocessing, discovery). The frontend, mocker
//! and selection crates above define their own and wrap this one where they call into it.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the LLM layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A model could not be found: not a local directory and not in the offline Hugging Face
    /// cache. `tried` lists every path that was looked at.
    #[error("model {name:?} not found: it is not a local directory and not in the Hugging Face cache (no download is attempted); tried: {}", display_paths(.tried))]
    ModelNotFound {
        /// The name or path as given.
        name: String,
        /// Paths looked at, in order.
        tried: Vec<PathBuf>,
    },
    /// A model file exists but cannot be read or parsed.
    #[error("cannot load {}: {reason}", .path.display())]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file that must exist does not (e.g. `custom_template_path`).
    #[error("file not found: {}", .0.display())]
    FileNotFound(PathBuf),
    /// A model-registration or runtime-configuration argument is invalid.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// The argument.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A card or other serialized object is malformed.
    #[error("malformed {what}: {reason}")]
    Deserialize {
        /// What was being parsed.
        what: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// The chat template cannot be compiled or rendered (including `raise_exception` from
    /// the template, which models use to reject malformed conversations).
    #[error("chat template error: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// An OpenAI request is invalid; the frontend answers HTTP 400 with OpenAI's
    /// `invalid_request_error` envelope.
    #[error("{message}")]
    InvalidRequest {
        /// Human-readable message (OpenAI's wording where there is one).
        message: String,
        /// The offending request parameter, when known.
        param: Option<String>,
    },
    /// The distributed runtime (discovery store, request plane) failed.
    #[error("runtime: {0}")]
    Runtime(String),
    /// A wait ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A server (the HTTP or gRPC frontend) cannot listen on its address: the port is
    /// taken, or the address is not this machine's.
    #[error("cannot listen on {addr}: {reason}")]
    Listen {
        /// `host:port` as configured.
        addr: String,
        /// The OS error number (`EADDRINUSE`, ...), when there is one.
        errno: Option<i32>,
        /// The OS's message.
        reason: String,
    },
}

impl Error {
    /// [`Error::Listen`] from the error of binding `addr`.
    pub fn listen(addr: &str, e: &std::io::Error) -> Self {
        Self::Listen {
            addr: addr.to_owned(),
            errno: e.raw_os_error(),
            reason: e.to_string(),
        }
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidRequest`].
    pub fn request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// The HTTP status an OpenAI frontend should answer with: 400 for invalid requests and
    /// templates that reject the conversation, 500 otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::InvalidRequest { .. } | Self::Template(_) => 400,
            _ => 500,
        }
    }

    /// The OpenAI error envelope `{"error": {"message", "type", "param", "code"}}`.
    pub fn openai_error_body(&self) -> serde_json::Value {
        let (kind, param) = match self {
            Self::InvalidRequest { param, .. } => ("invalid_request_error", param.clone()),
            Self::Template(_) => ("invalid_request_error", Some("messages".to_owned())),
            _ => ("internal_error", None),
        };
        serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": param,
                "code": serde_json::Value::Null,
            }
        })
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "(nothing)".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
