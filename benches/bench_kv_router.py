"""Python-level ``KvRouter.best_worker`` latency, this project vs the reference wheel.

Usage: python benches/bench_kv_router.py [--out docs/benchmarks/kv_router.md]

One process, discovery ``file`` (temp dir), request plane ``tcp``, one worker endpoint
served on the same runtime, ``KvRouterConfig(use_kv_events=False)`` (the approximate index:
the reference needs no event plane for it, as in its own router tests). The measured prompt
was routed once with ``update_indexer=True`` so it is fully cached. Measured, sequentially
awaited from the event loop, per prompt length (block size 16):

* ``best_worker(tokens)``: query only (hash, index lookup, cost, selection);
* ``best_worker(tokens, request_id=...)`` followed by ``free(request_id)``: book and release.

The reference additionally needs a registered model card for its worker watcher
(``register_model`` with a tensor-based card) and ``DYN_ROUTER_MIN_INITIAL_WORKERS=1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BLOCK_SIZE = 16
ISLS = [256, 4096]
SECONDS = 1.5
WARMUP = 100


async def _measure(reference: bool) -> dict[str, float]:
    os.environ["DYN_FILE_KV"] = tempfile.mkdtemp(prefix="bench-kvr-")
    os.environ["DYN_ROUTER_MIN_INITIAL_WORKERS"] = "1"
    from dynamo._core import DistributedRuntime, KvRouter, KvRouterConfig

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    endpoint = runtime.endpoint("benchkv.backend.generate")
    if reference:
        from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            endpoint,
            "bench-model",
            worker_type=WorkerType.Aggregated,
            tensor_model_config={"name": "bench-model", "inputs": [], "outputs": []},
        )

    async def handler(request):
        yield {"token_ids": [1], "finish_reason": "stop"}

    served = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    client = await endpoint.client()
    await client.wait_for_instances()
    router = KvRouter(endpoint, BLOCK_SIZE, KvRouterConfig(use_kv_events=False))
    for _ in range(200):
        try:
            await router.best_worker([1] * BLOCK_SIZE)
            break
        except Exception:
            await asyncio.sleep(0.05)

    out: dict[str, float] = {}
    for isl in ISLS:
        tokens = list(range(1, isl + 1))
        _, _, _ = await router.best_worker(tokens, update_indexer=True)
        _, _, overlap = await router.best_worker(tokens)
        out[f"overlap_{isl}"] = overlap
        for _ in range(WARMUP):
            await router.best_worker(tokens)
        samples = []
        deadline = time.perf_counter() + SECONDS
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await router.best_worker(tokens)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        out[f"query_median_us_{isl}"] = statistics.median(samples) * 1e6
        out[f"query_p99_us_{isl}"] = samples[int(len(samples) * 0.99)] * 1e6

        samples = []
        i = 0
        deadline = time.perf_counter() + SECONDS
        while time.perf_counter() < deadline:
            i += 1
            rid = f"bench-{isl}-{i}"
            t0 = time.perf_counter()
            await router.best_worker(tokens, request_id=rid)
            await router.free(rid)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        out[f"book_median_us_{isl}"] = statistics.median(samples) * 1e6
        out[f"book_p99_us_{isl}"] = samples[int(len(samples) * 0.99)] * 1e6

    runtime.shutdown()
    try:
        await asyncio.wait_for(served, 10)
    except Exception:
        pass
    return out


def measure(reference: bool) -> dict[str, float]:
    return asyncio.run(_measure(reference))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, run_under_reference

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure(args.reference)))
        return

    ours = measure(False)
    ref = run_under_reference(__file__, "--reference")
    lines = [
        "# KvRouter.best_worker from Python (one worker, approximate index)",
        "",
        f"Machine: {machine()} (shared with other builds, load average "
        f"{os.getloadavg()[0]:.1f} at the end of the run; medians are the figure to read).",
        "Discovery `file`, request plane `tcp`, one process, one worker endpoint,",
        f"`KvRouterConfig(use_kv_events=False)`, block size {BLOCK_SIZE}; the prompt is fully",
        "cached (recorded once with `update_indexer=True`). Each call is awaited in turn on the",
        f"event loop for {SECONDS} s after {WARMUP} warm-up calls.",
        "Reproduce: `bash benches/setup_reference.sh && python benches/bench_kv_router.py`.",
        "",
        "| call | ISL | dynamo-rs median (µs) | reference median (µs) | ratio | "
        "dynamo-rs p99 | reference p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, label in [("query", "best_worker (query)"), ("book", "best_worker + free")]:
        for isl in ISLS:
            a, b = ours[f"{kind}_median_us_{isl}"], ref[f"{kind}_median_us_{isl}"]
            lines.append(
                f"| {label} | {isl} | {a:.1f} | {b:.1f} | {a / b:.2f}x | "
                f"{ours[f'{kind}_p99_us_{isl}']:.1f} | {ref[f'{kind}_p99_us_{isl}']:.1f} |"
            )
    lines += [
        "",
        "Overlap reported for the measured prompt (blocks): "
        + ", ".join(
            f"ISL {isl}: dynamo-rs {ours[f'overlap_{isl}']:.0f}, "
            f"reference {ref[f'overlap_{isl}']:.0f}"
            for isl in ISLS
        )
        + ".",
        "",
        "The Rust decision latency without Python (criterion, 64 workers, 10k tokens) and the",
        "routing-quality replay are in `routing_quality.md`.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
