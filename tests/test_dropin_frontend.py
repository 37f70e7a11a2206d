"""Drop-in behaviour of the frontend's ``/health`` body and of ``HttpService.enable_endpoint``.

Observed with the reference wheel ``ai-dynamo-runtime==1.6.1`` (file discovery, tcp request
plane; ``make_engine(EngineType.Dynamic)`` + ``run_input("http")`` in a process that also
serves ``ns.comp.ep`` and ``ns2.other.gen`` with no model behind them):

* ``GET /health`` → 200 ``{"status": "healthy", "endpoints": ["dyn://ns.comp.ep",
  "dyn://ns2.other.gen"], "instances": [{"component": "comp", "endpoint": "ep",
  "namespace": "ns", "instance_id": <id>, "transport": {"tcp": "<host>:<port>/<hex>/ns/comp/ep"},
  "device_type": "cuda", "request_plane_codec": "msgpack"}, ...]}`` -- every instance in
  discovery, model or not, any namespace;
* ``GET /live`` → 200 ``{"status": "live", "message": "Service is live"}``;
* ``HttpService().enable_endpoint("batch", True|False)`` (any case) raises ``Exception``
  (the builtin class) ``batch endpoint availability is fixed when the HTTP service is
  built``; other known types return ``None``; an unknown type raises ``Exception``
  ``Invalid endpoint type: 'x'. Valid types are: chat, completion, ...``. Ours raises
  ``ValueError`` (a subclass of ``Exception``, so ``except Exception`` code still works)
  carrying the same text.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from runtime_util import unique_ns, wait_until
from services import free_port

from dynamo._core import DistributedRuntime, HttpService


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_frontend_health_lists_endpoints_and_instances() -> None:
    async def handler(request):
        yield {"ok": True}

    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    ns = unique_ns()
    tasks = []
    svc = None
    try:
        for path in (f"{ns}.comp.ep", f"{ns}.other.gen"):
            ep = rt.endpoint(path)
            tasks.append(asyncio.ensure_future(ep.serve_endpoint(handler)))
            await (await ep.client()).wait_for_instances()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        svc = HttpService(port=port)
        tasks.append(asyncio.ensure_future(svc.run(rt)))
        await wait_until(lambda: _reachable(f"{url}/live"), timeout=20)
        code, doc = await asyncio.to_thread(_get, f"{url}/health")
        assert (code, doc["status"]) == (200, "healthy"), doc
        # The mem store is shared by the whole test process: look at our namespace only.
        ours = [e for e in doc["endpoints"] if e.startswith(f"dyn://{ns}.")]
        assert ours == [f"dyn://{ns}.comp.ep", f"dyn://{ns}.other.gen"]
        instances = [i for i in doc["instances"] if i["namespace"] == ns]
        assert [(i["component"], i["endpoint"]) for i in instances] == [
            ("comp", "ep"),
            ("other", "gen"),
        ]
        for i in instances:
            assert i["instance_id"] == rt.endpoint(f"{ns}.comp.ep").connection_id()
            [(kind, address)] = i["transport"].items()
            assert kind == "tcp"
            assert address.endswith(f"{ns}/{i['component']}/{i['endpoint']}")
        # Our per-model list stays beside the reference's fields.
        assert isinstance(doc["models"], list)
        assert await asyncio.to_thread(_get, f"{url}/live") == (
            200,
            {"status": "live", "message": "Service is live"},
        )
    finally:
        if svc is not None:
            svc.shutdown()
        rt.shutdown()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("name", ["batch", "Batch", "BATCH"])
@pytest.mark.parametrize("enabled", [True, False])
def test_enable_endpoint_refuses_batch(name: str, enabled: bool) -> None:
    svc = HttpService(port=free_port())
    with pytest.raises(
        ValueError, match="batch endpoint availability is fixed when the HTTP service is built"
    ):
        svc.enable_endpoint(name, enabled)
    # The other families still toggle.
    assert svc.enable_endpoint("chat", enabled) is None
