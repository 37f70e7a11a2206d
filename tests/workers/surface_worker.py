"""Workers of the non-generative surfaces: deterministic fake results, computed from the
request so the tests can check them.

``surface_worker.py KIND MODEL_DIR NAME``; KIND is one of ``embed-text`` (``ModelInput.Text``,
``ModelType.Embedding``, answers an OpenAI embeddings response), ``embed-tokens``
(``ModelInput.Tokens``, ``ModelType.Embedding``, answers the engine shape
``{"embeddings", "prompt_tokens", "total_tokens"}``), ``classify`` (``ModelType.Classify``:
rerank and classify), ``pooling`` (``ModelType.Pooling``), ``images`` (a 1x1 PNG),
``audio`` (a WAV of silence, one frame per input character) and ``videos``. Each request is appended as
one JSON line to ``$MARKER``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import struct
import sys
import wave
import zlib

import uvloop

from dynamo.llm import ModelInput, ModelType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


def text_vector(s: str) -> list[float]:
    return [float(len(s)), float(ord(s[0])), 1.0, 0.5]


def token_vector(ids: list[int]) -> list[float]:
    return [float(len(ids)), float(sum(ids) % 97), 0.25, -2.0]


def tiny_png() -> bytes:
    """A 1x1 red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    raw = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def tiny_wav(frames: int) -> bytes:
    """``frames`` frames of 8 kHz mono 16-bit silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * frames)
    return out.getvalue()


def _texts(request: dict) -> list:
    inp = request["input"]
    return [inp] if isinstance(inp, str) else inp


class Handler:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def generate(self, request, context):
        with open(os.environ["MARKER"], "a") as f:
            f.write(json.dumps(request) + "\n")
        if self.kind == "embed-tokens":
            ids = request["token_ids"]
            n = sum(len(t) for t in ids)
            yield {
                "embeddings": [token_vector(t) for t in ids],
                "prompt_tokens": n,
                "total_tokens": n,
            }
        elif self.kind == "embed-text":
            data = []
            for i, s in enumerate(_texts(request)):
                v = text_vector(s) if isinstance(s, str) else token_vector(s)
                data.append({"object": "embedding", "index": i, "embedding": v})
            # Out of order on purpose: the frontend orders by index.
            data.reverse()
            yield {"object": "list", "data": data, "usage": {"prompt_tokens": 5, "total_tokens": 5}}
        elif self.kind == "classify" and "query" in request:
            yield {
                "scores": [len(d) / 100 for d in request["documents"]],
                "usage": {"total_tokens": 11},
            }
        elif self.kind == "classify":
            yield {
                "data": [
                    {"index": i, "label": "long" if len(s) > 3 else "short", "probs": [0.25, 0.75]}
                    for i, s in enumerate(_texts(request))
                ]
            }
        elif self.kind == "images" and "image" in request:
            # An edit: echo the first image, and what else arrived, back.
            yield {
                "data": [
                    {
                        "b64_json": request["image"][0],
                        "revised_prompt": f"{request['prompt']}|{len(request['image'])}"
                        f"|{'mask' in request}",
                    }
                ]
                * request.get("n", 1)
            }
        elif self.kind == "images":
            png = base64.b64encode(tiny_png()).decode()
            yield {
                "created": 7,
                "data": [{"b64_json": png, "revised_prompt": request["prompt"]}]
                * request.get("n", 1),
            }
        elif self.kind == "audio":
            yield {"audio": base64.b64encode(tiny_wav(len(request["input"]))).decode()}
        elif self.kind == "videos" and request.get("stream_test"):
            for i in range(3):
                yield {"object": "video.chunk", "index": i, "prompt": request["prompt"]}
        elif self.kind == "videos":
            yield {"id": "video-1", "status": "completed", "prompt": request["prompt"]}
        else:
            yield {
                "data": [
                    {"index": i, "object": "pooling", "data": [float(len(s))]}
                    for i, s in enumerate(_texts(request))
                ],
                "usage": {"prompt_tokens": 2},
            }


KINDS = {
    "embed-text": (ModelInput.Text, ModelType.Embedding),
    "embed-tokens": (ModelInput.Tokens, ModelType.Embedding),
    "classify": (ModelInput.Text, ModelType.Classify),
    "pooling": (ModelInput.Text, ModelType.Pooling),
    "images": (ModelInput.Text, ModelType.Images),
    "audio": (ModelInput.Text, ModelType.Audios),
    "videos": (ModelInput.Text, ModelType.Videos),
}


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    kind, model_dir, name = sys.argv[1:4]
    endpoint = runtime.endpoint(f"surf.{kind}.generate")
    model_input, model_type = KINDS[kind]
    await register_model(model_input, model_type, endpoint, model_dir, name)
    await endpoint.serve_endpoint(Handler(kind).generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
