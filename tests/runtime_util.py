"""Helpers shared by the runtime tests: in-process runtimes and worker subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from dynamo._core import DistributedRuntime

WORKER = Path(__file__).resolve().parent / "workers" / "echo_worker.py"


def fresh_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (what a new process imports, or a process-wide
    state a test must not leave behind); asserts it exits 0, showing its stderr if not."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done


def unique_ns() -> str:
    """A namespace no other test uses (the mem store is shared by the whole process)."""
    return "t" + uuid.uuid4().hex[:12]


@asynccontextmanager
async def local_runtime(backend: str = "mem", request_plane: str | None = None):
    """A runtime on the running loop; on exit it shuts down and its serve tasks finish.

    The request plane defaults to ``DYN_REQUEST_PLANE`` (else ``tcp``).
    """
    plane = request_plane or os.environ.get("DYN_REQUEST_PLANE", "tcp")
    rt = DistributedRuntime(asyncio.get_running_loop(), backend, plane)
    tasks: list[asyncio.Future] = []

    def serve(endpoint, handler, **kwargs):
        task = asyncio.ensure_future(endpoint.serve_endpoint(handler, **kwargs))
        tasks.append(task)
        return task

    def serve_bidi(endpoint, handler, **kwargs):
        task = asyncio.ensure_future(endpoint.serve_bidirectional_endpoint(handler, **kwargs))
        tasks.append(task)
        return task

    class Harness:
        """The runtime plus ``serve``/``serve_bidi`` helpers that track serving tasks."""

        def __getattr__(self, name):
            return getattr(rt, name)

    harness = Harness()
    harness.serve = serve  # type: ignore[attr-defined]
    harness.serve_bidi = serve_bidi  # type: ignore[attr-defined]
    try:
        yield harness
    finally:
        rt.shutdown()
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


async def collect(stream) -> list:
    return [item async for item in stream]


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def worker_env(kv_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(kv_dir),
        DYN_FILE_KV_TTL_SECS="2",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYNAMO_SKIP_PYTHON_LOG_INIT="1",
    )
    env.update(extra)
    return env


class Worker:
    """A worker subprocess serving ``{ns}.worker.generate`` (tests/workers/echo_worker.py)."""

    def __init__(self, kv_dir: Path, ns: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), ns],
            env=worker_env(kv_dir, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("ID "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"worker failed to start: {line!r} {err}")
        self.instance_id = int(line.split()[1])

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
