//! Mooncake trace files: parsing with line-numbered validation.
//!
//! The simulator's own loader accepts rows the replay should refuse (unsorted timestamps are
//! silently sorted, a missing `input_length` is derived), and its errors are plain strings.
//! Parsing here first lets every problem surface as one [`ReplayError::InvalidTrace`] naming
//! the file and the 1-based line, before any simulation starts.

use std::io::{BufRead, BufReader};
use std::path::Path;

use aisimulate_core::replay::loadgen::MooncakeRow;
use serde::Deserialize;

use super::ReplayError;

/// One row as written in the file; every field optional so a missing one is reported by
/// name rather than as a serde message.
#[derive(Deserialize)]
struct RawRow {
    timestamp: Option<f64>,
    input_length: Option<u64>,
    output_length: Option<u64>,
    hash_ids: Option<Vec<u64>>,
    session_id: Option<String>,
}

/// Read and validate one Mooncake trace file. Timestamps must not decrease (the trace is a
/// log of arrivals); `input_length` must fit in `hash_ids.len() * trace_block_size` tokens.
pub(super) fn load_mooncake(
    path: &Path,
    trace_block_size: usize,
) -> Result<Vec<MooncakeRow>, ReplayError> {
    let file = std::fs::File::open(path).map_err(|e| ReplayError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let invalid = |line: usize, message: String| ReplayError::InvalidTrace {
        path: path.display().to_string(),
        line,
        message,
    };
    let mut rows = Vec::new();
    let mut last_ts = f64::NEG_INFINITY;
    for (idx, line) in BufReader::new(file).lines().enumerate() {
        let n = idx + 1;
        let line = line.map_err(|e| invalid(n, format!("unreadable: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawRow =
            serde_json::from_str(&line).map_err(|e| invalid(n, format!("not valid JSON: {e}")))?;
        let timestamp = raw
            .timestamp
            .ok_or_else(|| invalid(n, "missing field `timestamp`".into()))?;
        if !timestamp.is_finite() || timestamp < 0.0 {
            return Err(invalid(
                n,
                format!("timestamp must be a finite number >= 0, got {timestamp}"),
            ));
        }
        if timestamp < last_ts {
            return Err(invalid(
                n,
                format!("timestamp {timestamp} is earlier than the previous line's {last_ts}"),
            ));
        }
        last_ts = timestamp;
        let input_length = raw
            .input_length
            .ok_or_else(|| invalid(n, "missing field `input_length`".into()))?;
        let output_length = raw
            .output_length
            .ok_or_else(|| invalid(n, "missing field `output_length`".into()))?;
        let hash_ids = raw
            .hash_ids
            .ok_or_else(|| invalid(n, "missing field `hash_ids`".into()))?;
        if input_length == 0 {
            return Err(invalid(n, "input_length must be positive".into()));
        }
        if output_length == 0 {
            return Err(invalid(n, "output_length must be positive".into()));
        }
        let capacity = hash_ids.len() as u64 * trace_block_size as u64;
        if input_length > capacity {
            return Err(invalid(
                n,
                format!(
                    "input_length {input_length} exceeds the {} hash_ids x trace_block_size \
                     {trace_block_size} = {capacity} tokens",
                    hash_ids.len()
                ),
            ));
        }
        if let Some(bad) = hash_ids.iter().find(|&&h| h > u64::from(u32::MAX)) {
            return Err(invalid(n, format!("hash id {bad} does not fit in 32 bits")));
        }
        rows.push(MooncakeRow {
            request_id: None,
            session_id: raw.session_id,
            input_length: Some(input_length as usize),
            output_length: Some(output_length as usize),
            output_token_ids: None,
            hash_ids: Some(hash_ids),
            timestamp: Some(timestamp),
            delay: None,
            priority: None,
            strict_priority: None,
            policy_class: None,
        });
    }
    if rows.is_empty() {
        return Err(ReplayError::InvalidTrace {
            path: path.display().to_string(),
            line: 0,
            message: "the trace contains no requests".into(),
        });
    }
    Ok(rows)
}
