"""Context, ContextMetadata, SpanProxy, the decorators and the logging helpers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest
from pydantic import BaseModel
from runtime_util import collect, local_runtime, unique_ns

import dynamo.runtime as rt_mod
from dynamo._core import Context, ContextMetadata, SpanProxy, log_message
from dynamo.runtime import dynamo_endpoint, dynamo_worker
from dynamo.runtime import logging as dlog


def test_context_basics_and_cancellation() -> None:
    ctx = Context()
    assert len(ctx.id()) == 36 and ctx.id() != Context().id()
    assert not ctx.is_stopped() and not ctx.is_killed()
    ctx.stop_generating()
    ctx.stop_generating()  # idempotent
    assert ctx.is_stopped() and not ctx.is_killed()
    assert ctx.trace_id is None and ctx.span_id is None and ctx.parent_span_id is None
    assert ctx.trace_headers() is None
    ctx.notify_first_token()
    assert "Context(id=" in repr(ctx)


def test_context_metadata_is_a_live_mapping() -> None:
    ctx = Context(id="r1", metadata={"b": "2", "a": "1"})
    md = ctx.metadata
    assert isinstance(md, ContextMetadata)
    assert md.keys() == ["a", "b"] and md.values() == ["1", "2"]
    assert md.items() == [("a", "1"), ("b", "2")] and list(md) == ["a", "b"]
    md["c"] = "3"
    assert ctx.metadata["c"] == "3" and "c" in ctx.metadata and len(md) == 3
    del md["c"]
    with pytest.raises(KeyError):
        del md["c"]
    with pytest.raises(KeyError):
        md["missing"]
    assert md.get("missing") is None and md.get("missing", "d") == "d"
    assert md.pop("a") == "1"
    with pytest.raises(KeyError):
        md.pop("a")
    assert md.pop("a", None) is None and md.pop("a", "x") == "x"
    snapshot = md.copy()
    md.clear()
    assert snapshot == {"b": "2"} and len(ctx.metadata) == 0
    ctx.metadata = {"z": "26"}
    assert md.copy() == {"z": "26"}
    assert repr(md) == 'ContextMetadata({"z": "26"})'
    det = ctx.detached("r2")
    assert det.id() == "r2" and det.metadata.copy() == {"z": "26"}
    md["only-parent"] = "1"
    assert "only-parent" not in det.metadata
    ctx.stop_generating()
    assert not det.is_stopped()


def test_span_proxy_validates_status() -> None:
    span = Context().current_span()
    assert isinstance(span, SpanProxy)
    span.set_attribute("k", 1)
    span.set_attribute("obj", object())
    span.add_event("e", {"a": 1})
    span.set_status("ok")
    span.set_status("error", "boom")
    with pytest.raises(ValueError, match="'ok' or 'error'"):
        span.set_status("fine")
    with Context().start_span("child", {"x": 1}) as child:
        assert isinstance(child, SpanProxy)
    child.close()
    child.close()
    with pytest.raises(RuntimeError), Context().start_span("c"):
        raise RuntimeError("propagates")


async def test_async_killed_or_stopped() -> None:
    ctx = Context()
    waiter = ctx.async_killed_or_stopped()
    await asyncio.sleep(0.01)
    ctx.stop_generating()
    assert await asyncio.wait_for(waiter, 2) is True


class Req(BaseModel):
    text: str
    n: int = 1


async def test_dynamo_endpoint_validates_requests() -> None:
    class Handler:
        @dynamo_endpoint(Req, Req)
        async def generate(self, request: Req):
            for _ in range(request.n):
                yield request.text

    h = Handler()
    assert [x async for x in h.generate({"text": "a", "n": 2})] == ["a", "a"]
    assert [x async for x in h.generate('{"text": "b"}')] == ["b"]
    with pytest.raises(ValueError, match="Invalid request"):
        [x async for x in h.generate({"n": 2})]
    with pytest.raises(ValueError, match="Invalid request"):
        [x async for x in h.generate(42)]

    @dynamo_endpoint(str, Req)
    async def passthrough(request):
        yield request

    assert [x async for x in passthrough(7)] == [7]


async def test_dynamo_endpoint_handler_served_end_to_end() -> None:
    @dynamo_endpoint(Req, Req)
    async def handler(request: Req):
        yield {"echo": request.text}

    async with local_runtime() as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")
        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        assert await collect(await client.round_robin({"text": "hi"}, annotated=False)) == [
            {"echo": "hi"}
        ]
        with pytest.raises(ValueError, match="Invalid request"):
            await collect(await client.round_robin({"nope": 1}, annotated=False))


async def test_dynamo_worker_builds_a_runtime(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("DYN_DISCOVERY_BACKEND", raising=False)
    monkeypatch.delenv("ETCD_ENDPOINTS", raising=False)
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "kv"))
    seen = {}

    @dynamo_worker()
    async def worker(runtime, value):
        seen["runtime"] = runtime
        seen["value"] = value
        runtime.shutdown()
        return "dropped"

    assert await worker(5) is None
    assert isinstance(seen["runtime"], rt_mod.DistributedRuntime) and seen["value"] == 5
    assert rt_mod._default_discovery_backend() == "file"
    monkeypatch.setenv("ETCD_ENDPOINTS", "http://127.0.0.1:2379")
    assert rt_mod._default_discovery_backend() == "etcd"
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "mem")
    assert rt_mod._default_discovery_backend() == "mem"
    with pytest.warns(DeprecationWarning):
        dynamo_worker(enable_nats=True)


def test_runtime_module_exports() -> None:
    for name in ("Client", "Context", "DistributedRuntime", "Endpoint", "PyAsyncRequestStream"):
        assert name in rt_mod.__all__ and hasattr(rt_mod, name)


def test_uvloop_serves_and_calls() -> None:
    code = """
import asyncio, uvloop
from dynamo._core import DistributedRuntime

async def main():
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    ep = rt.endpoint("uv.loop.generate")
    async def h(request):
        yield request * 2
    served = asyncio.ensure_future(ep.serve_endpoint(h))
    client = await ep.client()
    await client.wait_for_instances()
    out = [x async for x in await client.round_robin(21, annotated=False)]
    rt.shutdown()
    await asyncio.wait_for(served, 5)
    print("RESULT", out, type(asyncio.get_running_loop()).__module__)

uvloop.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "RESULT [42] uvloop" in out


def test_log_level_helpers() -> None:
    assert dlog.log_level_mapping("debug") == logging.DEBUG
    assert dlog.log_level_mapping("warn") == logging.WARNING
    assert dlog.log_level_mapping("trace") == logging.INFO
    assert dlog.log_level_mapping("DEBUG") == logging.INFO
    assert dlog.python_log_level_mapping("warn,dynamo_runtime=debug") == logging.DEBUG
    assert dlog.python_log_level_mapping("error") == logging.ERROR
    assert dlog.python_log_level_mapping("x=trace") == logging.DEBUG
    assert dlog.python_log_level_mapping("") == logging.INFO
    assert dlog.construct_formatter_prefix("svc", 3) == "svc:3"
    assert dlog.construct_formatter_prefix(None, 3) == ":3"
    assert dlog.construct_formatter_prefix(None, None) == ""


def test_get_bool_env_var(monkeypatch) -> None:
    monkeypatch.setenv("DYN_T_BOOL", "TRUE")
    assert dlog.get_bool_env_var("DYN_T_BOOL") is True
    monkeypatch.setenv("DYN_T_BOOL", "0")
    assert dlog.get_bool_env_var("DYN_T_BOOL") is False
    monkeypatch.setenv("DYN_T_BOOL", "maybe")
    assert dlog.get_bool_env_var("DYN_T_BOOL") is False
    assert dlog.get_bool_env_var("DYN_T_UNSET", "1") is True


def test_vllm_formatter() -> None:
    rec = logging.LogRecord("x", logging.WARNING, "/p/m.py", 7, "hello %s", ("you",), None)
    rec.funcName = "fn"
    text = dlog.VllmColorFormatter().format(rec)
    assert "hello you" in text and "\033[33m" in text and "m.fn" in text


def _run_logging(env: dict, code: str) -> str:
    full = dict(os.environ)
    full.pop("DYNAMO_SKIP_PYTHON_LOG_INIT", None)
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stderr


LOG_CODE = """
import logging
from dynamo.runtime.logging import configure_dynamo_logging
configure_dynamo_logging("svc", 7)
logging.getLogger("mine").info("info line")
logging.getLogger("mine").debug("debug line")
"""


def test_configure_dynamo_logging_forwards_to_rust_with_dyn_log_filter() -> None:
    err = _run_logging({"DYN_LOG": "info", "DYN_SDK_DISABLE_ANSI_LOGGING": "1"}, LOG_CODE)
    assert "[svc:7] info line" in err and "debug line" not in err
    err = _run_logging({"DYN_LOG": "debug", "DYN_SDK_DISABLE_ANSI_LOGGING": "1"}, LOG_CODE)
    assert "debug line" in err


def test_jsonl_logging() -> None:
    err = _run_logging({"DYN_LOG": "info", "DYN_LOGGING_JSONL": "1"}, LOG_CODE)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(
        r["fields"]["message"] == "[svc:7] info line" and r["level"] == "INFO" for r in lines
    )


def _run_logging_on_a_terminal(env: dict[str, str]) -> str:
    """Stderr of LOG_CODE run with stderr on a pseudo-terminal (what a person at a shell sees)."""
    import os
    import pty

    full = dict(os.environ)
    full.pop("DYNAMO_SKIP_PYTHON_LOG_INIT", None)
    full.pop("NO_COLOR", None)
    full.pop("DYN_SDK_DISABLE_ANSI_LOGGING", None)
    full.update(env)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOG_CODE],
            env=full,
            stdout=subprocess.DEVNULL,
            stderr=follower,
        )
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(leader)
    return out.decode(errors="replace")


def test_log_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    esc = "\x1b["
    on_tty = _run_logging_on_a_terminal({"DYN_LOG": "info"})
    assert "info line" in on_tty and esc in on_tty
    no_color = _run_logging_on_a_terminal({"DYN_LOG": "info", "NO_COLOR": "1"})
    assert "info line" in no_color and esc not in no_color
    # A pipe (a log file, a collector) gets plain text.
    piped = _run_logging({"DYN_LOG": "info"}, LOG_CODE)
    assert "info line" in piped and esc not in piped


def test_log_message_accepts_every_level() -> None:
    for level in ("trace", "debug", "info", "warning", "warn", "error", "critical"):
        log_message(level, "m", "mod", "f.py", 1)
    handler = dlog.LogHandler()
    rec = logging.LogRecord("x", logging.INFO, "/p/m.py", 7, "msg", (), None)
    handler.emit(rec)
