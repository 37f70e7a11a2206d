"""Selection service speed, side by side with the reference's own service in one run.

For each implementation (ours, then ai-dynamo-runtime 1.6.1 under ``REF_PYTHON``):

* **ZMQ ingest**: 64 workers, each with its own ZMQ PUB socket (vLLM's msgpack format, in
  a separate publisher process that is the same for both sides); after a warm-up every
  publisher sends ``--events`` single-block stores as fast as it can; KV events/s is
  ``64 * events`` over the time until the service's ``overlap_scores`` shows every chain
  complete. The publisher is ``--publisher rust`` (default: the project's
  ``examples/zmq_kv_publisher``, every message encoded before the burst, one thread
  queueing all of them in a few milliseconds, so the subscriber side is what is measured)
  or ``--publisher python`` (pyzmq, one process: the earlier runs, publisher-bound).
* **in process**: ``await SelectionService.select`` with a 10k-token prompt against the 64
  workers (their caches hold the first ``events + 1`` blocks): p50 / p99 latency and
  selections/s on one thread.
* **over HTTP**: the implementation's ``python -m dynamo.select_service`` on loopback, the
  same 64 workers registered over HTTP, ``POST /select`` with the 10k-token prompt on one
  keep-alive connection: p50 / p99 and selections/s.

    python benches/bench_selection.py [--workers 64] [--events 200] [--selects 2000] \
        [--publisher rust|python]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BS = 16
PROMPT = list(range(10_000))


def block_tokens(j: int) -> list[int]:
    return PROMPT[j * BS : (j + 1) * BS]


# ----------------------------------------------------------------------------------------
# Publisher process (pyzmq; run with this project's interpreter for both sides)
# ----------------------------------------------------------------------------------------


def publisher(n: int, k: int) -> None:
    import msgpack
    import zmq

    ctx = zmq.Context()
    socks = []
    for _ in range(n):
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.bind_to_random_port("tcp://127.0.0.1")
        socks.append(s)
    ports = [int(s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]) for s in socks]
    print(json.dumps(ports), flush=True)
    seq = 0

    def msg(j: int) -> list[bytes]:
        nonlocal seq
        seq += 1
        ev = [
            "BlockStored",
            [1000 + j],
            None if j == 0 else 999 + j,
            block_tokens(j),
            BS,
            None,
            "GPU",
        ]
        return [b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), [ev], 0])]

    def clear() -> list[bytes]:
        nonlocal seq
        seq += 1
        return [
            b"",
            seq.to_bytes(8, "big"),
            msgpack.packb([time.time(), [["AllBlocksCleared"]], 0]),
        ]

    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "clear":
            m = clear()
            for s in socks:
                s.send_multipart(m)
        elif cmd == "warm":
            m = msg(0)
            for s in socks:
                s.send_multipart(m)
        elif cmd == "burst":
            for j in range(1, k + 1):
                m = msg(j)
                for s in socks:
                    s.send_multipart(m)
            print("sent", flush=True)
        elif cmd == "exit":
            break
    ctx.destroy(linger=0)


# ----------------------------------------------------------------------------------------
# Measurement (runs under ours or the reference)
# ----------------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pubs:
    def __init__(self, n: int, k: int) -> None:
        rust = os.environ.get("BENCH_PUB_BIN")
        if rust:
            cmd = [rust, str(n), str(k), str(BS)]
        else:
            cmd = [os.environ["BENCH_PUB_PYTHON"], __file__, "--publisher-process", str(n), str(k)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ports = json.loads(self.proc.stdout.readline())

    def cmd(self, c: str) -> None:
        self.proc.stdin.write(c + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self.cmd("exit")
        self.proc.wait(timeout=30)


def worker_dict(i: int, port: int) -> dict:
    return {
        "worker_id": i + 1,
        "model_name": "bench",
        "block_size": BS,
        "endpoint": f"http://w{i + 1}",
        "kv_events_endpoint": f"tcp://127.0.0.1:{port}",
    }


async def measure_inproc(n: int, k: int, selects: int, rounds: int) -> dict:
    from dynamo._core import SelectionService

    pubs = Pubs(n, k)
    svc = SelectionService()
    for i, p in enumerate(pubs.ports):
        await svc.upsert_worker(worker_dict(i, p))

    async def blocks_seen(query_blocks: int) -> list[int]:
        r = await svc.overlap_scores(
            {"model_name": "bench", "token_ids": PROMPT[: query_blocks * BS]}
        )
        return [w["device_blocks"] for w in r["workers"]]

    async def ingest_round(first: bool) -> float:
        """One timed burst of ``k`` stores per worker; seconds until all are indexed."""
        deadline = time.monotonic() + 60
        if not first:
            # Drop the previous round's chains and wait until every worker shows none.
            pubs.cmd("clear")
            while max(await blocks_seen(1)) > 0:
                await asyncio.sleep(0.002)
                assert time.monotonic() < deadline, "clear timed out"
        while min(await blocks_seen(1) or [0]) < 1:
            pubs.cmd("warm")
            await asyncio.sleep(0.05)
            assert time.monotonic() < deadline, "warm-up timed out"
        t0 = time.perf_counter()
        pubs.cmd("burst")
        while min(await blocks_seen(k + 1)) < k + 1:
            await asyncio.sleep(0.002)
            assert time.perf_counter() - t0 < 300, "ingest timed out"
        ingest_s = time.perf_counter() - t0
        pubs.proc.stdout.readline()
        return ingest_s

    rates = [n * k / await ingest_round(r == 0) for r in range(rounds)]
    req = {"model_name": "bench", "token_ids": PROMPT}
    for _ in range(50):
        await svc.select(req)
    lat = []
    start = time.perf_counter()
    for _ in range(selects):
        t = time.perf_counter_ns()
        await svc.select(req)
        lat.append((time.perf_counter_ns() - t) / 1000)
    total = time.perf_counter() - start
    svc.shutdown()
    pubs.close()
    return {
        "events_per_s": statistics.median(rates),
        "events_per_s_max": max(rates),
        "inproc_p50_us": pct(lat, 0.5),
        "inproc_p99_us": pct(lat, 0.99),
        "inproc_mean_us": statistics.fmean(lat),
        "inproc_selects_per_s": selects / total,
    }


def measure_http(n: int, k: int, selects: int, ours: bool) -> dict:
    pubs = Pubs(n, k)
    port = free_port()
    args = [sys.executable, "-m", "dynamo.select_service", "--port", str(port)]
    if ours:
        args += ["--host", "127.0.0.1"]
    env = {**os.environ, "DYN_LOG": "error"}
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/"
    )
    try:
        conn = None
        deadline = time.monotonic() + 30
        while conn is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("GET", "/health")
                c.getresponse().read()
                conn = c
            except OSError:
                assert time.monotonic() < deadline, "service did not start"
                time.sleep(0.1)
        hdr = {"Content-Type": "application/json"}

        def post(path: str, body: dict) -> tuple[int, dict]:
            conn.request("POST", path, json.dumps(body), hdr)
            r = conn.getresponse()
            return r.status, json.loads(r.read())

        for i, p in enumerate(pubs.ports):
            assert post("/workers", worker_dict(i, p))[0] == 201
        q = {"model_name": "bench", "token_ids": PROMPT[:BS]}
        while True:
            pubs.cmd("warm")
            time.sleep(0.05)
            _, r = post("/overlap_scores", q)
            if min(w["device_blocks"] for w in r["workers"]) >= 1:
                break
            assert time.monotonic() < deadline + 60, "warm-up timed out"
        pubs.cmd("burst")
        pubs.proc.stdout.readline()
        q = {"model_name": "bench", "token_ids": PROMPT[: (k + 1) * BS]}
        while min(w["device_blocks"] for w in post("/overlap_scores", q)[1]["workers"]) < k + 1:
            time.sleep(0.01)
        body = json.dumps({"model_name": "bench", "token_ids": PROMPT})
        for _ in range(20):
            conn.request("POST", "/select", body, hdr)
            conn.getresponse().read()
        lat = []
        start = time.perf_counter()
        for _ in range(selects):
            t = time.perf_counter_ns()
            conn.request("POST", "/select", body, hdr)
            r = conn.getresponse()
            r.read()
            assert r.status == 200
            lat.append((time.perf_counter_ns() - t) / 1000)
        total = time.perf_counter() - start
        return {
            "http_p50_us": pct(lat, 0.5),
            "http_p99_us": pct(lat, 0.99),
            "http_selects_per_s": selects / total,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        pubs.close()


def measure(n: int, k: int, selects: int, ours: bool, rounds: int) -> dict:
    out = asyncio.run(measure_inproc(n, k, selects, rounds))
    out.update(measure_http(n, k, max(200, selects // 4), ours))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--selects", type=int, default=2000)
    ap.add_argument(
        "--ingest-rounds",
        type=int,
        default=5,
        help="timed ingest bursts (the chains are cleared in between); the median is reported",
    )
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--ours", action="store_true")
    ap.add_argument("--publisher", choices=["rust", "python"], default="rust")
    ap.add_argument("--publisher-process", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.publisher_process:
        publisher(*a.publisher_process)
        return
    if a.measure_only:
        print(json.dumps(measure(a.workers, a.events, a.selects, a.ours, a.ingest_rounds)))
        return
    from _common import machine, run_under_reference

    os.environ["BENCH_PUB_PYTHON"] = sys.executable
    if a.publisher == "rust" and "BENCH_PUB_BIN" not in os.environ:
        # BENCH_PUB_BIN set: use that publisher binary as it is (no cargo build).
        root = Path(__file__).resolve().parent.parent
        target = Path(
            os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache" / "dynamo-rs-target")
        )
        subprocess.run(
            ["cargo", "build", "-q", "--release", "-p", "dynamo-llm", "--example",
             "zmq_kv_publisher"],
            cwd=root, check=True, env={**os.environ, "CARGO_TARGET_DIR": str(target)},
        )  # fmt: skip
        os.environ["BENCH_PUB_BIN"] = str(target / "release" / "examples" / "zmq_kv_publisher")
    common = [
        "--workers", str(a.workers), "--events", str(a.events), "--selects", str(a.selects),
        "--ingest-rounds", str(a.ingest_rounds),
    ]  # fmt: skip
    ours = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--measure-only", "--ours", *common],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    ref = run_under_reference(__file__, *common)
    print(
        f"machine: {machine()}; {a.workers} workers, 10k-token prompt, block size {BS}, "
        f"{a.publisher} publisher"
    )
    print(f"{'metric':28} {'ours':>12} {'reference':>12} {'ratio':>8}")
    for key in ours:
        o, r = ours[key], ref[key]
        better = r / o if key.endswith("_us") else o / r
        print(f"{key:28} {o:12.1f} {r:12.1f} {better:7.2f}x")


if __name__ == "__main__":
    main()
