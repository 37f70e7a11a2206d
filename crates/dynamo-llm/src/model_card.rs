//! The model deployment card (MDC): what a worker publishes about its model so that a
//! frontend can serve it.
//!
//! A card names the model, its API surfaces ([`ModelType`]), its input ([`ModelInput`]), the
//! worker's role ([`WorkerType`]), runtime facts ([`ModelRuntimeConfig`]) and the model's
//! metadata files (`config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`, optionally a custom chat template) as [`CheckedFile`]s: a path
//! plus a blake3 checksum, so a reader can tell a stale or different copy from the one the
//! worker registered. Cards travel as JSON ([`ModelDeploymentCard::to_json_str`]).
//!
//! ```
//! # fn main() -> dynamo_llm::Result<()> {
//! use dynamo_llm::model_card::{ModelDeploymentCard, ModelType};
//! let mut card = ModelDeploymentCard::with_name("my-model");
//! card.model_type = ModelType::CHAT | ModelType::COMPLETIONS;
//! let back = ModelDeploymentCard::from_json_str(&card.to_json_str()?)?;
//! assert_eq!(back, card);
//! # Ok(()) }
//! ```

pub mod fetch;
pub mod registration;
pub mod runtime_config;
pub mod types;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use fetch::{fetch_model, resolve_model_path};
pub use registration::{DEFAULT_KV_CACHE_BLOCK_SIZE, RegisterModelArgs};
pub use runtime_config::ModelRuntimeConfig;
pub use types::{ModelInput, ModelType, WorkerType};

/// A model file: where it is, and the blake3 checksum and size of its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckedFile {
    /// Absolute path at registration time.
    pub path: PathBuf,
    /// `blake3:<hex>` of the content.
    pub checksum: String,
    /// Size in bytes.
    pub size: u64,
}

impl CheckedFile {
    /// Checksum a file.
    ///
    /// # Errors
    /// [`Error::ModelFile`] when it cannot be read.
    pub fn from_path(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::ModelFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(Self {
            path,
            checksum: format!("blake3:{}", blake3::hash(&bytes).to_hex()),
            size: bytes.len() as u64,
        })
    }

    /// Read the file and check that it still has the registered checksum.
    ///
    /// # Errors
    /// [`Error::ModelFile`] when it cannot be read or its content changed.
    pub fn read_verified(&self) -> Result<Vec<u8>> {
        let bytes = std::fs::read(&self.path).map_err(|e| Error::ModelFile {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        let actual = format!("blake3:{}", blake3::hash(&bytes).to_hex());
        if actual != self.checksum {
            return Err(Error::ModelFile {
                path: self.path.clone(),
                reason: format!(
                    "checksum mismatch: card has {}, file has {actual}",
                    self.checksum
                ),
            });
        }
        Ok(bytes)
    }
}

/// `config.json` of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelInfo {
    /// A Hugging Face `config.json`.
    HfConfigJson(CheckedFile),
}

/// The tokenizer of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    /// A Hugging Face `tokenizer.json`.
    HfTokenizerJson(CheckedFile),
}

/// Where the chat template comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormatterArtifact {
    /// `tokenizer_config.json` (its `chat_template` plus bos/eos tokens).
    HfTokenizerConfigJson(CheckedFile),
}

/// Generation defaults of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerationConfig {
    /// A Hugging Face `generation_config.json`.
    HfGenerationConfigJson(CheckedFile),
}

/// A LoRA adapter served on top of the base model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraInfo {
    /// Adapter name (the served model name).
    pub name: String,
    /// Most adapters resident on the GPU at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gpu_lora_count: Option<u32>,
}

/// The model deployment card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelDeploymentCard {
    /// Served model name (what requests put in `model`).
    pub display_name: String,
    /// URL- and path-safe form of the name.
    pub slug: String,
    /// The model path or repo id as registered.
    #[serde(default)]
    pub source_path: String,
    /// The local directory the metadata files were read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_dir: Option<PathBuf>,
    /// `config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_info: Option<ModelInfo>,
    /// `tokenizer.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerKind>,
    /// `tokenizer_config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_formatter: Option<PromptFormatterArtifact>,
    /// A custom chat template (jinja text, or JSON with a `chat_template` key) that
    /// overrides the one in `tokenizer_config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_file: Option<CheckedFile>,
    /// `generation_config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gen_config: Option<GenerationConfig>,
    /// The model's own context limit (`max_position_embeddings` and friends), 0 if unknown.
    #[serde(default)]
    pub architectural_max_context_length: u32,
    /// Longest sequence (prompt + output) the deployment serves, 0 if unknown.
    #[serde(default)]
    pub context_length: u32,
    /// Tokens per KV block of the engine.
    #[serde(default)]
    pub kv_cache_block_size: u32,
    /// Re-dispatches allowed per request when a stream breaks.
    #[serde(default)]
    pub migration_limit: u32,
    /// API surfaces.
    #[serde(default)]
    pub model_type: ModelType,
    /// What the worker's `generate` takes.
    #[serde(default)]
    pub model_input: ModelInput,
    /// Role of the worker.
    #[serde(default)]
    pub worker_type: WorkerType,
    /// Which other worker types this one needs, as a DNF list of AND-sets.
    #[serde(default)]
    pub needs: Vec<Vec<WorkerType>>,
    /// Runtime facts.
    #[serde(default)]
    pub runtime_config: ModelRuntimeConfig,
    /// Free-form worker metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<serde_json::Value>,
    /// Tensor-model configuration (only for `TensorBased` models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_model_config: Option<serde_json::Value>,
    /// The adapter, for a LoRA card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraInfo>,
    /// Other names the model answers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_aliases: Vec<String>,
    /// How the frontend fetches media URLs for this model (`register_model(media_fetcher=)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_fetcher: Option<dynamo_multimodal::MediaFetcherConfig>,
    /// Which media the frontend decodes for this model (`register_model(media_decoder=)`);
    /// `None`: image parts are passed to the template as they are, undecoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_decoder: Option<dynamo_multimodal::MediaDecoderConfig>,
}

/// A URL- and path-safe form of a model name: lowercase ASCII letters, digits, `-`, `_`
/// and `.`; everything else becomes `_`.
pub fn slugify(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect()
}

/// Keys of `config.json` that hold the model's context limit, most specific first.
const CONTEXT_KEYS: [&str; 5] = [
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "max_seq_len",
];

/// Tokenizer configs without a real limit use this sentinel (`int(1e30)`) or similar.
const MAX_SANE_CONTEXT: u64 = 1 << 31;

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::ModelFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| Error::ModelFile {
        path: path.to_path_buf(),
        reason: format!("invalid JSON: {e}"),
    })
}

/// The context limit in `config.json` (also under `text_config`, as multimodal models
/// nest it), else `model_max_length` of `tokenizer_config.json`.
fn context_length_of(
    config: Option<&serde_json::Value>,
    tok_config: Option<&serde_json::Value>,
) -> u32 {
    let from = |v: &serde_json::Value| {
        CONTEXT_KEYS
            .iter()
            .find_map(|k| v.get(k).and_then(serde_json::Value::as_u64))
    };
    config
        .and_then(|c| from(c).or_else(|| c.get("text_config").and_then(from)))
        .or_else(|| {
            tok_config
                .and_then(|t| t.get("model_max_length"))
                .and_then(serde_json::Value::as_f64)
                .filter(|v| *v >= 1.0 && *v < MAX_SANE_CONTEXT as f64)
                .map(|v| v as u64)
        })
        .filter(|v| *v < MAX_SANE_CONTEXT)
        .map_or(0, |v| v as u32)
}

impl ModelDeploymentCard {
    /// A card with only a name (what media and tensor models register).
    pub fn with_name(name: &str) -> Self {
        Self {
            display_name: name.to_owned(),
            slug: slugify(name),
            source_path: name.to_owned(),
            local_dir: None,
            model_info: None,
            tokenizer: None,
            prompt_formatter: None,
            chat_template_file: None,
            gen_config: None,
            architectural_max_context_length: 0,
            context_length: 0,
            kv_cache_block_size: 0,
            migration_limit: 0,
            model_type: ModelType::EMPTY,
            model_input: ModelInput::Tokens,
            worker_type: WorkerType::Aggregated,
            needs: Vec::new(),
            runtime_config: ModelRuntimeConfig::default(),
            user_data: None,
            tensor_model_config: None,
            lora: None,
            model_aliases: Vec::new(),
            media_fetcher: None,
            media_decoder: None,
        }
    }

    /// Build a card from a local model directory holding `config.json` and/or
    /// `tokenizer.json`, plus optionally `tokenizer_config.json` and
    /// `generation_config.json`. The name defaults to the directory path.
    ///
    /// # Errors
    /// [`Error::ModelNotFound`] when `dir` is not a directory (naming it);
    /// [`Error::ModelFile`] when it has neither `config.json` nor `tokenizer.json`, or a
    /// file cannot be read or parsed.
    pub fn load_from_disk(dir: &Path, name: Option<&str>) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::ModelNotFound {
                name: dir.display().to_string(),
                tried: vec![dir.to_path_buf()],
            });
        }
        let file = |n: &str| Some(dir.join(n)).filter(|p| p.is_file());
        let config_path = file("config.json");
        let tokenizer_path = file("tokenizer.json");
        if config_path.is_none() && tokenizer_path.is_none() {
            return Err(Error::ModelFile {
                path: dir.to_path_buf(),
                reason: "not a model directory: neither config.json nor tokenizer.json found"
                    .to_owned(),
            });
        }
        let tok_config_path = file("tokenizer_config.json");
        let config = config_path.as_deref().map(read_json).transpose()?;
        let tok_config = tok_config_path.as_deref().map(read_json).transpose()?;
        let context = context_length_of(config.as_ref(), tok_config.as_ref());

        let source = dir.display().to_string();
        let mut card = Self::with_name(name.unwrap_or(&source));
        card.source_path = source;
        card.local_dir = Some(std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()));
        card.model_info = config_path
            .as_deref()
            .map(CheckedFile::from_path)
            .transpose()?
            .map(ModelInfo::HfConfigJson);
        card.tokenizer = tokenizer_path
            .as_deref()
            .map(CheckedFile::from_path)
            .transpose()?
            .map(TokenizerKind::HfTokenizerJson);
        card.prompt_formatter = tok_config_path
            .as_deref()
            .map(CheckedFile::from_path)
            .transpose()?
            .map(PromptFormatterArtifact::HfTokenizerConfigJson);
        card.gen_config = file("generation_config.json")
            .as_deref()
            .map(CheckedFile::from_path)
            .transpose()?
            .map(GenerationConfig::HfGenerationConfigJson);
        card.architectural_max_context_length = context;
        card.context_length = context;
        Ok(card)
    }

    /// Use a custom chat template file instead of the one in `tokenizer_config.json`.
    ///
    /// # Errors
    /// [`Error::FileNotFound`] when the file does not exist.
    pub fn set_custom_template(&mut self, path: &Path) -> Result<()> {
        if !path.is_file() {
            return Err(Error::FileNotFound(path.to_path_buf()));
        }
        self.chat_template_file = Some(CheckedFile::from_path(path)?);
        Ok(())
    }

    /// Set the served name (and its slug).
    pub fn set_name(&mut self, name: &str) {
        name.clone_into(&mut self.display_name);
        self.slug = slugify(name);
    }

    /// The served model name.
    pub fn name(&self) -> &str {
        &self.display_name
    }

    /// The directory the metadata files were read from, or the source path for cards
    /// without files.
    pub fn local_dir(&self) -> PathBuf {
        self.local_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&self.source_path))
    }

    /// Serialize to JSON.
    ///
    /// # Errors
    /// Never in practice (every field serializes); kept fallible for API stability.
    pub fn to_json_str(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::Deserialize {
            what: "model deployment card",
            reason: e.to_string(),
        })
    }

    /// Parse from JSON.
    ///
    /// # Errors
    /// [`Error::Deserialize`] for malformed JSON or fields of the wrong type.
    pub fn from_json_str(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| Error::Deserialize {
            what: "model deployment card",
            reason: e.to_string(),
        })
    }

    /// A checksum of everything that must agree between workers serving the same model
    /// (name, surfaces, input, files, context, block size, adapter); frontends reject a
    /// worker whose card's `mdcsum` differs from the first one seen for the model.
    pub fn mdcsum(&self) -> String {
        let files = [
            self.model_info.as_ref().map(|ModelInfo::HfConfigJson(f)| f),
            self.tokenizer
                .as_ref()
                .map(|TokenizerKind::HfTokenizerJson(f)| f),
            self.prompt_formatter
                .as_ref()
                .map(|PromptFormatterArtifact::HfTokenizerConfigJson(f)| f),
            self.chat_template_file.as_ref(),
            self.gen_config
                .as_ref()
                .map(|GenerationConfig::HfGenerationConfigJson(f)| f),
        ];
        let key = serde_json::json!({
            "name": self.display_name,
            "model_type": self.model_type,
            "model_input": self.model_input,
            "files": files.iter().map(|f| f.map(|f| &f.checksum)).collect::<Vec<_>>(),
            "context_length": self.context_length,
            "kv_cache_block_size": self.kv_cache_block_size,
            "lora": self.lora,
        });
        blake3::hash(key.to_string().as_bytes())
            .to_hex()
            .to_string()
    }
}

/// A deterministic id for a LoRA adapter name: the first 8 bytes of the name's blake3 hash
/// as a big-endian integer, reduced to its low 31 bits so it is a positive signed 32-bit
/// value (the reference's ids; engines keep LoRA ids in an `int32`).
pub fn lora_name_to_id(lora_name: &str) -> i32 {
    let hash = blake3::hash(lora_name.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&hash.as_bytes()[..8]);
    let low31 = u64::from_be_bytes(head) & 0x7fff_ffff;
    i32::try_from(low31).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests;
