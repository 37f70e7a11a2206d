"""KV routing between runtimes of one process (``mem`` discovery): publishers, indexers,
the router's dispatch, load accounting, recovery after lost events, worker removal."""

from __future__ import annotations

import asyncio
import json

import pytest
from kv_cluster import Cluster
from runtime_util import fresh_python, local_runtime, unique_ns, wait_until

from dynamo._core import (
    ApproxKvIndexer,
    KvEventPublisher,
    KvIndexer,
    KvRouter,
    KvRouterConfig,
    KvStoredEventInput,
    WorkerMetricsPublisher,
)


async def test_publisher_argument_validation() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        with pytest.raises(ValueError, match="kv_block_size cannot be 0"):
            KvEventPublisher(ep)
        with pytest.raises(ValueError, match="batching_timeout_ms"):
            KvEventPublisher(ep, kv_block_size=4, batching_timeout_ms=20_000)
        pub = KvEventPublisher(ep, kv_block_size=4)
        assert pub.kv_block_size == 4
        with pytest.raises(ValueError, match="invalid KV event batch"):
            pub.publish_batch([{"type": "stored", "token_ids": [1, 2, 3, 4], "bogus": 1}])
        with pytest.raises(ValueError, match="invalid KV event batch"):
            pub.publish_batch([{"type": "moved", "block_hashes": [1]}])
        assert set(KvStoredEventInput.__optional_keys__) >= {"token_ids", "block_hashes"}
        pub.shutdown()


def test_batch_typed_dicts_are_made_on_first_use() -> None:
    """The TypedDicts are module attributes made on first use (importing ``typing`` at
    module import cost every process 8 ms of start-up): a fresh process that imports
    ``dynamo._core`` has not imported ``typing``; the names are listed, stable, and an
    unknown name is still an ``AttributeError``."""
    code = (
        "import sys, dynamo._core as c\n"
        "assert 'typing' not in sys.modules, 'typing imported'\n"
        "assert {'KvStoredEventInput', 'KvRemovedEventInput'} <= set(dir(c))\n"
        "from dynamo._core import KvRemovedEventInput\n"
        "assert c.KvRemovedEventInput is KvRemovedEventInput\n"
        "assert KvRemovedEventInput.__module__ == 'dynamo._core'\n"
        "assert set(KvRemovedEventInput.__optional_keys__) == {'type', 'block_hashes'}\n"
        "assert not hasattr(c, 'KvNoSuchInput')\n"
    )
    fresh_python(code)


async def test_routes_to_prefix_holder_and_tracks_load() -> None:
    c = await Cluster(3).start()
    try:
        prompt = c.prompt(8)
        await c.store(1, prompt, 8)
        wid, rank, overlap = await c.router.best_worker(prompt)
        assert (wid, rank, overlap) == (c.ids[1], 0, 8)

        def active(loads):
            return {x["worker_id"]: x["active_requests"] for x in loads}

        before = active(await c.router.get_potential_loads(prompt))
        assert before[c.ids[1]] == 0
        await c.router.best_worker(prompt, request_id="r1")
        await c.router.best_worker(prompt, request_id="r2")
        during = active(await c.router.get_potential_loads(prompt))
        assert sum(during.values()) == 2
        loads = {x["worker_id"]: x for x in await c.router.get_potential_loads(prompt)}
        await c.router.mark_prefill_complete("r1")
        after_prefill = {x["worker_id"]: x for x in await c.router.get_potential_loads(prompt)}
        assert sum(x["potential_prefill_tokens"] for x in after_prefill.values()) <= sum(
            x["potential_prefill_tokens"] for x in loads.values()
        )
        await c.router.free("r1")
        await c.router.free("r2")
        assert active(await c.router.get_potential_loads(prompt)) == before

        # generate: routed to the holder, booked while streaming, freed at the end.
        stream = await c.router.generate(prompt, "m", extra_args={"n": 3})
        items = [item async for item in stream]
        assert items == [{"i": i, "worker": c.ids[1]} for i in range(3)]
        assert sum(active(await c.router.get_potential_loads(prompt)).values()) == 0
        # Pinned generate goes to the pinned worker.
        stream = await c.router.generate(prompt, "m", worker_id=c.ids[2])
        assert {i["worker"] async for i in stream} == {c.ids[2]}

        events = json.loads(await c.router.dump_events())
        assert len(events) == 8 and {e["worker_id"] for e in events} == {c.ids[1]}

        # Overrides apply to their request only.
        other = c.prompt(4)
        await c.store(0, other, 4)
        assert (await c.router.best_worker(other))[0] == c.ids[0]
        w, _, _ = await c.router.best_worker(
            other, router_config_override={"overlap_score_credit": 0.0}
        )
        assert w in c.ids
        assert (await c.router.best_worker(other))[0] == c.ids[0]
        with pytest.raises(ValueError):
            await c.router.best_worker(other, router_config_override={"nope": 1})
    finally:
        await c.stop()


async def test_lost_events_are_recovered_from_the_local_indexer() -> None:
    c = await Cluster(2).start()
    try:
        first = c.prompt(4)
        await c.store(0, first, 4)
        # The next event is numbered but never sent: the router sees an id gap.
        c.pubs[0]._drop_next_events(1)
        lost = c.prompt(6)
        bs = c.block_size
        c.pubs[0].publish_stored(lost[: 6 * bs], [bs] * 6, list(range(100, 106)))
        # The next event reveals the gap; the router replays the lost one.
        later = c.prompt(2)
        c.pubs[0].publish_stored(later[: 2 * bs], [bs] * 2, [7, 8])
        for _ in range(300):
            if (await c.overlaps(lost)).get(c.ids[0]) == 6:
                break
            await asyncio.sleep(0.01)
        assert (await c.overlaps(lost)).get(c.ids[0]) == 6
        assert (await c.overlaps(later)).get(c.ids[0]) == 2
        # Removal events flow too.
        c.pubs[0].publish_removed(list(range(100, 106)))
        for _ in range(300):
            if (await c.overlaps(lost)).get(c.ids[0], 0) == 0:
                break
            await asyncio.sleep(0.01)
        assert (await c.overlaps(lost)).get(c.ids[0], 0) == 0
    finally:
        await c.stop()


async def test_removed_worker_vanishes_from_scores() -> None:
    c = await Cluster(2).start()
    try:
        prompt = c.prompt(4)
        await c.store(1, prompt, 4)
        assert (await c.overlaps(prompt)).get(c.ids[1]) == 4
        c.runtimes[1].shutdown()
        await wait_until(lambda: len(c.router._workers()) == 1)
        for _ in range(300):
            if not await c.overlaps(prompt):
                break
            await asyncio.sleep(0.01)
        assert await c.overlaps(prompt) == {}
        wid, _, overlap = await c.router.best_worker(prompt)
        assert (wid, overlap) == (c.ids[0], 0)
    finally:
        await c.stop()


async def test_kv_indexer_and_metrics() -> None:
    c = await Cluster(2).start()
    try:
        path = f"{c.ns}.backend.generate"
        indexer = KvIndexer(c.router_rt.endpoint(path), c.block_size)
        assert indexer.block_size() == c.block_size
        await wait_until(lambda: all(p._subscriber_count() >= 2 for p in c.pubs))
        prompt = c.prompt(3)
        await c.store(0, prompt, 3)
        for _ in range(300):
            if indexer.find_matches_for_request(prompt).scores:
                break
            await asyncio.sleep(0.01)
        assert indexer.find_matches_for_request(prompt).scores == {(c.ids[0], 0): 3}
        assert indexer.find_matches_for_request(prompt, lora_name="x").scores == {}

        metrics = WorkerMetricsPublisher()
        metrics.publish(kv_used_blocks=1)  # before create_endpoint: no effect, no error
        await metrics.create_endpoint(c.endpoints[0])
        metrics.publish(dp_rank=0, active_decode_blocks=3, kv_used_blocks=3)
    finally:
        await c.stop()


async def test_approx_indexer_records_decisions() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        approx = ApproxKvIndexer(ep, 4, router_ttl_secs=60.0)
        tokens = list(range(16))
        assert approx.find_matches_for_request(tokens).scores == {}
        await approx.process_routing_decision_for_request(tokens, 42, 1)
        assert approx.find_matches_for_request(tokens).scores == {(42, 1): 4}
        assert approx.block_size() == 4


async def test_router_in_approximate_mode_learns_from_its_decisions() -> None:
    c = await Cluster(2, config=KvRouterConfig(use_kv_events=False), events=False).start()
    try:
        prompt = c.prompt(4)
        wid, _, overlap = await c.router.best_worker(prompt, update_indexer=True)
        assert overlap == 0
        wid2, _, overlap2 = await c.router.best_worker(prompt)
        assert (wid2, overlap2) == (wid, 4)
    finally:
        await c.stop()


async def test_kv_router_rejects_bad_arguments() -> None:
    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        with pytest.raises(ValueError):
            KvRouter(ep, 0, KvRouterConfig())
        router = KvRouter(ep, 4, KvRouterConfig())
        with pytest.raises(ValueError):
            await router.generate([1, 2, 3], "m", response_buffer_size=-1)


async def test_router_queue_holds_requests_until_capacity_frees() -> None:
    from dynamo._core import KvRouterConfig as Cfg

    c = await Cluster(1, config=Cfg(router_queue_threshold=1.0, router_queue_policy="fcfs")).start()
    try:
        metrics = WorkerMetricsPublisher()
        await metrics.create_endpoint(c.endpoints[0])
        # Report a 32-token batch capacity until the router has it (it connects in the
        # background).
        for _ in range(500):
            metrics.publish(kv_used_blocks=0, total_kv_blocks=1000, max_num_batched_tokens=32)
            await asyncio.sleep(0.01)
            if c.router._capacity(c.ids[0]) == (1000, 32):
                break
        assert c.router._capacity(c.ids[0]) == (1000, 32)
        first = c.prompt(12)  # 48 uncached prompt tokens > 1.0 x 32: saturates the worker
        await c.router.best_worker(first, request_id="a")

        async def eventually_queued(n: int) -> None:
            for _ in range(300):
                if c.router._queued() == n:
                    return
                await asyncio.sleep(0.01)
            assert c.router._queued() == n

        # The worker is saturated: the next requests wait.
        b = asyncio.ensure_future(c.router.best_worker(c.prompt(12), request_id="b"))
        await eventually_queued(1)
        d = asyncio.ensure_future(c.router.best_worker(c.prompt(12), request_id="d"))
        await eventually_queued(2)
        await asyncio.sleep(0.1)
        assert not b.done() and not d.done()
        # Prefill of "a" done: its tokens stop counting, "b" (first in) goes, "d" still waits.
        await c.router.mark_prefill_complete("a")
        await asyncio.wait_for(b, 5)
        await eventually_queued(1)
        assert not d.done()
        await c.router.free("b")
        await asyncio.wait_for(d, 5)
        assert c.router._queued() == 0
        for rid in ("a", "d"):
            await c.router.free(rid)
    finally:
        await c.stop()


async def test_endpoint_client_in_kv_mode(monkeypatch) -> None:
    from dynamo._core import RouterMode

    monkeypatch.setenv("DYN_KV_BLOCK_SIZE", "4")
    c = await Cluster(3).start()
    try:
        client = await c.router_rt.endpoint(f"{c.ns}.backend.generate").client(
            router_mode=RouterMode.KV
        )
        await client.wait_for_instances()
        await wait_until(lambda: all(p._subscriber_count() >= 2 for p in c.pubs))
        prompt = c.prompt(5)
        await c.store(2, prompt, 5)
        # The client's own router learns the events in the background: wait for the first
        # hit, then every request must go to the holder (random routing: 3^-10).
        for _ in range(300):
            stream = await client.generate({"token_ids": prompt}, annotated=False)
            if {item["worker"] async for item in stream} == {c.ids[2]}:
                break
            await asyncio.sleep(0.01)
        for _ in range(10):
            stream = await client.generate({"token_ids": prompt}, annotated=False)
            assert {item["worker"] async for item in stream} == {c.ids[2]}
        with pytest.raises(ValueError, match="token_ids"):
            await client.generate({"prompt": "no tokens"})
        with pytest.raises(ValueError, match="router_mode"):
            await c.router_rt.endpoint(f"{c.ns}.backend.generate").client(
                router_mode=RouterMode.LeastLoaded
            )
    finally:
        await c.stop()


async def test_generate_from_request_routes_and_pins() -> None:
    c = await Cluster(2).start()
    try:
        prompt = c.prompt(4)
        await c.store(0, prompt, 4)
        request = {"token_ids": prompt, "model": "m", "extra_args": {"n": 3}}
        stream = await c.router.generate_from_request(request)
        assert [x async for x in stream] == [{"i": i, "worker": c.ids[0]} for i in range(3)]
        pinned = dict(request, routing={"backend_instance_id": c.ids[1], "dp_rank": 0})
        stream = await c.router.generate_from_request(pinned)
        assert {x["worker"] async for x in stream} == {c.ids[1]}
        loads = await c.router.get_potential_loads(prompt)
        assert sum(x["active_requests"] for x in loads) == 0
        with pytest.raises(ValueError, match="token_ids"):
            await c.router.generate_from_request({"model": "m"})
        with pytest.raises(ValueError):
            await c.router.generate_from_request(request, response_buffer_size=-1)
    finally:
        await c.stop()


async def test_dropping_a_routed_stream_frees_its_booking() -> None:
    import gc

    c = await Cluster(1).start()
    try:
        prompt = c.prompt(2)

        async def active() -> int:
            return sum(x["active_requests"] for x in await c.router.get_potential_loads(prompt))

        stream = await c.router.generate(prompt, "m", extra_args={"n": 1000, "delay": 0.01})
        first = await stream.__anext__()
        assert first["i"] == 0
        assert await active() == 1
        del stream
        gc.collect()
        for _ in range(300):
            if await active() == 0:
                break
            await asyncio.sleep(0.01)
        assert await active() == 0
    finally:
        await c.stop()
