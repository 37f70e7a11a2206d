"""Runtime behaviour within one process (discovery ``mem``, request plane ``tcp``)."""

from __future__ import annotations

import asyncio

import pytest
from runtime_util import collect, local_runtime, unique_ns, wait_until

from dynamo._core import (
    CannotConnect,
    Context,
    DistributedRuntime,
    EngineShutdown,
    Instance,
    InvalidArgument,
    StreamIncomplete,
    TransportType,
)


async def counting(request):
    for i in range(request["n"]):
        yield {"i": i}


async def test_serve_and_stream_annotated_and_raw() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"dyn://{unique_ns()}.backend.generate")
        rt.serve(ep, counting)
        client = await ep.client()
        ids = await asyncio.wait_for(client.wait_for_instances(), 5)
        assert ids == [ep.connection_id()]

        items = await collect(await client.round_robin({"n": 4}))
        assert [a.data() for a in items] == [{"i": i} for i in range(4)]
        assert all(a.event() is None and not a.is_error() for a in items)
        assert "Annotated" in repr(items[0])

        raw = await collect(await client.generate({"n": 2}, annotated=False))
        assert raw == [{"i": 0}, {"i": 1}]
        raw = await collect(await client.random({"n": 1}, annotated=None))
        assert raw == [{"i": 0}]
        raw = await collect(await client.direct({"n": 0}, ids[0], annotated=False))
        assert raw == []


async def test_instances_and_transport() -> None:
    async with local_runtime() as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.backend.generate")
        rt.serve(ep, counting)
        client = await ep.client()
        await client.wait_for_instances()
        [inst] = client.instances()
        assert isinstance(inst, Instance)
        assert (inst.namespace, inst.component, inst.endpoint) == (ns, "backend", "generate")
        assert inst.instance_id == ep.connection_id()
        assert inst.device_type is None
        assert str(inst) == f"{ns}/backend/generate/{inst.instance_id}"
        assert repr(inst) == f"Instance({inst})"
        t = inst.transport
        assert isinstance(t, TransportType)
        assert t.kind == "tcp"
        assert t.address.startswith("127.0.0.1:") and t.address.endswith(f"/{ns}/backend/generate")
        assert repr(t).startswith("TransportType(kind='tcp'")
        assert client.instances()[0] == inst and hash(client.instances()[0]) == hash(inst)


async def test_handler_with_and_without_context_and_yielded_annotations() -> None:
    async with local_runtime() as rt:
        ns = unique_ns()
        seen: dict = {}

        async def with_ctx(request, context):
            seen["id"] = context.id()
            seen["meta"] = context.metadata.copy()
            yield {"ctx": context.id()}

        async def annotated(request):
            yield {
                "_dynamo_annotated": True,
                "data": 1,
                "event": "note",
                "comment": ["c1"],
                "id": "x",
            }
            yield 2

        a = rt.endpoint(f"{ns}.a.generate")
        b = rt.endpoint(f"{ns}.b.generate")
        rt.serve(a, with_ctx)
        rt.serve(b, annotated)
        ca, cb = await a.client(), await b.client()
        await ca.wait_for_instances()
        await cb.wait_for_instances()

        caller = Context(id="req-123", metadata={"tenant": "t1"})
        items = await collect(await ca.round_robin({}, annotated=False, context=caller))
        assert items == [{"ctx": "req-123"}]
        assert seen == {"id": "req-123", "meta": {"tenant": "t1"}}

        first, second = await collect(await cb.round_robin(None))
        assert (first.data(), first.event(), first.comments(), first.id()) == (
            1,
            "note",
            ["c1"],
            "x",
        )
        assert second.data() == 2


async def test_stop_generating_reaches_the_handler() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        stopped = asyncio.Event()
        closed = asyncio.Event()

        async def endless(request, context):
            try:
                i = 0
                while True:
                    if context.is_stopped():
                        stopped.set()
                        return
                    yield i
                    i += 1
                    await asyncio.sleep(0.005)
            finally:
                closed.set()

        rt.serve(ep, endless)
        client = await ep.client()
        await client.wait_for_instances()
        ctx = Context()
        stream = await client.round_robin({}, annotated=False, context=ctx)
        assert await stream.__anext__() == 0
        ctx.stop_generating()
        # The handler observes the stop within 100 ms, and the caller's stream ends
        # without an error.
        await asyncio.wait_for(stopped.wait(), 0.1)
        await asyncio.wait_for(closed.wait(), 2)
        rest = await asyncio.wait_for(collect(stream), 2)
        assert len(rest) < 1000


async def test_dropping_the_stream_closes_the_generator() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        closed = asyncio.Event()
        killed_or_stopped = asyncio.Event()

        async def endless(request, context):
            async def watch():
                assert await context.async_killed_or_stopped() is True
                killed_or_stopped.set()

            watcher = asyncio.ensure_future(watch())
            try:
                while True:
                    yield "tick"
                    await asyncio.sleep(0.005)
            finally:
                closed.set()
                await asyncio.wait_for(watcher, 2)

        rt.serve(ep, endless)
        client = await ep.client()
        await client.wait_for_instances()
        stream = await client.round_robin({}, annotated=False)
        assert await stream.__anext__() == "tick"
        del stream
        await asyncio.wait_for(killed_or_stopped.wait(), 2)
        await asyncio.wait_for(closed.wait(), 2)


async def test_handler_errors_map_to_python_exceptions_and_worker_keeps_serving() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        class HttpLike(Exception):
            def __init__(self, code, message):
                super().__init__(message)
                self.code = code
                self.message = message

        async def failing(request):
            yield "first"
            kind = request["raise"]
            if kind == "value":
                raise ValueError("bad prompt")
            if kind == "key":
                raise KeyError("missing")
            if kind == "shutdown":
                raise EngineShutdown("draining, migrate")
            if kind == "invalid":
                raise InvalidArgument("too long")
            if kind == "http":
                raise HttpLike(404, "no such model")
            if kind == "ok":
                yield "second"

        rt.serve(ep, failing)
        client = await ep.client()
        await client.wait_for_instances()

        async def run(kind):
            stream = await client.round_robin({"raise": kind}, annotated=False)
            assert await stream.__anext__() == "first"
            return await collect(stream)

        with pytest.raises(ValueError, match="bad prompt"):
            await run("value")
        with pytest.raises(ValueError, match="missing"):
            await run("key")
        with pytest.raises(EngineShutdown, match="draining, migrate"):
            await run("shutdown")
        with pytest.raises(InvalidArgument, match="too long"):
            await run("invalid")
        with pytest.raises(ValueError, match='"code":404'):
            await run("http")
        assert await run("ok") == ["second"]


async def test_non_generator_handler_and_bad_items_fail_the_stream() -> None:
    async with local_runtime() as rt:
        ns = unique_ns()

        def not_a_generator(request):
            return 42

        async def bad_item(request):
            yield object()

        async def returns_early(request):
            if False:
                yield None

        a = rt.endpoint(f"{ns}.a.generate")
        b = rt.endpoint(f"{ns}.b.generate")
        c = rt.endpoint(f"{ns}.c.generate")
        rt.serve(a, not_a_generator)
        rt.serve(b, bad_item)
        rt.serve(c, returns_early)
        ca, cb, cc = [await e.client() for e in (a, b, c)]
        for client in (ca, cb, cc):
            await client.wait_for_instances()
        with pytest.raises(ValueError, match="async generator"):
            await ca.round_robin({})
        with pytest.raises(ValueError, match="failed serializing Python response"):
            await collect(await cb.round_robin({}))
        assert await collect(await cc.round_robin({})) == []


async def test_oversized_messages_are_rejected_and_worker_stays_healthy(monkeypatch) -> None:
    monkeypatch.setenv("DYN_TCP_MAX_MESSAGE_SIZE", "4096")
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def echo(request):
            yield request

        rt.serve(ep, echo)
        client = await ep.client()
        await client.wait_for_instances()
        with pytest.raises(ValueError, match="maximum message size"):
            await client.round_robin("x" * 10_000)
        # A response item over the limit ends that stream with an error, nothing else.
        big_reply = rt.endpoint(f"{unique_ns()}.big.generate")

        async def big(request):
            yield "y" * 10_000

        rt.serve(big_reply, big)
        cbig = await big_reply.client()
        await cbig.wait_for_instances()
        with pytest.raises(ValueError, match="maximum message size"):
            await collect(await cbig.round_robin({}))
        assert await collect(await client.round_robin("small", annotated=False)) == ["small"]


async def test_bidirectional_streaming() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.chat.stream")

        async def upper(request_stream, context):
            count = 0
            async for item in request_stream:
                count += 1
                yield item.upper()
            yield {"count": count, "ctx": context.id()}

        rt.serve_bidi(ep, upper)
        client = await ep.client()
        await client.wait_for_instances()

        async def words():
            for w in ("a", "b", "c"):
                yield w
                await asyncio.sleep(0.001)

        out = await collect(
            await client.round_robin(words(), annotated=False, context=Context(id="bidi"))
        )
        assert out == ["A", "B", "C", {"count": 3, "ctx": "bidi"}]


async def test_direct_to_unknown_instance_and_no_instances() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        client = await ep.client()
        assert client.instance_ids() == []
        with pytest.raises(CannotConnect, match="no instances"):
            await client.round_robin({})
        rt.serve(ep, counting)
        await asyncio.wait_for(client.wait_for_instances(), 5)
        # The id as the caller wrote it (decimal, as instance_ids() lists them), as in the
        # reference's "instance_id=12345 not found for endpoint ...".
        with pytest.raises(ValueError, match="instance_id=12345 not found"):
            await client.direct({"n": 1}, 12345)


async def test_sleep_and_wake() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        rt.serve(ep, counting)
        client = await ep.client()
        await client.wait_for_instances()
        await ep.unregister_endpoint_instance()
        await wait_until(lambda: client.instance_ids() == [])
        await ep.register_endpoint_instance()
        await wait_until(lambda: client.instance_ids() == [ep.connection_id()])
        assert await collect(await client.round_robin({"n": 1}, annotated=False)) == [{"i": 0}]


async def test_graceful_shutdown_drains_in_flight_streams() -> None:
    ns = unique_ns()
    async with local_runtime() as caller:
        worker = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
        ep = worker.endpoint(f"{ns}.backend.generate")

        async def slow(request):
            for i in range(5):
                await asyncio.sleep(0.05)
                yield i

        served = asyncio.ensure_future(ep.serve_endpoint(slow))
        client = await caller.endpoint(f"{ns}.backend.generate").client()
        await client.wait_for_instances()
        stream = await client.round_robin({}, annotated=False)
        assert await stream.__anext__() == 0
        worker.shutdown()
        # The stream in flight completes; the instance leaves discovery; serving ends.
        assert await asyncio.wait_for(collect(stream), 5) == [1, 2, 3, 4]
        await asyncio.wait_for(served, 5)
        await wait_until(lambda: client.instance_ids() == [])
        with pytest.raises(CannotConnect):
            await client.round_robin({})


async def test_cancelling_serve_endpoint_stops_only_that_endpoint() -> None:
    async with local_runtime() as rt:
        ns = unique_ns()
        a, b = rt.endpoint(f"{ns}.a.generate"), rt.endpoint(f"{ns}.b.generate")
        task_a = rt.serve(a, counting)
        rt.serve(b, counting)
        ca, cb = await a.client(), await b.client()
        await ca.wait_for_instances()
        await cb.wait_for_instances()
        task_a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task_a
        await wait_until(lambda: ca.instance_ids() == [])
        assert await collect(await cb.round_robin({"n": 2}, annotated=False)) == [
            {"i": 0},
            {"i": 1},
        ]


async def test_cancelling_serve_endpoint_at_once_still_stops_it() -> None:
    # Cancelled right after its first step, the serving future may be aborted before
    # tokio ever polled it; the endpoint must leave discovery all the same (CI once saw
    # it stay). Repeated because the window is a race; each round fails for good (the
    # instance stays forever) when the stop is lost.
    async with local_runtime() as rt:
        ns = unique_ns()
        for i in range(20):
            ep = rt.endpoint(f"{ns}.c{i}.generate")
            client = await ep.client()
            task = asyncio.ensure_future(ep.serve_endpoint(counting))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            await wait_until(lambda c=client: c.instance_ids() == [])


async def test_a_serve_task_cancelled_before_it_starts_stops_the_endpoint() -> None:
    # Serving starts when serve_endpoint() is called, as in the reference; a task
    # cancelled before its first step never runs the coroutine, and a coroutine closed
    # unstarted is the same case. Both must stop the endpoint, not leave it serving.
    async with local_runtime() as rt:
        ns = unique_ns()
        a, b = rt.endpoint(f"{ns}.a.generate"), rt.endpoint(f"{ns}.b.generate")
        ca, cb = await a.client(), await b.client()
        coro_a = a.serve_endpoint(counting)
        coro_b = b.serve_endpoint(counting)
        await ca.wait_for_instances()
        await cb.wait_for_instances()
        task = asyncio.ensure_future(coro_a)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: ca.instance_ids() == [])
        coro_b.close()
        await wait_until(lambda: cb.instance_ids() == [])


async def test_streams_ended_by_a_dead_handler_are_incomplete() -> None:
    # A sink dropped without a final frame (the pump could not run the handler to the
    # end) ends the stream with the typed StreamIncomplete; modelled here by a generator
    # whose task is cancelled.
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def cancels(request):
            yield 1
            raise asyncio.CancelledError()

        rt.serve(ep, cancels)
        client = await ep.client()
        await client.wait_for_instances()
        stream = await client.round_robin({}, annotated=False)
        assert await stream.__anext__() == 1
        with pytest.raises(Exception) as info:
            await stream.__anext__()
        assert type(info.value).__name__ in {"Cancelled", "StreamIncomplete"}
        assert StreamIncomplete.__mro__[1].__name__ == "DynamoException"


@pytest.mark.parametrize(
    "path",
    ["", "a", "a.b", "a.b.c.d", "A.b.c", "a..c", "a.b.c!", "dyn://a.b", "a b.c.d", "ns/x.c.e"],
)
async def test_bad_endpoint_paths(path: str) -> None:
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    try:
        with pytest.raises(ValueError):
            rt.endpoint(path)
    finally:
        rt.shutdown()


async def test_constructor_validation(monkeypatch) -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError, match="discovery backend"):
        DistributedRuntime(loop, "zookeeper", "tcp")
    with pytest.raises(ValueError, match="request plane"):
        DistributedRuntime(loop, "mem", "carrier-pigeon")
    with pytest.raises(ValueError, match="event_plane"):
        DistributedRuntime(loop, "mem", "tcp", event_plane="kafka")
    with pytest.raises(ValueError, match="not available"):
        DistributedRuntime(loop, "kubernetes", "tcp")
    # Nothing listens on port 1: a clear error naming the variable, not a hang.
    monkeypatch.setenv("ETCD_ENDPOINTS", "http://127.0.0.1:1")
    with pytest.raises(CannotConnect, match="ETCD_ENDPOINTS"):
        DistributedRuntime(loop, "etcd", "tcp")
    with pytest.warns(DeprecationWarning):
        rt = DistributedRuntime(loop, "mem", "tcp", True, event_plane="zmq")
    assert rt.event_loop() is loop
    ep = rt.endpoint("a.b.c")

    async def h(request):
        yield request

    with pytest.raises(TypeError, match="health_check_payload"):
        await ep.serve_endpoint(h, health_check_payload=[1])
    with pytest.raises(TypeError, match="metrics_labels"):
        await ep.serve_endpoint(h, metrics_labels=[("a",)])
    rt.shutdown()
