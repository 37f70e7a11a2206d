//! The router configuration of the selection service from the `DYN_ROUTER_*` environment,
//! as the reference's `SelectionService` reads it (names found in the 1.6.1 binary and
//! checked black-box with `scripts/observe_selection_decay_reference.py env`).
//!
//! Unset or empty variables keep the default. Unlike the reference (which ignores a value
//! it cannot parse and raises a bare `Exception` without the variable for one out of
//! range), every bad value is an error naming the variable and its value.

use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_runtime::config::parse_bool;

/// How a variable sets its field.
#[derive(Clone, Copy)]
enum Kind {
    Float(fn(&mut KvRouterConfig, f64)),
    Bool(fn(&mut KvRouterConfig, bool)),
    Uint(fn(&mut KvRouterConfig, u32)),
    Text(fn(&mut KvRouterConfig, &str) -> Result<(), String>),
}

/// `(variable, field it sets, how)`. The deprecated overlap weight sets
/// `prefill_load_scale` (and zeroes the credit when 0), as `KvRouterConfig`'s keyword does.
const VARS: &[(&str, &str, Kind)] = &[
    (
        "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT",
        "prefill_load_scale",
        Kind::Float(KvRouterConfig::apply_overlap_score_weight),
    ),
    (
        "DYN_OVERLAP_SCORE_WEIGHT",
        "prefill_load_scale",
        Kind::Float(KvRouterConfig::apply_overlap_score_weight),
    ),
    (
        "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT",
        "overlap_score_credit",
        Kind::Float(|c, v| c.overlap_score_credit = v),
    ),
    (
        "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY",
        "overlap_score_credit_decay",
        Kind::Float(|c, v| c.overlap_score_credit_decay = v),
    ),
    (
        "DYN_ROUTER_PREFILL_LOAD_SCALE",
        "prefill_load_scale",
        Kind::Float(|c, v| c.prefill_load_scale = v),
    ),
    (
        "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT",
        "decode_active_request_weight",
        Kind::Float(|c, v| c.decode_active_request_weight = v),
    ),
    (
        "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT",
        "host_cache_hit_weight",
        Kind::Float(|c, v| c.host_cache_hit_weight = v),
    ),
    (
        "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT",
        "disk_cache_hit_weight",
        Kind::Float(|c, v| c.disk_cache_hit_weight = v),
    ),
    (
        "DYN_ROUTER_TEMPERATURE",
        "router_temperature",
        Kind::Float(|c, v| c.router_temperature = v),
    ),
    (
        "DYN_ROUTER_TTL_SECS",
        "router_ttl_secs",
        Kind::Float(|c, v| c.router_ttl_secs = v),
    ),
    (
        "DYN_ROUTER_QUEUE_THRESHOLD",
        "router_queue_threshold",
        Kind::Float(|c, v| c.router_queue_threshold = Some(v)),
    ),
    (
        "DYN_ROUTER_PREDICTED_TTL_SECS",
        "router_predicted_ttl_secs",
        Kind::Float(|c, v| c.router_predicted_ttl_secs = Some(v)),
    ),
    (
        "DYN_SHARED_CACHE_MULTIPLIER",
        "shared_cache_multiplier",
        Kind::Float(|c, v| c.shared_cache_multiplier = v),
    ),
    (
        "DYN_ROUTER_USE_KV_EVENTS",
        "use_kv_events",
        Kind::Bool(|c, v| c.use_kv_events = v),
    ),
    (
        "DYN_ROUTER_REPLICA_SYNC",
        "router_replica_sync",
        Kind::Bool(|c, v| c.router_replica_sync = v),
    ),
    (
        "DYN_ROUTER_TRACK_ACTIVE_BLOCKS",
        "router_track_active_blocks",
        Kind::Bool(|c, v| c.router_track_active_blocks = v),
    ),
    (
        "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
        "router_track_output_blocks",
        Kind::Bool(|c, v| c.router_track_output_blocks = v),
    ),
    (
        "DYN_ROUTER_ASSUME_KV_REUSE",
        "router_assume_kv_reuse",
        Kind::Bool(|c, v| c.router_assume_kv_reuse = v),
    ),
    (
        "DYN_ROUTER_TRACK_PREFILL_TOKENS",
        "router_track_prefill_tokens",
        Kind::Bool(|c, v| c.router_track_prefill_tokens = v),
    ),
    (
        "DYN_USE_REMOTE_INDEXER",
        "use_remote_indexer",
        Kind::Bool(|c, v| c.use_remote_indexer = v),
    ),
    (
        "DYN_ROUTER_EVENT_THREADS",
        "router_event_threads",
        Kind::Uint(|c, v| c.router_event_threads = v),
    ),
    (
        "DYN_ROUTER_QUEUE_POLICY",
        "router_queue_policy",
        Kind::Text(|c, v| {
            c.router_queue_policy = v.parse().map_err(|e| format!("{e}"))?;
            Ok(())
        }),
    ),
    (
        "DYN_ROUTER_TRACKING_HASH",
        "router_tracking_hash",
        Kind::Text(|c, v| {
            c.router_tracking_hash = v.parse().map_err(|e| format!("{e}"))?;
            Ok(())
        }),
    ),
    (
        "DYN_ROUTER_PREFILL_LOAD_MODEL",
        "router_prefill_load_model",
        Kind::Text(|c, v| {
            c.router_prefill_load_model = v.parse().map_err(|e| format!("{e}"))?;
            Ok(())
        }),
    ),
    (
        "DYN_SHARED_CACHE_TYPE",
        "shared_cache_type",
        Kind::Text(|c, v| {
            c.shared_cache_type = v.parse().map_err(|e| format!("{e}"))?;
            Ok(())
        }),
    ),
    (
        "DYN_ROUTER_TRACKING_KEY_FILE",
        "router_tracking_key_file",
        Kind::Text(|c, v| {
            c.router_tracking_key_file = Some(v.to_owned());
            Ok(())
        }),
    ),
    (
        "DYN_ROUTER_TRACKING_KEY_ID",
        "router_tracking_key_id",
        Kind::Text(|c, v| {
            c.router_tracking_key_id = Some(v.to_owned());
            Ok(())
        }),
    ),
    (
        "DYN_ROUTER_POLICY_CONFIG",
        "router_policy_config",
        Kind::Text(|c, v| {
            c.router_policy_config = Some(v.to_owned());
            Ok(())
        }),
    ),
];

/// The variables read, in the order they apply.
pub fn router_env_vars() -> impl Iterator<Item = &'static str> {
    VARS.iter().map(|(var, _, _)| *var)
}

/// `base` with the `DYN_ROUTER_*` variables of `lookup` applied, then validated.
///
/// # Errors
/// A message naming the variable: a value that does not parse (`DYN_ROUTER_TEMPERATURE="x":
/// not a number`), or one the configuration refuses (`DYN_ROUTER_TEMPERATURE="-1": invalid
/// router_temperature: ...`).
pub fn router_config_from(
    mut base: KvRouterConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<KvRouterConfig, String> {
    let mut applied: Vec<(&str, &str, String)> = Vec::new();
    for &(var, field, kind) in VARS {
        let Some(raw) = lookup(var) else { continue };
        let value = raw.trim();
        if value.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("{var}={raw:?}: {why}");
        match kind {
            Kind::Float(set) => {
                let v: f64 = value.parse().map_err(|_| bad("not a number"))?;
                if !v.is_finite() {
                    return Err(bad("must be finite"));
                }
                set(&mut base, v);
            }
            Kind::Bool(set) => {
                let v = parse_bool(value)
                    .ok_or_else(|| bad("expected true/false (or 1/0, yes/no, on/off)"))?;
                set(&mut base, v);
            }
            Kind::Uint(set) => {
                let v: u32 = value
                    .parse()
                    .map_err(|_| bad("not a non-negative integer"))?;
                set(&mut base, v);
            }
            Kind::Text(set) => set(&mut base, value).map_err(|e| bad(&e))?,
        }
        applied.push((var, field, raw));
    }
    if let Err(e) = base.validate() {
        let text = e.to_string();
        // Name the variable that set the offending field (the last one applied wins).
        let culprit = applied
            .iter()
            .rev()
            .find(|(_, field, _)| text.contains(field));
        return Err(match culprit {
            Some((var, _, raw)) => format!("{var}={raw:?}: {text}"),
            None => format!("router configuration from the DYN_ROUTER_* environment: {text}"),
        });
    }
    Ok(base)
}

/// [`router_config_from`] over the process environment.
///
/// # Errors
/// As [`router_config_from`].
pub fn router_config_from_env(base: KvRouterConfig) -> Result<KvRouterConfig, String> {
    router_config_from(base, |var| std::env::var(var).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<KvRouterConfig, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        router_config_from(KvRouterConfig::default(), |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn values_apply_and_bad_ones_name_the_variable() {
        let c = with(&[
            ("DYN_ROUTER_TEMPERATURE", "0.5"),
            ("DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "2"),
            ("DYN_ROUTER_ASSUME_KV_REUSE", "false"),
            ("DYN_ROUTER_QUEUE_POLICY", "wspt"),
            ("DYN_ROUTER_EVENT_THREADS", ""),
        ])
        .expect("valid");
        assert_eq!(c.router_temperature, 0.5);
        assert_eq!(c.overlap_score_credit, 2.0);
        assert!(!c.router_assume_kv_reuse);
        assert_eq!(c.router_queue_policy.as_str(), "wspt");
        assert_eq!(
            c.router_event_threads,
            KvRouterConfig::default().router_event_threads
        );
        let c = with(&[("DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "0")]).expect("valid");
        assert_eq!((c.prefill_load_scale, c.overlap_score_credit), (0.0, 0.0));

        for (var, value, want) in [
            ("DYN_ROUTER_TEMPERATURE", "abc", "not a number"),
            ("DYN_ROUTER_TEMPERATURE", "-1", "router_temperature"),
            ("DYN_ROUTER_TEMPERATURE", "inf", "finite"),
            (
                "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
                "maybe",
                "expected true/false",
            ),
            ("DYN_ROUTER_EVENT_THREADS", "-2", "non-negative integer"),
            ("DYN_ROUTER_EVENT_THREADS", "0", "router_event_threads"),
            ("DYN_ROUTER_QUEUE_POLICY", "x", "fcfs"),
            (
                "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT",
                "2",
                "host_cache_hit_weight",
            ),
        ] {
            let e = with(&[(var, value)]).expect_err(var);
            assert!(e.starts_with(&format!("{var}={value:?}: ")), "{e}");
            assert!(e.contains(want), "{e}");
        }
    }
}
