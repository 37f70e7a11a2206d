"""``GET /v1/realtime`` (OpenAI Realtime text events over a WebSocket) and ``/openapi.json``,
against a real frontend with a mocker worker.

Realtime: a session answers ``session.created``; ``session.update`` →
``session.updated``; ``conversation.item.create`` → ``conversation.item.created``;
``response.create`` streams ``response.created``, ``response.text.delta`` events whose
concatenation is the ``response.text.done`` text and the ``response.done`` output, which
carries the chat path's usage. Audio (``input_audio_buffer.*``, an ``audio`` modality,
``input_audio`` parts) answers an ``error`` event and the session goes on. Reference 1.6.1
(observed, ``run_input(rt, "http", EngineType.Dynamic)``): its ``/openapi.json`` (3.1.0)
lists ``GET /v1/realtime``; an unknown model is refused with HTTP 404 before the upgrade
(``websockets`` raises ``InvalidStatus``), as ours is. The event shapes follow OpenAI's
Realtime API.

OpenAPI: the document is OpenAPI 3.1 and lists every route the frontend answers, with the
chat request's fields taken from the request type.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import websockets
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def stack(tmp_path, model_dir):
    procs = Procs(tmp_path / "kv", tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port)
        procs.mocker(model_dir, "--speedup-ratio", "100")
        wait_for_instances(base, "tiny", 1)
        yield port
    finally:
        procs.close()


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout=20))


async def _conversation(port: int) -> None:
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=tiny"
    async with websockets.connect(url) as ws:
        created = await _recv(ws)
        assert created["type"] == "session.created"
        assert created["session"]["model"] == "tiny"

        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"instructions": "Be brief.", "max_response_output_tokens": 6},
                }
            )
        )
        updated = await _recv(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["instructions"] == "Be brief."

        # Audio is refused, and the session goes on.
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"}))
        error = await _recv(ws)
        assert error["type"] == "error" and "audio" in error["error"]["message"]
        await ws.send(
            json.dumps({"type": "session.update", "session": {"modalities": ["text", "audio"]}})
        )
        error = await _recv(ws)
        assert error["type"] == "error" and "audio" in error["error"]["message"]

        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Hello there!"}],
                    },
                }
            )
        )
        item = await _recv(ws)
        assert item["type"] == "conversation.item.created"
        assert item["item"]["content"][0]["text"] == "Hello there!"

        for _ in range(2):
            await ws.send(json.dumps({"type": "response.create"}))
            events = []
            while True:
                event = await _recv(ws)
                events.append(event)
                if event["type"] in ("response.done", "error"):
                    break
            kinds = [e["type"] for e in events]
            assert kinds[0] == "response.created", kinds
            assert kinds[-2:] == ["response.text.done", "response.done"], kinds
            deltas = [e["delta"] for e in events if e["type"] == "response.text.delta"]
            assert deltas, kinds
            text = "".join(deltas)
            assert events[-2]["text"] == text
            done = events[-1]["response"]
            assert done["status"] == "completed"
            assert done["output"][0]["content"][0]["text"] == text
            # max_response_output_tokens reached the chat path.
            assert 0 < done["usage"]["output_tokens"] <= 6
            assert done["usage"]["input_tokens"] > 0

    # An unknown model is refused before the upgrade, as the reference does (observed:
    # its handshake answers HTTP 404).
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=nope"):
            pass
    assert refused.value.response.status_code == 404


def test_realtime_text_conversation_over_the_chat_path(stack) -> None:
    asyncio.run(_conversation(stack))


def test_realtime_without_upgrade_is_an_openai_error(stack) -> None:
    status, body = http("GET", f"http://127.0.0.1:{stack}/v1/realtime?model=tiny")
    assert 400 <= status < 500
    assert "WebSocket" in json.loads(body)["error"]["message"]


def test_openapi_lists_every_route(stack) -> None:
    base = f"http://127.0.0.1:{stack}"
    status, body = http("GET", f"{base}/openapi.json")
    assert status == 200
    doc = json.loads(body)
    assert doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    for path, method in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/health", "get"),
        ("/live", "get"),
        ("/metrics", "get"),
        ("/v1/realtime", "get"),
        ("/openapi.json", "get"),
    ]:
        assert method in paths[path], path
    schema = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert {"model", "messages", "stream"} <= set(schema["properties"])
    # Every documented GET without parameters answers (not the 404 fallback).
    for path, item in paths.items():
        if "get" in item and "{" not in path and path != "/v1/realtime":
            status, _ = http("GET", base + path)
            assert status == 200, path
