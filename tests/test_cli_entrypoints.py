"""The command-line entry points without asyncio: ``run_inputs_blocking`` and the
``python -m dynamo.frontend`` / ``python -m dynamo.mocker`` processes built on it.

The two entry points serve Rust engines only, so they run no asyncio event loop (importing
:mod:`asyncio` was most of their start-up): the Rust runtime blocks the main thread and
waits for SIGINT/SIGTERM itself. These tests hold them to what the asyncio version did:
a clean exit on either signal, every mocker worker registered and shut down, errors
raised (not hung on).
"""

from __future__ import annotations

import asyncio
import errno
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_util import fresh_python
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo._core import DistributedRuntime, EngineType, EntrypointArgs, run_inputs_blocking
from dynamo.llm.tiny_model import write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize(
    "module", ["frontend", "mocker", "indexer", "select_service", "slot_tracker", "replay"]
)
def test_entry_points_do_not_import_asyncio(module) -> None:
    done = fresh_python(
        "import sys\n"
        f"import dynamo.{module}.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('asyncio', 'ssl')))\n"
    )
    assert done.stdout.strip() == "[]"


def test_bad_arguments_raise_before_serving(tmp_path, model_dir) -> None:
    rt = DistributedRuntime(None, "mem", "tcp")
    frontend = EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1", http_port=free_port())
    with pytest.raises(ValueError, match="unknown input"):
        run_inputs_blocking([(rt, "carrier-pigeon", frontend)])
    with pytest.raises(ValueError, match="cannot be served as a worker endpoint"):
        run_inputs_blocking([(rt, "dyn://ns.comp.ep", frontend)])
    with pytest.raises(ValueError, match="need model_path"):
        run_inputs_blocking([(rt, "dyn://ns.comp.ep", EntrypointArgs(EngineType.Mocker))])

    async def with_factory() -> EntrypointArgs:
        # A factory is only accepted while a loop runs (it is called back on it).
        return EntrypointArgs(EngineType.Dynamic, chat_engine_factory=lambda *a: None)

    with pytest.raises(ValueError, match="chat_engine_factory"):
        run_inputs_blocking([(rt, "http", asyncio.run(with_factory()))])
    rt.shutdown()


def test_a_failing_input_stops_the_others_and_raises(tmp_path) -> None:
    """Two frontends, the second on a port already taken: the call raises the bind error
    (OSError with its errno) once the first has shut down, instead of serving half the
    inputs forever."""
    code = f"""
import socket
from dynamo._core import (
    DistributedRuntime, EngineType, EntrypointArgs, run_inputs_blocking
)

taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
rt = DistributedRuntime(None, "file", "tcp")
inputs = [
    (rt, "http", EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1", http_port={free_port()})),
    (rt, "http", EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1",
                                http_port=taken.getsockname()[1])),
]
try:
    run_inputs_blocking(inputs)
except OSError as e:
    print("raised", type(e).__name__, e.errno, e)
"""
    env = {"DYN_FILE_KV": str(tmp_path / "kv"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    # The OS's error, as Python's own servers raise it (errno 98, EADDRINUSE), naming the
    # address: not a DynamoException "Unknown".
    assert done.stdout.startswith(f"raised OSError {errno.EADDRINUSE} "), (done.stdout, done.stderr)
    assert "cannot listen on 127.0.0.1:" in done.stdout and "in use" in done.stdout.lower()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_entry_points_serve_and_exit_cleanly_on_a_signal(tmp_path, model_dir, sig) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        frontend = procs.frontend(port)
        worker = procs.mocker(model_dir, "--num-workers", "2", "--speedup-ratio", "1000")
        wait_for_instances(base, "tiny", 2)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        status, out = http("POST", f"{base}/v1/chat/completions", json.dumps(body).encode())
        assert status == 200, out
        assert json.loads(out)["usage"]["completion_tokens"] == 4
        worker.send_signal(sig)
        assert worker.wait(20) == 0
        # Both workers deregistered on the way out: the frontend drops the model.
        deadline = time.monotonic() + 20
        while json.loads(http("GET", f"{base}/v1/models")[1])["data"]:
            assert time.monotonic() < deadline, "the model stayed listed after the workers left"
            time.sleep(0.05)
        frontend.send_signal(sig)
        assert frontend.wait(20) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        procs.close()
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    assert "Traceback" not in logs and "KeyboardInterrupt" not in logs, logs[-3000:]
