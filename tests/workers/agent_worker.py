"""A scripted agent model (``ModelInput.Text``): it receives the chat request the frontend
sends (the Responses and Anthropic surfaces translate theirs into one) and streams OpenAI
chat chunks the way a chat path with a reasoning and a tool-call parser would:

* the last message is a tool result: the final answer ``The weather in <city> is <result>.``;
* the request has tools (and ``tool_choice`` is not ``none``): reasoning text, then one
  ``get_weather`` call per city named in the last user message (``Paris``, ``Oslo``), its
  arguments streamed in pieces, ``finish_reason: tool_calls``;
* otherwise ``echo: <last user text>`` word by word, cut to ``max_completion_tokens`` words
  (``finish_reason: length``).

With ``stream_options.include_usage`` a usage chunk follows (prompt tokens: the number of
words of every message). Each request is appended as one JSON line to ``$MARKER``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import uvloop

from dynamo.llm import ModelInput, ModelType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _plan(request: dict) -> tuple[list[dict], str]:
    """The deltas to stream and the finish reason."""
    messages = request["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        city = "Paris"
        for m in reversed(messages):
            for call in m.get("tool_calls") or []:
                city = json.loads(call["function"]["arguments"]).get("city", city)
                break
            else:
                continue
            break
        words = f"The weather in {city} is {_text(last['content'])}.".split(" ")
        return [{"content": w if i == 0 else f" {w}"} for i, w in enumerate(words)], "stop"
    user = _text(last.get("content"))
    if request.get("tools") and request.get("tool_choice") != "none":
        cities = [c for c in ("Paris", "Oslo") if c in user] or ["Paris"]
        deltas: list[dict] = [
            {"reasoning_content": "The user wants "},
            {"reasoning_content": "the weather; call the tool."},
        ]
        for index, city in enumerate(cities):
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": f"call_{city.lower()}",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
            for piece in ('{"city": ', json.dumps(city), "}"):
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        return deltas, "tool_calls"
    words = f"echo: {user}".split(" ")
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    finish = "stop"
    if limit is not None and limit < len(words):
        words, finish = words[:limit], "length"
    return [{"content": w if i == 0 else f" {w}"} for i, w in enumerate(words)], finish


class RequestHandler:
    async def generate(self, request, context):
        with open(os.environ["MARKER"], "a") as f:
            f.write(json.dumps(request) + "\n")
        deltas, finish = _plan(request)
        base = {
            "id": "chatcmpl-agent",
            "created": 0,
            "model": request["model"],
            "object": "chat.completion.chunk",
        }
        for i, delta in enumerate(deltas):
            await asyncio.sleep(0.002)
            if i == 0:
                delta = {"role": "assistant", **delta}
            yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        if (request.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(_text(m.get("content")).split()) for m in request["messages"])
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": len(deltas),
                "total_tokens": prompt + len(deltas),
            }
            yield {**base, "choices": [], "usage": usage}


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    endpoint = runtime.endpoint(os.environ.get("ENDPOINT", "agent.backend.generate"))
    await register_model(ModelInput.Text, ModelType.Chat, endpoint, sys.argv[1], sys.argv[2])
    await endpoint.serve_endpoint(RequestHandler().generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
