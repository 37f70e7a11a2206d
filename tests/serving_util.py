"""Helpers of the serving tests: a tiny model, frontend and worker subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

WORKERS = Path(__file__).resolve().parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0):
    """``(status, body bytes)``; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Procs:
    """Subprocesses sharing one file-discovery directory; all killed on close."""

    def __init__(self, discovery_dir: Path, log_dir: Path) -> None:
        self.env = dict(os.environ)
        self.env.update(
            {
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(discovery_dir),
                # A SIGKILLed worker's keys expire quickly.
                "DYN_FILE_KV_TTL_SECS": "2",
                "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "2",
            }
        )
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}-{len(self.procs)}.log", "wb")
        p = subprocess.Popen(
            [sys.executable, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(p)
        return p

    def frontend(self, port: int, *extra: str) -> subprocess.Popen:
        return self.start(
            "frontend",
            ["-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port), *extra],
        )

    def mocker(self, model_dir: Path, *extra: str) -> subprocess.Popen:
        return self.start(
            "mocker",
            ["-m", "dynamo.mocker", "--model-path", str(model_dir), "--model-name", "tiny", *extra],
        )

    def close(self) -> None:
        for p in self.procs:
            # Helpers that take commands on stdin read it in an executor thread, which
            # asyncio.run waits for at exit: end of input lets them leave at once (they
            # would otherwise sit out the kill deadline below).
            if p.stdin is not None and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_for_instances(base: str, model: str, count: int, timeout: float = 30.0) -> None:
    """Until ``/health`` lists ``count`` instances of ``model``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            status, body = http("GET", f"{base}/health", timeout=2)
            if status == 200:
                last = json.loads(body)
                for m in last["models"]:
                    if m["model"] == model and len(m["instances"]) == count:
                        return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{model} never had {count} instances; last health: {last}")


def metric(base: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    _, body = http("GET", f"{base}/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def metric_total(base: str, name: str) -> float:
    """The sum of every sample of ``name`` in ``/metrics`` (whatever its labels)."""
    _, body = http("GET", f"{base}/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )
