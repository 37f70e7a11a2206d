"""RadixTree apply / find_matches / memory, this project vs the reference wheel, one run.

Usage: python benches/bench_radix_tree.py [--out docs/benchmarks/kv_indexer.md]

Workload (the issue's): 16 workers, 4,000 sequences of 64 blocks; sequence ``s`` starts with
one of 50 shared 32-block prefixes (``s % 50``) followed by 32 blocks of its own, and is
stored by worker ``s % 16`` as one JSON ``stored`` event (external hashes depend on the
block path only, as engines compute them). Measured:

* apply: blocks/s of ``apply_event`` over all 4,000 pre-encoded events (256,000 blocks);
* find_matches: median and p99 latency of 64-block queries (stored sequences, and the
  same prefixes with an unknown tail), on the filled tree;
* memory: resident-set growth per stored block after storing 1,000,000 distinct blocks
  (15,625 events of 64 new blocks spread over 16 workers), in a fresh process.

Each measurement runs in a fresh interpreter: ours with this interpreter, the reference
with ``REF_PYTHON`` (see benches/_common.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

WORKERS = 16
SEQUENCES = 4_000
BLOCKS = 64
PREFIXES = 50
PREFIX_LEN = 32
MEMORY_BLOCKS = 1_000_000
REPEATS = 5
#: Alternating speed runs per implementation (best run kept).
ROUNDS = 3


def mix(x: int) -> int:
    """A 64-bit finalizer so that hashes look like real (random) hashes."""
    x &= 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 33)


def sequence(s: int) -> list[tuple[int, int]]:
    """(block_hash, tokens_hash) of sequence ``s``."""
    p = s % PREFIXES
    out = []
    for i in range(BLOCKS):
        key = (1 << 40 | p << 8 | i) if i < PREFIX_LEN else (2 << 40 | s << 8 | i)
        out.append((mix(key * 3 + 1), mix(key * 3 + 2)))
    return out


def event(event_id: int, blocks: list[tuple[int, int]]) -> bytes:
    return json.dumps(
        {
            "event_id": event_id,
            "data": {
                "stored": {
                    "parent_hash": None,
                    "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks],
                }
            },
        },
        separators=(",", ":"),
    ).encode()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure_speed() -> dict[str, float]:
    from dynamo._core import RadixTree

    seqs = [sequence(s) for s in range(SEQUENCES)]
    events = [(s % WORKERS, event(s, seqs[s])) for s in range(SEQUENCES)]
    total_blocks = SEQUENCES * BLOCKS
    rates = []
    tree = None
    for _ in range(REPEATS):
        tree = RadixTree()
        gc.collect()
        t0 = time.perf_counter()
        for w, ev in events:
            tree.apply_event(w, ev)
        rates.append(total_blocks / (time.perf_counter() - t0))
    rates.sort()

    hit = [[t for _, t in seqs[s]] for s in range(0, SEQUENCES, 7)]
    miss = [q[:PREFIX_LEN] + [mix(9 << 50 | i) for i in range(BLOCKS - PREFIX_LEN)] for q in hit]
    queries = [q for pair in zip(hit, miss, strict=True) for q in pair]
    for q in queries[:50]:
        tree.find_matches(q)  # warm up
    lat = []
    for _ in range(3):
        for q in queries:
            t0 = time.perf_counter()
            tree.find_matches(q)
            lat.append(time.perf_counter() - t0)
    lat.sort()
    # Sanity: the stored sequences score 64 for their worker.
    assert tree.find_matches(hit[0]).scores[(0, 0)] == BLOCKS
    return {
        "apply_blocks_per_s": rates[len(rates) // 2],
        "find_p50_us": lat[len(lat) // 2] * 1e6,
        "find_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "queries": len(lat),
    }


def measure_memory() -> dict[str, float]:
    from dynamo._core import RadixTree

    events = MEMORY_BLOCKS // BLOCKS
    # Warm up the interpreter's allocators with one event's worth of objects first.
    tree = RadixTree()
    tree.apply_event(0, event(0, [(mix(i * 2 + 1), mix(i * 2)) for i in range(BLOCKS)]))
    tree.remove_worker(0)
    del tree
    gc.collect()
    before = rss_bytes()
    tree = RadixTree()
    for e in range(events):
        base = (e + 1) << 8
        blocks = [(mix((base | i) * 2 + 1), mix((base | i) * 2)) for i in range(BLOCKS)]
        tree.apply_event(e % WORKERS, event(e, blocks))
    gc.collect()
    after = rss_bytes()
    return {"bytes_per_block": (after - before) / (events * BLOCKS), "blocks": events * BLOCKS}


def best(runs: list[dict]) -> dict:
    """The best figure of each metric over several runs."""
    return {
        "apply_blocks_per_s": max(r["apply_blocks_per_s"] for r in runs),
        "find_p50_us": min(r["find_p50_us"] for r in runs),
        "find_p99_us": min(r["find_p99_us"] for r in runs),
        "queries": runs[0]["queries"],
    }


def run(python: str, part: str) -> dict:
    out = subprocess.run(
        [python, __file__, "--measure-only", part],
        check=True,
        capture_output=True,
        text=True,
        cwd="/" if python != sys.executable else None,
        env=None,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, reference_python

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", choices=["speed", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    if args.measure_only:
        result = measure_speed() if args.measure_only == "speed" else measure_memory()
        print(json.dumps(result))
        return

    ref_py = reference_python()
    if ref_py is None:
        raise SystemExit("reference venv not found: set REF_PYTHON (see benches/_common.py)")
    # Speed runs alternate between the two implementations and keep each one's best run,
    # so that load from other processes on a shared machine biases neither side.
    ours_runs, ref_runs = [], []
    for _ in range(ROUNDS):
        ours_runs.append(run(sys.executable, "speed"))
        ref_runs.append(run(str(ref_py), "speed"))
    ours = {**best(ours_runs), **run(sys.executable, "memory")}
    ref = {**best(ref_runs), **run(str(ref_py), "memory")}

    def row(name: str, key: str, unit: str, scale: float, better: str) -> str:
        o, r = ours[key] * scale, ref[key] * scale
        ratio = o / r
        return f"| {name} | {o:,.2f} {unit} | {r:,.2f} {unit} | {ratio:.2f}x ({better}) |"

    lines = [
        "# RadixTree (Python level) — this project vs the reference",
        "",
        f"Machine: {machine()}. Reference: ai-dynamo-runtime 1.6.1, same script, fresh "
        "interpreter per measurement, both measured in this run.",
        "",
        f"Workload: {WORKERS} workers, {SEQUENCES:,} sequences of {BLOCKS} blocks, "
        f"{PREFIXES} shared {PREFIX_LEN}-block prefixes, one JSON `stored` event per sequence "
        f"({SEQUENCES * BLOCKS:,} blocks); apply = median of {REPEATS} full replays; "
        f"speed figures are the best of {ROUNDS} alternating runs per implementation; "
        f"find_matches over {ours['queries']:,} 64-block queries (hits and prefix-only hits); "
        f"memory = RSS growth per block after {MEMORY_BLOCKS:,} distinct blocks.",
        "",
        "| metric | this project | reference | ratio |",
        "|---|---|---|---|",
        row("apply_event", "apply_blocks_per_s", "M blocks/s", 1e-6, "higher is better"),
        row("find_matches p50", "find_p50_us", "µs", 1.0, "lower is better"),
        row("find_matches p99", "find_p99_us", "µs", 1.0, "lower is better"),
        row("resident memory per block", "bytes_per_block", "B", 1.0, "lower is better"),
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
