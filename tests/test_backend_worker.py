"""``dynamo._core.backend``: the records as the reference builds them, and a ``Worker``
around a Python engine object serving a real frontend (separate processes, file
discovery): start → register → serve → cleanup on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from runtime_util import unique_ns
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances

import dynamo._core as core
from dynamo._core import ModelInput, backend
from dynamo.llm.tiny_model import write_tiny_model


def test_submodule_is_in_sys_modules() -> None:
    assert sys.modules["dynamo._core.backend"] is core.backend
    names = {n for n in dir(backend) if not n.startswith("_")}
    assert {
        "DisaggregationMode",
        "LlmRegistration",
        "EngineConfig",
        "RuntimeConfig",
        "WorkerConfig",
        "Worker",
    } <= names


def test_disaggregation_mode_is_int_backed_and_unhashable() -> None:
    m = backend.DisaggregationMode
    assert [int(m.Aggregated), int(m.Prefill), int(m.Decode), int(m.Encode)] == [1, 2, 3, 4]
    assert repr(m.Prefill) == "DisaggregationMode.Prefill"
    assert m.Decode == m.Decode and m.Decode != m.Encode
    with pytest.raises(TypeError):
        hash(m.Aggregated)


def test_records_default_and_are_read_only() -> None:
    llm = backend.LlmRegistration()
    assert (llm.context_length, llm.kv_cache_block_size, llm.enable_eagle) == (None, None, False)
    llm = backend.LlmRegistration(context_length=10, kv_cache_block_size=16)
    assert (llm.context_length, llm.kv_cache_block_size) == (10, 16)
    with pytest.raises(AttributeError):
        llm.context_length = 5
    # As the reference: negative → OverflowError, wrong type → TypeError.
    with pytest.raises(OverflowError):
        backend.LlmRegistration(context_length=-1)
    with pytest.raises(TypeError):
        backend.LlmRegistration(context_length="x")
    with pytest.raises(ValueError, match="kv_cache_block_size"):
        backend.LlmRegistration(kv_cache_block_size=0)

    e = backend.EngineConfig("m")
    assert (e.model, e.served_model_name, e.runtime_data, e.llm, e.model_aliases) == (
        "m",
        None,
        {},
        None,
        [],
    )
    e = backend.EngineConfig("m", "served", {"a": 1}, llm, ["x"])
    assert (e.served_model_name, e.runtime_data, e.llm.context_length, e.model_aliases) == (
        "served",
        {"a": 1},
        10,
        ["x"],
    )

    w = backend.WorkerConfig("ns")
    assert (w.component, w.endpoint, w.endpoint_types, w.model_input) == (
        "backend",
        "generate",
        "chat,completions",
        ModelInput.Tokens,
    )
    assert w.disaggregation_mode == backend.DisaggregationMode.Aggregated
    with pytest.raises(TypeError):
        backend.WorkerConfig()
    with pytest.raises(ValueError, match="endpoint_types"):
        backend.WorkerConfig("ns", endpoint_types="chat,bogus")
    with pytest.raises(ValueError, match="namespace"):
        backend.WorkerConfig("bad.name")
    r = backend.RuntimeConfig("file", "tcp", response_plane="tcp")
    assert (r.discovery_backend, r.request_plane, r.event_plane) == ("file", "tcp", None)
    with pytest.raises(TypeError, match="config"):
        backend.Worker(object(), "not a config", None)


def test_worker_serves_a_frontend_and_cleans_up(tmp_path) -> None:
    ns = unique_ns()
    model = write_tiny_model(tmp_path / "tiny")
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "kv", tmp_path / "logs")
    procs.env["DYN_NAMESPACE"] = ns
    worker = subprocess.Popen(
        [sys.executable, str(WORKERS / "backend_worker.py"), str(model), ns],
        env=procs.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.procs.append(worker)
    try:
        port = free_port()
        procs.frontend(port, "--namespace", ns)
        base = f"http://127.0.0.1:{port}"
        wait_for_instances(base, "tiny-backend", 1)
        body = json.dumps(
            {"model": "tiny-backend", "prompt": "hello world hello", "max_tokens": 3}
        ).encode()
        status, out = http("POST", f"{base}/v1/completions", body, timeout=30)
        assert status == 200, out
        choice = json.loads(out)["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["text"]
        worker.send_signal(signal.SIGTERM)
        lines, _ = worker.communicate(timeout=20)
        log = lines.splitlines()
        assert log[0].startswith("START ") and int(log[0].split()[1]) > 0
        assert log[1].startswith("READY ")
        assert any(line.startswith("GENERATE ") for line in log)
        assert log[-2:] == ["CLEANUP", "EXITED"]
    finally:
        procs.close()


def test_stub_matches_the_submodule() -> None:
    """stubtest cannot check a submodule declared as a class (allowlisted): compare each
    nested class's constructor parameters and public members with the stub here."""
    import ast
    import inspect
    from pathlib import Path

    stub = Path(core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    ns = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "backend")
    classes = {n.name: n for n in ns.body if isinstance(n, ast.ClassDef)}
    assert set(classes) == {
        n for n in dir(backend) if not n.startswith("_") and isinstance(getattr(backend, n), type)
    }
    for name, node in classes.items():
        runtime = getattr(backend, name)
        members: dict[str, ast.AST] = {}
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                members[item.name] = item
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members[item.target.id] = item
        public = {m for m in members if not m.startswith("_")}
        assert public == {m for m in dir(runtime) if not m.startswith("_")}, name
        if "__new__" in members:
            stub_params = [a.arg for a in members["__new__"].args.args[1:]] + [
                a.arg for a in members["__new__"].args.kwonlyargs
            ]
            assert stub_params == list(inspect.signature(runtime).parameters), name
