//! `get_tool_parser_names`, `get_reasoning_parser_names`: the parser names the frontend
//! accepts (`dynamo_parsers`).

use pyo3::prelude::*;

/// Every accepted tool-call parser name (aliases included), sorted.
#[pyfunction]
fn get_tool_parser_names() -> Vec<&'static str> {
    dynamo_parsers::tool_parser_names()
}

/// Every accepted reasoning parser name (aliases included), sorted.
#[pyfunction]
fn get_reasoning_parser_names() -> Vec<&'static str> {
    dynamo_parsers::reasoning_parser_names()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(get_tool_parser_names, m)?)?;
    m.add_function(wrap_pyfunction!(get_reasoning_parser_names, m)?)?;
    Ok(())
}
