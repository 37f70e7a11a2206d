"""Python workers behind the OpenAI frontend, end to end with the ``openai`` client.

The worker guide's custom worker (``examples/custom_worker.py``): answers, cancellation on
client disconnect, ``EngineShutdown`` migration (and a clean error without migration). A
``ModelInput.Text`` worker that gets the raw OpenAI request. KV mode's admission: 529 when
every worker is over the busy threshold, 503 while a registered model has no instance.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, Procs, free_port, metric, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_worker.py"
MESSAGES = [{"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _client(base: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=timeout)


def _until(what: str, cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def _models(client: openai.OpenAI) -> set[str]:
    """The served model names; none while the frontend is not listening yet."""
    try:
        return {m.id for m in client.models.list().data}
    except openai.APIConnectionError:
        return set()


def _events(trace: Path, event: str) -> list[list[str]]:
    """``[request id, pid]`` of each ``event`` line the example wrote."""
    if not trace.exists():
        return []
    lines = [line.split() for line in trace.read_text().splitlines()]
    return [parts[1:] for parts in lines if parts and parts[0] == event]


@pytest.fixture
def example_stack(tmp_path, model_dir):
    """A frontend and two example workers; yields ``(procs, base, trace, start)``."""
    procs = Procs(tmp_path / "kv", tmp_path)
    trace = tmp_path / "trace.txt"
    procs.env["DYN_EXAMPLE_TRACE"] = str(trace)
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def start(*frontend_args: str) -> None:
        procs.frontend(port, "--namespace", "demo", *frontend_args)
        for _ in range(2):
            procs.start("example", [str(EXAMPLE), str(model_dir)])
        wait_for_instances(base, "tiny-echo", 2)

    try:
        yield procs, base, trace, start
    finally:
        procs.close()


def test_custom_worker_example_answers_and_sees_client_disconnects(example_stack) -> None:
    _, base, trace, start = example_stack
    start()
    client = _client(base)
    r = client.chat.completions.create(model="tiny-echo", messages=MESSAGES, max_tokens=64)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 64
    # The engine echoes the templated prompt's tokens: the user's words come back.
    assert "Hello there!" in r.choices[0].message.content
    c = client.completions.create(model="tiny-echo", prompt="once upon a time", max_tokens=64)
    assert c.choices[0].text.startswith("once upon a time"), c.choices[0].text

    stream = client.chat.completions.create(
        model="tiny-echo", messages=MESSAGES, max_tokens=2000, stream=True
    )
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    started = _events(trace, "start")
    _until("the handler saw the cancellation", lambda: _events(trace, "cancelled"))
    cancelled = _events(trace, "cancelled")
    assert len(cancelled) == 1
    assert cancelled[0] == started[-1], (started, cancelled)


def _stream_and_drain_its_worker(procs, base: str, trace: Path, max_tokens: int):
    """Stream a chat answer; after its first chunk, SIGUSR1 the worker that serves it (the
    example then raises ``EngineShutdown`` mid-stream). Returns the chunks received."""
    client = _client(base, timeout=60)
    stream = client.chat.completions.create(
        model="tiny-echo",
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 1:
            [[_, pid]] = _events(trace, "start")
            os.kill(int(pid), signal.SIGUSR1)
    return chunks


def test_engine_shutdown_mid_stream_migrates_to_the_other_worker(example_stack) -> None:
    procs, base, trace, start = example_stack
    start("--migration-limit", "1")
    # 10 ms per token: the stream is still running when the worker is drained.
    chunks = _stream_and_drain_its_worker(procs, base, trace, max_tokens=600)
    assert chunks[-1].usage.completion_tokens == 600
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    [[request, drained_pid]] = _events(trace, "migrating")
    started = _events(trace, "start")
    assert len(started) == 2
    assert started[1][1] != drained_pid, "the migrated request went to the other worker"
    assert request == started[0][0]
    assert (
        metric(
            base,
            "dynamo_frontend_model_migration_total",
            model="tiny-echo",
            migration_type="ongoing_request",
        )
        == 1
    )


def test_engine_shutdown_without_migration_is_a_clean_error(example_stack) -> None:
    procs, base, trace, start = example_stack
    start()
    began = time.monotonic()
    with pytest.raises(openai.APIError) as e:
        _stream_and_drain_its_worker(procs, base, trace, max_tokens=600)
    assert "shutting down" in str(e.value)
    # An error event, not a hang until the client's timeout.
    assert time.monotonic() - began < 30
    assert len(_events(trace, "start")) == 1
    assert (
        metric(
            base,
            "dynamo_frontend_model_migration_total",
            model="tiny-echo",
            migration_type="ongoing_request",
        )
        == 0
    )


def test_text_model_gets_the_raw_openai_request(tmp_path, model_dir) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    marker = tmp_path / "requests.jsonl"
    procs.env["MARKER"] = str(marker)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "text")
        procs.env["ENDPOINT"] = "text.backend.generate"
        procs.start("text", [str(WORKERS / "text_worker.py"), str(model_dir)])
        wait_for_instances(base, "texty", 1)
        client = _client(base)

        chunks = list(
            client.chat.completions.create(
                model="texty", messages=MESSAGES, max_tokens=7, temperature=0.5, stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: Hello there!"
        assert chunks[-1].choices[0].finish_reason == "stop"

        r = client.chat.completions.create(model="texty", messages=MESSAGES)
        assert r.choices[0].message.content == "echo: Hello there!"
        assert r.choices[0].finish_reason == "stop"

        c = client.completions.create(model="texty", prompt="a b c")
        assert c.choices[0].text == "echo: a b c"

        seen = [json.loads(line) for line in marker.read_text().splitlines()]
        assert len(seen) == 3
        first = seen[0]
        # The OpenAI body as the client sent it: no tokens, no preprocessing.
        assert first["messages"] == MESSAGES
        assert first["max_tokens"] == 7 and first["temperature"] == 0.5
        assert first["stream"] is True
        assert "token_ids" not in first
        assert seen[2]["prompt"] == "a b c"
    finally:
        procs.close()


def test_kv_mode_answers_529_when_every_worker_is_busy(tmp_path, model_dir) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    hold = tmp_path / "hold"
    hold.touch()
    procs.env.update(
        {"MARKER": str(tmp_path / "marker"), "HOLD": str(hold), "ENDPOINT": "busy.slow.generate"}
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        # Busy as soon as one prompt waits for its prefill (first token).
        procs.frontend(
            port, "--namespace", "busy", "--router-mode", "kv",
            "--active-prefill-tokens-threshold", "0",
        )  # fmt: skip
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        wait_for_instances(base, "slow", 1)
        client = _client(base)

        held = client.chat.completions.create(
            model="slow", messages=MESSAGES, max_tokens=3, stream=True
        )
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=3)
        assert e.value.status_code == 529
        assert e.value.body["type"] == "service_unavailable"
        assert "busy" in e.value.body["message"]
        assert (
            metric(
                base, "dynamo_frontend_errors_total", model="slow", error_type="service_unavailable"
            )
            >= 1
        )

        # Its first token ends the held request's prefill; the worker takes requests again.
        hold.unlink()
        assert [c.choices[0].finish_reason for c in held if c.choices][-1] == "length"
        r = client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=3)
        assert r.usage.completion_tokens == 3
    finally:
        procs.close()


@pytest.mark.parametrize("mode", ["kv", "round-robin"])
def test_registered_model_without_instances_answers_503(tmp_path, model_dir, mode) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    serve = tmp_path / "serve"
    procs.env.update(
        {
            "MARKER": str(tmp_path / "marker"),
            "SERVE_AFTER": str(serve),
            "ENDPOINT": "idle.slow.generate",
        }
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "idle", "--router-mode", mode)
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        client = _client(base)
        # The card is registered; the endpoint is not served yet.
        _until("model listed", lambda: "slow" in _models(client))
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=2)
        assert e.value.status_code == 503
        assert e.value.body["type"] == "service_unavailable"

        serve.touch()
        wait_for_instances(base, "slow", 1)
        r = client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        procs.close()
