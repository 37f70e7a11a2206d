//! `replay_mode="online"`: not implemented yet (see docs/replay.md, known gaps).

use serde_json::{Map, Value};

use super::{ReplayError, ReplayOptions, Workload};

/// Online replay (wall-clock time through live mocker workers).
///
/// # Errors
/// Always [`ReplayError::InvalidArgument`] for now: only offline replay is implemented.
pub fn run_online(
    _opts: &ReplayOptions,
    _workload: &Workload,
) -> Result<Map<String, Value>, ReplayError> {
    Err(ReplayError::InvalidArgument(
        "replay_mode='online' is not supported by this build yet; use replay_mode='offline' \
         (simulated time, same engines and router)"
            .into(),
    ))
}
