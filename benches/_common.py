"""Helpers shared by the Python benchmarks.

Every benchmark measures this project and the reference wheel (``ai-dynamo-runtime``) side
by side in one run. The reference lives in its own virtual environment (``REF_PYTHON``,
default ``.bench-ref-venv/bin/python``, created by ``benches/setup_reference.sh``); the
benchmark re-runs its own measuring function under that interpreter in a subprocess and
reads back JSON, so this project never imports the reference.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REF_PYTHON = ROOT / ".bench-ref-venv" / "bin" / "python"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server the benchmark starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHER = Path(__file__).resolve().parent / "serve_launcher.py"
WORKER_ENDPOINT = "dyn://dynamo.backend.generate"


def server_commands(
    python: str, via: str, model: str, port: int, parsers: tuple[str, str] | None = None
) -> list[list[str]]:
    """The frontend's and the mocker worker's command lines (speedup 1000, block size 16).

    ``via="launcher"``: ``serve_launcher.py`` under ``python``, the same script on both
    sides, through the ``dynamo._core`` entry-point API only (all the reference's runtime
    wheel ships). ``via="cli"``: ``python -m dynamo.frontend`` and ``python -m
    dynamo.mocker`` with the same flags on both sides, what an operator types; the
    reference's modules come with the ``ai-dynamo`` wheel (``setup_reference.sh --cli``).
    Both read file discovery and the TCP request plane from ``DYN_DISCOVERY_BACKEND`` and
    ``DYN_REQUEST_PLANE`` (the launcher always uses them). ``parsers`` (tool, reasoning):
    frontend-wide parser defaults, this project's launcher only."""
    if via == "launcher":
        mocker = json.dumps({"speedup_ratio": 1000.0, "block_size": 16})
        return [
            [python, str(LAUNCHER), "frontend", str(port), *(parsers or ())],
            [python, str(LAUNCHER), "mocker", model, mocker],
        ]
    if via != "cli" or parsers:
        raise ValueError(f"no command line for via={via!r} with parsers={parsers!r}")
    frontend = ["-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)]
    mocker = ["-m", "dynamo.mocker", "--model-path", model, "--model-name", "tiny"]
    mocker += ["--endpoint", WORKER_ENDPOINT, "--speedup-ratio", "1000", "--block-size", "16"]
    return [[python, *frontend], [python, *mocker]]


def server_env(kv_dir: str) -> dict[str, str]:
    """Environment of both server processes: file discovery in ``kv_dir`` (fresh per
    start), TCP request plane, namespace ``dynamo``, warnings only in the logs."""
    return dict(
        os.environ,
        DYN_FILE_KV=kv_dir,
        DYN_LOG="warn",
        DYN_NAMESPACE="dynamo",
        DYN_DISCOVERY_BACKEND="file",
        DYN_REQUEST_PLANE="tcp",
    )


def stop_processes(procs: list[subprocess.Popen], timeout: float = 15) -> None:
    """SIGTERM every process (graceful shutdown, as an operator would), then wait for each
    up to ``timeout`` seconds in all before killing it."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def reference_python() -> Path | None:
    """The reference venv's interpreter, or None when it is not installed."""
    path = Path(os.environ.get("REF_PYTHON", DEFAULT_REF_PYTHON))
    return path if path.exists() else None


def run_under_reference(script: str, *args: str) -> dict:
    """Run ``script --measure-only args`` with the reference interpreter; return its JSON."""
    py = reference_python()
    if py is None:
        raise SystemExit(
            "reference venv not found: run `bash benches/setup_reference.sh` "
            "or set REF_PYTHON to a python with ai-dynamo-runtime==1.6.1"
        )
    env = dict(os.environ)
    # Make sure the reference interpreter cannot pick up this project's package.
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [str(py), script, "--measure-only", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"


async def time_sequential(one, seconds: float, warmup: int) -> list[float]:
    """Durations (s) of back-to-back awaits of ``one()`` for ``seconds``, after ``warmup``
    untimed ones."""
    for _ in range(warmup):
        await one()
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        await one()
        samples.append(time.perf_counter() - t0)
    return samples


def median_p99_ms(samples: list[float]) -> tuple[float, float]:
    """Median and p99 of ``samples`` (seconds) in milliseconds; sorts ``samples``."""
    samples.sort()
    return statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3
