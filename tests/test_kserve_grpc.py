"""The KServe v2 gRPC ingress, driven by Triton's own client (``tritonclient[grpc]``).

In-process models (``KserveGrpcService.add_*``) and Python workers registered through
discovery (file and etcd) behind ``python -m dynamo.frontend --kserve-grpc-server`` (with
its HTTP API beside): health and metadata RPCs, text and tensor ``ModelInfer`` (raw and
typed contents, FP32 and BYTES), ``stream`` and sampling fields as tensors or request
parameters, ``ModelStreamInfer`` chunk by chunk (text) and item by item (tensor),
validation errors naming the input, and cancelled streams and abandoned unary calls that
stop the worker's generation.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving_util import WORKERS, Procs, free_port, http
from tritonclient.utils import InferenceServerException

from dynamo.llm import KserveGrpcService, ModelRuntimeConfig, PythonAsyncEngine
from dynamo.llm.tiny_model import write_tiny_model
from dynamo.runtime import DistributedRuntime

TENSOR_CONFIG = {
    "name": "tmodel",
    "inputs": [
        {"name": "INPUT0", "data_type": "Float32", "shape": [-1, 4]},
        {"name": "S", "data_type": "Bytes", "shape": [-1]},
    ],
    "outputs": [
        {"name": "INPUT0", "data_type": "Float32", "shape": [-1, 4]},
        {"name": "S", "data_type": "Bytes", "shape": [-1]},
    ],
}


def _until(what: str, cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except InferenceServerException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def _text_input(text: bytes) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text], dtype=object))
    return inp


def _bool_input(name: str, value: bool) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, [1], "BOOL")
    inp.set_data_from_numpy(np.array([value]))
    return inp


def _int_input(name: str, value: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return inp


def _code(exc: InferenceServerException) -> str:
    return str(exc.status())


def _stream(client, requests, wait: float = 10.0, count: int | None = None):
    """Send ``(model, inputs, id)`` on one stream; ``(result, error)`` pairs until
    ``count`` arrived (or ``wait`` seconds)."""
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    for model, inputs, rid in requests:
        client.async_stream_infer(model, inputs, request_id=rid)
    out = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (count is None or len(out) < count):
        try:
            out.append(q.get(timeout=0.1))
        except queue.Empty:
            pass
    client.stop_stream()
    return out


def _stream_params(client, model, inputs, parameters, count, settle: float = 0.5, rid="p"):
    """One request with request ``parameters`` on a stream: the ``(result, error)`` pairs
    that arrived once ``count`` did (within 20 s) and ``settle`` seconds more passed, so
    that a response too many is seen."""
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer(model, inputs, request_id=rid, parameters=parameters)
    out: list = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            out.append(q.get(timeout=0.1))
        except queue.Empty:
            pass
        if len(out) >= count:
            deadline = min(deadline, time.monotonic() + settle)
    client.stop_stream()
    return out


# ---- in-process models -------------------------------------------------------------------

STEPS: list = []


async def _completions(request, context=None):
    n = int(request.get("max_tokens") or 3)
    words = [f"w{i} " for i in range(n)]
    try:
        for i, w in enumerate(words):
            await asyncio.sleep(0.01)
            STEPS.append(i)
            yield {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": request["model"],
                "choices": [
                    {"index": 0, "text": w, "finish_reason": "stop" if i == n - 1 else None}
                ],
            }
    finally:
        STEPS.append("closed")


SEEN: list = []


async def _tensor(request, context=None):
    SEEN.append(request)
    if request["tensors"][0]["metadata"]["name"] == "RAISE":
        raise RuntimeError("engine failure")
    yield {"tensors": request["tensors"], "parameters": request.get("parameters", {})}


async def _serve_static(client_body) -> None:
    """Run ``client_body(client, service)`` in a thread against an in-process service."""
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "mem", "tcp")
    port = free_port()
    svc = KserveGrpcService(port=port, host="127.0.0.1")
    svc.add_completions_model("cmodel", "x", PythonAsyncEngine(_completions, loop))
    svc.add_chat_completions_model("chmodel", "x", PythonAsyncEngine(_completions, loop))
    rc = ModelRuntimeConfig()
    rc.set_engine_specific("backend", '"onnx"')  # JSON text
    rc.set_engine_specific("batch", {"max": 8})
    svc.add_tensor_model(
        "tmodel",
        "x",
        PythonAsyncEngine(_tensor, loop),
        runtime_config=rc,
        tensor_model_config=TENSOR_CONFIG,
    )
    svc.add_tensor_model("tnocfg", "x", PythonAsyncEngine(_tensor, loop))
    task = asyncio.ensure_future(svc.run(runtime))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        await asyncio.to_thread(_until, "server live", client.is_server_live)
        await asyncio.wait_for(asyncio.to_thread(client_body, client, svc), 60)
        client.close()
    finally:
        svc.shutdown()
        await asyncio.wait_for(task, 10)
        runtime.shutdown()


async def test_added_models_are_listed_and_removed() -> None:
    loop = asyncio.get_running_loop()
    svc = KserveGrpcService(port=0)
    engine = PythonAsyncEngine(_tensor, loop)
    svc.add_completions_model("a", "x", engine)
    svc.add_chat_completions_model("b", "x", engine)
    svc.add_tensor_model("c", "x", engine, tensor_model_config=TENSOR_CONFIG)
    assert (
        svc.list_completions_models(),
        svc.list_chat_completions_models(),
        svc.list_tensor_models(),
    ) == (["a"], ["b"], ["c"])
    svc.remove_tensor_model("c")
    assert svc.list_tensor_models() == []
    for remove in (
        svc.remove_tensor_model,
        svc.remove_completions_model,
        svc.remove_chat_completions_model,
    ):
        with pytest.raises(ValueError, match="Model not found: zz"):
            remove("zz")
    bad = {"name": "c", "inputs": [{"name": "x", "data_type": "TYPE_FP32", "shape": [1]}]}
    with pytest.raises(ValueError, match="unknown variant `TYPE_FP32`"):
        svc.add_tensor_model("c", "x", engine, tensor_model_config=bad)


async def test_health_metadata_and_config_rpcs() -> None:
    def body(client, svc) -> None:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata(as_json=True)["name"] == "dynamo"
        for m in ("cmodel", "chmodel", "tmodel", "tnocfg"):
            assert client.is_model_ready(m), m
        assert not client.is_model_ready("nope")
        meta = client.get_model_metadata("tmodel", as_json=True)
        assert meta["platform"] == "dynamo" and meta["versions"] == ["1"]
        assert meta["inputs"] == [
            {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]},
            {"name": "S", "datatype": "BYTES", "shape": ["-1"]},
        ]
        config = client.get_model_config("tmodel", as_json=True)["config"]
        assert config["input"][0] == {
            "name": "INPUT0",
            "data_type": "TYPE_FP32",
            "dims": ["-1", "4"],
        }
        assert config["output"][1]["data_type"] == "TYPE_STRING"
        # add_tensor_model's runtime_config: its engine-specific values are the parameters.
        assert config["parameters"] == {
            "backend": {"string_value": "onnx"},
            "batch": {"string_value": '{"max":8}'},
        }
        assert "parameters" not in client.get_model_config("cmodel", as_json=True)["config"]
        text = client.get_model_metadata("cmodel", as_json=True)
        assert [i["name"] for i in text["inputs"]] == ["text_input", "stream"]
        for m in ("nope", "tnocfg"):
            with pytest.raises(InferenceServerException) as e:
                client.get_model_metadata(m)
            assert _code(e.value) == "StatusCode.NOT_FOUND", m

    await _serve_static(body)


async def test_text_and_tensor_infer() -> None:
    SEEN.clear()

    def body(client, svc) -> None:
        r = client.infer("cmodel", [_text_input(b"Hello there")])
        assert r.as_numpy("text_output").tolist() == [b"w0 w1 w2 "]
        assert r.as_numpy("finish_reason").tolist() == [b"stop"]
        r = client.infer("cmodel", [_text_input(b"Hi"), _int_input("max_tokens", 2)])
        assert r.as_numpy("text_output").tolist() == [b"w0 w1 "]
        # Sampling fields as request parameters; a tensor wins over a parameter.
        r = client.infer("cmodel", [_text_input(b"Hi")], parameters={"max_tokens": 4})
        assert r.as_numpy("text_output").tolist() == [b"w0 w1 w2 w3 "]
        r = client.infer(
            "cmodel",
            [_text_input(b"Hi"), _int_input("max_tokens", 1)],
            parameters={"max_tokens": 4},
        )
        assert r.as_numpy("text_output").tolist() == [b"w0 "]

        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        s = np.array([b"ab", b"c"], dtype=object)
        i0 = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
        i0.set_data_from_numpy(x)
        i1 = grpcclient.InferInput("S", [2], "BYTES")
        i1.set_data_from_numpy(s)
        r = client.infer("tmodel", [i0, i1], request_id="rid7", parameters={"k": 3, "f": "v"})
        np.testing.assert_array_equal(r.as_numpy("INPUT0"), x)
        assert r.as_numpy("S").tolist() == [b"ab", b"c"]
        resp = r.get_response()
        assert resp.id == "rid7" and resp.parameters["k"].int64_param == 3

        # Typed contents in, typed contents out.
        t0 = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        t0._input.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
        t1 = grpcclient.InferInput("S", [1], "BYTES")
        t1._input.contents.bytes_contents.extend([b"xyz"])
        resp = client.infer("tmodel", [t0, t1]).get_response()
        assert list(resp.outputs[0].contents.fp32_contents) == [1.0, 2.0, 3.0, 4.0]
        assert list(resp.outputs[1].contents.bytes_contents) == [b"xyz"]
        assert not resp.raw_output_contents

        # A model without a config is served unchecked.
        r = client.infer("tnocfg", [i1])
        assert r.as_numpy("S").tolist() == [b"ab", b"c"]

    await _serve_static(body)
    first = SEEN[0]
    assert first["id"] == "rid7" and first["model"] == "tmodel"
    assert first["parameters"] == {"f": {"string": "v"}, "k": {"int64": 3}}
    assert first["tensors"][0] == {
        "metadata": {"name": "INPUT0", "data_type": "Float32", "shape": [2, 4]},
        "data": {"data_type": "Float32", "values": [float(v) for v in range(8)]},
    }
    assert first["tensors"][1]["data"] == {"data_type": "Bytes", "values": [[97, 98], [99]]}


async def test_errors_are_grpc_statuses_naming_the_input() -> None:
    def code_of(fn) -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as e:
            fn()
        return _code(e.value), e.value.message()

    def body(client, svc) -> None:
        x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        s = grpcclient.InferInput("S", [1], "BYTES")
        s.set_data_from_numpy(np.array([b"a"], dtype=object))
        code, msg = code_of(lambda: client.infer("nope", [x]))
        assert code == "StatusCode.NOT_FOUND" and "nope" in msg
        code, msg = code_of(lambda: client.infer("chmodel", [_text_input(b"x")]))
        assert code == "StatusCode.NOT_FOUND"
        # Wrong datatype, wrong fixed dimension, unknown input, missing input.
        bad = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 4), dtype=np.int32))
        code, msg = code_of(lambda: client.infer("tmodel", [bad, s]))
        assert code == "StatusCode.INVALID_ARGUMENT" and "'INPUT0'" in msg and "FP32" in msg
        wide = grpcclient.InferInput("INPUT0", [1, 5], "FP32")
        wide.set_data_from_numpy(np.zeros((1, 5), dtype=np.float32))
        code, msg = code_of(lambda: client.infer("tmodel", [wide, s]))
        assert code == "StatusCode.INVALID_ARGUMENT" and "'INPUT0'" in msg
        odd = grpcclient.InferInput("ODD", [1], "FP32")
        odd.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        code, msg = code_of(lambda: client.infer("tmodel", [x, s, odd]))
        assert code == "StatusCode.INVALID_ARGUMENT" and "'ODD'" in msg
        code, msg = code_of(lambda: client.infer("tmodel", [x]))
        assert code == "StatusCode.INVALID_ARGUMENT" and "'S'" in msg
        # Values that do not fill the shape.
        short = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
        short._input.contents.fp32_contents.extend([1.0, 2.0])
        typed_s = grpcclient.InferInput("S", [1], "BYTES")
        typed_s._input.contents.bytes_contents.extend([b"a"])
        code, msg = code_of(lambda: client.infer("tmodel", [short, typed_s]))
        assert code == "StatusCode.INVALID_ARGUMENT" and "'INPUT0'" in msg
        # Text models: the reference's messages.
        code, msg = code_of(lambda: client.infer("cmodel", []))
        assert msg == "Missing required input: 'text_input'"
        wrong = grpcclient.InferInput("wrong", [1], "BYTES")
        wrong.set_data_from_numpy(np.array([b"x"], dtype=object))
        code, msg = code_of(lambda: client.infer("cmodel", [wrong]))
        assert code == "StatusCode.INVALID_ARGUMENT" and msg.startswith("Invalid input name: wrong")
        code, msg = code_of(
            lambda: client.infer("cmodel", [_text_input(b"x"), _bool_input("stream", True)])
        )
        assert msg == "Streaming is not supported for this endpoint"
        # The same as a request parameter (either name).
        for name in ("stream", "streaming"):
            code, msg = code_of(
                lambda name=name: client.infer(
                    "cmodel", [_text_input(b"x")], parameters={name: True}
                )
            )
            assert code == "StatusCode.INVALID_ARGUMENT", name
            assert msg == "Streaming is not supported for this endpoint", name
        code, msg = code_of(
            lambda: client.infer("cmodel", [_text_input(b"x")], parameters={"stream": "yes"})
        )
        assert code == "StatusCode.INVALID_ARGUMENT" and "'stream'" in msg
        # An engine failure.
        raise_ = grpcclient.InferInput("RAISE", [1], "FP32")
        raise_.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        code, msg = code_of(lambda: client.infer("tnocfg", [raise_]))
        assert code == "StatusCode.INTERNAL" and "engine failure" in msg

    await _serve_static(body)


async def test_stream_infer_answers_chunk_by_chunk_and_cancel_stops_the_engine() -> None:
    def body(client, svc) -> None:
        items = _stream(
            client,
            [
                ("cmodel", [_text_input(b"Hi"), _bool_input("stream", True)], "r1"),
                ("nope", [_text_input(b"Hi")], "r2"),
            ],
            count=4,
        )
        ok = [r.get_response() for r, e in items if e is None]
        errors = [str(e) for r, e in items if e is not None]
        assert [r.id for r in ok] == ["r1"] * 3
        texts = [r.as_numpy("text_output").tolist()[0] for r, e in items if e is None]
        assert texts == [b"w0 ", b"w1 ", b"w2 "]
        reasons = [r.as_numpy("finish_reason").tolist()[0] for r, e in items if e is None]
        assert reasons == [b"", b"", b"stop"]
        assert len(errors) == 1 and "nope" in errors[0]
        # Without `stream`, one response with the whole text.
        items = _stream(client, [("cmodel", [_text_input(b"Hi")], "r3")], count=1)
        assert items[0][0].as_numpy("text_output").tolist() == [b"w0 w1 w2 "]
        # `stream` as a request parameter streams too; a `stream` tensor set to false wins.
        items = _stream_params(client, "cmodel", [_text_input(b"Hi")], {"streaming": True}, 3)
        assert [r.as_numpy("text_output").tolist()[0] for r, e in items] == [
            b"w0 ",
            b"w1 ",
            b"w2 ",
        ]
        off = [_text_input(b"Hi"), _bool_input("stream", False)]
        items = _stream_params(client, "cmodel", off, {"stream": True}, 1)
        assert [r.as_numpy("text_output").tolist()[0] for r, e in items] == [b"w0 w1 w2 "]

        # A long generation, cancelled by the client, stops in the engine.
        STEPS.clear()
        q: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        inputs = [_text_input(b"Hi"), _bool_input("stream", True), _int_input("max_tokens", 2000)]
        client.async_stream_infer("cmodel", inputs, request_id="long")
        _until("the first chunks", lambda: q.qsize() >= 3)
        client.stop_stream(cancel_requests=True)
        _until("the engine's generator closed", lambda: "closed" in STEPS, timeout=5)
        produced = len(STEPS)
        time.sleep(0.3)
        assert len(STEPS) == produced and produced < 500, produced

    await _serve_static(body)


# ---- workers through discovery -------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "etcd"])
def test_discovered_workers_behind_the_frontend(backend, request, tmp_path, model_dir) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    if backend == "etcd":
        etcd = request.getfixturevalue("etcd_server")
        procs.env["DYN_DISCOVERY_BACKEND"] = "etcd"
        procs.env["ETCD_ENDPOINTS"] = etcd.endpoint
    trace = tmp_path / "trace.txt"
    tick_trace = tmp_path / "tick_trace.txt"
    tick_trace.write_text("")
    procs.env["TRACE"] = str(trace)
    procs.env["TICK_TRACE"] = str(tick_trace)
    grpc_port, http_port = free_port(), free_port()
    try:
        procs.frontend(
            http_port,
            "--namespace",
            "kserve",
            "--kserve-grpc-server",
            "--grpc-port",
            str(grpc_port),
        )
        procs.start("worker", [str(WORKERS / "kserve_worker.py"), str(model_dir)])
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        for m in ("echo", "strings", "noconfig", "ticker", "slowtext"):
            _until(f"{m} ready", lambda m=m: client.is_model_ready(m), timeout=40)

        # HTTP runs beside gRPC, over the same discovered models (its own watcher).
        def http_lists_slowtext() -> bool:
            try:
                status, body = http("GET", f"http://127.0.0.1:{http_port}/v1/models")
            except OSError:  # not listening yet
                return False
            assert status == 200, body
            return "slowtext" in [m["id"] for m in json.loads(body)["data"]]

        _until("HTTP lists the model", http_lists_slowtext)

        assert client.is_server_live() and client.is_server_ready()
        server = client.get_server_metadata(as_json=True)
        assert server["name"] == "dynamo" and "model_configuration" in server["extensions"]
        meta = client.get_model_metadata("echo", as_json=True)
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}]
        config = client.get_model_config("echo", as_json=True)["config"]
        assert config["input"] == [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["-1", "-1"]}
        ]
        assert config["output"][0]["data_type"] == "TYPE_FP32"
        # The worker's runtime config (engine-specific values) as the config's parameters.
        assert config["parameters"] == {"kind": {"string_value": "echo"}}
        assert "model_transaction_policy" not in config
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config("noconfig")
        assert _code(e.value) == "StatusCode.INVALID_ARGUMENT"
        assert "no model config is provided" in e.value.message()

        x = np.random.default_rng(0).random((1, 1024), dtype=np.float32)
        i0 = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
        i0.set_data_from_numpy(x)
        r = client.infer("echo", [i0], parameters={"p": True})
        np.testing.assert_array_equal(r.as_numpy("INPUT0"), x)
        assert r.get_response().parameters["p"].bool_param is True
        # Typed contents in, typed contents out (no raw output).
        typed = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        typed._input.contents.fp32_contents.extend([1.5, -2.0, 3.25, 0.0])
        resp = client.infer("echo", [typed]).get_response()
        assert list(resp.outputs[0].contents.fp32_contents) == [1.5, -2.0, 3.25, 0.0]
        assert list(resp.outputs[0].shape) == [1, 4] and resp.outputs[0].datatype == "FP32"
        assert not resp.raw_output_contents
        s = grpcclient.InferInput("TEXT", [2], "BYTES")
        s.set_data_from_numpy(np.array([b"ab", b"cd"], dtype=object))
        assert client.infer("strings", [s]).as_numpy("UPPER").tolist() == [b"AB", b"CD"]
        bad = grpcclient.InferInput("INPUT0", [1024], "FP32")
        bad.set_data_from_numpy(x[0])
        with pytest.raises(InferenceServerException) as e:
            client.infer("echo", [bad])
        assert _code(e.value) == "StatusCode.INVALID_ARGUMENT" and "'INPUT0'" in e.value.message()

        r = client.infer("slowtext", [_text_input(b"Hi"), _int_input("max_tokens", 3)])
        assert r.as_numpy("text_output").tolist() == [b"t0 t1 t2 "]
        # A sampling field as a request parameter reaches the worker.
        r = client.infer("slowtext", [_text_input(b"Hi")], parameters={"max_tokens": 2})
        assert r.as_numpy("text_output").tolist() == [b"t0 t1 "]
        # `stream` as a request parameter: one response per chunk.
        items = _stream_params(
            client, "slowtext", [_text_input(b"Hi")], {"stream": True, "max_tokens": 3}, 3
        )
        assert [(r.get_response().id, r.as_numpy("text_output").tolist()[0]) for r, _ in items] == [
            ("p", b"t0 "),
            ("p", b"t1 "),
            ("p", b"t2 "),
        ]
        items = _stream(
            client,
            [("slowtext", [_text_input(b"Hi"), _bool_input("stream", True)], "s1")],
            count=5,
        )
        assert [r.as_numpy("text_output").tolist()[0] for r, _ in items] == [
            b"t0 ",
            b"t1 ",
            b"t2 ",
            b"t3 ",
            b"t4 ",
        ]

        # Cancel a long stream: the worker's request stops well before its 2000 tokens.
        trace.write_text("")
        q: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        inputs = [_text_input(b"Hi"), _bool_input("stream", True), _int_input("max_tokens", 2000)]
        client.async_stream_infer("slowtext", inputs, request_id="long")
        _until("the first chunks", lambda: q.qsize() >= 3)
        client.stop_stream(cancel_requests=True)
        _until("the worker's request ended", lambda: "end " in trace.read_text(), timeout=10)
        ends = [
            int(line.split()[1])
            for line in trace.read_text().splitlines()
            if line.startswith("end")
        ]
        assert ends and ends[0] < 1000, ends

        _check_ticker(client, tick_trace)
        client.close()
    finally:
        procs.close()


def _tick_ends(trace: Path) -> list[tuple[int, str]]:
    return [
        (int(line.split()[1]), line.split()[2])
        for line in trace.read_text().splitlines()
        if line.startswith("end ")
    ]


def _check_ticker(client, trace: Path) -> None:
    """A tensor model answering many responses per request: ModelStreamInfer carries
    each with the request id; a cancelled stream and an abandoned unary call (its
    deadline passed) both end the worker's handler early."""
    x = grpcclient.InferInput("X", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))

    items = _stream_params(client, "ticker", [x], {}, 3, rid="tk")
    assert [e for _, e in items] == [None] * 3
    assert [r.get_response().id for r, _ in items] == ["tk"] * 3
    assert [r.as_numpy("STEP").tolist() for r, _ in items] == [[0], [1], [2]]
    _until("the ticker ended", lambda: _tick_ends(trace), timeout=10)
    assert [n for n, _ in _tick_ends(trace)] == [3]
    # On ModelInfer the first response is the answer (the rest are read and dropped).
    r = client.infer("ticker", [x], parameters={"count": 2})
    assert r.as_numpy("STEP").tolist() == [0]
    _until("the second ticker finished", lambda: len(_tick_ends(trace)) == 2, timeout=10)

    # A cancelled stream of a tensor model stops the worker's handler.
    trace.write_text("")
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("ticker", [x], request_id="long", parameters={"count": 100000})
    _until("the first responses", lambda: q.qsize() >= 3)
    client.stop_stream(cancel_requests=True)
    _until("the streamed ticker ended", lambda: _tick_ends(trace), timeout=15)
    ((yielded, how),) = _tick_ends(trace)
    assert how in ("stopped", "closed") and 3 <= yielded < 50000, (yielded, how)

    # A unary call abandoned at its deadline stops the worker's handler too.
    trace.write_text("")
    with pytest.raises(InferenceServerException) as e:
        client.infer("ticker", [x], parameters={"count": 100000}, client_timeout=4)
    assert _code(e.value) in ("StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED"), e.value
    _until("the abandoned ticker started", lambda: "start 100000" in trace.read_text(), 5)
    _until("the abandoned ticker ended", lambda: _tick_ends(trace), timeout=15)
    ((yielded, how),) = _tick_ends(trace)
    assert how in ("stopped", "closed") and yielded < 50000, (yielded, how)


@pytest.mark.slow
def test_overload_and_no_worker_are_grpc_statuses(tmp_path, model_dir) -> None:
    """Item 6 end to end: a registered model whose endpoint has no live instance answers
    ``UNAVAILABLE`` (HTTP's 503), and with every worker busy under KV-mode thresholds a
    request answers ``RESOURCE_EXHAUSTED`` (HTTP's 529); both recover without a restart."""
    procs = Procs(tmp_path / "kv", tmp_path)
    hold = tmp_path / "hold"
    serve = tmp_path / "serve"
    procs.env.update(
        {
            "MARKER": str(tmp_path / "marker"),
            "HOLD": str(hold),
            "SERVE_AFTER": str(serve),
            "ENDPOINT": "kbusy.slow.generate",
        }
    )
    grpc_port = free_port()
    try:
        # Busy as soon as one prompt waits for its prefill (first token).
        procs.frontend(
            free_port(), "--namespace", "kbusy", "--router-mode", "kv",
            "--active-prefill-tokens-threshold", "0",
            "--kserve-grpc-server", "--grpc-port", str(grpc_port),
        )  # fmt: skip
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        inputs = [_text_input(b"Hello there!"), _int_input("max_tokens", 3)]

        # The card is registered; the endpoint is not served yet.
        def listed() -> bool:
            try:
                client.infer("slow", inputs, client_timeout=10)
            except InferenceServerException as e:
                return _code(e) != "StatusCode.NOT_FOUND"
            return True

        _until("model listed", listed, timeout=40)
        with pytest.raises(InferenceServerException) as e:
            client.infer("slow", inputs, client_timeout=10)
        assert _code(e.value) == "StatusCode.UNAVAILABLE", e.value.message()

        serve.touch()
        q: queue.Queue = queue.Queue()

        def served() -> bool:
            try:
                client.infer("slow", inputs, client_timeout=10)
            except InferenceServerException as e:
                return _code(e) != "StatusCode.UNAVAILABLE"
            return True

        _until("endpoint served", served, timeout=40)
        # A request held at its prefill by the worker (HOLD) makes the only worker busy.
        hold.touch()
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        client.async_stream_infer("slow", [*inputs, _bool_input("stream", True)], request_id="held")
        busy = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

        # The stream's request must be routed (and booked) before the probe: a probe routed
        # first would itself be held. Every call has a deadline, so a lost race fails the
        # test instead of hanging it.
        time.sleep(1.5)
        with pytest.raises(InferenceServerException) as e:
            busy.infer("slow", inputs, client_timeout=10)
        assert _code(e.value) == "StatusCode.RESOURCE_EXHAUSTED", e.value.message()
        assert "busy" in e.value.message()
        hold.unlink()
        _until("the held stream finished", lambda: q.qsize() >= 3)
        client.stop_stream()
        r = busy.infer("slow", inputs, client_timeout=30)
        assert r.as_numpy("text_output").tolist()[0]
        busy.close()
        client.close()
    finally:
        procs.close()
