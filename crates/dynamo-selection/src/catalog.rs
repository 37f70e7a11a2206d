//! The worker catalog: what a caller registered for each worker (a [`WorkerRequest`]) and
//! the record the service reports back ([`WorkerRecord`]), whose `lifecycle` and
//! `not_schedulable_reasons` say exactly why a worker cannot be chosen.
//!
//! An upsert replaces the whole registration (fields left out are cleared), as in the
//! reference; unknown fields are ignored. A worker is `incomplete` while its registration
//! lacks something selection needs (its `endpoint`, a non-zero `block_size`, a valid
//! `tcp://` KV-event endpoint for each data-parallel rank), `unschedulable` while a
//! KV-event publisher it needs is unreachable (or once deleted), `schedulable` otherwise.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A worker registration, as `upsert_worker` / `POST /workers` receive it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerRequest {
    /// The worker (instance) id.
    pub worker_id: u64,
    /// Model served (default `"default"`).
    #[serde(default)]
    pub model_name: Option<String>,
    /// Routing group inside the model (default `"default"`).
    #[serde(default)]
    pub routing_group: Option<String>,
    /// Where callers send the worker's requests (opaque to the service).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The engine's ZMQ KV-event PUB endpoint (single-rank workers).
    #[serde(default)]
    pub kv_events_endpoint: Option<String>,
    /// KV-event endpoints per data-parallel rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events_endpoints: Option<BTreeMap<u32, String>>,
    /// The engine's KV-event replay endpoint (recorded; see the module docs of `listener`).
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Tokens per KV block.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// First data-parallel rank (default 0).
    #[serde(default)]
    pub data_parallel_start_rank: Option<u32>,
    /// Number of data-parallel ranks (default 1).
    #[serde(default)]
    pub data_parallel_size: Option<u32>,
    /// Largest token batch of one forward pass (busy thresholds).
    #[serde(default)]
    pub max_num_batched_tokens: Option<u64>,
    /// KV blocks of the worker's cache (busy thresholds).
    #[serde(default)]
    pub total_kv_blocks: Option<u64>,
    /// Caller-defined stable id (recorded).
    #[serde(default)]
    pub stable_routing_id: Option<Value>,
    /// Eagle speculative decoding (recorded).
    #[serde(default)]
    pub is_eagle: Option<bool>,
    /// Taints (matched by routing constraints).
    #[serde(default)]
    pub taints: Vec<String>,
    /// Topology labels (recorded).
    #[serde(default)]
    pub topology_domains: BTreeMap<String, Value>,
    /// KV-transfer domain (recorded).
    #[serde(default)]
    pub kv_transfer_domain: Option<String>,
    /// KV-transfer enforcement (recorded).
    #[serde(default)]
    pub kv_transfer_enforcement: Option<String>,
    /// KV-transfer preference weight (recorded).
    #[serde(default)]
    pub kv_transfer_preferred_weight: Option<f64>,
}

/// Model name of registrations and requests that give none.
pub const DEFAULT_MODEL: &str = "default";
/// Routing group of registrations and requests that give none.
pub const DEFAULT_GROUP: &str = "default";

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// The registration lacks something selection needs.
    Incomplete,
    /// Selectable.
    Schedulable,
    /// Registered but not selectable now (a KV-event publisher is unreachable), or deleted.
    Unschedulable,
}

/// The catalog record of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker id.
    pub worker_id: u64,
    /// Model served.
    pub model_name: String,
    /// Routing group.
    pub routing_group: String,
    /// Lifecycle state.
    pub lifecycle: Lifecycle,
    /// The registration's other fields, as given.
    #[serde(flatten)]
    pub registration: RecordFields,
    /// Why the worker is not schedulable (absent when it is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_schedulable_reasons: Vec<String>,
}

/// The registration fields a record echoes (everything but the id, model and group).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordFields {
    /// See [`WorkerRequest::endpoint`].
    pub endpoint: Option<String>,
    /// See [`WorkerRequest::kv_events_endpoint`].
    pub kv_events_endpoint: Option<String>,
    /// See [`WorkerRequest::kv_events_endpoints`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events_endpoints: Option<BTreeMap<u32, String>>,
    /// See [`WorkerRequest::replay_endpoint`].
    pub replay_endpoint: Option<String>,
    /// See [`WorkerRequest::block_size`].
    pub block_size: Option<u32>,
    /// See [`WorkerRequest::data_parallel_start_rank`].
    pub data_parallel_start_rank: Option<u32>,
    /// See [`WorkerRequest::data_parallel_size`].
    pub data_parallel_size: Option<u32>,
    /// See [`WorkerRequest::max_num_batched_tokens`].
    pub max_num_batched_tokens: Option<u64>,
    /// See [`WorkerRequest::total_kv_blocks`].
    pub total_kv_blocks: Option<u64>,
    /// See [`WorkerRequest::stable_routing_id`].
    pub stable_routing_id: Option<Value>,
    /// See [`WorkerRequest::is_eagle`].
    pub is_eagle: Option<bool>,
    /// See [`WorkerRequest::taints`].
    pub taints: Vec<String>,
    /// See [`WorkerRequest::topology_domains`].
    pub topology_domains: BTreeMap<String, Value>,
    /// See [`WorkerRequest::kv_transfer_domain`].
    pub kv_transfer_domain: Option<String>,
    /// See [`WorkerRequest::kv_transfer_enforcement`].
    pub kv_transfer_enforcement: Option<String>,
    /// See [`WorkerRequest::kv_transfer_preferred_weight`].
    pub kv_transfer_preferred_weight: Option<f64>,
}

impl WorkerRequest {
    /// Model name, defaulted.
    pub fn model(&self) -> &str {
        self.model_name.as_deref().unwrap_or(DEFAULT_MODEL)
    }

    /// Routing group, defaulted.
    pub fn group(&self) -> &str {
        self.routing_group.as_deref().unwrap_or(DEFAULT_GROUP)
    }

    /// The data-parallel ranks the worker serves.
    pub fn ranks(&self) -> std::ops::Range<u32> {
        let start = self.data_parallel_start_rank.unwrap_or(0);
        start..start.saturating_add(self.data_parallel_size.unwrap_or(1))
    }

    /// The KV-event endpoint of each rank that has one. A single `kv_events_endpoint`
    /// covers a single-rank worker only.
    pub fn rank_endpoints(&self) -> BTreeMap<u32, String> {
        let ranks = self.ranks();
        let mut out = BTreeMap::new();
        if let Some(map) = &self.kv_events_endpoints {
            for (r, e) in map {
                if ranks.contains(r) {
                    out.insert(*r, e.clone());
                }
            }
        }
        if ranks.len() == 1
            && let Some(e) = &self.kv_events_endpoint
        {
            out.entry(ranks.start).or_insert_with(|| e.clone());
        }
        out
    }

    /// What the registration lacks for selection (empty when complete).
    pub fn config_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if self.endpoint.is_none() {
            reasons.push("endpoint is required".to_owned());
        }
        if self.block_size.unwrap_or(0) == 0 {
            reasons.push("block_size must be greater than 0".to_owned());
        }
        if self.data_parallel_size == Some(0) {
            reasons.push("data_parallel_size must be greater than 0".to_owned());
        }
        let endpoints = self.rank_endpoints();
        for rank in self.ranks() {
            match endpoints.get(&rank) {
                None => reasons.push(format!("kv_events endpoint is required for dp_rank {rank}")),
                Some(e) => {
                    if let Err(why) = zmq_tcp_address(e) {
                        reasons.push(format!(
                            "invalid kv_events endpoint for worker {} dp_rank {rank}: {why}",
                            self.worker_id
                        ));
                    }
                }
            }
        }
        reasons
    }

    /// The record for this registration.
    pub fn record(&self, lifecycle: Lifecycle, reasons: Vec<String>) -> WorkerRecord {
        WorkerRecord {
            worker_id: self.worker_id,
            model_name: self.model().to_owned(),
            routing_group: self.group().to_owned(),
            lifecycle,
            registration: RecordFields {
                endpoint: self.endpoint.clone(),
                kv_events_endpoint: self.kv_events_endpoint.clone(),
                kv_events_endpoints: self.kv_events_endpoints.clone(),
                replay_endpoint: self.replay_endpoint.clone(),
                block_size: self.block_size,
                data_parallel_start_rank: self.data_parallel_start_rank,
                data_parallel_size: self.data_parallel_size,
                max_num_batched_tokens: self.max_num_batched_tokens,
                total_kv_blocks: self.total_kv_blocks,
                stable_routing_id: self.stable_routing_id.clone(),
                is_eagle: self.is_eagle,
                taints: self.taints.clone(),
                topology_domains: self.topology_domains.clone(),
                kv_transfer_domain: self.kv_transfer_domain.clone(),
                kv_transfer_enforcement: self.kv_transfer_enforcement.clone(),
                kv_transfer_preferred_weight: self.kv_transfer_preferred_weight,
            },
            not_schedulable_reasons: reasons,
        }
    }
}

/// `host:port` of a `tcp://host:port` ZMQ endpoint (`*` = loopback, as a bind address
/// means every interface); the SUB client speaks TCP only.
///
/// # Errors
/// Why the endpoint is not one.
pub fn zmq_tcp_address(endpoint: &str) -> Result<String, String> {
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(format!("invalid ZMQ endpoint `{endpoint}`: missing scheme"));
    };
    if scheme != "tcp" {
        return Err(format!(
            "invalid ZMQ endpoint `{endpoint}`: only tcp:// is supported, not {scheme}://"
        ));
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!("invalid ZMQ endpoint `{endpoint}`: missing port"));
    };
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!(
            "invalid ZMQ endpoint `{endpoint}`: bad host or port"
        ));
    }
    Ok(format!(
        "{}:{port}",
        if host == "*" { "127.0.0.1" } else { host }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> WorkerRequest {
        serde_json::from_value(v).expect("valid registration")
    }

    #[test]
    fn partial_registrations_say_what_is_missing() {
        let w = parse(serde_json::json!({"worker_id": 1}));
        assert_eq!(
            w.config_reasons(),
            [
                "endpoint is required",
                "block_size must be greater than 0",
                "kv_events endpoint is required for dp_rank 0"
            ]
        );
        let w = parse(serde_json::json!({"worker_id": 1, "endpoint": "http://a",
            "block_size": 16, "kv_events_endpoint": "tcp://127.0.0.1:5557",
            "data_parallel_size": 2}));
        assert_eq!(
            w.config_reasons(),
            [
                "kv_events endpoint is required for dp_rank 0",
                "kv_events endpoint is required for dp_rank 1"
            ]
        );
        let w = parse(serde_json::json!({"worker_id": 1, "endpoint": "http://a",
            "block_size": 16, "kv_events_endpoints": {"0": "tcp://h:1", "1": "tcp://h:2"},
            "data_parallel_size": 2}));
        assert!(w.config_reasons().is_empty());
    }

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(zmq_tcp_address("tcp://*:5557").unwrap(), "127.0.0.1:5557");
        assert!(
            zmq_tcp_address("garbage")
                .unwrap_err()
                .contains("missing scheme")
        );
        assert!(
            zmq_tcp_address("ipc:///tmp/x")
                .unwrap_err()
                .contains("only tcp://")
        );
        assert!(
            zmq_tcp_address("tcp://host")
                .unwrap_err()
                .contains("missing port")
        );
        assert!(zmq_tcp_address("tcp://host:0").is_err());
    }

    #[test]
    fn record_shape_matches_the_reference() {
        let w = parse(serde_json::json!({"worker_id": 3}));
        let v = serde_json::to_value(w.record(Lifecycle::Incomplete, w.config_reasons())).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert!(keys.contains(&"not_schedulable_reasons"));
        assert!(!keys.contains(&"kv_events_endpoints"));
        assert_eq!(v["model_name"], "default");
        assert_eq!(v["lifecycle"], "incomplete");
        assert_eq!(v["taints"], serde_json::json!([]));
    }
}
