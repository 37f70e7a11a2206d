"""HTTP half of observe_selection_reference.py (reference services on loopback)."""

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import msgpack
import zmq

# The reference's interpreter: REF_PYTHON, else the venv of benches/setup_reference.sh.
REF = os.environ.get(
    "REF_PYTHON", str(Path(__file__).resolve().parent.parent / ".bench-ref-venv" / "bin" / "python")
)

ctx = zmq.Context()
s = ctx.socket(zmq.PUB)
s.bind("tcp://127.0.0.1:5991")
s2 = ctx.socket(zmq.PUB)
s2.bind("tcp://127.0.0.1:5992")
p = subprocess.Popen(
    [
        REF,
        "-m",
        "dynamo.indexer",
        "--port",
        "18090",
        "--block-size",
        "4",
        "--workers",
        "1=tcp://127.0.0.1:5991,1:1=tcp://127.0.0.1:5992",
    ],
    stderr=subprocess.DEVNULL,
)
q = subprocess.Popen(
    [REF, "-m", "dynamo.select_service", "--port", "18092"],
    stderr=subprocess.DEVNULL,
)
time.sleep(3)


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


print(
    post(
        18092,
        "/workers",
        {
            "worker_id": 7,
            "model_name": "m",
            "block_size": 4,
            "endpoint": "http://w7",
            "kv_events_endpoint": "tcp://127.0.0.1:5991",
        },
    )
)
print(
    post(
        18092,
        "/workers",
        {
            "worker_id": 8,
            "model_name": "m",
            "block_size": 4,
            "endpoint": "http://w8",
            "kv_events_endpoint": "tcp://127.0.0.1:5992",
        },
    )
)
time.sleep(1)
toks = list(range(16))
for seq in range(3):
    ev = (
        [["BlockStored", [101, 102], None, toks[:8], 4, None, "GPU"]]
        if seq == 0
        else [["BlockStored", [103], 102, toks[8:12], 4, None, "GPU"]]
        if seq == 1
        else []
    )
    s.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), ev, 0])])
    s2.send_multipart(
        [b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), ev[:1] if seq == 0 else [], 1])]
    )
s.send_multipart([b"", (3).to_bytes(8, "big"), b"\xc1garbage"])
time.sleep(1)
print(post(18090, "/query", {"token_ids": toks, "model_name": "default"}))
print(urllib.request.urlopen("http://127.0.0.1:18090/dump").read()[:600])
print(post(18092, "/select", {"model_name": "m", "token_ids": toks}))
print(post(18092, "/overlap_scores", {"model_name": "m", "token_ids": toks}))
print(urllib.request.urlopen("http://127.0.0.1:18090/metrics").read().decode()[:3000])
print(
    post(
        18092,
        "/workers",
        {
            "worker_id": 9,
            "model_name": "m",
            "block_size": 4,
            "endpoint": "http://w9",
            "kv_events_endpoint": "tcp://127.0.0.1:5999",
        },
    )
)
time.sleep(2)
print(urllib.request.urlopen("http://127.0.0.1:18092/workers").read().decode()[-700:])
p.terminate()
q.terminate()
print("rc", p.wait(), q.wait())
