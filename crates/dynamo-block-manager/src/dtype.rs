//! Element types of KV blocks.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Element type of a KV cache. FP8 is stored and exported as raw bytes (`uint8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DType {
    /// 8-bit float (exported through DLPack as `uint8`).
    Fp8,
    /// IEEE half precision; the default.
    #[default]
    Fp16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    Fp32,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

/// The DLPack type class of an element type (`DLDataTypeCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DTypeCode {
    /// Signed integer (`kDLInt` = 0).
    Int,
    /// Unsigned integer (`kDLUInt` = 1).
    UInt,
    /// IEEE float (`kDLFloat` = 2).
    Float,
    /// bfloat16 (`kDLBfloat` = 4).
    Bfloat,
}

impl DType {
    /// Every element type, in the order of the documentation.
    pub const ALL: [DType; 12] = [
        DType::Fp8,
        DType::Fp16,
        DType::Bf16,
        DType::Fp32,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::Fp8 | DType::U8 | DType::I8 => 1,
            DType::Fp16 | DType::Bf16 | DType::U16 | DType::I16 => 2,
            DType::Fp32 | DType::U32 | DType::I32 => 4,
            DType::U64 | DType::I64 => 8,
        }
    }

    /// The DLPack type class and bit width; FP8 is exported as `uint8`.
    pub const fn dlpack(self) -> (DTypeCode, u8) {
        let bits = (self.size_bytes() * 8) as u8;
        let code = match self {
            DType::Fp8 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => DTypeCode::UInt,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => DTypeCode::Int,
            DType::Fp16 | DType::Fp32 => DTypeCode::Float,
            DType::Bf16 => DTypeCode::Bfloat,
        };
        (code, bits)
    }

    /// The canonical lower-case spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::Fp8 => "fp8",
            DType::Fp16 => "fp16",
            DType::Bf16 => "bf16",
            DType::Fp32 => "fp32",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parse a dtype spelling, case-insensitively (`"FP16"`, `"bf16"`, `"i32"`, ...).
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == lower)
            .ok_or_else(|| Error::UnsupportedDtype(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_in_any_case() {
        for d in DType::ALL {
            assert_eq!(d.as_str().parse::<DType>().ok(), Some(d));
            assert_eq!(d.as_str().to_uppercase().parse::<DType>().ok(), Some(d));
        }
        assert!(matches!("fp64".parse::<DType>(), Err(Error::UnsupportedDtype(s)) if s == "fp64"));
        assert!("".parse::<DType>().is_err());
    }

    #[test]
    fn fp8_is_exported_as_uint8() {
        assert_eq!(DType::Fp8.dlpack(), (DTypeCode::UInt, 8));
        assert_eq!(DType::Bf16.dlpack(), (DTypeCode::Bfloat, 16));
        assert_eq!(DType::I64.dlpack(), (DTypeCode::Int, 64));
        assert_eq!(DType::Fp32.size_bytes(), 4);
    }
}
