"""Observe the reference's ``chat_engine_factory`` black-box (run with the reference venv).

    .bench-ref-venv/bin/python scripts/observe_chat_engine_factory_reference.py MODEL_DIR

Starts two worker processes serving model ``alpha`` on one endpoint and one serving
``beta`` on another (file discovery in a temporary directory), then a frontend in this
process whose factory records each call and wraps the ``RoutedEngine`` it is given. Prints
what it saw as JSON: factory calls (triple, card name), what ``routed.generate`` yields,
HTTP answers of chat and completions requests, and what a raising factory gives.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from dynamo.llm import (
    EngineType,
    EntrypointArgs,
    ModelInput,
    ModelType,
    PythonAsyncEngine,
    WorkerType,
    make_engine,
    register_model,
    run_input,
)
from dynamo.runtime import DistributedRuntime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def worker(model_dir: str, ns: str, component: str, name: str) -> None:
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp")
    ep = rt.endpoint(f"{ns}.{component}.generate")

    async def handler(request, context=None):
        print("WORKER_REQUEST", json.dumps(request), flush=True)
        yield {"token_ids": [40, 41]}
        yield {"token_ids": [42], "finish_reason": "stop"}

    task = asyncio.ensure_future(ep.serve_endpoint(handler))
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        ep,
        model_dir,
        name,
        worker_type=WorkerType.Aggregated,
    )
    await task


async def frontend(model_dir: str, ns: str, raising: bool) -> dict:
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp")
    calls: list = []
    items: list = []

    async def factory(instance, card, routed):
        calls.append(
            {
                "triple": list(instance.triple()),
                "instance_type": type(instance).__name__,
                "card_name": card.name(),
                "routed_type": type(routed).__name__,
                "routed_dir": [m for m in dir(routed) if not m.startswith("_")],
            }
        )
        if raising:
            raise RuntimeError("factory refused " + card.name())

        async def gen(request, context=None):
            pre = {
                "token_ids": [1, 2, 3],
                "stop_conditions": {"max_tokens": 4},
                "sampling_options": {},
                "output_options": {},
                "eos_token_ids": [],
                "model": request["model"],
            }
            stream = await routed.generate(pre)
            got = []
            async for item in stream:
                got.append(item if isinstance(item, (dict, list, str, int)) else repr(item))
            items.append({"stream_type": type(stream).__name__, "items": got})
            yield {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": "WRAPPED"},
                        "finish_reason": "stop",
                    }
                ],
            }

        return PythonAsyncEngine(gen, asyncio.get_running_loop())

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
    base = f"http://127.0.0.1:{port}"
    out: dict = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            st, body = await asyncio.to_thread(http, "GET", base + "/v1/models")
            ids = sorted(m["id"] for m in json.loads(body)["data"]) if st == 200 else []
            if ids == ["alpha", "beta"]:
                break
        except OSError:
            pass
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)
    out["models"] = await asyncio.to_thread(http, "GET", base + "/v1/models")
    chat = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    out["chat_alpha"] = [
        await asyncio.to_thread(http, "POST", base + "/v1/chat/completions", chat) for _ in range(3)
    ]
    out["chat_alpha_stream"] = await asyncio.to_thread(
        http, "POST", base + "/v1/chat/completions", {**chat, "stream": True}
    )
    out["completions_alpha"] = await asyncio.to_thread(
        http, "POST", base + "/v1/completions", {"model": "alpha", "prompt": "hi", "max_tokens": 4}
    )
    out["factory_calls"] = calls
    out["routed_items"] = items
    rt.shutdown()
    try:
        await asyncio.wait_for(task, 5)
    except Exception as e:
        out["run_input_end"] = repr(e)
    return out


def main() -> None:
    if sys.argv[1] == "--worker":
        asyncio.run(worker(*sys.argv[2:6]))
        return
    model_dir = sys.argv[1]
    result = {}
    # Outside a running loop.
    try:
        EntrypointArgs(EngineType.Dynamic, chat_engine_factory=lambda *a: None)
        result["no_loop_construct"] = "ok"
    except Exception as e:
        result["no_loop_construct"] = f"{type(e).__name__}: {e}"
    for raising in (False, True):
        with tempfile.TemporaryDirectory() as d:
            env = dict(
                os.environ,
                DYN_FILE_KV=d,
                DYN_DISCOVERY_BACKEND="file",
                DYN_TCP_RPC_HOST="127.0.0.1",
            )
            os.environ["DYN_TCP_RPC_HOST"] = "127.0.0.1"
            os.environ["DYN_FILE_KV"] = d
            ns = "obs" + str(os.getpid()) + str(int(raising))
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", model_dir, ns, comp, name],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                for comp, name in (("wa", "alpha"), ("wa", "alpha"), ("wb", "beta"))
            ]
            try:
                result["raising" if raising else "plain"] = asyncio.run(
                    frontend(model_dir, ns, raising)
                )
            finally:
                for p in procs:
                    p.terminate()
                reqs = []
                for p in procs:
                    o, _ = p.communicate(timeout=10)
                    reqs += [
                        json.loads(line.split(" ", 1)[1])
                        for line in o.splitlines()
                        if line.startswith("WORKER_REQUEST")
                    ]
                result[("raising" if raising else "plain") + "_worker_requests"] = reqs
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
