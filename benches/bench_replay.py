"""Trace replay: fidelity, routing quality and speed, ours vs the reference, side by side.

    python benches/bench_replay.py [--trace PATH] [--rounds 3] [--scale 10]

For each arrival speed-up (2x, 4x) and router mode (kv_router, round_robin) it runs the
Mooncake synthetic trace (8 workers, 16,384 blocks of 64 tokens, trace block 512) through
``run_mocker_trace_replay`` of this project and of the reference wheel (in a subprocess under
``REF_PYTHON``), alternating the two each round, and prints the summary figures side by side
with the wall time of each replay. The reference's KV router breaks ties at random, so each
figure is the mean over the rounds (ours varies its router seed per round the same way).

``--rounds N`` with N >= 2 also prints, per figure, the mean with a 95% confidence interval
(Student t over the rounds) for each side and for the difference of the means (Welch), so
"ours >= reference" can be told apart from run-to-run noise. Wall and CPU seconds of each
replay are measured inside the process that runs it (CPU: ``time.process_time``, all
threads), and the wall ratio is taken per round between the two runs alternated back to back.
``--modes`` and ``--speedups`` restrict the configurations; ``--workers 6,8,12`` runs each one
at several worker counts, and a panel of several configurations ends with, per figure, the
number of configurations in which ours is at least as good as the reference.

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

TRACE = (
    Path(__file__).resolve().parent.parent / "tests" / "data" / "mooncake" / "synthetic_trace.jsonl"
)
KEYS = [
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "mean_e2e_latency_ms",
]
ENGINE = {"engine": {"num_gpu_blocks": 16384, "block_size": 64}}


def measure(trace: str, mode: str, speedup: float, seed: int, workers: int = 8) -> dict:
    """One replay with whichever ``dynamo`` this interpreter imports."""
    from dynamo._core import run_mocker_trace_replay

    kwargs = dict(
        extra_engine_args=ENGINE,
        num_workers=workers,
        router_mode=mode,
        arrival_speedup_ratio=speedup,
        trace_block_size=512,
    )
    try:  # ours: vary the KV router's tie-break seed per round like the reference's RNG
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_mocker_trace_replay([trace], seed=seed, **kwargs)
    except TypeError:
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_mocker_trace_replay([trace], **kwargs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = r.summary
    return {"wall_s": wall, "cpu_s": cpu, "n": s["num_requests"], **{k: s[k] for k in KEYS}}


# Two-sided 95% Student t quantiles by degrees of freedom (1..30; normal beyond).
T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t95(df: float) -> float:
    return T95[max(1, int(df)) - 1] if df < 31 else 1.96


def ci(xs: list[float]) -> tuple[float, float]:
    """Mean and 95% confidence half-width."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5


def diff_ci(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a minus mean of b, with Welch's 95% confidence half-width."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return d, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return d, t95(df) * (va + vb) ** 0.5


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
    ap.add_argument("--modes", default="kv_router,round_robin")
    ap.add_argument("--speedups", default="2,4")
    ap.add_argument(
        "--workers", default="8", help="worker counts (comma list): a panel of configurations"
    )
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--args", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure_only:
        trace, mode, speedup, seed, workers = a.args.split("|")
        print(json.dumps(measure(trace, mode, float(speedup), int(seed), int(workers))))
        return

    script = str(Path(__file__).resolve())
    results: dict = {"machine": machine(), "rounds": a.rounds, "runs": {}}
    whos = ("ours",) if a.ours_only else ("ours", "reference")
    worker_counts = [int(w) for w in a.workers.split(",") if w]
    configs = [
        (w, float(s), m)
        for w in worker_counts
        for s in a.speedups.split(",")
        for m in a.modes.split(",")
        if s and m
    ]
    for workers, speedup, mode in configs:
        ours, ref = [], []
        for rnd in range(a.rounds):
            arg = f"{a.trace}|{mode}|{speedup}|{rnd}|{workers}"
            ours.append(measure(str(a.trace), mode, speedup, rnd, workers))
            if not a.ours_only:
                ref.append(run_under_reference(script, "--args", arg))
        key = f"{mode}@{speedup:g}x" + (f"/{workers}w" if worker_counts != [8] else "")
        mean = lambda rs, k: statistics.fmean(r[k] for r in rs)  # noqa: E731
        results["runs"][key] = {
            "ours": {k: mean(ours, k) for k in [*KEYS, "wall_s", "cpu_s"]},
            "ours_rounds": ours,
        }
        if ref:
            results["runs"][key]["reference"] = {
                k: mean(ref, k) for k in [*KEYS, "wall_s", "cpu_s"]
            }
            results["runs"][key]["reference_rounds"] = ref
            results["runs"][key]["wall_ratio_rounds"] = [
                o["wall_s"] / r["wall_s"] for o, r in zip(ours, ref, strict=True)
            ]
            results["runs"][key]["cpu_ratio_rounds"] = [
                o["cpu_s"] / r["cpu_s"] for o, r in zip(ours, ref, strict=True)
            ]
    print(f"machine: {results['machine']} (shared with other jobs); means of {a.rounds} rounds")
    hdr = (
        f"{'run':<20}{'':<5}"
        + "".join(f"{k.replace('_ms', ''):>22}" for k in KEYS)
        + f"{'wall s':>10}{'cpu s':>8}"
    )
    print(hdr)
    for key, r in results["runs"].items():
        for who in whos:
            row = r[who]
            print(
                f"{key:<20}{who[:3]:<5}"
                + "".join(f"{row[k]:>22.4f}" for k in KEYS)
                + f"{row['wall_s']:>10.2f}{row['cpu_s']:>8.2f}"
            )
        if a.ours_only:
            continue
        diff = {k: (r["ours"][k] - r["reference"][k]) / r["reference"][k] * 100 for k in KEYS}
        print(f"{'':<20}{'diff':<5}" + "".join(f"{diff[k]:>21.1f}%" for k in KEYS))
        results["runs"][key]["diff_pct"] = diff
        wr, cr = r["wall_ratio_rounds"], r["cpu_ratio_rounds"]
        print(
            f"{'':<20}ratio ours/ref per round: wall {statistics.fmean(wr):.2f} "
            f"({min(wr):.2f}-{max(wr):.2f}), cpu {statistics.fmean(cr):.2f} "
            f"({min(cr):.2f}-{max(cr):.2f})"
        )
        if a.rounds >= 2:
            stats = {}
            for k in [*KEYS, "wall_s", "cpu_s"]:
                o = [x[k] for x in r["ours_rounds"]]
                f = [x[k] for x in r["reference_rounds"]]
                (mo, ho), (mf, hf), (d, hd) = ci(o), ci(f), diff_ci(o, f)
                stats[k] = {"ours": [mo, ho], "reference": [mf, hf], "diff": [d, hd]}
                print(
                    f"{'':<20}{k:<26} ours {mo:.4f} +- {ho:.4f}  ref {mf:.4f} +- {hf:.4f}"
                    f"  diff {d:+.4f} +- {hd:.4f} (95% CI)"
                )
            results["runs"][key]["ci95"] = stats

    compared = [r for r in results["runs"].values() if "diff_pct" in r]
    if len(compared) > 1:
        # Over a panel of configurations: in how many is ours' mean at least as good as the
        # reference's (reuse higher, latencies lower), and the mean relative difference.
        panel = {}
        for k in KEYS:
            sign = 1.0 if k == "prefix_cache_reused_ratio" else -1.0
            wins = sum(sign * r["diff_pct"][k] >= 0 for r in compared)
            panel[k] = {
                "wins": wins,
                "mean_diff_pct": statistics.fmean(r["diff_pct"][k] for r in compared),
            }
            print(
                f"panel {k:<26} ours at least as good in {wins} of {len(compared)} "
                f"configurations, mean difference {panel[k]['mean_diff_pct']:+.2f}%"
            )
        results["panel"] = panel

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
