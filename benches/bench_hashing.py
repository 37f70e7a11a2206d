"""compute_block_hash_for_seq throughput (tokens/s), this project vs the reference wheel.

Usage: python benches/bench_hashing.py [--out docs/benchmarks/hashing.md]

Both implementations hash the same prompts (4k and 100k tokens, block size 16) from Python
lists, in one run; the reference runs in its own venv (see benches/_common.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROMPTS = {"4k": 4_096, "100k": 100_000}
BLOCK_SIZE = 16
#: Wall time spent per case; long enough for a stable median on a noisy 2-core machine.
SECONDS_PER_CASE = 2.0


def measure() -> dict[str, float]:
    """Tokens/s for each prompt size with whatever `dynamo._core` this interpreter has."""
    from dynamo._core import compute_block_hash_for_seq as h

    results = {}
    for name, n in PROMPTS.items():
        tokens = [(i * 2_654_435_761) % 152_064 for i in range(n)]
        h(tokens, BLOCK_SIZE)  # warm up
        rates = []
        deadline = time.perf_counter() + SECONDS_PER_CASE
        while time.perf_counter() < deadline:
            reps = max(1, 400_000 // n)
            t0 = time.perf_counter()
            for _ in range(reps):
                h(tokens, BLOCK_SIZE)
            rates.append(reps * n / (time.perf_counter() - t0))
        rates.sort()
        results[name] = rates[len(rates) // 2]
    return results


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, run_under_reference

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure()))
        return

    ours = measure()
    ref = run_under_reference(__file__)
    lines = [
        "# compute_block_hash_for_seq throughput",
        "",
        f"Machine: {machine()}. Block size {BLOCK_SIZE}, Python list input, median of "
        f"repeated runs over {SECONDS_PER_CASE:.0f} s per case. Reference: ai-dynamo-runtime 1.6.1.",
        "",
        "| prompt | this project (M tokens/s) | reference (M tokens/s) | ratio |",
        "|---|---|---|---|",
    ]
    for name in PROMPTS:
        lines.append(
            f"| {name} | {ours[name] / 1e6:.1f} | {ref[name] / 1e6:.1f} | "
            f"{ours[name] / ref[name]:.2f}x |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
