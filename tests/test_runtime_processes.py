"""Runtime behaviour across processes: worker subprocesses, request plane ``tcp`` on
127.0.0.1, discovery ``file`` in a temp directory or a real etcd (tests/services.py), lease
TTL 2 s either way."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
from collections import Counter

import pytest
from runtime_util import Worker, collect, local_runtime, unique_ns, wait_until

from dynamo._core import Disconnected, EngineShutdown


@pytest.fixture
def kv_dir(tmp_path, monkeypatch):
    d = tmp_path / "kv"
    monkeypatch.setenv("DYN_FILE_KV", str(d))
    monkeypatch.setenv("DYN_FILE_KV_TTL_SECS", "2")
    return d


@pytest.fixture(params=["file+tcp", "etcd+tcp", "etcd+nats"])
def backend(request, monkeypatch) -> dict[str, str]:
    """Discovery and request plane for the test and its workers: ``file`` (lease 2 s), or
    etcd with a 2 s lease and the TCP or NATS request plane (real servers)."""
    discovery, plane = request.param.split("+")
    monkeypatch.setenv("DYN_REQUEST_PLANE", plane)
    if discovery == "file":
        return {"DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": plane}
    etcd = request.getfixturevalue("etcd_server")
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "DYN_REQUEST_PLANE": plane,
        "ETCD_ENDPOINTS": etcd.endpoint,
        "ETCD_LEASE_TTL": "2",
    }
    if plane == "nats":
        env["NATS_SERVER"] = request.getfixturevalue("nats_server").url
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def workers(kv_dir, backend):
    started: list[Worker] = []
    ns = unique_ns()

    def start(**env: str) -> Worker:
        w = Worker(kv_dir, ns, **{**backend, **env})
        started.append(w)
        return w

    start.ns = ns  # type: ignore[attr-defined]
    start.backend = backend["DYN_DISCOVERY_BACKEND"]  # type: ignore[attr-defined]
    yield start
    for w in started:
        w.kill()


async def connect(ns: str, rt, expected: set[int]):
    client = await rt.endpoint(f"{ns}.worker.generate").client()
    await wait_until(lambda: set(client.instance_ids()) == expected)
    return client


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_round_robin_direct_and_random_over_two_workers(workers) -> None:
    a, b = workers(), workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id, b.instance_id})

        async def who(stream) -> int:
            items = await collect(stream)
            assert [x["i"] for x in items] == [0, 1, 2]
            assert len({x["worker"] for x in items}) == 1
            return items[0]["worker"]

        order = [await who(await client.round_robin({}, annotated=False)) for _ in range(10)]
        assert all(x != y for x, y in itertools.pairwise(order)), order
        assert Counter(order) == {a.instance_id: 5, b.instance_id: 5}

        for w in (a, b):
            for _ in range(3):
                assert (
                    await who(await client.direct({}, w.instance_id, annotated=False))
                    == w.instance_id
                )

        seen = {await who(await client.random({}, annotated=False)) for _ in range(40)}
        assert seen == {a.instance_id, b.instance_id}


async def test_errors_cross_the_process_boundary(workers) -> None:
    a = workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id})
        with pytest.raises(EngineShutdown, match="migrate"):
            await collect(await client.round_robin({"raise": "shutdown"}, annotated=False))
        with pytest.raises(ValueError, match="bad input from worker"):
            await collect(await client.round_robin({"raise": "value"}, annotated=False))
        assert len(await collect(await client.round_robin({}))) == 3


async def test_workers_joining_and_leaving_while_a_client_runs(workers) -> None:
    a = workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id})
        served: Counter = Counter()
        errors: list[BaseException] = []
        running = True

        async def load() -> None:
            while running:
                try:
                    items = await collect(await client.round_robin({"n": 2}, annotated=False))
                    served[items[0]["worker"]] += 1
                except Exception as e:
                    errors.append(e)
                await asyncio.sleep(0.005)

        task = asyncio.ensure_future(load())
        b = workers()
        await wait_until(lambda: set(client.instance_ids()) == {a.instance_id, b.instance_id})
        await wait_until(lambda: served[b.instance_id] >= 5)
        # A graceful leave: deregistered first, in-flight streams drained.
        assert b.stop() == 0
        await wait_until(lambda: client.instance_ids() == [a.instance_id])
        before = served[a.instance_id]
        await wait_until(lambda: served[a.instance_id] >= before + 5)
        running = False
        await asyncio.wait_for(task, 5)
        assert errors == []


async def test_worker_killed_mid_stream(workers) -> None:
    a, b = workers(), workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id, b.instance_id})
        stream = await client.direct({"n": 10_000, "delay": 0.01}, a.instance_id, annotated=False)
        assert (await stream.__anext__())["worker"] == a.instance_id
        a.kill()
        with pytest.raises(Disconnected):
            await asyncio.wait_for(collect(stream), 3)
        # Later requests go to the survivor, before and after the dead lease expires.
        for _ in range(6):
            items = await collect(await client.round_robin({}, annotated=False))
            assert items[0]["worker"] == b.instance_id
        await wait_until(lambda: client.instance_ids() == [b.instance_id], timeout=8)


async def test_sigterm_drains_in_flight_streams(workers) -> None:
    a = workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id})
        stream = await client.round_robin({"n": 10, "delay": 0.05}, annotated=False)
        assert (await stream.__anext__())["i"] == 0
        a.proc.terminate()
        rest = await asyncio.wait_for(collect(stream), 10)
        assert [x["i"] for x in rest] == list(range(1, 10))
        assert await asyncio.to_thread(a.proc.wait, 10) == 0
        assert "SERVED" in a.proc.stdout.read()
        await wait_until(lambda: client.instance_ids() == [])


@pytest.mark.slow
async def test_ten_thousand_concurrent_streams_without_errors_or_leaks(workers) -> None:
    a, b = workers(), workers()
    async with local_runtime(workers.backend) as rt:
        client = await connect(workers.ns, rt, {a.instance_id, b.instance_id})
        # Warm up: one pooled connection per worker.
        for _ in range(2):
            await collect(await client.round_robin({"n": 1}, annotated=False))
        gc.collect()
        fds = fd_count(), fd_count(a.proc.pid), fd_count(b.proc.pid)

        async def one(i: int) -> int:
            items = await collect(await client.round_robin({"n": 2}, annotated=False))
            assert [x["i"] for x in items] == [0, 1]
            return items[0]["worker"]

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(10_000))), 120)
        assert Counter(results) == {a.instance_id: 5_000, b.instance_id: 5_000}
        gc.collect()
        after = fd_count(), fd_count(a.proc.pid), fd_count(b.proc.pid)
        assert all(x <= y for x, y in zip(after, fds, strict=True)), (after, fds)
