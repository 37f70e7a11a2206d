# Event-loop side of `dynamo._core.backend.Worker.run` (loaded by crates/dynamo-py/src/backend.rs).
#
# Why Python here: every step of a worker's life is a call into the Python engine object
# (`start`, the optional hooks, `generate`, `cleanup`), awaited on the caller's event loop;
# the steps in between are the project's own public API (`DistributedRuntime`,
# `register_model`, `Endpoint.serve_endpoint`), each a thin call into Rust. Sequencing
# awaits is what Python does natively; doing it from Rust would only add glue.
import asyncio

from dynamo._core import (
    DistributedRuntime,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
)
from dynamo.runtime import (
    _default_discovery_backend,
    _default_request_plane,
    _install_signal_handlers,
)

# `WorkerConfig.endpoint_types` names (comma separated) and the model types they register.
MODEL_TYPES = {
    "chat": ModelType.Chat,
    "completions": ModelType.Completions,
    "embedding": ModelType.Embedding,
    "embeddings": ModelType.Embedding,
    "classify": ModelType.Classify,
    "pooling": ModelType.Pooling,
    "images": ModelType.Images,
    "audios": ModelType.Audios,
    "videos": ModelType.Videos,
    "tensor": ModelType.TensorBased,
    "prefill": ModelType.Prefill,
}

WORKER_TYPES = {
    "Aggregated": WorkerType.Aggregated,
    "Prefill": WorkerType.Prefill,
    "Decode": WorkerType.Decode,
    "Encode": WorkerType.Encode,
}


def model_type(endpoint_types):
    """The ModelType of a comma-separated list; ValueError naming the field otherwise."""
    names = [n.strip().lower() for n in endpoint_types.split(",") if n.strip()]
    if not names:
        raise ValueError("endpoint_types must name at least one endpoint type")
    out = None
    for name in names:
        if name not in MODEL_TYPES:
            raise ValueError(
                f"endpoint_types: unknown endpoint type {name!r} "
                f"(expected one of {', '.join(sorted(MODEL_TYPES))})"
            )
        out = MODEL_TYPES[name] if out is None else out | MODEL_TYPES[name]
    return out


def _runtime_config(config, llm, engine_config):
    rc = ModelRuntimeConfig()
    for field in ("total_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(llm, field)
        if value is not None:
            setattr(rc, field, value)
    if llm.data_parallel_size is not None:
        rc.data_parallel_size = llm.data_parallel_size
    if llm.data_parallel_start_rank is not None:
        rc.data_parallel_start_rank = llm.data_parallel_start_rank
    rc.enable_eagle = llm.enable_eagle
    rc.tool_call_parser = config.tool_call_parser
    rc.reasoning_parser = config.reasoning_parser
    rc.exclude_tools_when_tool_choice_none = config.exclude_tools_when_tool_choice_none
    rc.enable_local_indexer = config.enable_local_indexer
    for key, value in (engine_config.runtime_data or {}).items():
        rc.set_engine_specific(key, value)
    return rc


async def run_worker(engine, config, loop, raw, engine_config_type, llm_type):
    """Start the engine, register its model, serve ``engine.generate`` until shutdown
    (SIGTERM/SIGINT on the main thread, or the runtime's ``shutdown()``), then clean up."""
    del raw  # requests and responses are handed through unchanged either way
    rt_config = config.runtime
    runtime = DistributedRuntime(
        loop,
        (rt_config and rt_config.discovery_backend) or _default_discovery_backend(),
        (rt_config and rt_config.request_plane) or _default_request_plane(),
        event_plane=rt_config and rt_config.event_plane,
    )
    installed = _install_signal_handlers(loop, runtime)
    try:
        endpoint = runtime.endpoint(f"{config.namespace}.{config.component}.{config.endpoint}")
        engine_config = await engine.start(endpoint.connection_id())
        if not isinstance(engine_config, engine_config_type):
            raise TypeError(
                "engine.start() must return a dynamo._core.backend.EngineConfig, "
                f"not {type(engine_config).__name__}"
            )
        llm = engine_config.llm or llm_type()
        await register_model(
            config.model_input,
            model_type(config.endpoint_types),
            endpoint,
            engine_config.model,
            engine_config.served_model_name or config.served_model_name or config.model_name or None,
            worker_type=WORKER_TYPES[config.disaggregation_mode.name],
            context_length=llm.context_length,
            kv_cache_block_size=llm.kv_cache_block_size,
            runtime_config=_runtime_config(config, llm, engine_config),
            custom_template_path=config.custom_jinja_template,
            media_decoder=config.media_decoder,
            media_fetcher=config.media_fetcher,
            max_gpu_lora_count=llm.max_gpu_lora_count,
            model_aliases=list(engine_config.model_aliases) or None,
        )
        ready = getattr(engine, "on_endpoint_ready", None)
        if ready is not None:
            await ready(endpoint)
        await endpoint.serve_endpoint(
            engine.generate,
            metrics_labels=list(config.metrics_labels) or None,
            health_check_payload=config.health_check_payload,
        )
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        cleanup = getattr(engine, "cleanup", None)
        # Also after a failed start, as the reference does.
        if cleanup is not None:
            result = cleanup()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                await result
        runtime.shutdown()
