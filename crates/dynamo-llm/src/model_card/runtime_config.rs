//! [`ModelRuntimeConfig`]: runtime facts a worker advertises in its model card.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Prefix of taints derived from topology metadata; callers cannot set them.
pub const RESERVED_TAINT_PREFIX: &str = "dynamo.topology/";

/// Structural-tag mode for tool calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StructuralTagMode {
    /// No structural tags.
    #[default]
    Off,
    /// Structural tags on.
    On,
}

/// When structural tags apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StructuralTagScope {
    /// When the request's tools call for it.
    #[default]
    Auto,
    /// On every request.
    Always,
}

/// How strictly structural tags follow the tool schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StructuralTagSchema {
    /// Engine's choice.
    #[default]
    Auto,
    /// Strict schema.
    Strict,
}

/// Whether KV transfer must stay within `kv_transfer_domain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTransferEnforcement {
    /// Only peers of the same domain.
    Required,
    /// Same-domain peers are preferred (weighted by `kv_transfer_preferred_weight`).
    Preferred,
}

fn default_true() -> bool {
    true
}

fn default_one() -> u32 {
    1
}

/// Runtime facts a worker advertises in its model card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelRuntimeConfig {
    /// Longest sequence the engine accepts (overrides the model's own limit when set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// KV-cache capacity in blocks.
    pub total_kv_blocks: Option<u64>,
    /// Most concurrent sequences.
    pub max_num_seqs: Option<u64>,
    /// Token budget of one forward pass.
    pub max_num_batched_tokens: Option<u64>,
    /// Tool-call parser the frontend should use.
    pub tool_call_parser: Option<String>,
    /// Reasoning parser the frontend should use.
    pub reasoning_parser: Option<String>,
    /// Tokenizer implementation: `default` or `fastokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer_backend: Option<String>,
    /// Structural-tag mode (`off` | `on`).
    pub structural_tag_mode: StructuralTagMode,
    /// Structural-tag scope (`auto` | `always`).
    pub structural_tag_scope: StructuralTagScope,
    /// Structural-tag schema (`auto` | `strict`).
    pub structural_tag_schema: StructuralTagSchema,
    /// Drop `tools` from the prompt when `tool_choice` is `none`.
    #[serde(default = "default_true")]
    pub exclude_tools_when_tool_choice_none: bool,
    /// First data-parallel rank served by this worker.
    pub data_parallel_start_rank: u32,
    /// Data-parallel ranks served by this worker.
    #[serde(default = "default_one")]
    pub data_parallel_size: u32,
    /// The worker keeps a local KV indexer that routers can query after a restart.
    #[serde(default = "default_true")]
    pub enable_local_indexer: bool,
    /// Eagle speculative decoding (changes block hashing).
    pub enable_eagle: bool,
    /// Caller-managed taints (routing constraints).
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub taints: BTreeSet<String>,
    /// Routing identity stable across restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stable_routing_id: Option<String>,
    /// Engine-specific values (`set_engine_specific`), JSON.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime_data: BTreeMap<String, serde_json::Value>,
    /// Topology labels (e.g. `rack` → `r1`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topology_domains: BTreeMap<String, String>,
    /// KV-transfer domain of this worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_domain: Option<String>,
    /// KV-transfer domain enforcement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_enforcement: Option<KvTransferEnforcement>,
    /// Weight of same-domain peers under `preferred` enforcement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_preferred_weight: Option<f64>,
    /// Disaggregation bootstrap host (set by `set_disaggregated_endpoint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_host: Option<String>,
    /// Disaggregation bootstrap port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// The engine publishes KV events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_event_publishing_enabled: Option<bool>,
    /// Where KV events come from (engine specific).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_event_source_mode: Option<String>,
    /// Endpoint of a KV-state service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_state_endpoint: Option<String>,
}

impl Default for ModelRuntimeConfig {
    fn default() -> Self {
        Self {
            context_length: None,
            total_kv_blocks: None,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            tool_call_parser: None,
            reasoning_parser: None,
            tokenizer_backend: None,
            structural_tag_mode: StructuralTagMode::Off,
            structural_tag_scope: StructuralTagScope::Auto,
            structural_tag_schema: StructuralTagSchema::Auto,
            exclude_tools_when_tool_choice_none: true,
            data_parallel_start_rank: 0,
            data_parallel_size: 1,
            enable_local_indexer: true,
            enable_eagle: false,
            taints: BTreeSet::new(),
            stable_routing_id: None,
            runtime_data: BTreeMap::new(),
            topology_domains: BTreeMap::new(),
            kv_transfer_domain: None,
            kv_transfer_enforcement: None,
            kv_transfer_preferred_weight: None,
            bootstrap_host: None,
            bootstrap_port: None,
            kv_event_publishing_enabled: None,
            kv_event_source_mode: None,
            kv_state_endpoint: None,
        }
    }
}

/// Valid values of `tokenizer_backend`.
pub const TOKENIZER_BACKENDS: &[&str] = &["default", "fastokens"];

impl ModelRuntimeConfig {
    /// Check every field (called by model registration).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        if self.context_length == Some(0) {
            return Err(Error::config("context_length", "must be > 0"));
        }
        for (field, value) in [
            ("total_kv_blocks", self.total_kv_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        ] {
            if value == Some(0) {
                return Err(Error::config(field, "must be > 0 when set"));
            }
        }
        if self.data_parallel_size == 0 {
            return Err(Error::config("data_parallel_size", "must be >= 1"));
        }
        if let Some(b) = &self.tokenizer_backend {
            Self::check_tokenizer_backend(b)?;
        }
        if let Some(w) = self.kv_transfer_preferred_weight
            && !(w.is_finite() && w >= 0.0)
        {
            return Err(Error::config(
                "kv_transfer_preferred_weight",
                format!("must be finite and >= 0, got {w}"),
            ));
        }
        Self::check_taints(&self.taints)?;
        // Unknown parser names fail here, at registration, not on the first request.
        if let Some(p) = &self.tool_call_parser {
            dynamo_parsers::check_tool_parser(p)
                .map_err(|m| Error::config("tool_call_parser", m))?;
        }
        if let Some(p) = &self.reasoning_parser {
            dynamo_parsers::check_reasoning_parser(p)
                .map_err(|m| Error::config("reasoning_parser", m))?;
        }
        Ok(())
    }

    /// Check a `tokenizer_backend` value.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] unless it is `default` or `fastokens`.
    pub fn check_tokenizer_backend(value: &str) -> Result<()> {
        if TOKENIZER_BACKENDS.contains(&value) {
            Ok(())
        } else {
            Err(Error::config(
                "tokenizer_backend",
                format!("invalid tokenizer backend {value:?} (expected 'default' or 'fastokens')"),
            ))
        }
    }

    /// Check caller-managed taints: non-empty and not in the reserved
    /// [`RESERVED_TAINT_PREFIX`] namespace.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad taint.
    pub fn check_taints<'a>(taints: impl IntoIterator<Item = &'a String>) -> Result<()> {
        for t in taints {
            if t.trim().is_empty() {
                return Err(Error::config("taints", "a taint must not be empty"));
            }
            if t.starts_with(RESERVED_TAINT_PREFIX) {
                return Err(Error::config(
                    "taints",
                    format!(
                        "{t:?} is reserved ({RESERVED_TAINT_PREFIX}* taints are derived from topology metadata)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Parse `kv_transfer_enforcement`: `required`, `preferred`, or `""`/None for unset.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn parse_kv_transfer_enforcement(
        value: Option<&str>,
    ) -> Result<Option<KvTransferEnforcement>> {
        match value {
            None | Some("") => Ok(None),
            Some("required") => Ok(Some(KvTransferEnforcement::Required)),
            Some("preferred") => Ok(Some(KvTransferEnforcement::Preferred)),
            Some(other) => Err(Error::config(
                "kv_transfer_enforcement",
                format!("must be 'required' or 'preferred', got {other:?}"),
            )),
        }
    }

    /// Set `structural_tag_mode` from `off` | `on`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn set_structural_tag_mode(&mut self, mode: &str) -> Result<()> {
        self.structural_tag_mode = parse_lower(mode, "structural_tag_mode", &["off", "on"])?;
        Ok(())
    }

    /// Set `structural_tag_scope` from `auto` | `always`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn set_structural_tag_scope(&mut self, scope: &str) -> Result<()> {
        self.structural_tag_scope =
            parse_lower(scope, "structural_tag_scope", &["auto", "always"])?;
        Ok(())
    }

    /// Set `structural_tag_schema` from `auto` | `strict`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn set_structural_tag_schema(&mut self, schema: &str) -> Result<()> {
        self.structural_tag_schema =
            parse_lower(schema, "structural_tag_schema", &["auto", "strict"])?;
        Ok(())
    }

    /// Store an engine-specific value given as JSON text.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `json` does not parse.
    pub fn set_engine_specific(&mut self, key: &str, json: &str) -> Result<()> {
        let value = serde_json::from_str(json).map_err(|e| {
            Error::config(
                format!("engine_specific[{key:?}]"),
                format!("invalid JSON: {e}"),
            )
        })?;
        self.runtime_data.insert(key.to_owned(), value);
        Ok(())
    }

    /// An engine-specific value as JSON text.
    pub fn get_engine_specific(&self, key: &str) -> Option<String> {
        self.runtime_data.get(key).map(serde_json::Value::to_string)
    }

    /// Whether `runtime_data[key]` equals `value` (what `wait_for_instance_by_runtime_data`
    /// waits for). A JSON string value also matches its bare text.
    pub fn runtime_data_matches(&self, key: &str, value: &serde_json::Value) -> bool {
        match (self.runtime_data.get(key), value) {
            (Some(stored), v) if stored == v => true,
            (Some(serde_json::Value::String(s)), serde_json::Value::String(v)) => s == v,
            _ => false,
        }
    }

    /// Record the disaggregation bootstrap endpoint.
    pub fn set_disaggregated_endpoint(&mut self, host: Option<String>, port: Option<u16>) {
        self.bootstrap_host = host;
        self.bootstrap_port = port;
    }
}

fn parse_lower<T: serde::de::DeserializeOwned>(
    value: &str,
    field: &str,
    allowed: &[&str],
) -> Result<T> {
    if !allowed.contains(&value) {
        return Err(Error::config(
            field,
            format!("must be one of {allowed:?}, got {value:?}"),
        ));
    }
    serde_json::from_value(serde_json::Value::String(value.to_owned()))
        .map_err(|e| Error::config(field, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip() {
        let c = ModelRuntimeConfig::default();
        c.validate().expect("valid");
        let json = serde_json::to_string(&c).expect("json");
        let back: ModelRuntimeConfig = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, c);
        let empty: ModelRuntimeConfig = serde_json::from_str("{}").expect("parse");
        assert_eq!(empty, c);
    }

    type Case = (fn(&mut ModelRuntimeConfig), &'static str);

    #[test]
    fn validation_names_the_field() {
        let cases: [Case; 5] = [
            (|c| c.data_parallel_size = 0, "data_parallel_size"),
            (|c| c.context_length = Some(0), "context_length"),
            (
                |c| c.tokenizer_backend = Some("bad".into()),
                "tokenizer_backend",
            ),
            (
                |c| c.kv_transfer_preferred_weight = Some(f64::NAN),
                "kv_transfer_preferred_weight",
            ),
            (
                |c| {
                    c.taints.insert("dynamo.topology/rack".into());
                },
                "taints",
            ),
        ];
        for (mutate, field) in cases {
            let mut c = ModelRuntimeConfig::default();
            mutate(&mut c);
            let err = c.validate().expect_err(field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn enums_and_engine_specific() {
        let mut c = ModelRuntimeConfig::default();
        c.set_structural_tag_mode("on").expect("on");
        assert_eq!(c.structural_tag_mode, StructuralTagMode::On);
        assert!(c.set_structural_tag_mode("maybe").is_err());
        c.set_structural_tag_scope("always").expect("always");
        c.set_structural_tag_schema("strict").expect("strict");
        assert!(c.set_structural_tag_schema("loose").is_err());
        assert_eq!(
            ModelRuntimeConfig::parse_kv_transfer_enforcement(Some("")).expect("ok"),
            None
        );
        assert!(ModelRuntimeConfig::parse_kv_transfer_enforcement(Some("x")).is_err());
        c.set_engine_specific("k", r#"{"a": [1, 2]}"#)
            .expect("json");
        assert_eq!(
            c.get_engine_specific("k").as_deref(),
            Some(r#"{"a":[1,2]}"#)
        );
        assert!(c.set_engine_specific("bad", "{nope").is_err());
        assert_eq!(c.get_engine_specific("missing"), None);
        c.set_engine_specific("role", r#""leader""#).expect("json");
        assert!(c.runtime_data_matches("role", &serde_json::json!("leader")));
        assert!(!c.runtime_data_matches("role", &serde_json::json!("follower")));
    }
}
