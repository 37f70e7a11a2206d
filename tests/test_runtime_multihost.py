"""Multi-host: a worker in its own network namespace (iproute2 ``ip netns`` + a veth pair,
created and removed by the test) and a client in the test's namespace discover each other
through etcd and exchange requests over NATS; etcd and nats-server listen on the veth
address of the test's side only."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from runtime_util import WORKER, collect, local_runtime, unique_ns, wait_until
from services import Etcd, Nats


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns():
    """A namespace ``ns`` joined to this one by a veth pair: 10.213.N.1 here, .2 there."""
    tag = uuid.uuid4().hex[:6]
    name, here, there = f"dyn-{tag}", f"dva{tag}", f"dvb{tag}"
    subnet = int(tag[:2], 16)
    try:
        ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as e:
        reason = getattr(e, "stderr", "") or str(e)
        print(f"network namespaces unavailable: {reason}")
        pytest.skip(f"the kernel refuses network namespaces: {reason.strip()}")
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", name)
        ip("addr", "add", f"10.213.{subnet}.1/24", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"10.213.{subnet}.2/24", "dev", there)
        ip("netns", "exec", name, "ip", "link", "set", there, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


async def test_worker_in_another_namespace_over_etcd_and_nats(netns, monkeypatch) -> None:
    name, here, there = netns
    etcd, nats = Etcd(host=here), Nats(host=here)
    etcd.start()
    nats.start()
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": etcd.endpoint,
        "ETCD_LEASE_TTL": "2",
        "DYN_REQUEST_PLANE": "nats",
        "NATS_SERVER": nats.url,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ns = unique_ns()
    worker = subprocess.Popen(
        ["ip", "netns", "exec", name, sys.executable, str(WORKER), ns],
        env={**os.environ, **env, "DYN_TCP_RPC_HOST": there, "DYNAMO_SKIP_PYTHON_LOG_INIT": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = worker.stdout.readline() if worker.stdout else ""
        assert line.startswith("ID "), (line, worker.stderr.read() if worker.stderr else "")
        worker_id = int(line.split()[1])
        async with local_runtime("etcd", "nats") as rt:
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await wait_until(lambda: client.instance_ids() == [worker_id])
            for _ in range(5):
                items = await collect(await client.round_robin({"n": 4}, annotated=False))
                assert items == [{"worker": worker_id, "i": i} for i in range(4)]
            # The worker dies with its namespace's process: its lease expires for us.
            worker.kill()
            await wait_until(lambda: client.instance_ids() == [], timeout=6)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(10)
        etcd.close()
        nats.close()
