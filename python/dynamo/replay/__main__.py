"""``python -m dynamo.replay TRACE --workers 8 --router kv,round_robin --speedup 2 --out report/``.

Runs the trace once per router mode (offline, simulated time), shows a progress bar, and
writes into ``--out``:

* ``summary.json``: the arguments and, per mode, the replay's summary (the reference's keys);
* ``per_request_<mode>.jsonl``: one JSON object per request;
* ``timeline_<mode>.json``: queue depth, running requests and active KV blocks over
  simulated time;
* with matplotlib installed: ``ttft_cdf.png``, ``prefix_reuse.png``, ``queue_depth.png`` and
  ``active_kv_blocks.png``. Without it the CLI says so and writes everything else.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dynamo._core import ReplayProgress, run_mocker_trace_replay

MODES = {
    "kv": "kv_router",
    "kv_router": "kv_router",
    "round_robin": "round_robin",
    "rr": "round_robin",
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dynamo.replay",
        description="Replay a Mooncake trace on simulated mocker workers, one run per router mode.",
    )
    p.add_argument("trace", nargs="+", type=Path, help="Mooncake JSONL trace file(s)")
    p.add_argument("--workers", type=int, default=8, help="number of workers (default 8)")
    p.add_argument(
        "--router",
        default="kv,round_robin",
        help="comma-separated router modes: kv (kv_router), round_robin (default: both)",
    )
    p.add_argument("--speedup", type=float, default=1.0, help="arrival speed-up ratio")
    p.add_argument("--out", type=Path, default=Path("replay-report"), help="output directory")
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="KV blocks per worker")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    p.add_argument(
        "--trace-block-size", type=int, default=512, help="tokens per trace hash id (default 512)"
    )
    p.add_argument(
        "--engine-args",
        default=None,
        help='extra engine args as JSON, e.g. \'{"engine": {"max_num_seqs": 128}}\'',
    )
    p.add_argument(
        "--replay-mode",
        choices=("offline", "online"),
        default="offline",
        help="offline: simulated time (default); online: wall-clock time through live "
        "in-process mocker workers (no timeline samples)",
    )
    p.add_argument("--concurrency", type=int, default=None, help="closed-loop in-flight cap")
    p.add_argument(
        "--max-sim-time-ms",
        type=float,
        default=None,
        help="stop each replay after this much simulated time, in ms (default: run the "
        "whole trace)",
    )
    p.add_argument(
        "--sla-ttft-ms",
        type=float,
        default=None,
        help="time-to-first-token SLA in ms: the summary adds goodput_* figures, the "
        "throughput of the requests that meet every SLA given (default: none)",
    )
    p.add_argument(
        "--sla-itl-ms",
        type=float,
        default=None,
        help="inter-token-latency SLA in ms, counted like --sla-ttft-ms (default: none)",
    )
    p.add_argument(
        "--sample-interval-ms",
        type=float,
        default=1000.0,
        help="timeline sampling interval in simulated ms (default 1000)",
    )
    p.add_argument("--seed", type=int, default=42, help="KV router tie-break seed")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = p.parse_args(argv)
    modes = []
    for m in args.router.split(","):
        m = m.strip()
        if m not in MODES:
            p.error(f"unknown router mode {m!r} (use kv or round_robin)")
        if MODES[m] not in modes:
            modes.append(MODES[m])
    args.modes = modes
    return args


def _engine_args(args: argparse.Namespace) -> dict[str, Any]:
    extra: dict[str, Any] = json.loads(args.engine_args) if args.engine_args else {}
    engine = dict(extra.get("engine", {}))
    if args.num_gpu_blocks is not None:
        engine["num_gpu_blocks"] = args.num_gpu_blocks
    if args.block_size is not None:
        engine["block_size"] = args.block_size
    extra["engine"] = engine
    return extra


def _count_requests(files: list[Path]) -> int:
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def _bar(label: str, done: int, total: int, started: float, final: bool = False) -> None:
    width = 30
    frac = min(done / total, 1.0) if total else 1.0
    fill = int(width * frac)
    line = (
        f"\r{label:<12} [{'#' * fill}{'-' * (width - fill)}] {done}/{total} "
        f"{time.monotonic() - started:5.1f}s"
    )
    if sys.stderr.isatty() or final:
        sys.stderr.write(line + ("\n" if final else ""))
        sys.stderr.flush()


def _run_mode(args: argparse.Namespace, mode: str, total: int) -> Any:
    progress = ReplayProgress()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["r"] = run_mocker_trace_replay(
                [str(t) for t in args.trace],
                extra_engine_args=_engine_args(args),
                num_workers=args.workers,
                router_mode=mode,
                replay_mode=args.replay_mode,
                arrival_speedup_ratio=args.speedup,
                trace_block_size=args.trace_block_size,
                replay_concurrency=args.concurrency,
                max_sim_time_ms=args.max_sim_time_ms,
                sla_ttft_ms=args.sla_ttft_ms,
                sla_itl_ms=args.sla_itl_ms,
                report_jsonl_path=str(args.out / f"per_request_{mode}.jsonl"),
                capture_per_request=True,
                capture_telemetry=True,
                telemetry_sample_interval_ms=args.sample_interval_ms,
                progress=progress,
                seed=args.seed,
            )
        except BaseException as e:  # re-raised in the main thread
            result["e"] = e

    started = time.monotonic()
    t = threading.Thread(target=work, name=f"replay-{mode}", daemon=True)
    t.start()
    while t.is_alive():
        _bar(mode, progress.completed, total, started)
        t.join(0.1)
    if "e" in result:
        raise result["e"]
    _bar(mode, progress.completed, total, started, final=True)
    return result["r"]


def _plots(out: Path, runs: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, r in runs.items():
        ttfts = sorted(x["ttft_ms"] for x in (r.per_request or []) if x.get("ttft_ms") is not None)
        if ttfts:
            ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            ax.step(ttfts, ys, where="post", label=mode)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per router mode")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ttft_cdf.png", dpi=110)
    plt.close(fig)
    written.append("ttft_cdf.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(runs)
    vals = [runs[m].summary["prefix_cache_reused_ratio"] for m in names]
    ax.bar(names, vals, color=["tab:blue", "tab:orange", "tab:green"][: len(names)])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.3f}", ha="center", va="bottom")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_title("Prefix reuse per router mode")
    fig.tight_layout()
    fig.savefig(out / "prefix_reuse.png", dpi=110)
    plt.close(fig)
    written.append("prefix_reuse.png")

    for key, fname, title in (
        ("queue_depth", "queue_depth.png", "Queued requests (all workers)"),
        ("active_kv_blocks", "active_kv_blocks.png", "Active KV blocks (all workers)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        for mode, r in runs.items():
            samples = (r.telemetry or {}).get("samples", [])
            ax.plot([s["t_ms"] / 1000 for s in samples], [s[key] for s in samples], label=mode)
        ax.set_xlabel("simulated time (s)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        written.append(fname)
    return written


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    for t in args.trace:
        if not t.is_file():
            print(f"error: trace file {t} not found", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    total = _count_requests(args.trace)
    runs: dict[str, Any] = {}
    for mode in args.modes:
        try:
            runs[mode] = _run_mode(args, mode, total)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except RuntimeError as e:
            # The simulator refused the configuration or failed mid-run: one line, no traceback.
            msg = " ".join(str(e).split())
            print(f"error: {mode}: {msg}", file=sys.stderr)
            return 1
    report = {
        "trace": [str(t) for t in args.trace],
        "workers": args.workers,
        "arrival_speedup_ratio": args.speedup,
        "replay_mode": args.replay_mode,
        "engine_args": _engine_args(args),
        "trace_block_size": args.trace_block_size,
        "modes": {m: r.summary for m, r in runs.items()},
    }
    (args.out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    for m, r in runs.items():
        tel = r.telemetry or {"samples": []}
        (args.out / f"timeline_{m}.json").write_text(json.dumps(tel["samples"]) + "\n")

    cols = [
        ("prefix reuse", "prefix_cache_reused_ratio", "{:.3f}"),
        ("TTFT mean", "mean_ttft_ms", "{:.1f}"),
        ("TTFT p50", "median_ttft_ms", "{:.1f}"),
        ("TTFT p99", "p99_ttft_ms", "{:.1f}"),
        ("ITL mean", "mean_itl_ms", "{:.2f}"),
        ("E2E mean", "mean_e2e_latency_ms", "{:.1f}"),
    ]
    print(f"{'mode':<12}" + "".join(f"{c[0]:>14}" for c in cols))
    for m, r in runs.items():
        s = r.summary
        print(f"{m:<12}" + "".join(f"{c[2].format(s[c[1]]):>14}" for c in cols))

    if args.no_plots:
        print(f"wrote {args.out}/ (plots skipped)")
        return 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "matplotlib is not installed: no PNG plots written "
            "(pip install matplotlib, or the package's [replay] extra); "
            f"summary.json, per-request JSONL and timelines are in {args.out}/",
            file=sys.stderr,
        )
        return 0
    written = _plots(args.out, runs)
    print(
        f"wrote {args.out}/: summary.json, per_request_*.jsonl, timeline_*.json, "
        + ", ".join(written)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
