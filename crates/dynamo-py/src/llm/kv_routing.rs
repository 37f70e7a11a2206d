//! KV routing between processes: `KvEventPublisher`, `WorkerMetricsPublisher`,
//! `KvIndexer`, `ApproxKvIndexer` and `KvRouter` (thin wrappers over
//! `dynamo_llm::kv_routing`).

use std::sync::Arc;

use dynamo_kv_router::hashing::{self, BlockHashOptions};
use dynamo_kv_router::protocols::{WorkerWithDpRank, encode_json_router_event};
use dynamo_kv_router::publisher::{PublishInput, StoredInput};
use dynamo_kv_router::scheduling::config::{KvRouterConfig, RouterConfigOverride};
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_llm::kv_routing::{self as kvr, RouteOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::aio::py_future;
use crate::json::to_json;
use crate::llm::kv::OverlapScores;
use crate::llm::router::{PyKvRouterConfig, PyRoutingConstraints};
use crate::msgpack::{Wide, to_msgpack};
use crate::runtime::distributed_runtime::Endpoint;
use crate::runtime::engine::AsyncResponseStream;
use crate::{convert, errors};

/// Largest `batching_timeout_ms` accepted (as the reference).
const MAX_BATCHING_TIMEOUT_MS: u64 = 15_000;

fn err(e: kvr::Error) -> PyErr {
    match e {
        kvr::Error::Router(e) => errors::kv_router_error(e),
        kvr::Error::Runtime(e) => errors::runtime_error(e),
        other => PyValueError::new_err(other.to_string()),
    }
}

fn enter() -> PyResult<tokio::runtime::EnterGuard<'static>> {
    Ok(dynamo_runtime::tokio_runtime()
        .map_err(errors::runtime_error)?
        .enter())
}

fn opt<'a, 'py>(o: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    o.filter(|o| !o.is_none())
}

fn overrides(o: Option<&Bound<'_, PyAny>>) -> PyResult<Option<RouterConfigOverride>> {
    opt(o)
        .map(|o| {
            let json = to_json(o)?;
            serde_json::from_slice(&json)
                .map_err(|e| PyValueError::new_err(format!("invalid router_config_override: {e}")))
        })
        .transpose()
}

fn mm_infos(
    o: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Vec<Option<hashing::BlockExtraInfo>>>> {
    opt(o).map(convert::block_mm_infos).transpose()
}

/// Publishes a worker's KV-cache events for routers.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct KvEventPublisher {
    inner: Arc<kvr::KvEventPublisher>,
    block_size: usize,
}

#[expect(clippy::too_many_arguments, reason = "the fields of publish_stored")]
fn stored_input(
    token_ids: &Bound<'_, PyAny>,
    num_block_tokens: Vec<usize>,
    block_hashes: Vec<i64>,
    parent_hash: Option<i64>,
    block_mm_infos: Option<&Bound<'_, PyAny>>,
    lora_name: Option<String>,
    is_eagle: Option<bool>,
    cache_salt: Option<String>,
) -> PyResult<StoredInput> {
    Ok(StoredInput {
        token_ids: convert::tokens(token_ids)?,
        num_block_tokens,
        block_hashes,
        parent_hash,
        block_mm_infos: mm_infos(block_mm_infos)?,
        lora_name,
        is_eagle: is_eagle.unwrap_or(false),
        cache_salt,
    })
}

fn batch_item(item: &Bound<'_, PyAny>, index: usize) -> PyResult<PublishInput> {
    let bad =
        |msg: String| PyValueError::new_err(format!("invalid KV event batch: item {index}: {msg}"));
    let dict = item
        .cast::<PyDict>()
        .map_err(|_| bad("not a dict".into()))?;
    let kind: String = dict
        .get_item("type")?
        .ok_or_else(|| bad("missing 'type'".into()))?
        .extract()
        .map_err(|_| bad("'type' must be a string".into()))?;
    let allowed: &[&str] = match kind.as_str() {
        "stored" => &[
            "type",
            "token_ids",
            "num_block_tokens",
            "block_hashes",
            "parent_hash",
            "block_mm_infos",
            "lora_name",
            "is_eagle",
            "cache_salt",
        ],
        "removed" => &["type", "block_hashes"],
        other => return Err(bad(format!("unknown type {other:?}"))),
    };
    for key in dict.keys() {
        let key: String = key.extract().map_err(|_| bad("non-string key".into()))?;
        if !allowed.contains(&key.as_str()) {
            return Err(bad(format!("unknown field {key:?}")));
        }
    }
    let get = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(dict.get_item(k)?.filter(|v| !v.is_none()))
    };
    let required = |k: &str| get(k)?.ok_or_else(|| bad(format!("missing {k:?}")));
    let block_hashes: Vec<i64> = required("block_hashes")?
        .extract()
        .map_err(|e| bad(format!("block_hashes: {e}")))?;
    if kind == "removed" {
        return Ok(PublishInput::Removed(block_hashes));
    }
    let extract_err = |k: &str| {
        let k = k.to_owned();
        move |e: PyErr| bad(format!("{k}: {e}"))
    };
    Ok(PublishInput::Stored(StoredInput {
        token_ids: convert::tokens(&required("token_ids")?).map_err(extract_err("token_ids"))?,
        num_block_tokens: required("num_block_tokens")?
            .extract()
            .map_err(extract_err("num_block_tokens"))?,
        block_hashes,
        parent_hash: get("parent_hash")?
            .map(|v| v.extract())
            .transpose()
            .map_err(extract_err("parent_hash"))?,
        block_mm_infos: mm_infos(get("block_mm_infos")?.as_ref())
            .map_err(extract_err("block_mm_infos"))?,
        lora_name: get("lora_name")?
            .map(|v| v.extract())
            .transpose()
            .map_err(extract_err("lora_name"))?,
        is_eagle: get("is_eagle")?
            .map(|v| v.extract())
            .transpose()
            .map_err(extract_err("is_eagle"))?
            .unwrap_or(false),
        cache_salt: get("cache_salt")?
            .map(|v| v.extract())
            .transpose()
            .map_err(extract_err("cache_salt"))?,
    }))
}

#[pymethods]
impl KvEventPublisher {
    #[new]
    #[pyo3(signature = (endpoint, worker_id=None, kv_block_size=0, dp_rank=0, enable_local_indexer=false, zmq_endpoint=None, zmq_topic=None, batching_timeout_ms=None, image_token_id=None, kv_state_endpoint=None))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn new(
        endpoint: PyRef<'_, Endpoint>,
        worker_id: Option<u64>,
        kv_block_size: usize,
        dp_rank: u32,
        enable_local_indexer: bool,
        zmq_endpoint: Option<String>,
        zmq_topic: Option<String>,
        batching_timeout_ms: Option<u64>,
        image_token_id: Option<u32>,
        kv_state_endpoint: Option<String>,
    ) -> PyResult<Self> {
        let _ = (image_token_id, kv_state_endpoint);
        if kv_block_size == 0 {
            return Err(PyValueError::new_err("kv_block_size cannot be 0"));
        }
        if batching_timeout_ms.is_some_and(|t| t > MAX_BATCHING_TIMEOUT_MS) {
            return Err(PyValueError::new_err(format!(
                "batching_timeout_ms must be at most {MAX_BATCHING_TIMEOUT_MS}"
            )));
        }
        let worker = WorkerWithDpRank::new(
            worker_id.unwrap_or_else(|| endpoint.runtime.connection_id()),
            dp_rank,
        );
        let _guard = enter()?;
        let inner = kvr::KvEventPublisher::new(
            &endpoint.runtime,
            &endpoint.id,
            worker,
            kv_block_size,
            enable_local_indexer,
        )
        .map_err(err)?;
        let inner = Arc::new(inner);
        if let Some(zmq) = zmq_endpoint {
            inner.start_zmq_relay(&zmq, zmq_topic.as_deref().unwrap_or(""));
        }
        Ok(Self {
            inner,
            block_size: kv_block_size,
        })
    }

    #[pyo3(signature = (token_ids, num_block_tokens, block_hashes, parent_hash=None, block_mm_infos=None, lora_name=None, is_eagle=None, cache_salt=None))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn publish_stored(
        &self,
        token_ids: &Bound<'_, PyAny>,
        num_block_tokens: Vec<usize>,
        block_hashes: Vec<i64>,
        parent_hash: Option<i64>,
        block_mm_infos: Option<&Bound<'_, PyAny>>,
        lora_name: Option<String>,
        is_eagle: Option<bool>,
        cache_salt: Option<String>,
    ) -> PyResult<()> {
        let input = stored_input(
            token_ids,
            num_block_tokens,
            block_hashes,
            parent_hash,
            block_mm_infos,
            lora_name,
            is_eagle,
            cache_salt,
        )?;
        self.inner.publish_stored(&input).map_err(err)
    }

    #[pyo3(signature = (block_hashes))]
    fn publish_removed(&self, block_hashes: Vec<i64>) -> PyResult<()> {
        self.inner.publish_removed(&block_hashes).map_err(err)
    }

    #[pyo3(signature = (events))]
    fn publish_batch(&self, events: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut items = Vec::new();
        for (i, item) in events.try_iter()?.enumerate() {
            items.push(batch_item(&item?, i)?);
        }
        self.inner.publish_batch(&items).map_err(|e| match e {
            kvr::Error::Router(e) => PyValueError::new_err(format!("invalid KV event batch: {e}")),
            other => err(other),
        })
    }

    #[pyo3(signature = ())]
    fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Block size in tokens.
    #[getter]
    fn kv_block_size(&self) -> usize {
        self.block_size
    }

    /// Routers connected to this publisher's channel (diagnostics and tests).
    fn _subscriber_count(&self) -> usize {
        self.inner.subscriber_count()
    }

    /// Number the next `n` events but do not send them (fault injection: routers see an
    /// id gap and recover from the local indexer).
    fn _drop_next_events(&self, n: u64) {
        self.inner.drop_next_events(n);
    }
}

/// Publishes a worker's load for router load balancing.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct WorkerMetricsPublisher {
    inner: std::sync::Mutex<Option<kvr::WorkerMetricsPublisher>>,
}

#[pymethods]
impl WorkerMetricsPublisher {
    #[new]
    fn new() -> Self {
        Self {
            inner: std::sync::Mutex::new(None),
        }
    }

    #[pyo3(signature = (endpoint))]
    fn create_endpoint<'py>(
        slf: Py<Self>,
        py: Python<'py>,
        endpoint: PyRef<'py, Endpoint>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runtime = endpoint.runtime.clone();
        let id = endpoint.id.clone();
        py_future(
            py,
            async move {
                let p = kvr::WorkerMetricsPublisher::new(&runtime, &id, runtime.connection_id())
                    .map_err(err)?;
                *slf.get()
                    .inner
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(p);
                Ok(())
            },
            true,
        )
    }

    #[pyo3(signature = (dp_rank=None, active_decode_blocks=None, kv_used_blocks=None, *, total_kv_blocks=None, max_num_batched_tokens=None))]
    fn publish(
        &self,
        dp_rank: Option<u32>,
        active_decode_blocks: Option<u64>,
        kv_used_blocks: Option<u64>,
        total_kv_blocks: Option<u64>,
        max_num_batched_tokens: Option<u64>,
    ) {
        if let Some(p) = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            p.publish_load(&kvr::ActiveLoad {
                worker_id: 0,
                dp_rank: dp_rank.unwrap_or(0),
                active_decode_blocks,
                kv_used_blocks,
                total_kv_blocks,
                max_num_batched_tokens,
            });
        }
    }
}

fn find_for_request(
    router: &kvr::KvRouter,
    token_ids: &Bound<'_, PyAny>,
    lora_name: Option<&str>,
    is_eagle: Option<bool>,
) -> PyResult<OverlapScores> {
    let tokens = convert::tokens(token_ids)?;
    let options = BlockHashOptions {
        block_mm_infos: None,
        lora_name,
        cache_namespace: None,
        is_eagle: is_eagle.unwrap_or(false),
    };
    let local =
        hashing::compute_block_hash_for_seq(&tokens, router.block_size() as usize, &options)
            .map_err(errors::kv_router_error)?;
    Ok(OverlapScores {
        inner: router.core().find_matches(&local),
    })
}

/// A KV indexer fed by the KV events of the endpoint's component.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct KvIndexer {
    inner: Arc<kvr::KvRouter>,
}

#[pymethods]
impl KvIndexer {
    #[new]
    #[pyo3(signature = (endpoint, block_size))]
    fn new(endpoint: PyRef<'_, Endpoint>, block_size: u32) -> PyResult<Self> {
        let _guard = enter()?;
        let inner = kvr::KvRouter::new(
            &endpoint.runtime,
            &endpoint.id,
            block_size,
            KvRouterConfig::default(),
            LoadThresholds::default(),
        )
        .map_err(err)?;
        Ok(Self { inner })
    }

    #[pyo3(signature = (sequence))]
    fn find_matches(&self, sequence: Vec<u64>) -> OverlapScores {
        let local: Vec<hashing::LocalBlockHash> =
            sequence.into_iter().map(hashing::LocalBlockHash).collect();
        OverlapScores {
            inner: self.inner.core().find_matches(&local),
        }
    }

    #[pyo3(signature = (token_ids, lora_name=None, is_eagle=None))]
    fn find_matches_for_request(
        &self,
        token_ids: &Bound<'_, PyAny>,
        lora_name: Option<&str>,
        is_eagle: Option<bool>,
    ) -> PyResult<OverlapScores> {
        find_for_request(&self.inner, token_ids, lora_name, is_eagle)
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
}

impl Drop for KvIndexer {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

/// An indexer without KV events: routing decisions are assumed cached for a TTL.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct ApproxKvIndexer {
    inner: Arc<kvr::KvRouter>,
}

#[pymethods]
impl ApproxKvIndexer {
    #[new]
    #[pyo3(signature = (endpoint, kv_block_size, router_ttl_secs=120.0))]
    fn new(
        endpoint: PyRef<'_, Endpoint>,
        kv_block_size: u32,
        router_ttl_secs: f64,
    ) -> PyResult<Self> {
        let config = KvRouterConfig {
            use_kv_events: false,
            router_ttl_secs,
            ..KvRouterConfig::default()
        };
        config.validate().map_err(errors::kv_router_error)?;
        let _guard = enter()?;
        let inner = kvr::KvRouter::new(
            &endpoint.runtime,
            &endpoint.id,
            kv_block_size,
            config,
            LoadThresholds::default(),
        )
        .map_err(err)?;
        Ok(Self { inner })
    }

    #[pyo3(signature = (token_ids, lora_name=None, is_eagle=None))]
    fn find_matches_for_request(
        &self,
        token_ids: &Bound<'_, PyAny>,
        lora_name: Option<&str>,
        is_eagle: Option<bool>,
    ) -> PyResult<OverlapScores> {
        find_for_request(&self.inner, token_ids, lora_name, is_eagle)
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    #[pyo3(signature = (tokens, worker_id, dp_rank=0))]
    fn process_routing_decision_for_request<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        worker_id: u64,
        dp_rank: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tokens = convert::tokens(tokens)?;
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                router
                    .core()
                    .record_routing_decision(&tokens, WorkerWithDpRank::new(worker_id, dp_rank))
                    .map_err(errors::kv_router_error)
            },
            true,
        )
    }
}

impl Drop for ApproxKvIndexer {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

/// A KV-aware router over an endpoint's workers.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct KvRouter {
    inner: Arc<kvr::KvRouter>,
}

impl Drop for KvRouter {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

fn route_options(
    router_config_override: Option<&Bound<'_, PyAny>>,
    request_id: Option<String>,
    block_mm_infos: Option<&Bound<'_, PyAny>>,
    lora_name: Option<String>,
    routing_constraints: Option<PyRef<'_, PyRoutingConstraints>>,
    cache_namespace: Option<String>,
) -> PyResult<RouteOptions> {
    Ok(RouteOptions {
        request_id,
        overrides: overrides(router_config_override)?,
        constraints: routing_constraints.map(|c| c.inner.clone()),
        lora_name,
        cache_namespace,
        block_mm_infos: mm_infos(block_mm_infos)?,
        pinned: None,
        avoid: Vec::new(),
        update_indexer: false,
        strict_priority: 0,
    })
}

fn routed_stream<'py>(
    py: Python<'py>,
    router: Arc<kvr::KvRouter>,
    tokens: Vec<u32>,
    body: Vec<u8>,
    opts: RouteOptions,
) -> PyResult<Bound<'py, PyAny>> {
    py_future(
        py,
        async move {
            let stream = router
                .generate(
                    &tokens,
                    body.into(),
                    opts,
                    dynamo_runtime::Context::default(),
                )
                .await
                .map_err(err)?;
            Ok(AsyncResponseStream::routed(stream, false))
        },
        true,
    )
}

#[pymethods]
impl KvRouter {
    #[new]
    #[pyo3(signature = (endpoint, block_size, kv_router_config, aic_perf_config=None))]
    fn new(
        endpoint: PyRef<'_, Endpoint>,
        block_size: u32,
        kv_router_config: PyRef<'_, PyKvRouterConfig>,
        aic_perf_config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let _ = aic_perf_config;
        let _guard = enter()?;
        let inner = kvr::KvRouter::new(
            &endpoint.runtime,
            &endpoint.id,
            block_size,
            kv_router_config.inner.clone(),
            LoadThresholds::default(),
        )
        .map_err(err)?;
        Ok(Self { inner })
    }

    #[pyo3(signature = (token_ids, model, stop_conditions=None, sampling_options=None, output_options=None, router_config_override=None, worker_id=None, dp_rank=None, extra_args=None, block_mm_infos=None, multi_modal_data=None, mm_routing_info=None, routing_constraints=None, response_buffer_size=100))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        model: &str,
        stop_conditions: Option<&Bound<'py, PyAny>>,
        sampling_options: Option<&Bound<'py, PyAny>>,
        output_options: Option<&Bound<'py, PyAny>>,
        router_config_override: Option<&Bound<'py, PyAny>>,
        worker_id: Option<u64>,
        dp_rank: Option<u32>,
        extra_args: Option<&Bound<'py, PyAny>>,
        block_mm_infos: Option<&Bound<'py, PyAny>>,
        multi_modal_data: Option<&Bound<'py, PyAny>>,
        mm_routing_info: Option<&Bound<'py, PyAny>>,
        routing_constraints: Option<PyRef<'py, PyRoutingConstraints>>,
        response_buffer_size: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        if response_buffer_size < 0 {
            return Err(PyValueError::new_err("response_buffer_size must be >= 0"));
        }
        let tokens = convert::tokens(token_ids)?;
        let request = PyDict::new(py);
        request.set_item("token_ids", PyList::new(py, &tokens)?)?;
        request.set_item("model", model)?;
        request.set_item(
            "stop_conditions",
            opt(stop_conditions)
                .cloned()
                .unwrap_or_else(|| PyDict::new(py).into_any()),
        )?;
        request.set_item(
            "sampling_options",
            opt(sampling_options)
                .cloned()
                .unwrap_or_else(|| PyDict::new(py).into_any()),
        )?;
        request.set_item(
            "output_options",
            opt(output_options)
                .cloned()
                .unwrap_or_else(|| PyDict::new(py).into_any()),
        )?;
        for (k, v) in [
            ("router_config_override", router_config_override),
            ("extra_args", extra_args),
            ("multi_modal_data", multi_modal_data),
            ("mm_routing_info", mm_routing_info),
        ] {
            if let Some(v) = opt(v) {
                request.set_item(k, v)?;
            }
        }
        let mut opts = route_options(
            router_config_override,
            None,
            block_mm_infos,
            None,
            routing_constraints,
            None,
        )?;
        if let Some(w) = worker_id {
            opts.pinned = Some(WorkerWithDpRank::new(w, dp_rank.unwrap_or(0)));
            let routing = PyDict::new(py);
            routing.set_item("backend_instance_id", w)?;
            routing.set_item("dp_rank", dp_rank.unwrap_or(0))?;
            request.set_item("routing", routing)?;
        }
        let body = to_msgpack(request.as_any(), Wide::Refuse)?;
        routed_stream(py, Arc::clone(&self.inner), tokens, body, opts)
    }

    #[pyo3(signature = (request, response_buffer_size=100))]
    fn generate_from_request<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        response_buffer_size: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        if response_buffer_size < 0 {
            return Err(PyValueError::new_err("response_buffer_size must be >= 0"));
        }
        let dict = request
            .cast::<PyDict>()
            .map_err(|_| PyValueError::new_err("request must be a dict (PreprocessedRequest)"))?;
        let tokens = convert::tokens(
            &dict
                .get_item("token_ids")?
                .ok_or_else(|| PyValueError::new_err("request has no token_ids"))?,
        )?;
        let mut opts = route_options(
            dict.get_item("router_config_override")?.as_ref(),
            None,
            None,
            None,
            None,
            None,
        )?;
        if let Some(routing) = dict.get_item("routing")?.filter(|r| !r.is_none()) {
            let routing = routing
                .cast::<PyDict>()
                .map_err(|_| PyValueError::new_err("routing must be a dict"))?;
            if let Some(w) = routing
                .get_item("backend_instance_id")?
                .filter(|w| !w.is_none())
            {
                let rank: u32 = routing
                    .get_item("dp_rank")?
                    .filter(|r| !r.is_none())
                    .map(|r| r.extract())
                    .transpose()?
                    .unwrap_or(0);
                opts.pinned = Some(WorkerWithDpRank::new(w.extract()?, rank));
            }
        }
        let body = to_msgpack(request, Wide::Refuse)?;
        routed_stream(py, Arc::clone(&self.inner), tokens, body, opts)
    }

    #[pyo3(signature = (token_ids, router_config_override=None, request_id=None, update_indexer=false, block_mm_infos=None, lora_name=None, routing_constraints=None, strict_priority=0, policy_class=None, cache_namespace=None))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn best_worker<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        router_config_override: Option<&Bound<'py, PyAny>>,
        request_id: Option<String>,
        update_indexer: bool,
        block_mm_infos: Option<&Bound<'py, PyAny>>,
        lora_name: Option<String>,
        routing_constraints: Option<PyRef<'py, PyRoutingConstraints>>,
        strict_priority: i64,
        policy_class: Option<String>,
        cache_namespace: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = policy_class;
        let tokens = convert::tokens(token_ids)?;
        let strict_priority = u32::try_from(strict_priority.max(0)).unwrap_or(u32::MAX);
        let mut opts = route_options(
            router_config_override,
            request_id,
            block_mm_infos,
            lora_name,
            routing_constraints,
            cache_namespace,
        )?;
        opts.update_indexer = update_indexer;
        opts.strict_priority = strict_priority;
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                let s = router.route(&tokens, &opts).await.map_err(err)?;
                Ok((s.worker.worker_id, s.worker.dp_rank, s.overlap_blocks))
            },
            true,
        )
    }

    #[pyo3(signature = (token_ids, block_mm_infos=None, lora_name=None, cache_namespace=None))]
    fn get_potential_loads<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        block_mm_infos: Option<&Bound<'py, PyAny>>,
        lora_name: Option<String>,
        cache_namespace: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tokens = convert::tokens(token_ids)?;
        let opts = route_options(None, None, block_mm_infos, lora_name, None, cache_namespace)?;
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                let loads = router.potential_loads(&tokens, &opts).map_err(err)?;
                Ok(loads
                    .into_iter()
                    .map(|l| {
                        [
                            ("worker_id", l.worker.worker_id),
                            ("dp_rank", u64::from(l.worker.dp_rank)),
                            ("potential_prefill_tokens", l.potential_prefill_tokens),
                            ("potential_decode_blocks", l.potential_decode_blocks),
                            ("active_requests", l.active_requests),
                        ]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<std::collections::BTreeMap<String, u64>>()
                    })
                    .collect::<Vec<_>>())
            },
            true,
        )
    }

    #[pyo3(signature = (token_ids, router_config_override=None, block_mm_infos=None, lora_name=None, include_shared=true, cache_namespace=None))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn get_overlap_scores<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        router_config_override: Option<&Bound<'py, PyAny>>,
        block_mm_infos: Option<&Bound<'py, PyAny>>,
        lora_name: Option<String>,
        include_shared: bool,
        cache_namespace: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = include_shared;
        let tokens = convert::tokens(token_ids)?;
        let opts = route_options(
            router_config_override,
            None,
            block_mm_infos,
            lora_name,
            None,
            cache_namespace,
        )?;
        let router = Arc::clone(&self.inner);
        let block_size = router.block_size();
        let (local, _) = router
            .core()
            .hash_request(&dynamo_kv_router::kv_router::RouteRequest {
                tokens: &tokens,
                lora_name: opts.lora_name.as_deref(),
                cache_namespace: opts.cache_namespace.as_deref(),
                block_mm_infos: opts.block_mm_infos.as_deref(),
                ..Default::default()
            })
            .map_err(errors::kv_router_error)?;
        let scores = router.core().find_matches(&local);
        let workers = PyList::empty(py);
        for (w, n) in scores.scores {
            let d = PyDict::new(py);
            d.set_item("worker_id", w.worker_id)?;
            d.set_item("dp_rank", w.dp_rank)?;
            d.set_item("device_overlap_blocks", n)?;
            d.set_item("host_pinned_overlap_blocks", 0)?;
            d.set_item("disk_overlap_blocks", 0)?;
            d.set_item("shared_overlap_blocks", 0)?;
            workers.append(d)?;
        }
        let out = PyDict::new(py);
        out.set_item("block_size", block_size)?;
        out.set_item("num_blocks", local.len())?;
        out.set_item("shared_cache", py.None())?;
        out.set_item("workers", workers)?;
        let out = out.unbind();
        py_future(py, async move { Ok(out) }, false)
    }

    fn dump_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                let events: Vec<String> = router
                    .core()
                    .dump_events()
                    .iter()
                    .map(encode_json_router_event)
                    .collect();
                Ok(format!("[{}]", events.join(",")))
            },
            true,
        )
    }

    #[pyo3(signature = (request_id))]
    fn mark_prefill_complete<'py>(
        &self,
        py: Python<'py>,
        request_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move { router.mark_prefill_complete(&request_id).map_err(err) },
            true,
        )
    }

    #[pyo3(signature = (request_id))]
    fn free<'py>(&self, py: Python<'py>, request_id: String) -> PyResult<Bound<'py, PyAny>> {
        let router = Arc::clone(&self.inner);
        py_future(
            py,
            async move { router.free(&request_id).map_err(err) },
            true,
        )
    }

    /// Set a worker's taints (as its model registration would; tests).
    fn _set_worker_taints(&self, worker_id: u64, taints: std::collections::BTreeSet<String>) {
        self.inner.set_worker_taints(worker_id, taints);
    }

    /// `(total_kv_blocks, max_num_batched_tokens)` a rank reported, `None` before its first
    /// capacity report (diagnostics and tests).
    #[pyo3(signature = (worker_id, dp_rank=0))]
    fn _capacity(&self, worker_id: u64, dp_rank: u32) -> Option<(Option<u64>, Option<u64>)> {
        self.inner
            .capacity(WorkerWithDpRank::new(worker_id, dp_rank))
            .map(|c| (c.total_kv_blocks, c.max_num_batched_tokens))
    }

    /// Requests waiting in the router queue (diagnostics and tests).
    fn _queued(&self) -> usize {
        self.inner.queued()
    }

    /// Registered worker ranks as `(worker_id, dp_rank)` (diagnostics and tests).
    fn _workers(&self) -> Vec<(u64, u32)> {
        self.inner
            .core()
            .workers()
            .into_iter()
            .map(|w| (w.worker_id, w.dp_rank))
            .collect()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KvEventPublisher>()?;
    m.add_class::<WorkerMetricsPublisher>()?;
    m.add_class::<KvIndexer>()?;
    m.add_class::<ApproxKvIndexer>()?;
    m.add_class::<KvRouter>()?;
    // The batch item shapes, as TypedDicts that exist at run time, made on first use.
    m.add_function(wrap_pyfunction!(module_getattr, m)?)?;
    m.add_function(wrap_pyfunction!(module_dir, m)?)?;
    Ok(())
}

/// The batch item shapes (all keys optional to the type checker except by convention:
/// `type` and the hashes are required).
const TYPED_DICTS: &std::ffi::CStr = pyo3::ffi::c_str!(
    "import typing\n\
KvStoredEventInput = typing.TypedDict('KvStoredEventInput', {'type': str, 'token_ids': typing.List[int], \
'num_block_tokens': typing.List[int], 'block_hashes': typing.List[int], 'parent_hash': typing.Optional[int], \
'block_mm_infos': typing.Optional[typing.List[typing.Optional[typing.Dict[str, typing.Any]]]], \
'lora_name': typing.Optional[str], 'is_eagle': typing.Optional[bool], 'cache_salt': typing.Optional[str]}, total=False)\n\
KvRemovedEventInput = typing.TypedDict('KvRemovedEventInput', {'type': str, 'block_hashes': typing.List[int]}, total=False)\n\
KvStoredEventInput.__module__ = 'dynamo._core'\n\
KvRemovedEventInput.__module__ = 'dynamo._core'\n"
);

/// The module attributes made on first use (PEP 562): [`TYPED_DICTS`] imports `typing`,
/// 8 ms of a process's start-up (a fifth of the frontend's imports) for two classes that
/// only code typing its batches touches.
const LAZY: [&str; 2] = ["KvStoredEventInput", "KvRemovedEventInput"];

static LAZY_VALUES: pyo3::sync::PyOnceLock<Py<PyDict>> = pyo3::sync::PyOnceLock::new();

/// `dynamo._core.__getattr__`: the [`LAZY`] names, made once.
#[pyfunction]
#[pyo3(name = "__getattr__")]
fn module_getattr(py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
    if !LAZY.contains(&name) {
        return Err(pyo3::exceptions::PyAttributeError::new_err(format!(
            "module 'dynamo._core' has no attribute '{name}'"
        )));
    }
    let values = LAZY_VALUES.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
        let ns = PyDict::new(py);
        py.run(TYPED_DICTS, Some(&ns), None)?;
        Ok(ns.unbind())
    })?;
    let value = values.bind(py).get_item(name)?.ok_or_else(|| {
        pyo3::exceptions::PyAttributeError::new_err(format!("{name} was not made"))
    })?;
    Ok(value.unbind())
}

/// `dynamo._core.__dir__`: the module's attributes with the [`LAZY`] ones.
#[pyfunction]
#[pyo3(name = "__dir__", pass_module)]
fn module_dir(module: &Bound<'_, PyModule>) -> PyResult<Vec<String>> {
    let mut names: Vec<String> = module.dict().keys().extract()?;
    names.extend(LAZY.iter().map(|n| (*n).to_owned()));
    names.sort_unstable();
    Ok(names)
}
