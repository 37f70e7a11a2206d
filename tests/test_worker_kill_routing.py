"""A worker killed with SIGKILL: the frontend forgets it at once, in every router mode.

Two mocker workers behind a frontend with the default ``--migration-limit 0``; a bounded
request loop (8 client threads, short completions) runs while one worker is killed with
``kill -9``. Its discovery entry lives on until the lease expires (10 s here, the default).

Reported in issue 20 (before the fix): in ``--router-mode kv`` 167-174 requests got HTTP
500 ``cannot connect`` over ~9.5 s, until the entry expired; round-robin and the reference
1.6.1 lost only the in-flight requests. Now a connection failure marks the instance down
for every router of the frontend at once, and a request that failed before any output is
retried on the other worker whatever the migration limit: at most the requests in flight
on the killed worker fail (those that had already produced tokens), and none after the
first moments.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

CLIENTS = 8
AFTER_KILL_S = 4.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize("mode", ["kv", "round-robin"])
def test_kill_9_of_one_worker_loses_only_in_flight_requests(tmp_path, model_dir, mode) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    # The default lease: a dead worker stays discovered for up to 10 s.
    procs.env["DYN_FILE_KV_TTL_SECS"] = "10"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 6}).encode()
    try:
        procs.frontend(port, "--router-mode", mode)
        victim = procs.mocker(model_dir, "--speedup-ratio", "20")
        procs.mocker(model_dir, "--speedup-ratio", "20")
        wait_for_instances(base, "tiny", 2)
        for _ in range(4):  # warm both workers up
            assert http("POST", f"{base}/v1/completions", body)[0] == 200

        stop = threading.Event()
        lock = threading.Lock()
        results: list[tuple[float, int, bytes]] = []

        def client() -> None:
            while not stop.is_set():
                try:
                    status, out = http("POST", f"{base}/v1/completions", body, timeout=15)
                except OSError as e:
                    status, out = 0, str(e).encode()
                with lock:
                    results.append((time.monotonic(), status, out))

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        victim.kill()
        time.sleep(AFTER_KILL_S)
        stop.set()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads)

        after = [r for r in results if r[0] >= killed_at]
        errors = [r for r in after if r[1] != 200]
        late = [r for r in errors if r[0] - killed_at > 1.0]
        print(
            f"{mode}: {len(after)} requests after the kill, {len(errors)} errors, "
            f"last error at +{max((r[0] - killed_at for r in errors), default=0):.2f} s: "
            f"{sorted({r[2][:120] for r in errors})}"
        )
        assert len(after) > 50, "the loop must keep running through the kill"
        # Only requests in flight on the killed worker may fail (one per client thread
        # at most), and only right after the kill.
        assert len(errors) <= CLIENTS, [r[2][:200] for r in errors]
        assert not late, [r[2][:200] for r in late]
    finally:
        procs.close()
