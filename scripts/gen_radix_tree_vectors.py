"""Generate tests/data/radix_tree_vectors.json from the reference wheel (run once).

Usage: /path/to/reference/venv/bin/python scripts/gen_radix_tree_vectors.py OUT.json

The script builds a deterministic sequence of RadixTree operations (JSON events, including
rejected and malformed ones, remove_worker, clear_all_blocks) and records, for every step,
the error class it raised (or null) and the scores of a few queries. It imports whatever
``dynamo._core`` the running interpreter has: run it with the reference interpreter to
produce the committed vector; tests/test_radix_tree_compat.py replays the steps against
this project and compares.

The operations stay inside the behaviour both trees define the same way: removals take a
worker rank's deepest blocks first (as engines evict), and the external hash is a function of
the block path (as engines compute them, identical across ranks). Early-exit queries are not recorded
(the reference's compressed tree stops at edge boundaries).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

from dynamo._core import RadixTree

SEED = 20261129
STEPS = 600
WORKERS = [0, 1, 2, 7, 2**63 + 5]
LOCALS = [(i * 0x9E3779B97F4A7C15 + 1) % 2**64 for i in range(5)]


def ext_hash(path: tuple[int, ...]) -> int:
    # Like real engines: the external hash is a function of the block path only, so every
    # rank that stores the same prefix reports the same hash.
    h = hashlib.blake2b(repr(path).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def main() -> None:
    rng = random.Random(SEED)
    tree = RadixTree()
    # Generator-side bookkeeping: rank -> {path: ext} of blocks it holds (as the reference
    # would report them), only used to pick plausible operations.
    held: dict[tuple[int, int], dict[tuple[int, ...], int]] = {}
    steps = []
    event_id = 0

    def queries() -> list[list[int]]:
        qs = []
        all_paths = [p for m in held.values() for p in m]
        for _ in range(4):
            if all_paths and rng.random() < 0.8:
                p = list(rng.choice(all_paths))
                p += [rng.choice(LOCALS) for _ in range(rng.randrange(0, 3))]
            else:
                p = [rng.choice(LOCALS) for _ in range(rng.randrange(0, 6))]
            qs.append(p)
        return qs

    for _ in range(STEPS):
        event_id += 1
        worker = rng.choice(WORKERS)
        dp = rng.choice([0, 0, 0, 1])
        rank = held.setdefault((worker, dp), {})
        r = rng.random()
        op: dict
        if r < 0.45:
            # Store: extend one of the rank's chains (or start at the root).
            leaves = [
                p for p in rank if not any(len(q) > len(p) and q[: len(p)] == p for q in rank)
            ]
            parent = rng.choice(leaves) if leaves and rng.random() < 0.6 else ()
            n = rng.randrange(1, 5)
            path = parent
            blocks = []
            for _ in range(n):
                path = (*path, rng.choice(LOCALS))
                blocks.append({"block_hash": ext_hash(path), "tokens_hash": path[-1]})
            data = {
                "stored": {
                    "parent_hash": ext_hash(parent) if parent else None,
                    "blocks": blocks,
                }
            }
            op = {
                "kind": "event",
                "worker_id": worker,
                "event": {"event_id": event_id, "data": data, "dp_rank": dp},
            }
        elif r < 0.52:
            # Store under a parent the rank does not hold: rejected.
            data = {
                "stored": {
                    "parent_hash": rng.getrandbits(64),
                    "blocks": [
                        {"block_hash": rng.getrandbits(64), "tokens_hash": rng.choice(LOCALS)}
                    ],
                }
            }
            op = {
                "kind": "event",
                "worker_id": worker,
                "event": {"event_id": event_id, "data": data, "dp_rank": dp},
            }
        elif r < 0.72:
            # Remove the rank's deepest blocks (and sometimes an unknown hash too).
            paths = sorted(rank, key=len, reverse=True)
            k = rng.randrange(0, min(3, len(paths)) + 1)
            hashes = [rank[p] for p in paths[:k]]
            if rng.random() < 0.15:
                hashes.append(rng.getrandbits(64))
            data = {"removed": {"block_hashes": hashes}}
            op = {
                "kind": "event",
                "worker_id": worker,
                "event": {"event_id": event_id, "data": data, "dp_rank": dp},
            }
        elif r < 0.76:
            op = {
                "kind": "event",
                "worker_id": worker,
                "event": {"event_id": event_id, "data": "cleared", "dp_rank": dp},
            }
        elif r < 0.80:
            op = {"kind": "remove_worker", "worker_id": worker}
        elif r < 0.83:
            op = {"kind": "clear_all_blocks", "worker_id": worker}
        else:
            bad = rng.choice(
                [
                    "",
                    "{",
                    '{"event_id":1,"data":"foo"}',
                    '{"event_id":1}',
                    '{"event_id":-1,"data":"cleared"}',
                    '{"event_id":1,"data":{"removed":{"block_hashes":[-5]}}}',
                    '{"event_id":1,"data":"removed"}',
                    '{"event_id":1,"data":{"removed":{}}}',
                    '{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1}]}}}',
                    '{"event_id":1,"data":"cleared","dp_rank":4294967296}',
                    '{"event_id":1,"data":"cleared"} x',
                    '{"event_id":1.5,"data":"cleared"}',
                ]
            )
            op = {"kind": "raw", "worker_id": worker, "bytes": bad}

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
        except Exception as e:
            error = type(e).__name__

        # Update the bookkeeping from what the operation did (known to the generator).
        if (op["kind"] == "event" and error is None) or (
            op["kind"] == "event" and "removed" in op["event"]["data"]
        ):
            data = op["event"]["data"]
            if data == "cleared":
                rank.clear()
            elif "stored" in data:
                st = data["stored"]
                if st["parent_hash"] is None:
                    path: tuple[int, ...] = ()
                else:
                    path = next(p for p, e in rank.items() if e == st["parent_hash"])
                for b in st["blocks"]:
                    path = (*path, b["tokens_hash"])
                    rank[path] = b["block_hash"]
            else:
                gone = set(data["removed"]["block_hashes"])
                for p in [p for p, e in rank.items() if e in gone]:
                    del rank[p]
        elif op["kind"] in ("remove_worker", "clear_all_blocks"):
            for (w, _), m in held.items():
                if w == op["worker_id"]:
                    m.clear()

        results = []
        for q in queries():
            scores = tree.find_matches(q).scores
            results.append(
                {"query": q, "scores": sorted([w, d, s] for (w, d), s in scores.items())}
            )
        steps.append({"op": op, "error": error, "matches": results})

    out = {
        "generator": "scripts/gen_radix_tree_vectors.py",
        "reference": "ai-dynamo-runtime 1.6.1",
        "seed": SEED,
        "steps": steps,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
