"""Unary (one answer) helpers: ``dynamo.runtime.UnaryClient`` / ``serve_unary_endpoint`` and
``dynamo.llm.LLMUnaryClient`` / ``UnaryChatModel`` / ``with_engine_data`` (issue 11, item 15).

Each test's docstring records what ai-dynamo-runtime 1.6.1 did when the same calls were made
against it (file discovery, tcp request plane).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from runtime_util import fresh_python, local_runtime, unique_ns
from serving_util import Procs, free_port, http

from dynamo._core import Context
from dynamo.llm import LLMUnaryClient, UnaryChatModel, with_engine_data
from dynamo.llm.tiny_model import write_tiny_model
from dynamo.runtime import UnaryClient, serve_unary_endpoint

PLANES = ["tcp", "nats"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def plane(request, monkeypatch):
    """The request plane of the test; nats gets its own server."""
    name = request.param
    if name == "nats":
        server = request.getfixturevalue("nats_server")
        monkeypatch.setenv("NATS_SERVER", server.url)
    return name


async def _client(rt, path: str):
    client = await rt.endpoint(path).client()
    await asyncio.wait_for(client.wait_for_instances(), 10)
    return client


@pytest.mark.parametrize("plane", PLANES, indirect=True)
async def test_unary_client_returns_exactly_one_answer(plane) -> None:
    """Reference 1.6.1: ``serve_unary_endpoint(endpoint, handler)`` calls
    ``handler(request, context=<Context>)`` and sends its return value as the only item;
    ``UnaryClient(client).complete(request)`` returns it. A handler returning ``None`` and a
    streaming endpoint with 0 items make ``complete`` raise ``RuntimeError("unary endpoint
    returned no response")``; 2 items raise ``RuntimeError("unary endpoint returned multiple
    responses")``; a handler exception reaches the caller as an error of the call.
    """
    ns = unique_ns()
    async with local_runtime(request_plane=plane) as rt:
        seen = {}

        async def handler(request, context):
            seen["context"] = context
            if request == "none":
                return None
            if request == "raise":
                raise ValueError("boom")
            return {"echo": request}

        async def stream(request, context):
            for i in range(request):
                yield i

        unary_ep = rt.endpoint(f"{ns}.c.unary")
        rt_tasks = [asyncio.ensure_future(serve_unary_endpoint(unary_ep, handler))]
        rt.serve(rt.endpoint(f"{ns}.c.stream"), stream)
        try:
            unary = UnaryClient(await _client(rt, f"{ns}.c.unary"))
            assert await unary.complete({"a": [1, 2]}) == {"echo": {"a": [1, 2]}}
            assert isinstance(seen["context"], Context)
            with pytest.raises(RuntimeError, match="unary endpoint returned no response"):
                await unary.complete("none")
            with pytest.raises(Exception, match="boom"):
                await unary.complete("raise")

            multi = UnaryClient(await _client(rt, f"{ns}.c.stream"))
            assert await multi.complete(1) == 0
            with pytest.raises(RuntimeError, match="unary endpoint returned no response"):
                await multi.complete(0)
            with pytest.raises(RuntimeError, match="unary endpoint returned multiple responses"):
                await multi.complete(2)
        finally:
            rt.shutdown()
            await asyncio.wait_for(asyncio.gather(*rt_tasks, return_exceptions=True), 10)


@pytest.mark.parametrize("plane", PLANES, indirect=True)
async def test_stop_on_the_outer_call_reaches_the_nested_inner_handler(plane) -> None:
    """Reference 1.6.1: an outer unary handler that calls an inner unary endpoint with
    ``UnaryClient(inner).complete(request, context=context)`` (its own context); the caller
    runs ``UnaryClient(outer).complete(..., context=ctx)`` and calls ``ctx.stop_generating()``
    while the inner handler is running. The inner handler's ``context.is_stopped()`` became
    True within the poll interval, and the caller's ``complete`` raised ``RuntimeError("unary
    endpoint returned no response")``.

    The inner handler counts as having observed the stop when it sees ``is_stopped()`` or when
    its coroutine is closed/cancelled (either way it stops working for the dead request).
    """
    ns = unique_ns()
    async with local_runtime(request_plane=plane) as rt:
        started = asyncio.Event()
        observed = asyncio.Event()

        async def inner(request, context):
            started.set()
            try:
                for _ in range(400):
                    if context.is_stopped():
                        observed.set()
                        return {"stopped": True}
                    await asyncio.sleep(0.02)
                return {"stopped": False}
            except (GeneratorExit, asyncio.CancelledError):
                observed.set()
                raise

        inner_ep = rt.endpoint(f"{ns}.c.inner")
        outer_ep = rt.endpoint(f"{ns}.c.outer")
        inner_holder = {}

        async def outer(request, context):
            return await UnaryClient(inner_holder["client"]).complete(request, context=context)

        tasks = [
            asyncio.ensure_future(serve_unary_endpoint(inner_ep, inner)),
            asyncio.ensure_future(serve_unary_endpoint(outer_ep, outer)),
        ]
        try:
            inner_holder["client"] = await _client(rt, f"{ns}.c.inner")
            outer_client = UnaryClient(await _client(rt, f"{ns}.c.outer"))
            ctx = Context()
            call = asyncio.ensure_future(outer_client.complete({"x": 1}, context=ctx))
            await asyncio.wait_for(started.wait(), 10)
            assert not observed.is_set()
            t0 = time.monotonic()
            ctx.stop_generating()
            await asyncio.wait_for(observed.wait(), 5)
            assert time.monotonic() - t0 < 5
            # The caller gets no answer for a stopped call (an error, not a value).
            with pytest.raises(Exception):  # noqa: B017 - the text differs by plane/timing
                await asyncio.wait_for(call, 10)
        finally:
            rt.shutdown()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def test_with_engine_data_merges_without_overwriting() -> None:
    """Reference 1.6.1 ``with_engine_data(completion, values)``: returns a new dict (the input
    is unchanged) whose ``engine_data`` is the old one (or ``{}`` when absent/None) plus
    ``values``; empty ``values`` adds no ``engine_data`` key; errors are ``ValueError``:
    ``"engine_data already contains keys: 'a'"``, ``"existing engine_data must be an
    object"``, ``"engine_data values must be an object"``, ``"LLM completion must be an
    object"``.
    """
    completion = {"token_ids": [1], "finish_reason": "stop", "engine_data": {"b": 2}}
    merged = with_engine_data(completion, {"a": 1})
    assert merged == {"token_ids": [1], "finish_reason": "stop", "engine_data": {"b": 2, "a": 1}}
    assert completion["engine_data"] == {"b": 2}
    assert with_engine_data({"token_ids": [1]}, {"a": 1})["engine_data"] == {"a": 1}
    assert with_engine_data({"engine_data": None}, {"a": 1})["engine_data"] == {"a": 1}
    assert with_engine_data({"token_ids": [1]}, {}) == {"token_ids": [1]}
    with pytest.raises(ValueError, match="engine_data already contains keys: 'a'"):
        with_engine_data({"engine_data": {"a": 2}}, {"a": 1})
    with pytest.raises(ValueError, match="existing engine_data must be an object"):
        with_engine_data({"engine_data": 5}, {"a": 1})
    with pytest.raises(ValueError, match="engine_data values must be an object"):
        with_engine_data({}, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LLM completion must be an object"):
        with_engine_data(5, {"a": 1})  # type: ignore[arg-type]


async def test_llm_unary_client_joins_the_stream_and_validates() -> None:
    """Reference 1.6.1 ``LLMUnaryClient``: ``await LLMUnaryClient.connect(runtime, path)``
    waits for an instance (a bad path is ``ValueError``); ``complete(request)`` returns the
    terminal chunk (the one with a ``finish_reason``) with ``token_ids`` = every chunk's
    tokens in order (``[1,2]+[3]+[]`` -> ``[1,2,3]``, ``engine_data`` of the terminal chunk).
    Request checks (``ValueError``, before sending): not a mapping -> ``"LLM request must be
    an object"``; ``sampling_options``/``output_options`` not a mapping -> ``"... must be an
    object"``; ``sampling_options.n=2`` -> ``"LLMUnaryClient requires n=1"``;
    ``output_options.logprobs``/``prompt_logprobs`` -> ``"LLMUnaryClient does not support
    logprobs"``. Stream checks (``RuntimeError``): chunk index not 0 (or missing) -> ``"LLM
    endpoint requires choice index 0"``; a chunk after the terminal one -> ``"LLM endpoint
    returned data after terminal"``; no finish_reason -> ``"LLM endpoint returned no terminal
    chunk"``; log probabilities -> ``"LLM endpoint returned unsupported logprobs"``; a
    non-mapping chunk -> ``"LLM endpoint returned a non-object chunk"``.
    """
    ns = unique_ns()
    async with local_runtime() as rt:

        async def generate(request, context):
            mode = request.get("annotations", ["plain"])[0]
            if mode == "chunks":
                yield {"index": 0, "token_ids": [1, 2], "engine_data": {"early": 1}}
                yield {"index": 0, "token_ids": [3]}
                yield {
                    "index": 0,
                    "token_ids": [],
                    "finish_reason": "stop",
                    "engine_data": {"k": 1},
                }
            elif mode == "index1":
                yield {"index": 1, "token_ids": [1], "finish_reason": "stop"}
            elif mode == "noindex":
                yield {"token_ids": [1], "finish_reason": "stop"}
            elif mode == "after":
                yield {"index": 0, "token_ids": [1], "finish_reason": "stop"}
                yield {"index": 0, "token_ids": [2], "finish_reason": "stop"}
            elif mode == "nofinish":
                yield {"index": 0, "token_ids": [1]}
            elif mode == "logprobs":
                yield {"index": 0, "token_ids": [1], "log_probs": [-0.5], "finish_reason": "stop"}
            elif mode == "list":
                yield [1]
            else:
                yield {
                    "index": 0,
                    "token_ids": request["token_ids"][::-1],
                    "finish_reason": "length",
                }

        rt.serve(rt.endpoint(f"{ns}.w.generate"), generate)
        with pytest.raises(ValueError, match=r"(?i)invalid endpoint path"):
            await LLMUnaryClient.connect(rt, "bad")
        client = await asyncio.wait_for(LLMUnaryClient.connect(rt, f"{ns}.w.generate"), 10)
        base = {"token_ids": [5, 6, 7]}
        assert await client.complete(base) == {
            "index": 0,
            "token_ids": [7, 6, 5],
            "finish_reason": "length",
        }
        assert await client.complete({**base, "annotations": ["chunks"]}) == {
            "index": 0,
            "token_ids": [1, 2, 3],
            "finish_reason": "stop",
            "engine_data": {"k": 1},
        }
        for mode, text in [
            ("index1", "LLM endpoint requires choice index 0"),
            ("noindex", "LLM endpoint requires choice index 0"),
            ("after", "LLM endpoint returned data after terminal"),
            ("nofinish", "LLM endpoint returned no terminal chunk"),
            ("logprobs", "LLM endpoint returned unsupported logprobs"),
            ("list", "LLM endpoint returned a non-object chunk"),
        ]:
            with pytest.raises(RuntimeError, match=text):
                await client.complete({**base, "annotations": [mode]})
        for request, text in [
            ([1, 2], "LLM request must be an object"),
            ({**base, "sampling_options": None}, "sampling_options must be an object"),
            ({**base, "output_options": 3}, "output_options must be an object"),
            ({**base, "sampling_options": {"n": 2}}, "LLMUnaryClient requires n=1"),
            ({**base, "output_options": {"logprobs": 2}}, "does not support logprobs"),
            ({**base, "output_options": {"prompt_logprobs": 1}}, "does not support logprobs"),
        ]:
            with pytest.raises(ValueError, match=text):
                await client.complete(request)  # type: ignore[arg-type]
        assert (await client.complete({**base, "sampling_options": {"n": 1}}))["token_ids"] == [
            7,
            6,
            5,
        ]


async def test_unary_chat_model_is_served_through_the_frontend(
    tmp_path, model_dir, monkeypatch
) -> None:
    """Reference 1.6.1 ``UnaryChatModel(model_path, service_name, public_model_name=None,
    chat_template=None)`` is a frozen dataclass; ``await model.serve(runtime, handler)``
    registers a token-input chat model (``model_type: Chat``, ``model_input: Tokens``, display
    name ``public_model_name``) on ``<service_name>.app.generate`` and serves the handler
    there as a unary endpoint: the handler's return value is sent as is (the terminal
    completion ``{"index": 0, "token_ids": [...], "finish_reason": ...}``).

    Here the OpenAI frontend serves the model: a chat request reaches the handler as a
    preprocessed request and the handler's tokens come back as the answer's text.
    """
    import dataclasses

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    answer_ids = tok.encode("hello world").ids
    kv = tmp_path / "kv"
    procs = Procs(kv, tmp_path)
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    monkeypatch.setenv("DYN_FILE_KV", str(kv))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    model = UnaryChatModel(str(model_dir), "unarysvc", public_model_name="unary-pub")
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.service_name = "x"  # type: ignore[misc]
    seen = []

    async def handler(request, context):
        seen.append(request)
        return {"index": 0, "token_ids": answer_ids, "finish_reason": "stop"}

    try:
        procs.frontend(port)
        async with local_runtime(backend="file") as rt:
            task = asyncio.ensure_future(model.serve(rt, handler))
            try:
                body = json.dumps(
                    {
                        "model": "unary-pub",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 16,
                    }
                ).encode()
                deadline = time.monotonic() + 30
                status, out = 0, b""
                while time.monotonic() < deadline:
                    try:
                        status, out = await asyncio.to_thread(
                            http, "POST", f"{base}/v1/chat/completions", body
                        )
                    except OSError:
                        status = 0
                    if status == 200:
                        break
                    await asyncio.sleep(0.2)
                assert status == 200, out
                reply = json.loads(out)
                assert reply["model"] == "unary-pub"
                assert reply["choices"][0]["message"]["content"] == "hello world"
                assert reply["choices"][0]["finish_reason"] == "stop"
                assert seen and seen[0]["token_ids"]
                direct = await LLMUnaryClient.connect(rt, "unarysvc.app.generate")
                assert (await direct.complete({"token_ids": [1]}))["token_ids"] == answer_ids
            finally:
                rt.shutdown()
                await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
    finally:
        procs.close()


def test_llm_unary_helpers_load_on_first_use() -> None:
    """``dynamo.llm`` loads its unary helpers when one is first asked for (building their
    frozen dataclass and importing ``dataclasses`` was ~3 ms of every worker's and
    frontend's start-up): a fresh process that imports the package has not loaded them;
    the names are listed, resolve to the module's objects (also through ``import *``) and
    an unknown name is still an ``AttributeError``."""
    code = (
        "import sys, dynamo.llm as llm\n"
        "assert 'dynamo.llm._unary' not in sys.modules, 'loaded at import'\n"
        "assert 'dataclasses' not in sys.modules, 'dataclasses imported'\n"
        "assert {'LLMUnaryClient', 'UnaryChatModel', 'with_engine_data'} <= set(dir(llm))\n"
        "from dynamo.llm import UnaryChatModel\n"
        "import dynamo.llm._unary as u\n"
        "assert UnaryChatModel is u.UnaryChatModel\n"
        "ns = {}\n"
        "exec('from dynamo.llm import *', ns)\n"
        "assert ns['with_engine_data'] is u.with_engine_data\n"
        "assert ns['LLMUnaryClient'] is u.LLMUnaryClient\n"
        "assert not hasattr(llm, 'NoSuchHelper')\n"
    )
    fresh_python(code)


class _FakeStream:
    """A response stream of given chunks that records ``aclose()``; with ``hang`` it waits
    after them (for cancellation)."""

    def __init__(self, chunks: list, hang: bool = False) -> None:
        self.chunks = list(chunks)
        self.hang = hang
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.chunks:
            return self.chunks.pop(0)
        if self.hang:
            await asyncio.sleep(30)
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class _FakeClient:
    def __init__(self, stream: _FakeStream) -> None:
        self.stream = stream

    async def round_robin(self, request, annotated=True, context=None):
        return self.stream


_OK = {"index": 0, "token_ids": [1], "finish_reason": "stop"}


# Each stream, and what reference 1.6.1's client answered for it (observed black-box with
# the same fake client on both wheels, 2026-12-08; docs/compatibility.md).
@pytest.mark.parametrize(
    ("chunks", "error"),
    [
        ([{"index": 0, "token_ids": [1]}, _OK], None),
        ([5], "non-object chunk"),
        ([{**_OK, "index": 1}], "requires choice index 0"),
        ([{**_OK, "index": True}], "requires choice index 0"),
        ([{**_OK, "token_ids": "ab"}], "invalid token_ids"),
        ([{**_OK, "token_ids": [True]}], "invalid token_ids"),
        ([{**_OK, "token_ids": [1.0]}], "invalid token_ids"),
        ([{**_OK, "token_ids": None}], "invalid token_ids"),
        ([{"index": 0, "finish_reason": "stop"}], "invalid token_ids"),
        ([{**_OK, "token_ids": [-1]}], None),
        ([{"index": 0, "token_ids": [1]}], "no terminal chunk"),
        ([{**_OK, "finish_reason": ""}], "invalid finish_reason"),
        ([{**_OK, "finish_reason": 5}], "invalid finish_reason"),
        ([{**_OK, "finish_reason": "an_engines_own_reason"}], None),
        ([{**_OK, "log_probs": [0.1]}], "unsupported logprobs"),
        ([{**_OK, "log_probs": None}], "unsupported logprobs"),
        ([{**_OK, "top_logprobs": None}], "unsupported logprobs"),
        ([{**_OK, "cum_log_probs": None}], None),
        ([_OK, {"index": 0, "token_ids": [2]}], "data after terminal"),
    ],
)
async def test_llm_unary_client_checks_the_stream_and_always_closes_it(chunks, error) -> None:
    stream = _FakeStream(chunks)
    client = LLMUnaryClient(_FakeClient(stream))  # type: ignore[arg-type]
    if error is None:
        answer = await client.complete({"token_ids": [1]})
        assert answer["finish_reason"] == chunks[-1]["finish_reason"]
    else:
        with pytest.raises(RuntimeError, match=f"LLM endpoint .*{error}"):
            await client.complete({"token_ids": [1]})
    assert stream.closed


async def test_llm_unary_client_closes_the_stream_when_cancelled() -> None:
    stream = _FakeStream([{"index": 0, "token_ids": [1]}], hang=True)
    task = asyncio.ensure_future(
        LLMUnaryClient(_FakeClient(stream)).complete({"token_ids": [1]})  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.closed


async def test_unary_chat_model_looks_register_model_up_in_its_module(monkeypatch) -> None:
    """As the reference's: ``dynamo.llm._unary`` exposes ``register_model``, ``ModelInput``,
    ``ModelType`` and ``WorkerType``, and ``UnaryChatModel.serve`` calls the module's
    ``register_model`` as it is when called (so it can be patched there)."""
    import dynamo.llm._unary as unary

    for name in ("register_model", "ModelInput", "ModelType", "WorkerType"):
        assert hasattr(unary, name), name
    seen = []

    class Stop(Exception):
        pass

    async def fake_register(*args, **kwargs):
        seen.append((args, kwargs))
        raise Stop

    monkeypatch.setattr(unary, "register_model", fake_register)
    async with local_runtime() as rt:
        with pytest.raises(Stop):
            await UnaryChatModel("/nonexistent", "svc").serve(rt, lambda *a: None)  # type: ignore[arg-type]
    [(args, kwargs)] = seen
    assert args[0] == unary.ModelInput.Tokens and args[4] == "svc"
    assert kwargs["worker_type"] == unary.WorkerType.Aggregated
