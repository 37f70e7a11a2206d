"""Forward-pass metrics: FpmDirectPublisher → event plane → FpmEventSubscriber (recv and
tracking modes), FpmEventRelay from a real ZMQ PUB socket, on the brokerless TCP event plane
and over NATS; malformed payloads are counted and dropped."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from runtime_util import local_runtime, unique_ns
from services import free_port

from dynamo._core import FpmDirectPublisher, FpmEventRelay, FpmEventSubscriber

COUNTS = dict(
    scheduled_num_prefill_requests=2,
    scheduled_sum_prefill_tokens=300,
    scheduled_sum_prefill_kv_tokens=400,
    scheduled_num_decode_requests=5,
    scheduled_sum_decode_kv_tokens=600,
    queued_num_prefill_requests=7,
    queued_sum_prefill_tokens=800,
    queued_num_decode_requests=9,
    queued_sum_decode_kv_tokens=1000,
    wall_time_secs=0.025,
)


def snapshot(worker: str, rank: int, n: int) -> bytes:
    zero = {"num_prefill_requests": n, "sum_prefill_tokens": 0, "var_prefill_length": 0.0}
    return msgpack.packb(
        {
            "version": 1,
            "worker_id": worker,
            "dp_rank": rank,
            "counter_id": n,
            "wall_time": 0.01,
            "scheduled_requests": {
                **zero,
                "sum_prefill_kv_tokens": 0,
                "num_decode_requests": 0,
                "sum_decode_kv_tokens": 0,
                "var_decode_kv_tokens": 0.0,
            },
            "queued_requests": {
                **zero,
                "num_decode_requests": 0,
                "sum_decode_kv_tokens": 0,
                "var_decode_kv_tokens": 0.0,
            },
        }
    )


async def recv(sub: FpmEventSubscriber, timeout: float = 5.0) -> dict | None:
    raw = await asyncio.wait_for(asyncio.to_thread(sub.recv), timeout)
    return None if raw is None else msgpack.unpackb(raw)


async def recv_until(sub, pred, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = await recv(sub, max(0.1, deadline - time.monotonic()))
        assert m is not None
        if pred(m):
            return m


async def wait_for(pred, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def check_publish_and_heartbeat() -> None:
    async with local_runtime("mem") as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        sub = FpmEventSubscriber(ep)
        pub = FpmDirectPublisher(ep, "w1", 2)
        first = await recv(sub)  # starts recv mode; the first thing is rank heartbeats
        assert first is not None
        start = time.monotonic()
        pub.publish(dp_rank=1, **COUNTS, scheduled_prefill_lengths=[100, 200])
        m = await recv_until(sub, lambda m: m["dp_rank"] == 1 and m["wall_time"] > 0)
        assert list(m) == [
            "version",
            "worker_id",
            "dp_rank",
            "counter_id",
            "wall_time",
            "scheduled_requests",
            "queued_requests",
        ]
        assert m["worker_id"] == "w1" and m["version"] == 1
        assert m["scheduled_requests"]["sum_prefill_kv_tokens"] == 400
        assert m["queued_requests"]["num_decode_requests"] == 9
        # Welford over the given lengths (population variance of 100, 200).
        assert m["scheduled_requests"]["var_prefill_length"] == 2500.0
        assert m["scheduled_requests"]["var_decode_kv_tokens"] == 0.0
        # About 1 s later rank 1 sends a zeroed heartbeat with the next counter.
        hb = await recv_until(
            sub, lambda x: x["dp_rank"] == 1 and x["counter_id"] > m["counter_id"]
        )
        waited = time.monotonic() - start
        assert 0.8 < waited < 2.0, waited
        assert hb["wall_time"] == 0.0 and hb["scheduled_requests"]["num_prefill_requests"] == 0
        with pytest.raises(ValueError):
            pub.publish(dp_rank=2, **COUNTS)
        with pytest.raises(ValueError):
            pub.publish(dp_rank=0, **{**COUNTS, "queued_num_decode_requests": -1})
        with pytest.raises(ValueError):
            pub.publish(dp_rank=0, **{**COUNTS, "wall_time_secs": float("nan")})
        with pytest.raises(TypeError):
            pub.publish(0, **COUNTS)  # type: ignore[misc]
        with pytest.raises(RuntimeError):
            sub.start_tracking()
        pub.shutdown()
        pub.shutdown()
        pub.publish(dp_rank=0, **COUNTS)  # ignored after shutdown, as the reference
        sub.shutdown()
        assert await recv(sub) is None


async def test_direct_publisher_over_tcp_event_plane() -> None:
    await check_publish_and_heartbeat()


async def test_direct_publisher_over_nats(nats_server, monkeypatch) -> None:
    monkeypatch.setenv("NATS_SERVER", nats_server.url)
    monkeypatch.setenv("DYN_EVENT_PLANE", "nats")
    await check_publish_and_heartbeat()


async def test_relay_forwards_zmq_and_survives_publisher_restart(monkeypatch) -> None:
    port = free_port()
    monkeypatch.setenv("DYN_SYSTEM_PORT", str(free_port()))
    monkeypatch.setenv("DYN_SYSTEM_HOST", "127.0.0.1")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.bind(f"tcp://127.0.0.1:{port}")
    try:
        async with local_runtime("mem") as rt:
            ep = rt.endpoint(f"{unique_ns()}.backend.generate")
            relay = FpmEventRelay(ep, f"tcp://127.0.0.1:{port}")
            sub = FpmEventSubscriber(ep)
            # PUB drops until the relay's SUB is connected: keep sending until one arrives.
            got: list[dict] = []

            async def pump(worker: str) -> dict:
                reader = asyncio.ensure_future(recv(sub, 10.0))
                n = 0
                while not reader.done():
                    n += 1
                    sock.send_multipart([b"", n.to_bytes(8, "big"), snapshot(worker, 0, n)])
                    await asyncio.sleep(0.05)
                m = reader.result()
                assert m is not None
                return m

            got.append(await pump("a"))
            assert got[0]["worker_id"] == "a"
            # Malformed payloads are dropped and counted; the subscriber keeps going.
            base = malformed(rt)
            sock.send_multipart([b"", b"\x00" * 8, b"\xc1garbage"])
            sock.send_multipart([b"", b"\x00" * 8, msgpack.packb({"worker_id": "d"})])
            await wait_for(lambda: malformed(rt) >= base + 2)
            # The engine restarts its socket on the same port: the relay re-dials.
            sock.close(linger=0)
            await asyncio.sleep(0.3)
            sock = ctx.socket(zmq.PUB)
            sock.bind(f"tcp://127.0.0.1:{port}")
            m = await pump("b")
            while m["worker_id"] != "b":
                m = await recv(sub)
                assert m is not None
            relay.shutdown()
            relay.shutdown()
            sub.shutdown()
    finally:
        sock.close(linger=0)
        ctx.term()


def malformed(rt) -> float:
    import os

    port = int(os.environ["DYN_SYSTEM_PORT"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "dynamo_fpm_malformed_payloads_total":
                return s.value
    return 0.0


async def test_tracking_keeps_latest_per_worker_rank_and_purges_on_card_removal(
    tmp_path,
) -> None:
    from dynamo.llm import ModelInput, ModelType, register_model, unregister_model
    from dynamo.llm.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    async with local_runtime("mem") as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.backend.generate")
        sub = FpmEventSubscriber(ep)
        with pytest.raises(RuntimeError):
            sub.get_recent_stats()
        with pytest.raises(RuntimeError):
            sub.get_model_cards()
        sub.start_tracking()
        with pytest.raises(RuntimeError):
            sub.start_tracking()
        with pytest.raises(RuntimeError):
            sub.recv()
        wid = str(ep.connection_id())
        await register_model(ModelInput.Tokens, ModelType.Chat, ep, str(model), "tiny")
        cards = await wait_for(sub.get_model_cards)
        assert list(cards) == [wid] and json.loads(cards[wid])
        known = FpmDirectPublisher(ep, wid, 2)
        stranger = FpmDirectPublisher(ep, "42", 1)  # no model card: not tracked
        known.publish(dp_rank=1, **COUNTS)
        await wait_for(lambda: len(sub.get_recent_stats()) == 2)
        stats = sub.get_recent_stats()
        assert set(stats) == {(wid, 0), (wid, 1)}
        assert msgpack.unpackb(stats[(wid, 1)])["worker_id"] == wid
        await unregister_model(ep)
        await wait_for(lambda: not sub.get_model_cards())
        assert sub.get_recent_stats() == {}
        known.shutdown()
        stranger.shutdown()
        sub.shutdown()
