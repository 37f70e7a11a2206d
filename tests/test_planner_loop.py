"""The closed loop: mocker workers publish forward-pass metrics, `python -m dynamo.planner`
decides worker counts from them, `examples/planner/virtual_env.py` starts and stops mocker
workers through the virtual connector. Under a stepped load ramp the planner scales up; when
the load stops it scales back down one worker at a time; every decision is acknowledged (the
environment's log and the coordinator agree). Also: the frontend-metrics input drives the
planner on its own, and the environment scales a prefill pool on `num_prefill_workers`."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
from runtime_util import unique_ns

from dynamo._core import (
    DistributedRuntime,
    FpmDirectPublisher,
    FpmEventSubscriber,
    PlannerDecision,
    VirtualConnectorClient,
    VirtualConnectorCoordinator,
    run_planner,
)

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


def environment(
    ns: str, env: dict, model: Path, *endpoint_args: str, mocker_args: tuple = ()
) -> subprocess.Popen:
    """``examples/planner/virtual_env.py`` as a subprocess, its JSON lines on stdout."""
    return subprocess.Popen(
        [
            sys.executable,
            str(ENV_SCRIPT),
            "--namespace",
            ns,
            *endpoint_args,
            "--model-path",
            str(model),
            "--model-name",
            "tiny",
            "--",
            *mocker_args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def file_env(tmp_path: Path, monkeypatch) -> dict:
    """File discovery shared by this process and its children."""
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "kv"))
    return {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_LOG": "warn",
    }


async def test_planner_scales_mockers_up_under_load_and_back_down(tmp_path, monkeypatch) -> None:
    from dynamo.llm.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    ns = unique_ns()
    endpoint = f"{ns}.backend.generate"
    env = file_env(tmp_path, monkeypatch)
    started = time.monotonic()
    env_proc = environment(
        ns,
        env,
        model,
        "--endpoint",
        endpoint,
        "--initial-workers",
        "1",
        # Two sequences at a time: a handful of concurrent requests builds a queue.
        mocker_args=("--max-num-seqs", "2"),
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
    events = Lines(env_proc)
    # Concurrent users: user i runs while i < level[0].
    level = [0]
    rt = None
    try:
        await until(
            lambda: any(e.get("event") == "ready" for e in events.events), 30, "first worker"
        )
        rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        client = await rt.endpoint(endpoint).client()
        await client.wait_for_instances()

        async def user(i: int) -> None:
            n = 0
            while i < level[0]:
                n += 1
                request = {
                    "model": "tiny",
                    "token_ids": [(i * 7 + n + k) % 50 + 3 for k in range(64)],
                    "stop_conditions": {"max_tokens": 32, "ignore_eos": True},
                }
                stream = await client.round_robin(request, annotated=False)
                async for _ in stream:
                    pass

        # Ramp: more users every few seconds until the planner adds workers.
        users: list[asyncio.Future] = []

        def scaled_up() -> bool:
            return any(e["workers"] > 1 for e in events.scaled())

        for step in (2, 6, 12):
            level[0] = step
            users += [asyncio.ensure_future(user(i)) for i in range(len(users), step)]
            try:
                await until(scaled_up, 6 if step < 12 else 30, f"scale up at {step} users")
                break
            except AssertionError:
                if step == 12:
                    raise
        peak_time = time.monotonic()
        await asyncio.sleep(1.0)
        # Ramp down: all users stop after their current request.
        level[0] = 0
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
        counts = [e["workers"] for e in scaled]
        # The first decision scales up; after the last peak, down one worker at a time.
        assert counts[0] > 1, counts
        top = len(counts) - 1 - counts[::-1].index(max(counts))
        assert counts[top:] == list(range(counts[top], 0, -1)), counts
        ids = [e["decision_id"] for e in scaled]
        # Every decision was acknowledged, in order, none skipped.
        assert ids == list(range(ids[0], ids[0] + len(ids))), scaled
        assert ids[0] == 0
        # The planner's side agrees: its last decision is the acknowledged one.
        coordinator = VirtualConnectorCoordinator(rt, ns, 1, 5, 3)
        await coordinator.async_init()
        last = coordinator.read_state()
        assert (last.decision_id, last.num_decode_workers) == (ids[-1], 1)
        assert await coordinator.is_scaling_ready()
        assert time.monotonic() - started < 120
        assert time.monotonic() - peak_time < 60
    finally:
        level[0] = 0
        stop(planner)
        stop(env_proc)
        if rt is not None:
            rt.shutdown()


async def test_environment_scales_a_prefill_pool_on_num_prefill_workers(
    tmp_path, monkeypatch
) -> None:
    """With ``--prefill-endpoint`` the example environment keeps two mocker sets, one per
    count of the decision, and acknowledges once discovery shows both."""
    from dynamo.llm.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    ns = unique_ns()
    decode_ep, prefill_ep = f"{ns}.decode.generate", f"{ns}.prefill.generate"
    env = file_env(tmp_path, monkeypatch)
    env_proc = environment(
        ns,
        env,
        model,
        "--endpoint",
        decode_ep,
        "--prefill-endpoint",
        prefill_ep,
        "--initial-workers",
        "1",
        "--initial-prefill-workers",
        "1",
    )
    events = Lines(env_proc)
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    try:
        await until(lambda: any(e.get("event") == "ready" for e in events.events), 30, "ready")
        assert events.events[0] == {"event": "ready", "workers": 1, "prefill_workers": 1}
        decode = await rt.endpoint(decode_ep).client()
        prefill = await rt.endpoint(prefill_ep).client()
        coordinator = VirtualConnectorCoordinator(rt, ns, 1, 30, 60)
        await coordinator.async_init()
        for want_prefill, want_decode in ((2, 1), (1, 2)):
            await coordinator.update_scaling_decision(want_prefill, want_decode)
            decision_id = coordinator.read_state().decision_id
            await until(
                lambda d=decision_id: any(e["decision_id"] == d for e in events.scaled()),
                60,
                f"decision {decision_id} carried out",
            )
            (done,) = [e for e in events.scaled() if e["decision_id"] == decision_id]
            assert (done["prefill_workers"], done["workers"]) == (want_prefill, want_decode)
            assert len(prefill.instance_ids()) == want_prefill
            assert len(decode.instance_ids()) == want_decode
            assert await coordinator.is_scaling_ready()
    finally:
        stop(env_proc)
        rt.shutdown()


class FrontendMetrics:
    """A stand-in for the frontend's ``/metrics``: every scrape adds 10 requests whose
    mean TTFT is ``ttft`` seconds (the ITL histogram stays empty)."""

    def __init__(self) -> None:
        self.ttft = 0.5
        self.count = 0
        self.total = 0.0
        self.scrapes = 0
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics.scrape().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def scrape(self) -> str:
        self.scrapes += 1
        self.count += 10
        self.total += 10 * self.ttft
        h = "dynamo_frontend_time_to_first_token_seconds"
        i = "dynamo_frontend_inter_token_latency_seconds"
        return (
            f"# HELP {h} Time to first token.\n# TYPE {h} histogram\n"
            f'{h}_bucket{{model="tiny",le="+Inf"}} {self.count}\n'
            f'{h}_sum{{model="tiny"}} {self.total}\n'
            f'{h}_count{{model="tiny"}} {self.count}\n'
            f"# HELP {i} Inter-token latency.\n# TYPE {i} histogram\n"
            f'{i}_bucket{{model="tiny",le="+Inf"}} 0\n'
            f'{i}_sum{{model="tiny"}} 0\n'
            f'{i}_count{{model="tiny"}} 0\n'
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_planner_scales_on_frontend_ttft_while_fpm_shows_no_load() -> None:
    """The frontend's TTFT (deltas of its histogram between scrapes) drives the decision:
    the worker's FPM are idle heartbeats (estimated TTFT 0), yet a frontend TTFT five
    times the target scales the pool up, and a low one brings it back down."""
    ns = unique_ns()
    name = f"{ns}.backend.generate"
    frontend = FrontendMetrics()
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    tasks: list[asyncio.Future] = []
    try:

        async def handler(request):
            yield {"ok": True}

        ep = rt.endpoint(name)
        tasks.append(asyncio.ensure_future(ep.serve_endpoint(handler)))
        client = await ep.client()
        await asyncio.wait_for(client.wait_for_instances(), 10)
        (instance_id,) = client.instance_ids()
        # An idle worker: FPM are zeroed heartbeats only.
        fpm = FpmDirectPublisher(ep, str(instance_id), 1)
        idle = FpmEventSubscriber(ep)
        first = await asyncio.wait_for(asyncio.to_thread(idle.recv), 10)
        assert first is not None and msgpack.unpackb(first)["wall_time"] == 0.0
        idle.shutdown()
        planner = asyncio.ensure_future(
            run_planner(
                rt,
                [
                    "--namespace",
                    ns,
                    "--endpoint",
                    name,
                    "--ttft-ms",
                    "100",
                    "--itl-ms",
                    "1000",
                    "--adjustment-interval-secs",
                    "0.3",
                    "--max-workers",
                    "3",
                    "--frontend-metrics-url",
                    frontend.url,
                ],
            )
        )
        tasks.append(planner)
        # The environment: acknowledge every decision.
        decisions: list[PlannerDecision] = []
        env_client = VirtualConnectorClient(rt, ns)

        async def environment() -> None:
            while True:
                await env_client.wait()
                d = await env_client.get()
                decisions.append(d)
                await env_client.complete(d)

        tasks.append(asyncio.ensure_future(environment()))
        await until(lambda: any(d.num_decode_workers > 1 for d in decisions), 30, "scale up")
        assert frontend.scrapes >= 2
        peak = max(d.num_decode_workers for d in decisions)
        assert 1 < peak <= 3
        # The frontend's TTFT drops far below the target: one worker at a time back to 1.
        frontend.ttft = 0.005
        await until(
            lambda: bool(decisions) and decisions[-1].num_decode_workers == 1, 30, "scale down"
        )
        counts = [d.num_decode_workers for d in decisions]
        top = counts.index(peak)
        assert counts[top:] == list(range(peak, 0, -1)), counts
        ids = [d.decision_id for d in decisions]
        assert ids == list(range(len(ids))), ids
        fpm.shutdown()
        rt.shutdown()
        await asyncio.wait_for(planner, 10)
    finally:
        rt.shutdown()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        frontend.close()
