"""The standalone services as processes: ``python -m dynamo.select_service``,
``python -m dynamo.indexer`` and ``python -m dynamo.slot_tracker`` on loopback, driven by a
real HTTP client and real pyzmq PUB sockets; clap's parse errors; SIGTERM shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from selection_util import BS, Service, frame, pub, stored, wait_for

TOKENS = list(range(16))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_select_service_http_api(ctx: zmq.Context, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    svc = Service(
        "dynamo.select_service", "--access-log", str(log), "--selection-cache-max-entries", "8"
    )
    try:
        assert svc.call("GET", "/health") == (200, {"status": "ok"})
        status, body = svc.call("GET", "/ready")
        assert (status, body) == (503, {"ready": False, "schedulable_workers": 0, "workers": []})
        assert svc.call("GET", "/nope") == (404, {"error": "route not found"})
        assert svc.call("GET", "/select") == (405, {"error": "method not allowed"})
        status, body = svc.call("POST", "/workers", {})
        assert status == 422 and "worker_id" in body["error"]
        status, body = svc.call("POST", "/select", b"notjson")
        assert status == 400 and "Failed to parse the request body as JSON" in body["error"]
        status, body = svc.call("POST", "/select", {"model_name": "m", "token_ids": TOKENS})
        assert (status, body) == (
            503,
            {"error": "no schedulable workers for model=m routing_group=default"},
        )
        socks = [pub(ctx), pub(ctx)]
        for i, (_, ep) in enumerate(socks, start=1):
            status, rec = svc.call(
                "POST",
                "/workers",
                {
                    "worker_id": i,
                    "model_name": "m",
                    "block_size": BS,
                    "endpoint": f"http://w{i}",
                    "kv_events_endpoint": ep,
                },
            )
            assert (status, rec["lifecycle"]) == (201, "schedulable")
        assert svc.call("GET", "/ready")[0] == 200
        assert [w["worker_id"] for w in svc.call("GET", "/workers?model_name=m")[1]] == [1, 2]
        assert svc.call("GET", "/workers?model_name=zz")[1] == []
        # Worker 2 holds three blocks; a malformed frame in between is counted and skipped.
        sock2 = socks[1][0]
        seq = 0

        def steered() -> bool:
            nonlocal seq
            sock2.send_multipart([b"", seq.to_bytes(8, "big"), b"\xc1garbage"])
            sock2.send_multipart(frame(seq + 1, [stored([101, 102, 103], None, TOKENS[:12])]))
            seq += 2
            _, s = svc.call("POST", "/overlap_scores", {"model_name": "m", "token_ids": TOKENS})
            return [w["device_blocks"] for w in s["workers"]] == [0, 3]

        wait_for(steered)
        status, out = svc.call(
            "POST", "/select", {"model_name": "m", "token_ids": TOKENS, "selection_id": "s1"}
        )
        assert (status, out["selection_id"], out["worker_id"], out["overlap"]["gpu"]) == (
            200,
            "s1",
            2,
            12,
        )
        status, res = svc.call("POST", "/reservations", {"selection_id": "s1", "model_name": "m"})
        assert (status, res["worker_id"]) == (201, 2)
        assert (
            svc.call("POST", "/reservations", {"selection_id": "s1", "model_name": "m"})[0] == 409
        )
        assert svc.call("POST", "/reservations/s1/prefill_complete") == (200, {"status": "ok"})
        assert svc.call("POST", "/reservations/s1/output_block", {}) == (200, {"status": "ok"})
        status, body = svc.call("POST", "/reservations/s1/output_block", {"decay_fraction": 5})
        assert (status, body) == (400, {"error": "decay_fraction must be between 0.0 and 1.0"})
        loads = svc.call("GET", "/loads")[1]
        assert [w["active_requests"] for w in loads[0]["loads"]] == [0, 1]
        assert svc.call("DELETE", "/reservations/s1") == (200, {"status": "ok"})
        assert svc.call("DELETE", "/reservations/s1") == (
            404,
            {"error": "reservation s1 not found"},
        )
        status, sar = svc.call(
            "POST", "/select_and_reserve", {"model_name": "m", "token_ids": TOKENS}
        )
        assert status == 200 and len(sar["sequence_hashes"]) == 4
        status, pl = svc.call("POST", "/potential_loads", {"model_name": "m", "token_ids": TOKENS})
        assert status == 200 and len(pl) == 2
        dump = svc.call("GET", "/dump")[1]
        assert dump["m:default"]["block_size"] == BS and len(dump["m:default"]["events"]) >= 1
        status, metrics = svc.call("GET", "/metrics")
        assert status == 200
        lines = dict(
            line.rsplit(" ", 1)
            for line in metrics.splitlines()
            if line and not line.startswith("#")
        )
        assert int(lines["dynamo_select_service_malformed_frames_total"]) >= 1
        assert int(lines['dynamo_select_service_kv_events_total{outcome="applied"}']) >= 1
        assert lines['dynamo_select_service_listeners{status="active"}'] == "2"
        assert lines['dynamo_select_service_workers{lifecycle="schedulable"}'] == "2"
        assert int(lines["dynamo_select_service_selections_total"]) >= 2
        assert svc.call("DELETE", "/workers/1")[1]["lifecycle"] == "unschedulable"
        assert svc.call("DELETE", "/workers/1") == (404, {"error": "worker 1 not found"})
    finally:
        rc = svc.stop()
    assert rc == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"timestamp", "method", "path", "status", "duration_us", "trace_id"} <= set(entries[0])
    assert any(e["path"] == "/select" and e["status"] == 200 for e in entries)
    assert all(e["trace_id"] == "trace-1" and e["timestamp"].endswith("Z") for e in entries)


def test_indexer_service(ctx: zmq.Context) -> None:
    (s0, ep0), (s1, ep1) = pub(ctx), pub(ctx)
    svc = Service("dynamo.indexer", "--block-size", str(BS), "--workers", f"1={ep0},1:1={ep1}")
    try:
        workers = wait_for(
            lambda: (lambda w: w if w[0]["status"] == "active" else None)(
                svc.call("GET", "/workers")[1]
            )
        )
        assert workers[0]["endpoints"] == {"0": ep0, "1": ep1}
        assert workers[0]["listeners"]["1"] == {"endpoint": ep1, "status": "active"}
        seq = 0

        def indexed() -> object:
            nonlocal seq
            s0.send_multipart(frame(seq, [stored([1, 2, 3], None, TOKENS[:12])]))
            s1.send_multipart(frame(seq, [stored([7, 8], None, TOKENS[:8])], dp_rank=1))
            seq += 1
            _, q = svc.call("POST", "/query", {"token_ids": TOKENS, "model_name": "default"})
            return q if q["scores"].get("1") == {"0": 12, "1": 8} else None

        q = wait_for(indexed)
        assert q["instances"]["1"] == {
            "longest_matched": 12,
            "gpu": 12,
            "dp": {"0": 12, "1": 8},
            "cpu": 12,
            "disk": 12,
        }
        assert svc.call("POST", "/query", {"token_ids": TOKENS})[0] == 422
        status, _ = svc.call(
            "POST",
            "/register",
            {"instance_id": 2, "endpoint": ep0, "block_size": BS, "model_name": "x"},
        )
        assert status == 201
        status, body = svc.call(
            "POST",
            "/register",
            {"instance_id": 2, "endpoint": ep0, "block_size": BS, "model_name": "x"},
        )
        assert (status, body) == (409, {"error": "instance 2 dp_rank 0 already registered"})
        assert (
            svc.call("POST", "/query", {"token_ids": TOKENS, "model_name": "x"})[1]["scores"] == {}
        )
        assert svc.call("POST", "/unregister", {"instance_id": 2, "model_name": "x"}) == (
            200,
            {"status": "ok"},
        )
        assert svc.call("POST", "/unregister", {"instance_id": 2, "model_name": "x"}) == (
            404,
            {"error": "instance 2 not found"},
        )
        metrics = svc.call("GET", "/metrics")[1]
        assert 'dynamo_kvindexer_listeners{status="active"} 2' in metrics
    finally:
        assert svc.stop() == 0


def test_slot_tracker_service() -> None:
    svc = Service("dynamo.slot_tracker")
    try:
        status, body = svc.call(
            "POST", "/register", {"worker_id": 1, "model_name": "m", "block_size": BS}
        )
        assert status == 422 and "dp_start" in body["error"]
        reg = {"model_name": "m", "block_size": BS, "dp_start": 0, "dp_size": 1}
        for wid in (1, 2):
            assert svc.call("POST", "/register", {"worker_id": wid, **reg}) == (
                201,
                {"status": "ok"},
            )
        assert svc.call("GET", "/workers")[1][0] == {
            "worker_id": 1,
            "routing_group": "default",
            **reg,
        }
        add = {
            "model_name": "m",
            "request_id": "r1",
            "worker_id": 1,
            "dp_rank": 0,
            "sequence_hashes": [1, 2],
            "isl_tokens": 8,
        }
        assert svc.call("POST", "/add", add) == (200, {"status": "ok"})
        loads = {(w["worker_id"]): w for w in svc.call("GET", "/loads")[1]}
        assert (loads[1]["active_prefill_tokens"], loads[1]["active_decode_blocks"]) == (8, 2)
        assert (
            svc.call("POST", "/prefill_complete", {"model_name": "m", "request_id": "r1"})[0] == 200
        )
        assert svc.call("POST", "/prefill_complete", {"model_name": "m", "request_id": "zz"}) == (
            404,
            {"error": "Request zz not found"},
        )
        pl = svc.call(
            "POST",
            "/potential_loads",
            {"model_name": "m", "sequence_hashes": [1, 2, 3], "isl_tokens": 12},
        )[1]
        assert {w["worker_id"]: w["potential_decode_blocks"] for w in pl} == {1: 3, 2: 3}
        assert svc.call("POST", "/free", {"model_name": "m", "request_id": "r1"}) == (
            200,
            {"status": "ok"},
        )
        assert svc.call("POST", "/free", {"model_name": "m", "request_id": "r1"}) == (
            200,
            {"status": "ok"},
        )
        assert svc.call("POST", "/unregister", {"worker_id": 2, "model_name": "m"}) == (
            200,
            {"status": "ok"},
        )
        assert svc.call("POST", "/unregister", {"worker_id": 2, "model_name": "m"})[0] == 404
    finally:
        assert svc.stop() == 0


@pytest.mark.parametrize(
    ("module", "flag"),
    [
        ("dynamo.select_service", "--selection-cache-max-bytes"),
        ("dynamo.indexer", "--workers"),
        ("dynamo.slot_tracker", "--replica-sync-peers"),
    ],
)
def test_help_and_parse_errors(module: str, flag: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, timeout=30)
    assert out.returncode == 0
    assert f"Usage: python -m {module} [OPTIONS]" in out.stdout.decode()
    assert flag in out.stdout.decode()
    bad = subprocess.run(
        [sys.executable, "-m", module, "--port", "x"], capture_output=True, timeout=30
    )
    assert bad.returncode == 2
    assert "invalid value 'x' for '--port <PORT>'" in bad.stderr.decode()
    unknown = subprocess.run(
        [sys.executable, "-m", module, "--bogus"], capture_output=True, timeout=30
    )
    assert unknown.returncode == 2 and "--bogus" in unknown.stderr.decode()


def test_unsupported_flags_fail_clearly() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dynamo.select_service", "--session-affinity-ttl-secs", "5"],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "--session-affinity-ttl-secs is not supported yet" in out.stderr.decode()
