//! Extension routes: trusted `GET` handlers a frontend embedder adds next to the built-in
//! routes (`run_input(..., frontend_route_extensions=[FrontendRoute(...)])` in Python).
//!
//! Rules (API_CONTRACT.md, checked against ai-dynamo-runtime 1.6.1):
//! * only `GET` (any case) — `unsupported FrontendRoute method 'POST'; only GET is supported`;
//! * static paths: starting with `/`, no `{`, `}`, `*`, whitespace or control characters;
//! * two extensions on one path → `duplicate frontend route registered: GET /x`; an extension
//!   on a built-in `GET` path → `duplicate HTTP route registered: GET /health conflicts with
//!   GET /health`, refused before the frontend starts serving (the reference allows a `GET`
//!   extension on a path whose built-in route has another method, e.g.
//!   `/v1/chat/completions`, and on a path a built-in wildcard would match, e.g.
//!   `/v1/models/foo`: the static route wins; so do we);
//! * a handler runs on a blocking thread with a fresh [`ExtensionContext`]; whatever goes
//!   wrong in it is logged and answered `500 {"error": "frontend route extension failed"}`,
//!   and the frontend keeps serving.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::watch;

use super::models::ModelView;

/// Why an extension route was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Not `GET`.
    #[error("unsupported FrontendRoute method '{0}'; only GET is supported")]
    Method(String),
    /// The path does not start with `/`.
    #[error("frontend route path must start with '/': {0:?}")]
    NotAbsolute(String),
    /// The path has a parameter, wildcard, whitespace or control character.
    #[error("frontend route path must be static (no '{{...}}', '*', or whitespace): {0:?}")]
    NotStatic(String),
    /// Two extensions on one path.
    #[error("duplicate frontend route registered: GET {0}")]
    Duplicate(String),
    /// An extension on a built-in path.
    #[error("duplicate HTTP route registered: GET {0} conflicts with GET {0}")]
    ShadowsBuiltin(String),
    /// An HTTP status outside 100..=999.
    #[error("invalid status code {0}: invalid status code")]
    Status(i64),
}

/// What a handler answers: a status and a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtensionResponse {
    /// HTTP status (checked by [`ExtensionResponse::new`]).
    pub status: u16,
    /// JSON body.
    pub body: serde_json::Value,
}

impl ExtensionResponse {
    /// A response with `status`.
    ///
    /// # Errors
    /// [`RouteError::Status`] unless `100 <= status <= 999` (what HTTP allows on the wire).
    pub fn new(status: i64, body: serde_json::Value) -> Result<Self, RouteError> {
        match u16::try_from(status) {
            Ok(s) if StatusCode::from_u16(s).is_ok() => Ok(Self { status: s, body }),
            _ => Err(RouteError::Status(status)),
        }
    }
}

/// A handler: runs on a blocking thread; `Err` (a message for the log) becomes a 500.
pub type ExtensionHandler =
    Arc<dyn Fn(ExtensionContext) -> Result<ExtensionResponse, String> + Send + Sync>;

/// One extension route.
#[derive(Clone)]
pub struct ExtensionRoute {
    path: String,
    handler: ExtensionHandler,
}

impl std::fmt::Debug for ExtensionRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtensionRoute")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ExtensionRoute {
    /// A route for `method` (must be `GET`, any case) on `path`.
    ///
    /// # Errors
    /// [`RouteError::Method`], [`RouteError::NotAbsolute`] or [`RouteError::NotStatic`].
    pub fn new(method: &str, path: &str, handler: ExtensionHandler) -> Result<Self, RouteError> {
        if !method.eq_ignore_ascii_case("GET") {
            return Err(RouteError::Method(method.to_owned()));
        }
        if !path.starts_with('/') {
            return Err(RouteError::NotAbsolute(path.to_owned()));
        }
        if path
            .chars()
            .any(|c| matches!(c, '{' | '}' | '*') || c.is_whitespace() || c.is_control())
        {
            return Err(RouteError::NotStatic(path.to_owned()));
        }
        Ok(Self {
            path: path.to_owned(),
            handler,
        })
    }

    /// Always `GET`.
    pub fn method(&self) -> &'static str {
        "GET"
    }

    /// The path.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Check a set of extensions against each other and the built-in `GET` paths.
///
/// # Errors
/// [`RouteError::Duplicate`] or [`RouteError::ShadowsBuiltin`].
pub fn check_routes(routes: &[ExtensionRoute], builtin_get: &[&str]) -> Result<(), RouteError> {
    let mut seen = std::collections::HashSet::new();
    for r in routes {
        if !seen.insert(r.path.as_str()) {
            return Err(RouteError::Duplicate(r.path.clone()));
        }
    }
    for r in routes {
        if builtin_get.contains(&r.path.as_str()) {
            return Err(RouteError::ShadowsBuiltin(r.path.clone()));
        }
    }
    Ok(())
}

/// A read-only, live view of the frontend for handlers.
#[derive(Clone)]
pub struct ExtensionContext {
    pub(crate) view: ModelView,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) runtime: Option<dynamo_runtime::DistributedRuntime>,
}

impl ExtensionContext {
    /// Draining: the frontend (or its runtime) is shutting down.
    pub fn is_cancelled(&self) -> bool {
        *self.stop.borrow()
            || self
                .runtime
                .as_ref()
                .is_some_and(|rt| rt.is_shutting_down())
    }

    /// Serving (not draining).
    pub fn is_ready(&self) -> bool {
        !self.is_cancelled()
    }

    /// Whether `model` is served and a live worker serves it.
    pub fn is_model_ready_to_serve(&self, model: &str) -> bool {
        self.view.readiness(model).is_some_and(|r| r.ready())
    }

    /// Whether any model is ready to serve.
    pub fn has_any_ready_model(&self) -> bool {
        !self.serving_ready_display_names().is_empty()
    }

    /// Every served model's name, sorted.
    pub fn model_display_names(&self) -> Vec<String> {
        self.view.names().into_keys().collect()
    }

    /// The served models with a live worker, sorted.
    pub fn serving_ready_display_names(&self) -> Vec<String> {
        self.view
            .names()
            .into_keys()
            .filter(|m| self.is_model_ready_to_serve(m))
            .collect()
    }
}

/// Serve one request of `route`.
/// Register `routes` (already checked by [`check_routes`]) as `GET` handlers on `router`.
/// They are not in `/openapi.json`: the document lists the frontend's own routes.
pub(crate) fn register<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
    routes: &[ExtensionRoute],
    ctx: &ExtensionContext,
) -> axum::Router<S> {
    routes.iter().fold(router, |router, route| {
        let (route, ctx) = (route.clone(), ctx.clone());
        let path = route.path.clone();
        router.route(
            &path,
            axum::routing::get(move || serve(route.clone(), ctx.clone())),
        )
    })
}

pub(crate) async fn serve(route: ExtensionRoute, ctx: ExtensionContext) -> Response {
    let handler = Arc::clone(&route.handler);
    let failed = || {
        super::json_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({"error": "frontend route extension failed"}),
        )
    };
    match tokio::task::spawn_blocking(move || handler(ctx)).await {
        Ok(Ok(r)) => match StatusCode::from_u16(r.status) {
            Ok(status) => super::json_status(status, &r.body),
            Err(_) => failed(),
        },
        Ok(Err(e)) => {
            tracing::error!(path = %route.path, error = %e, "frontend route extension failed");
            failed()
        }
        Err(e) => {
            tracing::error!(path = %route.path, error = %e, "frontend route extension panicked");
            failed()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> ExtensionHandler {
        Arc::new(|_| Ok(ExtensionResponse::new(200, serde_json::json!(1)).expect("200")))
    }

    #[test]
    fn validation_matches_the_contract() {
        assert!(ExtensionRoute::new("get", "/x", ok()).is_ok());
        assert_eq!(
            ExtensionRoute::new("POST", "/x", ok()).map(|_| ()),
            Err(RouteError::Method("POST".into()))
        );
        assert_eq!(
            ExtensionRoute::new("GET", "x", ok()).map(|_| ()),
            Err(RouteError::NotAbsolute("x".into()))
        );
        for bad in ["/a/{b}", "/a*", "/a b", "/a\u{1}", "/a}"] {
            assert_eq!(
                ExtensionRoute::new("GET", bad, ok()).map(|_| ()),
                Err(RouteError::NotStatic(bad.into())),
                "{bad}"
            );
        }
        let a = ExtensionRoute::new("GET", "/a", ok()).expect("valid");
        let h = ExtensionRoute::new("GET", "/health", ok()).expect("valid");
        assert_eq!(
            check_routes(&[a.clone(), a.clone()], &["/health"]),
            Err(RouteError::Duplicate("/a".into()))
        );
        let e = check_routes(&[a.clone(), h], &["/health"]).expect_err("shadows");
        assert_eq!(
            e.to_string(),
            "duplicate HTTP route registered: GET /health conflicts with GET /health"
        );
        assert!(check_routes(&[a], &["/health"]).is_ok());
        assert!(ExtensionResponse::new(99, serde_json::Value::Null).is_err());
        assert!(ExtensionResponse::new(1000, serde_json::Value::Null).is_err());
        assert!(ExtensionResponse::new(600, serde_json::Value::Null).is_ok());
    }
}
