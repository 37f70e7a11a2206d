//! Forward-pass metrics: `FpmDirectPublisher`, `FpmEventRelay`, `FpmEventSubscriber` (thin
//! wrappers over `dynamo_llm::fpm`).

use dynamo_llm::fpm::{self, FpmLengths, FpmSample};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::errors;
use crate::errors::llm_error;
use crate::runtime::distributed_runtime::Endpoint;

/// Register the FPM classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FpmDirectPublisher>()?;
    m.add_class::<FpmEventRelay>()?;
    m.add_class::<FpmEventSubscriber>()?;
    Ok(())
}

fn enter() -> PyResult<tokio::runtime::EnterGuard<'static>> {
    Ok(dynamo_runtime::tokio_runtime()
        .map_err(errors::runtime_error)?
        .enter())
}

fn count(name: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {v}")))
}

/// In-process FPM producer with one channel per DP rank.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FpmDirectPublisher {
    inner: fpm::FpmDirectPublisher,
}

#[pymethods]
impl FpmDirectPublisher {
    #[new]
    #[pyo3(signature = (endpoint, worker_id, dp_size=1))]
    fn new(endpoint: PyRef<'_, Endpoint>, worker_id: String, dp_size: u32) -> PyResult<Self> {
        let _guard = enter()?;
        let (runtime, id) = endpoint.parts();
        Ok(Self {
            inner: fpm::FpmDirectPublisher::new(runtime, id, &worker_id, dp_size),
        })
    }

    /// Publish one pass of `dp_rank` (keyword-only: adjacent counts are easy to swap).
    /// The optional length lists feed the variance fields.
    #[pyo3(signature = (*, dp_rank, scheduled_num_prefill_requests, scheduled_sum_prefill_tokens, scheduled_sum_prefill_kv_tokens, scheduled_num_decode_requests, scheduled_sum_decode_kv_tokens, queued_num_prefill_requests, queued_sum_prefill_tokens, queued_num_decode_requests, queued_sum_decode_kv_tokens, wall_time_secs, scheduled_prefill_lengths=None, scheduled_decode_kv_lengths=None, queued_prefill_lengths=None, queued_decode_kv_lengths=None))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn publish(
        &self,
        dp_rank: i64,
        scheduled_num_prefill_requests: i64,
        scheduled_sum_prefill_tokens: i64,
        scheduled_sum_prefill_kv_tokens: i64,
        scheduled_num_decode_requests: i64,
        scheduled_sum_decode_kv_tokens: i64,
        queued_num_prefill_requests: i64,
        queued_sum_prefill_tokens: i64,
        queued_num_decode_requests: i64,
        queued_sum_decode_kv_tokens: i64,
        wall_time_secs: f64,
        scheduled_prefill_lengths: Option<Vec<u64>>,
        scheduled_decode_kv_lengths: Option<Vec<u64>>,
        queued_prefill_lengths: Option<Vec<u64>>,
        queued_decode_kv_lengths: Option<Vec<u64>>,
    ) -> PyResult<()> {
        if !(wall_time_secs.is_finite() && wall_time_secs >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "wall_time_secs must be a finite number >= 0, got {wall_time_secs}"
            )));
        }
        let any_lengths = scheduled_prefill_lengths.is_some()
            || scheduled_decode_kv_lengths.is_some()
            || queued_prefill_lengths.is_some()
            || queued_decode_kv_lengths.is_some();
        let lengths = any_lengths.then(|| {
            Box::new(FpmLengths {
                scheduled_prefill: scheduled_prefill_lengths.unwrap_or_default(),
                scheduled_decode_kv: scheduled_decode_kv_lengths.unwrap_or_default(),
                queued_prefill: queued_prefill_lengths.unwrap_or_default(),
                queued_decode_kv: queued_decode_kv_lengths.unwrap_or_default(),
            })
        });
        let sample = FpmSample {
            scheduled_num_prefill_requests: count(
                "scheduled_num_prefill_requests",
                scheduled_num_prefill_requests,
            )?,
            scheduled_sum_prefill_tokens: count(
                "scheduled_sum_prefill_tokens",
                scheduled_sum_prefill_tokens,
            )?,
            scheduled_sum_prefill_kv_tokens: count(
                "scheduled_sum_prefill_kv_tokens",
                scheduled_sum_prefill_kv_tokens,
            )?,
            scheduled_num_decode_requests: count(
                "scheduled_num_decode_requests",
                scheduled_num_decode_requests,
            )?,
            scheduled_sum_decode_kv_tokens: count(
                "scheduled_sum_decode_kv_tokens",
                scheduled_sum_decode_kv_tokens,
            )?,
            queued_num_prefill_requests: count(
                "queued_num_prefill_requests",
                queued_num_prefill_requests,
            )?,
            queued_sum_prefill_tokens: count(
                "queued_sum_prefill_tokens",
                queued_sum_prefill_tokens,
            )?,
            queued_num_decode_requests: count(
                "queued_num_decode_requests",
                queued_num_decode_requests,
            )?,
            queued_sum_decode_kv_tokens: count(
                "queued_sum_decode_kv_tokens",
                queued_sum_decode_kv_tokens,
            )?,
            wall_time_secs,
            lengths,
        };
        let rank = u32::try_from(dp_rank)
            .map_err(|_| PyValueError::new_err(format!("dp_rank must be >= 0, got {dp_rank}")))?;
        self.inner.publish(rank, sample).map_err(llm_error)
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// Relays FPM from a local ZMQ PUB socket to the event plane.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FpmEventRelay {
    inner: fpm::FpmEventRelay,
}

#[pymethods]
impl FpmEventRelay {
    #[new]
    #[pyo3(signature = (endpoint, zmq_endpoint))]
    fn new(endpoint: PyRef<'_, Endpoint>, zmq_endpoint: &str) -> PyResult<Self> {
        let _guard = enter()?;
        let (runtime, id) = endpoint.parts();
        Ok(Self {
            inner: fpm::FpmEventRelay::new(runtime, id, zmq_endpoint),
        })
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// FPM consumer: `recv()` mode or tracking mode.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FpmEventSubscriber {
    inner: fpm::FpmSubscriber,
}

#[pymethods]
impl FpmEventSubscriber {
    #[new]
    #[pyo3(signature = (endpoint))]
    fn new(endpoint: PyRef<'_, Endpoint>) -> PyResult<Self> {
        let _guard = enter()?;
        let (runtime, id) = endpoint.parts();
        Ok(Self {
            inner: fpm::FpmSubscriber::new(runtime, id),
        })
    }

    /// The next raw payload (blocking, GIL released); None once closed.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let rt = dynamo_runtime::tokio_runtime().map_err(errors::runtime_error)?;
        let got = py.detach(|| rt.block_on(self.inner.recv()));
        match got {
            Ok(Some(bytes)) => Ok(Some(PyBytes::new(py, &bytes))),
            Ok(None) => Ok(None),
            Err(e) => Err(PyRuntimeError::new_err(e)),
        }
    }

    fn start_tracking(&self) -> PyResult<()> {
        let _guard = enter()?;
        self.inner.start_tracking().map_err(PyRuntimeError::new_err)
    }

    /// `{(worker_id, dp_rank): payload}`.
    fn get_recent_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.recent_stats().map_err(PyRuntimeError::new_err)?;
        let dict = PyDict::new(py);
        for ((worker, rank), bytes) in stats {
            let key = PyTuple::new(
                py,
                [
                    worker.into_pyobject(py)?.into_any(),
                    rank.into_pyobject(py)?.into_any(),
                ],
            )?;
            dict.set_item(key, PyBytes::new(py, &bytes))?;
        }
        Ok(dict)
    }

    /// `{worker_id: model card JSON}`.
    fn get_model_cards(&self) -> PyResult<std::collections::BTreeMap<String, String>> {
        self.inner.model_cards().map_err(PyRuntimeError::new_err)
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}
