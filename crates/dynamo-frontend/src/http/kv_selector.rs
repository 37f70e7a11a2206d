//! KV-aware worker selection for the frontend (`--router-mode kv`).
//!
//! One [`KvRouter`] per served endpoint, created the first time a request for one of its
//! models arrives; it follows the model's own [`Client`] view of the instances (so a worker
//! it picks is always one that client can send to) and the workers' KV events. Each
//! attempt of a request is hashed, sent to the worker whose cache holds the longest prefix
//! weighed against load, and **booked** there ([`KvRouter::book`]): its prompt counts as
//! prefill load until the first token, its blocks as decode load until the attempt ends,
//! so concurrent requests spread by load instead of piling onto the prefix holder. The
//! booking travels with the frontend's worker stream and is released when the stream
//! ends, fails, migrates or is dropped (client disconnect).
//!
//! Errors: no instance → 503; every worker over the busy thresholds
//! ([`LoadThresholds`]) → 529 ([`HttpError::overloaded`]). A migrated or retried attempt
//! avoids the workers the request already failed on, and every attempt avoids the workers
//! the runtime knows are down ([`dynamo_runtime::Client::down_instance_ids`]).
//!
//! Text (`ModelInput::Text`) requests go round-robin (no tokens to route by).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_llm::discovery::{ModelEntry, ModelManager};
use dynamo_llm::kv_routing::{self, KvRouter, RouteOptions};
use dynamo_llm::model_card::DEFAULT_KV_CACHE_BLOCK_SIZE;
use dynamo_runtime::{Client, DistributedRuntime, Route};
use futures_util::future::BoxFuture;

use super::busy::BusyThresholds;
use super::engine::{RoutedRequest, Selected, WorkerSelector};
use super::error::HttpError;

/// The KV-routing selector.
pub struct KvSelector {
    runtime: DistributedRuntime,
    config: KvRouterConfig,
    busy: Arc<BusyThresholds>,
    routers: Mutex<HashMap<String, Arc<KvRouter>>>,
}

impl KvSelector {
    /// A selector whose routers use `config` and reject requests when every worker is
    /// over `thresholds`.
    pub fn new(
        runtime: DistributedRuntime,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Self {
        Self::with_busy(runtime, config, BusyThresholds::new(thresholds))
    }

    /// A selector whose per-model thresholds come from `busy` (changed at run time by
    /// `POST /busy_threshold`: each request applies its model's current values).
    pub fn with_busy(
        runtime: DistributedRuntime,
        config: KvRouterConfig,
        busy: Arc<BusyThresholds>,
    ) -> Self {
        Self {
            runtime,
            config,
            busy,
            routers: Mutex::new(HashMap::new()),
        }
    }

    /// Start each new token model's router before the frontend announces the model, and
    /// wait until its KV-event subscription is live: a router started by the first
    /// request would miss the events that request's own prefill publishes (over NATS, for
    /// good).
    pub fn follow(self: &Arc<Self>, models: &ModelManager) {
        let this = Arc::downgrade(self);
        models.before_announce(Arc::new(move |model: Arc<ModelEntry>| {
            let router = this
                .upgrade()
                .filter(|_| model.is_tokens())
                .and_then(|s| s.router(&model));
            Box::pin(async move {
                if let Some(r) = router {
                    r.events_subscribed().await;
                }
            })
        }));
    }

    /// The router of `model`'s endpoint (created on first use, or when the model appears
    /// under [`Self::follow`]; `None` when it cannot be built, and the selector then falls
    /// back to round-robin).
    pub fn router(&self, model: &ModelEntry) -> Option<Arc<KvRouter>> {
        let key = model.endpoint.to_string();
        let mut routers = self
            .routers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let thresholds = self.busy.get(&model.name);
        if let Some(r) = routers.get(&key) {
            // Validated by `BusyThresholds::update`; a refusal here would keep the old ones.
            if r.core().thresholds() != thresholds {
                let _ = r.core().set_thresholds(thresholds);
            }
            return Some(Arc::clone(r));
        }
        let block_size = match model.card.kv_cache_block_size {
            0 => DEFAULT_KV_CACHE_BLOCK_SIZE,
            b => b,
        };
        match KvRouter::with_client(
            &self.runtime,
            model.client.clone(),
            block_size,
            self.config.clone(),
            thresholds,
        ) {
            Ok(r) => {
                routers.insert(key, Arc::clone(&r));
                Some(r)
            }
            Err(e) => {
                tracing::warn!(endpoint = %model.endpoint, error = %e, "cannot start a KV router; using round-robin");
                None
            }
        }
    }
}

/// The client's answer for a routing failure.
fn routing_error(model: &ModelEntry, e: &kv_routing::Error) -> HttpError {
    use dynamo_kv_router::Error as R;
    match e {
        kv_routing::Error::Router(R::AllWorkersBusy { .. }) => {
            HttpError::overloaded(format!("All workers are busy, please retry later ({e})"))
        }
        kv_routing::Error::Router(
            R::NoWorkers | R::NoEligibleWorkers | R::UnknownWorker { .. },
        ) => HttpError::unavailable(format!("no workers available for {}: {e}", model.name)),
        kv_routing::Error::Runtime(e) => super::engine::route_error(e),
        _ => HttpError::internal(format!("routing failed: {e}")),
    }
}

impl WorkerSelector for KvSelector {
    fn metrics_text(&self) -> String {
        let routers: Vec<Arc<KvRouter>> = self
            .routers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let rows: Vec<_> = routers
            .iter()
            .map(|r| {
                let e = r.endpoint();
                (
                    (e.namespace.as_str(), e.component.as_str(), e.name.as_str()),
                    r.event_stats().snapshot(),
                )
            })
            .collect();
        kv_routing::event_stats::render_prometheus(&rows)
    }

    fn select(&self, model: &ModelEntry, _client: &Client, request: &RoutedRequest<'_>) -> Route {
        // Query only (no booking): callers that do not report completion.
        let RoutedRequest::Tokens(req) = request else {
            return Route::RoundRobin;
        };
        let Some(router) = self.router(model) else {
            return Route::RoundRobin;
        };
        let mut avoid = model.client.down_instance_ids();
        avoid.extend(model.not_serving_instances());
        match router
            .core()
            .best_worker(&dynamo_kv_router::kv_router::RouteRequest {
                tokens: &req.token_ids,
                lora_name: model.lora_name(),
                // Blocks covering an image hash with its mm_hash, as the engine's events do.
                block_mm_infos: req.mm_routing_info.as_ref().map(|m| &m.block_mm_infos[..]),
                avoid: &avoid,
                ..Default::default()
            }) {
            Ok(sel) => Route::Direct(sel.worker.worker_id),
            Err(_) => Route::RoundRobin,
        }
    }

    fn book<'a>(
        &'a self,
        model: &'a ModelEntry,
        request: RoutedRequest<'a>,
        attempt_id: &'a str,
        avoid: &'a [u64],
    ) -> BoxFuture<'a, Result<Selected, HttpError>> {
        Box::pin(async move {
            let plain = |route| Selected {
                route,
                booking: None,
                cached_tokens: None,
            };
            let RoutedRequest::Tokens(req) = request else {
                return Ok(plain(Route::RoundRobin));
            };
            if model.serving_instances().is_empty() {
                let why = if model.client.instance_ids().is_empty() {
                    format!("no instances found for endpoint {}", model.endpoint)
                } else {
                    format!("no live instance of {} registered it", model.endpoint)
                };
                return Err(HttpError::unavailable(format!(
                    "no workers available for {}: {why}",
                    model.name
                )));
            }
            let Some(router) = self.router(model) else {
                return Ok(plain(Route::RoundRobin));
            };
            // A migrated or retried attempt must not go back to a worker that failed it
            // (its cached prefix would otherwise draw it there); workers known down are
            // avoided by the router itself.
            // An adapter's blocks hash with its name (so they never match the base
            // model's), and only the instances that registered it are candidates.
            let mut avoid = avoid.to_vec();
            avoid.extend(model.not_serving_instances());
            let opts = RouteOptions {
                request_id: Some(attempt_id.to_owned()),
                avoid,
                lora_name: model.lora_name().map(str::to_owned),
                block_mm_infos: req
                    .mm_routing_info
                    .as_ref()
                    .map(|m| m.block_mm_infos.clone()),
                ..Default::default()
            };
            let (selection, booking) = router
                .book(&req.token_ids, &opts)
                .await
                .map_err(|e| routing_error(model, &e))?;
            // The overlap is whole blocks of the prompt: never more than the prompt.
            let cached = u64::from(selection.overlap_blocks) * u64::from(router.block_size());
            let prompt = req.token_ids.len() as u64;
            Ok(Selected {
                route: Route::Direct(selection.worker.worker_id),
                booking: Some(Box::new(booking)),
                cached_tokens: Some(u32::try_from(cached.min(prompt)).unwrap_or(u32::MAX)),
            })
        })
    }
}

#[cfg(test)]
mod tests;
