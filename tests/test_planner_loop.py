"""The closed loop: mocker workers publish forward-pass metrics, `python -m dynamo.planner`
decides worker counts from them, `examples/planner/virtual_env.py` starts and stops mocker
workers through the virtual connector. Under a load ramp the planner scales up; when the
load stops it scales back down; every decision is acknowledged."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from runtime_util import unique_ns

from dynamo._core import DistributedRuntime

ROOT = Path(__file__).resolve().parent.parent
ENV_SCRIPT = ROOT / "examples" / "planner" / "virtual_env.py"


class Lines:
    """Collects a process's stdout lines (JSON events) on a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.events: list[dict] = []
        self.proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def scaled(self) -> list[dict]:
        return [e for e in self.events if e.get("event") == "scaled"]


async def until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def test_planner_scales_mockers_up_under_load_and_back_down(tmp_path) -> None:
    from dynamo.llm.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    ns = unique_ns()
    endpoint = f"{ns}.backend.generate"
    env = {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_LOG": "warn",
    }
    os.environ["DYN_FILE_KV"] = env["DYN_FILE_KV"]
    started = time.monotonic()
    environment = subprocess.Popen(
        [
            sys.executable,
            str(ENV_SCRIPT),
            "--namespace",
            ns,
            "--endpoint",
            endpoint,
            "--model-path",
            str(model),
            "--model-name",
            "tiny",
            "--initial-workers",
            "1",
            "--",
            # Two sequences at a time: a handful of concurrent requests builds a queue.
            "--max-num-seqs",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    planner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamo.planner",
            "--namespace",
            ns,
            "--endpoint",
            endpoint,
            "--ttft-ms",
            "20",
            "--itl-ms",
            "1000",
            "--adjustment-interval-secs",
            "0.5",
            "--max-workers",
            "3",
            "--max-wait-time-secs",
            "20",
        ],
        env=env,
    )
    events = Lines(environment)
    stop_load = asyncio.Event()
    try:
        await until(
            lambda: any(e.get("event") == "ready" for e in events.events), 30, "first worker"
        )
        rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        client = await rt.endpoint(endpoint).client()
        await client.wait_for_instances()

        async def user(i: int) -> None:
            n = 0
            while not stop_load.is_set():
                n += 1
                request = {
                    "model": "tiny",
                    "token_ids": [(i * 7 + n + k) % 50 + 3 for k in range(64)],
                    "stop_conditions": {"max_tokens": 32, "ignore_eos": True},
                }
                stream = await client.round_robin(request, annotated=False)
                async for _ in stream:
                    pass

        users = [asyncio.ensure_future(user(i)) for i in range(12)]
        # Scale-up: a decision above one worker, carried out and acknowledged.
        await until(lambda: any(e["workers"] > 1 for e in events.scaled()), 30, "scale up")
        peak_time = time.monotonic()
        await asyncio.sleep(1.0)
        stop_load.set()
        await asyncio.wait_for(asyncio.gather(*users, return_exceptions=True), 20)
        # Idle: back to one worker.
        await until(
            lambda: (
                events.scaled()
                and events.scaled()[-1]["workers"] == 1
                and max(e["workers"] for e in events.scaled()) > 1
            ),
            30,
            "scale down",
        )
        scaled = events.scaled()
        ids = [e["decision_id"] for e in scaled]
        # Every decision was acknowledged, in order, none skipped.
        assert ids == list(range(ids[0], ids[0] + len(ids))), scaled
        assert ids[0] == 0
        assert time.monotonic() - started < 90
        assert time.monotonic() - peak_time < 60
        rt.shutdown()
    finally:
        stop_load.set()
        stop(planner)
        stop(environment)
