//! The Python exception hierarchy of `dynamo._core` and the mapping of core errors to it.
//!
//! ```text
//! Exception
//! └── DynamoException
//!     ├── Unknown, InvalidArgument, CannotConnect, Disconnected, ConnectionTimeout,
//!     ├── Cancelled, EngineShutdown, StreamIncomplete
//!     ├── RouterQueueLimitExceeded   (attributes set by the runtime when raised)
//!     └── SelectionServiceError      (attributes set by the runtime when raised)
//! ```

use pyo3::exceptions::{
    PyBufferError, PyException, PyIndexError, PyMemoryError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

pyo3::create_exception!(
    dynamo._core,
    DynamoException,
    PyException,
    "Base class of every error category raised by the Dynamo runtime."
);
pyo3::create_exception!(
    dynamo._core,
    Unknown,
    DynamoException,
    "An error that fits no other category."
);
pyo3::create_exception!(
    dynamo._core,
    InvalidArgument,
    DynamoException,
    "The request or an argument was invalid (for example a prompt longer than the context)."
);
pyo3::create_exception!(
    dynamo._core,
    CannotConnect,
    DynamoException,
    "A connection could not be established."
);
pyo3::create_exception!(
    dynamo._core,
    Disconnected,
    DynamoException,
    "An established connection was lost."
);
pyo3::create_exception!(
    dynamo._core,
    ConnectionTimeout,
    DynamoException,
    "A connection or request timed out."
);
pyo3::create_exception!(
    dynamo._core,
    Cancelled,
    DynamoException,
    "The request was cancelled."
);
pyo3::create_exception!(
    dynamo._core,
    EngineShutdown,
    DynamoException,
    "The engine shut down or crashed; the request may be migrated to another worker."
);
pyo3::create_exception!(
    dynamo._core,
    StreamIncomplete,
    DynamoException,
    "The response stream ended before completion; the request may be migrated."
);
pyo3::create_exception!(
    dynamo._core,
    RouterQueueLimitExceeded,
    DynamoException,
    "A router queue rejected the request. Attributes: policy_class, limit_kind, current, limit."
);
pyo3::create_exception!(
    dynamo._core,
    SelectionServiceError,
    DynamoException,
    "A selection-service call failed. Attributes: kind, status_code."
);

/// Add every exception class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DynamoException", py.get_type::<DynamoException>())?;
    m.add("Unknown", py.get_type::<Unknown>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("CannotConnect", py.get_type::<CannotConnect>())?;
    m.add("Disconnected", py.get_type::<Disconnected>())?;
    m.add("ConnectionTimeout", py.get_type::<ConnectionTimeout>())?;
    m.add("Cancelled", py.get_type::<Cancelled>())?;
    m.add("EngineShutdown", py.get_type::<EngineShutdown>())?;
    m.add("StreamIncomplete", py.get_type::<StreamIncomplete>())?;
    m.add(
        "RouterQueueLimitExceeded",
        py.get_type::<RouterQueueLimitExceeded>(),
    )?;
    m.add(
        "SelectionServiceError",
        py.get_type::<SelectionServiceError>(),
    )?;
    Ok(())
}

/// Map a KV-router core error to Python: an event the index cannot apply becomes
/// `RuntimeError("Failed to apply event: ...")` (as in the reference); bad input (bytes that
/// do not decode, a zero block size, ...) becomes `ValueError`.
pub(crate) fn kv_router_error(err: dynamo_kv_router::Error) -> PyErr {
    if err.is_apply_error() {
        PyRuntimeError::new_err(format!("Failed to apply event: {err}"))
    } else {
        PyValueError::new_err(err.to_string())
    }
}

/// Map a block manager error to Python: bad arguments → `ValueError`, an index out of range
/// → `IndexError`, a view that cannot be exported → `BufferError`, host allocation failure →
/// `MemoryError`, and the state of the machine or the pools (too few free blocks, a pool
/// that was not configured, CUDA unavailable or failing) → `RuntimeError`.
pub(crate) fn block_manager_error(err: dynamo_block_manager::Error) -> PyErr {
    use dynamo_block_manager::Error as E;
    let msg = err.to_string();
    match err {
        E::ZeroDimension(_)
        | E::InvalidConfig(_)
        | E::UnsupportedDtype(_)
        | E::SizeOverflow
        | E::IncompatibleLayouts(_)
        | E::InvalidCopy(_)
        | E::BlockFull(_)
        | E::InvalidState { .. } => PyValueError::new_err(msg),
        E::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        E::NotContiguous => PyBufferError::new_err(msg),
        E::HostAllocation(_) => PyMemoryError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}
