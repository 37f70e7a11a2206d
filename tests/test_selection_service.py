"""In-process ``SelectionService``: catalog records, readiness, KV-aware selection from real
ZMQ PUB sockets (pyzmq, vLLM's msgpack wire format on loopback), reservations and the
pending-selection cache. Shapes and messages are those observed on the reference
(scripts/observe_selection_reference.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgpack
import pytest
import zmq
from selection_util import BS, Pub, eventually, stored
from services import free_port

from dynamo.llm import SelectionCacheConfig, SelectionService
from dynamo.llm.exceptions import SelectionServiceError

TOKENS = list(range(20))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def worker(wid: int, pub: Pub | str, **extra: object) -> dict:
    ep = pub if isinstance(pub, str) else pub.endpoint
    return {
        "worker_id": wid,
        "model_name": "m",
        "block_size": BS,
        "endpoint": f"http://w{wid}",
        "kv_events_endpoint": ep,
        **extra,
    }


async def publish_until(svc: SelectionService, pub: Pub, events: list, wid: int, blocks: int):
    """PUB drops messages until the subscription arrives: repeat the (idempotent) stores
    until the service scores ``blocks`` blocks for ``wid``."""

    async def seen() -> bool:
        pub.send(events)
        scores = await svc.overlap_scores({"model_name": "m", "token_ids": TOKENS})
        return any(
            w["worker_id"] == wid and w["device_blocks"] == blocks for w in scores["workers"]
        )

    await eventually(seen)


async def test_records_say_exactly_what_is_missing(ctx: zmq.Context) -> None:
    svc = SelectionService()
    with pytest.raises(ValueError, match="worker_id"):
        await svc.upsert_worker({})
    with pytest.raises(ValueError, match="worker_id"):
        await svc.upsert_worker({"worker_id": "x"})
    rec = await svc.upsert_worker({"worker_id": 1})
    assert rec["lifecycle"] == "incomplete"
    assert (rec["model_name"], rec["routing_group"], rec["taints"]) == ("default", "default", [])
    assert rec["not_schedulable_reasons"] == [
        "endpoint is required",
        "block_size must be greater than 0",
        "kv_events endpoint is required for dp_rank 0",
    ]
    rec = await svc.upsert_worker({"worker_id": 2, "block_size": 16})
    assert rec["not_schedulable_reasons"] == [
        "endpoint is required",
        "kv_events endpoint is required for dp_rank 0",
    ]
    rec = await svc.upsert_worker(worker(3, "garbage"))
    assert rec["not_schedulable_reasons"] == [
        "invalid kv_events endpoint for worker 3 dp_rank 0: "
        "invalid ZMQ endpoint `garbage`: missing scheme"
    ]
    rec = await svc.upsert_worker(worker(4, "tcp://127.0.0.1:5557", data_parallel_size=2))
    assert rec["not_schedulable_reasons"] == [
        "kv_events endpoint is required for dp_rank 0",
        "kv_events endpoint is required for dp_rank 1",
    ]
    pubs = [Pub(ctx), Pub(ctx)]
    rec = await svc.upsert_worker(
        {
            **worker(5, pubs[0]),
            "kv_events_endpoint": None,
            "kv_events_endpoints": {0: pubs[0].endpoint, 1: pubs[1].endpoint},
            "data_parallel_size": 2,
            "taints": ["a"],
        }
    )
    assert rec["lifecycle"] == "schedulable"
    assert "not_schedulable_reasons" not in rec
    assert rec["kv_events_endpoints"] == {"0": pubs[0].endpoint, "1": pubs[1].endpoint}
    assert [w["worker_id"] for w in svc.list_workers()] == [1, 2, 3, 4, 5]
    assert [w["worker_id"] for w in svc.list_workers(model_name="m")] == [3, 4, 5]
    assert svc.list_workers(routing_group="zzz") == []
    ready = svc.ready()
    assert (ready["ready"], ready["schedulable_workers"]) == (True, 1)
    # An upsert replaces the registration: fields left out are cleared.
    rec = await svc.upsert_worker({"worker_id": 5, "model_name": "m"})
    assert rec["lifecycle"] == "incomplete" and rec["taints"] == []
    gone = await svc.delete_worker(5)
    assert gone["lifecycle"] == "unschedulable"
    with pytest.raises(SelectionServiceError) as e:
        await svc.delete_worker(5)
    assert (e.value.kind, e.value.status_code) == ("not_found", 404)
    svc.shutdown()


async def test_select_before_ready_is_not_ready(ctx: zmq.Context) -> None:
    svc = SelectionService()
    assert svc.ready() == {"ready": False, "schedulable_workers": 0, "workers": []}
    assert svc.loads() == []
    with pytest.raises(SelectionServiceError) as e:
        await svc.select({"model_name": "m", "token_ids": TOKENS})
    assert (e.value.kind, e.value.status_code) == ("not_ready", 503)
    assert "no schedulable workers for model=m routing_group=default" in str(e.value)
    pub = Pub(ctx)
    await svc.upsert_worker(worker(1, pub))
    out = await svc.select({"model_name": "m", "token_ids": TOKENS})
    assert out["worker_id"] == 1 and "selection_id" not in out
    with pytest.raises(SelectionServiceError) as e:
        await svc.select({"model_name": "m", "token_ids": TOKENS, "routing_group": "x"})
    assert e.value.kind == "not_ready"
    svc.shutdown()
    svc.shutdown()
    with pytest.raises(SelectionServiceError, match="shutting down") as e:
        await svc.select({"model_name": "m", "token_ids": TOKENS})
    assert e.value.status_code == 503
    assert svc.ready()["ready"] is False


async def test_kv_events_from_zmq_steer_selection(ctx: zmq.Context) -> None:
    svc = SelectionService()
    pubs = [Pub(ctx), Pub(ctx)]
    for i, p in enumerate(pubs, start=1):
        await svc.upsert_worker(worker(i, p))
    # Worker 2 caches the first three blocks of the prompt (a chain in two messages).
    await publish_until(svc, pubs[1], [stored([101, 102], None, TOKENS[:8])], 2, 2)
    await publish_until(svc, pubs[1], [stored([103], 102, TOKENS[8:12])], 2, 3)
    for _ in range(5):
        out = await svc.select({"model_name": "m", "token_ids": TOKENS})
        assert (out["worker_id"], out["dp_rank"], out["endpoint"]) == (2, 0, "http://w2")
        # Overlaps are reported in tokens, as the reference does.
        assert out["overlap"] == {
            "longest_matched": 12,
            "gpu": 12,
            "dp": {"0": 12},
            "cpu": 12,
            "disk": 12,
        }
        assert (out["effective_prefill_tokens"], out["potential_decode_blocks"]) == (8, 5)
        assert out["block_size"] == BS
    scores = await svc.overlap_scores({"model_name": "m", "token_ids": TOKENS})
    assert (scores["block_size"], scores["num_blocks"]) == (BS, 5)
    assert [(w["worker_id"], w["device_blocks"]) for w in scores["workers"]] == [(1, 0), (2, 3)]
    assert scores["shared_cache"] == {
        "enabled": False,
        "total_hit_blocks": 0,
        "ranges": [],
        "error": None,
    }
    # Removing the middle block cuts worker 2's prefix to one block.
    pubs[1].send([["BlockRemoved", [102], "GPU"]])

    async def cut() -> bool:
        s = await svc.overlap_scores({"model_name": "m", "token_ids": TOKENS})
        return [w["device_blocks"] for w in s["workers"]] == [0, 1]

    await eventually(cut)
    # Clearing drops the rest.
    pubs[1].send([["AllBlocksCleared"]])

    async def cleared() -> bool:
        s = await svc.overlap_scores({"model_name": "m", "token_ids": TOKENS})
        return [w["device_blocks"] for w in s["workers"]] == [0, 0]

    await eventually(cleared)
    svc.shutdown()


async def test_malformed_frames_are_skipped(ctx: zmq.Context) -> None:
    svc = SelectionService()
    pub = Pub(ctx)
    await svc.upsert_worker(worker(1, pub))
    # Garbage payloads, a bad sequence frame and an unknown event type: none stops the
    # subscriber, and the next good message is applied.
    for _ in range(20):
        pub.send_raw([b"", (0).to_bytes(8, "big"), b"\xc1not msgpack"])
        pub.send_raw([b"", b"\x01", msgpack.packb([0.0, [], 0])])
        pub.send([["Bogus", 1]])
        await asyncio.sleep(0.01)
    await publish_until(svc, pub, [stored([1, 2], None, TOKENS[:8])], 1, 2)
    svc.shutdown()


async def test_unreachable_publisher_is_reported_and_recovers(ctx: zmq.Context) -> None:
    svc = SelectionService()
    port = free_port()
    rec = await svc.upsert_worker(worker(1, f"tcp://127.0.0.1:{port}"))
    assert rec["lifecycle"] == "unschedulable"
    (reason,) = rec["not_schedulable_reasons"]
    assert reason.startswith(f"kv_events endpoint tcp://127.0.0.1:{port} for dp_rank 0")
    assert "unreachable" in reason
    assert svc.ready()["ready"] is False
    with pytest.raises(SelectionServiceError) as e:
        await svc.select({"model_name": "m", "token_ids": TOKENS})
    assert e.value.kind == "not_ready"
    # The publisher comes up: the listener reconnects (backoff at most 2 s).
    pub = Pub(ctx, port)
    await eventually(lambda: svc.list_workers()[0]["lifecycle"] == "schedulable", timeout=15)
    await publish_until(svc, pub, [stored([1], None, TOKENS[:4])], 1, 1)
    assert (await svc.select({"model_name": "m", "token_ids": TOKENS}))["worker_id"] == 1
    svc.shutdown()


async def test_reservation_lifecycle_books_and_frees_load(ctx: zmq.Context) -> None:
    svc = SelectionService()
    pubs = [Pub(ctx), Pub(ctx)]
    for i, p in enumerate(pubs, start=1):
        await svc.upsert_worker(worker(i, p))
    m = {"model_name": "m"}
    sel = await svc.select({**m, "token_ids": TOKENS, "selection_id": "s1"})
    assert sel["selection_id"] == "s1"
    assert all(w["active_requests"] == 0 for w in svc.loads()[0]["loads"])
    # Replay needs the same model/group.
    with pytest.raises(SelectionServiceError) as e:
        await svc.create_reservation({"selection_id": "s1"})
    assert (e.value.kind, e.value.status_code) == ("not_found", 404)
    assert "expired, already used, or never selected" in str(e.value)
    res = await svc.create_reservation({"selection_id": "s1", **m})
    assert res == {
        "selection_id": "s1",
        "model_name": "m",
        "routing_group": "default",
        "worker_id": sel["worker_id"],
        "dp_rank": 0,
        "endpoint": sel["endpoint"],
    }
    (group,) = svc.loads()
    assert (group["model_name"], group["pending_count"], group["pending_isl_tokens"]) == ("m", 0, 0)
    booked = next(w for w in group["loads"] if w["worker_id"] == sel["worker_id"])
    assert booked == {
        "worker_id": sel["worker_id"],
        "dp_rank": 0,
        "potential_prefill_tokens": 20,
        "potential_decode_blocks": 5,
        "active_requests": 1,
    }
    with pytest.raises(SelectionServiceError) as e:
        await svc.create_reservation({"selection_id": "s1", **m})
    assert (e.value.kind, e.value.status_code) == ("conflict", 409)
    assert await svc.prefill_complete("s1") is None
    booked = next(w for w in svc.loads()[0]["loads"] if w["worker_id"] == sel["worker_id"])
    assert (booked["potential_prefill_tokens"], booked["active_requests"]) == (0, 1)
    svc.add_output_block("s1")
    svc.add_output_block("s1", decay_fraction=0.5)
    with pytest.raises(ValueError, match=r"decay_fraction must be between 0\.0 and 1\.0"):
        svc.add_output_block("s1", decay_fraction=2.0)
    assert await svc.free_reservation("s1") is None
    assert all(w["active_requests"] == 0 for w in svc.loads()[0]["loads"])
    for call in (svc.free_reservation, svc.prefill_complete):
        with pytest.raises(SelectionServiceError, match="reservation s1 not found") as e:
            await call("s1")
        assert e.value.status_code == 404
    with pytest.raises(SelectionServiceError, match="reservation nope not found"):
        svc.add_output_block("nope")
    # select_and_reserve books at once; a fresh UUID when no id is given.
    sar = await svc.select_and_reserve({**m, "token_ids": TOKENS})
    assert len(sar["selection_id"]) == 36 and sar["selection_id"].count("-") == 4
    assert (sar["isl_tokens"], sar["track_prefill_tokens"], len(sar["sequence_hashes"])) == (
        20,
        True,
        5,
    )
    # Sequence hashes are reported signed (the reference's values for tokens 0..19, bs 4).
    assert sar["sequence_hashes"][:2] == [9143094415614847814, -8936425687869117083]
    await svc.select_and_reserve({**m, "token_ids": TOKENS, "selection_id": "mine"})
    with pytest.raises(SelectionServiceError, match="already reserved") as e:
        await svc.select_and_reserve({**m, "token_ids": TOKENS, "selection_id": "mine"})
    assert e.value.kind == "conflict"
    # Explicit booking on a worker, and on one that is not there.
    res = await svc.create_reservation(
        {"selection_id": "e1", "worker_id": 2, **m, "token_ids": TOKENS}
    )
    assert (res["worker_id"], res["endpoint"]) == (2, "http://w2")
    with pytest.raises(SelectionServiceError) as e:
        await svc.create_reservation(
            {"selection_id": "e2", "worker_id": 99, **m, "token_ids": TOKENS}
        )
    assert (e.value.kind, str(e.value)) == (
        "not_found",
        "schedulable worker 99 not found for model=m routing_group=default",
    )
    total = sum(w["active_requests"] for w in svc.loads(model_name="m")[0]["loads"])
    assert total == 3
    pot = await svc.potential_loads({**m, "token_ids": TOKENS})
    assert sorted(w["worker_id"] for w in pot) == [1, 2]
    assert all(w["potential_prefill_tokens"] >= 20 for w in pot)
    svc.shutdown()


async def test_prompts_given_as_hashes() -> None:
    ctx = zmq.Context()
    try:
        svc = SelectionService()
        pub = Pub(ctx)
        await svc.upsert_worker(worker(1, pub))
        with pytest.raises(ValueError, match="block_hashes is required without token_ids"):
            await svc.select({"model_name": "m"})
        with pytest.raises(ValueError, match="sequence_hashes is required without token_ids"):
            await svc.select({"model_name": "m", "block_hashes": [1, 2]})
        out = await svc.select(
            {
                "model_name": "m",
                "block_hashes": [1, -2, 3],
                "sequence_hashes": [4, 5, 6],
                "isl_tokens": 12,
            }
        )
        assert (out["effective_prefill_tokens"], out["potential_decode_blocks"]) == (12, 3)
        svc.shutdown()
    finally:
        ctx.destroy(linger=0)


async def test_malformed_requests_name_the_field(ctx: zmq.Context) -> None:
    svc = SelectionService()
    await svc.upsert_worker(worker(1, Pub(ctx)))
    with pytest.raises(ValueError, match="token_ids"):
        await svc.select({"model_name": "m", "token_ids": "x"})
    with pytest.raises(ValueError, match="token_ids"):
        await svc.select({"model_name": "m", "token_ids": [-1]})
    with pytest.raises(ValueError, match="request must be a dict, got list"):
        await svc.select([1])
    with pytest.raises(ValueError, match="selection_id"):
        await svc.create_reservation({})
    with pytest.raises(ValueError, match="router_config_override"):
        await svc.select(
            {"model_name": "m", "token_ids": TOKENS, "router_config_override": {"bogus": 1}}
        )
    with pytest.raises(ValueError, match="block_size"):
        await svc.upsert_worker({"worker_id": 1, "block_size": -1})
    svc.shutdown()


async def test_selection_cache_limits_are_enforced(ctx: zmq.Context) -> None:
    pub = Pub(ctx)
    m = {"model_name": "m"}

    async def service(**cfg: object) -> SelectionService:
        svc = SelectionService(selection_cache=SelectionCacheConfig(**cfg))
        await svc.upsert_worker(worker(1, pub))
        return svc

    # max_entries: the oldest selections go first.
    svc = await service(max_entries=2)
    for k in range(4):
        await svc.select({**m, "token_ids": TOKENS, "selection_id": f"c{k}"})
    for k in (0, 1):
        with pytest.raises(SelectionServiceError, match="no pending selection"):
            await svc.create_reservation({"selection_id": f"c{k}", **m})
    for k in (2, 3):
        assert (await svc.create_reservation({"selection_id": f"c{k}", **m}))["worker_id"] == 1
    svc.shutdown()
    # ttl_secs: an unclaimed selection expires.
    svc = await service(ttl_secs=0.2)
    await svc.select({**m, "token_ids": TOKENS, "selection_id": "t"})
    await asyncio.sleep(0.4)
    with pytest.raises(SelectionServiceError, match="no pending selection t"):
        await svc.create_reservation({"selection_id": "t", **m})
    svc.shutdown()
    # max_bytes: a selection larger than the budget is not kept; small ones are.
    svc = await service(max_bytes=400)
    await svc.select({**m, "token_ids": list(range(400)), "selection_id": "big"})
    await svc.select({**m, "token_ids": list(range(8)), "selection_id": "small"})
    with pytest.raises(SelectionServiceError, match="no pending selection big"):
        await svc.create_reservation({"selection_id": "big", **m})
    assert (await svc.create_reservation({"selection_id": "small", **m}))["worker_id"] == 1
    svc.shutdown()
    with pytest.raises(ValueError, match="ttl_secs"):
        SelectionCacheConfig(ttl_secs=-1)


def test_constructor_options() -> None:
    with pytest.raises(ValueError, match="replica_sync_peers requires replica_sync_port"):
        SelectionService(replica_sync_peers=["tcp://127.0.0.1:1"])
    with pytest.raises(ValueError, match="has no port"):
        SelectionService(indexer_peers=["http://h"])
    with pytest.raises(ValueError, match="only http:// and https://"):
        SelectionService(indexer_peers=["ftp://127.0.0.1:8090"])
    with pytest.raises(ValueError, match="session_affinity_ttl_secs is not supported yet"):
        SelectionService(session_affinity_ttl_secs=5)
    SelectionService(indexer_threads=1).shutdown()
