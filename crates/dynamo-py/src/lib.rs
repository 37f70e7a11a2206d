//! The `dynamo._core` Python extension module.
//!
//! This crate is the PyO3 layer only: each function converts its arguments, calls one
//! function of a core crate and maps the result or error. Business logic lives in the core
//! crates, where `cargo test` covers it. One file per Python-visible area:
//!
//! * [`errors`]: the `DynamoException` hierarchy and the mapping of core errors.
//! * [`convert`]: fast, validated conversions of Python arguments.
//! * [`router`]: router configuration classes.
//! * [`kv`]: block hashing, the `RadixTree` indexer and `OverlapScores`.
//! * [`llm`]: model types, runtime config, model deployment card, `MockEngineArgs`,
//!   `lora_name_to_id`, `fetch_model`.

use pyo3::prelude::*;

mod convert;
mod errors;
mod kv;
mod llm;
mod router;

/// The extension module. Each area registers its own classes and functions.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    kv::register(m)?;
    router::register(m)?;
    llm::register(m)?;
    Ok(())
}
