"""KvRouterConfig, RouterConfig, RouterMode, RoutingConstraints and AicPerfConfig."""

from __future__ import annotations

import math

import pytest

from dynamo._core import (
    AicPerfConfig,
    KvRouterConfig,
    RouterConfig,
    RouterMode,
    RoutingConstraints,
)


def test_constructor_defaults_are_the_rust_defaults() -> None:
    # from_json("{}") fills every field from the Rust `Default`; the Python signature
    # repeats those values, so the two must agree.
    assert KvRouterConfig() == KvRouterConfig.from_json("{}")
    assert repr(KvRouterConfig()) == repr(KvRouterConfig.from_json("{}"))


def test_documented_defaults() -> None:
    c = KvRouterConfig()
    assert c.overlap_score_credit == 1.0
    assert c.overlap_score_credit_decay == 0.0
    assert c.prefill_load_scale == 1.0
    assert c.decode_active_request_weight == 0.0
    assert c.overlap_score_weight == 1.0
    text = repr(c)
    for fragment in [
        '"host_cache_hit_weight":0.75',
        '"disk_cache_hit_weight":0.25',
        '"router_ttl_secs":120.0',
        '"router_event_threads":4',
        '"router_queue_policy":"fcfs"',
        '"router_tracking_hash":"public-xxh3-v1"',
        '"router_queue_threshold":null',
    ]:
        assert fragment in text


def test_at_most_five_positional_arguments() -> None:
    KvRouterConfig(None, 0.75, 0.25, 0.0, True)
    with pytest.raises(TypeError):
        KvRouterConfig(None, 0.75, 0.25, 0.0, True, False)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"decode_active_request_weight": -1.0}, "decode_active_request_weight"),
        ({"decode_active_request_weight": math.nan}, "decode_active_request_weight"),
        ({"decode_active_request_weight": math.inf}, "decode_active_request_weight"),
        ({"overlap_score_credit": -0.1}, "overlap_score_credit"),
        ({"router_temperature": -1.0}, "router_temperature"),
        ({"host_cache_hit_weight": 1.5}, "host_cache_hit_weight"),
        ({"disk_cache_hit_weight": -0.5}, "disk_cache_hit_weight"),
        ({"router_event_threads": 0}, "router_event_threads"),
        ({"router_ttl_secs": 0.0}, "router_ttl_secs"),
        ({"router_queue_policy": "random"}, "router_queue_policy"),
        ({"router_prefill_load_model": "magic"}, "router_prefill_load_model"),
        ({"shared_cache_type": "redis"}, "shared_cache_type"),
        ({"router_tracking_hash": "md5"}, "router_tracking_hash"),
        (
            {"router_track_output_blocks": True, "router_track_active_blocks": False},
            "router_track_output_blocks",
        ),
        ({"use_remote_indexer": True, "serve_indexer": True}, "serve_indexer"),
        ({"router_predicted_ttl_secs": 5.0, "use_kv_events": False}, "router_predicted_ttl"),
        ({"router_tracking_hash": "keyed-xxh3-v1"}, "router_tracking_key_file"),
        ({"router_tracking_key_id": "k"}, "router_tracking_key_file"),
        (
            {"router_prefill_load_model": "aic", "router_queue_policy": "wspt"},
            "router_prefill_load_model",
        ),
    ],
)
def test_invalid_values_raise_value_error_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KvRouterConfig(**kwargs)


def test_overlap_score_weight_is_a_deprecated_alias() -> None:
    c = KvRouterConfig(overlap_score_weight=2.0)
    assert (c.prefill_load_scale, c.overlap_score_credit) == (2.0, 1.0)
    zero = KvRouterConfig(overlap_score_weight=0.0)
    assert (zero.prefill_load_scale, zero.overlap_score_credit) == (0.0, 0.0)
    c.overlap_score_weight = 0.0
    assert (c.prefill_load_scale, c.overlap_score_credit) == (0.0, 0.0)


def test_setters_revalidate_and_keep_the_old_value() -> None:
    c = KvRouterConfig()
    c.overlap_score_credit = 0.5
    assert c.overlap_score_credit == 0.5
    with pytest.raises(ValueError, match="overlap_score_credit"):
        c.overlap_score_credit = -1.0
    assert c.overlap_score_credit == 0.5
    with pytest.raises(AttributeError):
        c.decode_active_request_weight = 1.0  # type: ignore[misc]


def test_with_overrides_and_copy_do_not_touch_the_original() -> None:
    c = KvRouterConfig()
    d = c.with_overrides(overlap_score_credit=0.5, decode_active_request_weight=2.0)
    assert (d.overlap_score_credit, d.decode_active_request_weight) == (0.5, 2.0)
    assert (c.overlap_score_credit, c.decode_active_request_weight) == (1.0, 0.0)
    with pytest.raises(ValueError, match="decode_active_request_weight"):
        c.with_overrides(decode_active_request_weight=-1.0)
    e = c.copy()
    assert e == c and e is not c
    e.prefill_load_scale = 3.0
    assert c.prefill_load_scale == 1.0


def test_from_json() -> None:
    c = KvRouterConfig.from_json('{"router_temperature": 0.5, "router_queue_policy": "wspt"}')
    assert '"router_temperature":0.5' in repr(c)
    with pytest.raises(ValueError, match="no_such_field"):
        KvRouterConfig.from_json('{"no_such_field": 1}')
    with pytest.raises(ValueError, match="invalid JSON"):
        KvRouterConfig.from_json("{not json")
    with pytest.raises(ValueError, match="router_temperature"):
        KvRouterConfig.from_json('{"router_temperature": -2}')


def test_router_mode_enum() -> None:
    expected = {
        "RoundRobin": 0,
        "Random": 1,
        "PowerOfTwoChoices": 2,
        "KV": 3,
        "Direct": 4,
        "LeastLoaded": 5,
        "DeviceAwareWeighted": 6,
    }
    for name, value in expected.items():
        mode = getattr(RouterMode, name)
        assert int(mode) == value
        assert repr(mode) == f"RouterMode.{name}"
    assert RouterMode.KV == RouterMode.KV
    assert RouterMode.KV != RouterMode.Random
    assert len({RouterMode.KV, RouterMode.KV, RouterMode.Random}) == 2


def test_router_config() -> None:
    r = RouterConfig(RouterMode.KV)
    assert r.router_mode == RouterMode.KV
    assert r.kv_router_config == KvRouterConfig()
    r.router_mode = RouterMode.Random
    assert r.router_mode == RouterMode.Random
    cfg = KvRouterConfig(router_temperature=0.3)
    assert RouterConfig(RouterMode.KV, cfg).kv_router_config == cfg
    RouterConfig(RouterMode.KV, active_decode_blocks_threshold=0.9, enforce_disagg=True)
    with pytest.raises(ValueError, match="active_decode_blocks_threshold"):
        RouterConfig(RouterMode.KV, active_decode_blocks_threshold=1.5)
    with pytest.raises(ValueError, match="active_prefill_tokens_threshold_frac"):
        RouterConfig(RouterMode.KV, active_prefill_tokens_threshold_frac=-1.0)
    with pytest.raises(OverflowError):
        RouterConfig(RouterMode.KV, active_prefill_tokens_threshold=-5)


def test_routing_constraints() -> None:
    c = RoutingConstraints(required_taints={"gpu"}, preferred_taints={"fast": 1.5})
    assert c.required_taints == {"gpu"}
    assert c.preferred_taints == {"fast": 1.5}
    empty = RoutingConstraints()
    assert (empty.required_taints, empty.preferred_taints) == (set(), {})
    empty.required_taints = {"a", "b"}
    assert empty.required_taints == {"a", "b"}
    with pytest.raises(ValueError, match="fast"):
        RoutingConstraints(preferred_taints={"fast": math.nan})


def test_aic_perf_config_validation() -> None:
    AicPerfConfig("vllm", "h200_sxm", "/models/x", aic_nextn=3)
    with pytest.raises(ValueError, match="aic_backend"):
        AicPerfConfig("", "h200_sxm", "/models/x")
    with pytest.raises(ValueError, match="aic_tp_size"):
        AicPerfConfig("vllm", "h200_sxm", "/models/x", aic_tp_size=0)
    with pytest.raises(ValueError, match="aic_nextn"):
        AicPerfConfig("vllm", "h200_sxm", "/models/x", aic_nextn=6)
    with pytest.raises(ValueError, match="aic_moe_ep_size"):
        AicPerfConfig("vllm", "h200_sxm", "/models/x", aic_moe_ep_size=0)
