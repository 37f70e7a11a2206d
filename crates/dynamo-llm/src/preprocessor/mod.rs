//! OpenAI request preprocessing for `ModelInput.Tokens` models, and the matching
//! postprocessing of worker output.
//!
//! * [`openai`]: request/response/chunk types, parsing with OpenAI-style 400 errors.
//! * [`template`]: HF chat templates (minijinja).
//! * [`protocols`]: [`PreprocessedRequest`] (to workers) and [`LLMEngineOutput`] (from them).
//! * [`detokenizer`]: incremental UTF-8-safe detokenization and stop strings.
//! * [`backend`]: [`OutputProcessor`], stop conditions over a worker's stream.
//!
//! [`Preprocessor`] ties them to a model: built once per model from its card, it turns a
//! chat or completions request into a [`PreprocessedRequest`] and makes the
//! [`OutputProcessor`] for its response stream.
//!
//! ```
//! # fn main() -> dynamo_llm::Result<()> {
//! use dynamo_llm::preprocessor::{openai, Preprocessor};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-model");
//! let pre = Preprocessor::from_model_dir(std::path::Path::new(dir), "tiny")?;
//! let req = openai::parse_chat_request(
//!     br#"{"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}"#,
//! )?;
//! let wire = pre.preprocess_chat(&req)?;
//! assert_eq!(wire.stop_conditions.max_tokens, Some(8));
//! assert_eq!(pre.tokenizer().decode(&wire.token_ids, false).unwrap(),
//!     "<|endoftext|><|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
//! # Ok(()) }
//! ```

pub mod backend;
pub mod detokenizer;
mod fast_encode;
mod length;
pub mod openai;
pub mod protocols;
pub mod template;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use detokenizer::TokenBytes;
use dynamo_multimodal::placeholder::{ImagePlaceholder, block_mm_infos};
use dynamo_multimodal::{LoadedImage, MediaPipeline};
use fast_encode::FastEncoder;
use length::TokenBudget;
use openai::{
    ChatCompletionRequest, CompletionRequest, ContentPart, MessageContent, Prompt,
    SamplingExtensions,
};
use serde_json::{Map, Value as Json};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::model_card::{
    GenerationConfig, ModelDeploymentCard, ModelInfo, PromptFormatterArtifact, TokenizerKind,
};

pub use backend::{BackendOutput, OutputProcessor};
pub use length::{COUNT_CHUNK_BYTES, UNKNOWN_CONTEXT_TOKEN_CAP};
pub use protocols::{
    FinishReason, ImageData, LLMEngineOutput, MmRoutingInfo, MultiModalData, OutputOptions,
    PreprocessedRequest, SamplingOptions, StopConditions,
};
pub use template::ChatTemplate;

/// Default `max_tokens` of `/v1/completions` (OpenAI's).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

/// Per-model preprocessing state (cheap to clone; share one per model).
#[derive(Debug, Clone)]
pub struct Preprocessor {
    model: String,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    eos_token_ids: Vec<u32>,
    context_length: u32,
    /// `max_new_tokens` of the model's `generation_config.json`: what a chat request without
    /// `max_tokens` may generate (capped by the room left in the context), as other
    /// OpenAI-compatible servers do. Without it, the room left in the context.
    default_max_tokens: Option<u32>,
    mdcsum: String,
    /// The card's `exclude_tools_when_tool_choice_none`: `tool_choice: none` keeps `tools`
    /// out of the template.
    exclude_tools_when_none: bool,
    /// Fetcher and decoder of image parts, when the card enables images.
    media: Option<MediaPipeline>,
    /// The model family's image placeholder, when known and images are enabled.
    image_placeholder: Option<ImagePlaceholder>,
    /// The card's KV block size (for the per-block image hashes).
    kv_block_size: u32,
    /// The tokenizer's per-id bytes for fast detokenization: filled by a background thread
    /// after construction; `Some(None)` when the tokenizer's decoding is not per-token bytes.
    token_bytes: Arc<OnceLock<Option<Arc<TokenBytes>>>>,
    /// Prompt ids without the tokenizer's offset bookkeeping, when the tokenizer's shape
    /// allows (`fast_encode.rs`): decided (shape and probe check) by the same background
    /// thread, before the byte table; until then, and as `Some(None)`, every prompt goes
    /// through the tokenizer, which gives the same ids.
    fast_encoder: Arc<OnceLock<Option<Arc<FastEncoder>>>>,
}

/// Most images one chat request may carry: each is fetched and decoded, so this bounds
/// the work one request can cause (OpenAI does not document a lower limit).
pub const MAX_IMAGES_PER_REQUEST: usize = 32;

fn parse_json(bytes: &[u8], path: &Path) -> Result<Json> {
    serde_json::from_slice(bytes).map_err(|e| Error::ModelFile {
        path: path.to_path_buf(),
        reason: format!("invalid JSON: {e}"),
    })
}

/// `eos_token_id` of a config: an int or a list of ints.
fn ids_of(v: Option<&Json>) -> Vec<u32> {
    match v {
        Some(Json::Number(n)) => n.as_u64().map(|i| vec![i as u32]).unwrap_or_default(),
        Some(Json::Array(a)) => a
            .iter()
            .filter_map(Json::as_u64)
            .map(|i| i as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// An assistant message's earlier `tool_calls` carry their `function.arguments` as JSON
/// text (the OpenAI wire form), but chat templates read them as a mapping (`arguments |
/// tojson`, `arguments.items()`), as vLLM and Hugging Face hand them over. Arguments that are
/// a JSON object become that object; anything else stays text for the template to handle.
fn arguments_as_objects(message: &mut Json) {
    let Some(calls) = message.get_mut("tool_calls").and_then(Json::as_array_mut) else {
        return;
    };
    for call in calls {
        let Some(arguments) = call.pointer_mut("/function/arguments") else {
            continue;
        };
        if let Some(text) = arguments.as_str()
            && let Ok(object @ Json::Object(_)) = serde_json::from_str::<Json>(text)
        {
            *arguments = object;
        }
    }
}

impl Preprocessor {
    /// Build from a card: reads (and checksum-verifies) its tokenizer, tokenizer config,
    /// custom template, `config.json` and `generation_config.json`.
    ///
    /// # Errors
    /// [`Error::ModelFile`] when the card has no tokenizer or a file is unreadable, changed
    /// or malformed; [`Error::Template`] when the chat template does not compile.
    pub fn from_card(card: &ModelDeploymentCard) -> Result<Self> {
        let Some(TokenizerKind::HfTokenizerJson(tok_file)) = &card.tokenizer else {
            return Err(Error::ModelFile {
                path: card.local_dir(),
                reason: format!("model {:?} has no tokenizer.json", card.display_name),
            });
        };
        let tokenizer =
            Tokenizer::from_bytes(tok_file.read_verified()?).map_err(|e| Error::ModelFile {
                path: tok_file.path.clone(),
                reason: e.to_string(),
            })?;
        let tok_config = match &card.prompt_formatter {
            Some(PromptFormatterArtifact::HfTokenizerConfigJson(f)) => {
                parse_json(&f.read_verified()?, &f.path)?
            }
            None => Json::Null,
        };
        let template = match &card.chat_template_file {
            Some(f) => {
                let text = String::from_utf8(f.read_verified()?).map_err(|e| Error::ModelFile {
                    path: f.path.clone(),
                    reason: e.to_string(),
                })?;
                Some(ChatTemplate::from_custom_file(&text, &tok_config)?)
            }
            None => ChatTemplate::from_tokenizer_config(&tok_config)?,
        };
        let mut eos = Vec::new();
        let mut hf_config = None;
        let mut default_max_tokens = None;
        if let Some(GenerationConfig::HfGenerationConfigJson(f)) = &card.gen_config {
            let gen_config = parse_json(&f.read_verified()?, &f.path)?;
            eos.extend(ids_of(gen_config.get("eos_token_id")));
            default_max_tokens = gen_config
                .get("max_new_tokens")
                .and_then(Json::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0);
        }
        if let Some(ModelInfo::HfConfigJson(f)) = &card.model_info {
            let config = parse_json(&f.read_verified()?, &f.path)?;
            eos.extend(ids_of(config.get("eos_token_id")));
            eos.extend(ids_of(
                config
                    .get("text_config")
                    .and_then(|t| t.get("eos_token_id")),
            ));
            hf_config = Some(config);
        }
        let media = MediaPipeline::new(card.media_fetcher.as_ref(), card.media_decoder.as_ref())
            .map_err(|e| Error::config("media_fetcher", e.to_string()))?;
        // `preprocessor_config.json` is not a card artefact: read it where the card's files
        // are, if they are on this machine; the family defaults apply otherwise.
        let image_placeholder = match (&media, &hf_config) {
            (Some(_), Some(config)) => {
                let pre = std::fs::read(card.local_dir().join("preprocessor_config.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Json>(&b).ok());
                ImagePlaceholder::from_model(config, &tokenizer, pre.as_ref())
            }
            _ => None,
        };
        if let Some(t) = template.as_ref().and_then(|t| t.special_token("eos_token"))
            && let Some(id) = tokenizer.token_to_id(t)
        {
            eos.push(id);
        }
        let mut seen = std::collections::HashSet::new();
        eos.retain(|id| seen.insert(*id));
        let tokenizer = Arc::new(tokenizer);
        let (fast_encoder, token_bytes) = build_tables(&tokenizer, &card.display_name);
        Ok(Self {
            model: card.display_name.clone(),
            token_bytes,
            fast_encoder,
            tokenizer,
            template,
            eos_token_ids: eos,
            context_length: card.context_length,
            default_max_tokens,
            mdcsum: card.mdcsum(),
            exclude_tools_when_none: card.runtime_config.exclude_tools_when_tool_choice_none,
            media,
            image_placeholder,
            kv_block_size: card.kv_cache_block_size,
        })
    }

    /// Build from a local model directory (a card named `name` is loaded first).
    ///
    /// # Errors
    /// As [`ModelDeploymentCard::load_from_disk`] and [`Self::from_card`].
    pub fn from_model_dir(dir: &Path, name: &str) -> Result<Self> {
        Self::from_card(&ModelDeploymentCard::load_from_disk(dir, Some(name))?)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's eos token ids (generation config, config and template's eos token).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Tokenize text.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if let Some(Some(f)) = self.fast_encoder.get()
            && let Some(ids) = f.encode(text, add_special_tokens)
        {
            return Ok(ids);
        }
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The most prompt tokens a request may have: the context length, or
    /// [`UNKNOWN_CONTEXT_TOKEN_CAP`] when the card does not give one.
    fn token_limit(&self) -> usize {
        if self.context_length > 0 {
            self.context_length as usize
        } else {
            UNKNOWN_CONTEXT_TOKEN_CAP
        }
    }

    fn too_long(&self, at_least: usize, param: &str) -> Error {
        let limit = self.token_limit();
        Error::request(
            format!(
                "This model's maximum context length is {limit} tokens. However, your prompt has at least {at_least} tokens. Please reduce the length of the messages or prompt."
            ),
            Some(param),
        )
    }

    /// Tokenise `text`, first counting it in pieces when it may be longer than the token
    /// limit, so that a prompt that cannot fit is refused without being tokenised whole (see
    /// `length.rs`). `counted` bytes of it were counted already (the message text of a chat
    /// request): only text beyond them can push it over.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] (`param`) when the text is longer than the limit;
    /// [`Error::Tokenizer`].
    fn encode_bounded(
        &self,
        text: &str,
        add_special_tokens: bool,
        param: &str,
        counted: usize,
    ) -> Result<Vec<u32>> {
        let limit = self.token_limit();
        // Text has at most about one token per byte, so text within `limit` bytes of what
        // was counted cannot hold much more than the limit: tokenising it whole is bounded.
        if text.len().saturating_sub(counted) > limit.max(COUNT_CHUNK_BYTES) {
            let mut budget = TokenBudget::new(&self.tokenizer, limit);
            if !budget.add(text)? {
                return Err(self.too_long(budget.counted(), param));
            }
        }
        self.encode(text, add_special_tokens)
    }

    /// Count the text of `req`'s messages against the token limit when it is long enough to
    /// matter. Returns the number of bytes counted (0 when the text was short).
    ///
    /// A conversation whose message text alone is longer than the context is refused even
    /// when the template would drop some of it (some templates strip earlier reasoning): the
    /// price of refusing a 200 MB conversation without copying it several times.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] (`messages`) when it cannot fit; [`Error::Tokenizer`].
    fn check_messages_fit(&self, req: &ChatCompletionRequest) -> Result<usize> {
        let texts = || {
            req.messages
                .iter()
                .filter_map(|m| m.content.as_ref())
                .flat_map(|c| match c {
                    MessageContent::Text(t) => vec![t.as_str()],
                    MessageContent::Parts(parts) => parts
                        .iter()
                        .filter_map(|p| match p {
                            ContentPart::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect(),
                })
        };
        let bytes: usize = texts().map(str::len).sum();
        if bytes <= self.token_limit().max(COUNT_CHUNK_BYTES) {
            return Ok(0);
        }
        let mut budget = TokenBudget::new(&self.tokenizer, self.token_limit());
        for text in texts() {
            if !budget.add(text)? {
                return Err(self.too_long(budget.counted(), "messages"));
            }
        }
        Ok(bytes)
    }

    /// Render the chat template for `req`.
    ///
    /// # Errors
    /// [`Error::Template`] (HTTP 400) when the model has no template or the template
    /// rejects the conversation.
    pub fn render_chat(&self, req: &ChatCompletionRequest) -> Result<String> {
        self.render_chat_with(req, false)
    }

    /// [`Self::render_chat`]; with `images`, image parts reach the template as HF's
    /// `{"type": "image"}` (image-aware templates write their marker for it), or, for a
    /// model with no known placeholder, content is flattened to its text.
    fn render_chat_with(&self, req: &ChatCompletionRequest, images: bool) -> Result<String> {
        let flatten_media = images && self.image_placeholder.is_none();
        let template = self.template.as_ref().ok_or_else(|| {
            Error::Template(format!(
                "model {:?} has no chat template; use /v1/completions or register a custom template",
                self.model
            ))
        })?;
        let messages = req
            .messages
            .iter()
            .map(|m| {
                let mut v = serde_json::to_value(m).unwrap_or(Json::Null);
                if let (Some(c), Some(obj)) = (&m.content, v.as_object_mut()) {
                    if c.is_text_only() || flatten_media {
                        obj.insert("content".to_owned(), Json::String(c.text()));
                    } else if images && let Some(Json::Array(parts)) = obj.get_mut("content") {
                        for part in parts.iter_mut() {
                            if part.get("type").and_then(Json::as_str) == Some("image_url") {
                                *part = serde_json::json!({"type": "image"});
                            }
                        }
                    }
                }
                arguments_as_objects(&mut v);
                v
            })
            .collect::<Vec<_>>();
        let mut extra = Map::new();
        let tool_choice_none = req.tool_choice.as_ref().and_then(Json::as_str) == Some("none");
        if let Some(tools) = &req.tools
            && !(tool_choice_none && self.exclude_tools_when_none)
        {
            extra.insert("tools".to_owned(), Json::Array(tools.clone()));
        }
        if let Some(effort) = &req.reasoning_effort {
            extra.insert("reasoning_effort".to_owned(), Json::String(effort.clone()));
        }
        for (k, v) in req.chat_template_kwargs.iter().flatten() {
            extra.insert(k.clone(), v.clone());
        }
        let continue_final = req.continue_final_message == Some(true);
        let add_generation_prompt = req.add_generation_prompt.unwrap_or(!continue_final);
        let mut prompt = template.render(&messages, add_generation_prompt, &extra)?;
        if continue_final
            && let Some(last) = req
                .messages
                .last()
                .and_then(|m| m.content.as_ref())
                .map(|c| c.text())
            && !last.is_empty()
            && let Some(pos) = prompt.rfind(&last)
        {
            prompt.truncate(pos + last.len());
        }
        Ok(prompt)
    }

    /// Preprocess a chat request.
    ///
    /// # Errors
    /// [`Error::Template`] / [`Error::InvalidRequest`] (HTTP 400) for conversations the
    /// template rejects and prompts that do not fit the context; [`Error::Tokenizer`].
    pub fn preprocess_chat(&self, req: &ChatCompletionRequest) -> Result<PreprocessedRequest> {
        self.preprocess_chat_with_media(req, Vec::new())
    }

    /// Whether the model decodes image parts (its card enables images).
    pub fn accepts_images(&self) -> bool {
        self.media.is_some()
    }

    /// Fetch, decode and hash the `image_url` parts of `req`, in prompt order (nothing when
    /// the model does not enable images: its parts then reach the template unchanged).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] (HTTP 400, `messages`) naming the image and the rule that
    /// refused it.
    pub async fn load_media(&self, req: &ChatCompletionRequest) -> Result<Vec<LoadedImage>> {
        let Some(media) = &self.media else {
            return Ok(Vec::new());
        };
        let mut urls = Vec::new();
        for part in req
            .messages
            .iter()
            .filter_map(|m| match &m.content {
                Some(MessageContent::Parts(p)) => Some(p),
                _ => None,
            })
            .flatten()
        {
            if let ContentPart::ImageUrl { image_url } = part {
                let url = image_url
                    .get("url")
                    .and_then(Json::as_str)
                    .or_else(|| image_url.as_str())
                    .ok_or_else(|| {
                        Error::request("an image_url part needs a `url` string", Some("messages"))
                    })?;
                urls.push(url);
            }
        }
        if urls.len() > MAX_IMAGES_PER_REQUEST {
            return Err(Error::request(
                format!(
                    "the request has {} images, more than {MAX_IMAGES_PER_REQUEST}",
                    urls.len()
                ),
                Some("messages"),
            ));
        }
        let loads = urls.iter().map(|u| media.load_image(u));
        futures_util::future::join_all(loads)
            .await
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.map_err(|e| Error::request(format!("image {i}: {e}"), Some("messages")))
            })
            .collect()
    }

    /// Preprocess a chat request whose images were loaded by [`Self::load_media`]: the
    /// prompt gets the family's placeholder tokens for them, and the request carries the
    /// pixels (`multi_modal_data`) and per-block image hashes (`mm_routing_info`).
    ///
    /// # Errors
    /// As [`Self::preprocess_chat`]; [`Error::InvalidRequest`] when the template wrote a
    /// different number of image markers than there are images.
    pub fn preprocess_chat_with_media(
        &self,
        req: &ChatCompletionRequest,
        images: Vec<LoadedImage>,
    ) -> Result<PreprocessedRequest> {
        // Refuse conversations whose text alone cannot fit before the template copies it.
        let counted = self.check_messages_fit(req)?;
        let prompt = self.render_chat_with(req, !images.is_empty())?;
        let mut token_ids = self.encode_bounded(&prompt, false, "messages", counted)?;
        let mut ranges = vec![None; images.len()];
        if let (Some(ph), false) = (&self.image_placeholder, images.is_empty()) {
            let sizes: Vec<(u32, u32)> = images
                .iter()
                .map(|i| (i.image.width, i.image.height))
                .collect();
            (token_ids, ranges) = ph
                .expand(&token_ids, &sizes)
                .map_err(|m| Error::request(m, Some("messages")))?;
        }
        let mut out = self.build(
            token_ids,
            req.max_output_tokens(),
            req.stop.clone(),
            &req.ext(),
        )?;
        out.sampling_options = SamplingOptions {
            n: req.n,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            temperature: req.temperature,
            top_p: req.top_p,
            seed: req.seed,
            guided_decoding: req.response_format.clone(),
            ..out.sampling_options
        };
        out.output_options.logprobs = req
            .logprobs
            .filter(|l| *l)
            .map(|_| req.top_logprobs.unwrap_or(0));
        if !images.is_empty() {
            let hashed: Vec<(u64, Option<(usize, usize)>)> = images
                .iter()
                .map(|i| i.mm_hash)
                .zip(ranges.iter().copied())
                .collect();
            out.mm_routing_info =
                block_mm_infos(&hashed, self.kv_block_size as usize, out.token_ids.len())
                    .map(|block_mm_infos| MmRoutingInfo { block_mm_infos });
            out.multi_modal_data = Some(MultiModalData {
                images: images
                    .into_iter()
                    .zip(ranges)
                    .map(|(i, token_range)| ImageData {
                        mm_hash: i.mm_hash,
                        shape: i.image.shape(),
                        dtype: "uint8".to_owned(),
                        format: i.image.format.to_owned(),
                        data: i.image.data,
                        token_range,
                    })
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Preprocess a completions request.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] (HTTP 400) for prompts that do not fit the context or
    /// hold ids outside the vocabulary; [`Error::Tokenizer`].
    pub fn preprocess_completion(&self, req: &CompletionRequest) -> Result<PreprocessedRequest> {
        let token_ids = match &req.prompt {
            Prompt::Text(t) => self.encode_bounded(t, true, "prompt", 0)?,
            Prompt::Texts(v) => {
                self.encode_bounded(v.first().map_or("", String::as_str), true, "prompt", 0)?
            }
            Prompt::Tokens(t) => t.clone(),
            Prompt::TokenLists(v) => v.first().cloned().unwrap_or_default(),
        };
        let vocab = self.tokenizer.get_vocab_size(true) as u32;
        if let Some(bad) = token_ids.iter().find(|&&t| t >= vocab) {
            return Err(Error::request(
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
                Some("prompt"),
            ));
        }
        let max = req.max_tokens.or(Some(DEFAULT_COMPLETION_MAX_TOKENS));
        let mut out = self.build(token_ids, max, req.stop.clone(), &req.ext())?;
        out.sampling_options = SamplingOptions {
            n: req.n,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            temperature: req.temperature,
            top_p: req.top_p,
            seed: req.seed,
            ..out.sampling_options
        };
        out.output_options.logprobs = req.logprobs;
        Ok(out)
    }

    fn build(
        &self,
        token_ids: Vec<u32>,
        max_tokens: Option<u32>,
        stop: Option<openai::StringOrList>,
        ext: &SamplingExtensions,
    ) -> Result<PreprocessedRequest> {
        if token_ids.is_empty() {
            return Err(Error::request("the prompt is empty", Some("prompt")));
        }
        let prompt_len = u32::try_from(token_ids.len()).unwrap_or(u32::MAX);
        let ctx = self.context_length;
        if ctx == 0 && token_ids.len() >= UNKNOWN_CONTEXT_TOKEN_CAP {
            return Err(self.too_long(token_ids.len(), "messages"));
        }
        let max_tokens = if ctx > 0 {
            if prompt_len >= ctx {
                return Err(Error::request(
                    format!(
                        "This model's maximum context length is {ctx} tokens. However, your prompt has {prompt_len} tokens. Please reduce the length of the messages or prompt."
                    ),
                    Some("messages"),
                ));
            }
            let room = ctx - prompt_len;
            match max_tokens {
                Some(m) if m > room => {
                    return Err(Error::request(
                        format!(
                            "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {m} for the completion). Please reduce the length of the prompt or max_tokens.",
                            u64::from(prompt_len) + u64::from(m)
                        ),
                        Some("max_tokens"),
                    ));
                }
                Some(m) => Some(m),
                None => Some(self.default_max_tokens.map_or(room, |d| d.min(room))),
            }
        } else {
            max_tokens.or(self.default_max_tokens)
        };
        let annotations = ext
            .nvext
            .as_ref()
            .and_then(|n| n.get("annotations"))
            .and_then(Json::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Json::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Ok(PreprocessedRequest {
            model: self.model.clone(),
            token_ids,
            stop_conditions: StopConditions {
                max_tokens,
                stop: stop.map(openai::StringOrList::into_vec),
                stop_token_ids_hidden: ext.stop_token_ids.clone(),
                min_tokens: ext.min_tokens,
                ignore_eos: ext.ignore_eos,
            },
            sampling_options: SamplingOptions {
                repetition_penalty: ext.repetition_penalty,
                top_k: ext.top_k,
                min_p: ext.min_p,
                include_stop_str_in_output: ext.include_stop_str_in_output,
                ..Default::default()
            },
            output_options: OutputOptions {
                skip_special_tokens: ext.skip_special_tokens,
                ..Default::default()
            },
            eos_token_ids: self.eos_token_ids.clone(),
            mdc_sum: Some(self.mdcsum.clone()),
            annotations,
            routing: None,
            multi_modal_data: None,
            mm_routing_info: None,
        })
    }

    /// The output processor for one request's response stream.
    pub fn output_processor(&self, req: &PreprocessedRequest) -> OutputProcessor {
        let table = self.token_bytes.get().cloned().flatten();
        OutputProcessor::new(req, Some(Arc::clone(&self.tokenizer))).with_token_bytes(table)
    }

    /// Wait until the fast detokenization table is decided; whether there is one. The fast
    /// prompt encoder is decided before it (same thread), so it is decided too.
    pub fn wait_token_bytes(&self) -> bool {
        loop {
            if let Some(t) = self.token_bytes.get() {
                return t.is_some();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Wait until the fast prompt encoder is decided; whether prompts use it.
    pub fn wait_fast_encoder(&self) -> bool {
        loop {
            if let Some(f) = self.fast_encoder.get() {
                return f.is_some();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

type Slot<T> = Arc<OnceLock<Option<Arc<T>>>>;

/// Decide the tokenizer's [`FastEncoder`] (its self-check tokenises ~30 probe strings both
/// ways) and then build its
/// [`TokenBytes`] (tens of milliseconds for a large vocabulary), on a thread of their own:
/// model load need not wait for either. Until each is decided, requests take the
/// tokenizer's own path, which gives the same ids and text, so a request that arrives early
/// is slower, never different.
fn build_tables(tokenizer: &Arc<Tokenizer>, model: &str) -> (Slot<FastEncoder>, Slot<TokenBytes>) {
    let (encoder, bytes) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let (tok, encoder_slot, bytes_slot) = (
        Arc::clone(tokenizer),
        Arc::clone(&encoder),
        Arc::clone(&bytes),
    );
    let model = model.to_owned();
    let spawned = std::thread::Builder::new()
        .name("token-tables".to_owned())
        .spawn(move || {
            let fast = match FastEncoder::new(&tok) {
                Ok(f) => Some(Arc::new(f)),
                Err(why) => {
                    tracing::debug!(%model, %why, "prompts use the tokenizer's own encoder");
                    None
                }
            };
            let _ = encoder_slot.set(fast);
            let _ = bytes_slot.set(TokenBytes::build(&tok).map(Arc::new));
        });
    if spawned.is_err() {
        let _ = encoder.set(None);
        let _ = bytes.set(None);
    }
    (encoder, bytes)
}

#[cfg(test)]
mod tests;
