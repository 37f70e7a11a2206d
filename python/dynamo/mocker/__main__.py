"""``python -m dynamo.mocker``: simulated inference workers that register a model.

Thin argparse over :mod:`dynamo._core`: the flags become a :class:`MockEngineArgs` (engine
settings are defined and validated once, in Rust); each of ``--num-workers`` workers is
``EntrypointArgs(EngineType.Mocker, ...)`` served on ``"dyn://ns.comp.ep"`` with its own
runtime, so each registers as its own instance. ``run_inputs_blocking`` serves them all as
``make_engine`` + ``run_input`` would, in Rust and without an asyncio event loop (the
process does not import :mod:`asyncio`).
"""

from __future__ import annotations

import argparse
import json
import os

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    MediaDecoder,
    MockEngineArgs,
    run_inputs_blocking,
)
from dynamo._env import COMMON_ENVIRONMENT, default_discovery_backend, default_request_plane


def _default_endpoint() -> str:
    return f"dyn://{os.environ.get('DYN_NAMESPACE', 'dynamo')}.backend.generate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dynamo.mocker",
        description="Simulated (GPU-free) inference workers serving a model over Dynamo.",
        epilog=COMMON_ENVIRONMENT
        + "  DYN_SYSTEM_PORT         status server (/health, /live, /metrics) of the first "
        "worker;\n                          worker i serves on this port + i\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model-path",
        required=True,
        help="local model directory (config.json, tokenizer, chat template); required",
    )
    p.add_argument(
        "--model-name", default=None, help="served model name (default: the --model-path)"
    )
    p.add_argument(
        "--endpoint",
        default=_default_endpoint(),
        help="endpoint the workers serve, dyn://NAMESPACE.COMPONENT.ENDPOINT "
        "(default: dyn://$DYN_NAMESPACE.backend.generate, namespace 'dynamo')",
    )
    p.add_argument(
        "--num-workers",
        type=int,
        default=1,
        help="simulated workers in this process, each its own instance (default: 1)",
    )
    p.add_argument(
        "--block-size", type=int, default=None, help="KV cache block size in tokens (default: 64)"
    )
    p.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV cache capacity of each worker, in blocks (default: 16384)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="most sequences a worker schedules at once (default: 256)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="most tokens a worker schedules in one step (default: 8192)",
    )
    p.add_argument(
        "--speedup-ratio",
        type=float,
        default=None,
        help="simulated time runs this many times faster than real time, > 0 (default: 1.0)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse cached prefix blocks across requests (default: on)",
    )
    p.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split long prompts' prefill over several steps (default: on)",
    )
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=None,
        help="data-parallel ranks per worker, each with its own KV cache (default: 1)",
    )
    p.add_argument(
        "--startup-time",
        type=float,
        default=None,
        help="seconds each worker waits before it registers, as a real engine loading "
        "weights would (default: 0)",
    )
    p.add_argument(
        "--extra-engine-args",
        default=None,
        help="JSON object (or a path to a JSON file) of MockEngineArgs fields",
    )
    p.add_argument(
        "--enable-image",
        action="store_true",
        help="register the model with a MediaDecoder that decodes images (default limits), "
        "so the frontend fetches, decodes and hashes image parts for these workers",
    )
    p.add_argument(
        "--zmq-kv-events-ports",
        default=None,
        help="comma-separated ZMQ PUB ports, one per worker: each worker also publishes its KV "
        "events there in the vLLM engine wire format (as the reference's flag)",
    )
    p.add_argument(
        "--zmq-replay-ports",
        default=None,
        help="comma-separated ZMQ ROUTER ports, one per worker, serving recent KV-event "
        "messages for gap recovery (vLLM's replay protocol; needs --zmq-kv-events-ports)",
    )
    p.add_argument(
        "--zmq-kv-events-port",
        type=int,
        default=None,
        help="base ZMQ PUB port: worker i binds port + i (alternative to --zmq-kv-events-ports)",
    )
    p.add_argument(
        "--zmq-replay-port",
        type=int,
        default=None,
        help="base ZMQ replay port: worker i binds port + i",
    )
    p.add_argument(
        "--discovery-backend",
        default=None,
        help="how frontends find the workers: file (shared directory $DYN_FILE_KV), etcd "
        "($ETCD_ENDPOINTS) or mem (this process only) (default: $DYN_DISCOVERY_BACKEND, "
        "else etcd when $ETCD_ENDPOINTS is set, else file)",
    )
    p.add_argument(
        "--request-plane",
        choices=["tcp", "nats"],
        default=None,
        help="how requests reach the workers (default: $DYN_REQUEST_PLANE, else tcp)",
    )
    return p.parse_args(argv)


def engine_args(args: argparse.Namespace) -> MockEngineArgs:
    """The mocker settings: ``--extra-engine-args`` first, explicit flags on top."""
    fields: dict[str, object] = {}
    if args.extra_engine_args:
        text = args.extra_engine_args
        if os.path.isfile(text):
            with open(text) as f:
                text = f.read()
        fields.update(json.loads(text))
    for flag, name in [
        ("block_size", "block_size"),
        ("num_gpu_blocks_override", "num_gpu_blocks"),
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("speedup_ratio", "speedup_ratio"),
        ("enable_prefix_caching", "enable_prefix_caching"),
        ("enable_chunked_prefill", "enable_chunked_prefill"),
        ("data_parallel_size", "dp_size"),
        ("startup_time", "startup_time"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            fields[name] = value
    return MockEngineArgs(**fields)


def _ports(listed: str | None, base: int | None, n: int, flag: str) -> list[int | None]:
    """Per-worker ports: a comma-separated list (one per worker) or a base port (worker i:
    base + i)."""
    if listed:
        ports = [int(p) for p in listed.split(",") if p.strip()]
        if len(ports) != n:
            raise SystemExit(f"{flag} lists {len(ports)} ports for {n} workers")
        return list(ports)
    if base is not None:
        return [base + i for i in range(n)]
    return [None] * n


def worker_engine_args(args: argparse.Namespace, mock: MockEngineArgs) -> list[MockEngineArgs]:
    """Each worker's settings: its own ZMQ ports. Ports given only in the engine arguments
    (``zmq_kv_events_port`` / ``zmq_replay_port``) are base ports: worker i binds base + i."""
    n = args.num_workers
    pub = _ports(
        args.zmq_kv_events_ports,
        args.zmq_kv_events_port,
        n,
        "--zmq-kv-events-ports",
    )
    replay = _ports(args.zmq_replay_ports, args.zmq_replay_port, n, "--zmq-replay-ports")
    engine = json.loads(mock.to_json())
    out = []
    for i in range(n):
        p = pub[i]
        if p is None and engine.get("zmq_kv_events_port") is not None:
            p = int(engine["zmq_kv_events_port"]) + i
        r = replay[i]
        if r is None and engine.get("zmq_replay_port") is not None:
            r = int(engine["zmq_replay_port"]) + i
        if r is not None and p is None:
            raise SystemExit("a ZMQ replay port needs a ZMQ KV-events port")
        out.append(mock.with_overrides(zmq_kv_events_port=p, zmq_replay_port=r))
    return out


def main(args: argparse.Namespace) -> None:
    """Serve every worker until SIGINT/SIGTERM (graceful shutdown of all of them)."""
    backend = args.discovery_backend or default_discovery_backend()
    per_worker = worker_engine_args(args, engine_args(args))
    plane = args.request_plane or default_request_plane()
    # No asyncio event loop: the mocker engine is Rust, and the Rust runtime waits for the
    # signals itself (run_inputs_blocking).
    inputs = []
    # Each worker is a runtime of its own, and each runtime with DYN_SYSTEM_PORT serves a
    # status server: worker i takes port + i (as the ZMQ base ports do), so that more than
    # one worker does not fail on a taken port. 0 (a free port each) and -1 (off) stay.
    system_port = os.environ.get("DYN_SYSTEM_PORT", "").strip()
    for i, mock in enumerate(per_worker):
        if system_port.isdigit() and int(system_port) > 0:
            os.environ["DYN_SYSTEM_PORT"] = str(int(system_port) + i)
        decoder = None
        if args.enable_image:
            decoder = MediaDecoder()
            decoder.enable_image({})
        entry = EntrypointArgs(
            EngineType.Mocker,
            model_path=args.model_path,
            model_name=args.model_name,
            mocker_engine_args=mock,
            media_decoder=decoder,
        )
        inputs.append((DistributedRuntime(None, backend, plane), args.endpoint, entry))
    if system_port:
        os.environ["DYN_SYSTEM_PORT"] = system_port
    run_inputs_blocking(inputs)


def run(argv: list[str] | None = None) -> None:
    main(parse_args(argv))


if __name__ == "__main__":
    run()
