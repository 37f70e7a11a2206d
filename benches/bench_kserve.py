"""The KServe v2 gRPC ingress: this project vs the reference's, side by side.

Each side runs two processes started with its own interpreter, using only the guide's API:

* a frontend: ``EntrypointArgs(EngineType.Dynamic)`` -> ``make_engine`` ->
  ``run_input(runtime, "grpc", engine)`` (this script run as ``bench_kserve.py frontend
  PORT``);
* one worker (``bench_kserve.py worker MODEL_DIR``): tensor model ``echo``
  (``register_model(ModelInput.Tensor, ModelType.TensorBased, ...,
  tensor_model_config=...)``, ``INPUT0`` FP32 ``[1, 1024]``) whose handler answers the
  request's tensors, and text model ``stream`` (``ModelInput.Text``, ``Completions``) whose
  handler yields ``max_tokens`` one-word chunks as fast as it can.

File discovery in a fresh ``DYN_FILE_KV`` directory per side, TCP request plane, loopback
only. Both stacks run at once; the load generator (``tritonclient.grpc.aio``, in this
script's interpreter) measures them in alternating rounds, so a noisy neighbour hits both.

Phases per round and side:

* unary: ``CONCURRENCY`` (64) tasks, each sending ``ModelInfer`` on ``echo`` with a 1x1024
  FP32 tensor (raw contents) back to back for ``--seconds``; requests/s and p50 latency;
* streaming: ``STREAMS`` (8) concurrent ``ModelStreamInfer`` requests of ``TOKENS`` (200)
  tokens each on ``stream``, repeated for ``--seconds``; streamed chunks (tokens)/s.

Usage: ``python benches/bench_kserve.py [--rounds 3] [--seconds 5] [--out
docs/benchmarks/kserve.md]`` (``REF_PYTHON`` selects the reference interpreter, see
``_common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, reference_python

HERE = Path(__file__).resolve()
CONCURRENCY = 64
STREAMS = 8
TOKENS = 200
ECHO_CONFIG = {
    "name": "echo",
    "inputs": [{"name": "INPUT0", "data_type": "Float32", "shape": [1, 1024]}],
    "outputs": [{"name": "INPUT0", "data_type": "Float32", "shape": [1, 1024]}],
}


# ---- the processes (run under either interpreter) -------------------------------------------


async def _frontend(port: int) -> None:
    from dynamo.llm import EngineType, EntrypointArgs, make_engine, run_input
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    args = EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1", http_port=port)
    await run_input(runtime, "grpc", await make_engine(runtime, args))


async def _worker(model_dir: str) -> None:
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    echo_ep = runtime.endpoint("bench.echo.generate")
    text_ep = runtime.endpoint("bench.stream.generate")

    async def echo(request, context=None):
        yield {"model": request["model"], "tensors": request["tensors"]}

    async def stream(request, context=None):
        n = int(request.get("max_tokens") or TOKENS)
        for i in range(n):
            yield {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}
                ],
            }

    agg = {"worker_type": WorkerType.Aggregated}
    await register_model(
        ModelInput.Tensor,
        ModelType.TensorBased,
        echo_ep,
        "echo",
        "echo",
        tensor_model_config=ECHO_CONFIG,
        **agg,
    )
    await register_model(
        ModelInput.Text, ModelType.Completions, text_ep, model_dir, "stream", **agg
    )
    await asyncio.gather(echo_ep.serve_endpoint(echo), text_ep.serve_endpoint(stream))


# ---- the load generator ---------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """A frontend and a worker of one implementation."""

    def __init__(self, label: str, python: str, model_dir: Path, log_dir: Path) -> None:
        self.label = label
        self.port = _free_port()
        kv = tempfile.mkdtemp(prefix=f"kserve-{label}-")
        env = dict(os.environ, DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=kv, DYN_LOG="warn")
        env.pop("PYTHONPATH", None)
        self.procs = []
        for name, args in (
            ("frontend", ["frontend", str(self.port)]),
            ("worker", ["worker", str(model_dir)]),
        ):
            log = open(log_dir / f"{label}-{name}.log", "wb")
            self.procs.append(
                subprocess.Popen(
                    [python, str(HERE), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                )
            )

    def close(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def _ready(url: str, timeout: float = 90) -> None:
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                if await client.is_model_ready("echo") and await client.is_model_ready("stream"):
                    return
            except Exception:
                pass
            await asyncio.sleep(0.2)
        raise SystemExit(f"{url}: models not ready")
    finally:
        await client.close()


async def _unary(url: str, seconds: float) -> dict:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    x = np.random.default_rng(0).random((1, 1024), dtype=np.float32)
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def one_stream() -> None:
        inp = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
        inp.set_data_from_numpy(x)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            await client.infer("echo", [inp])
            latencies.append(time.perf_counter() - t0)

    # Warm-up: connections, first requests.
    inp = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(x)
    out = await client.infer("echo", [inp])
    assert np.array_equal(out.as_numpy("INPUT0"), x)
    start = time.monotonic()
    await asyncio.gather(*(one_stream() for _ in range(CONCURRENCY)))
    elapsed = time.monotonic() - start
    await client.close()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
    }


def _finished(resp) -> bool:
    """Whether a text response carries a non-empty ``finish_reason`` (raw or typed: the
    reference answers typed contents, which ``as_numpy`` cannot read under numpy 2)."""
    for i, out in enumerate(resp.outputs):
        if out.name == "finish_reason":
            if resp.raw_output_contents:
                return len(resp.raw_output_contents[i]) > 4
            return bool(out.contents.bytes_contents and out.contents.bytes_contents[0])
    return False


async def _streaming(url: str, seconds: float) -> dict:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    stop = time.monotonic() + seconds
    tokens = 0

    def inputs():
        t = grpcclient.InferInput("text_input", [1], "BYTES")
        t.set_data_from_numpy(np.array([b"hello"], dtype=object))
        s = grpcclient.InferInput("stream", [1], "BOOL")
        s.set_data_from_numpy(np.array([True]))
        return [t, s]

    async def one() -> None:
        # One request at a time per stream: the next is sent when the previous one's last
        # chunk (non-empty finish_reason) arrived, so no backlog outlives the phase.
        nonlocal tokens
        turn = asyncio.Event()
        turn.set()

        async def requests():
            while time.monotonic() < stop:
                await turn.wait()
                turn.clear()
                if time.monotonic() >= stop:
                    return
                yield {"model_name": "stream", "inputs": inputs()}

        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            tokens += 1
            if _finished(result.get_response()):
                turn.set()
                if time.monotonic() >= stop:
                    break

    start = time.monotonic()
    await asyncio.gather(*(one() for _ in range(STREAMS)))
    elapsed = time.monotonic() - start
    await client.close()
    return {"tokens_per_s": tokens / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    ref = reference_python()
    if ref is None:
        raise SystemExit("reference interpreter not found: set REF_PYTHON (see _common.py)")
    sys.path.insert(0, str(HERE.parent.parent / "python"))
    from dynamo.llm.tiny_model import write_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-kserve-"))
    model_dir = write_tiny_model(tmp / "tiny")
    stacks = [
        Stack("ours", sys.executable, model_dir, tmp),
        Stack("reference", str(ref), model_dir, tmp),
    ]
    results: dict[str, list[dict]] = {s.label: [] for s in stacks}
    try:
        for s in stacks:
            asyncio.run(_ready(f"127.0.0.1:{s.port}"))
        for r in range(args.rounds):
            order = stacks if r % 2 == 0 else stacks[::-1]
            for s in order:
                url = f"127.0.0.1:{s.port}"
                limit = args.seconds + 60
                res = asyncio.run(asyncio.wait_for(_unary(url, args.seconds), limit))
                res.update(asyncio.run(asyncio.wait_for(_streaming(url, args.seconds), limit)))
                results[s.label].append(res)
                print(s.label, r, {k: round(v, 2) for k, v in res.items()}, flush=True)
    finally:
        for s in stacks:
            s.close()
    med = {
        label: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        for label, runs in results.items()
    }
    ours, theirs = med["ours"], med["reference"]
    lines = [
        "| metric | ours | reference | ours / reference |",
        "|---|---:|---:|---:|",
        f"| unary ModelInfer, 1x1024 FP32 echo, {CONCURRENCY} concurrent: req/s | {ours['rps']:.0f} | {theirs['rps']:.0f} | {ours['rps'] / theirs['rps']:.2f} |",
        f"| unary p50 latency (ms) | {ours['p50_ms']:.1f} | {theirs['p50_ms']:.1f} | {ours['p50_ms'] / theirs['p50_ms']:.2f} |",
        f"| ModelStreamInfer, {STREAMS} streams x {TOKENS} tokens: tokens/s | {ours['tokens_per_s']:.0f} | {theirs['tokens_per_s']:.0f} | {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f} |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        cmd = f"python benches/bench_kserve.py --rounds {args.rounds} --seconds {args.seconds}"
        args.out.write_text(
            "# KServe gRPC ingress benchmark\n\n"
            f"Command: `{cmd}` (reference: the venv of `benches/setup_reference.sh`, "
            "ai-dynamo-runtime 1.6.1). Machine: "
            f"{machine()}, shared with other jobs while measured; medians of "
            f"{args.rounds} alternating rounds of {args.seconds:g} s per phase.\n\n"
            f"{table}\n\n"
            "Setup: see the docstring of `benches/bench_kserve.py` (one frontend running "
            '`run_input(runtime, "grpc", engine)` and one Python worker per side, file '
            "discovery, TCP request plane, the load generator `tritonclient.grpc.aio` in the "
            "same run for both).\n"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "frontend":
        asyncio.run(_frontend(int(sys.argv[2])))
    elif len(sys.argv) > 2 and sys.argv[1] == "worker":
        asyncio.run(_worker(sys.argv[2]))
    else:
        main()
