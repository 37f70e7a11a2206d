"""Model layer: ModelInput/ModelType/WorkerType, ModelRuntimeConfig, ModelDeploymentCard,
MockEngineArgs, lora_name_to_id, fetch_model and the tiny model generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamo._core import (
    MockEngineArgs,
    ModelDeploymentCard,
    ReasoningConfig,
    SglangArgs,
    TrtllmArgs,
)
from dynamo.llm import (
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    fetch_llm,
    fetch_model,
    lora_name_to_id,
)
from dynamo.llm.tiny_model import BOS_TOKEN, EOS_TOKEN, write_tiny_model

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "crates" / "dynamo-llm" / "tests" / "data" / "tiny-model"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# --- enums and flags ------------------------------------------------------------------


def test_model_input_values() -> None:
    assert [int(v) for v in (ModelInput.Text, ModelInput.Tokens, ModelInput.Tensor)] == [1, 2, 3]
    assert ModelInput.Tokens == ModelInput.Tokens
    assert ModelInput.Tokens != ModelInput.Text
    assert repr(ModelInput.Text) == "ModelInput.Text"


def test_worker_type_values_and_names() -> None:
    expected = {
        WorkerType.Prefill: (1, "prefill"),
        WorkerType.Decode: (2, "decode"),
        WorkerType.Encode: (3, "encode"),
        WorkerType.Aggregated: (4, "aggregated"),
    }
    for w, (value, name) in expected.items():
        assert int(w) == value
        assert str(w) == name
    assert repr(WorkerType.Prefill) == "WorkerType.Prefill"
    assert len({WorkerType.Prefill, WorkerType.Prefill, WorkerType.Decode}) == 2


def test_model_type_flags() -> None:
    both = ModelType.Chat | ModelType.Completions
    assert str(both) == "chat,completions"
    assert both.supports_chat() and both.supports_completions()
    assert not both.supports_embedding()
    assert both == ModelType.Completions | ModelType.Chat
    assert both != ModelType.Chat
    assert hash(both) == hash(ModelType.Chat | ModelType.Completions)
    assert str(ModelType.Empty) == ""
    assert str(ModelType.TensorBased) == "tensor"
    assert ModelType.Embedding.supports_embedding()
    assert ModelType.Classify.supports_classify() and ModelType.Pooling.supports_pooling()
    assert not ModelType.Prefill.supports_chat()


# --- runtime config ---------------------------------------------------------------------


def test_runtime_config_defaults() -> None:
    c = ModelRuntimeConfig()
    assert c.context_length is None and c.total_kv_blocks is None
    assert c.data_parallel_size == 1 and c.data_parallel_start_rank == 0
    assert c.exclude_tools_when_tool_choice_none is True
    assert c.taints == set() and c.runtime_data == {} and c.topology_domains == {}
    assert c.bootstrap_host is None and c.bootstrap_port is None
    c.validate()


def test_runtime_config_setters_validate() -> None:
    c = ModelRuntimeConfig()
    c.total_kv_blocks = 100
    c.max_num_seqs = 8
    c.tokenizer_backend = "fastokens"
    assert (c.total_kv_blocks, c.max_num_seqs, c.tokenizer_backend) == (100, 8, "fastokens")
    with pytest.raises(ValueError, match="tokenizer backend"):
        c.tokenizer_backend = "bad"
    c.kv_transfer_enforcement = "required"
    assert c.kv_transfer_enforcement == "required"
    c.kv_transfer_enforcement = ""
    assert c.kv_transfer_enforcement is None
    with pytest.raises(ValueError, match="required"):
        c.kv_transfer_enforcement = "sometimes"
    with pytest.raises(ValueError, match="data_parallel_size"):
        c.data_parallel_size = 0
    with pytest.raises(ValueError, match="reserved"):
        c.taints = {"dynamo.topology/rack"}
    c.taints = {"gpu:h100"}
    assert c.taints == {"gpu:h100"}
    for setter, bad in [
        (c.set_structural_tag_mode, "maybe"),
        (c.set_structural_tag_scope, "never"),
        (c.set_structural_tag_schema, "loose"),
    ]:
        with pytest.raises(ValueError):
            setter(bad)
    c.set_structural_tag_mode("on")
    c.set_disaggregated_endpoint("10.0.0.1", 9000)
    assert (c.bootstrap_host, c.bootstrap_port) == ("10.0.0.1", 9000)


def test_engine_specific_values_round_trip_as_json() -> None:
    c = ModelRuntimeConfig()
    c.set_engine_specific("layout", '{"a": [1, 2]}')
    c.set_engine_specific("role", {"name": "leader"})
    assert c.get_engine_specific("layout") == '{"a":[1,2]}'
    assert json.loads(c.get_engine_specific("role") or "null") == {"name": "leader"}
    assert c.get_engine_specific("missing") is None
    assert c.runtime_data == {"layout": '{"a":[1,2]}', "role": '{"name":"leader"}'}
    with pytest.raises(ValueError, match="invalid JSON"):
        c.set_engine_specific("bad", "{nope")


# --- model deployment card ---------------------------------------------------------------


def test_card_from_generated_tiny_model(tiny_model: Path) -> None:
    card = ModelDeploymentCard.load(tiny_model, "tiny")
    assert card.name() == "tiny"
    assert card.local_dir() == str(tiny_model)
    assert card.model_type() == ModelType.Empty
    assert isinstance(card.runtime_config(), dict)
    raw = json.loads(card.to_json_str())
    assert raw["context_length"] == 8192
    assert raw["tokenizer"]["hf_tokenizer_json"]["checksum"].startswith("blake3:")
    back = ModelDeploymentCard.from_json_str(card.to_json_str())
    assert back == card
    assert back.mdcsum() == card.mdcsum()


def test_card_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        ModelDeploymentCard.load(missing)
    with pytest.raises(ValueError, match=r"config\.json"):
        ModelDeploymentCard.load(tmp_path)
    with pytest.raises(ValueError, match="malformed model deployment card"):
        ModelDeploymentCard.from_json_str("{")


# --- functions --------------------------------------------------------------------------


def test_lora_name_to_id_matches_the_reference() -> None:
    # Values observed from the reference implementation.
    assert lora_name_to_id("my-lora") == 868637996
    assert lora_name_to_id("a") == 1500095571
    assert lora_name_to_id("") == 1979294118
    assert all(0 <= lora_name_to_id(f"adapter-{i}") < 2**31 for i in range(100))


async def test_fetch_model_local_and_offline_cache(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fetch_llm is fetch_model
    assert await fetch_model(str(tiny_model)) == str(tiny_model)
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert await fetch_model("hf://acme/tiny", ignore_weights=True) == str(snapshot)
    with pytest.raises(FileNotFoundError, match="models--acme--absent"):
        await fetch_model("acme/absent")


# --- mocker arguments ----------------------------------------------------------------------


def test_mock_engine_args_defaults() -> None:
    a = MockEngineArgs()
    assert (a.block_size, a.num_gpu_blocks) == (64, 16384)
    assert (a.max_num_seqs, a.max_num_batched_tokens) == (256, 8192)
    assert a.engine_type == "vllm" and a.worker_type == "aggregated"
    assert a.enable_prefix_caching and a.dp_size == 1 and a.max_model_len is None
    assert a.aic_mtp_seed == 42 and a.handoff_session_timeout_ms == 300000
    assert a.kv_transfer_timing_mode == "full_prompt"
    assert not a.is_prefill() and not a.is_decode()
    assert a.unsupported_in_use() == []
    assert MockEngineArgs.from_json("{}") == a
    assert MockEngineArgs.from_json(a.to_json()) == a


def test_mock_engine_args_values_and_overrides() -> None:
    a = MockEngineArgs(block_size=16, num_gpu_blocks=128, speedup_ratio=10.0, worker_type="decode")
    assert (a.block_size, a.num_gpu_blocks, a.is_decode()) == (16, 128, True)
    b = a.with_overrides(num_gpu_blocks=64, worker_type="prefill", aic_backend="vllm")
    assert (b.num_gpu_blocks, b.is_prefill(), b.aic_backend) == (64, True, "vllm")
    assert a.num_gpu_blocks == 128, "with_overrides returns a copy"
    assert b.unsupported_in_use() == ["aic_backend"]
    c = b.copy()
    c.num_gpu_blocks = 32
    c.aic_backend = None
    assert (b.num_gpu_blocks, c.num_gpu_blocks, c.aic_backend) == (64, 32, None)
    assert c.unsupported_in_use() == []
    d = MockEngineArgs(
        reasoning=ReasoningConfig(5, 6, 0.25),
        sglang=SglangArgs(page_size=16),
        trtllm=TrtllmArgs("max_utilization"),
    )
    assert d.unsupported_in_use() == ["reasoning", "sglang", "trtllm"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"engine_type": "tensorrt"}, "engine_type"),
        ({"speedup_ratio": 0.0}, "speedup_ratio"),
        ({"worker_type": "encoder"}, "encoder"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ],
)
def test_mock_engine_args_invalid_values(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MockEngineArgs(**kwargs)


def test_mock_engine_args_from_json_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="no_such_option"):
        MockEngineArgs.from_json('{"no_such_option": 1}')
    with pytest.raises(ValueError, match="thinking_ratio"):
        ReasoningConfig(1, 2, 1.5)


# --- tiny model generator ---------------------------------------------------------------------


def test_tiny_model_is_deterministic_and_complete(tiny_model: Path, tmp_path: Path) -> None:
    again = write_tiny_model(tmp_path / "again")
    names = sorted(p.name for p in tiny_model.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert (tiny_model / name).read_bytes() == (again / name).read_bytes(), name
    config = json.loads((tiny_model / "config.json").read_text())
    tok_config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert config["max_position_embeddings"] == 8192
    assert (tok_config["bos_token"], tok_config["eos_token"]) == (BOS_TOKEN, EOS_TOKEN)
    assert "add_generation_prompt" in tok_config["chat_template"]


def test_committed_fixture_matches_the_generator(tiny_model: Path) -> None:
    # The Rust tests use the committed copy; it must be what the generator writes.
    for name in (
        "config.json",
        "tokenizer_config.json",
        "generation_config.json",
        "tokenizer.json",
    ):
        assert (FIXTURE / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_tiny_tokenizer_round_trips_text(tiny_model: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    text = "<|im_start|>user\nHello! Grüße 日本語 🙂<|im_end|>"
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id(EOS_TOKEN)
