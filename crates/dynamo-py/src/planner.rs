//! The planner's control plane: `PlannerDecision`, `VirtualConnectorCoordinator`,
//! `VirtualConnectorClient` (over `dynamo_runtime::planner`), `run_planner` (the loop of
//! `dynamo_llm::planner`).

use std::sync::Arc;
use std::time::Duration;

use dynamo_runtime::planner as core;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::aio::py_future;
use crate::errors::llm_error;
use crate::errors::runtime_error;
use crate::runtime::distributed_runtime::DistributedRuntime;

/// Register the planner classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PlannerDecision>()?;
    m.add_class::<VirtualConnectorCoordinator>()?;
    m.add_class::<VirtualConnectorClient>()?;
    m.add_function(wrap_pyfunction!(run_planner, m)?)?;
    m.add_function(wrap_pyfunction!(parse_planner_args, m)?)?;
    // The seed API's name of `endpoint.metrics`'s class (the reference's stub imports
    // `RuntimeMetrics as PyRuntimeMetrics`; its module has only `RuntimeMetrics`). Same
    // class object, so isinstance checks agree. Registered after the runtime classes.
    m.add("PyRuntimeMetrics", m.getattr("RuntimeMetrics")?)?;
    Ok(())
}

/// A scaling request (`-1`: not set).
#[pyclass(module = "dynamo._core", frozen)]
#[derive(Clone, Copy)]
pub(crate) struct PlannerDecision {
    inner: core::PlannerDecision,
}

#[pymethods]
impl PlannerDecision {
    #[getter]
    fn num_prefill_workers(&self) -> i64 {
        self.inner.num_prefill_workers
    }

    #[getter]
    fn num_decode_workers(&self) -> i64 {
        self.inner.num_decode_workers
    }

    #[getter]
    fn decision_id(&self) -> i64 {
        self.inner.decision_id
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "PlannerDecision(num_prefill_workers={}, num_decode_workers={}, decision_id={})",
            d.num_prefill_workers, d.num_decode_workers, d.decision_id
        )
    }
}

fn not_initialized() -> PyErr {
    PyRuntimeError::new_err("Call async_init before using this object")
}

/// The planner side of the virtual connector.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct VirtualConnectorCoordinator {
    inner: Arc<core::VirtualConnectorCoordinator>,
}

#[pymethods]
impl VirtualConnectorCoordinator {
    #[new]
    #[pyo3(signature = (runtime, dynamo_namespace, check_interval_secs, max_wait_time_secs, max_retries))]
    fn new(
        runtime: PyRef<'_, DistributedRuntime>,
        dynamo_namespace: &str,
        check_interval_secs: u64,
        max_wait_time_secs: u64,
        max_retries: u32,
    ) -> Self {
        Self {
            inner: Arc::new(core::VirtualConnectorCoordinator::new(
                runtime.core(),
                dynamo_namespace,
                Duration::from_secs(check_interval_secs),
                Duration::from_secs(max_wait_time_secs),
                max_retries,
            )),
        }
    }

    fn async_init<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move { inner.init().await.map_err(runtime_error) },
            true,
        )
    }

    fn read_state(&self) -> PlannerDecision {
        PlannerDecision {
            inner: self.inner.read_state(),
        }
    }

    #[pyo3(signature = (num_prefill=None, num_decode=None))]
    fn update_scaling_decision<'py>(
        &self,
        py: Python<'py>,
        num_prefill: Option<i64>,
        num_decode: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !self.inner.is_initialized() {
            return Err(not_initialized());
        }
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                inner
                    .update_scaling_decision(num_prefill, num_decode)
                    .await
                    .map(|_| ())
                    .map_err(runtime_error)
            },
            true,
        )
    }

    fn wait_for_scaling_completion<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if !self.inner.is_initialized() {
            return Err(not_initialized());
        }
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                inner
                    .wait_for_scaling_completion()
                    .await
                    .map(|_| ())
                    .map_err(runtime_error)
            },
            true,
        )
    }

    fn is_scaling_ready<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if !self.inner.is_initialized() {
            return Err(not_initialized());
        }
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move { inner.is_scaling_ready().await.map_err(runtime_error) },
            true,
        )
    }
}

/// The environment side of the virtual connector.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct VirtualConnectorClient {
    inner: Arc<core::VirtualConnectorClient>,
}

#[pymethods]
impl VirtualConnectorClient {
    #[new]
    #[pyo3(signature = (runtime, dynamo_namespace))]
    fn new(runtime: PyRef<'_, DistributedRuntime>, dynamo_namespace: &str) -> Self {
        Self {
            inner: Arc::new(core::VirtualConnectorClient::new(
                runtime.core(),
                dynamo_namespace,
            )),
        }
    }

    fn get<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move {
                inner
                    .get()
                    .await
                    .map(|inner| PlannerDecision { inner })
                    .map_err(runtime_error)
            },
            true,
        )
    }

    /// Acknowledge `decision` (the reference names the parameter `event`; pass it
    /// positionally).
    #[pyo3(signature = (decision))]
    fn complete<'py>(
        &self,
        py: Python<'py>,
        decision: PyRef<'_, PlannerDecision>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        let decision = *decision;
        py_future(
            py,
            async move { inner.complete(&decision.inner).await.map_err(runtime_error) },
            true,
        )
    }

    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        py_future(
            py,
            async move { inner.wait().await.map_err(runtime_error) },
            true,
        )
    }
}

/// Parse the command line of `python -m dynamo.planner` before a runtime exists: `--help`
/// prints every flag and exits 0, a bad flag prints one usage line and exits 2. Returns
/// the runtime's flags, `(discovery_backend, request_plane)` (`None` when not given).
#[pyfunction]
pub(crate) fn parse_planner_args(
    py: Python<'_>,
    argv: Vec<String>,
) -> PyResult<(Option<String>, Option<String>)> {
    let cli = dynamo_llm::planner::PlannerCli::parse_args(&argv)
        .map_err(|e| crate::errors::command_line_exit(py, &e))?;
    Ok((cli.discovery_backend, cli.request_plane))
}

/// Run the planner (`python -m dynamo.planner`) on `runtime` until it stops; `argv` are
/// the planner's `--flag value` arguments.
#[pyfunction]
#[pyo3(signature = (runtime, argv))]
pub(crate) fn run_planner<'py>(
    py: Python<'py>,
    runtime: PyRef<'_, DistributedRuntime>,
    argv: Vec<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let config = dynamo_llm::planner::PlannerConfig::from_args(&argv).map_err(llm_error)?;
    let runtime = runtime.core().clone();
    py_future(
        py,
        async move {
            dynamo_llm::planner::run(runtime, config)
                .await
                .map_err(llm_error)
        },
        true,
    )
}
