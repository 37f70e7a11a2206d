"""Request round trip through the runtime, this project vs the reference wheel.

Usage: python benches/bench_runtime.py [--out docs/benchmarks/runtime.md]
       python benches/bench_runtime.py --ours-only     # this project only, JSON
       python benches/bench_runtime.py --sequential N  # N round trips, for strace -c -f

One process, discovery ``mem``, request plane ``tcp``: a Python handler yielding 4 items
per request is served and called through a client on the same event loop. The client
reaches this process's own listener in process (no socket; ``DYN_TCP_IN_PROCESS=0`` for
loopback TCP, the path callers in other processes take: benches/bench_request_plane.py).
Measured:

* sequential round-trip latency (send, receive all 4 items), median and p99;
* throughput with 64 requests in flight;
* floors (this project's interpreter only, issue 19): the same sequential round trip with
  an empty handler (no items: the request plane's fixed cost), and a raw asyncio TCP echo
  on the same event loop (client and server in one process, one 4-line reply per request:
  what any asyncio program pays for a loopback round trip).

Both implementations run the same code in one run; the reference runs in its own venv
(``REF_PYTHON``, see benches/_common.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_p99_ms, time_sequential

ITEMS = 4
CONCURRENCY = 64
#: Wall time per measurement; long enough for stable medians on a noisy 2-core machine.
SECONDS = 3.0
WARMUP = 200


async def _floors() -> dict[str, float]:
    """Empty-handler round trip through the runtime and a raw asyncio TCP echo."""
    from dynamo._core import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    endpoint = runtime.endpoint("bench.backend.empty")

    async def empty(request):
        return
        yield  # an async generator that yields nothing

    served = asyncio.ensure_future(endpoint.serve_endpoint(empty))
    client = await endpoint.client()
    await client.wait_for_instances()

    async def one_empty() -> None:
        async for _ in await client.round_robin({"prompt": "hello"}, annotated=False):
            pass

    empty_p50, _ = median_p99_ms(await time_sequential(one_empty, SECONDS, WARMUP))
    runtime.shutdown()
    try:
        await asyncio.wait_for(served, 10)
    except Exception:
        pass

    reply = b"".join(b'{"i": %d, "text": "token"}\n' % i for i in range(ITEMS))

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            writer.write(reply)
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def one_echo() -> None:
        writer.write(b'{"prompt": "hello"}\n')
        for _ in range(ITEMS):
            await reader.readline()

    echo_p50, _ = median_p99_ms(await time_sequential(one_echo, SECONDS, WARMUP))
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    # Let the echo handler see the end of its stream and return: cancelled by the loop's
    # shutdown instead, it would print a CancelledError traceback.
    await asyncio.sleep(0.01)
    return {"empty_handler_median_ms": empty_p50, "asyncio_echo_median_ms": echo_p50}


@contextlib.asynccontextmanager
async def _served():
    """A runtime (mem discovery, tcp request plane) serving the ITEMS-item handler; yields
    one sequential round trip as a coroutine function, and shuts the runtime down after."""
    from dynamo._core import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    endpoint = runtime.endpoint("bench.backend.generate")

    async def handler(request):
        for i in range(ITEMS):
            yield {"i": i, "text": "token"}

    served = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    client = await endpoint.client()
    await client.wait_for_instances()

    async def one() -> None:
        stream = await client.round_robin({"prompt": "hello"}, annotated=False)
        n = 0
        async for _ in stream:
            n += 1
        assert n == ITEMS, n

    try:
        yield one
    finally:
        runtime.shutdown()
        try:
            await asyncio.wait_for(served, 10)
        except Exception:
            pass


async def _measure() -> dict[str, float]:
    async with _served() as one:
        return await _measure_with(one)


async def _measure_with(one) -> dict[str, float]:
    median, p99 = median_p99_ms(await time_sequential(one, SECONDS, WARMUP))

    done = 0
    stop_at = time.perf_counter() + SECONDS

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await one()
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - t0
    return {"latency_median_ms": median, "latency_p99_ms": p99, "throughput_rps": done / elapsed}


def measure() -> dict[str, float]:
    return asyncio.run(_measure())


async def _sequential(count: int) -> float:
    """``count`` sequential round trips after the warm-up (for ``strace -c -f``); returns
    the mean in microseconds."""
    async with _served() as one:
        for _ in range(WARMUP):
            await one()
        t0 = time.perf_counter()
        for _ in range(count):
            await one()
        return (time.perf_counter() - t0) / count * 1e6


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, run_under_reference

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    parser.add_argument(
        "--ours-only",
        action="store_true",
        help="measure this project only (with the floors) and print JSON",
    )
    parser.add_argument(
        "--sequential",
        type=int,
        metavar="N",
        help=f"only N sequential round trips after {WARMUP} warm-up ones (for strace -c -f)",
    )
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure()))
        return
    if args.sequential:
        print(json.dumps({"sequential_mean_us": asyncio.run(_sequential(args.sequential))}))
        return
    if args.ours_only:
        print(json.dumps({**measure(), **asyncio.run(_floors())}))
        return

    ours = measure()
    floors = asyncio.run(_floors())
    ref = run_under_reference(__file__)
    lat_ratio = ours["latency_median_ms"] / ref["latency_median_ms"]
    tput_ratio = ours["throughput_rps"] / ref["throughput_rps"]
    lines = [
        "# Runtime round trip (discovery mem, request plane tcp, one process)",
        "",
        f"Machine: {machine()}. A Python handler yields {ITEMS} items per request; the client",
        "runs on the same event loop. Sequential latency over "
        f"{SECONDS:.0f} s, then {CONCURRENCY} concurrent requests for {SECONDS:.0f} s.",
        "Reproduce: `REF_PYTHON=/path/to/ref/venv/bin/python python benches/bench_runtime.py`.",
        "Both sides run back to back on the same (possibly shared) machine; p99 reflects",
        "scheduling noise from other load more than either implementation.",
        "",
        "| metric | dynamo-rs | reference | ratio |",
        "|---|---:|---:|---:|",
        f"| latency median (ms) | {ours['latency_median_ms']:.3f} | "
        f"{ref['latency_median_ms']:.3f} | {lat_ratio:.2f}x |",
        f"| latency p99 (ms) | {ours['latency_p99_ms']:.3f} | {ref['latency_p99_ms']:.3f} | "
        f"{ours['latency_p99_ms'] / ref['latency_p99_ms']:.2f}x |",
        f"| throughput @{CONCURRENCY} (req/s) | {ours['throughput_rps']:,.0f} | "
        f"{ref['throughput_rps']:,.0f} | {tput_ratio:.2f}x |",
        "",
        "Targets (issue 4): latency <= 0.2x the reference, throughput >= 5x; issue 19: "
        "sequential latency <= 0.1 ms.",
        "",
        "Floors (this project's interpreter, same process layout, sequential medians):",
        "",
        "| floor | median (ms) |",
        "|---|---:|",
        f"| runtime round trip, empty handler (no items) | "
        f"{floors['empty_handler_median_ms']:.3f} |",
        f"| raw asyncio TCP echo, {ITEMS} lines per request | "
        f"{floors['asyncio_echo_median_ms']:.3f} |",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
