"""Black-box: how the reference ``SelectionService`` applies ``add_output_block`` and its
``decay_fraction``, and which ``DYN_ROUTER_*`` variables change its selection.

    .bench-ref-venv/bin/python scripts/observe_selection_decay_reference.py decay PUB_PYTHON
    .bench-ref-venv/bin/python scripts/observe_selection_decay_reference.py env PUB_PYTHON

``PUB_PYTHON`` is an interpreter with pyzmq (the project's venv): it runs the idle ZMQ PUB
sockets the workers' ``kv_events_endpoint``s point at, so the workers become schedulable.
Prints ``loads()`` after each step (decay) or the chosen worker under each environment (env).
Works with our ``dynamo._core`` too (run it with the project's interpreter).
"""

import asyncio
import json
import os
import socket
import subprocess
import sys

from dynamo._core import SelectionService

PUB = (
    "import sys, time, zmq\n"
    "s = zmq.Context().socket(zmq.PUB); s.bind(sys.argv[1]); time.sleep(float(sys.argv[2]))\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def service_with_workers(pub_python, n):
    pubs, svc = [], SelectionService()
    for w in range(n):
        ep = f"tcp://127.0.0.1:{free_port()}"
        pubs.append(subprocess.Popen([pub_python, "-c", PUB, ep, "60"]))
        await asyncio.sleep(0.3)
        rec = {
            "worker_id": w + 1,
            "model_name": "m",
            "block_size": 4,
            "endpoint": f"http://127.0.0.1:{9000 + w}",
            "kv_events_endpoint": ep,
        }
        for _ in range(50):
            r = await svc.upsert_worker(rec)
            if r["lifecycle"] == "schedulable":
                break
            await asyncio.sleep(0.1)
    return svc, pubs


def loads(svc):
    return json.dumps(svc.loads(model_name="m"))


async def decay(pub_python):
    svc, pubs = await service_with_workers(pub_python, 1)
    try:
        r = await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(16)), "selection_id": "a"}
        )
        print("reserve a", json.dumps(r))
        print("loads", loads(svc))
        await svc.prefill_complete("a")
        print("after prefill_complete", loads(svc))
        for d in [None, None, 0.5, 0.5, 0.0, 1.0, 0.25]:
            if d is None:
                svc.add_output_block("a")
            else:
                svc.add_output_block("a", decay_fraction=d)
            print(f"after add_output_block(decay_fraction={d})", loads(svc))
        # A second request sharing the prompt: shared blocks count once.
        await svc.select_and_reserve(
            {"model_name": "m", "token_ids": list(range(16)), "selection_id": "b"}
        )
        print("after reserve b (same prompt)", loads(svc))
        svc.add_output_block("b", decay_fraction=0.5)
        print("after b add_output_block(0.5)", loads(svc))
        await svc.free_reservation("a")
        print("after free a", loads(svc))
        await svc.free_reservation("b")
        print("after free b", loads(svc))
    finally:
        svc.shutdown()
        for p in pubs:
            p.kill()


async def env(pub_python):
    # Worker 1 carries a booked long prompt; new, different prompts then go to the idle
    # worker 2 at temperature 0, to either with a high DYN_ROUTER_TEMPERATURE.
    svc, pubs = await service_with_workers(pub_python, 2)
    try:
        r = await svc.select_and_reserve(
            {
                "model_name": "m",
                "token_ids": list(range(5000, 5400)),
                "selection_id": "x",
                "worker_id": 1,
            }
        )
        print("booked", r.get("worker_id"), "track_prefill_tokens", r.get("track_prefill_tokens"))
        print("loads", loads(svc))
        picks = []
        for i in range(16):
            r = await svc.select(
                {"model_name": "m", "token_ids": list(range(i * 100, i * 100 + 64))}
            )
            picks.append(r.get("worker_id"))
        print("picks", json.dumps(picks))
    finally:
        svc.shutdown()
        for p in pubs:
            p.kill()


if __name__ == "__main__":
    mode, pub_python = sys.argv[1], sys.argv[2]
    print("env", {k: v for k, v in os.environ.items() if k.startswith("DYN_ROUTER")})
    asyncio.run({"decay": decay, "env": env}[mode](pub_python))
