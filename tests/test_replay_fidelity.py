"""Fidelity regression: the offline replay reproduces the reference's summaries.

`docs/benchmarks/replay_reference_summaries.json` holds the reference's (ai-dynamo-runtime
1.6.1) summaries of the Mooncake synthetic trace (`tests/data/mooncake/`, 3,993 requests) on 8
workers of 16,384 blocks of 64 tokens, trace block 512, arrivals sped up 2x and 4x (see
docs/benchmarks/replay.md). Round robin runs the same simulator with the same policy, so its
summary must match exactly; the KV router is ours, so its figures must stay within 5% of the
reference's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamo._core import run_mocker_trace_replay

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "benchmarks" / "replay_reference_summaries.json"
TRACE = REPO / "tests" / "data" / "mooncake" / "synthetic_trace.jsonl"
KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "prefix_cache_reused_ratio")


def replay(mode: str, speedup: float) -> dict:
    return run_mocker_trace_replay(
        [TRACE],
        extra_engine_args={"engine": {"num_gpu_blocks": 16384, "block_size": 64}},
        num_workers=8,
        router_mode=mode,
        arrival_speedup_ratio=speedup,
        trace_block_size=512,
    ).summary


def reference(mode: str, speedup: float) -> dict:
    return json.loads(REFERENCE.read_text())[f"{mode}@{speedup:g}x"]["summary"]


@pytest.mark.parametrize("speedup", [2.0, 4.0])
def test_round_robin_matches_the_reference_exactly(speedup: float) -> None:
    ours, ref = replay("round_robin", speedup), reference("round_robin", speedup)
    assert ours["num_requests"] == ref["num_requests"] == 3993
    assert ours["completed_requests"] == ref["completed_requests"]
    assert ours["total_input_tokens"] == ref["total_input_tokens"]
    for k in KEYS:
        assert ours[k] == pytest.approx(ref[k], rel=1e-6), k


@pytest.mark.parametrize("speedup", [2.0, 4.0])
def test_kv_router_within_five_percent_of_the_reference(speedup: float) -> None:
    ours, ref = replay("kv_router", speedup), reference("kv_router", speedup)
    assert ours["completed_requests"] == ref["completed_requests"] == 3993
    for k in KEYS:
        assert ours[k] == pytest.approx(ref[k], rel=0.05), k
    # And KV routing still beats round robin on this trace (reuse up, TTFT down).
    rr = reference("round_robin", speedup)
    assert ours["prefix_cache_reused_ratio"] > rr["prefix_cache_reused_ratio"]
    assert ours["mean_ttft_ms"] < rr["mean_ttft_ms"]
