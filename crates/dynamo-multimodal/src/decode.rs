//! Decoding images (PNG, JPEG, WebP, GIF's first frame) into RGB8 pixels, refusing
//! bombs before allocating.
//!
//! Order of checks in [`ImageDecoder::decode`]:
//! 1. The format is sniffed from the bytes (never trusted from a file name or header) and
//!    must be one of the enabled `formats` (`format`).
//! 2. The dimensions are read from the header alone ([`image::ImageReader::into_dimensions`]):
//!    width, height and `width * height` must be within `max_image_width`,
//!    `max_image_height` and `max_pixels` (rules of the same names). A decompression bomb
//!    (a few KB declaring 100000×100000) stops here, before any pixel buffer exists.
//! 3. Decoding runs under [`image::Limits`] (the same width/height limits and `max_alloc`,
//!    the decoder's own allocation cap), so a header that lies about its size still cannot
//!    make the decoder allocate more than `max_alloc` (`max_alloc`).
//!
//! The output is always 8-bit RGB (`shape [h, w, 3]`): alpha is dropped, grey is
//! expanded, 16-bit samples are scaled down, as vision encoders expect.

use std::io::Cursor;

use image::{ImageFormat, ImageReader};
use serde::{Deserialize, Serialize};

use super::MediaError;

/// Default largest width or height: 16384 (the largest texture size of common GPUs; no
/// vision encoder takes more without resizing).
pub const DEFAULT_MAX_DIMENSION: u32 = 16_384;
/// Default largest pixel count: 50 MP, enough for a 48 MP phone photo; its RGB8 buffer is
/// 150 MB.
pub const DEFAULT_MAX_PIXELS: u64 = 50_000_000;
/// Default decoder allocation cap: the `image` crate's own default (512 MiB).
pub const DEFAULT_MAX_ALLOC: u64 = 512 * 1024 * 1024;

/// Size limits (`enable_image({"limits": {...}})`); `None` means the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageLimits {
    /// Largest width in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_image_width: Option<u32>,
    /// Largest height in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_image_height: Option<u32>,
    /// Largest allocation the decoder may make, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_alloc: Option<u64>,
    /// Largest `width * height` (an extension of the reference's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pixels: Option<u64>,
}

/// Image decoder settings (`MediaDecoder.enable_image(options)`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageDecoderConfig {
    /// Size limits.
    #[serde(default)]
    pub limits: ImageLimits,
    /// Enabled formats (`png`, `jpeg`, `webp`, `gif`); `None` means all four (an extension
    /// of the reference's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formats: Option<Vec<String>>,
}

/// The formats this build decodes.
pub const FORMATS: [&str; 4] = ["png", "jpeg", "webp", "gif"];

fn format_name(f: ImageFormat) -> Option<&'static str> {
    Some(match f {
        ImageFormat::Png => "png",
        ImageFormat::Jpeg => "jpeg",
        ImageFormat::WebP => "webp",
        ImageFormat::Gif => "gif",
        _ => return None,
    })
}

impl ImageDecoderConfig {
    /// Parse `enable_image`'s options: `{"limits": {"max_image_width", "max_image_height",
    /// "max_alloc", "max_pixels"}, "formats": [...]}`, every key optional.
    ///
    /// # Errors
    /// A message naming the unknown key, the bad value or the unsupported format.
    pub fn from_options(options: &serde_json::Value) -> Result<Self, String> {
        const TOP: [&str; 2] = ["limits", "formats"];
        const LIMITS: [&str; 4] = [
            "max_image_width",
            "max_image_height",
            "max_alloc",
            "max_pixels",
        ];
        let unknown = |v: &serde_json::Value, allowed: &[&str], what: &str| -> Result<(), String> {
            let obj = v
                .as_object()
                .ok_or_else(|| format!("{what} must be a dict, got {v}"))?;
            match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
                Some(k) => Err(format!(
                    "unknown field `{k}` in {what}, expected one of {}",
                    allowed.join(", ")
                )),
                None => Ok(()),
            }
        };
        unknown(options, &TOP, "decoder_options")?;
        let mut config = Self::default();
        if let Some(limits) = options.get("limits") {
            unknown(limits, &LIMITS, "decoder_options['limits']")?;
            // Field by field, so the message names the key whose value is wrong.
            let field = |k: &str| format!("decoder_options['limits']['{k}']");
            let l = &mut config.limits;
            for (k, v) in limits.as_object().into_iter().flatten() {
                let bad = |e: serde_json::Error| format!("{}: {e}", field(k));
                match k.as_str() {
                    "max_image_width" => {
                        l.max_image_width = serde_json::from_value(v.clone()).map_err(bad)?
                    }
                    "max_image_height" => {
                        l.max_image_height = serde_json::from_value(v.clone()).map_err(bad)?
                    }
                    "max_alloc" => l.max_alloc = serde_json::from_value(v.clone()).map_err(bad)?,
                    _ => l.max_pixels = serde_json::from_value(v.clone()).map_err(bad)?,
                }
            }
        }
        if let Some(formats) = options.get("formats") {
            config.formats = serde_json::from_value(formats.clone())
                .map_err(|e| format!("decoder_options['formats'] must be a list of names: {e}"))?;
        }
        if let Some(formats) = &mut config.formats {
            for f in formats.iter_mut() {
                *f = f.to_ascii_lowercase();
                if f == "jpg" {
                    *f = "jpeg".to_owned();
                }
                if !FORMATS.contains(&f.as_str()) {
                    return Err(format!(
                        "unsupported image format {f:?} in decoder_options['formats'], expected some of {}",
                        FORMATS.join(", ")
                    ));
                }
            }
        }
        let l = &config.limits;
        if l.max_image_width == Some(0) || l.max_image_height == Some(0) || l.max_pixels == Some(0)
        {
            return Err("decoder_options['limits'] values must be positive".to_owned());
        }
        Ok(config)
    }
}

/// Decoded pixels: `height * width * channels` bytes, row-major, channels last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Channels per pixel (always 3: RGB).
    pub channels: u32,
    /// The file's format (`png`, `jpeg`, `webp`, `gif`).
    pub format: &'static str,
    /// The pixels.
    pub data: Vec<u8>,
}

impl DecodedImage {
    /// `[height, width, channels]`.
    pub fn shape(&self) -> [u32; 3] {
        [self.height, self.width, self.channels]
    }
}

/// An image decoder with fixed settings (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct ImageDecoder {
    config: ImageDecoderConfig,
}

impl ImageDecoder {
    /// A decoder with these settings.
    pub fn new(config: ImageDecoderConfig) -> Self {
        Self { config }
    }

    /// The settings.
    pub fn config(&self) -> &ImageDecoderConfig {
        &self.config
    }

    /// The header's format and `(width, height)`, after the format and size checks.
    ///
    /// # Errors
    /// `format`, `max_image_width`, `max_image_height`, `max_pixels` or `decode`.
    pub fn probe(&self, bytes: &[u8]) -> Result<(ImageFormat, u32, u32), MediaError> {
        let reader = ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| MediaError::new("decode", e.to_string()))?;
        let format = reader.format().ok_or_else(|| {
            MediaError::new(
                "format",
                "not an image in a known format (png, jpeg, webp, gif)",
            )
        })?;
        let name = format_name(format).ok_or_else(|| {
            MediaError::new("format", format!("{format:?} images are not decoded"))
        })?;
        if let Some(enabled) = &self.config.formats
            && !enabled.iter().any(|f| f == name)
        {
            return Err(MediaError::new(
                "format",
                format!(
                    "{name} images are not enabled (formats: {})",
                    enabled.join(", ")
                ),
            ));
        }
        let (w, h) = reader.into_dimensions().map_err(|e| {
            MediaError::new("decode", format!("cannot read the {name} header: {e}"))
        })?;
        let l = &self.config.limits;
        let max_w = l.max_image_width.unwrap_or(DEFAULT_MAX_DIMENSION);
        let max_h = l.max_image_height.unwrap_or(DEFAULT_MAX_DIMENSION);
        let max_px = l.max_pixels.unwrap_or(DEFAULT_MAX_PIXELS);
        if w > max_w {
            return Err(MediaError::new(
                "max_image_width",
                format!("the image is {w} pixels wide, more than {max_w}"),
            ));
        }
        if h > max_h {
            return Err(MediaError::new(
                "max_image_height",
                format!("the image is {h} pixels high, more than {max_h}"),
            ));
        }
        let px = u64::from(w) * u64::from(h);
        if px > max_px {
            return Err(MediaError::new(
                "max_pixels",
                format!("the image is {w}x{h} = {px} pixels, more than {max_px}"),
            ));
        }
        if w == 0 || h == 0 {
            return Err(MediaError::new("decode", "the image is empty"));
        }
        Ok((format, w, h))
    }

    /// Decode `bytes` into RGB8 pixels.
    ///
    /// # Errors
    /// The rules of [`Self::probe`], `max_alloc`, or `decode` for corrupt data.
    pub fn decode(&self, bytes: &[u8]) -> Result<DecodedImage, MediaError> {
        let (format, w, h) = self.probe(bytes)?;
        let l = &self.config.limits;
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(l.max_image_width.unwrap_or(DEFAULT_MAX_DIMENSION));
        limits.max_image_height = Some(l.max_image_height.unwrap_or(DEFAULT_MAX_DIMENSION));
        let max_alloc = l.max_alloc.unwrap_or(DEFAULT_MAX_ALLOC);
        limits.max_alloc = Some(max_alloc);
        // The RGB8 output is allocated after decoding, outside the decoder's limits.
        let out_bytes = u64::from(w) * u64::from(h) * 3;
        if out_bytes > max_alloc {
            return Err(MediaError::new(
                "max_alloc",
                format!(
                    "decoding {w}x{h} needs {out_bytes} bytes, more than max_alloc ({max_alloc})"
                ),
            ));
        }
        let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
        reader.limits(limits);
        let name = format_name(format).unwrap_or("image");
        let img = reader.decode().map_err(|e| match e {
            image::ImageError::Limits(l) => MediaError::new(
                "max_alloc",
                format!("decoding the {name} exceeds the limits: {l}"),
            ),
            other => MediaError::new("decode", format!("cannot decode the {name}: {other}")),
        })?;
        let rgb = img.into_rgb8();
        let (width, height) = rgb.dimensions();
        Ok(DecodedImage {
            width,
            height,
            channels: 3,
            format: name,
            data: rgb.into_raw(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG of `w`×`h` RGB pixels, encoded by the `image` crate.
    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).expect("encode");
        out.into_inner()
    }

    /// A PNG whose IHDR declares `w`×`h` but whose data is a few bytes (a decompression
    /// bomb's header): signature, IHDR, a tiny IDAT and IEND, with correct CRCs.
    fn bomb_header(w: u32, h: u32) -> Vec<u8> {
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&w.to_be_bytes());
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [
            (b"IHDR", &ihdr[..]),
            (b"IDAT", &[0x78, 0x9c, 0x63, 0, 0, 0, 1, 0, 1][..]),
            (b"IEND", &[][..]),
        ] {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut body = kind.to_vec();
            body.extend_from_slice(data);
            out.extend_from_slice(&body);
            out.extend_from_slice(&crc32(&body).to_be_bytes());
        }
        out
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn decodes_png_to_rgb() {
        let img = ImageDecoder::default().decode(&png(5, 3)).expect("decodes");
        assert_eq!(img.shape(), [3, 5, 3]);
        assert_eq!(img.format, "png");
        assert_eq!(img.data.len(), 45);
        // Pixel (x=4, y=2).
        let at = (2 * 5 + 4) * 3;
        assert_eq!(&img.data[at..at + 3], &[4, 2, 7]);
    }

    #[test]
    fn bombs_are_refused_from_the_header() {
        let d = ImageDecoder::default();
        let rule = |b: &[u8]| d.probe(b).err().map(|e| e.rule);
        assert_eq!(rule(&bomb_header(100_000, 10)), Some("max_image_width"));
        assert_eq!(rule(&bomb_header(10, 100_000)), Some("max_image_height"));
        assert_eq!(rule(&bomb_header(10_000, 10_000)), Some("max_pixels"));
        let tight = ImageDecoder::new(ImageDecoderConfig {
            limits: ImageLimits {
                max_alloc: Some(1000),
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(
            tight.decode(&png(100, 100)).err().map(|e| e.rule),
            Some("max_alloc")
        );
    }

    #[test]
    fn formats_and_garbage() {
        let only_jpeg = ImageDecoder::new(ImageDecoderConfig {
            formats: Some(vec!["jpeg".into()]),
            ..Default::default()
        });
        assert_eq!(
            only_jpeg.decode(&png(2, 2)).err().map(|e| e.rule),
            Some("format")
        );
        let d = ImageDecoder::default();
        assert_eq!(
            d.decode(b"<html></html>").err().map(|e| e.rule),
            Some("format")
        );
        let mut truncated = png(64, 64);
        truncated.truncate(truncated.len() / 2);
        assert_eq!(d.decode(&truncated).err().map(|e| e.rule), Some("decode"));
    }

    #[test]
    fn options_are_validated() {
        let ok = ImageDecoderConfig::from_options(&serde_json::json!({
            "limits": {"max_image_width": 10, "max_pixels": 50},
            "formats": ["PNG", "jpg"]
        }))
        .expect("valid");
        assert_eq!(
            ok.formats.as_deref(),
            Some(&["png".to_owned(), "jpeg".to_owned()][..])
        );
        for bad in [
            serde_json::json!({"max_image_width": 10}),
            serde_json::json!({"limits": {"foo": 1}}),
            serde_json::json!({"limits": {"max_image_width": -1}}),
            serde_json::json!({"limits": 5}),
            serde_json::json!({"formats": ["tiff"]}),
            serde_json::json!({"limits": {"max_pixels": 0}}),
        ] {
            assert!(ImageDecoderConfig::from_options(&bad).is_err(), "{bad}");
        }
    }
}
