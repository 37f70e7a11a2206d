"""Model routes, the run-time busy-threshold API and extension routes (issue 13, items 1, 2, 6).

Reference observations: ai-dynamo-runtime 1.6.1 run in-process (``make_engine`` /
``run_input(rt, "http", ...)``, ``mem`` discovery, ``tcp`` request plane), a ``Mocker``
engine both as an in-process model and as a discovered worker (``run_input(rt,
"dyn://ns.mocker.generate", ...)`` next to an ``EngineType.Dynamic`` frontend), asked the
same requests over HTTP. What each test checks from those observations is in its docstring.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances

from dynamo.llm import (
    EngineType,
    EntrypointArgs,
    FrontendExtensionContext,
    FrontendResponse,
    FrontendRoute,
    make_engine,
    run_input,
)
from dynamo.llm.tiny_model import write_tiny_model
from dynamo.runtime import DistributedRuntime

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hello there!"}]
SLASHED = "Org/Tiny-0.6B"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _get(base: str, path: str) -> tuple[int, dict]:
    status, body = http("GET", f"{base}{path}")
    return status, json.loads(body)


def _post(base: str, path: str, body: dict | bytes) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, out = http("POST", f"{base}{path}", raw)
    return status, json.loads(out)


def _until(what: str, cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def _listed(base: str, model: str) -> bool:
    try:
        status, body = _get(base, "/v1/models")
    except OSError:
        return False
    return status == 200 and any(m["id"] == model for m in body["data"])


def test_model_routes_and_readiness(tmp_path, model_dir) -> None:
    """``GET /v1/models/{id}`` and ``/v1/models/{id}/ready`` with an id containing ``/``.

    Reference 1.6.1: ``/v1/models/tiny`` → 200 with the list entry (``id``, ``object:
    "model"``, ``created``, ``owned_by: "nvidia"``); ``/v1/models/tiny/ready`` → 200
    ``{"model": "tiny", "ready": true, "namespaces": {"ns": {"ready": true, "worker_types":
    {"aggregated": {"workers": 1, "needs": []}}, "present": ["aggregated"],
    "missing_worker_types": []}}}``; an unknown model (also ``/v1/models/a/b``) → 404
    (its body ``{"message": "Model not found", "type": "Not Found", "code": 404}``; ours is
    the OpenAI envelope). Not ready (a registered card whose endpoint is not served yet) →
    503 with ``ready: false`` and a ``reason``.
    """
    procs = Procs(tmp_path / "kv", tmp_path)
    serve = tmp_path / "serve"
    procs.env.update(
        {
            "MARKER": str(tmp_path / "marker"),
            "SERVE_AFTER": str(serve),
            "ENDPOINT": "ready.slow.generate",
            "MODEL": SLASHED,
        }
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "ready")
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        _until("model listed", lambda: _listed(base, SLASHED))

        status, card = _get(base, f"/v1/models/{SLASHED}")
        assert status == 200, card
        assert card["id"] == SLASHED and card["object"] == "model"
        assert card["owned_by"] == "nvidia" and isinstance(card["created"], int)

        # Registered, endpoint not served: not ready, and the body says why.
        status, ready = _get(base, f"/v1/models/{SLASHED}/ready")
        assert status == 503, ready
        assert ready["model"] == SLASHED and ready["ready"] is False
        assert "no live worker" in ready["reason"]
        assert ready["namespaces"]["ready"]["worker_types"]["aggregated"]["workers"] == 0

        serve.touch()
        wait_for_instances(base, SLASHED, 1)
        status, ready = _get(base, f"/v1/models/{SLASHED}/ready")
        assert status == 200, ready
        assert ready["ready"] is True and "reason" not in ready
        ns = ready["namespaces"]["ready"]
        assert ns["worker_types"] == {"aggregated": {"workers": 1, "needs": []}}
        assert ns["present"] == ["aggregated"] and ns["missing_worker_types"] == []

        for path in ("/v1/models/nope", "/v1/models/nope/ready", "/v1/models/Org/other"):
            status, err = _get(base, path)
            assert status == 404, (path, err)
            assert err["error"]["code"] == "model_not_found", err
            assert "nope" in err["error"]["message"] or "Org/other" in err["error"]["message"]
    finally:
        procs.close()


def test_busy_threshold_changes_at_run_time(tmp_path, model_dir) -> None:
    """``GET|POST /busy_threshold`` change the KV router's busy decision for the next request.

    Reference 1.6.1 (discovered mocker): ``GET`` → ``{"thresholds": [{"model": "tiny",
    "active_decode_blocks_threshold": null, "active_prefill_tokens_threshold": null,
    "active_prefill_tokens_threshold_frac": null}]}``; ``POST {"model": "tiny",
    "active_decode_blocks_threshold": 0.5}`` → 200 with the model's three values after the
    change; later posts merge (absent or ``null`` fields keep their value; a body with only
    ``model`` reads them); ``1.5`` → 400 ``{"error": "active_decode_blocks_threshold must be
    between 0.0 and 1.0, got 1.5"}``; ``frac: -1`` → 400 ``{"error":
    "active_prefill_tokens_threshold_frac must be a finite value greater than or equal to
    0.0, got -1"}``; an unknown (or in-process only) model → 404 ``{"error": "Model 'nope'
    not found. Thresholds can only be set for discovered models."}``; a wrong type or a
    missing ``model`` → 422 there (axum's JSON rejection), 400 here.
    """
    procs = Procs(tmp_path / "kv", tmp_path)
    hold = tmp_path / "hold"
    hold.touch()
    procs.env.update(
        {"MARKER": str(tmp_path / "marker"), "HOLD": str(hold), "ENDPOINT": "bt.slow.generate"}
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "bt", "--router-mode", "kv")
        procs.start("slow", [str(WORKERS / "llm_worker.py"), str(model_dir)])
        wait_for_instances(base, "slow", 1)
        nulls = {
            "active_decode_blocks_threshold": None,
            "active_prefill_tokens_threshold": None,
            "active_prefill_tokens_threshold_frac": None,
        }
        assert _get(base, "/busy_threshold") == (200, {"thresholds": [{"model": "slow", **nulls}]})
        assert _post(base, "/busy_threshold", {"model": "slow"}) == (
            200,
            {"model": "slow", **nulls},
        )

        status, body = _post(
            base, "/busy_threshold", {"model": "slow", "active_prefill_tokens_threshold": 0}
        )
        assert status == 200, body
        assert body == {"model": "slow", **nulls, "active_prefill_tokens_threshold": 0}

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)
        # The held request stays in prefill: with threshold 0 its worker is busy at once.
        held = client.chat.completions.create(
            model="slow", messages=MESSAGES, max_tokens=2, stream=True
        )
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=2)
        assert e.value.status_code == 529

        # Raised at run time: the very next request is admitted (it waits for the hold too).
        status, body = _post(
            base,
            "/busy_threshold",
            {"model": "slow", "active_prefill_tokens_threshold": 1_000_000, "bogus": 1},
        )
        assert status == 200 and body["active_prefill_tokens_threshold"] == 1_000_000, body
        second = client.chat.completions.create(
            model="slow", messages=MESSAGES, max_tokens=2, stream=True
        )
        hold.unlink()
        for stream in (held, second):
            assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "length"

        # Merging: absent and null fields keep their values.
        status, body = _post(
            base,
            "/busy_threshold",
            {"model": "slow", "active_decode_blocks_threshold": 0.5,
             "active_prefill_tokens_threshold_frac": None},
        )  # fmt: skip
        assert status == 200
        merged = {
            "model": "slow",
            "active_decode_blocks_threshold": 0.5,
            "active_prefill_tokens_threshold": 1_000_000,
            "active_prefill_tokens_threshold_frac": None,
        }
        assert body == merged
        assert _get(base, "/busy_threshold") == (200, {"thresholds": [merged]})

        bad = [
            ({"model": "slow", "active_decode_blocks_threshold": 1.5},
             "active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5"),
            ({"model": "slow", "active_prefill_tokens_threshold_frac": -1},
             "active_prefill_tokens_threshold_frac must be a finite value greater than or "
             "equal to 0.0, got -1"),
        ]  # fmt: skip
        for body, message in bad:
            assert _post(base, "/busy_threshold", body) == (400, {"error": message})
        for body in (
            {"model": "slow", "active_prefill_tokens_threshold": -5},
            {"model": "slow", "active_decode_blocks_threshold": "x"},
            {"active_decode_blocks_threshold": 0.5},
            b"not json",
        ):
            status, err = _post(base, "/busy_threshold", body)
            assert status == 400 and "error" in err, (body, err)
        assert _post(base, "/busy_threshold", {"model": "nope"}) == (
            404,
            {"error": "Model 'nope' not found. Thresholds can only be set for discovered models."},
        )
        # Refused changes left the values alone.
        assert _get(base, "/busy_threshold") == (200, {"thresholds": [merged]})
    finally:
        procs.close()


def test_frontend_route_validation() -> None:
    """Reference 1.6.1: ``POST`` → ``ValueError("unsupported FrontendRoute method 'POST';
    only GET is supported")``; ``"x"`` → ``ValueError("frontend route path must start with
    '/': \\"x\\"")``; ``/a/{b}``, ``/a*``, ``/a b`` → ``ValueError("frontend route path must
    be static (no '{...}', '*', or whitespace): ...")``; a non-callable → ``TypeError``; an
    ``async def`` → ``ValueError``; ``FrontendResponse(99, ...)`` → ``ValueError("invalid
    status code 99: invalid status code")``, 600 accepted; ``method`` is ``"GET"`` for
    ``"get"``."""

    def h(ctx):
        return {}

    async def ah(ctx):
        return {}

    r = FrontendRoute("get", "/x", h)
    assert (r.method, r.path) == ("GET", "/x")
    with pytest.raises(ValueError, match="unsupported FrontendRoute method 'POST'"):
        FrontendRoute("POST", "/x", h)
    with pytest.raises(ValueError, match="must start with '/'"):
        FrontendRoute("GET", "x", h)
    for path in ("/a/{b}", "/a*", "/a b", "/a\x01"):
        with pytest.raises(ValueError, match="must be static"):
            FrontendRoute("GET", path, h)
    with pytest.raises(TypeError, match="must be callable"):
        FrontendRoute("GET", "/x", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="synchronous"):
        FrontendRoute("GET", "/x", ah)
    with pytest.raises(ValueError, match="invalid status code 99"):
        FrontendResponse(99, {})
    FrontendResponse(600, {})


async def _serve(tmp_path: Path, routes, model_dir: Path):
    """An in-process mocker frontend serving ``routes``; ``(rt, task, base)``."""
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    port = free_port()
    args = EntrypointArgs(
        EngineType.Mocker,
        model_path=str(model_dir),
        model_name="tiny",
        http_host="127.0.0.1",
        http_port=port,
    )
    engine = await make_engine(rt, args)
    task = asyncio.ensure_future(run_input(rt, "http", engine, frontend_route_extensions=routes))
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        if task.done():
            break
        try:
            await asyncio.to_thread(http, "GET", f"{base}/live", None, 1)
            break
        except OSError:
            await asyncio.sleep(0.05)
    return rt, task, base


async def test_extension_routes_serve_and_fail_safely(tmp_path, model_dir) -> None:
    """Reference 1.6.1 (in-process mocker ``tiny``): the context answers ``is_ready`` true,
    ``is_cancelled`` false, ``has_any_ready_model`` true, ``is_model_ready_to_serve("tiny")``
    true and ``("nope")`` false, both name lists ``["tiny"]``; a tuple body → ``[1, 2]``; a
    set → an array; ``None`` → ``null``; ``FrontendResponse(202, {"x": 1})`` → 202; a raising
    handler and one returning a coroutine → 500 ``{"error": "frontend route extension
    failed"}`` and the frontend keeps serving; ``POST`` on the route → 405; a trailing slash
    → 404."""
    seen: list[FrontendExtensionContext] = []

    def state(ctx: FrontendExtensionContext):
        seen.append(ctx)
        return {
            "ready": ctx.is_ready(),
            "cancelled": ctx.is_cancelled(),
            "any": ctx.has_any_ready_model(),
            "tiny": ctx.is_model_ready_to_serve("tiny"),
            "nope": ctx.is_model_ready_to_serve("nope"),
            "names": ctx.model_display_names(),
            "serving": ctx.serving_ready_display_names(),
        }

    def boom(ctx):
        raise RuntimeError("boom")

    async def later():
        return 1

    routes = [
        FrontendRoute("GET", "/x/state", state),
        FrontendRoute("GET", "/x/tuple", lambda ctx: (1, 2)),
        FrontendRoute("GET", "/x/set", lambda ctx: {3}),
        FrontendRoute("GET", "/x/none", lambda ctx: None),
        FrontendRoute("GET", "/x/resp", lambda ctx: FrontendResponse(202, {"x": 1})),
        FrontendRoute("GET", "/x/fail", boom),
        FrontendRoute("GET", "/x/await", lambda ctx: later()),
        FrontendRoute("GET", "/x/object", lambda ctx: object()),
        # A GET extension where the built-in route is POST only, as the reference allows.
        FrontendRoute("GET", "/v1/chat/completions", lambda ctx: "ext"),
    ]
    rt, task, base = await _serve(tmp_path, routes, model_dir)
    try:

        async def get(path: str) -> tuple[int, object]:
            status, body = await asyncio.to_thread(http, "GET", f"{base}{path}")
            return status, json.loads(body) if body else None

        assert await get("/x/state") == (
            200,
            {
                "ready": True,
                "cancelled": False,
                "any": True,
                "tiny": True,
                "nope": False,
                "names": ["tiny"],
                "serving": ["tiny"],
            },
        )
        assert await get("/x/tuple") == (200, [1, 2])
        assert await get("/x/set") == (200, [3])
        assert await get("/x/none") == (200, None)
        assert await get("/x/resp") == (202, {"x": 1})
        failed = {"error": "frontend route extension failed"}
        for path in ("/x/fail", "/x/await", "/x/object"):
            assert await get(path) == (500, failed), path
        assert await get("/v1/chat/completions") == (200, "ext")
        assert (await get("/x/state/"))[0] == 404
        status, _ = await asyncio.to_thread(http, "POST", f"{base}/x/state", b"{}")
        assert status == 405
        # Still serving after the failures.
        assert (await get("/v1/models/tiny"))[0] == 200
        assert (await get("/v1/models/tiny/ready"))[1]["ready"] is True
        rt.shutdown()
        await asyncio.wait_for(task, 10)
        # The context is live: after shutdown the one a handler kept says so.
        assert seen[0].is_cancelled() and not seen[0].is_ready()
    finally:
        rt.shutdown()
        if not task.done():
            await asyncio.wait_for(task, 10)


async def test_extension_routes_may_not_collide(tmp_path, model_dir) -> None:
    """Reference 1.6.1: two extensions on one path → ``ValueError("duplicate frontend route
    registered: GET /x")`` from the ``run_input`` call itself; an extension on a built-in
    ``GET`` path (``/health``, ``/busy_threshold``) → an exception when awaited, before
    serving: ``duplicate HTTP route registered: GET /health conflicts with GET /health``;
    items must be ``FrontendRoute``s."""
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    try:
        engine = await make_engine(
            rt,
            EntrypointArgs(
                EngineType.Echo,
                model_path=str(model_dir),
                model_name="e",
                http_host="127.0.0.1",
                http_port=free_port(),
            ),
        )
        h = lambda ctx: {}  # noqa: E731
        with pytest.raises(ValueError, match="duplicate frontend route registered: GET /x"):
            run_input(
                rt, "http", engine, frontend_route_extensions=[FrontendRoute("GET", "/x", h)] * 2
            )
        with pytest.raises(TypeError, match="FrontendRoute"):
            run_input(rt, "http", engine, frontend_route_extensions=[1])
        with pytest.raises(ValueError, match="only supported with input"):
            run_input(
                rt, "stdin", engine, frontend_route_extensions=[FrontendRoute("GET", "/x", h)]
            )
        for path in ("/health", "/busy_threshold", "/v1/models"):
            with pytest.raises(
                ValueError,
                match=f"duplicate HTTP route registered: GET {path} conflicts with GET {path}",
            ):
                await asyncio.wait_for(
                    run_input(
                        rt,
                        "http",
                        engine,
                        frontend_route_extensions=[FrontendRoute("GET", path, h)],
                    ),
                    10,
                )
    finally:
        rt.shutdown()
