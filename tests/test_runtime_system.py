"""The system status server (``DYN_SYSTEM_PORT``): ``/health`` and ``/live``, ``/metrics``
(checked with prometheus_client's parser), ``/engine/{route}`` callbacks, health canaries."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_util import collect, local_runtime, unique_ns, wait_until


def _http(port: int, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def http(port: int, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    # In a thread: engine-route callbacks run on this loop, which must stay free.
    return await asyncio.to_thread(_http, port, path, body)


def samples(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def handler(request):
    if request.get("fail"):
        raise ValueError("asked to fail")
    for i in range(request.get("n", 2)):
        yield {"i": i}


async def test_health_flips_with_set_health_status(system_port) -> None:
    async with local_runtime("mem") as rt:
        code, body = await http(system_port, "/health")
        # Nothing served yet: not ready.
        assert code == 503 and json.loads(body)["status"] == "notready"
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.w.generate")
        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        code, body = await http(system_port, "/health")
        doc = json.loads(body)
        assert code == 200, doc
        assert doc["status"] == "ready"
        assert doc["endpoints"] == {f"{ns}.w.generate": "ready"}
        assert set(doc["uptime"]) == {"secs", "nanos"}
        rt.set_health_status(False)
        assert (await http(system_port, "/health"))[0] == 503
        assert (await http(system_port, "/live"))[0] == 503
        rt.set_health_status(True)
        assert (await http(system_port, "/health"))[0] == 200
        assert (await http(system_port, "/nope")) == (404, b"Route not found")


async def test_metrics_count_requests_exactly(system_port) -> None:
    async with local_runtime("mem") as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.w.generate")
        rt.serve(ep, handler, metrics_labels=[("model", "m-1")])
        ep.metrics.register_prometheus_expfmt_callback(
            lambda: "# TYPE my_custom_total counter\nmy_custom_total 5\n"
        )
        client = await ep.client()
        await client.wait_for_instances()
        for _ in range(7):
            assert len(await collect(await client.round_robin({"n": 3}, annotated=False))) == 3
        with pytest.raises(ValueError, match="asked to fail"):
            await collect(await client.round_robin({"fail": True}, annotated=False))
        code, body = await http(system_port, "/metrics")
        assert code == 200
        text = body.decode()
        labels = (
            ("dynamo_component", "w"),
            ("dynamo_endpoint", "generate"),
            ("dynamo_namespace", ns),
            ("model", "m-1"),
        )
        assert samples(text, "dynamo_component_requests_total") == {labels: 8.0}
        assert samples(text, "dynamo_component_errors_total") == {
            tuple(sorted((*labels, ("error_type", "generate")))): 1.0
        }
        assert samples(text, "dynamo_component_inflight_requests") == {labels: 0.0}
        assert samples(text, "dynamo_component_request_duration_seconds_count") == {labels: 8.0}
        assert samples(text, "dynamo_component_response_bytes_total")[labels] > 0
        assert samples(text, "my_custom_total") == {(): 5.0}
        assert samples(text, "dynamo_component_uptime_seconds")[()] > 0


async def test_engine_routes_return_the_callbacks_json(system_port) -> None:
    async with local_runtime("mem") as rt:

        async def echo(body):
            await asyncio.sleep(0)
            return {"got": body, "ok": True}

        async def broken(body):
            raise RuntimeError("profiler not available")

        rt.register_engine_route("control/start_profile", echo)
        rt.register_engine_route("broken", broken)
        code, body = await http(system_port, "/engine/control/start_profile", b'{"steps": 3}')
        assert (code, json.loads(body)) == (200, {"got": {"steps": 3}, "ok": True})
        code, body = await http(system_port, "/engine/control/start_profile")
        assert (code, json.loads(body)) == (200, {"got": {}, "ok": True})
        code, body = await http(system_port, "/engine/broken", b"{}")
        assert code == 500 and "profiler not available" in json.loads(body)["error"]
        assert (await http(system_port, "/engine/missing"))[0] == 404
        assert (await http(system_port, "/engine/control/start_profile", b"{not json"))[0] == 400


async def test_idle_endpoints_get_health_canaries(system_port, monkeypatch) -> None:
    monkeypatch.setenv("DYN_HEALTH_CHECK_ENABLED", "true")
    monkeypatch.setenv("DYN_CANARY_WAIT_TIME", "0.2")
    healthy = True
    canaries = []

    async def worker(request):
        if request.get("canary"):
            canaries.append(request)
            if not healthy:
                raise RuntimeError("engine wedged")
        yield {"ok": True}

    async with local_runtime("mem") as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.w.generate")
        rt.serve(ep, worker, health_check_payload={"canary": True})
        await wait_until(lambda: len(canaries) >= 1)
        assert (await http(system_port, "/health"))[0] == 200
        healthy = False
        await wait_until(lambda: _http(system_port, "/health")[0] == 503)
        healthy = True
        await wait_until(lambda: _http(system_port, "/health")[0] == 200)
        assert all(c == {"canary": True} for c in canaries)
