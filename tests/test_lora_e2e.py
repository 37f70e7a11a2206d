"""LoRA adapters end to end: workers register a base model and adapters, the frontend
lists and routes them, KV routing keeps their blocks apart, unregistering removes them.

Real processes: ``python -m dynamo.frontend`` and two ``tests/workers/lora_worker.py``
workers over file discovery; the adapter itself comes from an S3 API server on loopback
(moto) through ``LoRADownloader``, as a worker would fetch it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from s3_services import Moto
from serving_util import WORKERS, Procs, free_port, http

from dynamo.llm import LoRADownloader
from dynamo.llm.tiny_model import write_tiny_model

# A prompt of several 16-token blocks after the chat template.
PROMPT = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> Path:
    """``lora-a``, uploaded to moto and fetched back with ``LoRADownloader`` (s3://)."""
    import asyncio

    moto = Moto()
    try:
        moto.s3.create_bucket(Bucket="adapters")
        moto.upload_adapter("adapters", "lora-a", os.urandom(4096))
        cache = tmp_path_factory.mktemp("lora-cache")
        saved = {k: os.environ.get(k) for k in moto.env()}
        os.environ.update(moto.env())
        try:

            async def fetch() -> str:
                return await LoRADownloader(str(cache)).download_if_needed("s3://adapters/lora-a")

            path = Path(asyncio.run(fetch()))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        moto.close()
    # Served under the directory's name.
    named = tmp_path_factory.mktemp("adapters") / "lora-a"
    named.symlink_to(path, target_is_directory=True)
    return named


class Worker:
    def __init__(self, procs: Procs, model_dir: Path, *adapters: Path) -> None:
        log = open(procs.log_dir / f"worker-{len(procs.procs)}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "lora_worker.py"), str(model_dir), *map(str, adapters)],
            env=procs.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        procs.procs.append(self.proc)
        line = self.proc.stdout.readline()
        assert line.startswith("ID "), line
        self.id = int(line.split()[1])

    def command(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "OK"


@pytest.fixture
def cluster(tmp_path, request):
    procs = Procs(tmp_path / "kv", tmp_path)
    marker = tmp_path / "requests.txt"
    marker.touch()
    procs.env["MARKER"] = str(marker)
    procs.env["DYN_LOG"] = "warn"
    yield procs, marker
    procs.close()


def models(base: str) -> dict[str, dict]:
    status, body = http("GET", f"{base}/v1/models")
    assert status == 200
    return {m["id"]: m for m in json.loads(body)["data"]}


def wait_models(base: str, want: set[str], timeout: float = 30.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    got: dict[str, dict] = {}
    while time.monotonic() < deadline:
        try:
            got = models(base)
            if set(got) == want:
                return got
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"models never became {want}: {sorted(got)}")


def chat(base: str, model: str, content: str = "hi") -> tuple[int, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    status, raw = http("POST", f"{base}/v1/chat/completions", json.dumps(body).encode())
    return status, json.loads(raw)


def served(marker: Path) -> list[tuple[int, str, str]]:
    out = []
    for line in marker.read_text().splitlines():
        worker, model, lora = line.split()
        out.append((int(worker), model, lora))
    return out


def wait_ready(base: str, model: str, workers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = http("GET", f"{base}/v1/models/{model}/ready")
        if status == 200:
            ns = next(iter(json.loads(body)["namespaces"].values()))
            if ns["worker_types"]["aggregated"]["workers"] == workers:
                return
        time.sleep(0.05)
    raise AssertionError(f"{model} never had {workers} ready workers")


@pytest.mark.parametrize("router_mode", ["round-robin", "kv"])
def test_adapter_is_listed_routed_to_its_workers_and_unregistered(
    cluster, model_dir, adapter_dir, router_mode
) -> None:
    procs, marker = cluster
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs.frontend(port, "--router-mode", router_mode)
    with_adapter = Worker(procs, model_dir, adapter_dir)
    without = Worker(procs, model_dir)
    listed = wait_models(base, {"base", "lora-a"})
    assert listed["lora-a"]["parent"] == "base"
    assert "parent" not in listed["base"]
    status, body = http("GET", f"{base}/v1/models/lora-a")
    assert status == 200 and json.loads(body)["parent"] == "base"
    wait_ready(base, "base", 2)
    wait_ready(base, "lora-a", 1)

    for i in range(8):
        status, _ = chat(base, "lora-a", f"adapter request {i}")
        assert status == 200
    for i in range(8):
        status, _ = chat(base, "base", f"base request {i}")
        assert status == 200
    log = served(marker)
    adapter_hits = [(w, lora) for w, m, lora in log if m == "lora-a"]
    assert adapter_hits == [(with_adapter.id, "lora-a")] * 8, "only the adapter's worker"
    base_hits = [(w, lora) for w, m, lora in log if m == "base"]
    assert len(base_hits) == 8 and all(lora == "None" for _, lora in base_hits)
    if router_mode == "round-robin":
        assert {w for w, _ in base_hits} == {with_adapter.id, without.id}

    # Unregistering removes the adapter within one discovery round; the base stays.
    started = time.monotonic()
    with_adapter.command("unregister lora-a")
    wait_models(base, {"base"}, timeout=5)
    gone_after = time.monotonic() - started
    assert gone_after < 2.0, f"took {gone_after:.2f}s"
    status, body = chat(base, "lora-a")
    assert status == 404, body
    # Loaded again, on the other worker: requests follow it there.
    without.command(f"register {adapter_dir}")
    wait_models(base, {"base", "lora-a"})
    wait_ready(base, "lora-a", 1)
    before = len(served(marker))
    for i in range(4):
        assert chat(base, "lora-a", f"moved {i}")[0] == 200
    assert [(w, m) for w, m, _ in served(marker)[before:]] == [(without.id, "lora-a")] * 4


def test_a_dead_adapter_worker_is_not_replaced_by_a_worker_without_it(
    cluster, model_dir, adapter_dir
) -> None:
    procs, marker = cluster
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs.frontend(port)
    with_adapter = Worker(procs, model_dir, adapter_dir)
    Worker(procs, model_dir)
    wait_models(base, {"base", "lora-a"})
    with_adapter.proc.kill()
    with_adapter.proc.wait()
    # Until discovery drops its cards the adapter is listed but has no live worker: the
    # frontend answers 503 (or 404 once the card is gone), never the other worker.
    deadline = time.monotonic() + 15
    statuses = set()
    while time.monotonic() < deadline and "lora-a" in models(base):
        statuses.add(chat(base, "lora-a")[0])
        time.sleep(0.05)
    assert "lora-a" not in models(base)
    assert 200 not in statuses, statuses
    assert all(m != "lora-a" for _, m, _ in served(marker))


def cached_tokens(resp: dict) -> int:
    return (resp.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_kv_routing_keeps_adapter_blocks_apart(cluster, model_dir, adapter_dir) -> None:
    procs, marker = cluster
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs.frontend(port, "--router-mode", "kv")
    workers = [Worker(procs, model_dir, adapter_dir) for _ in range(2)]
    wait_models(base, {"base", "lora-a"})
    wait_ready(base, "lora-a", 2)

    def until_cached(model: str) -> tuple[int, dict]:
        # The worker's KV event reaches the router asynchronously.
        deadline = time.monotonic() + 10
        while True:
            status, resp = chat(base, model, PROMPT)
            assert status == 200, resp
            if cached_tokens(resp) > 0 or time.monotonic() > deadline:
                return status, resp
            time.sleep(0.1)

    status, first = chat(base, "base", PROMPT)
    assert status == 200 and cached_tokens(first) == 0
    _, again = until_cached("base")
    assert cached_tokens(again) >= 48, again["usage"]
    base_worker = served(marker)[-1][0]

    # Same prompt, adapter: none of the base model's blocks match.
    status, adapter_first = chat(base, "lora-a", PROMPT)
    assert status == 200 and cached_tokens(adapter_first) == 0, adapter_first["usage"]
    adapter_worker = served(marker)[-1][0]
    _, adapter_again = until_cached("lora-a")
    assert cached_tokens(adapter_again) >= 48, adapter_again["usage"]
    # The hit went to a worker that had served the adapter's prompt: normally the first
    # one, but a retry that raced that worker's KV event to the router may have been
    # balanced onto the other worker, which then holds the blocks too.
    *earlier, last = served(marker)
    adapter_holders = {w for w, m, _ in earlier if m == "lora-a"}
    assert adapter_worker in adapter_holders
    assert last[1:] == ("lora-a", "lora-a") and last[0] in adapter_holders, (last, earlier)
    assert {w.id for w in workers} >= {base_worker, adapter_worker}
