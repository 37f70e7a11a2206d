"""Replica sync of the standalone select services: per-worker spread of a burst split
across two ``python -m dynamo.select_service`` processes, ours beside the reference's.

Four workers are registered on every service (their KV-event endpoints are pyzmq PUB
sockets on loopback; no KV events are sent, so only booked load steers the choice). Each
burst is ``--burst`` identical prompts (``select_and_reserve``), sent ``--gap-ms`` apart
and alternately to the services of the scenario; the burst's reservations are freed
before the next one. Per burst, the number of reservations each worker got; reported: the
mean coefficient of variation (stdev / mean) and max - min per burst, and the share of
bursts spread evenly (max - min <= 1).

* ``single``: one service receives every request;
* ``sync-on``: two services with ``--replica-sync-port`` / ``--replica-sync-peers`` naming
  each other;
* ``sync-off``: two services without replica sync.

Usage: ``python benches/bench_selection_replica_sync.py [--bursts 50] [--burst 4]
[--gap-ms 2] [--reference PYTHON]``. The reference's services run with the reference's
interpreter (black box, subprocess only): ``--reference`` or ``REF_PYTHON``, by default the
venv of ``benches/setup_reference.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_REF_PYTHON, free_port, machine

WORKERS = 4
BS = 16
PROMPT = list(range(1024))


def _call(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


class Svc:
    def __init__(self, python: str, ours: bool, sync_port: int | None, peer: int | None) -> None:
        self.port = free_port()
        args = [python, "-m", "dynamo.select_service", "--port", str(self.port)]
        if ours:
            args += ["--host", "127.0.0.1"]
        if sync_port is not None:
            args += ["--replica-sync-port", str(sync_port)]
            if peer is not None:
                args += ["--replica-sync-peers", f"tcp://127.0.0.1:{peer}"]
        env = {**os.environ, "DYN_LOG": "error", "RUST_LOG": "error"}
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if _call(self.port, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"select service did not start: {self.proc.stderr.read().decode()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _cluster(python: str, ours: bool, scenario: str, endpoints: list[str]) -> list[Svc]:
    if scenario == "single":
        svcs = [Svc(python, ours, None, None)]
    elif scenario == "sync-off":
        svcs = [Svc(python, ours, None, None), Svc(python, ours, None, None)]
    else:
        pa, pb = free_port(), free_port()
        svcs = [Svc(python, ours, pa, pb), Svc(python, ours, pb, pa)]
    for s in svcs:
        for i, ep in enumerate(endpoints):
            w = {
                "worker_id": i + 1,
                "model_name": "m",
                "block_size": BS,
                "endpoint": f"http://w{i + 1}",
                "kv_events_endpoint": ep,
            }
            status, body = _call(s.port, "POST", "/workers", w)
            assert status == 201, body
    for s in svcs:
        deadline = time.monotonic() + 20
        while _call(s.port, "GET", "/ready")[0] != 200:
            assert time.monotonic() < deadline, "workers not schedulable"
            time.sleep(0.05)
    if scenario == "sync-on":
        time.sleep(3.0)  # subscriptions both ways (re-dial backs off up to 2 s)
    return svcs


def run(
    python: str, ours: bool, scenario: str, args: argparse.Namespace, endpoints: list[str]
) -> dict:
    svcs = _cluster(python, ours, scenario, endpoints)
    try:
        cvs, spans, even = [], [], 0
        totals = [0] * WORKERS
        for b in range(args.bursts):
            counts = [0] * WORKERS
            ids = []
            for i in range(args.burst):
                svc = svcs[i % len(svcs)]
                sid = f"b{b}-{i}"
                status, r = _call(
                    svc.port,
                    "POST",
                    "/select_and_reserve",
                    {"model_name": "m", "token_ids": PROMPT, "selection_id": sid},
                )
                assert status == 200, r
                counts[r["worker_id"] - 1] += 1
                ids.append((svc, sid))
                time.sleep(args.gap_ms / 1000)
            for svc, sid in ids:
                _call(svc.port, "DELETE", f"/reservations/{sid}")
            time.sleep(0.05)  # frees reach the peer before the next burst
            mean = statistics.fmean(counts)
            cvs.append(statistics.pstdev(counts) / mean)
            spans.append(max(counts) - min(counts))
            even += max(counts) - min(counts) <= 1
            totals = [t + c for t, c in zip(totals, counts, strict=True)]
        return {
            "cv": statistics.fmean(cvs),
            "span": statistics.fmean(spans),
            "even": even / args.bursts,
            "totals": totals,
        }
    finally:
        for s in svcs:
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, default=50)
    p.add_argument("--burst", type=int, default=WORKERS)
    p.add_argument("--gap-ms", type=float, default=2.0)
    p.add_argument("--reference", default=os.environ.get("REF_PYTHON", str(DEFAULT_REF_PYTHON)))
    p.add_argument("--only", choices=["ours", "reference"], default=None)
    args = p.parse_args()
    ctx = zmq.Context()
    pubs = [ctx.socket(zmq.PUB) for _ in range(WORKERS)]
    endpoints = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in pubs]
    impls = [("ours", sys.executable, True)]
    if args.reference and Path(args.reference).exists():
        impls.append(("reference 1.6.1", args.reference, False))
    if args.only:
        impls = [i for i in impls if i[2] == (args.only == "ours")]
    print(f"machine: {machine()}; {args.bursts} bursts of {args.burst}, gap {args.gap_ms} ms")
    print(
        "| implementation | scenario | CV per burst | max-min per burst | evenly spread bursts | reservations per worker, all bursts |"
    )
    print("|---|---|---|---|---|---|")
    for name, python, ours in impls:
        for scenario in ("single", "sync-on", "sync-off"):
            try:
                r = run(python, ours, scenario, args, endpoints)
            except (RuntimeError, AssertionError) as e:
                print(f"| {name} | {scenario} | failed: {str(e)[:120]} | | | |")
                continue
            print(
                f"| {name} | {scenario} | {r['cv']:.3f} | {r['span']:.2f} | {r['even']:.0%} | {r['totals']} |",
                flush=True,
            )
    for s in pubs:
        s.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
