//! The argument rules of `register_model` and the card it publishes.
//!
//! The runtime layer (discovery, endpoints) collects the Python arguments into
//! [`RegisterModelArgs`] and calls [`RegisterModelArgs::build_card`], which validates them
//! and returns the card to publish. Everything here is synchronous and touches only the
//! local file system.

use std::path::PathBuf;

use super::fetch::{resolve_model_path, strip_hf_prefix};
use super::{LoraInfo, ModelDeploymentCard, ModelInput, ModelRuntimeConfig, ModelType, WorkerType};
use crate::error::{Error, Result};

/// KV block size when the worker does not say (the guide's documented default).
pub const DEFAULT_KV_CACHE_BLOCK_SIZE: u32 = 16;

/// The arguments of `register_model`, minus the endpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegisterModelArgs {
    /// What the worker's `generate` takes.
    pub model_input: ModelInput,
    /// API surfaces.
    pub model_type: ModelType,
    /// Local directory or Hugging Face repo id (`hf://` prefix allowed).
    pub model_path: String,
    /// Served name; defaults to the LoRA name, else the model path.
    pub model_name: Option<String>,
    /// Role of the worker; `None` means [`WorkerType::Aggregated`] (so the guide's example
    /// runs as written).
    pub worker_type: Option<WorkerType>,
    /// Tokens per KV block; default [`DEFAULT_KV_CACHE_BLOCK_SIZE`].
    pub kv_cache_block_size: Option<u32>,
    /// Context length override (the guide's kwarg); also read from
    /// `runtime_config.context_length`.
    pub context_length: Option<u32>,
    /// Runtime facts.
    pub runtime_config: Option<ModelRuntimeConfig>,
    /// Only for `TensorBased` models.
    pub tensor_model_config: Option<serde_json::Value>,
    /// Free-form metadata.
    pub user_data: Option<serde_json::Value>,
    /// A chat template file overriding the model's.
    pub custom_template_path: Option<PathBuf>,
    /// Adapter name; requires `base_model_path`.
    pub lora_name: Option<String>,
    /// Base model of the adapter; requires `lora_name`.
    pub base_model_path: Option<String>,
    /// Worker types this one needs (DNF list of AND-sets); required unless aggregated.
    pub needs: Option<Vec<Vec<WorkerType>>>,
    /// Skip weights when downloading (nothing is downloaded here).
    pub ignore_weights: bool,
    /// Most adapters resident at once.
    pub max_gpu_lora_count: Option<u32>,
    /// Other names the model answers to.
    pub model_aliases: Vec<String>,
    /// Re-dispatches allowed when a stream breaks.
    pub migration_limit: u32,
    /// Media fetcher settings for the frontend.
    pub media_fetcher: Option<dynamo_multimodal::MediaFetcherConfig>,
    /// Media decoder settings for the frontend.
    pub media_decoder: Option<dynamo_multimodal::MediaDecoderConfig>,
}

impl RegisterModelArgs {
    /// The worker type, defaulting to aggregated.
    pub fn worker_type(&self) -> WorkerType {
        self.worker_type.unwrap_or_default()
    }

    /// Check the argument rules (no file system access except `custom_template_path`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the argument; [`Error::FileNotFound`] for a missing
    /// custom template.
    pub fn validate(&self) -> Result<()> {
        let worker = self.worker_type();
        if matches!(worker, WorkerType::Prefill | WorkerType::Encode)
            && self.model_input != ModelInput::Tokens
        {
            return Err(Error::config(
                "model_input",
                format!("{worker} workers require ModelInput.Tokens"),
            ));
        }
        if worker == WorkerType::Prefill && self.model_type.has_openai_surface() {
            return Err(Error::config(
                "model_type",
                format!(
                    "prefill workers must not serve an OpenAI surface (got {:?}); use ModelType.Empty",
                    self.model_type.to_string()
                ),
            ));
        }
        let needs = self.needs.as_deref().unwrap_or_default();
        if worker != WorkerType::Aggregated && needs.iter().all(Vec::is_empty) {
            return Err(Error::config(
                "needs",
                format!(
                    "{worker} workers must say which worker types they need (a non-empty list of lists)"
                ),
            ));
        }
        if self.tensor_model_config.is_some() && !self.model_type.supports_tensor() {
            return Err(Error::config(
                "tensor_model_config",
                "only valid for ModelType.TensorBased models",
            ));
        }
        if self.lora_name.is_some() != self.base_model_path.is_some() {
            return Err(Error::config(
                "lora_name",
                "lora_name and base_model_path must be given together",
            ));
        }
        if self
            .lora_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(Error::config("lora_name", "must not be empty"));
        }
        if self.kv_cache_block_size == Some(0) {
            return Err(Error::config("kv_cache_block_size", "must be > 0"));
        }
        if self.context_length == Some(0) {
            return Err(Error::config("context_length", "must be > 0"));
        }
        if self.model_path.trim().is_empty() {
            return Err(Error::config("model_path", "must not be empty"));
        }
        if let Some(rc) = &self.runtime_config {
            rc.validate()?;
        }
        if let Some(p) = &self.custom_template_path
            && !p.is_file()
        {
            return Err(Error::FileNotFound(p.clone()));
        }
        Ok(())
    }

    /// Validate, resolve the model directory and build the card to publish.
    ///
    /// # Errors
    /// As [`Self::validate`]; [`Error::ModelNotFound`] when the model is neither a local
    /// directory nor in the offline Hugging Face cache; [`Error::ModelFile`] for unreadable
    /// model files.
    pub fn build_card(&self) -> Result<ModelDeploymentCard> {
        self.validate()?;
        let mut card = if self.model_type.is_media_or_tensor() {
            // No tokenizer files: a minimal card under the given name; aliases ignored.
            let name = self.model_name.as_deref().unwrap_or(&self.model_path);
            let mut card = ModelDeploymentCard::with_name(name);
            card.source_path.clone_from(&self.model_path);
            card
        } else {
            let source = self.base_model_path.as_deref().unwrap_or(&self.model_path);
            let dir = resolve_model_path(source)?;
            let mut card = ModelDeploymentCard::load_from_disk(&dir, None)?;
            card.source_path = strip_hf_prefix(source).to_owned();
            let name = self
                .lora_name
                .as_deref()
                .or(self.model_name.as_deref())
                .unwrap_or(&card.source_path)
                .to_owned();
            card.set_name(&name);
            card.model_aliases.clone_from(&self.model_aliases);
            card
        };
        card.model_type = self.model_type;
        card.model_input = self.model_input;
        card.worker_type = self.worker_type();
        card.needs = self.needs.clone().unwrap_or_default();
        card.kv_cache_block_size = self
            .kv_cache_block_size
            .unwrap_or(DEFAULT_KV_CACHE_BLOCK_SIZE);
        card.migration_limit = self.migration_limit;
        card.runtime_config = self.runtime_config.clone().unwrap_or_default();
        if let Some(ctx) = self.context_length.or(card.runtime_config.context_length) {
            card.context_length = ctx;
        }
        card.user_data.clone_from(&self.user_data);
        card.media_fetcher.clone_from(&self.media_fetcher);
        card.media_decoder.clone_from(&self.media_decoder);
        card.tensor_model_config
            .clone_from(&self.tensor_model_config);
        if let Some(p) = &self.custom_template_path {
            card.set_custom_template(p)?;
        }
        card.lora = self.lora_name.as_ref().map(|name| LoraInfo {
            name: name.clone(),
            max_gpu_lora_count: self.max_gpu_lora_count,
        });
        Ok(card)
    }
}
