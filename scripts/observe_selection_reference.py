# The probes are three scripts run in sequence; each lambda is awaited inside its own loop
# iteration, so late binding (B023) cannot bite; the repeated helpers and late imports are the
# parts' own.
# ruff: noqa: B023, F811, E402, F841
"""Black-box observation of the reference ``SelectionService`` and standalone services
(ai-dynamo-runtime 1.6.1 in a scratch venv). Run with the reference's interpreter:

    .bench-ref-venv/bin/python scripts/observe_selection_reference.py inproc
    .venv/bin/python scripts/observe_selection_reference.py http   # needs pyzmq

``inproc`` prints every call and its answer or exception (type, message, ``kind``,
``status_code``); ``http`` starts the reference's ``python -m dynamo.select_service`` and
``python -m dynamo.indexer`` (via .bench-ref-venv/bin/python) on loopback, publishes vLLM-format
KV events from pyzmq PUB sockets and prints the HTTP answers. What was seen is recorded in
docs/design/selection_service.md and docs/compatibility.md; our tests assert the same shapes.
"""

# --- part 0 ---
import asyncio
import json
import sys

from dynamo._core import SelectionCacheConfig, SelectionService


async def tryit(tag, f):
    try:
        r = await f()
        print(tag, "->", json.dumps(r))
        return r
    except Exception as e:
        print(
            tag,
            "EXC",
            type(e).__name__,
            repr(str(e)),
            getattr(e, "kind", None),
            getattr(e, "status_code", None),
        )


async def main0():
    s = SelectionService()
    base = {"worker_id": 1, "model_name": "m", "block_size": 16}
    for kv in [
        {"0": "tcp://127.0.0.1:5999"},
        {0: "tcp://127.0.0.1:5999"},
        {0: "tcp://127.0.0.1:5999", 1: "tcp://127.0.0.1:5998"},
    ]:
        await tryit(f"kvs={kv!r}", lambda: s.upsert_worker({**base, "kv_events_endpoints": kv}))
    for ep in ["http://127.0.0.1:9000", {"url": "http://x"}, 5, "notaurl"]:
        await tryit(
            f"ep={ep!r}",
            lambda: s.upsert_worker(
                {**base, "endpoint": ep, "kv_events_endpoint": "tcp://127.0.0.1:5999"}
            ),
        )
    await tryit(
        "dp",
        lambda: s.upsert_worker(
            {
                **base,
                "endpoint": "http://a",
                "kv_events_endpoint": "tcp://127.0.0.1:5999",
                "data_parallel_size": 2,
            }
        ),
    )
    await tryit(
        "dp2",
        lambda: s.upsert_worker(
            {
                **base,
                "endpoint": "http://a",
                "kv_events_endpoints": {0: "tcp://127.0.0.1:5999", 1: "tcp://127.0.0.1:5998"},
                "data_parallel_size": 2,
            }
        ),
    )
    await tryit("unknown field", lambda: s.upsert_worker({**base, "bogus": 1}))
    await tryit("bs0", lambda: s.upsert_worker({**base, "block_size": 0}))
    await tryit("bs-1", lambda: s.upsert_worker({**base, "block_size": -1}))
    await tryit(
        "badkv",
        lambda: s.upsert_worker({**base, "endpoint": "http://a", "kv_events_endpoint": "garbage"}),
    )
    await tryit(
        "taints",
        lambda: s.upsert_worker(
            {
                **base,
                "worker_id": 9,
                "endpoint": "http://a",
                "kv_events_endpoint": "tcp://127.0.0.1:5999",
                "taints": ["x"],
            }
        ),
    )
    await tryit(
        "replay",
        lambda: s.upsert_worker(
            {
                **base,
                "worker_id": 10,
                "endpoint": "http://a",
                "kv_events_endpoint": "tcp://127.0.0.1:5999",
                "replay_endpoint": "tcp://127.0.0.1:5997",
            }
        ),
    )
    await asyncio.sleep(1)
    print("ready", json.dumps(s.ready()))
    await tryit("delete 1", lambda: s.delete_worker(1))
    await tryit("delete 1 again", lambda: s.delete_worker(1))
    print("list model filter", json.dumps(s.list_workers(model_name="zzz")))


# --- part 1 ---


async def tryit(tag, f):
    try:
        r = await f() if asyncio.iscoroutinefunction(f) or True else f()
        if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
            r = await r
        print(tag, "->", json.dumps(r))
        return r
    except Exception as e:
        print(
            tag,
            "EXC",
            type(e).__name__,
            repr(str(e)),
            getattr(e, "kind", None),
            getattr(e, "status_code", None),
        )


async def call(tag, f):
    try:
        r = f()
        if hasattr(r, "__await__"):
            r = await r
        print(tag, "->", json.dumps(r))
        return r
    except Exception as e:
        print(
            tag,
            "EXC",
            type(e).__name__,
            repr(str(e)),
            getattr(e, "kind", None),
            getattr(e, "status_code", None),
        )


async def main1():
    s = SelectionService()
    for i in (1, 2):
        await call(
            "up",
            lambda: s.upsert_worker(
                {
                    "worker_id": i,
                    "model_name": "m",
                    "block_size": 4,
                    "endpoint": f"http://w{i}",
                    "kv_events_endpoint": f"tcp://127.0.0.1:{5990 + i}",
                }
            ),
        )
    toks = list(range(20))
    for req in [
        {},
        {"token_ids": toks},
        {"model_name": "m"},
        {"model_name": "m", "token_ids": toks},
        {"model_name": "zz", "token_ids": toks},
        {"model_name": "m", "token_ids": "x"},
        {"model_name": "m", "tokens": toks},
        {"model_name": "m", "token_ids": toks, "selection_id": "abc"},
        {"model_name": "m", "token_ids": toks, "request_id": "r1"},
    ]:
        await call(f"select {json.dumps(req)[:80]}", lambda: s.select(req))
    await call("overlap", lambda: s.overlap_scores({"model_name": "m", "token_ids": toks}))
    await call("overlap empty", lambda: s.overlap_scores({}))
    await call("potential", lambda: s.potential_loads({"model_name": "m", "token_ids": toks}))
    await call("potential empty", lambda: s.potential_loads({}))
    await call("loads", lambda: s.loads())
    sid = "s1"
    r = await call(
        "sel", lambda: s.select({"model_name": "m", "token_ids": toks, "selection_id": sid})
    )
    await call(
        "sel dup", lambda: s.select({"model_name": "m", "token_ids": toks, "selection_id": sid})
    )
    await call(
        "sel bhash",
        lambda: s.select({"model_name": "m", "block_hashes": [1, 2, 3], "selection_id": "bh"}),
    )
    await call("sel bhash no isl", lambda: s.select({"model_name": "m", "block_hashes": [1, 2, 3]}))
    await call(
        "sel bhash isl",
        lambda: s.select({"model_name": "m", "block_hashes": [1, 2, 3], "isl_tokens": 12}),
    )
    await call("cr none", lambda: s.create_reservation({}))
    await call("cr replay", lambda: s.create_reservation({"selection_id": sid}))
    await call("cr replay again", lambda: s.create_reservation({"selection_id": sid}))
    await call("loads", lambda: s.loads())
    await call("cr unknown", lambda: s.create_reservation({"selection_id": "nope"}))
    await call(
        "cr explicit no prompt",
        lambda: s.create_reservation({"selection_id": "e1", "worker_id": 2}),
    )
    await call(
        "cr explicit",
        lambda: s.create_reservation(
            {"selection_id": "e2", "worker_id": 2, "model_name": "m", "token_ids": toks}
        ),
    )
    await call(
        "cr explicit bad worker",
        lambda: s.create_reservation(
            {"selection_id": "e3", "worker_id": 99, "model_name": "m", "token_ids": toks}
        ),
    )
    await call("loads", lambda: s.loads())
    await call("sar", lambda: s.select_and_reserve({"model_name": "m", "token_ids": toks}))
    await call(
        "sar sid",
        lambda: s.select_and_reserve(
            {"model_name": "m", "token_ids": toks, "selection_id": "mine"}
        ),
    )
    await call(
        "sar sid dup",
        lambda: s.select_and_reserve(
            {"model_name": "m", "token_ids": toks, "selection_id": "mine"}
        ),
    )
    await call("loads", lambda: s.loads())
    await call("pc", lambda: s.prefill_complete(sid))
    await call("pc again", lambda: s.prefill_complete(sid))
    await call("pc unknown", lambda: s.prefill_complete("nope"))
    await call("aob", lambda: s.add_output_block(sid))
    await call("aob decay", lambda: s.add_output_block(sid, decay_fraction=0.5))
    await call("aob decay bad", lambda: s.add_output_block(sid, decay_fraction=2.0))
    await call("aob unknown", lambda: s.add_output_block("nope"))
    await call("loads", lambda: s.loads())
    await call("free", lambda: s.free_reservation(sid))
    await call("free again", lambda: s.free_reservation(sid))
    await call("loads", lambda: s.loads())
    await call("snapshot", lambda: s.indexer_snapshot())
    s.shutdown()
    s.shutdown()
    await call("after shutdown select", lambda: s.select({"model_name": "m", "token_ids": toks}))
    await call("after shutdown ready", lambda: s.ready())


# --- part 2 ---
import time


async def call(tag, f):
    try:
        r = f()
        if hasattr(r, "__await__"):
            r = await r
        print(tag, "->", json.dumps(r))
        return r
    except Exception as e:
        print(
            tag,
            "EXC",
            type(e).__name__,
            repr(str(e)),
            getattr(e, "kind", None),
            getattr(e, "status_code", None),
        )


async def main2():
    for cfg in [dict(ttl_secs=-1), dict(ttl_secs=0), dict(max_entries=0), dict(max_bytes=0)]:
        try:
            SelectionCacheConfig(**cfg)
            print("cfg ok", cfg)
        except BaseException as e:
            print("cfg", cfg, type(e).__name__, e)
        try:
            print("svc skip")
        except BaseException as e:
            print("svc", cfg, type(e).__name__, e)
    c = SelectionCacheConfig(ttl_secs=1.0, max_entries=2, max_bytes=100000)
    print(repr(c), [a for a in dir(c) if not a.startswith("_")])
    for kw in [
        dict(indexer_peers=["http://h"]),
        dict(indexer_peers=["http://h:1"]),
        dict(indexer_threads=0),
        dict(replica_sync_peers=["tcp://h"]),
    ]:
        try:
            SelectionService(**kw)
            print("svc ok", kw)
        except Exception as e:
            print("svc", kw, type(e).__name__, e)
    s = SelectionService(selection_cache=c)
    for i in (1, 2):
        await call(
            "up",
            lambda: s.upsert_worker(
                {
                    "worker_id": i,
                    "model_name": "m",
                    "block_size": 4,
                    "endpoint": f"http://w{i}",
                    "kv_events_endpoint": f"tcp://127.0.0.1:{5990 + i}",
                }
            ),
        )
    toks = list(range(20))
    await call(
        "sel", lambda: s.select({"model_name": "m", "token_ids": toks, "selection_id": "s1"})
    )
    await call("loads", lambda: s.loads())
    await call("cr replay", lambda: s.create_reservation({"selection_id": "s1", "model_name": "m"}))
    await call(
        "cr replay again", lambda: s.create_reservation({"selection_id": "s1", "model_name": "m"})
    )
    await call("loads", lambda: s.loads())
    await call("pc", lambda: s.prefill_complete("s1"))
    await call("pc again", lambda: s.prefill_complete("s1"))
    await call("loads", lambda: s.loads())
    await call("aob", lambda: s.add_output_block("s1"))
    await call("aob decay", lambda: s.add_output_block("s1", decay_fraction=0.5))
    await call("loads", lambda: s.loads())
    await call("free", lambda: s.free_reservation("s1"))
    await call("free again", lambda: s.free_reservation("s1"))
    await call("loads", lambda: s.loads())
    # cache limits
    for k in range(4):
        await call(
            f"sel c{k}",
            lambda: s.select({"model_name": "m", "token_ids": toks, "selection_id": f"c{k}"}),
        )
    await call("loads", lambda: s.loads())
    for k in range(4):
        await call(
            f"cr c{k}", lambda: s.create_reservation({"selection_id": f"c{k}", "model_name": "m"})
        )
    await call(
        "sel t", lambda: s.select({"model_name": "m", "token_ids": toks, "selection_id": "t"})
    )
    time.sleep(1.5)
    await call(
        "cr t expired", lambda: s.create_reservation({"selection_id": "t", "model_name": "m"})
    )
    await call("loads", lambda: s.loads())
    s2 = SelectionService(selection_cache=SelectionCacheConfig(max_bytes=200))
    await call(
        "up",
        lambda: s2.upsert_worker(
            {
                "worker_id": 1,
                "model_name": "m",
                "block_size": 4,
                "endpoint": "http://w1",
                "kv_events_endpoint": "tcp://127.0.0.1:5991",
            }
        ),
    )
    await call(
        "sel big",
        lambda: s2.select(
            {"model_name": "m", "token_ids": list(range(400)), "selection_id": "big"}
        ),
    )
    await call(
        "sel small",
        lambda: s2.select(
            {"model_name": "m", "token_ids": list(range(8)), "selection_id": "small"}
        ),
    )
    await call("loads2", lambda: s2.loads())
    await call("cr big", lambda: s2.create_reservation({"selection_id": "big", "model_name": "m"}))
    await call(
        "cr small", lambda: s2.create_reservation({"selection_id": "small", "model_name": "m"})
    )
    # other request fields
    await call(
        "sel seqh",
        lambda: s.select({"model_name": "m", "sequence_hashes": [1, 2, 3], "isl_tokens": 12}),
    )
    await call(
        "sel seqh noisl", lambda: s.select({"model_name": "m", "sequence_hashes": [1, 2, 3]})
    )
    await call(
        "sel seqh bh",
        lambda: s.select(
            {
                "model_name": "m",
                "sequence_hashes": [1, 2, 3],
                "block_hashes": [4, 5, 6],
                "isl_tokens": 12,
            }
        ),
    )
    await call(
        "sel lora", lambda: s.select({"model_name": "m", "token_ids": toks, "lora_name": "a"})
    )
    await call(
        "sel rg", lambda: s.select({"model_name": "m", "token_ids": toks, "routing_group": "x"})
    )
    await call(
        "sel worker pin", lambda: s.select({"model_name": "m", "token_ids": toks, "worker_id": 2})
    )
    await call(
        "sel overrides",
        lambda: s.select(
            {
                "model_name": "m",
                "token_ids": toks,
                "router_config_override": {"overlap_score_weight": 2},
            }
        ),
    )
    await call("sel neg tok", lambda: s.select({"model_name": "m", "token_ids": [-1]}))
    await call("sel empty tok", lambda: s.select({"model_name": "m", "token_ids": []}))
    await call("sel notdict", lambda: s.select([1]))
    await call(
        "sar tpt",
        lambda: s.select_and_reserve(
            {
                "model_name": "m",
                "token_ids": toks,
                "track_prefill_tokens": False,
                "selection_id": "q",
            }
        ),
    )
    await call("loads", lambda: s.loads(model_name="m"))
    await call("pl", lambda: s.potential_loads({"model_name": "m", "token_ids": toks}))
    await call(
        "ov", lambda: s.overlap_scores({"model_name": "m", "token_ids": toks, "lora_name": "x"})
    )


def _http() -> None:
    import runpy

    runpy.run_path(
        __file__.replace("observe_selection_reference.py", "observe_selection_reference_http.py")
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        _http()
    else:
        for m in (main0, main1, main2):
            asyncio.run(m())
