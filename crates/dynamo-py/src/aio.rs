//! Rust futures as asyncio futures, completed without touching Python from tokio threads.
//!
//! Each event loop gets a [`Waker`]: a socket pair whose read end the loop watches
//! (`loop.add_reader`) and a queue of completions. A tokio task that finishes pushes its
//! result (still a Rust value) into the queue and writes one byte, which needs no GIL;
//! the loop's reader callback then converts the values and resolves the asyncio futures
//! on the loop thread.
//!
//! Why not `pyo3_async_runtimes::tokio::future_into_py` (still initialised with the
//! runtime's tokio runtime for other users): it takes the GIL on a tokio thread to call
//! `call_soon_threadsafe`, which (a) contends with the loop thread for the GIL on every
//! completion and (b) can run while the interpreter finalizes when a process exits right
//! after its last await, which aborts the process. Here no tokio thread ever takes the GIL.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors::runtime_error;

/// Converts a finished future's output into the asyncio future's result, on the loop.
type Deliver = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Completion {
    future: Py<PyAny>,
    deliver: Deliver,
}

/// The completion queue of one event loop.
pub(crate) struct Waker {
    queue: Mutex<Vec<Completion>>,
    signalled: AtomicBool,
    tx: UnixStream,
    rx: UnixStream,
}

impl Waker {
    fn push(&self, c: Completion) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // A full socket buffer means a wake-up is already pending; a closed loop means
            // nobody waits any more. Either way there is nothing else to do.
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// The loop's reader callback: resolves every queued future.
#[pyclass(module = "dynamo._core")]
struct Drain {
    waker: Arc<Waker>,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let mut buf = [0u8; 256];
        while matches!((&self.waker.rx).read(&mut buf), Ok(n) if n > 0) {}
        self.waker.signalled.store(false, Ordering::Release);
        let batch =
            std::mem::take(&mut *self.waker.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for Completion { future, deliver } in batch {
            let future = future.bind(py);
            if future
                .call_method0(pyo3::intern!(py, "done"))?
                .is_truthy()?
            {
                continue;
            }
            match deliver(py) {
                Ok(v) => future.call_method1(pyo3::intern!(py, "set_result"), (v,))?,
                Err(e) => {
                    future.call_method1(pyo3::intern!(py, "set_exception"), (e.into_value(py),))?
                }
            };
        }
        Ok(())
    }
}

/// An event loop (kept alive) and its waker.
type LoopWaker = (Py<PyAny>, Arc<Waker>);

struct Registry {
    get_running_loop: Py<PyAny>,
    /// Loop → waker. The entry keeps the loop alive, so its address is not reused; wakers
    /// of closed loops are dropped when a new loop registers.
    wakers: Mutex<HashMap<usize, LoopWaker>>,
}

static REGISTRY: PyOnceLock<Registry> = PyOnceLock::new();

fn registry(py: Python<'_>) -> PyResult<&Registry> {
    REGISTRY.get_or_try_init(py, || {
        Ok::<_, PyErr>(Registry {
            get_running_loop: py.import("asyncio")?.getattr("get_running_loop")?.unbind(),
            wakers: Mutex::new(HashMap::new()),
        })
    })
}

fn waker(py: Python<'_>, event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<Waker>> {
    let reg = registry(py)?;
    let key = event_loop.as_ptr() as usize;
    let mut wakers = reg.wakers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, w)) = wakers.get(&key) {
        return Ok(Arc::clone(w));
    }
    wakers.retain(|_, (l, _)| {
        !l.bind(py)
            .call_method0("is_closed")
            .and_then(|c| c.is_truthy())
            .unwrap_or(true)
    });
    let (tx, rx) = UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    let w = Arc::new(Waker {
        queue: Mutex::new(Vec::new()),
        signalled: AtomicBool::new(false),
        tx,
        rx,
    });
    let drain = Bound::new(
        py,
        Drain {
            waker: Arc::clone(&w),
        },
    )?;
    event_loop.call_method1("add_reader", (w.rx.as_raw_fd(), drain))?;
    wakers.insert(key, (event_loop.clone().unbind(), Arc::clone(&w)));
    Ok(w)
}

/// Cancels the Rust task when its asyncio future is cancelled.
#[pyclass(module = "dynamo._core")]
struct AbortOnCancel {
    handle: tokio::task::AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            self.handle.abort();
        }
        Ok(())
    }
}

/// Run `fut` on tokio; the returned asyncio future (of the running loop) resolves with
/// `convert(output)`, computed on the loop thread. With `cancellable`, cancelling the
/// asyncio future aborts the Rust future; otherwise the output is dropped.
pub(crate) fn py_future_with<'py, F, T, C>(
    py: Python<'py>,
    fut: F,
    convert: C,
    cancellable: bool,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let reg = registry(py)?;
    let event_loop = reg.get_running_loop.bind(py).call0()?;
    let waker = waker(py, &event_loop)?;
    let py_future = event_loop.call_method0(pyo3::intern!(py, "create_future"))?;
    let target = py_future.clone().unbind();
    let rt = dynamo_runtime::tokio_runtime().map_err(runtime_error)?;
    let task = rt.spawn(async move {
        let out = fut.await;
        waker.push(Completion {
            future: target,
            deliver: Box::new(move |py| convert(py, out)),
        });
    });
    if cancellable {
        let cb = Bound::new(
            py,
            AbortOnCancel {
                handle: task.abort_handle(),
            },
        )?;
        py_future.call_method1("add_done_callback", (cb,))?;
    }
    Ok(py_future)
}

/// [`py_future_with`] for a future whose output converts to Python by itself.
pub(crate) fn py_future<'py, F, T>(
    py: Python<'py>,
    fut: F,
    cancellable: bool,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    py_future_with(
        py,
        fut,
        |py, out| out.and_then(|v| v.into_py_any(py)),
        cancellable,
    )
}
