"""KV routing across processes: worker subprocesses publish KV events (discovery ``file``,
request plane ``tcp`` on 127.0.0.1), a ``KvRouter`` in the test process routes to them."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_util import local_runtime, unique_ns, wait_until, worker_env

from dynamo._core import KvRouter, KvRouterConfig

KV_WORKER = Path(__file__).resolve().parent / "workers" / "kv_worker.py"
BS = 4


class KvWorker:
    def __init__(self, kv_dir: Path, ns: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(KV_WORKER), ns],
            env=worker_env(kv_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line.startswith("ID "), line
        self.instance_id = int(line.split()[1])

    async def cmd(self, **cmd) -> str:
        def roundtrip() -> str:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            return self.proc.stdout.readline().strip()

        reply = await asyncio.get_running_loop().run_in_executor(None, roundtrip)
        assert reply.startswith("OK"), reply
        return reply

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def kv_dir(tmp_path, monkeypatch):
    d = tmp_path / "kv"
    monkeypatch.setenv("DYN_FILE_KV", str(d))
    monkeypatch.setenv("DYN_FILE_KV_TTL_SECS", "2")
    return d


@pytest.fixture
def cluster(kv_dir):
    ns = unique_ns()
    workers = [KvWorker(kv_dir, ns), KvWorker(kv_dir, ns)]
    yield ns, workers
    for w in workers:
        w.kill()


def prompt(blocks: int) -> list[int]:
    return [random.randrange(1, 2**31) for _ in range(blocks * BS)]


def hashes(n: int) -> list[int]:
    return [random.randrange(-(2**63), 2**63) for _ in range(n)]


async def overlap(router: KvRouter, tokens: list[int]) -> dict[int, int]:
    scores = await router.get_overlap_scores(tokens)
    return {w["worker_id"]: w["device_overlap_blocks"] for w in scores["workers"]}


async def eventually(router: KvRouter, tokens: list[int], expected: dict[int, int]) -> None:
    for _ in range(500):
        if await overlap(router, tokens) == expected:
            return
        await asyncio.sleep(0.01)
    assert await overlap(router, tokens) == expected


async def test_route_load_recovery_and_removal_across_processes(cluster) -> None:
    ns, (a, b) = cluster
    async with local_runtime("file") as rt:
        router = KvRouter(rt.endpoint(f"{ns}.backend.generate"), BS, KvRouterConfig())
        await wait_until(lambda: len(router._workers()) == 2)
        for w in (a, b):
            for _ in range(500):
                if (await w.cmd(op="subscribers")) != "OK 0":
                    break
                await asyncio.sleep(0.01)

        # Worker b holds the prompt: the router sends it there.
        p = prompt(6)
        hb = hashes(6)
        await b.cmd(op="store", tokens=p, hashes=hb)
        await eventually(router, p, {b.instance_id: 6})
        assert await router.best_worker(p) == (b.instance_id, 0, 6)
        stream = await router.generate(p, "m", extra_args={"n": 2})
        assert {item["worker"] async for item in stream} == {b.instance_id}

        # Loads rise with in-flight requests and fall when they finish or are freed.
        def active(loads) -> int:
            return sum(x["active_requests"] for x in loads)

        slow = await router.generate(p, "m", extra_args={"n": 3, "delay": 0.2})
        assert active(await router.get_potential_loads(p)) == 1
        await router.best_worker(p, request_id="manual")
        assert active(await router.get_potential_loads(p)) == 2
        await router.free("manual")
        assert [x["i"] async for x in slow] == [0, 1, 2]
        assert active(await router.get_potential_loads(p)) == 0

        # Lost events (numbered, never sent) are recovered from a's local indexer.
        q = prompt(5)
        await a.cmd(op="drop", n=1)
        await a.cmd(op="store", tokens=q, hashes=hashes(5))
        r = prompt(2)
        await a.cmd(op="store", tokens=r, hashes=hashes(2))
        await eventually(router, q, {a.instance_id: 5})
        await eventually(router, r, {a.instance_id: 2})

        # Removed blocks vanish.
        await b.cmd(op="remove", hashes=hb[3:])
        await eventually(router, p, {b.instance_id: 3})

        # A worker that leaves takes its blocks with it.
        await b.cmd(op="exit")
        b.proc.wait(10)
        await wait_until(lambda: len(router._workers()) == 1)
        await eventually(router, p, {})
        assert await router.best_worker(p) == (a.instance_id, 0, 0)
