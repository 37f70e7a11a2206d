"""Drop-in behaviour of ``EntrypointArgs(mocker_engine_args=...)``: besides a
``MockEngineArgs``, the reference 1.6.x mapping form ``{"engine": {...}, "dynamo": {...}}``.

Observed with the reference wheel ``ai-dynamo-runtime==1.6.1`` (it has no ``MockEngineArgs``
class; ``EntrypointArgs``' stub types the argument ``Optional[Mapping[str, Any]]``, "canonical
mocker configuration mapping with an ``engine`` section and optional ``dynamo`` runtime
options"), through its ``_normalize_mocker_config``:

* ``{"engine": {}}`` normalises to ``engine`` = ``backend`` ("vllm"), ``num_gpu_blocks``,
  ``block_size``, ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``prefill_schedule_interval``, ``prefill_decode_interval``, ``enable_prefix_caching``,
  ``enable_chunked_prefill``, ``speedup_ratio``, ``decode_speedup_ratio``, ``aic_nextn``,
  ``aic_nextn_accept_rates``, ``aic_mtp_seed``, ``worker_type``, ``preemption_mode``,
  ``emit_kv_events``, ``emit_kv_token_ids``, ``kv_transfer_bytes_per_token``,
  ``kv_transfer_bandwidth``, ``kv_transfer_timing_mode``, ``timing_model``, ``sglang``,
  ``trtllm``; top level ``dp_size``, ``tensor_parallel_size``, ``startup_time``,
  ``num_gpu_blocks_is_explicit``, ``gpu_memory_utilization``, ``mem_fraction_static``,
  ``free_gpu_memory_fraction``, ``cuda_graph_reserved_bytes``; and ``dynamo`` =
  ``enable_local_indexer``, ``bootstrap_port``, ``handoff_session_timeout_ms``,
  ``reasoning``, ``response_replay_trace_path``, ``zmq_kv_events_port``,
  ``zmq_replay_port``, ``router_queue_policy`` (the worker's Dynamo-side options);
* unknown keys raise ``ValueError``: ``invalid engine launch config: engine.bogus: unknown
  field `bogus`, expected one of ...``; ``bogus: unknown field `bogus`...`` (dynamo
  section); ``invalid engine launch config: zzz: unknown field `zzz`...`` (top level);
* a bad value: ``ValueError ... engine.block_size: invalid type: string "x", expected usize``.

Ours maps the sections onto the flat ``MockEngineArgs`` form (``engine.backend`` is
``engine_type``) and validates with the same deserialiser; the error names the key with its
section (``engine.bogus``, ``dynamo.nope``).
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

import pytest
from runtime_util import unique_ns
from services import free_port

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    MockEngineArgs,
    make_engine,
    run_input,
)
from dynamo.llm.tiny_model import write_tiny_model


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_mapping_form_configures_the_mocker(tmp_path) -> None:
    model = write_tiny_model(tmp_path / "tiny")
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    port = free_port()
    args = EntrypointArgs(
        EngineType.Mocker,
        model_path=str(model),
        model_name="tiny",
        namespace=unique_ns(),
        http_host="127.0.0.1",
        http_port=port,
        mocker_engine_args={
            "engine": {"backend": "vllm", "max_model_len": 8, "speedup_ratio": 100.0},
            "dynamo": {"enable_local_indexer": False, "bootstrap_port": None},
            "dp_size": 1,
        },
    )
    engine = await make_engine(rt, args)
    task = asyncio.ensure_future(run_input(rt, "http", engine))
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        long_prompt = {
            "model": "tiny",
            "prompt": "hello there how are you my friend",
            "max_tokens": 4,
        }
        for _ in range(200):
            try:
                code, doc = await asyncio.to_thread(_post, url, long_prompt)
                break
            except OSError:
                await asyncio.sleep(0.05)
        # engine.max_model_len reached the mocker: the long prompt is refused, a short one not.
        assert code == 400 and "max_model_len 8" in doc["error"]["message"], doc
        short = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        assert (await asyncio.to_thread(_post, url, short))[0] == 200
    finally:
        rt.shutdown()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"engine": {"bogus": 1}}, "engine.bogus"),
        ({"engine": {}, "dynamo": {"nope": True}}, "dynamo.nope"),
        ({"engine": {}, "zzz": {}}, "zzz"),
        ({"engine": {"block_size": "x"}}, "block_size"),
        ({"engine": {"backend": "nope"}}, "nope"),
    ],
)
def test_mapping_form_rejects_unknown_keys_naming_them(config: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        EntrypointArgs(EngineType.Mocker, mocker_engine_args=config)


def test_both_forms_are_accepted_and_other_types_are_not(tmp_path) -> None:
    EntrypointArgs(EngineType.Mocker, mocker_engine_args=MockEngineArgs(block_size=16))
    EntrypointArgs(EngineType.Mocker, mocker_engine_args={"engine": {"block_size": 16}})
    EntrypointArgs(EngineType.Mocker, mocker_engine_args={})
    # A JSON text (or an ``extra_engine_args`` file) in the mapping form is recognised too.
    assert MockEngineArgs.from_json('{"engine": {"block_size": 32}}').block_size == 32
    path = tmp_path / "mocker.json"
    path.write_text(json.dumps({"engine": {"bogus": 1}}))
    with pytest.raises(ValueError, match=r"engine\.bogus"):
        EntrypointArgs(EngineType.Mocker, extra_engine_args=str(path))
    with pytest.raises(TypeError, match="MockEngineArgs or a mapping"):
        EntrypointArgs(EngineType.Mocker, mocker_engine_args=[("engine", {})])


def test_mock_engine_args_properties_read_and_write_through_the_core() -> None:
    """The serde-based properties keep MockEngineArgs' Python surface."""
    a = MockEngineArgs(block_size=16, aic_tp_size=2, response_replay_trace_path="/tmp/trace")
    assert (a.block_size, a.aic_tp_size, a.max_num_seqs) == (16, 2, 256)
    assert str(a.response_replay_trace_path) == "/tmp/trace"
    assert a.bootstrap_port is None and a.enable_g4_storage is False
    a.aic_tp_size = None
    a.num_gpu_blocks = 99
    a.enable_prefix_caching = False
    assert (a.aic_tp_size, a.num_gpu_blocks, a.enable_prefix_caching) == (None, 99, False)
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        a.num_gpu_blocks = 0
    with pytest.raises(AttributeError):
        a.block_size = 8  # read-only, as in the reference
