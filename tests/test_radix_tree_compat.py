"""Replay the reference wheel's recorded RadixTree behaviour (tests/data/radix_tree_vectors.json).

The vector was generated once with ai-dynamo-runtime 1.6.1 by
scripts/gen_radix_tree_vectors.py: a scripted sequence of JSON events (accepted, rejected
and malformed), remove_worker and clear_all_blocks calls, each followed by queries. This
project must raise the same exception class at every step and produce the same scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamo.llm import RadixTree


@pytest.fixture(scope="module")
def vector(data_dir: Path) -> dict:
    return json.loads((data_dir / "radix_tree_vectors.json").read_text())


def test_vector_is_substantial(vector: dict) -> None:
    errors = {s["error"] for s in vector["steps"]}
    assert {None, "RuntimeError", "ValueError"} <= errors
    assert len(vector["steps"]) >= 500


def test_same_errors_and_scores_as_reference(vector: dict) -> None:
    tree = RadixTree()
    for i, step in enumerate(vector["steps"]):
        op = step["op"]
        error = None
        try:
            if op["kind"] == "event":
                tree.apply_event(op["worker_id"], json.dumps(op["event"]).encode())
            elif op["kind"] == "raw":
                tree.apply_event(op["worker_id"], op["bytes"].encode())
            elif op["kind"] == "remove_worker":
                tree.remove_worker(op["worker_id"])
            else:
                tree.clear_all_blocks(op["worker_id"])
        except (RuntimeError, ValueError) as e:
            error = type(e).__name__
        assert error == step["error"], f"step {i}: {op}"
        for m in step["matches"]:
            got = sorted([w, d, s] for (w, d), s in tree.find_matches(m["query"]).scores.items())
            assert got == m["scores"], f"step {i}: query {m['query']}"
