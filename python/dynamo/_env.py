"""Defaults read from the environment, shared by :mod:`dynamo.runtime` and the command-line
entry points. Kept apart because importing :mod:`dynamo.runtime` imports :mod:`asyncio`,
which ``python -m dynamo.frontend`` and ``python -m dynamo.mocker`` do not need (it is most
of their start-up)."""

from __future__ import annotations

import os


def default_discovery_backend() -> str:
    """``DYN_DISCOVERY_BACKEND``; when unset, etcd if ``ETCD_ENDPOINTS`` is set, else file."""
    backend = os.environ.get("DYN_DISCOVERY_BACKEND", "").strip()
    if backend:
        return backend
    return "etcd" if os.environ.get("ETCD_ENDPOINTS", "").strip() else "file"


def default_request_plane() -> str:
    """``DYN_REQUEST_PLANE`` (``tcp`` or ``nats``), else ``tcp``."""
    return os.environ.get("DYN_REQUEST_PLANE", "").strip().lower() or "tcp"
