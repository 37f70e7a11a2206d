"""Frontend + 1 mocker worker (speedup 1000, 16 output tokens), this project vs the reference.

Both implementations are started by ``serve_launcher.py`` (the same entry-point calls) over
file discovery on loopback, and measured by the same load generator, which runs in this
script's interpreter for both: a minimal asyncio HTTP/1.1 keep-alive client that streams a
chat completion and reads it to ``data: [DONE]``.

* sequential p50/p99 latency of one streaming request (max_tokens 16);
* at 128 concurrent streams: requests/s, and server CPU per request (user + system time of
  the frontend and worker processes, from /proc, over the phase, divided by requests).

Usage: ``python benches/bench_frontend.py [--requests N] [--out docs/benchmarks/frontend.md]``
(``REF_PYTHON`` selects the reference interpreter, see ``_common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, reference_python

LAUNCHER = Path(__file__).resolve().parent / "serve_launcher.py"
BODY = json.dumps(
    {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about routing."}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()
CONCURRENCY = 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Conn:
    """One keep-alive HTTP/1.1 connection that streams chat completions."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode()
        self.writer.write(head + BODY)
        buf = b""
        # The SSE body is chunked; it ends with [DONE] and the zero-length chunk.
        while not (b"[DONE]" in buf and buf.endswith(b"0\r\n\r\n")):
            try:
                data = await asyncio.wait_for(self.reader.read(65536), 30)
            except TimeoutError:
                raise RuntimeError(f"no end of stream after 30 s; got {buf[-300:]!r}") from None
            if not data:
                raise RuntimeError(f"connection closed; got {buf[:300]!r}")
            buf += data
        if not buf.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(buf[:300])


async def _sequential(port: int, n: int) -> list[float]:
    conn = Conn(port)
    for _ in range(20):  # warm-up
        await conn.request()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await conn.request()
        out.append(time.perf_counter() - t)
    return out


async def _concurrent(port: int, total: int) -> float:
    conns = [Conn(port) for _ in range(CONCURRENCY)]
    remaining = total

    async def run(c: Conn) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await c.request()

    await asyncio.gather(*(c.request() for c in conns))  # connect and warm up
    t = time.perf_counter()
    await asyncio.gather(*(run(c) for c in conns))
    return time.perf_counter() - t


def measure(python: str, model_dir: str, requests: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as tmp:
        mocker_args = json.dumps({"speedup_ratio": 1000.0, "block_size": 16})
        env = dict(os.environ, DYN_FILE_KV=f"{tmp}/kv", DYN_LOG="warn")
        env.pop("PYTHONPATH", None)
        port = _free_port()
        logs = open(Path(tmp) / "servers.log", "wb")
        procs = [
            subprocess.Popen(
                [python, str(LAUNCHER), "frontend", str(port)], env=env, stdout=logs, stderr=logs
            ),
            subprocess.Popen(
                [python, str(LAUNCHER), "mocker", model_dir, mocker_args],
                env=env,
                stdout=logs,
                stderr=logs,
            ),
        ]
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/v1/models", timeout=2
                    ) as r:
                        if any(m["id"] == "tiny" for m in json.loads(r.read())["data"]):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    logs.flush()
                    raise SystemExit((Path(tmp) / "servers.log").read_text()[-3000:])
                time.sleep(0.2)
            time.sleep(1.0)  # let the frontend's client see the worker instance
            lat = asyncio.run(_sequential(port, requests))
            total = requests * 4
            cpu0 = sum(_cpu_seconds(p.pid) for p in procs)
            wall = asyncio.run(_concurrent(port, total))
            cpu = sum(_cpu_seconds(p.pid) for p in procs) - cpu0
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
    lat.sort()
    return {
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1e3,
        "rps": total / wall,
        "cpu_ms_per_req": cpu / total * 1e3,
        "requests": total,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--out", default=None)
    p.add_argument("--ours-only", action="store_true", help="skip the reference (see frontend.md)")
    a = p.parse_args()
    from dynamo.llm.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        ours = measure(sys.executable, model, a.requests)
        if a.ours_only:
            ref = {k: float("nan") for k in ours}
        else:
            ref_py = reference_python()
            if ref_py is None:
                raise SystemExit("reference interpreter not found: set REF_PYTHON")
            ref = measure(str(ref_py), model, a.requests)
    rows = [
        ("sequential p50 latency (ms)", "p50_ms", "lower"),
        ("sequential p99 latency (ms)", "p99_ms", "lower"),
        (f"requests/s at {CONCURRENCY} streams", "rps", "higher"),
        (f"server CPU per request at {CONCURRENCY} streams (ms)", "cpu_ms_per_req", "lower"),
    ]
    lines = [
        "| metric | dynamo-rs | reference 1.6.1 | ratio (ours / ref) |",
        "|---|---:|---:|---:|",
    ]
    for label, key, _ in rows:
        lines.append(f"| {label} | {ours[key]:.2f} | {ref[key]:.2f} | {ours[key] / ref[key]:.2f} |")
    table = "\n".join(lines)
    print(f"machine: {machine()}\n{table}")
    print(json.dumps({"ours": ours, "reference": ref}))
    if a.out and not a.ours_only:
        Path(a.out).write_text(
            "# Frontend benchmark\n\n"
            "`python benches/bench_frontend.py --out docs/benchmarks/frontend.md`: frontend + 1 "
            "mocker worker (speedup 1000, block size 16, 16 output tokens, streaming chat), "
            "both started through `EntrypointArgs` -> `make_engine` -> `run_input` "
            "(`benches/serve_launcher.py`), same asyncio HTTP/1.1 load generator, one run.\n\n"
            f"Machine: {machine()}. Requests: {a.requests} sequential, {ours['requests']} at "
            f"{CONCURRENCY} concurrent streams.\n\n{table}\n\n"
            "Server CPU counts the frontend and the worker process (user + system, /proc). "
            "The 128-stream phase is client-bound on small machines: the load generator "
            "shares the cores with both servers.\n"
        )


if __name__ == "__main__":
    main()
