"""``SelectionService.add_output_block(decay_fraction=)`` and the ``DYN_ROUTER_*`` environment.

Reference 1.6.1 (``scripts/observe_selection_decay_reference.py``): output blocks count in
``loads()`` whatever ``router_track_output_blocks`` says; ``decay_fraction=f`` weighs every
block held only by the reservation by ``f`` (shared blocks keep their weight, a block keeps
its weight until released) and the per-rank sum is rounded: 4 prompt blocks, then output
blocks with decays None, None, 0.5, 0.5, 0.0, 1.0, 0.25 give 5, 6, 4, 4, 0, 10, 3; a second
reservation of the same prompt 3; its output block at 0.5 3; freeing the first 2, the
second 0. The service's router configuration comes from ``DYN_ROUTER_*``:
``DYN_ROUTER_TEMPERATURE=50`` spreads picks that go all to the idle worker at 0, and
``DYN_ROUTER_TRACK_PREFILL_TOKENS=false`` (or ``0``) makes reservations book no prefill
tokens (``track_prefill_tokens: false``). Bad values: the reference ignores one it cannot
parse and raises a bare ``Exception`` for one out of range; ours raises ``ValueError``
naming the variable for both.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq
from selection_util import Pub, eventually
from test_selection_service import worker

from dynamo.llm import SelectionService


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


async def _schedulable(ctx: zmq.Context, n: int) -> tuple[SelectionService, list[Pub]]:
    svc = SelectionService()
    pubs = [Pub(ctx) for _ in range(n)]
    for i, pub in enumerate(pubs):
        await svc.upsert_worker(worker(i + 1, pub))

    async def ready() -> bool:
        recs = svc.list_workers(model_name="m")
        return len(recs) == n and all(r["lifecycle"] == "schedulable" for r in recs)

    await eventually(ready)
    return svc, pubs


def _decode_blocks(svc: SelectionService, wid: int) -> int:
    (group,) = svc.loads(model_name="m")
    (load,) = [x for x in group["loads"] if x["worker_id"] == wid]
    return load["potential_decode_blocks"]


async def test_output_blocks_decay_as_the_reference(ctx: zmq.Context) -> None:
    svc, _ = await _schedulable(ctx, 1)
    try:
        r = await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(16)), "selection_id": "a"}
        )
        assert r["worker_id"] == 1 and _decode_blocks(svc, 1) == 4
        await svc.prefill_complete("a")
        seen = []
        for d in [None, None, 0.5, 0.5, 0.0, 1.0, 0.25]:
            if d is None:
                svc.add_output_block("a")
            else:
                svc.add_output_block("a", decay_fraction=d)
            seen.append(_decode_blocks(svc, 1))
        assert seen == [5, 6, 4, 4, 0, 10, 3]
        await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(16)), "selection_id": "b"}
        )
        assert _decode_blocks(svc, 1) == 3
        svc.add_output_block("b", decay_fraction=0.5)
        assert _decode_blocks(svc, 1) == 3
        await svc.free_reservation("a")
        assert _decode_blocks(svc, 1) == 2
        await svc.free_reservation("b")
        assert _decode_blocks(svc, 1) == 0

        for bad in (-0.1, 1.5, float("nan")):
            with pytest.raises(ValueError, match=r"decay_fraction must be between 0\.0 and 1\.0"):
                svc.add_output_block("b", decay_fraction=bad)
    finally:
        svc.shutdown()


async def test_decayed_load_steers_selection(ctx: zmq.Context) -> None:
    """A decayed reservation weighs less: the next prompt goes to the worker it is on."""
    svc, _ = await _schedulable(ctx, 2)
    try:
        a = await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(400)), "selection_id": "a"}
        )
        b = await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(1000, 1200)), "selection_id": "b"}
        )
        assert {a["worker_id"], b["worker_id"]} == {1, 2}
        await svc.prefill_complete("a")
        await svc.prefill_complete("b")
        prompt = {"model_name": "m", "token_ids": list(range(5000, 5040))}
        # 100 blocks on a's worker against 50: the new prompt goes to b's.
        assert (await svc.select(prompt))["worker_id"] == b["worker_id"]
        svc.add_output_block("a", decay_fraction=0.1)
        assert _decode_blocks(svc, a["worker_id"]) == 10
        assert (await svc.select(prompt))["worker_id"] == a["worker_id"]
    finally:
        svc.shutdown()


async def _picks(svc: SelectionService, n: int) -> tuple[int, list[int]]:
    r = await svc.select_and_reserve(
        {"model_name": "m", "token_ids": list(range(5000, 5400)), "selection_id": "x"}
    )
    picks = []
    for i in range(n):
        s = await svc.select({"model_name": "m", "token_ids": list(range(i * 100, i * 100 + 64))})
        picks.append(s["worker_id"])
    return r["worker_id"], picks


async def test_router_temperature_from_the_environment(ctx: zmq.Context, monkeypatch) -> None:
    svc, _ = await _schedulable(ctx, 2)
    try:
        busy, picks = await _picks(svc, 40)
        assert set(picks) == {3 - busy}, picks
    finally:
        svc.shutdown()
    monkeypatch.setenv("DYN_ROUTER_TEMPERATURE", "50")
    svc, _ = await _schedulable(ctx, 2)
    try:
        busy, picks = await _picks(svc, 40)
        # Softmax over costs at a high temperature: both workers are picked.
        assert set(picks) == {1, 2}, picks
    finally:
        svc.shutdown()


@pytest.mark.parametrize("value", ["false", "0"])
async def test_prefill_tracking_from_the_environment(
    ctx: zmq.Context, monkeypatch, value: str
) -> None:
    monkeypatch.setenv("DYN_ROUTER_TRACK_PREFILL_TOKENS", value)
    svc, _ = await _schedulable(ctx, 1)
    try:
        r = await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(40)), "selection_id": "x"}
        )
        assert r["track_prefill_tokens"] is False
        (group,) = svc.loads(model_name="m")
        assert group["loads"][0]["potential_prefill_tokens"] == 0
        assert group["loads"][0]["potential_decode_blocks"] == 10
    finally:
        svc.shutdown()


@pytest.mark.parametrize(
    ("var", "value", "why"),
    [
        ("DYN_ROUTER_TEMPERATURE", "abc", "not a number"),
        ("DYN_ROUTER_TEMPERATURE", "-1", "router_temperature"),
        ("DYN_ROUTER_TRACK_PREFILL_TOKENS", "maybe", "expected true/false"),
        ("DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "x", "not a number"),
        ("DYN_ROUTER_EVENT_THREADS", "0", "router_event_threads"),
        ("DYN_ROUTER_QUEUE_POLICY", "fifo", "fcfs"),
    ],
)
def test_bad_environment_values_name_the_variable(
    monkeypatch, var: str, value: str, why: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as e:
        SelectionService()
    assert str(e.value).startswith(f'{var}="{value}": '), str(e.value)
    assert why in str(e.value)
