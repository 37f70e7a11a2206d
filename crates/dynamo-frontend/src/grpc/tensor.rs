//! Tensor models: the `tensor_model_config` a worker registers, the request and response
//! a tensor worker's handler sees, and their conversion from and to KServe v2 tensors.
//!
//! The worker's request is a map (the reference's shape):
//! `{"id": str|None, "model": str, "tensors": [{"metadata": {"name", "data_type", "shape"},
//! "data": {"data_type", "values": [...]}}], "parameters"?: {name: {"int64": 1} | {"double":
//! 1.5} | {"bool": true} | {"string": "x"} | {"uint64": 1}}}`; data types are named
//! `Bool`, `Uint8`…`Uint64`, `Int8`…`Int64`, `Float16`, `BFloat16`, `Float32`, `Float64`,
//! `Bytes` (BYTES values are lists of byte values). The handler answers
//! `{"model"?, "id"?, "tensors": [...], "parameters"?: {...}}` in the same shape.
//!
//! Invariants: a converted tensor's value count equals the product of its shape; KServe
//! inputs are checked against the model's config (names, data types, ranks and fixed
//! dimensions) before anything reaches the worker, and every error names the input.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::proto::infer_parameter::ParameterChoice;
use super::proto::model_infer_request::InferInputTensor;
use super::proto::model_infer_response::InferOutputTensor;
use super::proto::{InferParameter, InferTensorContents};

/// A tensor element type, named as in the worker's request and `tensor_model_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[expect(missing_docs, reason = "the variants are the protocol's type names")]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    BFloat16,
    Float32,
    Float64,
    Bytes,
}

/// (type, KServe datatype name, Triton config enum name, bytes per element; 0: variable).
const TYPES: [(DataType, &str, &str, usize); 14] = [
    (DataType::Bool, "BOOL", "TYPE_BOOL", 1),
    (DataType::Uint8, "UINT8", "TYPE_UINT8", 1),
    (DataType::Uint16, "UINT16", "TYPE_UINT16", 2),
    (DataType::Uint32, "UINT32", "TYPE_UINT32", 4),
    (DataType::Uint64, "UINT64", "TYPE_UINT64", 8),
    (DataType::Int8, "INT8", "TYPE_INT8", 1),
    (DataType::Int16, "INT16", "TYPE_INT16", 2),
    (DataType::Int32, "INT32", "TYPE_INT32", 4),
    (DataType::Int64, "INT64", "TYPE_INT64", 8),
    (DataType::Float16, "FP16", "TYPE_FP16", 2),
    (DataType::BFloat16, "BF16", "TYPE_BF16", 2),
    (DataType::Float32, "FP32", "TYPE_FP32", 4),
    (DataType::Float64, "FP64", "TYPE_FP64", 8),
    (DataType::Bytes, "BYTES", "TYPE_STRING", 0),
];

impl DataType {
    fn row(self) -> (DataType, &'static str, &'static str, usize) {
        TYPES
            .into_iter()
            .find(|r| r.0 == self)
            .unwrap_or((self, "BYTES", "TYPE_STRING", 0))
    }

    /// The KServe v2 datatype name (`FP32`, `BYTES`, ...).
    pub fn kserve_name(self) -> &'static str {
        self.row().1
    }

    /// The Triton model-config enum value (`TYPE_FP32`, `TYPE_STRING`, ...).
    pub fn triton_config_type(self) -> i32 {
        super::proto::DataType::from_str_name(self.row().2).map_or(0, |t| t as i32)
    }

    /// The type of a KServe datatype name.
    pub fn from_kserve(name: &str) -> Option<Self> {
        TYPES.into_iter().find(|r| r.1 == name).map(|r| r.0)
    }

    /// Bytes per element (`None` for `Bytes`).
    fn width(self) -> Option<usize> {
        Some(self.row().3).filter(|w| *w > 0)
    }
}

/// Name, type and shape of one tensor (`-1`: any size in that dimension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMetadata {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub data_type: DataType,
    /// Dimensions.
    pub shape: Vec<i64>,
}

/// The inputs and outputs of a tensor model (`tensor_model_config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorModelConfig {
    /// Model name.
    #[serde(default)]
    pub name: String,
    /// Inputs the model takes.
    #[serde(default)]
    pub inputs: Vec<TensorMetadata>,
    /// Outputs it answers.
    #[serde(default)]
    pub outputs: Vec<TensorMetadata>,
}

impl TensorModelConfig {
    /// Parse a `tensor_model_config` dict.
    ///
    /// # Errors
    /// [`dynamo_llm::Error::InvalidConfig`] with the reference's wording ("Failed to convert
    /// tensor_model_config: ...").
    pub fn from_json(value: serde_json::Value) -> dynamo_llm::Result<Self> {
        serde_json::from_value(value).map_err(|e| dynamo_llm::Error::InvalidConfig {
            field: "tensor_model_config".into(),
            reason: format!("Failed to convert tensor_model_config: {e}"),
        })
    }
}

/// One element of a BYTES tensor: accepted from the worker as a list of byte values, a
/// byte string or a text string; sent as a list of byte values (the reference's shape).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ByteString(pub Vec<u8>);

impl Serialize for ByteString {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl<'de> Deserialize<'de> for ByteString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ByteString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of byte values, bytes or a string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<ByteString, E> {
                Ok(ByteString(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<ByteString, E> {
                Ok(ByteString(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteString, E> {
                Ok(ByteString(v.as_bytes().to_vec()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ByteString, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(ByteString(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A tensor's values, flattened, tagged with their type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "data_type", content = "values")]
#[expect(missing_docs, reason = "one variant per element type")]
pub enum FlattenTensor {
    Bool(Vec<bool>),
    Uint8(Vec<u8>),
    Uint16(Vec<u16>),
    Uint32(Vec<u32>),
    Uint64(Vec<u64>),
    Int8(Vec<i8>),
    Int16(Vec<i16>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    /// Half precision, carried as `f32` values.
    Float16(Vec<f32>),
    /// bfloat16, carried as `f32` values.
    BFloat16(Vec<f32>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Bytes(Vec<ByteString>),
}

impl FlattenTensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::Bool(v) => v.len(),
            Self::Uint8(v) => v.len(),
            Self::Uint16(v) => v.len(),
            Self::Uint32(v) => v.len(),
            Self::Uint64(v) => v.len(),
            Self::Int8(v) => v.len(),
            Self::Int16(v) => v.len(),
            Self::Int32(v) => v.len(),
            Self::Int64(v) => v.len(),
            Self::Float16(v) | Self::BFloat16(v) | Self::Float32(v) => v.len(),
            Self::Float64(v) => v.len(),
            Self::Bytes(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element type.
    pub fn data_type(&self) -> DataType {
        match self {
            Self::Bool(_) => DataType::Bool,
            Self::Uint8(_) => DataType::Uint8,
            Self::Uint16(_) => DataType::Uint16,
            Self::Uint32(_) => DataType::Uint32,
            Self::Uint64(_) => DataType::Uint64,
            Self::Int8(_) => DataType::Int8,
            Self::Int16(_) => DataType::Int16,
            Self::Int32(_) => DataType::Int32,
            Self::Int64(_) => DataType::Int64,
            Self::Float16(_) => DataType::Float16,
            Self::BFloat16(_) => DataType::BFloat16,
            Self::Float32(_) => DataType::Float32,
            Self::Float64(_) => DataType::Float64,
            Self::Bytes(_) => DataType::Bytes,
        }
    }
}

/// One tensor as the worker sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    /// Name, type and shape.
    pub metadata: TensorMetadata,
    /// Values.
    pub data: FlattenTensor,
}

/// A request parameter as the worker sees it (`{"int64": 3}`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[expect(missing_docs, reason = "one variant per KServe parameter type")]
pub enum ParamValue {
    Bool(bool),
    Int64(i64),
    Uint64(u64),
    Double(f64),
    String(String),
}

/// Named parameters.
pub type Params = BTreeMap<String, ParamValue>;

/// What a tensor worker's handler receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorRequest {
    /// The client's request id (`None` when it gave none).
    pub id: Option<String>,
    /// Model name.
    pub model: String,
    /// Input tensors, in request order.
    pub tensors: Vec<Tensor>,
    /// Request parameters (absent when there are none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: Params,
}

/// What a tensor worker's handler answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorResponse {
    /// Model name (defaults to the request's).
    #[serde(default)]
    pub model: Option<String>,
    /// Request id (defaults to the request's).
    #[serde(default)]
    pub id: Option<String>,
    /// Output tensors.
    #[serde(default)]
    pub tensors: Vec<Tensor>,
    /// Response parameters.
    #[serde(default)]
    pub parameters: Params,
}

/// A bad request: the message names the offending input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTensor(pub String);

fn bad(msg: impl Into<String>) -> BadTensor {
    BadTensor(msg.into())
}

/// Convert KServe request parameters.
pub fn params_from_kserve(params: &std::collections::HashMap<String, InferParameter>) -> Params {
    params
        .iter()
        .filter_map(|(k, p)| {
            let v = match p.parameter_choice.as_ref()? {
                ParameterChoice::BoolParam(b) => ParamValue::Bool(*b),
                ParameterChoice::Int64Param(i) => ParamValue::Int64(*i),
                ParameterChoice::Uint64Param(u) => ParamValue::Uint64(*u),
                ParameterChoice::DoubleParam(d) => ParamValue::Double(*d),
                ParameterChoice::StringParam(s) => ParamValue::String(s.clone()),
            };
            Some((k.clone(), v))
        })
        .collect()
}

/// Convert parameters to KServe's.
pub fn params_to_kserve(params: Params) -> std::collections::HashMap<String, InferParameter> {
    params
        .into_iter()
        .map(|(k, v)| {
            let choice = match v {
                ParamValue::Bool(b) => ParameterChoice::BoolParam(b),
                ParamValue::Int64(i) => ParameterChoice::Int64Param(i),
                ParamValue::Uint64(u) => ParameterChoice::Uint64Param(u),
                ParamValue::Double(d) => ParameterChoice::DoubleParam(d),
                ParamValue::String(s) => ParameterChoice::StringParam(s),
            };
            (
                k,
                InferParameter {
                    parameter_choice: Some(choice),
                },
            )
        })
        .collect()
}

/// The element count of `shape` (`None` for a negative dimension or an overflow).
fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, d| {
        usize::try_from(*d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// Check `input` against the model's `config` (name, type, rank, fixed dimensions).
///
/// # Errors
/// A [`BadTensor`] naming the input.
pub fn check_input(input: &InferInputTensor, config: &TensorModelConfig) -> Result<(), BadTensor> {
    let Some(want) = config.inputs.iter().find(|m| m.name == input.name) else {
        let names: Vec<&str> = config.inputs.iter().map(|m| m.name.as_str()).collect();
        return Err(bad(format!(
            "unexpected input '{}' for model '{}'; its inputs are {names:?}",
            input.name, config.name
        )));
    };
    if input.datatype != want.data_type.kserve_name() {
        return Err(bad(format!(
            "input '{}' has datatype {}, the model expects {}",
            input.name,
            input.datatype,
            want.data_type.kserve_name()
        )));
    }
    let fits = input.shape.len() == want.shape.len()
        && input
            .shape
            .iter()
            .zip(&want.shape)
            .all(|(got, w)| *w < 0 || got == w);
    if !fits {
        return Err(bad(format!(
            "input '{}' has shape {:?}, the model expects {:?}",
            input.name, input.shape, want.shape
        )));
    }
    Ok(())
}

/// Every input of `config` must be given.
///
/// # Errors
/// A [`BadTensor`] naming the first missing input.
pub fn check_all_given(
    inputs: &[InferInputTensor],
    config: &TensorModelConfig,
) -> Result<(), BadTensor> {
    for want in &config.inputs {
        if !inputs.iter().any(|i| i.name == want.name) {
            return Err(bad(format!("missing input '{}'", want.name)));
        }
    }
    Ok(())
}

fn chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

/// Decode length-prefixed (u32 little-endian) BYTES elements.
fn decode_bytes(raw: &[u8], name: &str) -> Result<Vec<ByteString>, BadTensor> {
    let mut out = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(bad(format!(
                "input '{name}': truncated BYTES length prefix"
            )));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(bad(format!("input '{name}': truncated BYTES element")));
        }
        out.push(ByteString(tail[..len].to_vec()));
        rest = &tail[len..];
    }
    Ok(out)
}

fn decode_raw(dt: DataType, raw: &[u8], name: &str) -> Result<FlattenTensor, BadTensor> {
    if let Some(w) = dt.width()
        && !raw.len().is_multiple_of(w)
    {
        return Err(bad(format!(
            "input '{name}': raw content of {} bytes is not a whole number of {} elements",
            raw.len(),
            dt.kserve_name()
        )));
    }
    Ok(match dt {
        DataType::Bool => FlattenTensor::Bool(raw.iter().map(|b| *b != 0).collect()),
        DataType::Uint8 => FlattenTensor::Uint8(raw.to_vec()),
        DataType::Uint16 => FlattenTensor::Uint16(chunks(raw).map(u16::from_le_bytes).collect()),
        DataType::Uint32 => FlattenTensor::Uint32(chunks(raw).map(u32::from_le_bytes).collect()),
        DataType::Uint64 => FlattenTensor::Uint64(chunks(raw).map(u64::from_le_bytes).collect()),
        DataType::Int8 => {
            FlattenTensor::Int8(raw.iter().map(|b| i8::from_le_bytes([*b])).collect())
        }
        DataType::Int16 => FlattenTensor::Int16(chunks(raw).map(i16::from_le_bytes).collect()),
        DataType::Int32 => FlattenTensor::Int32(chunks(raw).map(i32::from_le_bytes).collect()),
        DataType::Int64 => FlattenTensor::Int64(chunks(raw).map(i64::from_le_bytes).collect()),
        DataType::Float16 => FlattenTensor::Float16(
            chunks(raw)
                .map(|c| f16_to_f32(u16::from_le_bytes(c)))
                .collect(),
        ),
        DataType::BFloat16 => FlattenTensor::BFloat16(
            chunks(raw)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes(c)) << 16))
                .collect(),
        ),
        DataType::Float32 => FlattenTensor::Float32(chunks(raw).map(f32::from_le_bytes).collect()),
        DataType::Float64 => FlattenTensor::Float64(chunks(raw).map(f64::from_le_bytes).collect()),
        DataType::Bytes => FlattenTensor::Bytes(decode_bytes(raw, name)?),
    })
}

fn narrow<T: TryFrom<i64>>(v: &[i32], name: &str, dt: DataType) -> Result<Vec<T>, BadTensor> {
    v.iter()
        .map(|x| {
            T::try_from(i64::from(*x)).map_err(|_| {
                bad(format!(
                    "input '{name}': value {x} does not fit {}",
                    dt.kserve_name()
                ))
            })
        })
        .collect()
}

fn narrow_u<T: TryFrom<u32>>(v: &[u32], name: &str, dt: DataType) -> Result<Vec<T>, BadTensor> {
    v.iter()
        .map(|x| {
            T::try_from(*x).map_err(|_| {
                bad(format!(
                    "input '{name}': value {x} does not fit {}",
                    dt.kserve_name()
                ))
            })
        })
        .collect()
}

fn decode_typed(
    dt: DataType,
    c: &InferTensorContents,
    name: &str,
) -> Result<FlattenTensor, BadTensor> {
    Ok(match dt {
        DataType::Bool => FlattenTensor::Bool(c.bool_contents.clone()),
        DataType::Int8 => FlattenTensor::Int8(narrow(&c.int_contents, name, dt)?),
        DataType::Int16 => FlattenTensor::Int16(narrow(&c.int_contents, name, dt)?),
        DataType::Int32 => FlattenTensor::Int32(c.int_contents.clone()),
        DataType::Int64 => FlattenTensor::Int64(c.int64_contents.clone()),
        DataType::Uint8 => FlattenTensor::Uint8(narrow_u(&c.uint_contents, name, dt)?),
        DataType::Uint16 => FlattenTensor::Uint16(narrow_u(&c.uint_contents, name, dt)?),
        DataType::Uint32 => FlattenTensor::Uint32(c.uint_contents.clone()),
        DataType::Uint64 => FlattenTensor::Uint64(c.uint64_contents.clone()),
        DataType::Float32 => FlattenTensor::Float32(c.fp32_contents.clone()),
        DataType::Float64 => FlattenTensor::Float64(c.fp64_contents.clone()),
        DataType::Bytes => FlattenTensor::Bytes(
            c.bytes_contents
                .iter()
                .map(|b| ByteString(b.clone()))
                .collect(),
        ),
        DataType::Float16 | DataType::BFloat16 => {
            return Err(bad(format!(
                "input '{name}': {} data must be sent in raw_input_contents",
                dt.kserve_name()
            )));
        }
    })
}

/// Convert input `index` of a request (`raw`: its `raw_input_contents` entry, if the
/// request carries raw contents).
///
/// # Errors
/// A [`BadTensor`] naming the input: unknown datatype, negative dimension, or values that
/// do not match the shape.
pub fn tensor_from_kserve(
    input: &InferInputTensor,
    raw: Option<&Bytes>,
) -> Result<Tensor, BadTensor> {
    let name = &input.name;
    let dt = DataType::from_kserve(&input.datatype).ok_or_else(|| {
        bad(format!(
            "input '{name}' has unsupported datatype '{}'",
            input.datatype
        ))
    })?;
    let count = element_count(&input.shape).ok_or_else(|| {
        bad(format!(
            "input '{name}' has invalid shape {:?}",
            input.shape
        ))
    })?;
    let data = match (raw, &input.contents) {
        (Some(raw), _) => decode_raw(dt, raw, name)?,
        (None, Some(c)) => decode_typed(dt, c, name)?,
        (None, None) => decode_typed(dt, &InferTensorContents::default(), name)?,
    };
    if data.len() != count {
        return Err(bad(format!(
            "input '{name}': shape {:?} implies {count} elements but the data has {}",
            input.shape,
            data.len()
        )));
    }
    Ok(Tensor {
        metadata: TensorMetadata {
            name: name.clone(),
            data_type: dt,
            shape: input.shape.clone(),
        },
        data,
    })
}

/// Convert every input of a request.
///
/// # Errors
/// As [`tensor_from_kserve`], and a count mismatch of `raw_input_contents`.
pub fn tensors_from_kserve(
    inputs: &[InferInputTensor],
    raw: &[Bytes],
) -> Result<Vec<Tensor>, BadTensor> {
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(bad(format!(
            "raw_input_contents has {} entries for {} inputs",
            raw.len(),
            inputs.len()
        )));
    }
    inputs
        .iter()
        .enumerate()
        .map(|(i, input)| tensor_from_kserve(input, raw.get(i)))
        .collect()
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * N);
    for x in v {
        out.extend_from_slice(&f(*x));
    }
    out
}

fn encode_raw(data: &FlattenTensor) -> Vec<u8> {
    match data {
        FlattenTensor::Bool(v) => v.iter().map(|b| u8::from(*b)).collect(),
        FlattenTensor::Uint8(v) => v.clone(),
        FlattenTensor::Uint16(v) => le_bytes(v, u16::to_le_bytes),
        FlattenTensor::Uint32(v) => le_bytes(v, u32::to_le_bytes),
        FlattenTensor::Uint64(v) => le_bytes(v, u64::to_le_bytes),
        FlattenTensor::Int8(v) => le_bytes(v, i8::to_le_bytes),
        FlattenTensor::Int16(v) => le_bytes(v, i16::to_le_bytes),
        FlattenTensor::Int32(v) => le_bytes(v, i32::to_le_bytes),
        FlattenTensor::Int64(v) => le_bytes(v, i64::to_le_bytes),
        FlattenTensor::Float16(v) => le_bytes(v, |x| f32_to_f16(x).to_le_bytes()),
        FlattenTensor::BFloat16(v) => le_bytes(v, |x| f32_to_bf16(x).to_le_bytes()),
        FlattenTensor::Float32(v) => le_bytes(v, f32::to_le_bytes),
        FlattenTensor::Float64(v) => le_bytes(v, f64::to_le_bytes),
        FlattenTensor::Bytes(v) => {
            let mut out = Vec::with_capacity(v.iter().map(|b| b.0.len() + 4).sum());
            for b in v {
                let len = u32::try_from(b.0.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&b.0);
            }
            out
        }
    }
}

fn encode_typed(data: FlattenTensor) -> InferTensorContents {
    let mut c = InferTensorContents::default();
    match data {
        FlattenTensor::Bool(v) => c.bool_contents = v,
        FlattenTensor::Uint8(v) => c.uint_contents = v.into_iter().map(u32::from).collect(),
        FlattenTensor::Uint16(v) => c.uint_contents = v.into_iter().map(u32::from).collect(),
        FlattenTensor::Uint32(v) => c.uint_contents = v,
        FlattenTensor::Uint64(v) => c.uint64_contents = v,
        FlattenTensor::Int8(v) => c.int_contents = v.into_iter().map(i32::from).collect(),
        FlattenTensor::Int16(v) => c.int_contents = v.into_iter().map(i32::from).collect(),
        FlattenTensor::Int32(v) => c.int_contents = v,
        FlattenTensor::Int64(v) => c.int64_contents = v,
        // No typed field exists for half types: the caller sends them raw.
        FlattenTensor::Float16(v) | FlattenTensor::BFloat16(v) | FlattenTensor::Float32(v) => {
            c.fp32_contents = v;
        }
        FlattenTensor::Float64(v) => c.fp64_contents = v,
        FlattenTensor::Bytes(v) => c.bytes_contents = v.into_iter().map(|b| b.0).collect(),
    }
    c
}

/// KServe outputs (and, when `raw`, their `raw_output_contents`) of a worker's tensors.
/// Half-precision outputs always travel raw (KServe has no typed field for them); a
/// response with any raw output carries every output raw.
///
/// # Errors
/// A message about the worker's answer when a tensor's values do not match its shape.
pub fn tensors_to_kserve(
    tensors: Vec<Tensor>,
    raw: bool,
) -> Result<(Vec<InferOutputTensor>, Vec<Bytes>), String> {
    let raw = raw
        || tensors.iter().any(|t| {
            matches!(
                t.data,
                FlattenTensor::Float16(_) | FlattenTensor::BFloat16(_)
            )
        });
    let mut outputs = Vec::with_capacity(tensors.len());
    let mut contents = Vec::new();
    for t in tensors {
        let count = element_count(&t.metadata.shape);
        if count != Some(t.data.len()) {
            return Err(format!(
                "the worker's output '{}' has shape {:?} but {} values",
                t.metadata.name,
                t.metadata.shape,
                t.data.len()
            ));
        }
        let mut out = InferOutputTensor {
            name: t.metadata.name,
            datatype: t.data.data_type().kserve_name().to_owned(),
            shape: t.metadata.shape,
            ..Default::default()
        };
        if raw {
            contents.push(Bytes::from(encode_raw(&t.data)));
        } else {
            out.contents = Some(encode_typed(t.data));
        }
        outputs.push(out);
    }
    Ok((outputs, contents))
}

/// IEEE half bits to `f32`.
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise the mantissa.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// `f32` to IEEE half bits (round to nearest even).
fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rounded = (m + half - 1 + ((m >> shift) & 1)) >> shift;
        return sign | rounded as u16;
    }
    let rounded = man + 0xfff + ((man >> 13) & 1);
    if rounded & 0x80_0000 != 0 {
        let e = e + 1;
        if e >= 0x1f {
            return sign | 0x7c00;
        }
        return sign | ((e as u16) << 10);
    }
    sign | ((e as u16) << 10) | (rounded >> 13) as u16
}

/// `f32` to bfloat16 bits (round to nearest even).
fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounded = bits + 0x7fff + ((bits >> 16) & 1);
    (rounded >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, dt: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: dt.into(),
            shape: shape.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn raw_and_typed_inputs_give_the_same_tensor() {
        let raw = Bytes::from(le_bytes(&[1.0f32, 2.0, 3.0, 4.0], f32::to_le_bytes));
        let a = tensor_from_kserve(&input("x", "FP32", &[1, 4]), Some(&raw)).expect("raw");
        let mut typed = input("x", "FP32", &[1, 4]);
        typed.contents = Some(InferTensorContents {
            fp32_contents: vec![1.0, 2.0, 3.0, 4.0],
            ..Default::default()
        });
        let b = tensor_from_kserve(&typed, None).expect("typed");
        assert_eq!(a, b);
        assert_eq!(a.data, FlattenTensor::Float32(vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn bytes_round_trip_through_raw_contents() {
        let raw = Bytes::from_static(b"\x02\0\0\0ab\x01\0\0\0c");
        let t = tensor_from_kserve(&input("s", "BYTES", &[2]), Some(&raw)).expect("bytes");
        assert_eq!(
            t.data,
            FlattenTensor::Bytes(vec![ByteString(b"ab".to_vec()), ByteString(b"c".to_vec())])
        );
        let (outs, contents) = tensors_to_kserve(vec![t], true).expect("out");
        assert_eq!(outs[0].datatype, "BYTES");
        assert_eq!(contents[0], raw);
        let truncated = Bytes::from_static(b"\x05\0\0\0ab");
        let err = tensor_from_kserve(&input("s", "BYTES", &[1]), Some(&truncated)).unwrap_err();
        assert!(err.0.contains("'s'"), "{err:?}");
    }

    #[test]
    fn count_mismatch_and_bad_types_name_the_input() {
        let raw = Bytes::from(vec![0u8; 8]);
        let err = tensor_from_kserve(&input("x", "FP32", &[5]), Some(&raw)).unwrap_err();
        assert!(
            err.0.contains("'x'") && err.0.contains("5 elements"),
            "{err:?}"
        );
        let err = tensor_from_kserve(&input("y", "COMPLEX", &[1]), None).unwrap_err();
        assert!(
            err.0.contains("'y'") && err.0.contains("COMPLEX"),
            "{err:?}"
        );
        let mut i8s = input("z", "INT8", &[1]);
        i8s.contents = Some(InferTensorContents {
            int_contents: vec![300],
            ..Default::default()
        });
        assert!(
            tensor_from_kserve(&i8s, None)
                .unwrap_err()
                .0
                .contains("'z'")
        );
    }

    #[test]
    fn config_checks_names_types_and_fixed_dims() {
        let config = TensorModelConfig::from_json(serde_json::json!({
            "name": "m",
            "inputs": [{"name": "x", "data_type": "Float32", "shape": [-1, 4]}],
            "outputs": [{"name": "x", "data_type": "Float32", "shape": [-1, 4]}],
        }))
        .expect("config");
        check_input(&input("x", "FP32", &[2, 4]), &config).expect("fits");
        for (i, what) in [
            (input("x", "FP32", &[2, 3]), "shape"),
            (input("x", "INT32", &[2, 4]), "datatype"),
            (input("w", "FP32", &[2, 4]), "unexpected"),
            (input("x", "FP32", &[8]), "shape"),
        ] {
            let err = check_input(&i, &config).unwrap_err();
            assert!(err.0.contains(what), "{err:?}");
        }
        assert!(check_all_given(&[], &config).unwrap_err().0.contains("'x'"));
        let err = TensorModelConfig::from_json(serde_json::json!({
            "name": "m", "inputs": [{"name": "x", "data_type": "TYPE_FP32", "shape": [1]}]
        }))
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown variant `TYPE_FP32`"),
            "{err}"
        );
    }

    #[test]
    fn worker_json_uses_the_reference_shape() {
        let req = TensorRequest {
            id: None,
            model: "m".into(),
            tensors: vec![Tensor {
                metadata: TensorMetadata {
                    name: "s".into(),
                    data_type: DataType::Bytes,
                    shape: vec![1],
                },
                data: FlattenTensor::Bytes(vec![ByteString(b"ab".to_vec())]),
            }],
            parameters: Params::from([("k".into(), ParamValue::Int64(1))]),
        };
        assert_eq!(
            serde_json::to_value(&req).expect("json"),
            serde_json::json!({"id": null, "model": "m", "tensors": [{"metadata": {"name": "s", "data_type": "Bytes", "shape": [1]}, "data": {"data_type": "Bytes", "values": [[97, 98]]}}], "parameters": {"k": {"int64": 1}}})
        );
        let resp: TensorResponse = serde_json::from_value(serde_json::json!({
            "tensors": [{"metadata": {"name": "s", "data_type": "Bytes", "shape": [2]},
                         "data": {"data_type": "Bytes", "values": ["ab", [99]]}}]
        }))
        .expect("response");
        assert_eq!(
            resp.tensors[0].data,
            FlattenTensor::Bytes(vec![ByteString(b"ab".to_vec()), ByteString(b"c".to_vec())])
        );
    }

    #[test]
    fn half_precision_conversions_round_trip() {
        for x in [
            0.0f32,
            1.0,
            -2.5,
            65504.0,
            0.000_061_035_156,
            5.960_464_5e-8,
        ] {
            assert_eq!(f16_to_f32(f32_to_f16(x)), x, "{x}");
        }
        for x in [0.0f32, 1.0, -2.5, 3.0, 256.0, 0.5] {
            assert_eq!(f32::from_bits(u32::from(f32_to_bf16(x)) << 16), x, "{x}");
        }
        assert!(f16_to_f32(f32_to_f16(f32::INFINITY)).is_infinite());
    }
}
