"""Replica sync and peer recovery of the standalone selection services, across real
processes on loopback: slot trackers and select services share their bookings over ZMQ
PUB/SUB (``--replica-sync-port`` / ``--replica-sync-peers``), a late starter catches up from
its peers' snapshots, a killed replica's bookings expire; a restarted indexer (``--peers``)
and a select service (``--indexer-peers``) load a peer's ``/dump`` at start-up. KV events come
from pyzmq PUB sockets in the engine wire format."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import zmq
from selection_util import BS, Service, frame, pub, stored, wait_for
from services import free_port
from test_selection_services_cli import TOKENS

from dynamo.llm import SelectionService

# Peers silent for this long are forgotten (heartbeats every TTL/6).
TTL = "1.5"


@pytest.fixture(autouse=True)
def short_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_ROUTER_REPLICA_SYNC_TTL_SECS", TTL)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def synced(module: str, port: int, peers: list[int], *args: str) -> Service:
    return Service(
        module,
        "--replica-sync-port",
        str(port),
        "--replica-sync-peers",
        ",".join(f"127.0.0.1:{p}" for p in peers),
        *args,
    )


def metric(svc: Service, line_start: str) -> float:
    m = svc.metrics()
    assert line_start in m, f"{line_start} not in /metrics: {sorted(m)}"
    return m[line_start]


def linked(svc: Service, prefix: str, n: int) -> bool:
    return metric(svc, f'{prefix}_replica_sync_peer_links{{state="connected"}}') == n


def stop_all(*svcs: Service | None) -> None:
    for s in svcs:
        if s is not None:
            s.stop()


# ---- slot trackers ---------------------------------------------------------------------

REG = {"model_name": "m", "block_size": BS, "dp_start": 0, "dp_size": 1}


def tracker_loads(svc: Service) -> dict[int, tuple[int, int]]:
    return {
        w["worker_id"]: (w["active_prefill_tokens"], w["active_decode_blocks"])
        for w in svc.call("GET", "/loads")[1]
    }


def register(svc: Service, *workers: int) -> None:
    for wid in workers:
        assert svc.call("POST", "/register", {"worker_id": wid, **REG})[0] == 201


def add(svc: Service, rid: str, wid: int, hashes: list[int]) -> None:
    body = {
        "model_name": "m",
        "request_id": rid,
        "worker_id": wid,
        "dp_rank": 0,
        "sequence_hashes": hashes,
        "isl_tokens": len(hashes) * BS,
    }
    assert svc.call("POST", "/add", body) == (200, {"status": "ok"})


def test_slot_trackers_share_bookings_catch_up_and_expire() -> None:
    pa, pb, pc = free_port(), free_port(), free_port()
    a = synced("dynamo.slot_tracker", pa, [pb, pc])
    b = synced("dynamo.slot_tracker", pb, [pa, pc])
    c = None
    try:
        register(a, 1, 2)
        register(b, 1, 2)
        wait_for(
            lambda: linked(a, "dynamo_slot_tracker", 1) and linked(b, "dynamo_slot_tracker", 1)
        )
        # A booking on a counts in b's loads and potential loads.
        add(a, "r1", 1, [1, 2])
        wait_for(lambda: tracker_loads(b)[1] == (8, 2))
        pl = b.call(
            "POST", "/potential_loads", {"model_name": "m", "sequence_hashes": [9], "isl_tokens": 4}
        )[1]
        assert {w["worker_id"]: w["potential_prefill_tokens"] for w in pl} == {1: 12, 2: 4}
        # Prefill completion and a booking made on b travel too.
        assert (
            a.call("POST", "/prefill_complete", {"model_name": "m", "request_id": "r1"})[0] == 200
        )
        wait_for(lambda: tracker_loads(b)[1] == (0, 2))
        add(b, "s1", 2, [5, 6])
        wait_for(lambda: tracker_loads(a)[2] == (8, 2))
        # A replica started late catches up from its peers' snapshots.
        c = synced("dynamo.slot_tracker", pc, [pa, pb])
        register(c, 1, 2)
        wait_for(lambda: tracker_loads(c) == {1: (0, 2), 2: (8, 2)})
        assert metric(c, "dynamo_slot_tracker_replica_sync_snapshots_received_total") >= 1
        # A free on a releases the load everywhere.
        assert a.call("POST", "/free", {"model_name": "m", "request_id": "r1"})[0] == 200
        wait_for(lambda: tracker_loads(b)[1] == (0, 0) and tracker_loads(c)[1] == (0, 0))
        # b is killed (no goodbye): its booking expires at its peers after the TTL.
        b.proc.kill()
        b.proc.wait(timeout=10)
        killed = time.monotonic()
        assert tracker_loads(a)[2] == (8, 2)
        wait_for(lambda: tracker_loads(a)[2] == (0, 0) and tracker_loads(c)[2] == (0, 0))
        assert time.monotonic() - killed >= float(TTL) * 0.5
        assert metric(a, "dynamo_slot_tracker_replica_sync_peers_expired_total") >= 1
    finally:
        stop_all(a, b, c)


def test_replica_sync_flags_are_checked() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "dynamo.slot_tracker", "--replica-sync-peers", "127.0.0.1:1"],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "--replica-sync-peers requires --replica-sync-port" in out.stderr.decode()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynamo.select_service",
            "--replica-sync-port",
            "1",
            "--replica-sync-peers",
            "nohost",
        ],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "has no port" in out.stderr.decode()


# ---- select services -------------------------------------------------------------------


def select_loads(svc: Service) -> dict[int, int]:
    groups = svc.call("GET", "/loads")[1]
    return {w["worker_id"]: w["active_requests"] for g in groups for w in g["loads"]}


def test_select_services_split_burst_spreads_like_one(ctx: zmq.Context) -> None:
    pubs = [pub(ctx) for _ in range(4)]
    pa, pb = free_port(), free_port()
    a = synced("dynamo.select_service", pa, [pb])
    b = synced("dynamo.select_service", pb, [pa])
    one = Service("dynamo.select_service")
    try:
        for svc in (a, b, one):
            for i, (_, ep) in enumerate(pubs):
                w = {
                    "worker_id": i + 1,
                    "model_name": "m",
                    "block_size": BS,
                    "endpoint": f"http://w{i + 1}",
                    "kv_events_endpoint": ep,
                }
                assert svc.call("POST", "/workers", w)[0] == 201
        for svc in (a, b, one):
            wait_for(lambda s=svc: s.call("GET", "/ready")[1]["schedulable_workers"] == 4)
        wait_for(
            lambda: linked(a, "dynamo_select_service", 1) and linked(b, "dynamo_select_service", 1)
        )
        # Identical prompts, no cached blocks: only booked load tells the workers apart, so
        # one service spreads them greedily; a split burst must spread the same way.
        n = 10
        split: Counter[int] = Counter()
        for i in range(n):
            svc, other = (a, b) if i % 2 == 0 else (b, a)
            body = {"model_name": "m", "token_ids": TOKENS, "selection_id": f"r{i}"}
            status, r = svc.call("POST", "/select_and_reserve", body)
            assert status == 200, r
            split[r["worker_id"]] += 1
            # The other replica sees the booking before the next request reaches it.
            wait_for(lambda o=other, k=i + 1: sum(select_loads(o).values()) == k)
        single: Counter[int] = Counter()
        for i in range(n):
            body = {"model_name": "m", "token_ids": TOKENS, "selection_id": f"r{i}"}
            single[one.call("POST", "/select_and_reserve", body)[1]["worker_id"]] += 1
        assert sorted(split.values()) == sorted(single.values()), (split, single)
        assert select_loads(a) == select_loads(b) == {w: split.get(w, 0) for w in (1, 2, 3, 4)}
        # Frees travel too.
        for i in range(n):
            svc = a if i % 2 == 0 else b
            assert svc.call("DELETE", f"/reservations/r{i}")[0] == 200
        wait_for(lambda: sum(select_loads(a).values()) == 0 and sum(select_loads(b).values()) == 0)
    finally:
        stop_all(a, b, one)


async def test_in_process_services_sync(ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_SELECTION_REPLICA_SYNC_HOST", "127.0.0.1")
    (_, ep) = pub(ctx)
    pa, pb = free_port(), free_port()
    a = SelectionService(replica_sync_port=pa, replica_sync_peers=[f"127.0.0.1:{pb}"])
    b = SelectionService(replica_sync_port=pb, replica_sync_peers=[f"tcp://127.0.0.1:{pa}"])
    try:
        w = {
            "worker_id": 1,
            "model_name": "m",
            "block_size": BS,
            "endpoint": "http://w1",
            "kv_events_endpoint": ep,
        }
        for svc in (a, b):
            assert (await svc.upsert_worker(w))["lifecycle"] == "schedulable"
        deadline = time.monotonic() + 10
        booked = 0
        # Until b's subscription is up, a's first booking may be missed; b then asks for a
        # snapshot, so the count converges either way.
        await a.select_and_reserve({"model_name": "m", "token_ids": TOKENS, "selection_id": "x"})
        while booked != 1:
            assert time.monotonic() < deadline, b.loads()
            booked = b.loads()[0]["loads"][0]["active_requests"]
            await asyncio.sleep(0.02)
        await a.free_reservation("x")
        while b.loads()[0]["loads"][0]["active_requests"] != 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    finally:
        a.shutdown()
        b.shutdown()


# ---- peer recovery ---------------------------------------------------------------------


def test_restarted_indexer_recovers_from_a_peer(ctx: zmq.Context) -> None:
    s0, ep0 = pub(ctx)
    a = Service("dynamo.indexer", "--block-size", str(BS), "--workers", f"1={ep0}")
    b = c = None
    query = {"token_ids": TOKENS, "model_name": "default"}
    try:
        seq = 0

        def indexed() -> bool:
            nonlocal seq
            s0.send_multipart(frame(seq, [stored([1, 2, 3], None, TOKENS[:12])]))
            seq += 1
            return a.call("POST", "/query", query)[1]["scores"] == {"1": {"0": 12}}

        wait_for(indexed)
        # No more events: b knows the blocks only from a's dump (the first peer is down).
        dead = free_port()
        b = Service(
            "dynamo.indexer",
            "--block-size",
            str(BS),
            "--workers",
            f"1={ep0}",
            "--peers",
            f"http://127.0.0.1:{dead},http://127.0.0.1:{a.port}",
        )
        wait_for(lambda: b.call("POST", "/query", query)[1]["scores"] == {"1": {"0": 12}})
        assert metric(b, 'dynamo_kvindexer_peer_recovery_total{outcome="unreachable"}') == 1
        assert metric(b, 'dynamo_kvindexer_peer_recovery_total{outcome="recovered"}') == 1
        assert metric(b, 'dynamo_kvindexer_peer_recovery_events_total{outcome="applied"}') >= 1
        # A select service recovering from the indexer: its worker registers after the dump
        # arrived, and gets its blocks then.
        c = Service("dynamo.select_service", "--indexer-peers", f"127.0.0.1:{a.port}")
        wait_for(
            lambda: metric(c, 'dynamo_select_service_peer_recovery_total{outcome="recovered"}') == 1
        )
        w = {
            "worker_id": 1,
            "model_name": "default",
            "block_size": BS,
            "endpoint": "http://w1",
            "kv_events_endpoint": ep0,
        }
        assert c.call("POST", "/workers", w)[0] == 201
        scores = c.call("POST", "/overlap_scores", {"model_name": "default", "token_ids": TOKENS})[
            1
        ]
        assert scores["workers"][0]["device_blocks"] == 3
    finally:
        stop_all(a, b, c)
