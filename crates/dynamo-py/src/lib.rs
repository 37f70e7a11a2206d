//! The `dynamo._core` Python extension module.
//!
//! This crate is the PyO3 layer only: each function converts its arguments, calls one
//! function of a core crate and maps the result or error. Business logic lives in the core
//! crates, where `cargo test` covers it. One file per Python-visible area:
//!
//! * [`errors`]: the `DynamoException` hierarchy and the one mapping of each core crate's
//!   errors to Python exceptions.
//! * [`runtime`]: `dynamo.runtime` (`DistributedRuntime`, `Endpoint`, `Client`, `Context`,
//!   the handler bridge, logging).
//! * [`llm`]: `dynamo.llm` (model cards, KV routing, the frontend and entry points, the
//!   mocker's arguments, selection, block manager, ...).
//! * [`backend`]: the `dynamo._core.backend` submodule (`Worker` over a Python engine).
//! * [`planner`]: `dynamo.planner` (`PlannerDecision`, the virtual connector,
//!   `run_planner`).
//! * [`replay`]: `dynamo.replay` (`run_mocker_trace_replay`,
//!   `run_mocker_synthetic_trace_replay`).
//!
//! Plumbing shared by all of them: [`aio`] (Rust futures as asyncio futures),
//! [`convert`] (validated argument conversions), [`json`] and [`msgpack`] (payloads).

use pyo3::prelude::*;

mod aio;
mod backend;
mod convert;
mod errors;
mod json;
mod llm;
mod msgpack;
mod planner;
mod replay;
mod runtime;

/// The extension module. Each area registers its own classes and functions.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    runtime::register(m)?;
    llm::register(m)?;
    backend::register(m)?;
    planner::register(m)?;
    replay::register(m)?;
    Ok(())
}
