"""The OpenAI frontend end to end, with the official ``openai`` client.

One frontend (``python -m dynamo.frontend``) and mocker workers (``python -m dynamo.mocker``)
run as subprocesses over file discovery on loopback; a Python worker (the guide's shape)
serves a slow, deterministic model for stop strings and cancellation. Migration tests kill
workers with SIGKILL in the middle of a stream.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, Procs, free_port, http, metric, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_dir):
    """A frontend (1 MiB body limit) with two mocker workers and the slow Python worker."""
    root = tmp_path_factory.mktemp("stack")
    procs = Procs(root / "kv", root)
    procs.env["DYN_HTTP_BODY_LIMIT_MB"] = "1"
    procs.env["MARKER"] = str(root / "marker.txt")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "t1")
        procs.mocker(
            model_dir, "--endpoint", "dyn://t1.backend.generate", "--num-workers", "2",
            "--speedup-ratio", "10",
        )  # fmt: skip
        procs.env["ENDPOINT"] = "t1.slow.generate"
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        wait_for_instances(base, "tiny", 2)
        wait_for_instances(base, "slow", 1)
        yield base, root / "marker.txt"
    finally:
        procs.close()


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    base, _ = stack
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


MESSAGES = [{"role": "user", "content": "Hello there!"}]


def test_models_list(client) -> None:
    ids = {m.id for m in client.models.list().data}
    assert {"tiny", "slow"} <= ids


def test_chat_non_streaming_respects_max_tokens(client) -> None:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_streaming_with_usage(client) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1


def test_chat_streaming_without_usage_has_no_usage_chunk(client) -> None:
    chunks = list(
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True)
    )
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions_streaming_and_not(client) -> None:
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 6
    assert r.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="Once upon a time",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_without_max_tokens_stops_at_the_models_max_new_tokens(client) -> None:
    # The README's streaming request: no max_tokens. The tiny model's generation_config.json
    # says max_new_tokens 256, so the answer ends there ("length"), not at the context's end.
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 256


def test_completions_default_max_tokens_is_16(client) -> None:
    r = client.completions.create(model="tiny", prompt="Hi")
    assert r.usage.completion_tokens == 16


def test_stop_string_truncates_the_answer(client) -> None:
    # The slow worker is deterministic: learn its text, then stop in the middle of it.
    full = client.completions.create(model="slow", prompt="Hi", max_tokens=12).choices[0].text
    words = [w for w in full.split() if len(w) >= 2]
    assert words, full
    stop = words[len(words) // 2][:2]
    r = client.completions.create(model="slow", prompt="Hi", max_tokens=12, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.find(stop)]


def test_unknown_model_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert e.value.status_code == 404
    assert e.value.body["type"] == "not_found_error"
    assert "nope" in e.value.body["message"]


def test_empty_messages_is_400(client) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[])
    assert e.value.body["type"] == "invalid_request_error"
    assert e.value.body["param"] == "messages"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "tiny", "messages": [', None),
        (b'{"model": "tiny"}', "messages"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "bogus": 1}', "bogus"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            None,
        ),
    ],
)
def test_malformed_requests_are_400_with_the_envelope(stack, body, param) -> None:
    base, _ = stack
    status, raw = http("POST", f"{base}/v1/chat/completions", body)
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_oversized_body_is_413(stack) -> None:
    base, _ = stack
    big = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    ).encode()
    status, raw = http("POST", f"{base}/v1/chat/completions", big)
    assert status == 413
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_health_live_and_metrics(stack, client) -> None:
    base, _ = stack
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert http("GET", f"{base}/live")[0] == 200
    status, body = http("GET", f"{base}/health")
    assert status == 200 and json.loads(body)["status"] == "healthy"
    ok = metric(
        base,
        "dynamo_frontend_requests_total",
        model="tiny",
        endpoint="chat_completions",
        request_type="unary",
        status="success",
    )
    assert ok >= 1
    assert metric(base, "dynamo_frontend_time_to_first_token_seconds_count", model="tiny") >= 1
    assert (
        metric(base, "dynamo_frontend_errors_total", model="nope", error_type="not_found_error")
        >= 1
    )


def test_client_disconnect_cancels_the_worker_handler(stack, client) -> None:
    _, marker = stack
    stream = client.chat.completions.create(
        model="slow", messages=MESSAGES, max_tokens=200, stream=True
    )
    for i, _chunk in enumerate(stream):
        if i == 2:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if marker.exists() and "cancelled" in marker.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("the worker's handler was not cancelled")


def _migration_stack(tmp_path_factory, model_dir, ns: str, limit: int):
    root = tmp_path_factory.mktemp(ns)
    procs = Procs(root / "kv", root)
    port = free_port()
    procs.frontend(port, "--namespace", ns, "--migration-limit", str(limit))
    first = procs.mocker(model_dir, "--endpoint", f"dyn://{ns}.backend.generate")
    base = f"http://127.0.0.1:{port}"
    wait_for_instances(base, "tiny", 1)
    return procs, base, first


def test_sigkill_mid_stream_migrates_to_another_worker(tmp_path_factory, model_dir) -> None:
    procs, base, first = _migration_stack(tmp_path_factory, model_dir, "mig", 2)
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
        # ~4 ms per token at speedup 1: the stream outlives the second worker's start.
        stream = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=1500,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 3:
                procs.mocker(model_dir, "--endpoint", "dyn://mig.backend.generate")
                wait_for_instances(base, "tiny", 2)
                os.kill(first.pid, signal.SIGKILL)
        assert chunks[-1].usage.completion_tokens == 1500
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert (
            metric(
                base,
                "dynamo_frontend_model_migration_total",
                model="tiny",
                migration_type="ongoing_request",
            )
            == 1
        )
    finally:
        procs.close()


def test_sigkill_without_migration_ends_the_stream_with_an_error(
    tmp_path_factory, model_dir
) -> None:
    procs, base, first = _migration_stack(tmp_path_factory, model_dir, "nomig", 0)
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=1500, stream=True
        )
        started = time.monotonic()
        with pytest.raises(openai.APIError):
            for i, _chunk in enumerate(stream):
                if i == 3:
                    os.kill(first.pid, signal.SIGKILL)
        assert time.monotonic() - started < 20
    finally:
        procs.close()
