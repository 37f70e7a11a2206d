"""Request plane across processes with real etcd and NATS, this project vs the reference.

Usage: python benches/bench_request_plane.py [--out docs/benchmarks/request_plane.md]

A worker process serves a Python handler yielding 4 items per request; a client process
(discovery ``etcd``) measures the sequential round trip (median, p99) and the throughput
with 64 requests in flight, for each request plane (``tcp``, ``nats``) and implementation.
The floor of that layout is measured beside them: a raw asyncio TCP echo between the same
two kinds of process (one request line, 4 reply lines written one by one), sequential only.
etcd and nats-server are started on free loopback ports (tests/services.py). The reference
runs in its own venv (``REF_PYTHON``, see benches/_common.py), client and worker alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_p99_ms, time_sequential

HERE = Path(__file__).resolve().parent
ITEMS = 4
CONCURRENCY = 64
#: Wall time per measurement (two per configuration; the suite runs 4 configurations).
SECONDS = 2.0
WARMUP = 200


def endpoint_path() -> str:
    # One namespace per configuration: a killed worker's registration lingers until its
    # lease expires and must not be routed to by the next configuration.
    return f"{os.environ.get('BENCH_NS', 'benchrp')}.backend.generate"


async def _serve(plane: str) -> None:
    from dynamo._core import DistributedRuntime

    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", plane)
    endpoint = runtime.endpoint(endpoint_path())

    async def handler(request):
        for i in range(ITEMS):
            yield {"i": i, "text": "token"}

    print("READY", flush=True)
    await endpoint.serve_endpoint(handler)


async def _serve_echo() -> None:
    """The floor's worker: per request line, ITEMS reply lines, each its own write."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            for i in range(ITEMS):
                writer.write(b'{"i": %d, "text": "token"}\n' % i)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def _sequential(samples: list[float]) -> dict[str, float]:
    median, p99 = median_p99_ms(samples)
    return {"latency_median_ms": median, "latency_p99_ms": p99}


async def _measure_echo() -> dict[str, float]:
    """Sequential round trip of the raw asyncio echo in a second process (the floor)."""
    worker = subprocess.Popen(
        [sys.executable, __file__, "--serve-echo"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        port = int(worker.stdout.readline())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def one() -> None:
            writer.write(b'{"prompt": "hello"}\n')
            for _ in range(ITEMS):
                await reader.readline()

        samples = await time_sequential(one, SECONDS, WARMUP)
        writer.close()
        return _sequential(samples)
    finally:
        worker.terminate()
        worker.wait(15)


async def _measure(plane: str) -> dict[str, float]:
    from dynamo._core import DistributedRuntime

    try:
        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", plane)
    except Exception as e:  # a plane this implementation does not have
        return {"error": f"{type(e).__name__}: {e}"}
    worker = subprocess.Popen(
        [sys.executable, __file__, "--serve", plane],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "READY"
        client = await runtime.endpoint(endpoint_path()).client()
        await asyncio.wait_for(client.wait_for_instances(), 30)

        async def one() -> None:
            n = 0
            async for _ in await client.round_robin({"prompt": "hello"}, annotated=False):
                n += 1
            assert n == ITEMS, n

        samples = await time_sequential(one, SECONDS, WARMUP)
        done = 0
        stop_at = time.perf_counter() + SECONDS

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await one()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - t0
        return {**_sequential(samples), "throughput_rps": done / elapsed}
    finally:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plane", default="tcp", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.serve_echo:
        asyncio.run(_serve_echo())
        return
    if args.measure_only:
        print(json.dumps(asyncio.run(_measure(args.plane))))
        return

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests"))
    from _common import machine, run_under_reference
    from services import Etcd, Nats

    etcd, nats = Etcd(), Nats()
    etcd.start()
    nats.start()
    os.environ.update(
        DYN_DISCOVERY_BACKEND="etcd",
        ETCD_ENDPOINTS=etcd.endpoint,
        NATS_SERVER=nats.url,
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYNAMO_SKIP_PYTHON_LOG_INIT="1",
    )
    results: dict[tuple[str, str], dict] = {}
    try:
        for plane in ("tcp", "nats"):
            os.environ["DYN_REQUEST_PLANE"] = plane
            os.environ["BENCH_NS"] = f"benchrp-ours-{plane}"
            results[("dynamo-rs", plane)] = asyncio.run(_measure(plane))
            os.environ["BENCH_NS"] = f"benchrp-ref-{plane}"
            results[("reference", plane)] = run_under_reference(__file__, "--plane", plane)
        results[("asyncio echo (floor)", "tcp")] = asyncio.run(_measure_echo())
    finally:
        etcd.close()
        nats.close()

    def cell(impl: str, plane: str, key: str, fmt: str) -> str:
        r = results[(impl, plane)]
        return format(r[key], fmt) if key in r else "n/a"

    lines = [
        "# Request plane across processes (discovery etcd; tcp vs nats)",
        "",
        f"Machine: {machine()}. Worker and client are separate processes; a Python handler",
        f"yields {ITEMS} items per request. Sequential latency over {SECONDS:.0f} s, then "
        f"{CONCURRENCY} concurrent requests for {SECONDS:.0f} s; real etcd "
        "and nats-server on loopback.",
        "Reproduce: `REF_PYTHON=/path/to/ref/venv/bin/python "
        "python benches/bench_request_plane.py`.",
        "",
        "| implementation | plane | latency median (ms) | latency p99 (ms) | "
        f"throughput @{CONCURRENCY} (req/s) |",
        "|---|---|---:|---:|---:|",
    ]
    for (impl, plane), _ in results.items():
        lines.append(
            f"| {impl} | {plane} | {cell(impl, plane, 'latency_median_ms', '.3f')} | "
            f"{cell(impl, plane, 'latency_p99_ms', '.3f')} | "
            f"{cell(impl, plane, 'throughput_rps', ',.0f')} |"
        )
    lines.append("")
    for (impl, plane), r in results.items():
        if "error" in r:
            lines.append(f"* {impl} / {plane}: not measured ({r['error']}).")
    ours, ref = results[("dynamo-rs", "tcp")], results[("reference", "tcp")]
    if "latency_median_ms" in ours and "latency_median_ms" in ref:
        lines.append(
            f"* tcp ratios, dynamo-rs / reference: latency "
            f"{ours['latency_median_ms'] / ref['latency_median_ms']:.2f}x, throughput "
            f"{ours['throughput_rps'] / ref['throughput_rps']:.2f}x."
        )
    floor = results[("asyncio echo (floor)", "tcp")]
    if "latency_median_ms" in ours:
        lines.append(
            f"* tcp median over the floor (asyncio echo): dynamo-rs "
            f"{ours['latency_median_ms'] / floor['latency_median_ms']:.2f}x, +"
            f"{ours['latency_median_ms'] - floor['latency_median_ms']:.3f} ms."
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
