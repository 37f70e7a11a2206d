"""Multi-host: a worker in its own network namespace (iproute2 ``ip netns`` + a veth pair,
created and removed by the test) and a client in the test's namespace discover each other
through etcd and exchange requests over NATS, and KV events over the NATS event plane;
etcd and nats-server listen on the veth address of the test's side only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from runtime_util import WORKER, collect, local_runtime, unique_ns, wait_until
from services import Etcd, Nats

from dynamo._core import KvRouter, KvRouterConfig

KV_WORKER = Path(__file__).resolve().parent / "workers" / "kv_worker.py"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns():
    """A namespace ``ns`` joined to this one by a veth pair: 10.213.N.1 here, .2 there."""
    tag = uuid.uuid4().hex[:6]
    name, here, there = f"dyn-{tag}", f"dva{tag}", f"dvb{tag}"
    subnet = int(tag[:2], 16)
    try:
        ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as e:
        reason = getattr(e, "stderr", "") or str(e)
        print(f"network namespaces unavailable: {reason}")
        pytest.skip(f"the kernel refuses network namespaces: {reason.strip()}")
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", name)
        ip("addr", "add", f"10.213.{subnet}.1/24", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"10.213.{subnet}.2/24", "dev", there)
        ip("netns", "exec", name, "ip", "link", "set", there, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@pytest.fixture
def services(netns, monkeypatch):
    """etcd and nats-server on this side's veth address; the environment of both sides."""
    _, here, _ = netns
    etcd, nats = Etcd(host=here), Nats(host=here)
    try:
        etcd.start()
        nats.start()
        env = {
            "DYN_DISCOVERY_BACKEND": "etcd",
            "ETCD_ENDPOINTS": etcd.endpoint,
            "ETCD_LEASE_TTL": "2",
            "DYN_REQUEST_PLANE": "nats",
            "DYN_EVENT_PLANE": "nats",
            "NATS_SERVER": nats.url,
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield env
    finally:
        etcd.close()
        nats.close()


def start_in(netns, env: dict[str, str], script: Path, ns: str) -> subprocess.Popen:
    name, _, there = netns
    return subprocess.Popen(
        ["ip", "netns", "exec", name, sys.executable, str(script), ns],
        env={**os.environ, **env, "DYN_TCP_RPC_HOST": there, "DYNAMO_SKIP_PYTHON_LOG_INIT": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_worker_in_another_namespace_over_etcd_and_nats(netns, services) -> None:
    ns = unique_ns()
    worker = start_in(netns, services, WORKER, ns)
    try:
        line = worker.stdout.readline() if worker.stdout else ""
        assert line.startswith("ID "), (line, worker.stderr.read() if worker.stderr else "")
        worker_id = int(line.split()[1])
        async with local_runtime("etcd", "nats") as rt:
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await wait_until(lambda: client.instance_ids() == [worker_id])
            for _ in range(5):
                items = await collect(await client.round_robin({"n": 4}, annotated=False))
                assert items == [{"worker": worker_id, "i": i} for i in range(4)]
            # The worker dies with its namespace's process: its lease expires for us.
            worker.kill()
            await wait_until(lambda: client.instance_ids() == [], timeout=6)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(10)


async def test_kv_events_cross_namespaces_over_nats(netns, services) -> None:
    """The worker publishes KV events in its namespace; a router here receives them over
    the NATS event plane (and routes by them)."""
    ns = unique_ns()
    worker = start_in(netns, services, KV_WORKER, ns)

    async def cmd(**command) -> str:
        def roundtrip() -> str:
            worker.stdin.write(json.dumps(command) + "\n")
            worker.stdin.flush()
            return worker.stdout.readline().strip()

        reply = await asyncio.wait_for(asyncio.to_thread(roundtrip), 10)
        assert reply.startswith("OK"), reply
        return reply

    try:
        line = worker.stdout.readline() if worker.stdout else ""
        assert line.startswith("ID "), (line, worker.stderr.read() if worker.stderr else "")
        worker_id = int(line.split()[1])
        async with local_runtime("etcd", "nats") as rt:
            bs = 4
            router = KvRouter(rt.endpoint(f"{ns}.backend.generate"), bs, KvRouterConfig())
            await wait_until(lambda: len(router._workers()) == 1)
            tokens = list(range(1000, 1000 + 5 * bs))

            async def overlap() -> dict[int, int]:
                scores = await router.get_overlap_scores(tokens)
                return {w["worker_id"]: w["device_overlap_blocks"] for w in scores["workers"]}

            await cmd(op="store", tokens=tokens, hashes=[11, 12, 13, 14, 15], block_size=bs)
            for _ in range(500):
                if await overlap() == {worker_id: 5}:
                    break
                await asyncio.sleep(0.02)
            assert await overlap() == {worker_id: 5}
            await cmd(op="remove", hashes=[13, 14, 15])
            for _ in range(500):
                if await overlap() == {worker_id: 2}:
                    break
                await asyncio.sleep(0.02)
            assert await overlap() == {worker_id: 2}
            await cmd(op="exit")
            assert await asyncio.to_thread(worker.wait, 10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(10)
