//! `LoRADownloader` (wrapping `dynamo_lora::LoraDownloader`).
//!
//! Errors: an unsupported or malformed URI raises `ValueError`; every other failure of
//! `download_if_needed` raises `RuntimeError("Download failed: <uri>: <cause>")` (the
//! reference's prefix); a cache directory that cannot be determined and a cache entry
//! that cannot be inspected raise `RuntimeError`.

use std::path::PathBuf;
use std::sync::Arc;

use dynamo_lora::{LoraDownloader, LoraError, uri_to_cache_key};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

fn lora_error(err: LoraError) -> PyErr {
    match err {
        LoraError::InvalidUri(_) | LoraError::InvalidCacheKey(_) => {
            PyValueError::new_err(err.to_string())
        }
        LoraError::Download(_) => PyRuntimeError::new_err(format!("Download failed: {err}")),
        _ => PyRuntimeError::new_err(err.to_string()),
    }
}

/// Resolves LoRA adapter URIs (`file://`, `s3://`) to local directories, downloading
/// into and serving from an on-disk cache.
#[pyclass(name = "LoRADownloader", module = "dynamo._core", frozen)]
pub(crate) struct PyLoRADownloader {
    inner: Arc<LoraDownloader>,
}

#[pymethods]
impl PyLoRADownloader {
    #[new]
    #[pyo3(signature = (cache_path = None))]
    fn new(cache_path: Option<PathBuf>) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(LoraDownloader::new(cache_path).map_err(lora_error)?),
        })
    }

    /// The local directory of the adapter at `lora_uri` (awaitable): a `file://` path as
    /// is, an `s3://` prefix from the cache (downloaded first when missing).
    #[pyo3(signature = (lora_uri))]
    fn download_if_needed<'py>(
        &self,
        py: Python<'py>,
        lora_uri: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = Arc::clone(&self.inner);
        crate::aio::py_future(
            py,
            async move {
                let path = inner
                    .download_if_needed(&lora_uri)
                    .await
                    .map_err(lora_error)?;
                Ok(path.display().to_string())
            },
            true,
        )
    }

    /// The cache directory of `cache_key` (`ValueError` for a key naming a path outside
    /// the cache).
    #[pyo3(signature = (cache_key))]
    fn get_cache_path(&self, cache_key: &str) -> PyResult<String> {
        let p = self
            .inner
            .cache()
            .entry_path(cache_key)
            .map_err(lora_error)?;
        Ok(p.display().to_string())
    }

    /// Whether a URI (or, without `://`, a cache key) is available locally.
    #[pyo3(signature = (lora_uri))]
    fn is_cached(&self, py: Python<'_>, lora_uri: &str) -> bool {
        py.detach(|| self.inner.is_cached(lora_uri))
    }

    /// Whether the cache entry `cache_key` holds `adapter_config.json` plus adapter
    /// weights (`False` for a key naming no entry; `RuntimeError` when it cannot be read).
    #[pyo3(signature = (cache_key))]
    fn validate_cached(&self, py: Python<'_>, cache_key: &str) -> PyResult<bool> {
        match py.detach(|| self.inner.cache().validate(cache_key)) {
            Err(LoraError::InvalidCacheKey(_)) => Ok(false),
            r => r.map_err(lora_error),
        }
    }

    /// The cache key of a URI (the reference's format: `s3://b/a/x.y` -> `s3__b_a_x_y`).
    #[staticmethod]
    #[pyo3(signature = (uri))]
    fn uri_to_cache_key(uri: &str) -> String {
        uri_to_cache_key(uri)
    }
}

/// Register `LoRADownloader`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoRADownloader>()
}
