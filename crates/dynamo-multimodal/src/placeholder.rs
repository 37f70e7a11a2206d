//! Image placeholder tokens per model family, and which KV blocks each image covers.
//!
//! A vision-language model's chat template writes one *marker* per image (`{"type":
//! "image"}` parts become `<|image_pad|>`, `<image>`, `<start_of_image>`, ...); its
//! processor then expands each marker to the image's *placeholder* tokens, whose count
//! depends on the image size. [`ImagePlaceholder::expand`] does that expansion on the token
//! ids, and [`block_mm_infos`] says which blocks each image's tokens fall in, so the KV
//! router hashes those blocks with the image's `mm_hash`.
//!
//! | family | `model_type` | marker → expansion | placeholder id |
//! |---|---|---|---|
//! | Qwen2-VL, Qwen2.5-VL | `qwen2_vl`, `qwen2_5_vl` | `<\|image_pad\|>` → pad × (h/28)(w/28) after Qwen's `smart_resize` | `image_token_id`, else `<\|image_pad\|>` |
//! | Qwen3-VL | `qwen3_vl`, `qwen3_vl_moe` | same with 32-pixel cells | same |
//! | LLaVA | `llava` | `<image>` → × (image_size/patch_size)² (576) | `image_token_index`, else `<image>` |
//! | Llama-4 | `llama4` | `<\|image\|>` kept as written (no expansion) | `image_token_index`, else `<\|image\|>` |
//! | Gemma-3 | `gemma3` | `<start_of_image>` → boi, `<image_soft_token>` × `mm_tokens_per_image` (256), eoi | `image_token_index`, else `<image_soft_token>` |
//! | InternVL | `internvl`, `internvl_chat` | `<IMG_CONTEXT>` → `<img>`, ctx × 256, `</img>` (one tile) | `image_token_id`, else `<IMG_CONTEXT>` |
//!
//! Unknown families get no placeholders: their images still change the routing hash (of
//! the first block, and so of every block after it) but are not in the prompt.

use std::path::Path;

use dynamo_kv_router::hashing::{BlockExtraInfo, BlockMmObjectInfo};
use serde_json::Value as Json;
use tokenizers::Tokenizer;

/// `[start, end)` of an image's placeholder tokens in a prompt.
pub type TokenRange = (usize, usize);

/// Expanded prompt tokens and, per image, its placeholder range (`None`: not in the prompt).
pub type Expansion = (Vec<u32>, Vec<Option<TokenRange>>);

/// The vision-language families the frontend knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFamily {
    /// Qwen2-VL and Qwen2.5-VL.
    Qwen2Vl,
    /// Qwen3-VL.
    Qwen3Vl,
    /// LLaVA (1.5).
    Llava,
    /// Llama-4.
    Llama4,
    /// Gemma-3.
    Gemma3,
    /// InternVL (HF and original checkpoints).
    InternVl,
}

impl ImageFamily {
    /// The family of a `config.json` (its `model_type`, else its first architecture).
    pub fn detect(config: &Json) -> Option<Self> {
        let model_type = config
            .get("model_type")
            .and_then(Json::as_str)
            .unwrap_or("");
        let by_type = match model_type {
            "qwen2_vl" | "qwen2_5_vl" => Some(Self::Qwen2Vl),
            "qwen3_vl" | "qwen3_vl_moe" => Some(Self::Qwen3Vl),
            "llava" => Some(Self::Llava),
            "llama4" => Some(Self::Llama4),
            "gemma3" => Some(Self::Gemma3),
            "internvl" | "internvl_chat" => Some(Self::InternVl),
            _ => None,
        };
        by_type.or_else(|| {
            let arch = config
                .get("architectures")
                .and_then(Json::as_array)
                .and_then(|a| a.first())
                .and_then(Json::as_str)
                .unwrap_or("");
            match arch {
                "Qwen2VLForConditionalGeneration" | "Qwen2_5_VLForConditionalGeneration" => {
                    Some(Self::Qwen2Vl)
                }
                "Qwen3VLForConditionalGeneration" | "Qwen3VLMoeForConditionalGeneration" => {
                    Some(Self::Qwen3Vl)
                }
                "LlavaForConditionalGeneration" => Some(Self::Llava),
                "Llama4ForConditionalGeneration" => Some(Self::Llama4),
                "Gemma3ForConditionalGeneration" => Some(Self::Gemma3),
                "InternVLForConditionalGeneration" | "InternVLChatModel" => Some(Self::InternVl),
                _ => None,
            }
        })
    }
}

/// How many placeholder tokens one image gets.
#[derive(Debug, Clone, PartialEq)]
enum Count {
    /// Qwen's grid: the image resized to multiples of `cell` within the pixel bounds, one
    /// token per cell.
    Grid {
        cell: u64,
        min_pixels: u64,
        max_pixels: u64,
    },
    /// A fixed count.
    Fixed(usize),
    /// The marker is the placeholder, left as the template wrote it.
    Keep,
}

/// A model's image placeholder: what the template writes and what it becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePlaceholder {
    /// The family.
    pub family: ImageFamily,
    /// Token the chat template writes per image.
    pub marker_id: u32,
    /// Token repeated for the image's features (what routing treats as the image).
    pub placeholder_id: u32,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    count: Count,
}

fn config_id(config: &Json, keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| {
        config
            .get(*k)
            .or_else(|| config.get("text_config").and_then(|t| t.get(*k)))
            .and_then(Json::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    })
}

fn u64_at(v: Option<&Json>, path: &[&str]) -> Option<u64> {
    let mut cur = v?;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_u64()
}

impl ImagePlaceholder {
    /// The placeholder of a model from its `config.json`, tokenizer and (optional)
    /// `preprocessor_config.json`; `None` for unknown families or missing tokens.
    pub fn from_model(
        config: &Json,
        tokenizer: &Tokenizer,
        preprocessor: Option<&Json>,
    ) -> Option<Self> {
        let family = ImageFamily::detect(config)?;
        let tok = |s: &str| tokenizer.token_to_id(s);
        Some(match family {
            ImageFamily::Qwen2Vl | ImageFamily::Qwen3Vl => {
                let pad = tok("<|image_pad|>");
                let placeholder_id = config_id(config, &["image_token_id"]).or(pad)?;
                let qwen3 = family == ImageFamily::Qwen3Vl;
                // Qwen's processor defaults (patch 14 or 16, merge 2, and its pixel bounds).
                let patch =
                    u64_at(preprocessor, &["patch_size"]).unwrap_or(if qwen3 { 16 } else { 14 });
                let merge = u64_at(preprocessor, &["merge_size"]).unwrap_or(2);
                let min_pixels = u64_at(preprocessor, &["min_pixels"])
                    .or_else(|| u64_at(preprocessor, &["size", "shortest_edge"]))
                    .unwrap_or(if qwen3 { 65_536 } else { 3_136 });
                let max_pixels = u64_at(preprocessor, &["max_pixels"])
                    .or_else(|| u64_at(preprocessor, &["size", "longest_edge"]))
                    .unwrap_or(if qwen3 { 16_777_216 } else { 12_845_056 });
                Self {
                    family,
                    marker_id: pad.unwrap_or(placeholder_id),
                    placeholder_id,
                    prefix: Vec::new(),
                    suffix: Vec::new(),
                    count: Count::Grid {
                        cell: (patch * merge).max(1),
                        min_pixels,
                        max_pixels,
                    },
                }
            }
            ImageFamily::Llava => {
                let placeholder_id = config_id(config, &["image_token_index", "image_token_id"])
                    .or_else(|| tok("<image>"))?;
                let vision = config.get("vision_config");
                let size = u64_at(vision, &["image_size"]).unwrap_or(336);
                let patch = u64_at(vision, &["patch_size"]).unwrap_or(14).max(1);
                Self {
                    family,
                    marker_id: tok("<image>").unwrap_or(placeholder_id),
                    placeholder_id,
                    prefix: Vec::new(),
                    suffix: Vec::new(),
                    count: Count::Fixed(((size / patch) * (size / patch)) as usize),
                }
            }
            ImageFamily::Llama4 => {
                let placeholder_id = config_id(config, &["image_token_index", "image_token_id"])
                    .or_else(|| tok("<|image|>"))?;
                Self {
                    family,
                    marker_id: tok("<|image|>").unwrap_or(placeholder_id),
                    placeholder_id,
                    prefix: Vec::new(),
                    suffix: Vec::new(),
                    count: Count::Keep,
                }
            }
            ImageFamily::Gemma3 => {
                let placeholder_id = config_id(config, &["image_token_index", "image_token_id"])
                    .or_else(|| tok("<image_soft_token>"))?;
                let boi =
                    config_id(config, &["boi_token_index"]).or_else(|| tok("<start_of_image>"))?;
                let eoi = config_id(config, &["eoi_token_index"]).or_else(|| tok("<end_of_image>"));
                let n = u64_at(Some(config), &["mm_tokens_per_image"]).unwrap_or(256) as usize;
                Self {
                    family,
                    marker_id: boi,
                    placeholder_id,
                    prefix: vec![boi],
                    suffix: eoi.into_iter().collect(),
                    count: Count::Fixed(n),
                }
            }
            ImageFamily::InternVl => {
                let ctx = tok("<IMG_CONTEXT>");
                let placeholder_id =
                    config_id(config, &["image_token_id", "image_token_index"]).or(ctx)?;
                Self {
                    family,
                    marker_id: ctx.unwrap_or(placeholder_id),
                    placeholder_id,
                    prefix: tok("<img>").into_iter().collect(),
                    suffix: tok("</img>").into_iter().collect(),
                    // (448 / 14)² patches, pixel-shuffled by 0.5 in each direction: 256.
                    count: Count::Fixed(256),
                }
            }
        })
    }

    /// Placeholder tokens of one `width`×`height` image (`None`: keep the marker).
    pub fn tokens_for(&self, width: u32, height: u32) -> Option<usize> {
        match self.count {
            Count::Keep => None,
            Count::Fixed(n) => Some(n),
            Count::Grid {
                cell,
                min_pixels,
                max_pixels,
            } => {
                let (h, w) = smart_resize(
                    u64::from(height),
                    u64::from(width),
                    cell,
                    min_pixels,
                    max_pixels,
                );
                Some(((h / cell) * (w / cell)) as usize)
            }
        }
    }

    /// Expand each marker in `tokens` for the image at the same position of `sizes`
    /// (`(width, height)`). Returns the new tokens and, per image, the token range of its
    /// placeholders. With no marker in `tokens` (a template that ignores images) nothing
    /// changes and the ranges are `None`.
    ///
    /// # Errors
    /// A message when the template wrote a marker count other than the image count.
    pub fn expand(&self, tokens: &[u32], sizes: &[(u32, u32)]) -> Result<Expansion, String> {
        let markers = tokens.iter().filter(|&&t| t == self.marker_id).count();
        if markers == 0 {
            return Ok((tokens.to_vec(), vec![None; sizes.len()]));
        }
        if markers != sizes.len() {
            return Err(format!(
                "the chat template wrote {markers} image placeholders for {} images",
                sizes.len()
            ));
        }
        let mut out = Vec::with_capacity(tokens.len());
        let mut ranges = Vec::with_capacity(sizes.len());
        let mut next = sizes.iter();
        for &t in tokens {
            if t != self.marker_id {
                out.push(t);
                continue;
            }
            let &(w, h) = next.next().unwrap_or(&(0, 0));
            match self.tokens_for(w, h) {
                None => {
                    ranges.push(Some((out.len(), out.len() + 1)));
                    out.push(t);
                }
                Some(n) => {
                    out.extend_from_slice(&self.prefix);
                    let start = out.len();
                    out.extend(std::iter::repeat_n(self.placeholder_id, n));
                    ranges.push(Some((start, out.len())));
                    out.extend_from_slice(&self.suffix);
                }
            }
        }
        Ok((out, ranges))
    }
}

/// Qwen's `smart_resize`: `(height, width)` rounded to multiples of `factor`, scaled to
/// stay within `[min_pixels, max_pixels]`, keeping the aspect ratio.
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> (u64, u64) {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let round = |x: f64| ((x / f).round() * f).max(f);
    let (mut hb, mut wb) = (round(h), round(w));
    if hb * wb > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        hb = ((h / beta / f).floor() * f).max(f);
        wb = ((w / beta / f).floor() * f).max(f);
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    (hb as u64, wb as u64)
}

/// Per-block multimodal info for a prompt of `num_tokens` tokens: each image's `mm_hash`
/// is attached to every block its token range overlaps (offsets relative to the block),
/// and an image with no range (the prompt has no placeholder for it) to the first block,
/// whose hash every later block's sequence hash chains from. `None` when no block is
/// affected.
pub fn block_mm_infos(
    images: &[(u64, Option<(usize, usize)>)],
    block_size: usize,
    num_tokens: usize,
) -> Option<Vec<Option<BlockExtraInfo>>> {
    if images.is_empty() || block_size == 0 {
        return None;
    }
    let blocks = num_tokens.div_ceil(block_size).max(1);
    let mut infos: Vec<Option<BlockExtraInfo>> = vec![None; blocks];
    for &(mm_hash, range) in images {
        let (start, end) = range.unwrap_or((0, 0));
        let first = start / block_size;
        let last = if end > start {
            (end - 1) / block_size
        } else {
            first
        };
        for (b, slot) in infos.iter_mut().enumerate().take(last + 1).skip(first) {
            let base = b * block_size;
            let s = start.max(base) - base;
            let e = end.min(base + block_size).saturating_sub(base).max(s);
            slot.get_or_insert_with(BlockExtraInfo::default)
                .mm_objects
                .push(BlockMmObjectInfo {
                    mm_hash,
                    offsets: if end > start {
                        vec![(s, e)]
                    } else {
                        Vec::new()
                    },
                });
        }
    }
    Some(infos)
}

/// The routing-side image placeholder token id of the model in `model_dir` (its
/// `config.json` and `tokenizer.json`), or `None` for unknown families and unreadable
/// files. `model_id` (the HF id) is not needed: the family comes from `config.json`.
pub fn resolve_routing_image_token_id(_model_id: &str, model_dir: &Path) -> Option<u32> {
    let config: Json =
        serde_json::from_slice(&std::fs::read(model_dir.join("config.json")).ok()?).ok()?;
    ImageFamily::detect(&config)?;
    let tokenizer = Tokenizer::from_file(model_dir.join("tokenizer.json")).ok();
    let preprocessor: Option<Json> = std::fs::read(model_dir.join("preprocessor_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    match &tokenizer {
        Some(t) => ImagePlaceholder::from_model(&config, t, preprocessor.as_ref())
            .map(|p| p.placeholder_id),
        // Without a tokenizer only an id written in the config can be given.
        None => {
            let keys: &[&str] = match ImageFamily::detect(&config)? {
                ImageFamily::Qwen2Vl | ImageFamily::Qwen3Vl | ImageFamily::InternVl => {
                    &["image_token_id"]
                }
                _ => &["image_token_index", "image_token_id"],
            };
            config_id(&config, keys)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_grid_matches_the_hf_processor() {
        // 1024x1024 with Qwen2-VL's bounds: round(1024 / 28) = 37 cells a side, as HF's
        // `smart_resize` gives (1036x1036).
        assert_eq!(smart_resize(1024, 1024, 28, 3136, 12_845_056), (1036, 1036));
        assert_eq!(smart_resize(500, 300, 28, 3136, 12_845_056), (504, 308));
        // Tiny images grow to min_pixels: 56x56 -> 2x2 cells.
        assert_eq!(smart_resize(10, 10, 28, 3136, 12_845_056), (56, 56));
        // Huge images shrink under max_pixels.
        let (h, w) = smart_resize(8000, 6000, 28, 3136, 1_003_520);
        assert!(h * w <= 1_003_520 && h % 28 == 0 && w % 28 == 0);
    }

    #[test]
    fn blocks_get_the_hashes_of_the_images_they_overlap() {
        // Image A at tokens 5..20, image B has no placeholder; block size 8, 24 tokens.
        let infos = block_mm_infos(&[(0xA, Some((5, 20))), (0xB, None)], 8, 24).expect("some");
        assert_eq!(infos.len(), 3);
        let hashes = |i: usize| -> Vec<u64> {
            infos[i]
                .as_ref()
                .map(|x| x.mm_objects.iter().map(|o| o.mm_hash).collect())
                .unwrap_or_default()
        };
        assert_eq!(hashes(0), vec![0xA, 0xB]);
        assert_eq!(hashes(1), vec![0xA]);
        assert_eq!(hashes(2), vec![0xA]);
        assert_eq!(
            infos[0].as_ref().expect("block 0").mm_objects[0].offsets,
            vec![(5, 8)]
        );
        assert_eq!(
            infos[2].as_ref().expect("block 2").mm_objects[0].offsets,
            vec![(0, 4)]
        );
        assert!(block_mm_infos(&[], 8, 24).is_none());
    }
}
