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


# The variables every command reads, for the ``--help`` epilogs of the command lines.
COMMON_ENVIRONMENT = """\
environment:
  DYN_DISCOVERY_BACKEND   file, etcd or mem (default: etcd when ETCD_ENDPOINTS is set, else file)
  DYN_FILE_KV             directory of file discovery, shared by the processes of one machine
                          (default: $XDG_RUNTIME_DIR/dynamo_store_kv, else /tmp/dynamo_store_kv-<uid>)
  ETCD_ENDPOINTS          etcd URLs, comma-separated (etcd discovery), e.g. http://127.0.0.1:2379
  DYN_REQUEST_PLANE       tcp or nats (default: tcp)
  NATS_SERVER             NATS URL for the nats request plane and KV events, e.g. nats://127.0.0.1:4222
  DYN_NAMESPACE           default namespace (default: dynamo)
  DYN_LOG                 log filter, e.g. info, debug, dynamo_llm=debug (default: info)
  DYN_LOGGING_JSONL       1: one JSON object per log line
  NO_COLOR                set: no colour in logs (logs are coloured only on a terminal)
"""
