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
