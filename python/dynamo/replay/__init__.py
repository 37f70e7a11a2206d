"""Trace replay: simulate a trace on mocker workers behind a router (``python -m dynamo.replay``).

The replay runs in Rust (``dynamo._core.run_mocker_trace_replay``); this package is the
command-line front end: it runs several router modes side by side, writes ``summary.json``,
per-request JSONL and, when matplotlib is installed (``pip install 'ai-dynamo-runtime[replay]'``),
PNG plots.
"""

from dynamo._core import run_mocker_synthetic_trace_replay, run_mocker_trace_replay

__all__ = ["run_mocker_synthetic_trace_replay", "run_mocker_trace_replay"]
