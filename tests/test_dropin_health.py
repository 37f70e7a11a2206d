"""Drop-in behaviour of the system status server's ``/health`` with health canaries.

Observed with the reference wheel ``ai-dynamo-runtime==1.6.1`` (``DYN_SYSTEM_PORT`` set,
``DYN_HEALTH_CHECK_ENABLED=true``, ``DYN_CANARY_WAIT_TIME=1``,
``DYN_HEALTH_CHECK_REQUEST_TIMEOUT=1``, one endpoint served with
``health_check_payload={"canary": True}``):

* before serving: 503 ``{"status":"notready","uptime":{...},"endpoints":{}}``;
* right after ``serve_endpoint``: 503 with the endpoint ``"notready"`` (0.5 s);
* the first canary reaches the handler after the canary wait (1 s); once it yields, 200
  ``"ready"`` and canaries keep coming every wait period;
* a handler that never answers: 503 for as long as we watched (6 s), the canary being
  re-sent (and cancelled) after every timeout.

The reference keys ``endpoints`` by the bare endpoint name (``"ep"``); ours keys it by
``ns.component.endpoint`` (see docs/compatibility.md).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from runtime_util import local_runtime, unique_ns, wait_until
from services import free_port

CANARY_WAIT = 0.3


def _health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def health(port: int) -> tuple[int, dict]:
    return await asyncio.to_thread(_health, port)


@pytest.fixture
def system_port(monkeypatch) -> int:
    port = free_port()
    monkeypatch.setenv("DYN_SYSTEM_PORT", str(port))
    monkeypatch.setenv("DYN_SYSTEM_HOST", "127.0.0.1")
    monkeypatch.setenv("DYN_HEALTH_CHECK_ENABLED", "true")
    monkeypatch.setenv("DYN_CANARY_WAIT_TIME", str(CANARY_WAIT))
    monkeypatch.setenv("DYN_HEALTH_CHECK_REQUEST_TIMEOUT", "0.3")
    return port


async def test_health_is_503_until_a_canary_succeeds(system_port) -> None:
    gate = asyncio.Event()
    canaries = []

    async def worker(request):
        canaries.append(request)
        await gate.wait()
        yield {"ok": True}

    async with local_runtime("mem") as rt:
        ns = unique_ns()
        name = f"{ns}.w.generate"
        assert (await health(system_port))[0] == 503
        rt.serve(rt.endpoint(name), worker, health_check_payload={"canary": True})
        await wait_until(lambda: _health(system_port)[1]["endpoints"] != {})
        # Served but not yet proven alive: not ready, also across canary rounds whose
        # answer is held back (they time out).
        code, doc = await health(system_port)
        assert (code, doc["status"], doc["endpoints"]) == (503, "notready", {name: "notready"})
        await wait_until(lambda: len(canaries) >= 2)
        assert (await health(system_port))[0] == 503
        gate.set()
        await wait_until(lambda: _health(system_port)[0] == 200)
        code, doc = await health(system_port)
        assert (doc["status"], doc["endpoints"]) == ("ready", {name: "ready"})
        assert all(c == {"canary": True} for c in canaries)


async def test_a_handler_that_never_answers_stays_503(system_port) -> None:
    canaries = []

    async def wedged(request):
        canaries.append(request)
        await asyncio.sleep(3600)
        yield {"never": True}

    async with local_runtime("mem") as rt:
        ns = unique_ns()
        # Not graceful: the wedged canaries must not hold the runtime's shutdown (whether
        # a kill interrupts a handler blocked in an await is the handler bridge's matter).
        rt.serve(
            rt.endpoint(f"{ns}.w.generate"),
            wedged,
            graceful_shutdown=False,
            health_check_payload={"canary": True},
        )
        await wait_until(lambda: len(canaries) >= 3)
        for _ in range(5):
            code, doc = await health(system_port)
            assert (code, doc["status"]) == (503, "notready"), doc
            await asyncio.sleep(0.1)


async def test_without_a_payload_an_endpoint_is_ready_while_it_serves(system_port) -> None:
    """No ``health_check_payload``: nothing to probe, ready while serving (as before)."""

    async def worker(request):
        yield {"ok": True}

    async with local_runtime("mem") as rt:
        ep = rt.endpoint(f"{unique_ns()}.w.generate")
        rt.serve(ep, worker)
        await (await ep.client()).wait_for_instances()
        assert (await health(system_port))[0] == 200
