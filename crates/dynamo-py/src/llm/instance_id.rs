//! `ModelCardInstanceId`: which worker instance a model card belongs to.
//!
//! The frontend hands it to `chat_engine_factory` callbacks (see `routed_engine.rs`); like
//! the reference it has no Python constructor (`TypeError: No constructor defined`) and
//! exposes only `triple()` (its instance id shows only in its `repr`).

use dynamo_runtime::EndpointId;
use pyo3::prelude::*;

/// Register `ModelCardInstanceId`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ModelCardInstanceId>()
}

/// Identity of a worker instance: the endpoint it serves and its instance id.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct ModelCardInstanceId {
    endpoint: EndpointId,
    instance_id: u64,
}

impl ModelCardInstanceId {
    /// The identity of instance `instance_id` serving `endpoint`.
    pub(crate) fn new(endpoint: EndpointId, instance_id: u64) -> Self {
        Self {
            endpoint,
            instance_id,
        }
    }

    /// The instance id (not exposed to Python, as in the reference).
    pub(crate) fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// The endpoint the instance serves.
    pub(crate) fn endpoint(&self) -> &EndpointId {
        &self.endpoint
    }
}

#[pymethods]
impl ModelCardInstanceId {
    /// `(namespace, component, endpoint)` this worker is serving.
    fn triple(&self) -> (String, String, String) {
        (
            self.endpoint.namespace.clone(),
            self.endpoint.component.clone(),
            self.endpoint.name.clone(),
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "ModelCardInstanceId(namespace={:?}, component={:?}, endpoint={:?}, instance_id={:x})",
            self.endpoint().namespace,
            self.endpoint().component,
            self.endpoint().name,
            self.instance_id()
        )
    }
}
