# Event-loop side of the handler bridge (loaded by crates/dynamo-py/src/engine.rs).
#
# Why Python here: each served endpoint runs one "pump" task on the worker's event loop.
# The pump receives requests from the Rust request plane in batches and starts one task
# per request that drives the handler's async generator to completion, pushing every item
# into the Rust response sink with a plain (synchronous) call. A request therefore costs one
# event-loop wake-up, not one per item, which is what makes small streams cheap; the GIL is
# only taken on the loop thread, never by tokio worker threads waiting on Python.
import asyncio
import inspect

_READY = 0
_STOPPED = 1
_WAIT = 2
_FLUSH = 3
_FAILED = 4
_KILLED = 5


def accepts_context(handler):
    """Whether the handler declares a parameter named ``context``."""
    try:
        return "context" in inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False


def accepts_sender(handler):
    """Whether the handler declares a ``response_sender`` parameter (push mode)."""
    try:
        return "response_sender" in inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False


def start_pump(loop, inbox, handler, pass_context):
    """Start the endpoint's pump task on ``loop`` (called on the loop thread)."""
    return loop.create_task(_pump(loop, inbox, handler, pass_context, accepts_sender(handler)))


class _StopIfDropped:
    """Cancels the serving future when the coroutine holding it is dropped unfinished.

    A task cancelled before its first step never runs its coroutine, so ``await serving``
    below is never reached and cancelling it would not stop the endpoint; the coroutine's
    frame (and this guard) is released instead, and the guard cancels ``serving`` then.
    """

    __slots__ = ("serving",)

    def __init__(self, serving):
        self.serving = serving

    def __del__(self):
        serving = self.serving
        try:
            if not serving.done():
                # The last reference may go on another thread: cancel on the loop's own.
                serving.get_loop().call_soon_threadsafe(serving.cancel)
        except Exception:  # noqa: BLE001, S110 - the loop is closed: nothing serves any more
            pass


async def serve(serving, pump, _guard=None):
    """Await the Rust serving future, then the pump (which ends once serving stopped).

    Returning only after the pump has finished means no request-plane callback is pending
    on the loop when ``serve_endpoint`` returns, so a process can exit right after it.
    Cancelling stops this endpoint gracefully in the background (the pump ends with it).
    """
    await serving
    try:
        await asyncio.wait_for(asyncio.shield(pump), 5)
    except BaseException:  # noqa: BLE001 - the pump is best-effort at this point
        pump.cancel()


def _open(handler, request, context, pass_context, sink, what):
    """Call ``handler`` for one request and return its async iterator; on any failure end
    the request's stream with the error instead and return None."""
    try:
        gen = handler(request, context=context) if pass_context else handler(request)
        if not hasattr(gen, "__anext__"):
            raise TypeError(
                f"the {what} must be an async generator function "
                f"(returning an async iterator), got {type(gen).__name__}"
            )
    except BaseException as e:  # noqa: BLE001 - every failure ends the stream
        sink.fail(e)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    return gen


async def _pump(loop, inbox, handler, pass_context, push):
    tasks = set()
    while True:
        batch = await inbox.next()
        if batch is None:
            return
        for request, sink, context in batch:
            if push:
                sender = ResponseSender(sink, loop)
                task = _open_push(handler, request, context, pass_context, sink, sender)
                if task is None:
                    continue
                task = loop.create_task(task)
            else:
                gen = _open(handler, request, context, pass_context, sink, "endpoint handler")
                if gen is None:
                    continue
                task = loop.create_task(_drive(gen, sink, loop.call_soon))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            # Queued after the task's first step: the acknowledgement leaves with whatever
            # the handler produced before it first suspended, in one write.
            if sink.accept():
                loop.call_soon(sink.flush)


async def _drive(gen, sink, call_soon):
    # After the caller stops the stream (STOP), the handler is resumed once more: its
    # `yield` returns, so a handler written as in the worker guide (`if
    # context.is_stopped(): break`) ends its own loop and cleans up. An item yielded after
    # that is not sent, and the generator is closed there (GeneratorExit at that `yield`),
    # as the reference does: a handler ignoring is_stopped() runs at most to its next
    # yield. A kill (KILL, or the caller's connection lost) closes it at once.
    stopped = False
    close = False
    try:
        async for item in gen:
            if stopped:
                close = True
                break
            status = sink.send(item)
            if status == _READY:
                continue
            if status == _FLUSH:
                call_soon(sink.flush)
                continue
            if status == _WAIT:
                # A stop while waiting shows at the next send.
                await sink.credit()
                continue
            if status == _STOPPED:
                stopped = True
                continue
            # _FAILED (the item could not be serialised; the stream already ended with
            # that error) or _KILLED.
            close = True
            break
    except BaseException as e:  # noqa: BLE001 - mapped to a typed stream error
        sink.fail(e)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return
    if close:
        # Close the generator so its `finally` blocks run.
        try:
            await gen.aclose()
        except BaseException:  # noqa: BLE001, S110 - the stream is over either way
            pass
    sink.finish()


class ResponseSender:
    """Push egress: handed to a handler that declares ``response_sender`` (as in the
    reference), which pushes its items with ``send`` instead of yielding them and ends the
    stream with ``close`` (or by returning). Items go through the same sink as yielded
    ones, so they travel with the same codec and types.

    ``send`` never blocks the event loop: beyond the stream's credit window items are
    buffered rather than waited for. It may be called from another thread (as the
    reference allows). After the caller stopped the stream, or once the stream failed,
    items are dropped (check ``context.is_stopped()`` to end early).
    """

    __slots__ = ("_sink", "_loop", "_closed")

    def __init__(self, sink, loop):
        self._sink = sink
        self._loop = loop
        self._closed = False

    def send(self, item):
        """Send one response item."""
        if self._closed:
            raise RuntimeError("send on a closed response_sender")
        if self._sink.send(item) == _FLUSH:
            if asyncio._get_running_loop() is self._loop:
                self._loop.call_soon(self._sink.flush)
            else:
                self._loop.call_soon_threadsafe(self._sink.flush)

    def close(self):
        """End the response stream successfully."""
        if not self._closed:
            self._closed = True
            self._sink.finish()


_YIELDED_IN_PUSH = (
    "critical error: push-mode handler yielded a response instead of pushing it to its "
    "response_sender"
)


def _open_push(handler, request, context, pass_context, sink, sender):
    """Call a push-mode handler; return the coroutine that runs it, or None on failure."""
    try:
        kwargs = {"response_sender": sender}
        if pass_context:
            kwargs["context"] = context
        run = handler(request, **kwargs)
        if not hasattr(run, "__anext__") and not inspect.isawaitable(run):
            raise TypeError(
                "a push-mode handler must be an async function or async generator "
                f"function, got {type(run).__name__}"
            )
    except BaseException as e:  # noqa: BLE001 - every failure ends the stream
        sink.fail(e)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    return _drive_push(run, sink, sender)


async def _drive_push(run, sink, sender):
    try:
        if hasattr(run, "__anext__"):
            async for _ in run:
                await run.aclose()
                raise RuntimeError(_YIELDED_IN_PUSH)
        else:
            await run
    except BaseException as e:  # noqa: BLE001 - mapped to a typed stream error
        sink.fail(e)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return
    sender.close()


def start_feed(loop, source, feeder):
    """Forward an async iterable of request items to the request plane."""
    return loop.create_task(_feed(source, feeder))


async def _feed(source, feeder):
    try:
        async for item in source:
            if not feeder.send(item):
                return
    except asyncio.CancelledError:
        feeder.close()
        raise
    except BaseException as e:  # noqa: BLE001 - the request stream just ends
        feeder.close()
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return
    feeder.close()



# In-process engines (PythonAsyncEngine / HttpAsyncEngine, crates/dynamo-py/src/llm_static.rs):
# the same pump and driver, fed by the HTTP frontend instead of the request plane, plus a
# watcher per request that cancels the driving task when the client goes away, so a
# generator suspended in an ``await`` is cancelled at once rather than at its next yield.
_LOCAL_PUMPS = set()


def start_local_pump(loop, inbox, handler, pass_context):
    """Start an in-process engine's pump on ``loop`` (from any thread)."""
    loop.call_soon_threadsafe(_start_local_pump, loop, inbox, handler, pass_context)


def _start_local_pump(loop, inbox, handler, pass_context):
    task = loop.create_task(_local_pump(loop, inbox, handler, pass_context))
    _LOCAL_PUMPS.add(task)
    task.add_done_callback(_LOCAL_PUMPS.discard)


async def _local_pump(loop, inbox, handler, pass_context):
    tasks = set()
    while True:
        batch = await inbox.next()
        if batch is None:
            return
        for request, sink, context in batch:
            gen = _open(handler, request, context, pass_context, sink, "engine generator")
            if gen is None:
                continue
            task = loop.create_task(_drive(gen, sink, loop.call_soon))
            watcher = loop.create_task(_cancel_when_stopped(context, task))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(lambda _t, w=watcher: w.cancel())


async def _cancel_when_stopped(context, task):
    await context.async_killed_or_stopped()
    task.cancel()
