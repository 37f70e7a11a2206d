"""Trace replay: fidelity, routing quality and speed, ours vs the reference, side by side.

    python benches/bench_replay.py [--trace PATH] [--rounds 3] [--scale 10]

For each arrival speed-up (2x, 4x) and router mode (kv_router, round_robin) it runs the
Mooncake synthetic trace (8 workers, 16,384 blocks of 64 tokens, trace block 512) through
``run_mocker_trace_replay`` of this project and of the reference wheel (in a subprocess under
``REF_PYTHON``), alternating the two each round, and prints the summary figures side by side
with the wall time of each replay. The reference's KV router breaks ties at random, so each
figure is the mean over the rounds (ours varies its router seed per round the same way).

``--scale N`` also replays the trace tiled N times (copy k shifted by k x the trace span, its
hash ids offset so copies share nothing) to show the per-request simulation cost as the trace
grows. ``--ours-only`` skips the reference (no ``REF_PYTHON`` needed): our figures and
timings alone. Results as JSON on the last line with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, run_under_reference

TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
KEYS = [
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
]
ENGINE = {"engine": {"num_gpu_blocks": 16384, "block_size": 64}}


def measure(trace: str, mode: str, speedup: float, seed: int) -> dict:
    """One replay with whichever ``dynamo`` this interpreter imports."""
    from dynamo._core import run_mocker_trace_replay

    kwargs = dict(
        extra_engine_args=ENGINE,
        num_workers=8,
        router_mode=mode,
        arrival_speedup_ratio=speedup,
        trace_block_size=512,
    )
    try:  # ours: vary the KV router's tie-break seed per round like the reference's RNG
        t0 = time.perf_counter()
        r = run_mocker_trace_replay([trace], seed=seed, **kwargs)
    except TypeError:
        t0 = time.perf_counter()
        r = run_mocker_trace_replay([trace], **kwargs)
    wall = time.perf_counter() - t0
    s = r.summary
    return {"wall_s": wall, "n": s["num_requests"], **{k: s[k] for k in KEYS}}


def tiled(trace: Path, copies: int, out: Path) -> Path:
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    span = rows[-1]["timestamp"] + 1
    with open(out, "w") as f:
        for k in range(copies):
            for r in rows:
                r2 = dict(r)
                r2["timestamp"] = r["timestamp"] + k * span
                r2["hash_ids"] = [h + k * 1_000_000 for h in r["hash_ids"]]
                f.write(json.dumps(r2) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=int, default=0, help="also replay the trace tiled N times")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ours-only", action="store_true", help="skip the reference wheel")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--args", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure_only:
        trace, mode, speedup, seed = a.args.split("|")
        print(json.dumps(measure(trace, mode, float(speedup), int(seed))))
        return

    script = str(Path(__file__).resolve())
    results: dict = {"machine": machine(), "rounds": a.rounds, "runs": {}}
    whos = ("ours",) if a.ours_only else ("ours", "reference")
    configs = [(s, m) for s in (2.0, 4.0) for m in ("kv_router", "round_robin")]
    for speedup, mode in configs:
        ours, ref = [], []
        for rnd in range(a.rounds):
            arg = f"{a.trace}|{mode}|{speedup}|{rnd}"
            ours.append(measure(str(a.trace), mode, speedup, rnd))
            if not a.ours_only:
                ref.append(run_under_reference(script, "--args", arg))
        key = f"{mode}@{speedup:g}x"
        mean = lambda rs, k: statistics.fmean(r[k] for r in rs)  # noqa: E731
        results["runs"][key] = {
            "ours": {k: mean(ours, k) for k in [*KEYS, "wall_s"]},
            "ours_rounds": ours,
        }
        if ref:
            results["runs"][key]["reference"] = {k: mean(ref, k) for k in [*KEYS, "wall_s"]}
            results["runs"][key]["reference_rounds"] = ref
    print(f"machine: {results['machine']} (shared with other jobs); means of {a.rounds} rounds")
    hdr = (
        f"{'run':<18}{'':<5}"
        + "".join(f"{k.replace('_ms', ''):>22}" for k in KEYS)
        + f"{'wall s':>10}"
    )
    print(hdr)
    for key, r in results["runs"].items():
        for who in whos:
            row = r[who]
            print(
                f"{key:<18}{who[:3]:<5}"
                + "".join(f"{row[k]:>22.4f}" for k in KEYS)
                + f"{row['wall_s']:>10.2f}"
            )
        if a.ours_only:
            continue
        diff = {k: (r["ours"][k] - r["reference"][k]) / r["reference"][k] * 100 for k in KEYS}
        print(f"{'':<18}{'diff':<5}" + "".join(f"{diff[k]:>21.1f}%" for k in KEYS))
        results["runs"][key]["diff_pct"] = diff

    if a.scale > 1:
        with tempfile.TemporaryDirectory() as d:
            big = tiled(a.trace, a.scale, Path(d) / "tiled.jsonl")
            scale: dict = {}
            for label, path in (("1x", a.trace), (f"{a.scale}x", big)):
                o = measure(str(path), "kv_router", 2.0, 0)
                scale[label] = {
                    "requests": o["n"],
                    "ours_us_per_request": o["wall_s"] / o["n"] * 1e6,
                    "ours_wall_s": o["wall_s"],
                }
                line = (
                    f"scale {label}: {o['n']} requests, ours {o['wall_s']:.2f}s "
                    f"({scale[label]['ours_us_per_request']:.0f} us/request)"
                )
                if not a.ours_only:
                    r = run_under_reference(script, "--args", f"{path}|kv_router|2.0|0")
                    scale[label]["reference_us_per_request"] = r["wall_s"] / r["n"] * 1e6
                    scale[label]["reference_wall_s"] = r["wall_s"]
                    line += (
                        f", reference {r['wall_s']:.2f}s "
                        f"({scale[label]['reference_us_per_request']:.0f} us/request)"
                    )
                print(line)
            results["scale"] = scale
    if a.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
