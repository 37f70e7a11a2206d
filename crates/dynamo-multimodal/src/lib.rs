//! Multimodal chat requests: `image_url` content parts are fetched ([`fetch`]), decoded
//! ([`decode`]), hashed, given the model family's placeholder tokens in the prompt
//! ([`placeholder`]) and sent to the worker with their content hash (`mm_hash`), which the
//! KV router mixes into the hashes of the blocks the image covers.
//!
//! * [`MediaFetcherConfig`] and [`MediaDecoderConfig`] are what a worker registers with its
//!   model (`register_model(media_fetcher=..., media_decoder=...)`); they travel in the model
//!   card, and the frontend builds one [`MediaPipeline`] per model from them. A model
//!   registered without a decoder accepts no image parts (HTTP 400), as the reference does.
//! * Every refusal is a [`MediaError`] naming the rule that refused it (`private_address`,
//!   `max_bytes`, `content_type`, `max_pixels`, ...); the frontend answers HTTP 400 with that
//!   text.
//! * The wire form the worker receives is in `docs/design/multimodal.md`: per image `shape [h, w,
//!   3]`, `dtype "uint8"`, raw RGB bytes, `mm_hash`, and its token range in `token_ids`.
//!
//! Decoding runs on tokio's blocking pool ([`tokio::task::spawn_blocking`]) so a large image
//! never stalls the frontend's async threads.

pub mod decode;
pub mod fetch;
pub mod placeholder;

use serde::{Deserialize, Serialize};

pub use decode::{DecodedImage, ImageDecoder, ImageDecoderConfig, ImageLimits};
pub use fetch::{Fetched, MediaFetcher};
pub use placeholder::{ImageFamily, resolve_routing_image_token_id};

/// Fetcher settings (the Python `MediaFetcher` builder). Defaults are the secure ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MediaFetcherConfig {
    /// `User-Agent` header of fetches (default `dynamo-rs/<version>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// Allow URLs whose host is an IP literal, and addresses of every class (private,
    /// loopback, link-local, metadata service, ...).
    #[serde(default)]
    pub allow_direct_ip: bool,
    /// Allow URLs with an explicit port other than the scheme's default.
    #[serde(default)]
    pub allow_direct_port: bool,
    /// Allow host names that resolve to private/loopback/link-local addresses (the
    /// reference's `allow_private_ips`), without allowing IP-literal URLs.
    #[serde(default)]
    pub allow_private_ips: bool,
    /// When set, only these domains (and their subdomains) may be fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_media_domains: Option<Vec<String>>,
    /// Whole-fetch timeout in milliseconds (default [`fetch::DEFAULT_TIMEOUT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Largest response or `data:` payload in bytes (default [`fetch::DEFAULT_MAX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Decoder settings (the Python `MediaDecoder`): which media kinds are enabled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MediaDecoderConfig {
    /// Images, when `enable_image` was called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageDecoderConfig>,
}

/// Why a media item was refused. The `rule` is the setting or check that refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rule}: {detail}")]
pub struct MediaError {
    /// The rule: `scheme`, `direct_ip`, `direct_port`, `allowed_media_domains`,
    /// `private_address`, `dns`, `redirect`, `timeout`, `max_bytes`, `content_type`,
    /// `http_status`, `data_url`, `format`, `max_image_width`, `max_image_height`,
    /// `max_pixels`, `max_alloc`, `decode`, `image_disabled`, `fetch`.
    pub rule: &'static str,
    /// What exactly was refused.
    pub detail: String,
}

impl MediaError {
    pub(crate) fn new(rule: &'static str, detail: impl Into<String>) -> Self {
        Self {
            rule,
            detail: detail.into(),
        }
    }
}

/// An image ready for the worker: decoded pixels plus the content hash used for routing.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedImage {
    /// The decoded pixels.
    pub image: DecodedImage,
    /// Content hash of the decoded pixels and their shape (first 8 bytes of blake3, LE).
    pub mm_hash: u64,
}

/// The content hash of a decoded image: blake3 over `height`, `width`, `channels` (u32 LE
/// each) and the pixel bytes, truncated to its first 8 bytes (little-endian). Hashing the
/// pixels rather than the file means the same picture sent as a URL or as a data URL (or
/// re-encoded losslessly) routes to the same cached blocks.
pub fn mm_hash_of(image: &DecodedImage) -> u64 {
    let mut h = blake3::Hasher::new();
    for d in image.shape() {
        h.update(&d.to_le_bytes());
    }
    h.update(&image.data);
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// Fetcher and decoder of one model (cheap to clone).
#[derive(Debug, Clone)]
pub struct MediaPipeline {
    fetcher: MediaFetcher,
    image: Option<ImageDecoder>,
}

impl MediaPipeline {
    /// The pipeline of a model card's settings; `None` when the model enables no media
    /// (no decoder, or a decoder without images).
    ///
    /// # Errors
    /// A [`MediaError`] (`fetch`) when the HTTP client cannot be built.
    pub fn new(
        fetcher: Option<&MediaFetcherConfig>,
        decoder: Option<&MediaDecoderConfig>,
    ) -> Result<Option<Self>, MediaError> {
        let Some(image) = decoder.and_then(|d| d.image.as_ref()) else {
            return Ok(None);
        };
        let fetcher = MediaFetcher::new(fetcher.cloned().unwrap_or_default())?;
        Ok(Some(Self {
            fetcher,
            image: Some(ImageDecoder::new(image.clone())),
        }))
    }

    /// Fetch, decode (on the blocking pool) and hash one image URL.
    ///
    /// # Errors
    /// The [`MediaError`] of the fetch or decode step.
    pub async fn load_image(&self, url: &str) -> Result<LoadedImage, MediaError> {
        let decoder = self
            .image
            .clone()
            .ok_or_else(|| MediaError::new("image_disabled", "this model accepts no images"))?;
        let fetched = self.fetcher.fetch(url).await?;
        tokio::task::spawn_blocking(move || {
            let image = decoder.decode(&fetched.bytes)?;
            let mm_hash = mm_hash_of(&image);
            Ok(LoadedImage { image, mm_hash })
        })
        .await
        .map_err(|e| MediaError::new("decode", format!("decoder task failed: {e}")))?
    }
}
