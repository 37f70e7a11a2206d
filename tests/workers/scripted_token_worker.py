"""A scripted ``ModelInput.Tokens`` chat worker: it answers each request with a fixed model
output, as token ids of the model's own tokenizer, so the frontend's detokenizer and its
tool-call / reasoning parsers see what a real model of that format would emit.

``scripted_token_worker.py CONFIG``; ``CONFIG`` is a JSON file::

    {"models": [{"name": "hermes", "model_dir": "...", "tool_call_parser": "hermes",
                 "reasoning_parser": null, "exclude_tools_when_tool_choice_none": true}, ...],
     "scripts": "scripts.json", "log": "requests.jsonl", "chunk": 3}

Every model is registered (``ModelType.Chat``) on an endpoint of its own, with its parsers
in ``ModelRuntimeConfig``. ``scripts.json`` maps a key to an output text; it is read again
for every request, so a test may add scripts while the worker runs. A request's output is
the script whose marker ``[[script:KEY]]`` occurs last in the decoded prompt (the last user
or tool message names the next answer); no marker: ``no script``. The output is encoded with
the model's ``tokenizer.json`` (no special tokens added: the text's own special-token
strings, like ``<|channel|>`` of a model that has it, become their ids) and streamed
``chunk`` ids at a time, so multi-byte characters and markers are split across chunks; it is
cut at ``max_tokens`` (``finish_reason: length``), else ends with ``stop``. A marker
``[[chunk:N]]`` in the prompt streams ``N`` ids at a time instead.

Each request is appended to the log as one JSON line: the model, the prompt decoded with its
special tokens, the request's output options and stop conditions, the number of ids sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import uvloop
from tokenizers import Tokenizer

from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker

MARKER = re.compile(r"\[\[script:([A-Za-z0-9_.-]+)\]\]")
CHUNK = re.compile(r"\[\[chunk:([0-9]+)\]\]")


class Scripted:
    def __init__(self, name: str, model_dir: Path, config: dict) -> None:
        self.name = name
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.scripts = Path(config["scripts"])
        self.log = Path(config["log"])
        self.chunk = int(config.get("chunk", 3))

    def output(self, prompt: str) -> str:
        keys = MARKER.findall(prompt)
        if not keys:
            return "no script"
        scripts = json.loads(self.scripts.read_text())
        return scripts.get(keys[-1], f"unknown script {keys[-1]}")

    async def generate(self, request, context):
        prompt = self.tokenizer.decode(request["token_ids"], skip_special_tokens=False)
        ids = self.tokenizer.encode(self.output(prompt), add_special_tokens=False).ids
        limit = (request.get("stop_conditions") or {}).get("max_tokens")
        finish = "stop"
        if limit is not None and limit < len(ids):
            ids, finish = ids[:limit], "length"
        with self.log.open("a") as f:
            record = {
                "model": self.name,
                "prompt": prompt,
                "output_options": request.get("output_options"),
                "stop_conditions": request.get("stop_conditions"),
                "output_tokens": len(ids),
            }
            f.write(json.dumps(record) + "\n")
        chunks = CHUNK.findall(prompt)
        chunk = max(1, int(chunks[-1])) if chunks else self.chunk
        for start in range(0, len(ids), chunk):
            if context.is_stopped():
                return
            yield {"token_ids": ids[start : start + chunk]}
            await asyncio.sleep(0)
        yield {"token_ids": [], "finish_reason": finish}


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    serving = []
    for i, model in enumerate(config["models"]):
        endpoint = runtime.endpoint(f"scripted.m{i}.generate")
        runtime_config = ModelRuntimeConfig()
        runtime_config.tool_call_parser = model.get("tool_call_parser")
        runtime_config.reasoning_parser = model.get("reasoning_parser")
        if "exclude_tools_when_tool_choice_none" in model:
            runtime_config.exclude_tools_when_tool_choice_none = model[
                "exclude_tools_when_tool_choice_none"
            ]
        model_dir = Path(model["model_dir"])
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat,
            endpoint,
            str(model_dir),
            model["name"],
            runtime_config=runtime_config,
        )
        handler = Scripted(model["name"], model_dir, config)
        serving.append(endpoint.serve_endpoint(handler.generate))
    await asyncio.gather(*serving)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
