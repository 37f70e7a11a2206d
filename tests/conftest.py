"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Directory of committed test vectors."""
    return DATA


@pytest.fixture(scope="session")
def etcd_server():
    """A real etcd on a free loopback port for the whole session (tests/services.py)."""
    from services import Etcd

    server = Etcd()
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def nats_server():
    """A real nats-server on a free loopback port for the whole session."""
    from services import Nats

    server = Nats()
    server.start()
    yield server
    server.close()


@pytest.fixture(params=["tcp", "nats"])
def event_plane(request, monkeypatch) -> str:
    """Run the test on the brokerless TCP event plane, then over a real NATS server."""
    monkeypatch.setenv("DYN_EVENT_PLANE", request.param)
    if request.param == "nats":
        monkeypatch.setenv("NATS_SERVER", request.getfixturevalue("nats_server").url)
    return request.param


@pytest.fixture
def system_port(monkeypatch) -> int:
    """A system status server (for ``/metrics``) on a free loopback port."""
    from services import free_port

    port = free_port()
    monkeypatch.setenv("DYN_SYSTEM_PORT", str(port))
    monkeypatch.setenv("DYN_SYSTEM_HOST", "127.0.0.1")
    return port
