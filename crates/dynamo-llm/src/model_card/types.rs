//! What a model takes ([`ModelInput`]), which API surfaces it serves ([`ModelType`]) and the
//! role of its worker ([`WorkerType`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// What a worker's `generate` receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ModelInput {
    /// The raw OpenAI request; the engine does its own templating and tokenization.
    Text = 1,
    /// A [`crate::preprocessor::PreprocessedRequest`]: token ids plus stop conditions and
    /// sampling options (the frontend templates and tokenizes).
    #[default]
    Tokens = 2,
    /// The tensor protocol.
    Tensor = 3,
}

impl ModelInput {
    /// From the Python enum value (1, 2, 3).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn from_value(value: i64) -> Result<Self> {
        match value {
            1 => Ok(Self::Text),
            2 => Ok(Self::Tokens),
            3 => Ok(Self::Tensor),
            _ => Err(Error::config(
                "model_input",
                format!("unknown value {value}"),
            )),
        }
    }
}

/// A set of OpenAI-style API surfaces a model serves (bit flags; combine with `|`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelType(u32);

/// Flag names in bit order, as `Display` writes them (the reference's lowercase names).
const FLAG_NAMES: [(ModelType, &str); 11] = [
    (ModelType::CHAT, "chat"),
    (ModelType::COMPLETIONS, "completions"),
    (ModelType::EMBEDDING, "embedding"),
    (ModelType::TENSOR_BASED, "tensor"),
    (ModelType::PREFILL, "prefill"),
    (ModelType::IMAGES, "images"),
    (ModelType::AUDIOS, "audios"),
    (ModelType::VIDEOS, "videos"),
    (ModelType::REALTIME, "realtime"),
    (ModelType::CLASSIFY, "classify"),
    (ModelType::POOLING, "pooling"),
];

impl ModelType {
    /// No surface (prefill and encode workers).
    pub const EMPTY: Self = Self(0);
    /// `/v1/chat/completions`.
    pub const CHAT: Self = Self(1);
    /// `/v1/completions`.
    pub const COMPLETIONS: Self = Self(1 << 1);
    /// `/v1/embeddings`.
    pub const EMBEDDING: Self = Self(1 << 2);
    /// The tensor protocol.
    pub const TENSOR_BASED: Self = Self(1 << 3);
    /// Legacy marker of prefill workers (carries no OpenAI surface).
    pub const PREFILL: Self = Self(1 << 4);
    /// `/v1/images/generations`.
    pub const IMAGES: Self = Self(1 << 5);
    /// Audio generation.
    pub const AUDIOS: Self = Self(1 << 6);
    /// `/v1/videos/generations`.
    pub const VIDEOS: Self = Self(1 << 7);
    /// `/v1/realtime`.
    pub const REALTIME: Self = Self(1 << 8);
    /// Classification.
    pub const CLASSIFY: Self = Self(1 << 9);
    /// Pooling (hidden-state outputs).
    pub const POOLING: Self = Self(1 << 10);
    /// Every defined bit.
    const ALL: u32 = (1 << 11) - 1;

    /// From raw bits.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when an undefined bit is set.
    pub fn from_bits(bits: u32) -> Result<Self> {
        if bits & !Self::ALL != 0 {
            return Err(Error::config(
                "model_type",
                format!("unknown bits {bits:#x}"),
            ));
        }
        Ok(Self(bits))
    }

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Union of two sets.
    #[must_use]
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// No flag set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Serves `/v1/chat/completions`.
    pub fn supports_chat(self) -> bool {
        self.contains(Self::CHAT)
    }

    /// Serves `/v1/completions`.
    pub fn supports_completions(self) -> bool {
        self.contains(Self::COMPLETIONS)
    }

    /// Serves `/v1/embeddings`.
    pub fn supports_embedding(self) -> bool {
        self.contains(Self::EMBEDDING)
    }

    /// Serves the tensor protocol.
    pub fn supports_tensor(self) -> bool {
        self.contains(Self::TENSOR_BASED)
    }

    /// Serves classification.
    pub fn supports_classify(self) -> bool {
        self.contains(Self::CLASSIFY)
    }

    /// Serves pooling.
    pub fn supports_pooling(self) -> bool {
        self.contains(Self::POOLING)
    }

    /// Serves images, videos or realtime: surfaces whose models register without
    /// tokenizer files.
    pub fn is_media_or_tensor(self) -> bool {
        self.intersects(Self(
            Self::TENSOR_BASED.0 | Self::IMAGES.0 | Self::VIDEOS.0 | Self::REALTIME.0,
        ))
    }

    /// Carries an OpenAI surface (anything but the legacy prefill marker).
    pub fn has_openai_surface(self) -> bool {
        self.0 & !Self::PREFILL.0 != 0
    }
}

impl std::ops::BitOr for ModelType {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl fmt::Display for ModelType {
    /// The set flags' names joined by `,` (`chat,completions`); empty for [`ModelType::EMPTY`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (flag, name) in FLAG_NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelType({self})")
    }
}

impl FromStr for ModelType {
    type Err = Error;

    /// Parses the [`Display`](fmt::Display) form; also accepts `|` separators and spaces.
    fn from_str(s: &str) -> Result<Self> {
        let mut out = Self::EMPTY;
        for part in s.split([',', '|']).map(str::trim).filter(|p| !p.is_empty()) {
            let lower = part.to_ascii_lowercase();
            let flag = FLAG_NAMES
                .iter()
                .find(|(_, name)| *name == lower || (lower == "tensorbased" && *name == "tensor"))
                .map(|(flag, _)| *flag)
                .ok_or_else(|| Error::config("model_type", format!("unknown flag {part:?}")))?;
            out = out | flag;
        }
        Ok(out)
    }
}

impl Serialize for ModelType {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ModelType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The role of a worker in (dis)aggregated serving. Not combinable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerType {
    /// Prefill only; hands the KV cache to a decode worker.
    Prefill = 1,
    /// Decode only.
    Decode = 2,
    /// Multimodal encoder.
    Encode = 3,
    /// Prefill and decode in one worker (the default).
    #[default]
    Aggregated = 4,
}

impl WorkerType {
    /// From the Python enum value (1..=4).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other value.
    pub fn from_value(value: i64) -> Result<Self> {
        match value {
            1 => Ok(Self::Prefill),
            2 => Ok(Self::Decode),
            3 => Ok(Self::Encode),
            4 => Ok(Self::Aggregated),
            _ => Err(Error::config(
                "worker_type",
                format!("unknown value {value}"),
            )),
        }
    }

    /// Lowercase name: `prefill`, `decode`, `encode`, `aggregated`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Encode => "encode",
            Self::Aggregated => "aggregated",
        }
    }
}

impl fmt::Display for WorkerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "prefill" => Ok(Self::Prefill),
            "decode" => Ok(Self::Decode),
            "encode" => Ok(Self::Encode),
            "aggregated" => Ok(Self::Aggregated),
            _ => Err(Error::config(
                "worker_type",
                format!("must be prefill, decode, encode or aggregated, got {s:?}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_type_union_display_and_parse() {
        let t = ModelType::CHAT | ModelType::COMPLETIONS;
        assert_eq!(t.to_string(), "chat,completions");
        assert!(t.supports_chat() && t.supports_completions() && !t.supports_embedding());
        assert_eq!("chat,completions".parse::<ModelType>().expect("parse"), t);
        assert_eq!("Chat | Completions".parse::<ModelType>().expect("parse"), t);
        assert_eq!(ModelType::TENSOR_BASED.to_string(), "tensor");
        assert_eq!(ModelType::EMPTY.to_string(), "");
        assert_eq!("".parse::<ModelType>().expect("parse"), ModelType::EMPTY);
        assert!("chat,bogus".parse::<ModelType>().is_err());
        assert!(ModelType::from_bits(1 << 20).is_err());
        let json = serde_json::to_string(&t).expect("json");
        assert_eq!(json, r#""chat,completions""#);
        assert_eq!(serde_json::from_str::<ModelType>(&json).expect("back"), t);
    }

    #[test]
    fn prefill_marker_is_not_an_openai_surface() {
        assert!(!ModelType::PREFILL.has_openai_surface());
        assert!(!ModelType::EMPTY.has_openai_surface());
        assert!((ModelType::PREFILL | ModelType::CHAT).has_openai_surface());
        assert!(ModelType::IMAGES.is_media_or_tensor());
        assert!(!ModelType::CHAT.is_media_or_tensor());
    }

    #[test]
    fn worker_type_names_and_values() {
        for (v, name) in [
            (1, "prefill"),
            (2, "decode"),
            (3, "encode"),
            (4, "aggregated"),
        ] {
            let w = WorkerType::from_value(v).expect("valid");
            assert_eq!(w.to_string(), name);
            assert_eq!(name.parse::<WorkerType>().expect("parse"), w);
            assert_eq!(w as i64, v);
        }
        assert!(WorkerType::from_value(0).is_err());
        assert_eq!(WorkerType::default(), WorkerType::Aggregated);
        assert_eq!(
            ModelInput::from_value(2).expect("valid"),
            ModelInput::Tokens
        );
        assert!(ModelInput::from_value(4).is_err());
    }
}
