"""Forward-pass metrics: cost of FpmDirectPublisher.publish from Python (µs per call) and
publisher → subscriber latency (p50/p99) on the event planes, this project vs the
reference wheel.

Usage: python benches/bench_fpm.py [--rounds 3] [--nats] [--out docs/benchmarks/fpm.md]

Publish cost: the best of 10 batches of 5,000 back-to-back calls.

Latency: each sample publishes a snapshot whose ``wall_time_secs`` carries the send time
(``time.time()``); a ``FpmEventSubscriber.recv`` thread in the same process notes the
receive time (heartbeats, with wall time 0, are skipped). One snapshot every 2 ms, so the
figure is the delivery latency of a lightly loaded channel, not of a saturated one. The
reference runs in its own venv (benches/_common.py); ``--nats`` starts a nats-server
(tests/services.py) and measures both over NATS too. The order of ours / the reference
alternates per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

ZERO = dict(
    scheduled_num_prefill_requests=1,
    scheduled_sum_prefill_tokens=128,
    scheduled_sum_prefill_kv_tokens=0,
    scheduled_num_decode_requests=8,
    scheduled_sum_decode_kv_tokens=4096,
    queued_num_prefill_requests=0,
    queued_sum_prefill_tokens=0,
    queued_num_decode_requests=0,
    queued_sum_decode_kv_tokens=0,
)
PUBLISH_CALLS = 50_000
LATENCY_SAMPLES = 1_000


async def _measure(plane: str) -> dict[str, float]:
    import msgpack

    from dynamo._core import DistributedRuntime, FpmDirectPublisher, FpmEventSubscriber

    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "mem", "tcp")
    ep = rt.endpoint(f"bench{os.getpid()}.backend.generate")
    pub = FpmDirectPublisher(ep, "w", 1)
    # Publish cost: back-to-back calls (serialisation happens on the rank task).
    kw = dict(ZERO, dp_rank=0, wall_time_secs=0.01)
    for _ in range(1000):
        pub.publish(**kw)
    # Best of several batches: on a shared machine the minimum is the cost of the call,
    # the rest is other processes' time slices.
    batches = []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(PUBLISH_CALLS // 10):
            pub.publish(**kw)
        batches.append((time.perf_counter() - t0) / (PUBLISH_CALLS // 10) * 1e6)
        await asyncio.sleep(0.05)  # let the rank task drain
    per_call_us = min(batches)
    await asyncio.sleep(0.5)

    sub = FpmEventSubscriber(ep)
    lat: list[float] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            raw = sub.recv()
            if raw is None:
                return
            now = time.time()
            sent = msgpack.unpackb(raw)["wall_time"]
            if sent > 1e9:
                lat.append(now - sent)
                if len(lat) >= LATENCY_SAMPLES:
                    done.set()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    await asyncio.sleep(1.0)  # subscriber connected
    deadline = time.monotonic() + 30
    while not done.is_set() and time.monotonic() < deadline:
        pub.publish(**dict(ZERO, dp_rank=0, wall_time_secs=time.time()))
        await asyncio.sleep(0.002)
    pub.shutdown()
    sub.shutdown()
    rt.shutdown()
    lat.sort()
    if not lat:
        return {"publish_us": per_call_us, "p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "publish_us": per_call_us,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
        "samples": len(lat),
        "plane": plane,
    }


def measure(plane: str) -> dict[str, float]:
    return asyncio.run(_measure(plane))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _common import machine, run_under_reference

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plane", default="tcp", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nats", action="store_true", help="also measure over NATS")
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure(args.plane)))
        return

    planes = ["tcp"]
    nats = None
    if args.nats:
        from services import Nats

        nats = Nats()
        nats.start()
        planes.append("nats")
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        for r in range(args.rounds):
            for plane in planes:
                if plane == "nats":
                    os.environ["NATS_SERVER"] = nats.url  # type: ignore[union-attr]
                    os.environ["DYN_EVENT_PLANE"] = "nats"
                else:
                    os.environ.pop("DYN_EVENT_PLANE", None)
                order = ["ours", "reference"] if r % 2 == 0 else ["reference", "ours"]
                for who in order:
                    try:
                        res = (
                            measure(plane)
                            if who == "ours"
                            else run_under_reference(__file__, "--plane", plane)
                        )
                    except Exception as e:
                        print(plane, who, "failed:", e, flush=True)
                        continue
                    results.setdefault((plane, who), []).append(res)
                    print(plane, who, res, flush=True)
    finally:
        if nats is not None:
            nats.close()

    def median(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2]

    lines = [
        "# Forward-pass metrics: publish cost and delivery latency",
        "",
        f"Machine: {machine()} (shared with other jobs while measuring: figures are noisy).",
        "",
        f"Command: `python benches/bench_fpm.py --rounds {args.rounds}"
        + (" --nats" if args.nats else "")
        + "` (medians over rounds; ours and the reference alternate).",
        "",
        "| event plane | implementation | publish (µs/call) | latency p50 (ms) | latency p99 (ms) |",
        "|---|---|---|---|---|",
    ]
    for plane in planes:
        for who in ["ours", "reference"]:
            rs = results.get((plane, who), [])
            if not rs:
                continue
            lines.append(
                f"| {plane} | {who} | {median([x['publish_us'] for x in rs]):.2f} | "
                f"{median([x['p50_ms'] for x in rs]):.3f} | {median([x['p99_ms'] for x in rs]):.3f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
