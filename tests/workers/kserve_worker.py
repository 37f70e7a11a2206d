"""Workers behind the KServe gRPC ingress, registered through discovery.

* ``kserve.echo.generate``: tensor model ``echo`` (``INPUT0`` FP32 ``[-1, -1]``), answers the
  request's tensors unchanged (with the request's parameters);
* ``kserve.strings.generate``: tensor model ``strings`` (``TEXT`` BYTES ``[-1]``), answers
  each string upper-cased in ``UPPER``;
* ``kserve.noconfig.generate``: tensor model ``noconfig`` registered without
  ``tensor_model_config``;
* ``kserve.ticker.generate``: tensor model ``ticker`` (``X`` FP32 ``[-1]``): yields
  ``count`` (a request parameter, default 3) responses ``STEP`` INT32 ``[1]`` = 0, 1, ...
  ``DELAY`` seconds apart, checking ``context.is_stopped()`` before each. Appends
  ``start <count>`` and ``end <yielded> <how>`` lines to ``$TICK_TRACE`` (``how``: ``done``,
  ``stopped`` when ``is_stopped()`` ended the loop, ``closed`` when the generator was
  closed or cancelled);
* ``kserve.slow.generate``: ``ModelInput.Text`` completions model ``slowtext``: streams
  ``max_tokens`` (default 5) chunks ``"t0 "``, ``"t1 "``... ``DELAY`` seconds apart. Appends
  ``start <n>`` and ``end <yielded>`` lines to ``$TRACE``.

``echo`` is registered with a runtime config whose engine-specific ``kind`` is ``"echo"``.

``argv[1]``: the tiny model directory (for the text model's card).
"""

from __future__ import annotations

import asyncio
import os
import sys

import uvloop

from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker

DELAY = float(os.environ.get("DELAY", "0.02"))
ECHO = {
    "name": "echo",
    "inputs": [{"name": "INPUT0", "data_type": "Float32", "shape": [-1, -1]}],
    "outputs": [{"name": "INPUT0", "data_type": "Float32", "shape": [-1, -1]}],
}
STRINGS = {
    "name": "strings",
    "inputs": [{"name": "TEXT", "data_type": "Bytes", "shape": [-1]}],
    "outputs": [{"name": "UPPER", "data_type": "Bytes", "shape": [-1]}],
}

TICKER = {
    "name": "ticker",
    "inputs": [{"name": "X", "data_type": "Float32", "shape": [-1]}],
    "outputs": [{"name": "STEP", "data_type": "Int32", "shape": [1]}],
}


def _trace(line: str, var: str = "TRACE") -> None:
    with open(os.environ[var], "a") as f:
        f.write(line + "\n")


async def ticker(request, context):
    count = int(request.get("parameters", {}).get("count", {}).get("int64", 3))
    _trace(f"start {count}", "TICK_TRACE")
    yielded, how = 0, "closed"
    try:
        for i in range(count):
            if i:
                await asyncio.sleep(DELAY)
            if context.is_stopped():
                how = "stopped"
                break
            yielded += 1
            yield {
                "tensors": [
                    {
                        "metadata": {"name": "STEP", "data_type": "Int32", "shape": [1]},
                        "data": {"data_type": "Int32", "values": [i]},
                    }
                ]
            }
        else:
            how = "done"
    finally:
        _trace(f"end {yielded} {how}", "TICK_TRACE")


async def echo(request, context):
    yield {"tensors": request["tensors"], "parameters": request.get("parameters", {})}


async def strings(request, context):
    (t,) = request["tensors"]
    upper = [bytes(v).upper() for v in t["data"]["values"]]
    yield {
        "tensors": [
            {
                "metadata": {"name": "UPPER", "data_type": "Bytes", "shape": [len(upper)]},
                "data": {"data_type": "Bytes", "values": [list(b) for b in upper]},
            }
        ]
    }


async def slow_text(request, context):
    n = int(request.get("max_tokens") or 5)
    _trace(f"start {n}")
    yielded = 0
    try:
        for i in range(n):
            await asyncio.sleep(DELAY)
            if context.is_stopped():
                break
            yielded += 1
            yield {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": f"t{i} ",
                        "finish_reason": "stop" if i == n - 1 else None,
                    }
                ],
            }
    finally:
        _trace(f"end {yielded}")


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    eps = {
        n: runtime.endpoint(f"kserve.{n}.generate")
        for n in ("echo", "strings", "noconfig", "ticker", "slow")
    }
    tensor = (ModelInput.Tensor, ModelType.TensorBased)
    agg = {"worker_type": WorkerType.Aggregated}
    rc = ModelRuntimeConfig()
    rc.set_engine_specific("kind", '"echo"')  # JSON text
    await register_model(
        *tensor, eps["echo"], "echo", "echo", runtime_config=rc, tensor_model_config=ECHO, **agg
    )
    await register_model(
        *tensor, eps["strings"], "strings", "strings", tensor_model_config=STRINGS, **agg
    )
    await register_model(*tensor, eps["noconfig"], "noconfig", "noconfig", **agg)
    await register_model(
        *tensor, eps["ticker"], "ticker", "ticker", tensor_model_config=TICKER, **agg
    )
    await register_model(
        ModelInput.Text, ModelType.Completions, eps["slow"], sys.argv[1], "slowtext", **agg
    )
    await asyncio.gather(
        eps["echo"].serve_endpoint(echo),
        eps["strings"].serve_endpoint(strings),
        eps["noconfig"].serve_endpoint(echo),
        eps["ticker"].serve_endpoint(ticker),
        eps["slow"].serve_endpoint(slow_text),
    )


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
