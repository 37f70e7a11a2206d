"""Router replica sync across processes (``router_replica_sync=True``): routers of the same
workers share their bookings over the event plane (brokerless TCP, then real NATS).

Workers are mocker processes (``python -m dynamo.mocker``); one router replica is a
``KvRouter`` in the test process, the others are subprocesses (``workers/sync_router.py``)
or frontends (``python -m dynamo.frontend --router-mode kv --router-replica-sync``), all
over file discovery in a per-test directory.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from runtime_util import local_runtime, unique_ns, wait_until
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances

from dynamo._core import KvRouter, KvRouterConfig
from dynamo.llm.tiny_model import write_tiny_model

BS = 16
N_WORKERS = 4
#: Peers' bookings expire after this much silence (DYN_ROUTER_REPLICA_SYNC_TTL_SECS).
TTL_SECS = 2.0


class RouterProc:
    """A router replica subprocess (tests/workers/sync_router.py)."""

    def __init__(self, procs: Procs, ns: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "sync_router.py"), ns, str(BS)],
            env=procs.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.procs.append(self.proc)

    async def ready(self) -> None:
        line = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(None, self.proc.stdout.readline), 30
        )
        assert line.strip() == "READY", line

    async def cmd(self, **cmd):
        def roundtrip() -> str:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            return self.proc.stdout.readline().strip()

        reply = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(None, roundtrip), 30
        )
        assert reply.startswith("OK"), reply
        rest = reply[2:].strip()
        return json.loads(rest) if rest else None

    async def loads(self) -> dict[int, list[int]]:
        return {int(k): v for k, v in (await self.cmd(op="loads")).items()}


@pytest.fixture
def cluster(tmp_path, monkeypatch, event_plane):
    """Mocker workers of a fresh namespace and the environment for more replicas."""
    ns = unique_ns()
    kv = tmp_path / "kv"
    for k, v in {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(kv),
        "DYN_FILE_KV_TTL_SECS": "2",
        "DYN_NAMESPACE": ns,
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_ROUTER_REPLICA_SYNC_TTL_SECS": str(TTL_SECS),
    }.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "logs").mkdir()
    procs = Procs(kv, tmp_path / "logs")
    model = write_tiny_model(tmp_path / "tiny")
    # Slow workers (speedup 0.05): streams stay in flight long enough to observe.
    procs.mocker(
        model,
        "--num-workers",
        str(N_WORKERS),
        "--block-size",
        str(BS),
        "--speedup-ratio",
        "0.05",
    )
    yield ns, procs, model
    procs.close()


async def local_router(rt, ns: str) -> KvRouter:
    router = KvRouter(
        rt.endpoint(f"{ns}.backend.generate"), BS, KvRouterConfig(router_replica_sync=True)
    )
    await wait_until(lambda: len(router._workers()) == N_WORKERS, timeout=30)
    return router


async def booked(router: KvRouter) -> dict[int, list[int]]:
    """``{worker: [active requests, prefill tokens]}`` booked in ``router``'s view."""
    loads = await router.get_potential_loads([])
    return {x["worker_id"]: [x["active_requests"], x["potential_prefill_tokens"]] for x in loads}


async def eventually(probe, expected, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while loop.time() < deadline:
        last = await probe()
        if last == expected:
            return
        await asyncio.sleep(0.05)
    assert last == expected


def total(view: dict[int, list[int]]) -> list[int]:
    return [sum(v[0] for v in view.values()), sum(v[1] for v in view.values())]


PROMPT = list(range(1, 4 * BS + 1))


async def test_bookings_prefill_and_free_are_shared(cluster) -> None:
    ns, procs, _ = cluster
    async with local_runtime("file") as rt:
        a = await local_router(rt, ns)
        b = RouterProc(procs, ns)
        await b.ready()
        # A's booking shows up in B's view, with its prefill tokens.
        wa, _, _ = await a.best_worker(PROMPT, request_id="a1")
        await eventually(lambda: b.loads(), {**{w: [0, 0] for w in await b.loads()}, wa: [1, 64]})
        # B's booking shows up in A's view.
        wb = await b.cmd(op="book", tokens=PROMPT, request_id="b1")
        assert wb != wa, "B saw A's load on its worker"
        await eventually(
            lambda: booked(a), {**{w: [0, 0] for w in await booked(a)}, wa: [1, 64], wb: [1, 64]}
        )
        await a.mark_prefill_complete("a1")
        await eventually(
            lambda: b.loads(), {**{w: [0, 0] for w in await b.loads()}, wa: [1, 0], wb: [1, 64]}
        )
        await a.free("a1")
        await b.cmd(op="free", request_id="b1")
        await eventually(lambda: booked(a), {w: [0, 0] for w in await booked(a)})
        await eventually(lambda: b.loads(), {w: [0, 0] for w in await b.loads()})


async def test_split_burst_spreads_like_one_router(cluster) -> None:
    """Identical prompts sent alternately to two replicas land on distinct workers, as
    with one router (each booking seen by the other replica before the next request)."""
    ns, procs, _ = cluster
    async with local_runtime("file") as rt:
        a = await local_router(rt, ns)
        b = RouterProc(procs, ns)
        await b.ready()
        chosen = []
        for i in range(N_WORKERS):
            if i % 2 == 0:
                chosen.append((await a.best_worker(PROMPT, request_id=f"q{i}"))[0])
            else:
                chosen.append(await b.cmd(op="book", tokens=PROMPT, request_id=f"q{i}"))
            n = i + 1
            await eventually(
                lambda n=n: _both_totals(a, b), ([n, n * len(PROMPT)], [n, n * len(PROMPT)])
            )
        assert sorted(chosen) == sorted(set(chosen)) and len(chosen) == N_WORKERS


async def _both_totals(a: KvRouter, b: RouterProc):
    return total(await booked(a)), total(await b.loads())


async def test_late_replica_catches_up_from_a_snapshot(cluster) -> None:
    ns, procs, _ = cluster
    async with local_runtime("file") as rt:
        a = await local_router(rt, ns)
        for i in range(3):
            await a.best_worker(PROMPT, request_id=f"early{i}")
        await a.mark_prefill_complete("early0")
        # B starts after A booked: it asks for (or is noticed and sent) a snapshot.
        b = RouterProc(procs, ns)
        await b.ready()
        await eventually(lambda: _total(b), [3, 2 * len(PROMPT)])
        await a.free("early1")
        await eventually(lambda: _total(b), [2, len(PROMPT)])


async def _total(b: RouterProc) -> list[int]:
    return total(await b.loads())


async def test_dead_replica_bookings_expire(cluster) -> None:
    ns, procs, _ = cluster
    async with local_runtime("file") as rt:
        a = await local_router(rt, ns)
        b = RouterProc(procs, ns)
        await b.ready()
        for i in range(2):
            await b.cmd(op="book", tokens=PROMPT, request_id=f"doomed{i}")
        await eventually(lambda: _local_total(a), [2, 2 * len(PROMPT)])
        b.proc.kill()  # no goodbye: only its silence tells
        b.proc.wait(10)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await eventually(lambda: _local_total(a), [0, 0], timeout=TTL_SECS + 5)
        assert loop.time() - start >= TTL_SECS * 0.5, "released before the TTL"


async def _local_total(a: KvRouter) -> list[int]:
    return total(await booked(a))


async def test_frontend_replica_shares_its_bookings(cluster) -> None:
    """A frontend with --router-replica-sync books each streamed request where the other
    replicas see it, and releases it when the stream ends."""
    ns, procs, _ = cluster
    port = free_port()
    procs.frontend(port, "--router-mode", "kv", "--router-replica-sync")
    base = f"http://127.0.0.1:{port}"
    await asyncio.get_running_loop().run_in_executor(
        None, wait_for_instances, base, "tiny", N_WORKERS
    )
    async with local_runtime("file") as rt:
        a = await local_router(rt, ns)
        body = json.dumps(
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hello " * 20}],
                "max_tokens": 40,
                "ignore_eos": True,
            }
        ).encode()
        call = asyncio.get_running_loop().run_in_executor(
            None, lambda: http("POST", f"{base}/v1/chat/completions", body, timeout=60)
        )
        await eventually(lambda: _requests(a), 1)
        status, _ = await call
        assert status == 200
        await eventually(lambda: _requests(a), 0)


async def _requests(a: KvRouter) -> int:
    return total(await booked(a))[0]
