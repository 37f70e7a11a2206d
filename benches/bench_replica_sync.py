"""Router replica sync: per-worker load spread of a burst split across two KV frontends.

Four mocker workers (separate ``python -m dynamo.mocker`` processes, each with its own
system port for ``/metrics``) behind KV-routing frontends (``python -m dynamo.frontend
--router-mode kv``), over file discovery and the brokerless TCP event plane on loopback.
Each scenario starts a fresh cluster (cold caches), warms every frontend with one request
of another prompt (its router exists and has synced), then sends ``--bursts`` bursts of
``--burst`` identical chat requests, one every ``--gap-ms``, alternately to the
frontends, and waits for each burst to finish:

* ``single``: one frontend receives every request;
* ``sync-on``: two frontends with ``--router-replica-sync``;
* ``sync-off``: two frontends without it.

Spread per worker: requests served (``dynamo_component_requests_total`` of each worker)
and the peak of its in-flight streams (``dynamo_component_inflight_requests``, sampled
every 10 ms). Reported: the per-worker figures, their coefficient of variation (stdev /
mean) and max - min.

Usage: ``python benches/bench_replica_sync.py [--bursts 6] [--burst 16] [--gap-ms 10]
[--repeat 3] [--out docs/benchmarks/kv_router.md]`` (``--out`` prints the Markdown table
to append; figures are printed either way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, machine, stop_processes

WORKERS = 4
#: About 700 tokens with the tiny model's tokenizer: its prefill is still running when the
#: burst's next request is routed, so the router's booked prefill load decides.
PROMPT = "Explain how a KV-aware router spreads identical prompts. " * 60


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except OSError:
        return 0, b""


def _chat(port: int, content: str, max_tokens: int) -> int:
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        return r.status


def _metric(port: int, name: str) -> float:
    """Sum of ``name`` over the worker's ``generate`` endpoint series."""
    _, body = _get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    total = 0.0
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name + "{") and 'endpoint="generate"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Cluster:
    def __init__(self, frontends: int, sync: bool, args: argparse.Namespace) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-replica-sync-")
        root = Path(self.tmp.name)
        from dynamo.llm.tiny_model import write_tiny_model

        model = write_tiny_model(root / "tiny")
        self.env = dict(os.environ)
        self.env.update(
            DYN_DISCOVERY_BACKEND="file",
            DYN_FILE_KV=str(root / "kv"),
            DYN_FILE_KV_TTL_SECS="2",
            DYN_TCP_RPC_HOST="127.0.0.1",
            DYN_EVENT_PLANE="tcp",
            DYN_NAMESPACE="bench",
            DYN_LOG="warn",
        )
        self.env.pop("NATS_SERVER", None)
        self.procs: list[subprocess.Popen] = []
        self.worker_ports = [free_port() for _ in range(WORKERS)]
        for port in self.worker_ports:
            env = dict(self.env, DYN_SYSTEM_PORT=str(port), DYN_SYSTEM_HOST="127.0.0.1")
            self._start(
                env,
                "-m",
                "dynamo.mocker",
                "--model-path",
                str(model),
                "--model-name",
                "tiny",
                "--block-size",
                "16",
                "--speedup-ratio",
                str(args.speedup),
            )
        self.ports = [free_port() for _ in range(frontends)]
        for port in self.ports:
            extra = ["--router-replica-sync"] if sync else []
            self._start(
                self.env,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--router-mode",
                "kv",
                *extra,
            )

    def _start(self, env: dict, *argv: str) -> None:
        self.procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        for port in self.ports:
            while True:
                status, body = _get(f"http://127.0.0.1:{port}/health", timeout=2)
                if status == 200:
                    models = json.loads(body).get("models", [])
                    if any(m["model"] == "tiny" and len(m["instances"]) == WORKERS for m in models):
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"frontend {port} never saw {WORKERS} workers")
                time.sleep(0.1)
        for port in self.worker_ports:
            while _get(f"http://127.0.0.1:{port}/metrics")[0] != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("worker metrics never came up")
                time.sleep(0.1)
        # Every frontend builds its router on its first request; replicas then exchange
        # heartbeats and snapshots. A different prompt, so no cache is warmed for the burst.
        for port in self.ports:
            _chat(port, "warm up", 4)
        time.sleep(2.0)

    def requests(self) -> list[float]:
        return [_metric(p, "dynamo_component_requests_total") for p in self.worker_ports]

    def inflight(self) -> list[float]:
        return [_metric(p, "dynamo_component_inflight_requests") for p in self.worker_ports]

    def close(self) -> None:
        stop_processes(self.procs, timeout=10)
        self.tmp.cleanup()


def _spread(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    return {
        "per_worker": [round(v, 1) for v in values],
        "cv": statistics.pstdev(values) / mean if mean else 0.0,
        "max_min": max(values) - min(values),
    }


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    frontends, sync = {"single": (1, False), "sync-on": (2, True), "sync-off": (2, False)}[name]
    cluster = Cluster(frontends, sync, args)
    try:
        cluster.wait_ready()
        first = cluster.requests()
        per_burst = []
        with ThreadPoolExecutor(max_workers=args.burst) as pool:
            for _ in range(args.bursts):
                before = cluster.requests()
                futures = []
                for i in range(args.burst):
                    port = cluster.ports[i % len(cluster.ports)]
                    futures.append(pool.submit(_chat, port, PROMPT, args.max_tokens))
                    time.sleep(args.gap_ms / 1000)
                for f in futures:
                    assert f.result() == 200
                after = cluster.requests()
                per_burst.append([a - b for a, b in zip(after, before, strict=True)])
        served = [a - b for a, b in zip(cluster.requests(), first, strict=True)]
        spreads = [_spread(c) for c in per_burst]
        even = args.burst % WORKERS == 0
        return {
            "scenario": name,
            "requests": _spread(served),
            "burst_cv": statistics.fmean(x["cv"] for x in spreads),
            "burst_max_min": statistics.fmean(x["max_min"] for x in spreads),
            # Bursts whose requests landed as evenly as possible.
            "even_bursts": (
                sum(1 for c in per_burst if max(c) - min(c) <= (0 if even else 1)) / len(per_burst)
            ),
        }
    finally:
        cluster.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, default=20)
    p.add_argument("--burst", type=int, default=WORKERS)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows: dict[str, list[dict]] = {}
    for _ in range(args.repeat):
        for name in ("single", "sync-on", "sync-off"):
            r = run_scenario(name, args)
            rows.setdefault(name, []).append(r)
            print(json.dumps(r), flush=True)
    lines = [
        f"Machine: {machine()}. `python {' '.join(sys.argv)}`: {args.bursts} bursts of "
        f"{args.burst} identical requests (one every {args.gap_ms:g} ms, alternately to the "
        f"frontends; each burst waits for the previous one), mocker speedup {args.speedup:g}, "
        f"max_tokens {args.max_tokens}; mean of {args.repeat} fresh clusters per scenario.",
        "",
        "| scenario | requests per worker, whole run (last cluster) | CV, whole run "
        "| CV per burst | max-min per burst | evenly spread bursts |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, rs in rows.items():
        lines.append(
            f"| {name} | {rs[-1]['requests']['per_worker']} "
            f"| {statistics.fmean(r['requests']['cv'] for r in rs):.3f} "
            f"| {statistics.fmean(r['burst_cv'] for r in rs):.3f} "
            f"| {statistics.fmean(r['burst_max_min'] for r in rs):.2f} "
            f"| {statistics.fmean(r['even_bursts'] for r in rs):.0%} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        print(f"(append the table above to {args.out})")


if __name__ == "__main__":
    main()
