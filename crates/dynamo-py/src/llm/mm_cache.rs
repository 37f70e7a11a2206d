//! The multimodal embedding cache's discovery: `MultimodalEmbeddingCachePublisher` (an
//! encode worker announces the embedding keys it holds) and `MultimodalEmbeddingCacheIndex`
//! (a consumer's view of who holds what), over `dynamo_llm::mm_cache`.

use std::sync::Arc;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::aio::py_future;
use crate::errors::llm_error;
use crate::runtime::distributed_runtime::Endpoint;

/// Register the embedding-cache classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MultimodalEmbeddingCachePublisher>()?;
    m.add_class::<MultimodalEmbeddingCacheIndex>()?;
    Ok(())
}

/// Publishes which multimodal embedding keys this encode worker caches.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct MultimodalEmbeddingCachePublisher {
    inner: Arc<dynamo_llm::mm_cache::MultimodalEmbeddingCachePublisher>,
}

#[pymethods]
impl MultimodalEmbeddingCachePublisher {
    #[new]
    fn new() -> Self {
        Self {
            inner: Arc::new(dynamo_llm::mm_cache::MultimodalEmbeddingCachePublisher::new()),
        }
    }

    #[pyo3(signature = (endpoint))]
    fn create_endpoint<'py>(
        &self,
        py: Python<'py>,
        endpoint: PyRef<'_, Endpoint>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        let (runtime, id) = endpoint.parts();
        let (runtime, id) = (runtime.clone(), id.clone());
        py_future(
            py,
            async move {
                inner
                    .create_endpoint(&runtime, &id)
                    .await
                    .map_err(llm_error)
            },
            true,
        )
    }

    #[pyo3(signature = (added_keys, removed_keys))]
    fn publish_delta(&self, added_keys: Vec<String>, removed_keys: Vec<String>) -> PyResult<()> {
        self.inner
            .publish_delta(&added_keys, &removed_keys)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

/// The routing side's view of which encode worker holds which embedding keys.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct MultimodalEmbeddingCacheIndex {
    inner: Arc<dynamo_llm::mm_cache::MultimodalEmbeddingCacheIndex>,
}

#[pymethods]
impl MultimodalEmbeddingCacheIndex {
    /// Start following `endpoint`'s encode workers (awaitable).
    #[staticmethod]
    #[pyo3(signature = (endpoint))]
    fn create<'py>(py: Python<'py>, endpoint: PyRef<'_, Endpoint>) -> PyResult<Bound<'py, PyAny>> {
        let (runtime, id) = endpoint.parts();
        let (runtime, id) = (runtime.clone(), id.clone());
        py_future(
            py,
            async move {
                dynamo_llm::mm_cache::MultimodalEmbeddingCacheIndex::start(&runtime, &id)
                    .await
                    .map(|inner| Self {
                        inner: Arc::new(inner),
                    })
                    .map_err(llm_error)
            },
            true,
        )
    }

    #[pyo3(signature = (key))]
    fn holders(&self, key: &str) -> Vec<u64> {
        self.inner.holders(key)
    }

    #[pyo3(signature = (worker_id))]
    fn keys(&self, worker_id: u64) -> Option<Vec<String>> {
        self.inner.keys(worker_id)
    }

    fn workers(&self) -> Vec<u64> {
        self.inner.workers()
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}
