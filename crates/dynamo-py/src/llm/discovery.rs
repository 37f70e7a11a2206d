//! Model cards in discovery: `register_model`, `unregister_model`, `update_model_taints`
//! (each converts its arguments and calls one function of [`dynamo_llm::discovery`]).

use std::collections::BTreeSet;
use std::path::PathBuf;

use dynamo_llm::model_card::RegisterModelArgs;
use pyo3::prelude::*;

use crate::aio::py_async;
use crate::errors::llm_error;
use crate::json::opt_json;
use crate::llm::model_card::{PyModelInput, PyModelRuntimeConfig, PyModelType, PyWorkerType};
use crate::runtime::distributed_runtime::Endpoint;

/// Register the discovery functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(register_model, m)?)?;
    m.add_function(wrap_pyfunction!(unregister_model, m)?)?;
    m.add_function(wrap_pyfunction!(update_model_taints, m)?)?;
    Ok(())
}

/// Publish this worker's model card in discovery, next to its endpoint instance.
#[pyfunction]
#[pyo3(signature = (
    model_input, model_type, endpoint, model_path, model_name = None, *, worker_type = None,
    context_length = None, kv_cache_block_size = None, router_mode = None, router_config = None,
    runtime_config = None, tensor_model_config = None, user_data = None,
    custom_template_path = None, media_decoder = None, media_fetcher = None,
    forward_inline_media_in_messages = None, lora_name = None, base_model_path = None,
    needs = None, self_host_metadata = None, ignore_weights = false, max_gpu_lora_count = None,
    model_aliases = None, migration_limit = 0
))]
#[expect(
    clippy::too_many_arguments,
    reason = "the Python signature of register_model"
)]
#[expect(unused_variables, reason = "accepted for compatibility; not modelled")]
fn register_model<'py>(
    py: Python<'py>,
    model_input: PyModelInput,
    model_type: PyModelType,
    endpoint: &Endpoint,
    model_path: String,
    model_name: Option<String>,
    worker_type: Option<PyWorkerType>,
    context_length: Option<u32>,
    kv_cache_block_size: Option<u32>,
    router_mode: Option<&Bound<'py, PyAny>>,
    router_config: Option<&Bound<'py, PyAny>>,
    runtime_config: Option<PyModelRuntimeConfig>,
    tensor_model_config: Option<&Bound<'py, PyAny>>,
    user_data: Option<&Bound<'py, PyAny>>,
    custom_template_path: Option<PathBuf>,
    media_decoder: Option<&Bound<'py, PyAny>>,
    media_fetcher: Option<&Bound<'py, PyAny>>,
    forward_inline_media_in_messages: Option<bool>,
    lora_name: Option<String>,
    base_model_path: Option<String>,
    needs: Option<Vec<Vec<PyWorkerType>>>,
    self_host_metadata: Option<bool>,
    ignore_weights: bool,
    max_gpu_lora_count: Option<u32>,
    model_aliases: Option<Vec<String>>,
    migration_limit: u32,
) -> PyResult<Bound<'py, PyAny>> {
    let args = RegisterModelArgs {
        model_input: model_input.into(),
        model_type: model_type.inner,
        model_path,
        model_name,
        worker_type: worker_type.map(Into::into),
        kv_cache_block_size,
        context_length,
        runtime_config: runtime_config.map(|c| c.inner),
        tensor_model_config: opt_json(tensor_model_config)?,
        user_data: opt_json(user_data)?,
        custom_template_path,
        lora_name,
        base_model_path,
        needs: needs.map(|n| {
            n.into_iter()
                .map(|set| set.into_iter().map(Into::into).collect())
                .collect()
        }),
        ignore_weights,
        max_gpu_lora_count,
        model_aliases: model_aliases.unwrap_or_default(),
        migration_limit,
        media_fetcher: crate::llm::media::fetcher_config(media_fetcher)?,
        media_decoder: crate::llm::media::decoder_config(media_decoder)?,
    };
    let (runtime, id) = endpoint.parts();
    let (runtime, id) = (runtime.clone(), id.clone());
    py_async(py, async move {
        let card = args.build_card().map_err(llm_error)?;
        dynamo_llm::discovery::register_model(&runtime, &id, &card)
            .await
            .map_err(llm_error)
    })
}

/// Remove this worker's model card (or its LoRA adapter card).
#[pyfunction]
#[pyo3(signature = (endpoint, lora_name = None))]
fn unregister_model<'py>(
    py: Python<'py>,
    endpoint: &Endpoint,
    lora_name: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let (runtime, id) = endpoint.parts();
    let (runtime, id) = (runtime.clone(), id.clone());
    py_async(py, async move {
        dynamo_llm::discovery::unregister_model(&runtime, &id, lora_name.as_deref())
            .await
            .map_err(llm_error)
    })
}

/// Replace the caller-managed taints of this worker's base model card.
#[pyfunction]
#[pyo3(signature = (endpoint, taints))]
fn update_model_taints<'py>(
    py: Python<'py>,
    endpoint: &Endpoint,
    taints: BTreeSet<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let (runtime, id) = endpoint.parts();
    let (runtime, id) = (runtime.clone(), id.clone());
    py_async(py, async move {
        dynamo_llm::discovery::update_model_taints(&runtime, &id, taints)
            .await
            .map_err(llm_error)
    })
}
