"""File discovery does not trust its directory, with a real frontend and mocker worker.

Planted in ``$DYN_FILE_KV`` next to the live entries: a FIFO, a symlink to ``/dev/zero``
and a 3 GiB sparse file, each named like a discovery key. Observed before the fix (and on
the reference 1.6.1 for the FIFO): the FIFO wedged the tokio worker threads (no route
answered, SIGTERM ignored); the other two made every process read them whole and abort.
Now they are skipped with one warning, the model stays served and the processes stay small.

A directory scan that fails (the frontend out of file descriptors, forced with
``prlimit --nofile`` on the running process) used to be read as "no entries", so the model
was removed and clients got 404; now the last known state is kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def stack(tmp_path, model_dir):
    """A frontend and one mocker worker on a private discovery directory."""
    kv = tmp_path / "kv"
    procs = Procs(kv, tmp_path)
    procs.env["DYN_LOG"] = "info"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    frontend = procs.frontend(port)
    worker = procs.mocker(model_dir, "--speedup-ratio", "100")
    try:
        wait_for_instances(base, "tiny", 1)
        yield procs, base, kv, frontend, worker
    finally:
        procs.close()


def _completion(base: str) -> int:
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 3}).encode()
    status, _ = http("POST", f"{base}/v1/completions", body, timeout=10)
    return status


def _models(base: str) -> set[str]:
    status, body = http("GET", f"{base}/v1/models", timeout=5)
    assert status == 200, body
    return {m["id"] for m in json.loads(body)["data"]}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_fifo_zero_symlink_and_sparse_file_are_ignored(stack) -> None:
    procs, base, kv, frontend, worker = stack
    os.mkfifo(kv / "v1%2Fmdc%2Fdemo%2Ffifo")
    os.symlink("/dev/zero", kv / "v1%2Fmdc%2Fdemo%2Fzero")
    with open(kv / "v1%2Finstances%2Fdemo%2Fbig", "wb") as f:
        f.truncate(3 << 30)
    # Many scans (every 100 ms) and watcher re-lists go over them.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert _models(base) == {"tiny"}
        assert _completion(base) == 200
        time.sleep(0.2)
    for p in (frontend, worker):
        assert p.poll() is None, "a process died reading the directory"
        assert _rss_mib(p.pid) < 1024
    log = (procs.log_dir / "frontend-0.log").read_text(errors="replace")
    assert "ignoring entry" in log
    # Not wedged: SIGTERM still stops the frontend promptly.
    frontend.send_signal(signal.SIGTERM)
    frontend.wait(timeout=10)


def test_failed_scan_keeps_the_models(stack) -> None:
    procs, base, _kv, frontend, _worker = stack
    assert _models(base) == {"tiny"}
    log_path = procs.log_dir / "frontend-0.log"
    # Out of descriptors: every open (read_dir included) fails with EMFILE for a while.
    hard = subprocess.run(
        ["prlimit", "--pid", str(frontend.pid), "--nofile", "--output", "HARD", "--noheadings"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(["prlimit", "--pid", str(frontend.pid), f"--nofile=3:{hard}"], check=True)
    try:
        time.sleep(1.5)  # ~15 failed scans and at least one watcher re-list
    finally:
        subprocess.run(
            ["prlimit", "--pid", str(frontend.pid), f"--nofile={hard}:{hard}"], check=True
        )
    assert frontend.poll() is None
    assert _models(base) == {"tiny"}
    assert _completion(base) == 200
    log = log_path.read_text(errors="replace")
    assert "cannot scan the directory" in log, log[-2000:]
    assert "model removed" not in log, log[-2000:]
