//! KV-aware worker selection for the frontend (`--router-mode kv`).
//!
//! One [`KvRouter`] per served endpoint, created the first time a request for one of its
//! models arrives (its index then follows the workers' KV events and discovery). Each
//! request is hashed and sent to the worker whose cache holds the longest prefix, weighed
//! against load ([`KvRouterCore::best_worker`], query only: the frontend's selector hook
//! has no completion callback yet, so requests are not booked as active load).
//! Text (`ModelInput::Text`) requests and requests for which the router knows no worker yet
//! fall back to round-robin.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dynamo_kv_router::kv_router::RouteRequest;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_runtime::{Client, DistributedRuntime, Route};

use super::engine::{RoutedRequest, WorkerSelector};
use crate::discovery::ModelEntry;
use crate::kv_routing::KvRouter;
use crate::model_card::DEFAULT_KV_CACHE_BLOCK_SIZE;

/// The KV-routing selector.
pub struct KvSelector {
    runtime: DistributedRuntime,
    config: KvRouterConfig,
    routers: Mutex<HashMap<String, Arc<KvRouter>>>,
}

impl KvSelector {
    /// A selector whose routers use `config`.
    pub fn new(runtime: DistributedRuntime, config: KvRouterConfig) -> Self {
        Self {
            runtime,
            config,
            routers: Mutex::new(HashMap::new()),
        }
    }

    fn router(&self, model: &ModelEntry) -> Option<Arc<KvRouter>> {
        let key = model.endpoint.to_string();
        let mut routers = self
            .routers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = routers.get(&key) {
            return Some(Arc::clone(r));
        }
        let block_size = match model.card.kv_cache_block_size {
            0 => DEFAULT_KV_CACHE_BLOCK_SIZE,
            b => b,
        };
        match KvRouter::new(
            &self.runtime,
            &model.endpoint,
            block_size,
            self.config.clone(),
            LoadThresholds::default(),
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

impl WorkerSelector for KvSelector {
    fn select(&self, model: &ModelEntry, _client: &Client, request: &RoutedRequest<'_>) -> Route {
        let RoutedRequest::Tokens(req) = request else {
            return Route::RoundRobin;
        };
        let Some(router) = self.router(model) else {
            return Route::RoundRobin;
        };
        match router.core().best_worker(&RouteRequest {
            tokens: &req.token_ids,
            ..Default::default()
        }) {
            Ok(sel) => Route::Direct(sel.worker.worker_id),
            Err(_) => Route::RoundRobin,
        }
    }
}
