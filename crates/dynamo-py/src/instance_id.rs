//! `ModelCardInstanceId`: which worker instance a model card belongs to.
//!
//! The reference hands it to `chat_engine_factory` callbacks; like the reference it has no
//! Python constructor (`TypeError: No constructor defined`) and exposes only `triple()`
//! (its instance id stays internal).

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
    #[expect(
        dead_code,
        reason = "built where a chat_engine_factory is invoked; the frontend does not invoke one yet"
    )]
    pub(crate) fn new(endpoint: EndpointId, instance_id: u64) -> Self {
        Self {
            endpoint,
            instance_id,
        }
    }

    /// The instance id (not exposed to Python, as in the reference).
    #[expect(dead_code, reason = "kept for the factory caller's logs")]
    pub(crate) fn instance_id(&self) -> u64 {
        self.instance_id
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
}
