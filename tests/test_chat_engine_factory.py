"""``EntrypointArgs(chat_engine_factory=...)``: discovered models' chat served by a Python engine.

Reference 1.6.1 (``scripts/observe_chat_engine_factory_reference.py``, two worker processes
serving model ``alpha`` on one endpoint and one serving ``beta``): the factory is called
once per model (not per instance) with a ``ModelCardInstanceId`` whose ``triple()`` is the
workers' ``(namespace, component, endpoint)``, the model's ``ModelDeploymentCard`` and a
``RoutedEngine`` whose only method is ``generate``; ``await routed.generate(preprocessed)``
returns an ``AsyncResponseStream`` of ``Annotated`` items whose ``data()`` is the worker's raw
``LLMEngineOutput`` dict (``token_ids``, ``finish_reason``, ... not detokenized); chat
completions come from the returned engine, completions keep the built-in pipeline.
``EntrypointArgs(chat_engine_factory=f)`` outside a running loop raises ``RuntimeError:
Failed to get TaskLocals for chat_engine_factory: RuntimeError: no running event loop``.
A raising factory: the reference logs it, retries (1 s, 2 s, 4 s, ...) and does not serve
the model at all meanwhile (404); ours retries the same way but answers the model's chat
requests 503 with the factory's error (completions keep working).

Here: a frontend in this process (``make_engine`` / ``run_input(rt, "http", ...)``, file
discovery), mocker workers in subprocesses, the official ``openai`` client.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import openai
import pytest
from serving_util import Procs, free_port, http

from dynamo.llm import (
    EngineType,
    EntrypointArgs,
    ModelCardInstanceId,
    PythonAsyncEngine,
    make_engine,
    run_input,
)
from dynamo.llm.tiny_model import write_tiny_model
from dynamo.runtime import DistributedRuntime

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _chunk(model: str, text: str, finish: str | None) -> dict:
    return {
        "id": "chatcmpl-factory",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}
        ],
    }


def _wrapping_factory(calls: list, seen: list, fail_first: int = 0):
    """A factory whose engine sends a fixed prompt through ``routed`` and answers with a
    marked summary of what the workers returned (post-processed text)."""

    async def factory(instance, card, routed):
        calls.append((instance, card, routed))
        if len(calls) <= fail_first:
            raise RuntimeError(f"factory refused {card.name()} (call {len(calls)})")

        async def gen(request, context=None):
            pre = {
                "model": request["model"],
                "token_ids": list(range(10, 42)),
                "stop_conditions": {"max_tokens": request.get("max_tokens") or 6},
                "sampling_options": {},
                "output_options": {},
                "eos_token_ids": [],
            }
            stream = await routed.generate(pre, context=context)
            tokens: list[int] = []
            finish = None
            async for item in stream:
                data = item.data()
                seen.append(data)
                tokens.extend(data.get("token_ids") or [])
                finish = data.get("finish_reason") or finish
            yield _chunk(
                request["model"], f"WRAPPED[{len(tokens)} tokens]", "stop" if finish else None
            )

        return PythonAsyncEngine(gen, asyncio.get_running_loop())

    return factory


async def _until_chat(client, model: str, timeout: float = 30.0):
    """The first chat answer that is not a 404/503 while the model is discovered."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return await client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=5
            )
        except (openai.NotFoundError, openai.APIConnectionError, openai.InternalServerError) as e:
            last = e
            await asyncio.sleep(0.1)
    raise AssertionError(f"no chat answer from {model} within {timeout} s: {last!r}")


async def _frontend(ns: str, factory):
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp")
    port = free_port()
    args = EntrypointArgs(
        EngineType.Dynamic,
        http_host="127.0.0.1",
        http_port=port,
        namespace=ns,
        chat_engine_factory=factory,
    )
    engine = await make_engine(rt, args)
    task = asyncio.ensure_future(run_input(rt, "http", engine))
    return rt, task, f"http://127.0.0.1:{port}"


async def _stop(rt, task) -> None:
    rt.shutdown()
    try:
        await asyncio.wait_for(task, 10)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        task.cancel()


def _env(monkeypatch, tmp_path) -> tuple[Procs, str]:
    procs = Procs(tmp_path / "kv", tmp_path)
    for k, v in procs.env.items():
        if k.startswith("DYN_"):
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("DYN_TCP_RPC_HOST", "127.0.0.1")
    ns = "cef" + uuid.uuid4().hex[:8]
    procs.env["DYN_NAMESPACE"] = ns
    procs.env["DYN_TCP_RPC_HOST"] = "127.0.0.1"
    return procs, ns


def test_factory_wraps_the_routed_engine(tmp_path, monkeypatch, model_dir) -> None:
    """Called once for a model with two instances, with the right triple and card; chat
    (plain and streaming) goes through its engine, which reaches the mocker workers
    through ``routed.generate``; completions keep the built-in pipeline."""
    procs, ns = _env(monkeypatch, tmp_path)
    calls: list = []
    seen: list = []

    async def main() -> None:
        rt, task, base = await _frontend(ns, _wrapping_factory(calls, seen))
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        try:
            procs.mocker(model_dir, "--speedup-ratio", "100", "--num-workers", "2")
            reply = await _until_chat(client, "tiny")
            text = reply.choices[0].message.content
            assert text.startswith("WRAPPED[") and text != "WRAPPED[0 tokens]", text
            assert reply.choices[0].finish_reason == "stop"
            # The workers' raw outputs: token ids, not text.
            assert seen and all(isinstance(d["token_ids"], list) for d in seen)
            assert sum(len(d["token_ids"]) for d in seen[-10:]) > 0

            stream = await client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=4, stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert "".join(parts).startswith("WRAPPED["), parts

            # Several requests, both instances alive: still one factory call.
            for _ in range(4):
                await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
            assert len(calls) == 1, calls
            instance, card, routed = calls[0]
            assert isinstance(instance, ModelCardInstanceId)
            assert instance.triple() == (ns, "backend", "generate")
            assert card.name() == "tiny"
            assert type(routed).__name__ == "RoutedEngine"
            assert [m for m in dir(routed) if not m.startswith("_")] == ["generate"]

            # Completions: the built-in pipeline (real detokenized text, not the wrapper).
            done = await client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
            assert not done.choices[0].text.startswith("WRAPPED")
            assert done.usage.completion_tokens > 0
        finally:
            await client.close()
            await _stop(rt, task)
            procs.close()

    asyncio.run(main())


def test_raising_factory_gives_a_clean_http_error_then_recovers(
    tmp_path, monkeypatch, model_dir
) -> None:
    """A factory that raises: the model's chat answers 503 with the factory's message (no
    crash, the frontend keeps serving); the factory is retried and its engine serves once a
    call succeeds."""
    procs, ns = _env(monkeypatch, tmp_path)
    calls: list = []
    seen: list = []

    async def main() -> None:
        rt, task, base = await _frontend(ns, _wrapping_factory(calls, seen, fail_first=2))
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        try:
            procs.mocker(model_dir, "--speedup-ratio", "100")
            deadline = time.monotonic() + 30
            error = None
            while time.monotonic() < deadline and error is None:
                try:
                    await client.chat.completions.create(
                        model="tiny", messages=MESSAGES, max_tokens=3
                    )
                    raise AssertionError(
                        "the first factory call failed; chat must not answer 200 yet"
                    )
                except openai.NotFoundError:
                    await asyncio.sleep(0.05)
                except openai.APIStatusError as e:
                    error = e
            assert error is not None and error.status_code == 503, error
            assert "factory refused tiny" in str(error), error
            assert "chat_engine_factory failed" in str(error), error
            # Other surfaces of the model still work meanwhile.
            done = await client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
            assert done.choices[0].text is not None
            # Retried after 1 s, then 2 s: the third call succeeds.
            reply = await _until_chat(client, "tiny", timeout=20)
            assert reply.choices[0].message.content.startswith("WRAPPED[")
            assert len(calls) == 3, len(calls)
        finally:
            await client.close()
            await _stop(rt, task)
            procs.close()

    asyncio.run(main())


def test_routed_engine_rejects_a_malformed_request(tmp_path, monkeypatch, model_dir) -> None:
    """``routed.generate`` with a dict that is not a ``PreprocessedRequest`` raises
    ``ValueError`` naming the field; an engine that lets it escape answers 400."""
    procs, ns = _env(monkeypatch, tmp_path)
    errors: list = []

    async def factory(instance, card, routed):
        async def gen(request, context=None):
            try:
                await routed.generate({"token_ids": "not a list", "model": request["model"]})
            except ValueError as e:
                errors.append(str(e))
                raise
            yield _chunk(request["model"], "unreachable", "stop")

        return PythonAsyncEngine(gen, asyncio.get_running_loop())

    async def main() -> None:
        rt, task, base = await _frontend(ns, factory)
        try:
            procs.mocker(model_dir, "--speedup-ratio", "100")
            deadline = time.monotonic() + 30
            status, out = None, b""
            while time.monotonic() < deadline:
                body = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
                try:
                    status, out = await asyncio.to_thread(
                        http, "POST", f"{base}/v1/chat/completions", body
                    )
                except OSError:
                    # `run_input` is still binding the port (it runs as a task started
                    # just before): not listening yet.
                    status = None
                if status not in (None, 404, 503):
                    break
                await asyncio.sleep(0.1)
            assert status == 400, (status, out)
            assert (
                errors and "invalid preprocessed request" in errors[0] and "token_ids" in errors[0]
            )
        finally:
            await _stop(rt, task)
            procs.close()

    asyncio.run(main())


def test_factory_needs_a_running_event_loop() -> None:
    """As the reference: the factory's loop is the one running when the args are made."""

    async def factory(instance, card, routed):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(
        RuntimeError,
        match=r"Failed to get TaskLocals for chat_engine_factory.*no running event loop",
    ):
        EntrypointArgs(EngineType.Dynamic, chat_engine_factory=factory)

    async def inside() -> None:
        EntrypointArgs(EngineType.Dynamic, chat_engine_factory=factory)
        EntrypointArgs(EngineType.Dynamic, chat_engine_factory=None)

    asyncio.run(inside())
