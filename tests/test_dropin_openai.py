"""OpenAI responses as the reference's frontend shapes them (issue 11, items 13 and 14).

One frontend in KV mode with one mocker worker (block size 16). The reference observations
in the docstrings come from ai-dynamo-runtime 1.6.1's own frontend and mocker, run in-process
(``make_engine``/``run_input`` with ``EngineType.Dynamic`` and ``EngineType.Mocker``, file
discovery, tcp request plane) and asked the same requests over HTTP.
"""

from __future__ import annotations

import json

import pytest
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

BLOCK = 16
#: Long enough for several full KV blocks (about 170 prompt tokens with the chat template).
LONG = (
    "The quick brown fox jumps over the lazy dog and keeps running through the forest while "
    "the sun sets behind the hills far away from the city lights and noise. "
) * 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """``base`` URL of a KV-mode frontend with one mocker serving ``tiny``."""
    root = tmp_path_factory.mktemp("dropin")
    model_dir = write_tiny_model(root / "tiny")
    procs = Procs(root / "kv", root)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--router-mode", "kv")
        procs.mocker(model_dir, "--block-size", str(BLOCK), "--speedup-ratio", "100")
        wait_for_instances(base, "tiny", 1)
        yield base
    finally:
        procs.close()


def _post(base: str, path: str, body: dict) -> tuple[int, bytes]:
    return http("POST", f"{base}{path}", json.dumps(body).encode(), timeout=30)


def _sse(raw: bytes) -> list:
    """The JSON events of an SSE body, then ``"[DONE]"``."""
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_usage_reports_cached_prompt_tokens_and_chat_message_has_refusal(stack) -> None:
    """Reference 1.6.1 (KV router mode, mocker with prefix caching, block 16): a chat
    request's usage is ``{"prompt_tokens": 168, "completion_tokens": 5, "total_tokens": 173,
    "prompt_tokens_details": {"cached_tokens": 0}}`` the first time and ``cached_tokens: 160``
    (10 full blocks) when the same prompt is sent again; the same in the final usage chunk of
    a stream with ``stream_options.include_usage`` and for ``/v1/completions``. The same
    figures came back in round-robin mode, so the count is the engine's own (the mocker's);
    ours prefers the engine's count too and falls back to the KV router's overlap (blocks x
    block size) when the worker reports none. The chat ``message`` is
    ``{"content": ..., "refusal": null, "role": "assistant"}``.
    """
    chat = {"model": "tiny", "messages": [{"role": "user", "content": LONG}], "max_tokens": 5}
    status, first = _post(stack, "/v1/chat/completions", chat)
    assert status == 200, first
    first = json.loads(first)
    message = first["choices"][0]["message"]
    assert "refusal" in message and message["refusal"] is None
    assert message["role"] == "assistant"
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 4 * BLOCK

    status, again = _post(stack, "/v1/chat/completions", chat)
    assert status == 200, again
    usage = json.loads(again)["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= prompt_tokens
    assert cached % BLOCK == 0
    assert cached >= (prompt_tokens // BLOCK - 1) * BLOCK

    status, raw = _post(
        stack,
        "/v1/chat/completions",
        {**chat, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert status == 200, raw
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["choices"] == []
    assert final["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert all(e["usage"] is None for e in events[:-2])

    completion = {"model": "tiny", "prompt": LONG, "max_tokens": 3}
    _post(stack, "/v1/completions", completion)
    status, body = _post(stack, "/v1/completions", completion)
    assert status == 200, body
    assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_n_choices_are_separate_generations(stack) -> None:
    """Reference 1.6.1: ``n`` outside 1..128 is a 400 (``"n must be between 1 and 128, got
    129"``; ``n=1000`` fails its JSON parse as a u8). Within the range it answers 200 and
    forwards ``n`` to the engine in ``sampling_options``; its mocker ignores ``n``, so the
    reference's responses to ``n=2``/``n=3`` (chat, completions, streamed or not) had a
    single choice with index 0 and the usage of one generation.

    Ours (deliberate difference, recorded in docs/compatibility.md): the frontend runs ``n``
    generations itself, one worker request per choice (``n=1`` each), so every engine, the
    mocker included, answers ``n`` choices with indexes ``0..n-1`` (OpenAI's contract);
    streamed chunks carry their choice's index, each choice ends with its own
    ``finish_reason``, and usage counts the prompt once and sums the completion tokens.
    """
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "n": 3,
    }
    status, body = _post(stack, "/v1/chat/completions", chat)
    assert status == 200, body
    reply = json.loads(body)
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in reply["choices"])
    assert all(c["message"]["role"] == "assistant" for c in reply["choices"])
    single = json.loads(_post(stack, "/v1/chat/completions", {**chat, "n": 1})[1])
    assert len(single["choices"]) == 1
    assert reply["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert reply["usage"]["completion_tokens"] == 3 * 4
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + 12

    completion = {
        "model": "tiny",
        "prompt": "hello there",
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = _post(stack, "/v1/completions", completion)
    assert status == 200, raw
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    chunks = [e for e in events[:-2] if e["choices"]]
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    assert usage["completion_tokens"] == 2 * 3

    status, raw = _post(
        stack, "/v1/chat/completions", {**chat, "n": 2, "stream": True, "max_tokens": 2}
    )
    assert status == 200, raw
    chat_chunks = [e for e in _sse(raw)[:-1] if e["choices"]]
    firsts = [c for c in chat_chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    assert sorted(c["choices"][0]["index"] for c in firsts) == [0, 1]

    for n in (0, 129):
        status, body = _post(stack, "/v1/completions", {**completion, "stream": False, "n": n})
        assert status == 400, body
        assert f"n must be between 1 and 128, got {n}" in body.decode()
