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
    PyBufferError, PyException, PyFileNotFoundError, PyIndexError, PyMemoryError, PyRuntimeError,
    PyTimeoutError, PyValueError,
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
/// A command line's parse outcome as Python sees it: clap's message printed (help to
/// stdout, errors to stderr) and `SystemExit` with its code (0 for `--help`, 2 for a usage
/// error), so `python -m ...` ends with one line instead of a traceback.
pub(crate) fn command_line_exit(py: Python<'_>, e: &clap::Error) -> PyErr {
    let _ = e.print();
    let _ = py.import("sys").and_then(|s| {
        s.getattr("stdout")?.call_method0("flush")?;
        s.getattr("stderr")?.call_method0("flush")
    });
    pyo3::exceptions::PySystemExit::new_err(e.exit_code())
}

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

/// Map an LLM-layer error to Python: missing files and models → `FileNotFoundError`;
/// invalid arguments, configs, cards and requests → `ValueError`; a timeout →
/// `TimeoutError`; anything else → `dynamo._core.Unknown`.
pub(crate) fn llm_error(err: dynamo_llm::Error) -> PyErr {
    use dynamo_llm::Error as E;
    match &err {
        E::FileNotFound(_) | E::ModelNotFound { .. } => {
            PyFileNotFoundError::new_err(err.to_string())
        }
        E::InvalidConfig { .. }
        | E::Deserialize { .. }
        | E::ModelFile { .. }
        | E::InvalidRequest { .. }
        | E::Template(_)
        | E::Tokenizer(_) => PyValueError::new_err(err.to_string()),
        E::Timeout(_) => PyTimeoutError::new_err(err.to_string()),
        // As Python's own servers report it: OSError with the errno (98: address in use).
        E::Listen { errno, .. } => match errno {
            Some(n) => pyo3::exceptions::PyOSError::new_err((*n, err.to_string())),
            None => pyo3::exceptions::PyOSError::new_err(err.to_string()),
        },
        _ => Unknown::new_err(err.to_string()),
    }
}

/// Map a mocker error to Python: invalid engine arguments → `ValueError`; anything else
/// (a rejected request, a stopped engine, a port that cannot be bound) →
/// `dynamo._core.Unknown`.
pub(crate) fn mocker_error(err: dynamo_mocker::Error) -> PyErr {
    match &err {
        dynamo_mocker::Error::InvalidEngineArgs { .. } => PyValueError::new_err(err.to_string()),
        _ => Unknown::new_err(err.to_string()),
    }
}

/// Map a frontend error to Python: what a lower layer reported maps as that layer's; a
/// refused extension route → `ValueError`; a failed in-process request →
/// `dynamo._core.Unknown`.
pub(crate) fn frontend_error(err: dynamo_frontend::Error) -> PyErr {
    use dynamo_frontend::Error as E;
    match err {
        E::Llm(e) => llm_error(e),
        E::Mocker(e) => mocker_error(e),
        E::Route(e) => PyValueError::new_err(e.to_string()),
        other => Unknown::new_err(other.to_string()),
    }
}

/// Map a runtime core error to Python (API_CONTRACT §3).
pub(crate) fn runtime_error(err: dynamo_runtime::Error) -> PyErr {
    use dynamo_runtime::Error as E;
    let msg = err.to_string();
    match err {
        E::InvalidName(_)
        | E::InvalidArgument(_)
        | E::MessageTooLarge { .. }
        | E::NatsPayloadTooLarge { .. }
        | E::Codec(_) => PyValueError::new_err(msg),
        // etcd or NATS unreachable (or failing, or refusing the credentials).
        E::Discovery(_) | E::Nats(_) | E::NatsAuth(_) => CannotConnect::new_err(msg),
        E::UnknownInstance { .. } => PyValueError::new_err(msg),
        E::CannotConnect { .. } | E::NoInstances(_) => CannotConnect::new_err(msg),
        // The reference raises ValueError("Unavailable: Stream ended before generation
        // completed") for a stream cut short; ours is a Disconnected that is also a
        // ValueError, with the reference's text first.
        E::Disconnected(_) => compat::Disconnected::new_err(format!("Unavailable: {msg}")),
        E::ConnectionTimeout(_) => ConnectionTimeout::new_err(msg),
        E::ShuttingDown => Cancelled::new_err(msg),
        E::Remote(w) => wire_error(w),
        E::Io(e) => PyErr::from(e),
        _ => Unknown::new_err(msg),
    }
}

/// The Python exception a caller raises for an error frame. As the reference (observed on
/// 1.6.1), the message is `"{category}: {message}"` (`Internal: RuntimeError: boom`,
/// `InvalidRequest: ValueError: bad`, `Cancelled: ...`) and the exception is a
/// `ValueError`; when the worker's handler raised one of the runtime's typed classes, the
/// caller's exception is also an instance of that class (a subclass of both, so `except
/// ValueError` written for the reference and `except Cancelled` both catch it).
pub(crate) fn wire_error(w: dynamo_runtime::transport::WireError) -> PyErr {
    use dynamo_runtime::transport::ErrorKind as K;
    if w.kind == K::Unavailable {
        return CannotConnect::new_err(w.message);
    }
    let m = format!("{}: {}", wire_category(w.kind), w.message);
    match (w.kind, w.typed) {
        (K::Unknown, true) => compat::Unknown::new_err(m),
        (K::InvalidArgument, true) => compat::InvalidArgument::new_err(m),
        (K::CannotConnect, true) => compat::CannotConnect::new_err(m),
        (K::Disconnected, true) => compat::Disconnected::new_err(m),
        (K::ConnectionTimeout, true) => compat::ConnectionTimeout::new_err(m),
        (K::Cancelled, true) => compat::Cancelled::new_err(m),
        (K::EngineShutdown, true) => compat::EngineShutdown::new_err(m),
        (K::StreamIncomplete, true) => compat::StreamIncomplete::new_err(m),
        _ => PyValueError::new_err(m),
    }
}

/// The reference's name for an error category, as it prefixes caller-side messages.
fn wire_category(kind: dynamo_runtime::transport::ErrorKind) -> &'static str {
    use dynamo_runtime::transport::ErrorKind as K;
    match kind {
        K::InvalidArgument => "InvalidRequest",
        K::CannotConnect => "CannotConnect",
        K::Disconnected => "Disconnected",
        K::ConnectionTimeout => "ConnectionTimeout",
        K::Cancelled => "Cancelled",
        K::EngineShutdown => "EngineShutdown",
        K::StreamIncomplete => "StreamIncomplete",
        K::NotFound => "NotFound",
        K::Unavailable => "Unavailable",
        _ => "Internal",
    }
}

/// Classes that derive from one typed class and `ValueError` (`python/dynamo/_wire_errors.py`);
/// imported when first raised, so errors made on tokio threads stay lazy (no GIL there).
mod compat {
    pyo3::import_exception!(dynamo._wire_errors, Unknown);
    pyo3::import_exception!(dynamo._wire_errors, InvalidArgument);
    pyo3::import_exception!(dynamo._wire_errors, CannotConnect);
    pyo3::import_exception!(dynamo._wire_errors, Disconnected);
    pyo3::import_exception!(dynamo._wire_errors, ConnectionTimeout);
    pyo3::import_exception!(dynamo._wire_errors, Cancelled);
    pyo3::import_exception!(dynamo._wire_errors, EngineShutdown);
    pyo3::import_exception!(dynamo._wire_errors, StreamIncomplete);
}

/// Classify an exception raised by a handler (API_CONTRACT §3, "Python → runtime"; the
/// first matching rule wins).
pub(crate) fn handler_error(err: &Bound<'_, PyAny>) -> dynamo_runtime::transport::WireError {
    use dynamo_runtime::transport::{ErrorKind as K, WireError};
    use pyo3::exceptions as x;
    let py = err.py();
    let text = err.str().map(|s| s.to_string()).unwrap_or_default();
    let type_name = err
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let message = if text.is_empty() {
        type_name.clone()
    } else {
        text.clone()
    };
    // Untyped exceptions travel as "{type}: {text}", as the reference's
    // ("RuntimeError: boom"; the caller adds the category in front).
    let described = format!("{type_name}: {text}");
    let is = |t: Bound<'_, pyo3::types::PyType>| err.is_instance(&t).unwrap_or(false);
    let typed = [
        (py.get_type::<Unknown>(), K::Unknown),
        (py.get_type::<InvalidArgument>(), K::InvalidArgument),
        (py.get_type::<CannotConnect>(), K::CannotConnect),
        (py.get_type::<Disconnected>(), K::Disconnected),
        (py.get_type::<ConnectionTimeout>(), K::ConnectionTimeout),
        (py.get_type::<Cancelled>(), K::Cancelled),
        (py.get_type::<EngineShutdown>(), K::EngineShutdown),
        (py.get_type::<StreamIncomplete>(), K::StreamIncomplete),
    ];
    for (t, kind) in typed {
        if is(t) {
            return WireError::new(kind, message, true);
        }
    }
    if is(py.get_type::<DynamoException>()) {
        return WireError::new(K::Unknown, message, true);
    }
    for attr in ["code", "status"] {
        let code = err
            .getattr(attr)
            .ok()
            .filter(|c| !c.is_instance_of::<pyo3::types::PyBool>())
            .and_then(|c| c.extract::<i64>().ok());
        if let Some(code) = code {
            let detail = err
                .getattr("message")
                .ok()
                .and_then(|m| m.extract::<String>().ok())
                .unwrap_or(message);
            let json = serde_json::json!({"message": detail, "code": code}).to_string();
            let kind = if (400..500).contains(&code) {
                K::InvalidArgument
            } else {
                K::Unknown
            };
            return WireError::new(kind, json, false);
        }
    }
    if is(py.get_type::<x::PyGeneratorExit>()) {
        return WireError::new(K::EngineShutdown, "engine shutting down", true);
    }
    let cancelled = py
        .import("asyncio")
        .and_then(|m| m.getattr("CancelledError"))
        .ok()
        .is_some_and(|t| err.is_instance(&t).unwrap_or(false));
    if cancelled {
        return WireError::new(K::Cancelled, described, true);
    }
    let kind = if is(py.get_type::<x::PyValueError>()) || is(py.get_type::<x::PyTypeError>()) {
        K::InvalidArgument
    } else if is(py.get_type::<x::PyTimeoutError>()) {
        K::ConnectionTimeout
    } else if is(py.get_type::<x::PyConnectionRefusedError>()) {
        K::CannotConnect
    } else if is(py.get_type::<x::PyConnectionError>()) {
        K::Disconnected
    } else {
        K::Unknown
    };
    WireError::new(kind, described, false)
}
