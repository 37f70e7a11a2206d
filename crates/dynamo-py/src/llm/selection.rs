//! `SelectionService`, `SelectionCacheConfig` and the standalone-service entry points
//! (`run_select_service`, `run_kv_indexer`, `run_slot_tracker`) over
//! `dynamo_selection`.
//!
//! Request dicts go to the core as JSON (its serde types name a bad field in the
//! `ValueError`); answers come back as plain dicts. Every call but `upsert_worker` is short
//! and synchronous in the core, so the "async" methods compute with the GIL released and
//! return an already-resolved asyncio future (no thread hop on the hot path); malformed
//! input raises `ValueError` at the call, like the reference.

use std::sync::Arc;
use std::time::Duration;

use dynamo_selection::cli::{self, IndexerArgs, Running, SelectArgs, SlotTrackerArgs};
use dynamo_selection::recovery;
use dynamo_selection::{
    ErrorKind, PromptRequest, ReservationRequest, SelectionCacheConfig, SelectionError,
    ServiceOptions, WorkerRequest, parse,
};
use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit, PyValueError};
use pyo3::prelude::*;
use serde::Serialize;

use crate::aio::py_future_with;
use crate::errors::command_line_exit;
use crate::errors::{SelectionServiceError, runtime_error};
use crate::json::{from_json, to_json};

/// `ValueError` for malformed input, `SelectionServiceError(kind, status_code)` otherwise.
fn selection_error(py: Python<'_>, e: SelectionError) -> PyErr {
    if e.kind == ErrorKind::InvalidRequest {
        return PyValueError::new_err(e.message);
    }
    let err = SelectionServiceError::new_err(e.message);
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory errors;
    // the exception is still raised without them then.
    let _ = value.setattr("kind", e.kind.as_str());
    let _ = value.setattr("status_code", e.kind.status_code());
    err
}

fn to_py<T: Serialize>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    let bytes = serde_json::to_vec(v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(from_json(py, &bytes)?.unbind())
}

/// A prompt request: `token_ids` (the bulk of a request) goes through the fast token
/// conversion, the rest through JSON.
fn prompt_request(obj: &Bound<'_, PyAny>) -> PyResult<PromptRequest> {
    let (rest, tokens) = split_tokens(obj)?;
    let mut req: PromptRequest = request(&rest)?;
    if tokens.is_some() {
        req.token_ids = tokens;
    }
    Ok(req)
}

/// [`prompt_request`] for `create_reservation`.
fn reservation_request(obj: &Bound<'_, PyAny>) -> PyResult<ReservationRequest> {
    let (rest, tokens) = split_tokens(obj)?;
    let mut req: ReservationRequest = request(&rest)?;
    if tokens.is_some() {
        req.prompt.token_ids = tokens;
    }
    Ok(req)
}

/// The dict without `token_ids`, and the token ids converted.
fn split_tokens<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Option<Vec<u32>>)> {
    let Ok(dict) = obj.cast::<pyo3::types::PyDict>() else {
        return Ok((obj.clone(), None));
    };
    match dict.get_item("token_ids")? {
        Some(t) if !t.is_none() => {
            let tokens = crate::convert::tokens(&t)
                .map_err(|e| PyValueError::new_err(format!("token_ids: {}", e.value(obj.py()))))?;
            let rest = dict.copy()?;
            rest.del_item("token_ids")?;
            Ok((rest.into_any(), Some(tokens)))
        }
        _ => Ok((obj.clone(), None)),
    }
}

fn request<T: serde::de::DeserializeOwned>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    if !obj.is_instance_of::<pyo3::types::PyDict>() {
        return Err(PyValueError::new_err(format!(
            "request must be a dict, got {}",
            obj.get_type().name()?
        )));
    }
    let bytes = to_json(obj)?;
    parse(&bytes).map_err(|e| PyValueError::new_err(e.message))
}

/// An asyncio future of the running loop, already resolved with `result`.
fn resolved<'py>(py: Python<'py>, result: PyResult<Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let fut = event_loop.call_method0("create_future")?;
    match result {
        Ok(v) => fut.call_method1("set_result", (v,))?,
        Err(e) => fut.call_method1("set_exception", (e.into_value(py),))?,
    };
    Ok(fut)
}

/// Run `f` without the GIL and resolve a future with its (converted) answer.
fn answer<'py, T: Serialize + Send>(
    py: Python<'py>,
    f: impl FnOnce() -> Result<T, SelectionError> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let out = py.detach(f);
    let converted = match out {
        Ok(v) => to_py(py, &v),
        Err(e) => Err(selection_error(py, e)),
    };
    resolved(py, converted)
}

/// Bounds of the pending-selection cache; an omitted field keeps the service default.
#[pyclass(module = "dynamo._core", name = "SelectionCacheConfig", frozen)]
#[derive(Clone)]
pub(crate) struct PySelectionCacheConfig {
    inner: SelectionCacheConfig,
}

#[pymethods]
impl PySelectionCacheConfig {
    #[new]
    #[pyo3(signature = (*, ttl_secs=None, max_entries=None, max_bytes=None))]
    fn new(
        ttl_secs: Option<f64>,
        max_entries: Option<usize>,
        max_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let inner = SelectionCacheConfig {
            ttl_secs,
            max_entries,
            max_bytes,
        };
        inner.validate().map_err(PyValueError::new_err)?;
        Ok(Self { inner })
    }

    fn __repr__(&self) -> String {
        let f = |v: Option<String>| v.unwrap_or_else(|| "None".to_owned());
        format!(
            "SelectionCacheConfig(ttl_secs={}, max_entries={}, max_bytes={})",
            f(self.inner.ttl_secs.map(|v| v.to_string())),
            f(self.inner.max_entries.map(|v| v.to_string())),
            f(self.inner.max_bytes.map(|v| v.to_string()))
        )
    }
}

/// In-process handle to a runtime-free worker-selection core.
#[pyclass(module = "dynamo._core", name = "SelectionService", frozen)]
pub(crate) struct PySelectionService {
    svc: Arc<dynamo_selection::SelectionService>,
}

fn check_peers(name: &str, peers: Option<&[String]>) -> PyResult<()> {
    for p in peers.unwrap_or(&[]) {
        let rest = p.split_once("://").map_or(p.as_str(), |(_, r)| r);
        let has_port = rest
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.trim_end_matches('/').parse::<u16>().is_ok());
        if !has_port {
            return Err(PyValueError::new_err(format!(
                "{name}: peer {p:?} has no port"
            )));
        }
    }
    Ok(())
}

fn not_supported(name: &str, given: bool) -> PyResult<()> {
    if given {
        return Err(PyValueError::new_err(format!(
            "{name} is not supported yet by this implementation (session affinity of \
             SelectionService is not implemented)"
        )));
    }
    Ok(())
}

/// Address the replica-sync PUB socket of an in-process service binds (all interfaces
/// unless this variable says otherwise, e.g. `127.0.0.1`).
const REPLICA_SYNC_HOST_ENV: &str = "DYN_SELECTION_REPLICA_SYNC_HOST";

#[pymethods]
impl PySelectionService {
    #[new]
    #[pyo3(signature = (*, indexer_threads=4, indexer_peers=None, replica_sync_port=None, replica_sync_peers=None, selection_cache=None, session_affinity_ttl_secs=None))]
    fn new(
        py: Python<'_>,
        indexer_threads: usize,
        indexer_peers: Option<Vec<String>>,
        replica_sync_port: Option<u16>,
        replica_sync_peers: Option<Vec<String>>,
        selection_cache: Option<PyRef<'_, PySelectionCacheConfig>>,
        session_affinity_ttl_secs: Option<f64>,
    ) -> PyResult<Self> {
        // Queries share one lock-light index on the callers' threads: no pool to size.
        let _ = indexer_threads;
        check_peers("indexer_peers", indexer_peers.as_deref())?;
        check_peers("replica_sync_peers", replica_sync_peers.as_deref())?;
        if replica_sync_peers.is_some() && replica_sync_port.is_none() {
            return Err(PyValueError::new_err(
                "replica_sync_peers requires replica_sync_port",
            ));
        }
        let recovery_peers = indexer_peers
            .unwrap_or_default()
            .iter()
            .map(|p| recovery::parse_peer_url(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(PyValueError::new_err)?;
        not_supported(
            "session_affinity_ttl_secs",
            session_affinity_ttl_secs.is_some(),
        )?;
        let rt = dynamo_runtime::tokio_runtime().map_err(runtime_error)?;
        // The router configuration comes from the DYN_ROUTER_* environment (as the
        // reference); a bad value is a ValueError naming the variable.
        let router = dynamo_selection::service::router_config_from_env(Default::default())
            .map_err(PyValueError::new_err)?;
        let options = ServiceOptions {
            router,
            selection_cache: selection_cache.map(|c| c.inner).unwrap_or_default(),
        };
        let svc = Arc::new(
            dynamo_selection::SelectionService::new(options, rt.handle().clone())
                .map_err(|e| PyValueError::new_err(e.message))?,
        );
        if let Some(port) = replica_sync_port {
            let host =
                std::env::var(REPLICA_SYNC_HOST_ENV).unwrap_or_else(|_| "0.0.0.0".to_owned());
            let peers = replica_sync_peers.unwrap_or_default();
            py.detach(|| svc.enable_replica_sync(&host, port, &peers))
                .map_err(|e| PyValueError::new_err(e.message))?;
        }
        // Recovery: after the slow-joiner delay, from the first peer that answers.
        let _ = recovery::spawn(
            svc.clone(),
            recovery_peers,
            recovery::SLOW_JOINER_DELAY,
            rt.handle(),
        );
        Ok(Self { svc })
    }

    /// Stop the service: listeners end and further selections fail with `not_ready`.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.svc.shutdown());
    }

    /// Upsert a worker and subscribe to its KV events; resolves to its catalog record.
    #[pyo3(signature = (worker))]
    fn upsert_worker<'py>(
        &self,
        py: Python<'py>,
        worker: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req: WorkerRequest = request(worker)?;
        let svc = self.svc.clone();
        py_future_with(
            py,
            async move { svc.upsert_worker_settled(req).await },
            |py, out| match out {
                Ok(rec) => to_py(py, &rec),
                Err(e) => Err(selection_error(py, e)),
            },
            false,
        )
    }

    /// Remove a worker and its KV-event listeners; resolves to its last record.
    #[pyo3(signature = (worker_id))]
    fn delete_worker<'py>(&self, py: Python<'py>, worker_id: u64) -> PyResult<Bound<'py, PyAny>> {
        answer(py, || self.svc.delete_worker(worker_id))
    }

    /// Catalog records, optionally filtered by model and routing group.
    #[pyo3(signature = (*, model_name=None, routing_group=None))]
    fn list_workers(
        &self,
        py: Python<'_>,
        model_name: Option<&str>,
        routing_group: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let v = py.detach(|| self.svc.list_workers(model_name, routing_group));
        to_py(py, &v)
    }

    /// Whether at least one worker is schedulable, plus the catalog.
    fn ready(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = py.detach(|| self.svc.ready());
        to_py(py, &v)
    }

    /// Per-rank KV overlap of a prompt.
    #[pyo3(signature = (request))]
    fn overlap_scores<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = prompt_request(request)?;
        answer(py, || self.svc.overlap_scores(&req))
    }

    /// Choose a worker without booking (cached under `selection_id` when given).
    #[pyo3(signature = (request))]
    fn select<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = prompt_request(request)?;
        answer(py, || self.svc.select(&req))
    }

    /// Choose a worker and book the request's load.
    #[pyo3(signature = (request))]
    fn select_and_reserve<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = prompt_request(request)?;
        answer(py, || self.svc.select_and_reserve(&req))
    }

    /// Book under `selection_id`: replay its cached selection, or book on `worker_id`.
    #[pyo3(signature = (request))]
    fn create_reservation<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = reservation_request(request)?;
        answer(py, || self.svc.create_reservation(&req))
    }

    /// The reservation's prefill is done.
    #[pyo3(signature = (selection_id))]
    fn prefill_complete<'py>(
        &self,
        py: Python<'py>,
        selection_id: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        answer(py, || self.svc.prefill_complete(selection_id))
    }

    /// One more decode output block for the reservation.
    #[pyo3(signature = (selection_id, *, decay_fraction=None))]
    fn add_output_block(
        &self,
        py: Python<'_>,
        selection_id: &str,
        decay_fraction: Option<f64>,
    ) -> PyResult<()> {
        py.detach(|| self.svc.add_output_block(selection_id, decay_fraction))
            .map_err(|e| selection_error(py, e))
    }

    /// Free a finished reservation.
    #[pyo3(signature = (selection_id))]
    fn free_reservation<'py>(
        &self,
        py: Python<'py>,
        selection_id: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        answer(py, || self.svc.free_reservation(selection_id))
    }

    /// Current per-model load.
    #[pyo3(signature = (*, model_name=None, routing_group=None))]
    fn loads(
        &self,
        py: Python<'_>,
        model_name: Option<&str>,
        routing_group: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let v = py.detach(|| self.svc.loads(model_name, routing_group));
        to_py(py, &v)
    }

    /// Per-rank load with this prompt, without booking.
    #[pyo3(signature = (request))]
    fn potential_loads<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = prompt_request(request)?;
        answer(py, || self.svc.potential_loads(&req))
    }
}

impl Drop for PySelectionService {
    fn drop(&mut self) {
        self.svc.shutdown();
    }
}

/// `argv`, or `sys.argv[1:]`.
fn argv_or_sys(py: Python<'_>, args: Option<Vec<String>>) -> PyResult<Vec<String>> {
    match args {
        Some(a) => Ok(a),
        None => {
            let all: Vec<String> = py.import("sys")?.getattr("argv")?.extract()?;
            Ok(all.into_iter().skip(1).collect())
        }
    }
}

/// Block until the service ends or a signal arrives, with the GIL released between
/// checks. SIGTERM is routed to `KeyboardInterrupt` while the service runs (when called
/// on the main thread), so both SIGINT and SIGTERM stop it gracefully and return.
fn block_on_service(py: Python<'_>, running: Running) -> PyResult<()> {
    let signal = py.import("signal")?;
    let threading = py.import("threading")?;
    let main = threading
        .call_method0("current_thread")?
        .is(&threading.call_method0("main_thread")?);
    let sigterm = signal.getattr("SIGTERM")?;
    let previous = if main {
        let prev = signal.call_method1("getsignal", (&sigterm,))?;
        signal.call_method1("signal", (&sigterm, signal.getattr("default_int_handler")?))?;
        Some(prev)
    } else {
        None
    };
    let result = loop {
        if let Some(r) = py.detach(|| running.wait(Duration::from_millis(100))) {
            break r.map_err(PyValueError::new_err);
        }
        if let Err(e) = py.check_signals() {
            running.stop();
            let _ = py.detach(|| running.wait(Duration::from_secs(30)));
            break if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                Ok(())
            } else {
                Err(e)
            };
        }
    };
    if let Some(prev) = previous {
        signal.call_method1("signal", (&sigterm, prev))?;
    }
    result
}

fn run<A: cli::Parser + Sync>(
    py: Python<'_>,
    args: Option<Vec<String>>,
    start: impl FnOnce(&A, &tokio::runtime::Handle) -> Result<Running, String> + Send,
) -> PyResult<()> {
    let argv = argv_or_sys(py, args)?;
    let parsed: A = cli::parse_args(&argv).map_err(|e| command_line_exit(py, &e))?;
    let rt = dynamo_runtime::tokio_runtime().map_err(runtime_error)?;
    let running = match py.detach(|| start(&parsed, rt.handle())) {
        Ok(r) => r,
        Err(msg) => {
            let _ = py.import("sys").and_then(|s| {
                s.getattr("stderr")?
                    .call_method1("write", (format!("error: {msg}\n"),))
            });
            return Err(PySystemExit::new_err(2));
        }
    };
    block_on_service(py, running)
}

/// Run the selection service (`python -m dynamo.select_service`) until SIGINT/SIGTERM.
#[pyfunction]
#[pyo3(signature = (args=None))]
fn run_select_service(py: Python<'_>, args: Option<Vec<String>>) -> PyResult<()> {
    run::<SelectArgs>(py, args, cli::start_select)
}

/// Run the standalone KV indexer (`python -m dynamo.indexer`) until SIGINT/SIGTERM.
#[pyfunction]
#[pyo3(signature = (args=None))]
fn run_kv_indexer(py: Python<'_>, args: Option<Vec<String>>) -> PyResult<()> {
    run::<IndexerArgs>(py, args, cli::start_indexer)
}

/// Run the standalone slot tracker (`python -m dynamo.slot_tracker`) until SIGINT/SIGTERM.
#[pyfunction]
#[pyo3(signature = (args=None))]
fn run_slot_tracker(py: Python<'_>, args: Option<Vec<String>>) -> PyResult<()> {
    run::<SlotTrackerArgs>(py, args, cli::start_slot_tracker)
}

/// Register the classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelectionCacheConfig>()?;
    m.add_class::<PySelectionService>()?;
    m.add_function(wrap_pyfunction!(run_select_service, m)?)?;
    m.add_function(wrap_pyfunction!(run_kv_indexer, m)?)?;
    m.add_function(wrap_pyfunction!(run_slot_tracker, m)?)?;
    Ok(())
}
