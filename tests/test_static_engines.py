"""In-process engines: Python generators served by ``HttpService``, the echo engine, the
terminal inputs of ``run_input`` and ``Client.wait_for_instance_by_runtime_data``.

The HTTP services run on an event loop in a background thread (the engines' generators
run there too); the tests talk to them with the official ``openai`` client and raw
HTTP (``urllib``, ``http.client``) from the main thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, free_port, http

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    HttpAsyncEngine,
    HttpService,
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    PythonAsyncEngine,
    make_engine,
    register_model,
    run_input,
)
from dynamo.llm.exceptions import HttpError
from dynamo.llm.tiny_model import write_tiny_model

CREATED = 1_700_000_000


def chat_chunk(model: str, text: str, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ],
    }


def completion_chunk(model: str, text: str, finish: str | None = None) -> dict:
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }


class Recorder:
    """What the generators saw (written on the loop thread, read by the tests)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.contexts: list[object] = []
        self.cancelled = threading.Event()
        self.stopped_on_cancel: list[bool] = []


def make_generator(rec: Recorder):
    async def generate(request, context):
        rec.requests.append(request)
        rec.contexts.append(context)
        chat = "messages" in request
        text = request["messages"][-1]["content"] if chat else request["prompt"]
        chunk = chat_chunk if chat else completion_chunk
        model = request["model"]
        if text.startswith("http-"):
            raise HttpError(int(text[5:]), f"custom {text}")
        if text == "boom":
            raise RuntimeError("boom")
        if text == "bad":
            raise ValueError("bad value")
        if text == "slow":
            yield chunk(model, "first")
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                rec.stopped_on_cancel.append(context.is_stopped())
                rec.cancelled.set()
                raise
            yield chunk(model, "never")
            return
        if text.startswith("many "):
            for i in range(int(text[5:])):
                yield chunk(model, f"{i},")
            return
        if text == "late":
            yield chunk(model, "He")
            raise HttpError(400, "late failure")
        words = text.split()
        for w in words:
            yield chunk(model, w + " ")
        final = chunk(model, "", "stop")
        final["usage"] = {
            "prompt_tokens": len(words),
            "completion_tokens": len(words),
            "total_tokens": 2 * len(words),
        }
        yield final

    return generate


class Background:
    """An event loop on a thread, with a runtime and services on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tasks: list[asyncio.Future] = []

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = http("GET", f"http://127.0.0.1:{port}/live", timeout=1)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def served():
    """Two services over the same engines: the default, and ``wait_for_first_item``."""
    bg = Background()
    rec = Recorder()
    ports = (free_port(), free_port())

    async def setup():
        loop = asyncio.get_running_loop()
        rt = DistributedRuntime(loop, "mem", "tcp")
        gen = make_generator(rec)
        http_engine = HttpAsyncEngine(gen, loop)
        plain_engine = PythonAsyncEngine(gen, loop)
        services = (
            HttpService(port=ports[0]),
            HttpService(port=ports[1], wait_for_first_item=True),
        )
        for svc in services:
            svc.add_chat_completions_model("echo-chat", "sum-1", http_engine)
            svc.add_completions_model("echo-chat", "sum-1", http_engine)
            svc.add_chat_completions_model("plain", "sum-2", plain_engine)
            bg.tasks.append(asyncio.ensure_future(svc.run(rt)))
        return rt, services

    rt, services = bg.call(setup())
    for p in ports:
        wait_listening(p)
    try:
        yield bg, rec, services, [f"http://127.0.0.1:{p}" for p in ports]
    finally:

        async def teardown():
            for s in services:
                s.shutdown()
            await asyncio.wait_for(asyncio.gather(*bg.tasks, return_exceptions=True), 10)
            rt.shutdown()

        bg.call(teardown())
        bg.close()


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    base = served[3][0]
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def post(url: str, body: dict) -> tuple[int, str]:
    status, raw = http("POST", url, json.dumps(body).encode())
    return status, raw.decode()


def sse_events(body: str) -> list[tuple[str | None, str]]:
    """``(event name, data)`` of each SSE event."""
    out = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        name = None
        data = []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        out.append((name, "\n".join(data)))
    return out


def test_added_models_are_listed_per_surface_and_in_v1_models(served, client) -> None:
    _, _, (svc, _), _ = served
    assert svc.list_chat_completions_models() == ["echo-chat", "plain"]
    assert svc.list_completions_models() == ["echo-chat"]
    listed = {m.id: m for m in client.models.list().data}
    assert {"echo-chat", "plain"} <= set(listed)
    assert listed["plain"].object == "model"


def test_chat_streams_the_generator_chunks(served, client) -> None:
    stream = client.chat.completions.create(
        model="echo-chat", messages=user("hello big world"), stream=True
    )
    chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["hello ", "big ", "world ", ""]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.id == "chatcmpl-test" and c.created == CREATED for c in chunks)


def test_chat_non_streaming_folds_the_chunks(served, client) -> None:
    r = client.chat.completions.create(model="echo-chat", messages=user("one two"))
    assert r.object == "chat.completion"
    assert r.id == "chatcmpl-test"
    assert r.created == CREATED
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "one two "
    assert r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (2, 4)


def test_completions_stream_and_fold(served, client) -> None:
    r = client.completions.create(model="echo-chat", prompt="a b c")
    assert r.object == "text_completion"
    assert r.choices[0].text == "a b c "
    assert r.choices[0].finish_reason == "stop"
    parts = [
        c.choices[0].text
        for c in client.completions.create(model="echo-chat", prompt="x y", stream=True)
    ]
    assert parts == ["x ", "y ", ""]


def test_long_streams_pass_the_back_pressure_window(client) -> None:
    # Far more chunks than the in-process window (64): the generator waits for credit.
    want = "".join(f"{i}," for i in range(500))
    parts = client.chat.completions.create(
        model="echo-chat", messages=user("many 500"), stream=True
    )
    assert "".join(c.choices[0].delta.content for c in parts) == want
    r = client.chat.completions.create(model="echo-chat", messages=user("many 500"))
    assert r.choices[0].message.content == want


def test_generator_gets_the_request_dict_and_a_context(served, client) -> None:
    _, rec, _, _ = served
    client.chat.completions.create(
        model="echo-chat", messages=user("ctx check"), max_tokens=7, temperature=0.5
    )
    req = next(r for r in reversed(rec.requests) if r.get("messages") == user("ctx check"))
    assert req["model"] == "echo-chat"
    assert req["max_tokens"] == 7
    assert req["temperature"] == 0.5
    ctx = rec.contexts[rec.requests.index(req)]
    assert type(ctx).__name__ == "Context"
    assert isinstance(ctx.id(), str) and ctx.id()


def test_invalid_request_is_400_before_the_engine(served) -> None:
    _, rec, _, (base, _) = served
    before = len(rec.requests)
    status, body = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "echo-chat", "messages": "not a list"}).encode(),
    )
    assert status == 400
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert len(rec.requests) == before


@pytest.mark.parametrize(
    "code, kind",
    [(429, "rate_limit_error"), (400, "invalid_request_error"), (503, "service_unavailable")],
)
def test_http_error_before_the_first_item_is_its_status(served, code, kind) -> None:
    _, _, _, (base, _) = served
    body = json.dumps({"model": "echo-chat", "messages": user(f"http-{code}")}).encode()
    status, raw = http("POST", f"{base}/v1/chat/completions", body)
    assert status == code
    err = json.loads(raw)["error"]
    assert err["message"] == f"custom http-{code}"
    assert err["type"] == kind


def test_http_error_through_the_openai_client(client) -> None:
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="echo-chat", messages=user("http-429"))
    assert e.value.status_code == 429
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo-chat", messages=user("bad"))


def test_streaming_http_error_is_an_sse_event_unless_waiting_for_the_first_item(served) -> None:
    _, _, _, (base, waiting) = served
    body = {"model": "echo-chat", "messages": user("http-429"), "stream": True}
    status, text = post(f"{base}/v1/chat/completions", body)
    assert status == 200
    events = sse_events(text)
    assert events[-1][0] == "error"
    assert json.loads(events[-1][1])["error"]["message"] == "custom http-429"
    status, text = post(f"{waiting}/v1/chat/completions", body)
    assert status == 429
    assert json.loads(text)["error"]["type"] == "rate_limit_error"
    # A stream that starts well is unaffected by the wait.
    status, text = post(
        f"{waiting}/v1/chat/completions",
        {"model": "echo-chat", "messages": user("p q"), "stream": True},
    )
    assert status == 200
    assert text.endswith("data: [DONE]\n\n")


def test_error_after_the_first_item_ends_the_stream_with_an_sse_error(served, client) -> None:
    _, _, _, (base, waiting) = served
    for url in (base, waiting):
        status, text = post(
            f"{url}/v1/chat/completions",
            {"model": "echo-chat", "messages": user("late"), "stream": True},
        )
        assert status == 200
        events = sse_events(text)
        assert json.loads(events[0][1])["choices"][0]["delta"]["content"] == "He"
        assert events[-1][0] == "error"
        assert json.loads(events[-1][1])["error"]["message"] == "late failure"
        assert "[DONE]" not in text
    got = []
    with pytest.raises(openai.APIError, match="late failure"):
        for c in client.chat.completions.create(
            model="echo-chat", messages=user("late"), stream=True
        ):
            got.append(c.choices[0].delta.content)
    assert got == ["He"]
    # Non-streaming: the error wins over the partial answer.
    status, raw = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "echo-chat", "messages": user("late")}).encode(),
    )
    assert status == 400 and json.loads(raw)["error"]["message"] == "late failure"


def test_plain_engine_errors_are_500_and_value_errors_400(served) -> None:
    _, _, _, (base, _) = served
    status, raw = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "plain", "messages": user("boom")}).encode(),
    )
    assert status == 500
    err = json.loads(raw)["error"]
    assert err["type"] == "internal_server_error" and "boom" in err["message"]
    status, raw = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "plain", "messages": user("bad")}).encode(),
    )
    assert status == 400 and "bad value" in json.loads(raw)["error"]["message"]
    # The plain engine serves answers like the HTTP one.
    status, raw = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "plain", "messages": user("fine")}).encode(),
    )
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "fine "


def test_removed_model_answers_404_and_leaves_v1_models(served, client) -> None:
    bg, rec, (svc, _), (base, _) = served

    async def add():
        svc.add_chat_completions_model(
            "temp", "sum", HttpAsyncEngine(make_generator(rec), asyncio.get_running_loop())
        )

    bg.call(add())
    assert (
        client.chat.completions.create(model="temp", messages=user("hi")).choices[0].message.content
        == "hi "
    )
    assert "temp" in {m.id for m in client.models.list().data}
    svc.remove_chat_completions_model("temp")
    assert "temp" not in svc.list_chat_completions_models()
    assert "temp" not in {m.id for m in client.models.list().data}
    status, raw = http(
        "POST",
        f"{base}/v1/chat/completions",
        json.dumps({"model": "temp", "messages": user("hi")}).encode(),
    )
    assert status == 404
    assert json.loads(raw)["error"]["code"] == "model_not_found"
    with pytest.raises(ValueError, match="temp"):
        svc.remove_chat_completions_model("temp")
    with pytest.raises(ValueError):
        svc.remove_completions_model("plain")


def test_enable_endpoint_turns_a_surface_off_and_on(served) -> None:
    _, _, (svc, _), (base, _) = served
    body = json.dumps({"model": "echo-chat", "prompt": "z"}).encode()
    svc.enable_endpoint("completion", False)
    try:
        assert http("POST", f"{base}/v1/completions", body)[0] == 404
        chat = json.dumps({"model": "echo-chat", "messages": user("z")}).encode()
        assert http("POST", f"{base}/v1/chat/completions", chat)[0] == 200
    finally:
        svc.enable_endpoint("Completion", True)
    assert http("POST", f"{base}/v1/completions", body)[0] == 200
    with pytest.raises(ValueError, match="valid types are: chat, completion"):
        svc.enable_endpoint("completions", True)


def test_client_disconnect_cancels_the_generator(served) -> None:
    _, rec, _, (base, _) = served
    rec.cancelled.clear()
    host, port = base.removeprefix("http://").split(":")
    conn = HTTPConnection(host, int(port), timeout=10)
    body = {"model": "echo-chat", "messages": user("slow"), "stream": True}
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    assert r.status == 200
    first = r.readline().decode()
    assert json.loads(first[len("data: ") :])["choices"][0]["delta"]["content"] == "first"
    conn.close()
    # The generator was suspended in asyncio.sleep(60): it is cancelled, not left running.
    assert rec.cancelled.wait(5), "the generator was not cancelled"
    assert rec.stopped_on_cancel[-1] is True


def test_engines_and_models_reject_bad_arguments(served) -> None:
    bg, _, (svc, _), _ = served
    with pytest.raises(TypeError):
        PythonAsyncEngine(42, bg.loop)
    with pytest.raises(TypeError):
        svc.add_chat_completions_model("x", "sum", object())


# --- Echo engine, run_input ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_echo_over_http_streams_the_templated_prompt(model_dir) -> None:
    bg = Background()
    port = free_port()

    async def start():
        rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
        args = EntrypointArgs(
            EngineType.Echo,
            model_path=str(model_dir),
            model_name="echo",
            http_host="127.0.0.1",
            http_port=port,
        )
        engine = await make_engine(rt, args)
        return rt, asyncio.ensure_future(run_input(rt, "http", engine))

    rt, task = bg.call(start())
    try:
        wait_listening(port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["echo"]
        parts = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="echo", messages=user("hello echo world"), stream=True
            )
        ]
        assert len([p for p in parts if p]) > 3
        assert "hello echo world" in "".join(parts)
        r = client.chat.completions.create(model="echo", messages=user("say this"))
        assert "say this" in r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
        # The template's end-of-sequence tokens are not echoed.
        assert 0 < r.usage.completion_tokens < r.usage.prompt_tokens
        c = client.completions.create(model="echo", prompt="plain prompt text")
        assert c.choices[0].text.strip() == "plain prompt text"
    finally:

        async def stop():
            rt.shutdown()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)

        bg.call(stop())
        bg.close()


def test_echo_over_dyn_registers_its_card_for_a_frontend(model_dir) -> None:
    bg = Background()
    port = free_port()
    ns = f"echo{os.getpid()}"

    async def start():
        loop = asyncio.get_running_loop()
        worker = DistributedRuntime(loop, "mem", "tcp")
        frontend = DistributedRuntime(loop, "mem", "tcp")
        engine = await make_engine(
            worker,
            EntrypointArgs(EngineType.Echo, model_path=str(model_dir), model_name="echo-dyn"),
        )
        serving = asyncio.ensure_future(run_input(worker, f"dyn://{ns}.echo.generate", engine))
        svc = HttpService(port=port)
        running = asyncio.ensure_future(svc.run(frontend))
        client = await worker.endpoint(f"{ns}.echo.generate").client()
        await asyncio.wait_for(client.wait_for_instances(), 10)
        return worker, frontend, svc, [serving, running]

    worker, frontend, svc, tasks = bg.call(start())
    try:
        wait_listening(port)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "echo-dyn" in http("GET", f"{base}/v1/models")[1].decode():
                break
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="echo-dyn", messages=user("over the wire"))
        assert "over the wire" in r.choices[0].message.content
    finally:

        async def stop():
            svc.shutdown()
            worker.shutdown()
            frontend.shutdown()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)

        bg.call(stop())
        bg.close()


def entrypoint(*args: str, stdin: str, env: dict | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, str(WORKERS / "entrypoint.py"), *args],
        input=stdin.encode(),
        capture_output=True,
        timeout=timeout,
        env=env,
    )


def test_stdin_input_answers_once_and_exits(model_dir) -> None:
    p = entrypoint("Echo", str(model_dir), "stdin", stdin="the whole\nof stdin")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert "the whole\nof stdin" in out
    assert out.endswith("\n")


def test_text_input_chats_line_by_line_until_eof(model_dir) -> None:
    p = entrypoint("Echo", str(model_dir), "text", stdin="first question\n\nsecond question\n")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    # Two answers (the blank line is skipped). The echo answers with the templated
    # conversation, so the second answer holds the first turn (question and answer): the
    # conversation is kept.
    assert out.count("second question") == 1
    assert out.count("first question") == 3
    first = out.split("second question")[0]
    assert "first question" in first and out.endswith("\n")
    # One prompt marker per read (two questions, the blank line, EOF) on stderr.
    assert p.stderr.decode().count("> ") == 4


def test_text_input_with_the_mocker(model_dir) -> None:
    p = entrypoint("Mocker", str(model_dir), "text", "--speedup", "100", stdin="hello\nagain\n")
    assert p.returncode == 0, p.stderr.decode()
    # The mocker's tokens are random, but each turn prints one answer line.
    assert p.stdout.decode().count("\n") >= 2


def test_stdin_input_with_a_dynamic_engine_waits_for_a_discovered_worker(
    model_dir, tmp_path
) -> None:
    env = dict(os.environ)
    env.update(
        {
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(tmp_path / "kv"),
            "DYN_FILE_KV_TTL_SECS": "2",
        }
    )
    ns = f"dyn{os.getpid()}"
    worker = subprocess.Popen(
        [
            sys.executable,
            str(WORKERS / "entrypoint.py"),
            "Echo",
            str(model_dir),
            f"dyn://{ns}.echo.generate",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        p = entrypoint(
            "Dynamic", str(model_dir), "stdin", "--namespace", ns, stdin="routed prompt", env=env
        )
        assert p.returncode == 0, p.stderr.decode()
        assert "routed prompt" in p.stdout.decode()
        # The frontend's interactive mode is the same input.
        chat = subprocess.run(
            [sys.executable, "-m", "dynamo.frontend", "-i", "--namespace", ns],
            input=b"typed line\n",
            capture_output=True,
            timeout=60,
            env=env,
        )
        assert chat.returncode == 0, chat.stderr.decode()
        assert "typed line" in chat.stdout.decode()
        # ... and routes through the KV router when asked to, as the HTTP frontend does.
        frontend_cmd = [sys.executable, "-m", "dynamo.frontend", "-i", "--namespace", ns]
        frontend_cmd += ["--router-mode", "kv"]
        kv = subprocess.run(
            frontend_cmd,
            input=b"kv routed line\n",
            capture_output=True,
            timeout=60,
            env=env,
        )
        assert kv.returncode == 0, kv.stderr.decode()
        assert "kv routed line" in kv.stdout.decode()
    finally:
        worker.terminate()
        worker.wait(10)


# --- wait_for_instance_by_runtime_data ----------------------------------------------------


def test_wait_for_instance_by_runtime_data(model_dir) -> None:
    async def main():
        loop = asyncio.get_running_loop()
        rt = DistributedRuntime(loop, "mem", "tcp")
        ns = f"rd{os.getpid()}"
        endpoint = rt.endpoint(f"{ns}.backend.generate")

        async def handler(request):
            yield request

        serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
        client = await endpoint.client()
        with pytest.raises(ValueError):
            await client.wait_for_instance_by_runtime_data("role", "leader", timeout_s=-1)
        with pytest.raises(ValueError):
            await client.wait_for_instance_by_runtime_data("role", "leader", timeout_s=float("inf"))
        waiter = asyncio.ensure_future(
            client.wait_for_instance_by_runtime_data("role", "leader", timeout_s=10)
        )
        await asyncio.sleep(0.2)
        assert not waiter.done()
        cfg = ModelRuntimeConfig()
        cfg.set_engine_specific("role", '"leader"')
        await register_model(
            ModelInput.Tokens, ModelType.Chat, endpoint, str(model_dir), "rd", runtime_config=cfg
        )
        found = await asyncio.wait_for(waiter, 10)
        assert found == endpoint.connection_id()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="last_match_count=0"):
            await client.wait_for_instance_by_runtime_data("role", "follower", timeout_s=0.3)
        assert 0.25 < time.monotonic() - t0 < 5
        rt.shutdown()
        await asyncio.wait_for(asyncio.gather(serving, return_exceptions=True), 10)

    asyncio.run(main())
