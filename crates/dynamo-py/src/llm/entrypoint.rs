//! Entry points: `EngineType`, `EntrypointArgs`, `EngineConfig`, `make_engine`,
//! `run_input`, `run_inputs_blocking`. Each converts its arguments and calls one function of
//! [`dynamo_frontend::entrypoint`].

use std::path::PathBuf;
use std::sync::Arc;

use dynamo_frontend::entrypoint::text::TextInput;
use dynamo_frontend::entrypoint::{LocalEngine, LocalEngineKind, serve_http_with_factory};
use dynamo_frontend::http::engine_factory::ChatEngineFactory;
use dynamo_frontend::http::{FrontendConfig, RouterMode};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_mocker::MockEngineArgs;
use dynamo_runtime::EndpointId;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::aio::py_async;
use crate::errors::{frontend_error, mocker_error, runtime_error};
use crate::llm::mocker_args::mock_engine_args_from_py;
use crate::llm::model_card::PyModelRuntimeConfig;
use crate::llm::router::PyRouterConfig;
use crate::runtime::distributed_runtime::DistributedRuntime;

/// Register the entry-point classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(make_engine, m)?)?;
    m.add_function(wrap_pyfunction!(run_input, m)?)?;
    m.add_function(wrap_pyfunction!(run_inputs_blocking, m)?)?;
    m.add_class::<EngineType>()?;
    m.add_class::<EngineConfig>()?;
    m.add_class::<EntrypointArgs>()?;
    Ok(())
}

/// The engine an entry point runs.
#[pyclass(
    name = "EngineType",
    module = "dynamo._core",
    eq,
    eq_int,
    frozen,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum EngineType {
    Echo = 1,
    Dynamic = 2,
    Mocker = 3,
}

/// `RoundRobin` / `Random` / `KV` from a `RouterConfig` (its `router_mode`).
fn router_mode_of(config: Option<&Bound<'_, PyAny>>) -> PyResult<RouterMode> {
    let Some(config) = config.filter(|c| !c.is_none()) else {
        return Ok(RouterMode::RoundRobin);
    };
    let mode = config.getattr("router_mode")?;
    let text: String = mode
        .repr()?
        .to_string()
        .to_ascii_lowercase()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    if text.ends_with("roundrobin") {
        Ok(RouterMode::RoundRobin)
    } else if text.ends_with("random") {
        Ok(RouterMode::Random)
    } else if text.ends_with("kv") {
        Ok(RouterMode::Kv)
    } else {
        Err(PyValueError::new_err(format!(
            "router mode {text:?} is not supported by this frontend: use RoundRobin, Random or KV"
        )))
    }
}

/// Arguments of `make_engine`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct EntrypointArgs {
    engine_type: EngineType,
    model_path: Option<String>,
    model_name: Option<String>,
    http_host: Option<String>,
    http_port: Option<u16>,
    router_mode: RouterMode,
    /// The KV router's configuration and busy thresholds (from `router_config`).
    kv_router: Option<(KvRouterConfig, LoadThresholds)>,
    mock_args: Option<MockEngineArgs>,
    namespace: Option<String>,
    migration_limit: u32,
    /// The frontend's default tool-call / reasoning parsers (`runtime_config`'s).
    parsers: dynamo_parsers::ParserNames,
    /// Serve the Anthropic Messages API (`None`: `DYN_ENABLE_ANTHROPIC_API`).
    enable_anthropic_api: Option<bool>,
    /// Media settings of a local engine's card (`media_decoder=` / `media_fetcher=`).
    media_decoder: Option<dynamo_multimodal::MediaDecoderConfig>,
    media_fetcher: Option<dynamo_multimodal::MediaFetcherConfig>,
    /// Builds discovered chat models' chat engines (`chat_engine_factory`, on the event
    /// loop running when the args were created).
    chat_engine_factory: Option<Arc<dyn ChatEngineFactory>>,
}

#[pymethods]
impl EntrypointArgs {
    #[new]
    #[pyo3(signature = (
        engine_type, model_path = None, model_name = None, endpoint_id = None,
        context_length = None, template_file = None, router_config = None,
        kv_cache_block_size = None, http_host = None, http_port = None,
        http_metrics_port = None, tls_cert_path = None, tls_key_path = None,
        extra_engine_args = None, mocker_engine_args = None, runtime_config = None,
        namespace = None, namespace_prefix = None, is_prefill = false, is_decode = false,
        migration_limit = 0, migration_max_seq_len = None, chat_engine_factory = None,
        aic_perf_config = None, *, metrics_prefix = None, enable_anthropic_api = None,
        strip_anthropic_preamble = None, enable_streaming_tool_dispatch = None,
        enable_streaming_reasoning_dispatch = None, tokenizer_backend = None,
        media_decoder = None, media_fetcher = None
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the Python signature of EntrypointArgs"
    )]
    #[expect(unused_variables, reason = "accepted for compatibility; not modelled")]
    fn new(
        py: Python<'_>,
        engine_type: EngineType,
        model_path: Option<String>,
        model_name: Option<String>,
        endpoint_id: Option<String>,
        context_length: Option<u32>,
        template_file: Option<String>,
        router_config: Option<&Bound<'_, PyAny>>,
        kv_cache_block_size: Option<u32>,
        http_host: Option<String>,
        http_port: Option<u16>,
        http_metrics_port: Option<u16>,
        tls_cert_path: Option<String>,
        tls_key_path: Option<String>,
        extra_engine_args: Option<PathBuf>,
        mocker_engine_args: Option<&Bound<'_, PyAny>>,
        runtime_config: Option<PyModelRuntimeConfig>,
        namespace: Option<String>,
        namespace_prefix: Option<String>,
        is_prefill: bool,
        is_decode: bool,
        migration_limit: u32,
        migration_max_seq_len: Option<u32>,
        chat_engine_factory: Option<&Bound<'_, PyAny>>,
        aic_perf_config: Option<&Bound<'_, PyAny>>,
        metrics_prefix: Option<String>,
        enable_anthropic_api: Option<bool>,
        strip_anthropic_preamble: Option<bool>,
        enable_streaming_tool_dispatch: Option<bool>,
        enable_streaming_reasoning_dispatch: Option<bool>,
        tokenizer_backend: Option<String>,
        media_decoder: Option<&Bound<'_, PyAny>>,
        media_fetcher: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if tls_cert_path.is_some() != tls_key_path.is_some() {
            return Err(PyValueError::new_err(
                "tls_cert_path and tls_key_path must be given together",
            ));
        }
        let mock_args = match (
            mocker_engine_args.filter(|a| !a.is_none()),
            extra_engine_args,
        ) {
            (Some(a), _) => Some(mock_engine_args_from_py(a)?),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    PyValueError::new_err(format!("cannot read {}: {e}", path.display()))
                })?;
                Some(MockEngineArgs::from_json(&text).map_err(mocker_error)?)
            }
            (None, None) => None,
        };
        let parsers = runtime_config
            .as_ref()
            .map(|c| dynamo_parsers::ParserNames {
                tool_call_parser: c.inner.tool_call_parser.clone(),
                reasoning_parser: c.inner.reasoning_parser.clone(),
            })
            .unwrap_or_default();
        parsers.validate().map_err(PyValueError::new_err)?;
        let chat_engine_factory = match chat_engine_factory.filter(|f| !f.is_none()) {
            Some(f) => Some(
                Arc::new(crate::llm::routed_engine::PyChatEngineFactory::new(py, f)?)
                    as Arc<dyn ChatEngineFactory>,
            ),
            None => None,
        };
        Ok(Self {
            engine_type,
            model_path,
            model_name,
            http_host,
            http_port,
            router_mode: router_mode_of(router_config)?,
            kv_router: router_config
                .and_then(|c| c.extract::<PyRouterConfig>().ok())
                .map(|c| (c.kv_router_config.inner, c.thresholds)),
            mock_args,
            namespace,
            migration_limit,
            parsers,
            enable_anthropic_api,
            media_decoder: crate::llm::media::decoder_config(media_decoder)?,
            media_fetcher: crate::llm::media::fetcher_config(media_fetcher)?,
            chat_engine_factory,
        })
    }
}

/// What `make_engine` built (opaque): the frontend settings (for `http`, `text`, `stdin`)
/// and, for `Echo` / `Mocker`, the in-process engine (else the frontend follows discovered
/// workers).
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct EngineConfig {
    frontend: FrontendConfig,
    local: Option<LocalEngine>,
    chat_engine_factory: Option<Arc<dyn ChatEngineFactory>>,
}

/// Build the engine described by `args`.
#[pyfunction]
#[pyo3(signature = (distributed_runtime, args))]
fn make_engine<'py>(
    py: Python<'py>,
    distributed_runtime: &DistributedRuntime,
    args: &EntrypointArgs,
) -> PyResult<Bound<'py, PyAny>> {
    let _ = distributed_runtime;
    let config = engine_config(args)?;
    py_async(py, async move { Ok(config) })
}

/// What `make_engine` resolves to (it needs no I/O: the awaitable is the API's shape).
fn engine_config(args: &EntrypointArgs) -> PyResult<EngineConfig> {
    let mut frontend = FrontendConfig::default();
    if let Some(h) = &args.http_host {
        frontend.host.clone_from(h);
    }
    if let Some(p) = args.http_port {
        frontend.port = p;
    }
    frontend.router_mode = args.router_mode;
    if let Some((config, thresholds)) = &args.kv_router {
        frontend.kv_router_config = config.clone();
        frontend.load_thresholds = *thresholds;
    }
    frontend.migration_limit = args.migration_limit;
    frontend.namespace.clone_from(&args.namespace);
    frontend.parsers.clone_from(&args.parsers);
    if let Some(enabled) = args.enable_anthropic_api {
        frontend.enable_anthropic_api = enabled;
    }
    let kind = match args.engine_type {
        EngineType::Dynamic => None,
        EngineType::Mocker => Some(LocalEngineKind::Mocker(
            args.mock_args.clone().unwrap_or_default(),
        )),
        EngineType::Echo => Some(LocalEngineKind::Echo),
    };
    let local = match kind {
        None => None,
        Some(kind) => Some(LocalEngine {
            model_path: args.model_path.clone().ok_or_else(|| {
                PyValueError::new_err(format!("{:?} engines need model_path", args.engine_type))
            })?,
            model_name: args.model_name.clone(),
            kind,
            media_decoder: args.media_decoder.clone(),
            media_fetcher: args.media_fetcher.clone(),
        }),
    };
    // Fail here, not at `run_input`, on a model directory that cannot serve.
    if let Some(l) = &local {
        l.card().map_err(frontend_error)?;
    }
    Ok(EngineConfig {
        frontend,
        local,
        chat_engine_factory: args.chat_engine_factory.clone(),
    })
}

/// Run `engine_config` behind `input` (`"http"`, `"grpc"`, `"text"`, `"stdin"` or `"dyn://ns.comp.ep"`) until the runtime
/// stops.
#[pyfunction]
#[pyo3(signature = (runtime, input, engine_config, frontend_route_extensions = None))]
fn run_input<'py>(
    py: Python<'py>,
    runtime: &DistributedRuntime,
    input: &str,
    engine_config: &EngineConfig,
    frontend_route_extensions: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let routes = match frontend_route_extensions.filter(|f| !f.is_none()) {
        Some(f) => crate::llm::frontend_routes::routes_from_py(f)?,
        None => Vec::new(),
    };
    if !routes.is_empty() && input != "http" {
        return Err(PyValueError::new_err(
            "frontend_route_extensions are only supported with input \"http\"",
        ));
    }
    let fut = input_future(runtime.core().clone(), input, engine_config, routes)?;
    py_async(py, fut)
}

/// A future serving one input of `run_input` until the runtime stops.
type InputFuture = std::pin::Pin<Box<dyn std::future::Future<Output = PyResult<()>> + Send>>;

/// What `run_input` awaits: `engine_config` behind `input` on `drt`. Errors that need no
/// I/O (an unknown input, a frontend engine given a worker endpoint) are raised here.
fn input_future(
    drt: dynamo_runtime::DistributedRuntime,
    input: &str,
    engine_config: &EngineConfig,
    routes: Vec<dynamo_frontend::http::extensions::ExtensionRoute>,
) -> PyResult<InputFuture> {
    let frontend = engine_config.frontend.clone();
    let local = engine_config.local.clone();
    if input == "http" {
        let factory = engine_config.chat_engine_factory.clone();
        return Ok(Box::pin(async move {
            serve_http_with_factory(drt, frontend, local.as_ref(), routes, factory)
                .await
                .map_err(frontend_error)
        }));
    }
    if let Some(text) = TextInput::parse(input) {
        return Ok(Box::pin(async move {
            dynamo_frontend::entrypoint::text::run(drt, text, frontend, local.as_ref())
                .await
                .map_err(frontend_error)
        }));
    }
    match (local, input) {
        (Some(local), ep) if ep.starts_with("dyn://") => {
            let endpoint = EndpointId::parse(ep).map_err(runtime_error)?;
            Ok(Box::pin(async move {
                local
                    .serve_endpoint(drt, endpoint)
                    .await
                    .map_err(frontend_error)
            }))
        }
        (None, ep) if ep.starts_with("dyn://") => Err(PyValueError::new_err(
            "a dynamic (frontend) engine cannot be served as a worker endpoint",
        )),
        // The reference serves gRPC on the engine's HTTP host and port.
        (local, "grpc") => Ok(Box::pin(async move {
            dynamo_frontend::entrypoint::serve_grpc(drt, frontend, local.as_ref())
                .await
                .map_err(frontend_error)
        })),
        _ => Err(PyValueError::new_err(format!(
            "unknown input {input:?}: expected \"http\", \"text\", \"stdin\", \"grpc\" or \"dyn://namespace.component.endpoint\""
        ))),
    }
}

/// Run each `(runtime, input, args)` as `await run_input(runtime, input, await
/// make_engine(runtime, args))` would, all at once, on the calling thread (the GIL released)
/// and without an asyncio event loop; return when every one has returned. SIGINT and SIGTERM
/// start every runtime's graceful shutdown; the first input to fail shuts the others down
/// and its error is raised once they have stopped; when all have returned, every runtime is
/// shut down.
///
/// For the command-line entry points (`python -m dynamo.frontend`, `python -m
/// dynamo.mocker`), whose engines call no Python code: such a process need not import
/// `asyncio`, which is most of its start-up. Bad arguments raise before anything is served.
#[pyfunction]
#[pyo3(signature = (inputs))]
fn run_inputs_blocking(
    py: Python<'_>,
    inputs: Vec<(
        PyRef<'_, DistributedRuntime>,
        String,
        PyRef<'_, EntrypointArgs>,
    )>,
) -> PyResult<()> {
    let rt = crate::runtime::distributed_runtime::tokio_runtime()?;
    let mut runtimes = Vec::with_capacity(inputs.len());
    let mut futures = Vec::with_capacity(inputs.len());
    for (runtime, input, args) in &inputs {
        let config = engine_config(args)?;
        if config.chat_engine_factory.is_some() {
            return Err(PyValueError::new_err(
                "a chat_engine_factory calls Python: serve it with run_input on an event loop",
            ));
        }
        futures.push(input_future(
            runtime.core().clone(),
            input,
            &config,
            Vec::new(),
        )?);
        runtimes.push(runtime.core().clone());
    }
    drop(inputs);
    // Python's own SIGINT handler would run too (signal handlers chain) and raise
    // KeyboardInterrupt once this returns: the signal is ours while serving. Only the main
    // thread may set handlers; elsewhere Python's stays and the caller sees the interrupt.
    let signal = py.import("signal")?;
    let sigint = signal.getattr("SIGINT")?;
    let previous = signal
        .call_method1("signal", (&sigint, signal.getattr("SIG_DFL")?))
        .ok();
    let outcome = py.detach(|| rt.block_on(run_until_signal(runtimes, futures)));
    if let Some(previous) = previous {
        signal.call_method1("signal", (sigint, previous))?;
    }
    outcome
}

/// Drive `futures` to completion; SIGINT/SIGTERM or the first error shut `runtimes` down.
async fn run_until_signal(
    runtimes: Vec<dynamo_runtime::DistributedRuntime>,
    futures: Vec<InputFuture>,
) -> PyResult<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown_all = || {
        runtimes
            .iter()
            .for_each(dynamo_runtime::DistributedRuntime::shutdown)
    };
    let listen = |kind| {
        signal(kind).map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot wait for signals: {e}"))
        })
    };
    let (mut term, mut int) = (
        listen(SignalKind::terminate())?,
        listen(SignalKind::interrupt())?,
    );
    let mut tasks = tokio::task::JoinSet::new();
    for fut in futures {
        tasks.spawn(fut);
    }
    let mut first_error = None;
    loop {
        let done = tokio::select! {
            _ = term.recv() => { shutdown_all(); continue; }
            _ = int.recv() => { shutdown_all(); continue; }
            done = tasks.join_next() => done,
        };
        let outcome = match done {
            None => break,
            Some(Ok(outcome)) => outcome,
            Some(Err(e)) => Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "an input task failed: {e}"
            ))),
        };
        if let Err(e) = outcome {
            shutdown_all();
            first_error.get_or_insert(e);
        }
    }
    shutdown_all();
    first_error.map_or(Ok(()), Err)
}
