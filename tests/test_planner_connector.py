"""The planner's virtual connector over real etcd (keys `v1/{ns}/planner/...`, decimal
values) and the file store; metrics callbacks merged into `/metrics`; the multimodal cache
publisher and the consumer that rebuilds which worker holds which keys (over the TCP event
plane and NATS, including a consumer that starts late)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import urllib.request
from contextlib import asynccontextmanager

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_util import collect, local_runtime, unique_ns, wait_until
from services import free_port

from dynamo._core import (
    DistributedRuntime,
    DynamoException,
    MultimodalEmbeddingCacheIndex,
    MultimodalEmbeddingCachePublisher,
    PlannerDecision,
    VirtualConnectorClient,
    VirtualConnectorCoordinator,
)


def etcd_range(endpoint: str, prefix: str) -> dict[str, str]:
    """Keys under ``prefix`` through etcd's JSON gateway (no etcdctl needed)."""
    k = prefix.encode()
    end = k[:-1] + bytes([k[-1] + 1])
    body = json.dumps(
        {"key": base64.b64encode(k).decode(), "range_end": base64.b64encode(end).decode()}
    ).encode()
    with urllib.request.urlopen(f"{endpoint}/v3/kv/range", body, timeout=5) as r:
        data = json.loads(r.read())
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
        for kv in data.get("kvs", [])
    }


@asynccontextmanager
async def runtime(backend: str):
    """A bare runtime (the connector classes take the DistributedRuntime itself)."""
    rt = DistributedRuntime(asyncio.get_running_loop(), backend, "tcp")
    try:
        yield rt
    finally:
        rt.shutdown()


def state(d: PlannerDecision) -> tuple[int, int, int]:
    return (d.num_prefill_workers, d.num_decode_workers, d.decision_id)


async def connector_protocol(rt, ns: str, keys=None) -> None:
    c = VirtualConnectorCoordinator(rt, ns, 1, 2, 2)
    assert state(c.read_state()) == (-1, -1, -1)
    with pytest.raises(RuntimeError, match="async_init"):
        await c.update_scaling_decision(1, 1)
    await c.async_init()
    assert await c.is_scaling_ready()
    t = time.monotonic()
    await c.wait_for_scaling_completion()
    assert time.monotonic() - t < 0.5  # no decision: returns at once
    await c.update_scaling_decision(None, 2)
    assert state(c.read_state()) == (-1, 2, 0)
    if keys:
        assert keys() == {
            f"v1/{ns}/planner/decision_id": "0",
            f"v1/{ns}/planner/num_decode_workers": "2",
        }
    assert not await c.is_scaling_ready()
    client = VirtualConnectorClient(rt, ns)
    d = await client.get()
    assert state(d) == (-1, 2, 0)
    await asyncio.wait_for(client.wait(), 2)  # a pending decision: resolves at once
    # Unacknowledged: skipped (no write) until max_wait (2 s) since the first skip.
    await c.update_scaling_decision(None, 3)
    assert state(c.read_state()) == (-1, 2, 0)
    t = time.monotonic()
    await c.wait_for_scaling_completion()  # 2 retries, 1 s apart, then only logs
    assert 1.5 < time.monotonic() - t < 4
    await asyncio.sleep(0.3)
    await c.update_scaling_decision(None, 3)
    assert state(c.read_state()) == (-1, 3, 1)
    await c.update_scaling_decision(None, 3)  # unchanged: no-op
    assert state(c.read_state()) == (-1, 3, 1)
    await client.complete(await client.get())
    assert await c.is_scaling_ready()
    if keys:
        assert keys()[f"v1/{ns}/planner/scaled_decision_id"] == "1"
    waiter = asyncio.ensure_future(client.wait())
    await asyncio.sleep(0.3)
    assert not waiter.done()
    await c.update_scaling_decision(1, None)
    await asyncio.wait_for(waiter, 3)
    assert state(await client.get()) == (1, 3, 2)
    c2 = VirtualConnectorCoordinator(rt, ns, 1, 2, 2)
    await c2.async_init()
    assert state(c2.read_state()) == (1, 3, 2)


async def test_connector_over_etcd(etcd_server, monkeypatch) -> None:
    monkeypatch.setenv("ETCD_ENDPOINTS", etcd_server.endpoint)
    ns = unique_ns()
    async with runtime("etcd") as rt:
        await connector_protocol(
            rt, ns, lambda: etcd_range(etcd_server.endpoint, f"v1/{ns}/planner/")
        )
    # The keys were the runtime's (its lease): gone with it, as in the reference (the
    # lease is revoked as the runtime stops, not before shutdown() returns).
    await wait_until(lambda: etcd_range(etcd_server.endpoint, f"v1/{ns}/planner/") == {}, 10)


async def test_connector_over_file_store(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path))
    async with runtime("file") as rt:
        await connector_protocol(rt, unique_ns())


async def test_bad_planner_value_is_a_value_error(etcd_server, monkeypatch) -> None:
    monkeypatch.setenv("ETCD_ENDPOINTS", etcd_server.endpoint)
    ns = unique_ns()
    body = json.dumps(
        {
            "key": base64.b64encode(f"v1/{ns}/planner/decision_id".encode()).decode(),
            "value": base64.b64encode(b"abc").decode(),
        }
    ).encode()
    urllib.request.urlopen(f"{etcd_server.endpoint}/v3/kv/put", body, timeout=5).read()
    async with runtime("etcd") as rt:
        c = VirtualConnectorCoordinator(rt, ns, 1, 1, 1)
        with pytest.raises(ValueError, match="invalid"):
            await c.async_init()


async def test_client_wait_raises_on_shutdown() -> None:
    async with runtime("mem") as rt:
        client = VirtualConnectorClient(rt, unique_ns())
        waiter = asyncio.ensure_future(client.wait())
        await asyncio.sleep(0.2)
        rt.shutdown()
        with pytest.raises(DynamoException):
            await asyncio.wait_for(waiter, 5)


async def test_metrics_callbacks_merge_into_a_valid_exposition(monkeypatch) -> None:
    port = free_port()
    monkeypatch.setenv("DYN_SYSTEM_PORT", str(port))
    monkeypatch.setenv("DYN_SYSTEM_HOST", "127.0.0.1")

    async def handler(request):
        yield {"ok": True}

    async with local_runtime("mem") as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        assert len(await collect(await client.round_robin({}, annotated=False))) == 1
        m = ep.metrics
        m.register_prometheus_expfmt_callback(
            lambda: "# HELP engine_gauge g\n# TYPE engine_gauge gauge\nengine_gauge 3\n"
        )
        m.register_prometheus_expfmt_callback(lambda: 1 / 0)
        m.register_prometheus_expfmt_callback(lambda: 42)  # type: ignore[arg-type,return-value]
        m.register_prometheus_expfmt_callback(lambda: None)  # type: ignore[arg-type,return-value]
        # Repeats a family the runtime exports, and one another callback exports.
        m.register_prometheus_expfmt_callback(
            lambda: (
                "# HELP dynamo_component_requests_total dup\n"
                "# TYPE dynamo_component_requests_total counter\n"
                'dynamo_component_requests_total{source="engine"} 7\n'
                '# TYPE engine_gauge gauge\nengine_gauge{x="1"} 4'
            )
        )
        with pytest.raises(TypeError):
            m.register_prometheus_expfmt_callback(5)  # type: ignore[arg-type]

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert r.status == 200
                return r.read().decode()

        for _ in range(2):  # every scrape calls the callbacks again
            text = await asyncio.to_thread(scrape)
            type_lines = [line for line in text.splitlines() if line.startswith("# TYPE ")]
            assert len(type_lines) == len(set(type_lines)), type_lines
            names = [line.split()[2] for line in type_lines]
            assert len(names) == len(set(names))
            families = {f.name: f for f in text_string_to_metric_families(text)}
            req = families["dynamo_component_requests"]
            assert req.type == "counter"
            assert {s.labels.get("source") for s in req.samples} >= {"engine", None}
            assert sorted(s.value for s in families["engine_gauge"].samples) == [3.0, 4.0]


async def test_multimodal_cache_publisher_needs_an_endpoint() -> None:
    async with local_runtime("mem") as rt:
        p = MultimodalEmbeddingCachePublisher()
        with pytest.raises(RuntimeError, match="not initialized"):
            p.publish_delta(["a"], [])
        await p.create_endpoint(rt.endpoint(f"{unique_ns()}.encoder.generate"))
        p.publish_delta(["k1", "k2"], [])
        p.publish_delta([], ["k1"])
        p.publish_delta(["k1"], ["k1"])  # cancels out: nothing sent


async def test_multimodal_cache_consumers_rebuild_who_holds_what(
    etcd_server, event_plane, monkeypatch
) -> None:
    monkeypatch.setenv("ETCD_ENDPOINTS", etcd_server.endpoint)
    ns = unique_ns()
    name = f"{ns}.encoder.generate"
    prefix = f"v1/mm_embedding_cache/{ns}/encoder/generate/"
    loop = asyncio.get_running_loop()
    # Two encode workers and a router, each its own runtime (lease, instance id).
    w1, w2, router = (DistributedRuntime(loop, "etcd", "tcp") for _ in range(3))
    try:
        p1 = MultimodalEmbeddingCachePublisher()
        await p1.create_endpoint(w1.endpoint(name))
        id1 = w1.endpoint(name).connection_id()
        early = await MultimodalEmbeddingCacheIndex.create(router.endpoint(name))
        assert early.keys(12345) is None
        await wait_until(lambda: early.keys(id1) == [], 10)  # the empty snapshot
        p1.publish_delta(["k1", "k2"], [])
        p1.publish_delta([], ["k1"])
        p1.publish_delta(["k3"], ["k3"])  # cancels out
        await wait_until(lambda: early.keys(id1) == ["k2"], 10)
        assert early.holders("k2") == [id1] and early.holders("k1") == []

        # What a late consumer finds in the store: the worker's full key set.
        def snapshot() -> dict:
            raw = etcd_range(etcd_server.endpoint, prefix).get(f"{prefix}{id1:x}")
            return json.loads(raw) if raw else {}

        await wait_until(lambda: snapshot().get("keys") == ["k2"], 10)
        snap = snapshot()
        assert snap["worker_id"] == id1 and snap["sequence"] >= 1

        # A consumer started now rebuilds the same view, then follows new deltas.
        late = await MultimodalEmbeddingCacheIndex.create(router.endpoint(name))
        await wait_until(lambda: late.keys(id1) == ["k2"], 10)
        p2 = MultimodalEmbeddingCachePublisher()
        await p2.create_endpoint(w2.endpoint(name))
        id2 = w2.endpoint(name).connection_id()
        p2.publish_delta(["k2", "k9"], [])
        p1.publish_delta(["k4"], [])
        for index in (early, late):
            await wait_until(lambda i=index: i.holders("k2") == sorted([id1, id2]), 10)
            await wait_until(lambda i=index: i.holders("k4") == [id1], 10)
        assert late.workers() == sorted([id1, id2])
        assert late.keys(id2) == ["k2", "k9"]

        # A stopped consumer keeps its last view and applies nothing more.
        early.shutdown()
        early.shutdown()
        p2.publish_delta(["k5"], [])
        await wait_until(lambda: late.holders("k5") == [id2], 10)
        assert early.holders("k5") == []

        # Worker 1 stops: its snapshot key goes with its lease and consumers forget it.
        w1.shutdown()
        await wait_until(lambda: late.workers() == [id2], 15)
        assert late.holders("k2") == [id2] and late.keys(id1) is None
        assert f"{prefix}{id1:x}" not in etcd_range(etcd_server.endpoint, prefix)
        late.shutdown()
    finally:
        for rt in (w1, w2, router):
            rt.shutdown()


class RawNatsSubscriber:
    """A minimal core-NATS subscriber on a socket (enough to read frames off the wire)."""

    def __init__(self, url: str, subject: str) -> None:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = b""
        assert self._line().startswith(b"INFO")
        self.sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false}\r\n'
            + f"SUB {subject} 1\r\n".encode()
            + b"PING\r\n"
        )
        assert self._line() == b"PONG"  # the server has the subscription

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "NATS connection closed"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def next_message(self) -> bytes:
        while True:
            line = self._line()
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            if line.startswith(b"MSG "):
                size = int(line.split()[-1])
                while len(self.buf) < size + 2:
                    chunk = self.sock.recv(65536)
                    assert chunk, "NATS connection closed"
                    self.buf += chunk
                payload, self.buf = self.buf[:size], self.buf[size + 2 :]
                return payload

    def close(self) -> None:
        self.sock.close()


async def test_multimodal_cache_delta_frames_on_the_wire(nats_server, monkeypatch) -> None:
    """What any consumer reads off NATS: one envelope per non-empty delta, numbered
    consecutively, carrying the reference's payload ``{worker_id, update: {added_keys,
    removed_keys}}``."""
    monkeypatch.setenv("DYN_EVENT_PLANE", "nats")
    monkeypatch.setenv("NATS_SERVER", nats_server.url)
    ns = unique_ns()
    subject = f"namespace.{ns}.component.encoder.endpoint.generate.multimodal_embedding_cache"
    wire = RawNatsSubscriber(nats_server.url, subject)
    try:
        async with local_runtime("mem") as rt:
            ep = rt.endpoint(f"{ns}.encoder.generate")
            p = MultimodalEmbeddingCachePublisher()
            await p.create_endpoint(ep)
            p.publish_delta(["k1", "k2"], [])
            p.publish_delta([], ["k1"])
            p.publish_delta(["k3"], ["k3"])  # cancels out: no frame
            p.publish_delta(["k4"], [])
            frames = [
                msgpack.unpackb(await asyncio.wait_for(asyncio.to_thread(wire.next_message), 10))
                for _ in range(3)
            ]
            worker_id = ep.connection_id()
    finally:
        wire.close()
    assert [f["topic"] for f in frames] == ["multimodal_embedding_cache"] * 3
    assert len({f["publisher_id"] for f in frames}) == 1
    first = frames[0]["sequence"]
    assert [f["sequence"] for f in frames] == [first, first + 1, first + 2]
    payloads = [msgpack.unpackb(f["payload"]) for f in frames]
    assert [list(d) for d in payloads] == [["worker_id", "update"]] * 3
    assert all(d["worker_id"] == worker_id for d in payloads)
    assert [d["update"] for d in payloads] == [
        {"added_keys": ["k1", "k2"], "removed_keys": []},
        {"added_keys": [], "removed_keys": ["k1"]},
        {"added_keys": ["k4"], "removed_keys": []},
    ]
