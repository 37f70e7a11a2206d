#!/usr/bin/env python3
"""Alternate several builds of the scale bench, ours only, and compare medians.

One run of a 100k-block scale takes a second or two and this kind of machine moves a run
by up to 30 % (other tenants' load on the host), so a change of a few percent shows only
in the median of many alternated runs. Build each tree's binary as in
`docs/benchmarks/kv_indexer.md` and copy it aside, then:

    python3 ab.py --scales 100k,1m --runs 6 --rounds 7 base=/path/a new=/path/b

Prints, per scale and binary, the median and minimum over the runs of each run's apply
ns/block and find p99 (each itself the median of `--rounds` rounds).
"""

import argparse
import os
import statistics
import subprocess
from pathlib import Path

# The shared data folder beside the project checkout (crates/dynamo-kv-router/benches/scale).
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[4].parent / "shared/data/mooncake/synthetic_trace.jsonl"
)


def figures(binary, scales, rounds, trace):
    """One run: {scale: (apply ns/block, find p99 ns)} from the bench's table rows."""
    out = subprocess.run(
        [
            binary,
            "--scales",
            scales,
            "--workers",
            "16",
            "--rounds",
            str(rounds),
            "--only",
            "scale",
            "--cands",
            "ours",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, MOONCAKE_TRACE=trace),
    ).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 8 and cells[1].isdigit():
            rows[cells[1]] = (float(cells[3].split()[0]), float(cells[7].split()[0]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="100k,1m")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--trace", default=os.environ.get("MOONCAKE_TRACE", str(DEFAULT_TRACE)))
    p.add_argument("builds", nargs="+", help="NAME=PATH of a bench binary")
    args = p.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    seen = {name: {} for name, _ in builds}
    for _ in range(args.runs):
        for name, path in builds:
            for scale, fig in figures(path, args.scales, args.rounds, args.trace).items():
                seen[name].setdefault(scale, []).append(fig)
    for scale in seen[builds[0][0]]:
        for name, _ in builds:
            runs = seen[name][scale]
            apply = [a for a, _ in runs]
            p99 = [q for _, q in runs]
            print(
                f"{scale:>9} {name:>10}: apply median {statistics.median(apply):6.1f} "
                f"min {min(apply):6.1f} | find p99 median {statistics.median(p99):6.0f} "
                f"| runs {apply}"
            )


if __name__ == "__main__":
    main()
