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
//!
//! [`py_future_local`] goes one step further for the short waits of the request plane (the
//! next request of a served endpoint, the next response item, a call's acknowledgement):
//! the Rust future is not spawned on tokio but polled on the loop thread itself, first
//! inline, then whenever it is woken, and its waker queues it in the same completion
//! queue. A value that is already there costs no thread hop at all, and one that arrives
//! later wakes the loop straight from the tokio thread that produced it (a spawned task
//! would first wake a tokio worker from the loop thread, then be woken itself by the
//! producer, then wake the loop).

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

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

/// What the loop's reader callback finds in the queue.
enum Entry {
    /// A finished tokio task's output.
    Done(Completion),
    /// A loop-polled future that was woken: poll it again.
    Poll(Arc<LocalTask>),
}

/// The completion queue of one event loop.
pub(crate) struct Waker {
    queue: Mutex<Vec<Entry>>,
    signalled: AtomicBool,
    tx: UnixStream,
    rx: UnixStream,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resolve `future` with `deliver`'s value on the loop; a future already done (cancelled)
/// is left alone and the value dropped unconverted.
fn resolve(py: Python<'_>, future: &Bound<'_, PyAny>, deliver: Deliver) -> PyResult<()> {
    if future
        .call_method0(pyo3::intern!(py, "done"))?
        .is_truthy()?
    {
        return Ok(());
    }
    match deliver(py) {
        Ok(v) => future.call_method1(pyo3::intern!(py, "set_result"), (v,))?,
        Err(e) => future.call_method1(pyo3::intern!(py, "set_exception"), (e.into_value(py),))?,
    };
    Ok(())
}

impl Waker {
    fn push(&self, c: Entry) {
        lock(&self.queue).push(c);
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
        let batch = std::mem::take(&mut *lock(&self.waker.queue));
        // Every entry is handled even if one fails (a dropped entry would leave its
        // awaiter waiting forever); the first error is reported.
        let mut first_err = None;
        for entry in batch {
            let done = match entry {
                Entry::Done(Completion { future, deliver }) => {
                    resolve(py, future.bind(py), deliver)
                }
                Entry::Poll(task) => task.run(py),
            };
            if let Err(e) = done {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
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

/// The running loop's waker and a new asyncio future of that loop.
fn loop_future(py: Python<'_>) -> PyResult<(Arc<Waker>, Bound<'_, PyAny>)> {
    let event_loop = registry(py)?.get_running_loop.bind(py).call0()?;
    let waker = waker(py, &event_loop)?;
    let py_future = event_loop.call_method0(pyo3::intern!(py, "create_future"))?;
    Ok((waker, py_future))
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
    let (waker, py_future) = loop_future(py)?;
    let target = py_future.clone().unbind();
    let rt = dynamo_runtime::tokio_runtime().map_err(runtime_error)?;
    let task = rt.spawn(async move {
        let out = fut.await;
        waker.push(Entry::Done(Completion {
            future: target,
            deliver: Box::new(move |py| convert(py, out)),
        }));
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

/// A Rust future polled on its event loop's thread (see [`py_future_local`]).
type LocalFuture = Pin<Box<dyn Future<Output = Deliver> + Send>>;

struct LocalTask {
    waker: Arc<Waker>,
    /// Queued for a poll (or being polled for the first time).
    queued: AtomicBool,
    /// The future and the asyncio future it resolves; empty once done or dropped.
    slot: Mutex<Option<(LocalFuture, Py<PyAny>)>>,
}

impl std::task::Wake for LocalTask {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.waker.push(Entry::Poll(Arc::clone(self)));
        }
    }
}

impl LocalTask {
    /// Poll once (on the loop thread); resolve the asyncio future when ready.
    fn run(self: &Arc<Self>, py: Python<'_>) -> PyResult<()> {
        self.queued.store(false, Ordering::Release);
        let mut slot = lock(&self.slot);
        let Some((fut, _)) = slot.as_mut() else {
            return Ok(());
        };
        let waker = std::task::Waker::from(Arc::clone(self));
        let mut cx = std::task::Context::from_waker(&waker);
        let polled = {
            // Timers, sockets and spawns inside the future need the runtime's context.
            let _rt = dynamo_runtime::tokio_runtime()
                .map_err(runtime_error)?
                .enter();
            fut.as_mut().poll(&mut cx)
        };
        let Poll::Ready(deliver) = polled else {
            return Ok(());
        };
        let Some((_, target)) = slot.take() else {
            return Ok(());
        };
        drop(slot);
        resolve(py, target.bind(py), deliver)
    }
}

/// Drops a loop-polled future when its asyncio future is cancelled.
#[pyclass(module = "dynamo._core")]
struct DropOnCancel {
    task: Arc<LocalTask>,
}

#[pymethods]
impl DropOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            let dropped = lock(&self.task.slot).take();
            drop(dropped);
        }
        Ok(())
    }
}

/// Like [`py_future_with`], but `fut` is polled on the running loop's thread instead of
/// being spawned on tokio: once before this returns (a value already available resolves
/// the asyncio future at once, and whatever the future sends on the way, such as a
/// request, leaves now), then each time it is woken. For futures that only wait (on a
/// channel, a socket, a timer) and do little work per poll: the loop is busy while they
/// run. With `cancellable`, cancelling the asyncio future drops `fut`; otherwise it is
/// polled to its end and the output dropped.
pub(crate) fn py_future_local<'py, F, T, C>(
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
    let (waker, py_future) = loop_future(py)?;
    let fut: LocalFuture = Box::pin(async move {
        let out = fut.await;
        Box::new(move |py: Python<'_>| convert(py, out)) as Deliver
    });
    let task = Arc::new(LocalTask {
        waker,
        queued: AtomicBool::new(true),
        slot: Mutex::new(Some((fut, py_future.clone().unbind()))),
    });
    task.run(py)?;
    if cancellable && lock(&task.slot).is_some() {
        let cb = Bound::new(py, DropOnCancel { task })?;
        py_future.call_method1("add_done_callback", (cb,))?;
    }
    Ok(py_future)
}

/// An awaitable of `fut` on the running loop (cancelling it aborts `fut`).
pub(crate) fn py_async<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    py_future(py, fut, true)
}
