//! `MediaDecoder`, `MediaFetcher` and `resolve_routing_image_token_id`. The settings types
//! and the fetch/decode/placeholder logic live in `dynamo_multimodal`; the classes hold
//! a settings value that `register_model` copies into the model card.

use std::path::PathBuf;

use dynamo_multimodal::{ImageDecoderConfig, MediaDecoderConfig, MediaFetcherConfig, placeholder};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::json::py_to_json;

/// Register the media classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMediaDecoder>()?;
    m.add_class::<PyMediaFetcher>()?;
    m.add_function(wrap_pyfunction!(resolve_routing_image_token_id, m)?)?;
    Ok(())
}

/// Which media the frontend decodes for a model (passed to `register_model`).
#[pyclass(name = "MediaDecoder", module = "dynamo._core", from_py_object)]
#[derive(Clone, Default)]
pub(crate) struct PyMediaDecoder {
    pub(crate) inner: MediaDecoderConfig,
}

#[pymethods]
impl PyMediaDecoder {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Decode images: `{"limits": {"max_image_width", "max_image_height", "max_alloc",
    /// "max_pixels"}, "formats": ["png", "jpeg", "webp", "gif"]}`, every key optional.
    #[pyo3(signature = (decoder_options))]
    fn enable_image(&mut self, decoder_options: &Bound<'_, PyDict>) -> PyResult<()> {
        let options = py_to_json(decoder_options.as_any())?;
        let config = ImageDecoderConfig::from_options(&options).map_err(|e| {
            PyValueError::new_err(format!("Failed to parse image decoder config: {e}"))
        })?;
        self.inner.image = Some(config);
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "MediaDecoder({})",
            serde_json::to_string(&self.inner).unwrap_or_default()
        )
    }
}

/// How the frontend fetches media URLs for a model (passed to `register_model`). The
/// setters change this object and return None, as the reference's do.
#[pyclass(name = "MediaFetcher", module = "dynamo._core", from_py_object)]
#[derive(Clone, Default)]
pub(crate) struct PyMediaFetcher {
    pub(crate) inner: MediaFetcherConfig,
}

#[pymethods]
impl PyMediaFetcher {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    #[pyo3(signature = (user_agent))]
    fn user_agent(&mut self, user_agent: String) {
        self.inner.user_agent = Some(user_agent);
    }

    #[pyo3(signature = (allow))]
    fn allow_direct_ip(&mut self, allow: bool) {
        self.inner.allow_direct_ip = allow;
    }

    #[pyo3(signature = (allow))]
    fn allow_direct_port(&mut self, allow: bool) {
        self.inner.allow_direct_port = allow;
    }

    #[pyo3(signature = (allow))]
    fn allow_private_ips(&mut self, allow: bool) {
        self.inner.allow_private_ips = allow;
    }

    #[pyo3(signature = (domains))]
    fn allowed_media_domains(&mut self, domains: Vec<String>) {
        self.inner.allowed_media_domains = Some(domains);
    }

    #[pyo3(signature = (timeout_ms))]
    fn timeout_ms(&mut self, timeout_ms: u64) -> PyResult<()> {
        if timeout_ms == 0 {
            return Err(PyValueError::new_err("timeout_ms must be positive"));
        }
        self.inner.timeout_ms = Some(timeout_ms);
        Ok(())
    }

    #[pyo3(signature = (max_bytes))]
    fn max_bytes(&mut self, max_bytes: u64) -> PyResult<()> {
        if max_bytes == 0 {
            return Err(PyValueError::new_err("max_bytes must be positive"));
        }
        self.inner.max_bytes = Some(max_bytes);
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "MediaFetcher({})",
            serde_json::to_string(&self.inner).unwrap_or_default()
        )
    }
}

/// The decoder settings of `register_model(media_decoder=...)`.
pub(crate) fn decoder_config(
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<MediaDecoderConfig>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => Ok(Some(
            o.extract::<PyMediaDecoder>()
                .map_err(|_| PyTypeError::new_err("media_decoder must be a MediaDecoder"))?
                .inner,
        )),
    }
}

/// The fetcher settings of `register_model(media_fetcher=...)`.
pub(crate) fn fetcher_config(
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<MediaFetcherConfig>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => Ok(Some(
            o.extract::<PyMediaFetcher>()
                .map_err(|_| PyTypeError::new_err("media_fetcher must be a MediaFetcher"))?
                .inner,
        )),
    }
}

/// The routing-side image placeholder token id of a model family, or None.
#[pyfunction]
#[pyo3(signature = (model_id, model_dir = None))]
fn resolve_routing_image_token_id(
    py: Python<'_>,
    model_id: String,
    model_dir: Option<PathBuf>,
) -> Option<u32> {
    let dir = model_dir.unwrap_or_else(|| PathBuf::from(&model_id));
    // Reads and parses a tokenizer: without the GIL.
    py.detach(|| placeholder::resolve_routing_image_token_id(&model_id, &dir))
}
