"""``python -m dynamo.frontend``: an OpenAI-compatible HTTP frontend over discovered workers.

Thin argparse over :mod:`dynamo._core`: the flags become a :class:`RouterConfig` and an
:class:`EntrypointArgs` (``EngineType.Dynamic``); ``run_inputs_blocking`` serves it as
``make_engine`` + ``run_input(runtime, "http", engine)`` would (``-i``: input ``"text"``, a
terminal chat), in Rust and without an asyncio event loop, so the process does not import
:mod:`asyncio` (which would be most of its start-up). Workers appear as they call
``register_model``. ``--kserve-grpc-server`` also serves the KServe v2 gRPC API on
``--grpc-port`` (input ``"grpc"``).

The HTTP limits (body size, header and body read timeouts, connections per client) are read
by the Rust frontend from their ``DYN_HTTP_*`` variables; each flag defaults to its variable
and, when given, sets it for this process. ``docs/design/reliability.md`` explains them.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    KvRouterConfig,
    ModelRuntimeConfig,
    RouterConfig,
    RouterMode,
    get_reasoning_parser_names,
    get_tool_parser_names,
    run_inputs_blocking,
)
from dynamo._env import COMMON_ENVIRONMENT, default_discovery_backend, default_request_plane

ENVIRONMENT = (
    COMMON_ENVIRONMENT
    + """\
  DYN_HTTP_OVERLOAD_STATUS_CODE  status of a request finding every worker busy (default: 529)
  DYN_HTTP_*, DYN_ROUTER_*, DYN_ACTIVE_*, DYN_GRPC_PORT, DYN_ENABLE_ANTHROPIC_API,
  DYN_MIGRATION_LIMIT     defaults of the flags above, as each one's help says
"""
)

_MODES = {
    "round-robin": RouterMode.RoundRobin,
    "random": RouterMode.Random,
    "kv": RouterMode.KV,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dynamo.frontend",
        description="OpenAI-compatible HTTP frontend (chat, completions, models, metrics).",
        epilog=ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--http-host",
        default=os.environ.get("DYN_HTTP_HOST", "0.0.0.0"),
        help="address the HTTP server listens on; 127.0.0.1 keeps it private to this "
        "machine (default: $DYN_HTTP_HOST, else 0.0.0.0, every interface)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ.get("DYN_HTTP_PORT", "8000")),
        help="TCP port of the HTTP server (default: $DYN_HTTP_PORT, else 8000)",
    )
    p.add_argument(
        "--router-mode",
        choices=sorted(_MODES),
        default=os.environ.get("DYN_ROUTER_MODE", "round-robin"),
        help="how a worker is chosen for each request: round-robin, random, or kv (the "
        "worker whose KV cache holds most of the prompt, weighed against its load) "
        "(default: $DYN_ROUTER_MODE, else round-robin)",
    )
    p.add_argument(
        "--migration-limit",
        type=int,
        default=int(os.environ.get("DYN_MIGRATION_LIMIT", "0")),
        help="times a request whose worker stream breaks is sent again to another worker, "
        "resuming from the tokens already produced; 0: off (default: $DYN_MIGRATION_LIMIT, "
        "else 0)",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("DYN_NAMESPACE"),
        help="serve only the models registered in this namespace (default: $DYN_NAMESPACE, "
        "else every namespace)",
    )
    p.add_argument(
        "--discovery-backend",
        default=None,
        help="how workers are found: file (shared directory $DYN_FILE_KV), etcd "
        "($ETCD_ENDPOINTS) or mem (this process only) (default: $DYN_DISCOVERY_BACKEND, "
        "else etcd when $ETCD_ENDPOINTS is set, else file)",
    )
    p.add_argument(
        "--request-plane",
        choices=["tcp", "nats"],
        default=None,
        help="how requests reach workers: tcp (direct) or nats ($NATS_SERVER) "
        "(default: $DYN_REQUEST_PLANE, else tcp)",
    )
    # HTTP limits: flag > environment variable > the Rust default (see the module docstring).
    p.add_argument(
        "--http-body-limit-mb",
        type=_non_negative(int, least=1),
        default=None,
        help="largest request body in MiB (default: $DYN_HTTP_BODY_LIMIT_MB, else 32)",
    )
    p.add_argument(
        "--http-header-timeout",
        type=_non_negative(float),
        default=None,
        help="seconds to receive a request head, also the keep-alive idle limit; 0: none "
        "(default: $DYN_HTTP_HEADER_TIMEOUT_SECS, else 30)",
    )
    p.add_argument(
        "--http-body-timeout",
        type=_non_negative(float),
        default=None,
        help="seconds to receive a whole request body; 0: none "
        "(default: $DYN_HTTP_BODY_TIMEOUT_SECS, else 60)",
    )
    p.add_argument(
        "--http-max-connections-per-ip",
        type=_non_negative(int),
        default=None,
        help="open connections allowed per client address; 0: no limit; raise it behind a "
        "proxy, whose address every request then has (default: "
        "$DYN_HTTP_MAX_CONNECTIONS_PER_IP, else 1024)",
    )
    # KV router flags: accepted and passed to the router configuration.
    p.add_argument(
        "--kv-cache-block-size",
        type=int,
        default=None,
        help="KV block size in tokens the router hashes with (default: each model's "
        "registered block size)",
    )
    p.add_argument(
        "--router-temperature",
        type=float,
        default=0.0,
        help="KV mode: 0 picks the lowest-cost worker; above 0 samples workers by cost, "
        "more evenly the higher it is (default: 0.0)",
    )
    p.add_argument(
        "--kv-overlap-score-weight",
        type=float,
        default=1.0,
        help="KV mode: weight of the prompt tokens a worker must still prefill against its "
        "decode load; 0 ignores cached prefixes (default: 1.0)",
    )
    p.add_argument(
        "--router-kv-events",
        dest="use_kv_events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="KV mode: follow the workers' KV cache events; with --no-router-kv-events the "
        "router predicts the caches from its own routing decisions (default: on)",
    )
    p.add_argument(
        "--router-replica-sync",
        action="store_true",
        help="KV mode: share booked load with the other frontends' KV routers of the same "
        "workers, over the event plane (default: off)",
    )
    p.add_argument(
        "--router-reset-states",
        action="store_true",
        help="accepted for compatibility: the reference purges its router state stored in "
        "NATS at start; this frontend stores none, so there is nothing to reset",
    )
    p.add_argument(
        "--router-track-output-blocks",
        action="store_true",
        help="KV mode: book a decode block per block_size generated tokens (default: off)",
    )
    p.add_argument(
        "--router-queue-threshold",
        type=float,
        default=None,
        help="KV mode: queue requests in the router while every worker's prompt tokens "
        "awaiting prefill exceed this fraction of its max_num_batched_tokens (default: off)",
    )
    # Busy thresholds (KV mode): a worker over any of them is skipped; when every worker is
    # over one, requests are rejected with 529.
    p.add_argument(
        "--active-decode-blocks-threshold",
        type=float,
        default=_env("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", float),
        help="KV mode: a worker whose booked decode blocks exceed this fraction (0-1) of its "
        "KV cache is busy (default: $DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD, else none)",
    )
    p.add_argument(
        "--active-prefill-tokens-threshold",
        type=int,
        default=_env("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", int),
        help="KV mode: a worker with more prompt tokens than this waiting for their first "
        "token is busy (default: $DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD, else none)",
    )
    p.add_argument(
        "--active-prefill-tokens-threshold-frac",
        type=float,
        default=_env("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", float),
        help="KV mode: the same, as a fraction of the worker's max_num_batched_tokens "
        "(default: $DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC, else none)",
    )
    p.add_argument(
        "--enable-anthropic-api",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) "
        "(default: $DYN_ENABLE_ANTHROPIC_API, else off)",
    )
    p.add_argument(
        "-i",
        "--interactive",
        action="store_true",
        help="chat with the discovered model on the terminal instead of serving HTTP "
        "(default: off)",
    )
    p.add_argument(
        "--kserve-grpc-server",
        action="store_true",
        help="also serve the KServe v2 gRPC API (on --grpc-port) beside HTTP (default: off)",
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=int(os.environ.get("DYN_GRPC_PORT", "8787")),
        help="port of the KServe gRPC server (default: $DYN_GRPC_PORT, else 8787)",
    )
    # Parsers of models whose registration names none (docs/design/tool_calling.md).
    p.add_argument(
        "--dyn-tool-call-parser",
        choices=get_tool_parser_names(),
        default=None,
        metavar="NAME",
        help="tool-call parser for models that register none (default: none): "
        + ", ".join(get_tool_parser_names()),
    )
    p.add_argument(
        "--dyn-reasoning-parser",
        choices=get_reasoning_parser_names(),
        default=None,
        metavar="NAME",
        help="reasoning parser for models that register none (default: none): "
        + ", ".join(get_reasoning_parser_names()),
    )
    return p.parse_args(argv)


def _env(name: str, kind: type) -> float | int | None:
    value = os.environ.get(name)
    return kind(value) if value else None


def _non_negative(kind: type, least: float = 0):
    def parse(text: str) -> float | int:
        value = kind(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


#: Flag → the variable the Rust frontend reads it from.
_HTTP_LIMIT_VARS = {
    "http_body_limit_mb": "DYN_HTTP_BODY_LIMIT_MB",
    "http_header_timeout": "DYN_HTTP_HEADER_TIMEOUT_SECS",
    "http_body_timeout": "DYN_HTTP_BODY_TIMEOUT_SECS",
    "http_max_connections_per_ip": "DYN_HTTP_MAX_CONNECTIONS_PER_IP",
}


def _export_http_limits(args: argparse.Namespace) -> None:
    for flag, var in _HTTP_LIMIT_VARS.items():
        value = getattr(args, flag)
        if value is not None:
            os.environ[var] = str(value)


def _parser_config(args: argparse.Namespace) -> ModelRuntimeConfig:
    """The frontend's default parsers, carried by ``EntrypointArgs.runtime_config``."""
    config = ModelRuntimeConfig()
    config.tool_call_parser = args.dyn_tool_call_parser
    config.reasoning_parser = args.dyn_reasoning_parser
    return config


def main(args: argparse.Namespace) -> None:
    """Serve until SIGINT/SIGTERM (graceful shutdown) or, with ``-i``, until the chat ends."""
    backend = args.discovery_backend or default_discovery_backend()
    _export_http_limits(args)
    # No asyncio event loop: nothing here calls back into Python, and the Rust runtime
    # waits for the signals itself (run_inputs_blocking).
    runtime = DistributedRuntime(None, backend, args.request_plane or default_request_plane())
    kv = KvRouterConfig(
        overlap_score_weight=args.kv_overlap_score_weight,
        router_temperature=args.router_temperature,
        use_kv_events=args.use_kv_events,
        router_replica_sync=args.router_replica_sync,
        router_track_output_blocks=args.router_track_output_blocks,
        router_queue_threshold=args.router_queue_threshold,
    )
    router = RouterConfig(
        _MODES[args.router_mode],
        kv,
        active_decode_blocks_threshold=args.active_decode_blocks_threshold,
        active_prefill_tokens_threshold=args.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac=args.active_prefill_tokens_threshold_frac,
    )

    def entry(port: int) -> EntrypointArgs:
        return EntrypointArgs(
            EngineType.Dynamic,
            http_host=args.http_host,
            http_port=port,
            router_config=router,
            kv_cache_block_size=args.kv_cache_block_size,
            namespace=args.namespace,
            migration_limit=args.migration_limit,
            runtime_config=_parser_config(args),
            enable_anthropic_api=args.enable_anthropic_api,
        )

    if args.interactive:
        inputs = [(runtime, "text", entry(args.http_port))]
    else:
        inputs = [(runtime, "http", entry(args.http_port))]
        if args.kserve_grpc_server:
            # The gRPC input listens on its engine's HTTP host/port (as in the reference),
            # so it gets an engine of its own on --grpc-port; both follow the same models.
            inputs.append((runtime, "grpc", entry(args.grpc_port)))
    run_inputs_blocking(inputs)


def _listen_error(args: argparse.Namespace, e: OSError) -> str:
    """One line for a server that cannot listen, naming the flag to change."""
    grpc = args.kserve_grpc_server and f":{args.grpc_port}:" in str(e)
    port_flag, host_flag = (
        ("--grpc-port", "--http-host") if grpc else ("--http-port", "--http-host")
    )
    if e.errno == errno.EADDRINUSE:
        hint = f"another process uses that port: choose a free one with {port_flag}"
    elif e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        hint = f"{host_flag} must be an address of this machine (0.0.0.0: all of them)"
    elif e.errno == errno.EACCES:
        hint = f"ports below 1024 need privileges: choose another with {port_flag}"
    else:
        hint = f"check {host_flag} and {port_flag}"
    message = str(e).removeprefix(f"[Errno {e.errno}] ") if e.errno else str(e)
    return f"python -m dynamo.frontend: error: {message}; {hint}"


def run(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        main(args)
    except OSError as e:
        if "cannot listen on" not in str(e):
            raise
        print(_listen_error(args, e), file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run()
