"""Forward-pass metrics: FpmDirectPublisher → event plane → FpmEventSubscriber (recv and
tracking modes), FpmEventRelay from a real ZMQ PUB socket, each on the brokerless TCP event
plane and over NATS; malformed payloads are counted and dropped in both modes; a mocker
worker publishes FPM under its instance id with the variance fields filled in."""

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

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    FpmDirectPublisher,
    FpmEventRelay,
    FpmEventSubscriber,
    MockEngineArgs,
    make_engine,
    run_input,
)

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


async def test_passes_nobody_hears_are_not_numbered() -> None:
    """On the brokerless plane a publisher with no subscriber drops its samples before
    encoding them: a subscriber that connects later sees the snapshots numbered from 1."""
    async with local_runtime("mem") as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        pub = FpmDirectPublisher(ep, "w1", 1)
        await asyncio.sleep(0.5)  # the event-plane publisher is set up by now
        for _ in range(20):
            pub.publish(dp_rank=0, **COUNTS)
        await asyncio.sleep(0.2)
        sub = FpmEventSubscriber(ep)
        first = await recv(sub)
        assert first is not None and first["counter_id"] == 1, first
        pub.publish(dp_rank=0, **COUNTS)
        m = await recv_until(sub, lambda x: x["wall_time"] > 0)
        assert m["counter_id"] > 1
        assert m["queued_requests"]["num_decode_requests"] == 9
        pub.shutdown()
        sub.shutdown()


async def test_direct_publisher_over_nats(nats_server, monkeypatch) -> None:
    monkeypatch.setenv("NATS_SERVER", nats_server.url)
    monkeypatch.setenv("DYN_EVENT_PLANE", "nats")
    await check_publish_and_heartbeat()


async def test_relay_forwards_zmq_and_survives_publisher_restart(event_plane, system_port) -> None:
    port = free_port()
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
                # Until a snapshot of `worker` arrives (earlier ones may still be queued).
                deadline = time.monotonic() + 20
                n = 0
                while time.monotonic() < deadline:
                    reader = asyncio.ensure_future(recv(sub, 10.0))
                    while not reader.done():
                        n += 1
                        sock.send_multipart([b"", n.to_bytes(8, "big"), snapshot(worker, 0, n)])
                        await asyncio.sleep(0.05)
                    m = reader.result()
                    assert m is not None
                    if m["worker_id"] == worker:
                        return m
                raise AssertionError(f"no snapshot of {worker} relayed")

            got.append(await pump("a"))
            assert got[0]["worker_id"] == "a"
            # Malformed payloads are dropped and counted; the subscriber keeps going.
            base = malformed(system_port)
            sock.send_multipart([b"", b"\x00" * 8, b"\xc1garbage"])
            sock.send_multipart([b"", b"\x00" * 8, msgpack.packb({"worker_id": "d"})])
            await wait_for(lambda: malformed(system_port) >= base + 2)
            # The engine restarts its socket on the same port: the relay re-dials.
            sock.close(linger=0)
            await asyncio.sleep(0.3)
            sock = ctx.socket(zmq.PUB)
            sock.bind(f"tcp://127.0.0.1:{port}")
            assert (await pump("b"))["worker_id"] == "b"
            relay.shutdown()
            relay.shutdown()
            sub.shutdown()
    finally:
        sock.close(linger=0)
        ctx.term()


def malformed(port: int) -> float:
    """``dynamo_fpm_malformed_payloads_total`` as the system status server reports it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "dynamo_fpm_malformed_payloads_total":
                return s.value
    return 0.0


async def test_tracking_keeps_latest_per_worker_rank_and_purges_on_card_removal(
    tmp_path, event_plane, system_port
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
        # Garbage on the channel (through a relay) is counted and dropped; tracking goes on.
        port = free_port()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUB)
        sock.bind(f"tcp://127.0.0.1:{port}")
        relay = FpmEventRelay(ep, f"tcp://127.0.0.1:{port}")
        try:
            base = malformed(system_port)
            deadline = time.monotonic() + 10
            while malformed(system_port) < base + 1:  # PUB drops until the relay connects
                assert time.monotonic() < deadline, "garbage never counted"
                sock.send_multipart([b"", b"\x00" * 8, b"\x93not-a-snapshot"])
                await asyncio.sleep(0.05)
        finally:
            relay.shutdown()
            sock.close(linger=0)
            ctx.term()

        def latest() -> dict:
            return msgpack.unpackb(sub.get_recent_stats()[(wid, 1)])

        before = latest()["counter_id"]
        known.publish(dp_rank=1, **{**COUNTS, "queued_num_decode_requests": 77})
        await wait_for(lambda: latest()["queued_requests"]["num_decode_requests"] == 77)
        assert latest()["counter_id"] > before
        await unregister_model(ep)
        await wait_for(lambda: not sub.get_model_cards())
        assert sub.get_recent_stats() == {}
        known.shutdown()
        stranger.shutdown()
        sub.shutdown()


async def test_recv_returns_none_when_the_runtime_stops(event_plane) -> None:
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    try:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        sub = FpmEventSubscriber(ep)
        pub = FpmDirectPublisher(ep, "w1", 1)
        pub.publish(dp_rank=0, **COUNTS)
        assert await recv(sub, 10) is not None  # recv mode is live
        pub.shutdown()

        def drain() -> int:
            n = 0
            while sub.recv() is not None:  # blocks until the runtime stops
                n += 1
            return n

        blocked = asyncio.ensure_future(asyncio.to_thread(drain))
        await asyncio.sleep(0.2)
        rt.shutdown()
        # Only what was already queued (at most a heartbeat or two), then None.
        assert await asyncio.wait_for(blocked, 10) < 5
        assert sub.recv() is None
    finally:
        rt.shutdown()


async def test_mocker_worker_publishes_fpm_with_its_instance_id_and_variances(
    tmp_path,
) -> None:
    from dynamo.llm.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    serving = None
    try:
        name = f"{unique_ns()}.backend.generate"
        args = EntrypointArgs(
            EngineType.Mocker,
            model_path=str(model),
            model_name="tiny",
            mocker_engine_args=MockEngineArgs(max_num_seqs=8),
        )
        engine = await make_engine(rt, args)
        serving = asyncio.ensure_future(run_input(rt, f"dyn://{name}", engine))
        ep = rt.endpoint(name)
        client = await ep.client()
        await asyncio.wait_for(client.wait_for_instances(), 30)
        (instance_id,) = client.instance_ids()
        sub = FpmEventSubscriber(ep)
        seen: list[dict] = []

        def varied() -> bool:
            return any(m["scheduled_requests"]["var_prefill_length"] > 0 for m in seen) and any(
                m["scheduled_requests"]["var_decode_kv_tokens"] > 0 for m in seen
            )

        def collect_until_varied() -> None:
            # Bounded by the load loop below: a timeout there stops the runtime, which
            # ends this recv with None.
            while (raw := sub.recv()) is not None:
                seen.append(msgpack.unpackb(raw))
                if varied():
                    return

        reader = asyncio.ensure_future(asyncio.to_thread(collect_until_varied))

        async def one(length: int) -> None:
            request = {
                "model": "tiny",
                "token_ids": [(length + k) % 50 + 3 for k in range(length)],
                "stop_conditions": {"max_tokens": 24, "ignore_eos": True},
            }
            async for _ in await client.round_robin(request, annotated=False):
                pass

        # Concurrent requests of different prompt lengths: batches of unequal lengths.
        deadline = time.monotonic() + 60
        while not reader.done():
            assert time.monotonic() < deadline, "no batch of unequal lengths seen"
            await asyncio.gather(*(one(n) for n in (8, 40, 72, 104, 136, 168)))
        await reader
        sub.shutdown()
        busy = [m for m in seen if m["wall_time"] > 0]
        # The worker id is the instance id (decimal), as planners expect.
        assert {m["worker_id"] for m in seen} == {str(instance_id)}
        assert {m["dp_rank"] for m in seen} == {0}
        assert any(m["scheduled_requests"]["var_prefill_length"] > 0 for m in busy)
        assert any(m["scheduled_requests"]["var_decode_kv_tokens"] > 0 for m in busy)
        assert any(m["scheduled_requests"]["num_decode_requests"] > 1 for m in busy)
    finally:
        rt.shutdown()
        if serving is not None:
            await asyncio.wait_for(asyncio.gather(serving, return_exceptions=True), 15)
