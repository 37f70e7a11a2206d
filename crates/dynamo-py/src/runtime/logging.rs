//! `log_message` and the Rust tracing subscriber that Python logging forwards to.
//!
//! The subscriber is installed when `dynamo._core` is imported (unless
//! `DYNAMO_SKIP_PYTHON_LOG_INIT` is set): filter from `DYN_LOG` (RUST_LOG syntax, default
//! `info`), output to stderr, JSON lines when `DYN_LOGGING_JSONL` is true, colour only on a
//! terminal (and never with `NO_COLOR`).

use pyo3::prelude::*;
use tracing_subscriber::EnvFilter;

fn truthy(name: &str) -> bool {
    std::env::var(name)
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Install the process's subscriber (once; later calls and other installers win nothing).
pub(crate) fn init() {
    if std::env::var_os("DYNAMO_SKIP_PYTHON_LOG_INIT").is_some() {
        return;
    }
    let filter = std::env::var("DYN_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let jsonl = truthy("DYN_LOGGING_JSONL")
        || std::env::var("DYN_LOGGING_CONSOLE_FORMAT")
            .is_ok_and(|v| v.eq_ignore_ascii_case("jsonl"));
    let _ = if jsonl {
        builder.json().with_current_span(false).try_init()
    } else {
        builder.with_ansi(colour_wanted()).try_init()
    };
}

/// Colour codes only where a person reads them: stderr is a terminal, `NO_COLOR` is unset
/// or empty (the convention of no-color.org) and `DYN_SDK_DISABLE_ANSI_LOGGING` is not
/// true. A log redirected to a file or a pipe gets plain text.
fn colour_wanted() -> bool {
    use std::io::IsTerminal as _;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    std::io::stderr().is_terminal() && !no_color && !truthy("DYN_SDK_DISABLE_ANSI_LOGGING")
}

/// Send one formatted Python log record to the Rust tracing subscriber. `level` is a
/// lower-case Python level name; the record's logger target travels as the `module` field
/// (tracing targets are static), so `DYN_LOG` filters Python records by level under the
/// `python` target.
#[pyfunction]
#[pyo3(signature = (level, message, module, file, line))]
pub(crate) fn log_message(level: &str, message: &str, module: &str, file: &str, line: u32) {
    match level {
        "trace" => tracing::trace!(target: "python", module, file, line, "{message}"),
        "debug" => tracing::debug!(target: "python", module, file, line, "{message}"),
        "info" => tracing::info!(target: "python", module, file, line, "{message}"),
        "warn" | "warning" => tracing::warn!(target: "python", module, file, line, "{message}"),
        _ => tracing::error!(target: "python", module, file, line, "{message}"),
    }
}

/// Register `log_message` and install the subscriber.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(log_message, m)?)?;
    init();
    Ok(())
}
