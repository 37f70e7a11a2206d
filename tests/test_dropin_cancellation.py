"""Cancellation and stream errors as handlers and callers of the reference see them.

Observed black-box on ai-dynamo-runtime 1.6.1 (worker and caller in separate processes,
``file`` discovery, ``tcp`` request plane); each test's docstring records what it did. Run
here on both of our request planes (``tcp``, and ``nats`` with a real nats-server).
"""

from __future__ import annotations

import asyncio

import pytest
from runtime_util import Worker, collect, local_runtime, unique_ns

from dynamo._core import Cancelled, Context, Disconnected


@pytest.fixture(params=["tcp", "nats"])
def plane(request, monkeypatch) -> str:
    if request.param == "nats":
        monkeypatch.setenv("NATS_SERVER", request.getfixturevalue("nats_server").url)
    return request.param


async def _serve(rt, handler):
    ep = rt.endpoint(f"{unique_ns()}.backend.generate")
    rt.serve(ep, handler)
    client = await ep.client()
    await client.wait_for_instances()
    return client


async def test_stop_generating_lets_the_handler_see_is_stopped_and_finish(plane) -> None:
    """Item 5. Reference: after the caller's ``stop_generating()`` the handler's pending
    ``yield`` returns and ``context.is_stopped()`` is True, so a worker-guide loop
    (``if context.is_stopped(): break``) ends by itself and its ``finally`` runs; the caller
    gets only the items sent before the stop and its stream ends quietly. A handler that
    ignores ``is_stopped()`` and yields again is closed there (``GeneratorExit`` at that
    ``yield``), so it cannot run on unnoticed. ``async_killed_or_stopped()`` wakes on stop."""
    log: list[str] = []
    woke = asyncio.Event()
    async with local_runtime("mem", plane) as rt:

        async def guide(request, context):
            async def watch():
                await context.async_killed_or_stopped()
                woke.set()

            watcher = asyncio.ensure_future(watch())
            try:
                for i in range(1000):
                    yield {"i": i}
                    if context.is_stopped():
                        log.append(f"saw stop after {i}")
                        break
                    await asyncio.sleep(0.02)
                log.append("loop ended")
            except GeneratorExit:
                log.append("GeneratorExit")
                raise
            finally:
                log.append("finally")
                watcher.cancel()

        client = await _serve(rt, guide)
        ctx = Context()
        got = []
        async for item in await client.round_robin({}, annotated=False, context=ctx):
            got.append(item)
            if len(got) == 3:
                ctx.stop_generating()
        assert got == [{"i": 0}, {"i": 1}, {"i": 2}]
        await asyncio.wait_for(woke.wait(), 5)
        for _ in range(100):
            if "finally" in log:
                break
            await asyncio.sleep(0.02)
        assert log[0].startswith("saw stop after ") and log[1:] == ["loop ended", "finally"]

        ignored: list[str] = []

        async def ignores(request, context):
            try:
                for i in range(1000):
                    yield {"i": i, "stopped": context.is_stopped()}
                    await asyncio.sleep(0.02)
            except GeneratorExit:
                ignored.append(f"closed, stopped={context.is_stopped()}")
                raise

        client = await _serve(rt, ignores)
        ctx = Context()
        got = []
        async for item in await client.round_robin({}, annotated=False, context=ctx):
            got.append(item)
            if len(got) == 2:
                ctx.stop_generating()
        assert len(got) == 2
        for _ in range(100):
            if ignored:
                break
            await asyncio.sleep(0.02)
        assert ignored == ["closed, stopped=True"]


async def test_request_stopped_before_it_is_sent(plane) -> None:
    """Item 6. Reference: with a context stopped before ``round_robin(..., context=ctx)``
    (or between the call and its first ``await``), the handler is still called, sees
    ``is_stopped()`` True (at its first yield on the reference, whose stop travels after
    the request; ours carries it in the request, so from its first line), and the caller
    gets an empty stream that ends quietly (no exception)."""
    calls: list[bool] = []
    async with local_runtime("mem", plane) as rt:

        async def handler(request, context):
            calls.append(context.is_stopped())
            for i in range(50):
                yield {"i": i}
                if context.is_stopped():
                    break
                await asyncio.sleep(0.02)

        client = await _serve(rt, handler)
        ctx = Context()
        ctx.stop_generating()
        assert await collect(await client.round_robin({}, annotated=False, context=ctx)) == []
        assert calls == [True]

        ctx = Context()
        pending = client.round_robin({}, annotated=False, context=ctx)
        ctx.stop_generating()
        assert await collect(await pending) == []
        for _ in range(100):
            if len(calls) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(calls) == 2


async def test_caller_error_texts_and_classes(plane, tmp_path, monkeypatch) -> None:
    """Item 7. Reference texts, all raised as ``ValueError``: a handler's RuntimeError →
    ``"Internal: RuntimeError: boom in handler"``; a ValueError → ``"InvalidRequest:
    ValueError: bad value"``; ``asyncio.CancelledError`` → ``"Cancelled: CancelledError: "``;
    the runtime's ``Cancelled("typed cancel")`` → ``"Cancelled: typed cancel"``; a worker
    killed mid-stream → ``"Unavailable: Stream ended before generation completed"`` after
    the items already sent. Ours raises the same texts; where the reference's class is
    ValueError and ours a typed class (Cancelled, Disconnected), the exception is both."""
    async with local_runtime("mem", plane) as rt:

        async def handler(request):
            yield 1
            kind = request["raise"]
            if kind == "runtime":
                raise RuntimeError("boom in handler")
            if kind == "value":
                raise ValueError("bad value")
            if kind == "cancelled":
                raise asyncio.CancelledError()
            raise Cancelled("typed cancel")

        client = await _serve(rt, handler)

        async def error_of(kind):
            stream = await client.round_robin({"raise": kind}, annotated=False)
            assert await stream.__anext__() == 1
            with pytest.raises(ValueError) as info:
                await stream.__anext__()
            return info.value

        e = await error_of("runtime")
        assert (type(e), str(e)) == (ValueError, "Internal: RuntimeError: boom in handler")
        e = await error_of("value")
        assert (type(e), str(e)) == (ValueError, "InvalidRequest: ValueError: bad value")
        e = await error_of("cancelled")
        assert isinstance(e, Cancelled) and str(e) == "Cancelled: CancelledError: "
        assert type(e).__name__ == "Cancelled"
        e = await error_of("typed")
        assert isinstance(e, Cancelled) and str(e) == "Cancelled: typed cancel"

    # A worker killed mid-stream (a separate process).
    kv = tmp_path / "kv"
    monkeypatch.setenv("DYN_FILE_KV", str(kv))
    ns = unique_ns()
    worker = Worker(kv, ns, DYN_REQUEST_PLANE=plane, DYN_DISCOVERY_BACKEND="file")
    try:
        async with local_runtime("file", plane) as rt:
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await client.wait_for_instances()
            stream = await client.round_robin({"n": 10_000, "delay": 0.01}, annotated=False)
            assert (await stream.__anext__())["i"] == 0
            worker.kill()
            with pytest.raises(ValueError) as info:
                await asyncio.wait_for(collect(stream), 5)
            assert isinstance(info.value, Disconnected)
            assert str(info.value).startswith(
                "Unavailable: Stream ended before generation completed"
            )
    finally:
        worker.kill()
