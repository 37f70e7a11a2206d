//! Errors of the frontend crate: what the layers below report, and the frontend's own
//! refusals (extension routes that clash). HTTP answers are not errors of this kind: a
//! request that fails becomes an [`crate::http::HttpError`] response.

use crate::http::extensions::RouteError;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building or running a frontend or entry point.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The LLM layer failed (model card, preprocessing, discovery, runtime).
    #[error(transparent)]
    Llm(#[from] dynamo_llm::Error),
    /// The simulated engine failed (invalid engine arguments, a port it cannot bind).
    #[error(transparent)]
    Mocker(#[from] dynamo_mocker::Error),
    /// A request sent through the frontend in-process (the terminal inputs of
    /// `run_input`) failed: the frontend's status and error message, as an HTTP client
    /// would have seen them.
    #[error("{0}")]
    Request(String),
    /// A frontend extension route was refused (a built-in path, or two routes on one).
    #[error(transparent)]
    Route(#[from] RouteError),
}
