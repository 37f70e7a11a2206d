"""Distributed mode against a real etcd (tests/services.py): registrations visible with
etcdctl, lease expiry of killed workers, etcd outages short and long, restarts."""

from __future__ import annotations

import asyncio
import time

import pytest
from runtime_util import Worker, collect, local_runtime, unique_ns, wait_until

TTL = 2


@pytest.fixture
def etcd_env(etcd_server, monkeypatch) -> dict[str, str]:
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": etcd_server.endpoint,
        "ETCD_LEASE_TTL": str(TTL),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def workers(tmp_path, etcd_env):
    started: list[Worker] = []
    ns = unique_ns()

    def start(**env: str) -> Worker:
        w = Worker(tmp_path, ns, **{**etcd_env, **env})
        started.append(w)
        return w

    start.ns = ns  # type: ignore[attr-defined]
    yield start
    for w in started:
        w.kill()


async def client_of(rt, ns: str, expected: set[int]):
    client = await rt.endpoint(f"{ns}.worker.generate").client()
    await wait_until(lambda: set(client.instance_ids()) == expected)
    return client


async def test_registrations_are_visible_with_etcdctl(workers, etcd_server) -> None:
    a, b = workers(), workers()
    prefix = f"v1/instances/{workers.ns}/worker/generate/"
    keys = etcd_server.etcdctl("get", "--prefix", "--keys-only", prefix).split()
    assert sorted(keys) == sorted(f"{prefix}{w.instance_id:x}" for w in (a, b))
    # The value is the instance, and the key carries the worker's lease.
    assert f'"instance_id":{a.instance_id}' in etcd_server.etcdctl(
        "get", f"{prefix}{a.instance_id:x}"
    )
    leases = etcd_server.etcdctl("lease", "list")
    assert f"{a.instance_id:x}" in leases
    # A graceful stop revokes the lease: the key is gone at once.
    assert a.stop() == 0
    keys = etcd_server.etcdctl("get", "--prefix", "--keys-only", prefix).split()
    assert keys == [f"{prefix}{b.instance_id:x}"]


async def test_sigkilled_worker_disappears_within_ttl_and_gets_no_requests(workers) -> None:
    a, b = workers(), workers()
    async with local_runtime("etcd") as rt:
        client = await client_of(rt, workers.ns, {a.instance_id, b.instance_id})
        a.kill()
        killed_at = time.monotonic()
        served = []
        while a.instance_id in client.instance_ids():
            assert time.monotonic() - killed_at < TTL + 2, "dead worker still listed"
            served.append((await collect(await client.round_robin({}, annotated=False)))[0])
            await asyncio.sleep(0.05)
        assert time.monotonic() - killed_at <= TTL + 2
        assert all(item["worker"] == b.instance_id for item in served)
        for _ in range(10):
            items = await collect(await client.round_robin({}, annotated=False))
            assert items[0]["worker"] == b.instance_id


async def test_restarted_worker_rejoins_with_a_new_id(workers) -> None:
    a = workers()
    async with local_runtime("etcd") as rt:
        client = await client_of(rt, workers.ns, {a.instance_id})
        a.kill()
        a2 = workers()
        assert a2.instance_id != a.instance_id
        await wait_until(lambda: client.instance_ids() == [a2.instance_id], timeout=TTL + 3)
        items = await collect(await client.round_robin({}, annotated=False))
        assert items[0]["worker"] == a2.instance_id


async def test_brief_etcd_outage_loses_nothing(workers, etcd_server, etcd_env, monkeypatch) -> None:
    # A longer lease than the outage: a stop shorter than the TTL must be harmless.
    monkeypatch.setenv("ETCD_LEASE_TTL", "8")
    a = workers(ETCD_LEASE_TTL="8")
    async with local_runtime("etcd") as rt:
        client = await client_of(rt, workers.ns, {a.instance_id})
        etcd_server.stop()
        try:
            # Requests keep flowing while etcd is away (discovery is cached).
            for _ in range(5):
                items = await collect(await client.round_robin({}, annotated=False))
                assert items[0]["worker"] == a.instance_id
                await asyncio.sleep(0.2)
        finally:
            etcd_server.start()
        await asyncio.sleep(2)
        assert a.proc.poll() is None
        assert client.instance_ids() == [a.instance_id]
        prefix = f"v1/instances/{workers.ns}/worker/generate/"
        assert etcd_server.etcdctl("get", "--prefix", "--keys-only", prefix).split() == [
            f"{prefix}{a.instance_id:x}"
        ]
        # Discovery still follows changes after the restart.
        b = workers(ETCD_LEASE_TTL="8")
        await wait_until(lambda: set(client.instance_ids()) == {a.instance_id, b.instance_id})
        got = {
            (await collect(await client.round_robin({}, annotated=False)))[0]["worker"]
            for _ in range(4)
        }
        assert got == {a.instance_id, b.instance_id}


async def test_long_etcd_outage_shuts_the_worker_down(workers, etcd_server) -> None:
    a = workers()
    key = f"v1/instances/{workers.ns}/worker/generate/{a.instance_id:x}"
    await wait_until(lambda: key in etcd_server.etcdctl("get", "--keys-only", key), interval=0.1)
    etcd_server.stop()
    try:
        # No renewal for a whole TTL: the lease is lost, the worker shuts down in order.
        code = await asyncio.to_thread(a.proc.wait, TTL + 8)
    finally:
        etcd_server.start()
    assert code == 0, a.proc.stderr.read()
    assert "SERVED" in a.proc.stdout.read()


async def test_nats_outage_then_requests_flow_again(workers, nats_server, monkeypatch) -> None:
    monkeypatch.setenv("DYN_REQUEST_PLANE", "nats")
    monkeypatch.setenv("NATS_SERVER", nats_server.url)
    a = workers(DYN_REQUEST_PLANE="nats", NATS_SERVER=nats_server.url)
    async with local_runtime("etcd", "nats") as rt:
        client = await client_of(rt, workers.ns, {a.instance_id})
        assert len(await collect(await client.round_robin({}, annotated=False))) == 3
        nats_server.stop()
        await asyncio.sleep(2)
        nats_server.start()
        # Both sides reconnect by themselves; the worker keeps its registration.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while True:
            try:
                items = await collect(await client.round_robin({}, annotated=False))
                break
            except Exception:
                assert loop.time() < deadline, "requests did not recover after the NATS restart"
                await asyncio.sleep(0.2)
        assert [x["worker"] for x in items] == [a.instance_id] * 3
        assert client.instance_ids() == [a.instance_id]
