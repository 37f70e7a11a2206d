//! `dynamo.runtime`: the distributed runtime's classes, one file per area.
//!
//! * [`distributed_runtime`]: `DistributedRuntime`, `Endpoint`, `Client`, `Instance`,
//!   `TransportType`, `RuntimeMetrics` (thin bindings over `dynamo_runtime`), and the tokio
//!   runtime handed to pyo3-async-runtimes.
//! * [`context`]: `Context`, `ContextMetadata`, `SpanProxy`.
//! * [`engine`]: the bridge between the request plane and Python handlers and streams
//!   (with its Python half, `bridge.py`).
//! * [`logging`]: `log_message` (what `dynamo.runtime.logging` forwards to) and the tracing
//!   subscriber.

use pyo3::prelude::*;

pub(crate) mod context;
pub(crate) mod distributed_runtime;
pub(crate) mod engine;
pub(crate) mod logging;

/// Register every `dynamo.runtime` class and function on the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    distributed_runtime::register(m)?;
    logging::register(m)?;
    Ok(())
}
