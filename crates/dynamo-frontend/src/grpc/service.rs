//! `inference.GRPCInferenceService` over the models of a [`super::KserveService`].

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use dynamo_llm::discovery::{ModelEntry, ModelManager};
use dynamo_llm::model_card::ModelRuntimeConfig;
use dynamo_runtime::{Context, Route};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tower_service::Service;

use super::proto::grpc_inference_service_server::GrpcInferenceService;
use super::proto::model_metadata_response::TensorMetadata as KsTensorMetadata;
use super::proto::{
    ModelConfig, ModelConfigRequest, ModelConfigResponse, ModelInferRequest, ModelInferResponse,
    ModelInput, ModelMetadataRequest, ModelMetadataResponse, ModelOutput, ModelParameter,
    ModelReadyRequest, ModelReadyResponse, ModelStreamInferResponse, ModelTransactionPolicy,
    ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse,
    ServerReadyRequest, ServerReadyResponse,
};
use super::tensor::{
    DataType, TensorMetadata, TensorModelConfig, TensorRequest, TensorResponse, check_all_given,
    check_input, params_from_kserve, params_to_kserve, tensors_from_kserve, tensors_to_kserve,
};
use super::text::{self, SseEvent, SseParser, TextRequest};
use super::{StaticTensorModel, TensorModels};
use crate::http::HttpError;
use crate::http::StaticModels;
use crate::http::engine::{decode_item, route_error};

/// Responses buffered per `ModelStreamInfer` stream before its requests wait for the
/// client: absorbs a burst of chunks, keeps a slow reader's memory small.
const STREAM_WINDOW: usize = 64;

/// The gRPC status of a frontend error.
pub(crate) fn status_of(e: &HttpError) -> Status {
    let msg = e.message.clone();
    match e.status {
        400 | 413 | 415 | 422 => Status::invalid_argument(msg),
        404 => Status::not_found(msg),
        408 => Status::deadline_exceeded(msg),
        429 | 529 => Status::resource_exhausted(msg),
        503 => Status::unavailable(msg),
        501 => Status::unimplemented(msg),
        _ => Status::internal(msg),
    }
}

fn not_found(model: &str) -> Status {
    Status::not_found(format!("Model '{model}' not found"))
}

/// Where a model's tensor requests go.
enum TensorTarget {
    Static(StaticTensorModel),
    Discovered(Arc<ModelEntry>),
}

type TensorStream = BoxStream<'static, Result<TensorResponse, Status>>;
type TextStream = BoxStream<'static, Result<(String, Option<String>), Status>>;

/// The service (cheap to clone: one per connection).
#[derive(Clone)]
pub(crate) struct Kserve {
    router: Router,
    models: ModelManager,
    statics: StaticModels,
    tensors: TensorModels,
}

impl Kserve {
    pub(crate) fn new(
        router: Router,
        models: ModelManager,
        statics: StaticModels,
        tensors: TensorModels,
    ) -> Self {
        Self {
            router,
            models,
            statics,
            tensors,
        }
    }

    fn tensor_target(&self, model: &str) -> Option<TensorTarget> {
        if let Some(s) = self.tensors.get(model) {
            return Some(TensorTarget::Static(s));
        }
        self.models
            .get(model)
            .filter(|e| e.card.model_type.supports_tensor())
            .map(TensorTarget::Discovered)
    }

    fn is_text_model(&self, model: &str) -> bool {
        self.statics.list_completions().iter().any(|m| m == model)
            || self.statics.token_model(model).is_some()
            || self
                .models
                .get(model)
                .is_some_and(|e| e.card.model_type.supports_completions())
    }

    fn is_known(&self, model: &str) -> bool {
        self.tensors.get(model).is_some()
            || self.models.get(model).is_some()
            || self.statics.list_chat().iter().any(|m| m == model)
            || self.is_text_model(model)
    }

    // ---- tensor models ----

    /// Validate and convert `req`, send it to the model; the worker's answers.
    async fn tensor_open(
        &self,
        target: TensorTarget,
        req: &ModelInferRequest,
    ) -> Result<TensorStream, Status> {
        let config = match &target {
            TensorTarget::Static(s) => s.config.clone(),
            TensorTarget::Discovered(e) => match &e.card.tensor_model_config {
                Some(v) => Some(Arc::new(
                    TensorModelConfig::from_json(v.clone())
                        .map_err(|e| Status::internal(e.to_string()))?,
                )),
                None => None,
            },
        };
        if let Some(config) = &config {
            for input in &req.inputs {
                check_input(input, config).map_err(|e| Status::invalid_argument(e.0))?;
            }
            check_all_given(&req.inputs, config).map_err(|e| Status::invalid_argument(e.0))?;
        }
        let tensors = tensors_from_kserve(&req.inputs, &req.raw_input_contents)
            .map_err(|e| Status::invalid_argument(e.0))?;
        let request = TensorRequest {
            id: Some(req.id.clone()).filter(|i| !i.is_empty()),
            model: req.model_name.clone(),
            tensors,
            parameters: params_from_kserve(&req.parameters),
        };
        match target {
            TensorTarget::Static(s) => {
                let body = serde_json::to_vec(&request)
                    .map_err(|e| Status::internal(format!("cannot encode the request: {e}")))?;
                let chunks = s.engine.generate(Bytes::from(body), Context::default());
                Ok(chunks
                    .map(|item| {
                        let bytes = item.map_err(|e| status_of(&e))?;
                        serde_json::from_slice::<TensorResponse>(&bytes).map_err(|e| {
                            Status::internal(format!(
                                "invalid tensor response from the engine: {e}"
                            ))
                        })
                    })
                    .boxed())
            }
            TensorTarget::Discovered(entry) => {
                let body = dynamo_runtime::transport::codec::encode(&request)
                    .map_err(|e| Status::internal(format!("cannot encode the request: {e}")))?;
                let stream = entry
                    .client
                    .generate(
                        Bytes::from(body),
                        Route::RoundRobin,
                        Context::default(),
                        None,
                    )
                    .await
                    .map_err(|e| status_of(&route_error(&e)))?;
                Ok(futures_util::stream::unfold(stream, |mut s| async move {
                    loop {
                        let item = match s.next().await? {
                            Ok(bytes) => bytes,
                            Err(e) => {
                                let st =
                                    Status::internal(format!("stream ended with an error: {e}"));
                                return Some((Err(st), s));
                            }
                        };
                        match decode_item::<TensorResponse>(&item) {
                            Ok(Some(r)) => return Some((Ok(r), s)),
                            Ok(None) => {}
                            Err(e) => return Some((Err(status_of(&e)), s)),
                        }
                    }
                })
                .boxed())
            }
        }
    }

    fn tensor_response(
        req_model: &str,
        req_id: &str,
        raw: bool,
        wanted: &[String],
        resp: TensorResponse,
    ) -> Result<ModelInferResponse, Status> {
        let mut tensors = resp.tensors;
        if !wanted.is_empty() {
            tensors.retain(|t| wanted.contains(&t.metadata.name));
        }
        let (outputs, raw_output_contents) =
            tensors_to_kserve(tensors, raw).map_err(Status::internal)?;
        Ok(ModelInferResponse {
            model_name: req_model.to_owned(),
            model_version: "1".into(),
            id: resp
                .id
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| req_id.to_owned()),
            parameters: params_to_kserve(resp.parameters),
            outputs,
            raw_output_contents,
        })
    }

    // ---- text models ----

    /// Send a completions request through the frontend's router; its chunks' text.
    async fn text_open(&self, model: &str, req: &TextRequest) -> Result<TextStream, Status> {
        let body = serde_json::to_vec(&req.body)
            .map_err(|e| Status::internal(format!("cannot encode the request: {e}")))?;
        let request = axum::http::Request::post("/v1/completions")
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .map_err(|e| Status::internal(e.to_string()))?;
        let mut router = self.router.clone();
        let response = match Service::call(&mut router, request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        if status != 200 {
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            if status == 404 {
                return Err(not_found(model));
            }
            return Err(status_of(&HttpError::new(status, message)));
        }
        let data = response.into_body().into_data_stream();
        let state = (
            data,
            SseParser::default(),
            std::collections::VecDeque::new(),
            false,
        );
        Ok(futures_util::stream::unfold(
            state,
            |(mut data, mut parser, mut pending, done)| async move {
                loop {
                    if let Some(ev) = pending.pop_front() {
                        let out = match ev {
                            SseEvent::Data(v) => Ok(text::chunk_text(&v)),
                            SseEvent::Error(m) => Err(Status::internal(m)),
                            SseEvent::Done => return None,
                        };
                        return Some((out, (data, parser, pending, done)));
                    }
                    if done {
                        return None;
                    }
                    match data.next().await {
                        Some(Ok(bytes)) => pending.extend(parser.feed(&bytes)),
                        Some(Err(e)) => {
                            let st = Status::internal(format!("stream failed: {e}"));
                            return Some((Err(st), (data, parser, pending, true)));
                        }
                        None => return None,
                    }
                }
            },
        )
        .boxed())
    }

    /// Parse a text request (`NOT_FOUND` for a model that serves no completions).
    fn text_request(&self, req: &ModelInferRequest) -> Result<TextRequest, Status> {
        if !self.is_text_model(&req.model_name) {
            return Err(not_found(&req.model_name));
        }
        text::parse(req, &req.model_name).map_err(Status::invalid_argument)
    }

    // ---- one request of either kind ----

    /// Answer `req` on `tx`, one response per chunk when it streams. Errors are returned
    /// for the caller to report.
    async fn stream_one(
        &self,
        req: ModelInferRequest,
        tx: &mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
    ) -> Result<(), Status> {
        let model = req.model_name.clone();
        let send = |r: ModelInferResponse| async {
            tx.send(Ok(ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(r),
            }))
            .await
            .map_err(|_| Status::cancelled("the client went away"))
        };
        if let Some(target) = self.tensor_target(&model) {
            let raw = !req.raw_input_contents.is_empty();
            let wanted: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
            let mut stream = self.tensor_open(target, &req).await?;
            while let Some(item) = stream.next().await {
                let resp = Self::tensor_response(&model, &req.id, raw, &wanted, item?)?;
                send(resp).await?;
            }
            return Ok(());
        }
        let parsed = self.text_request(&req)?;
        let mut stream = self.text_open(&model, &parsed).await?;
        if parsed.stream {
            while let Some(item) = stream.next().await {
                let (text, finish) = item?;
                send(text::response(
                    &model,
                    &req.id,
                    &text,
                    finish.as_deref(),
                    parsed.raw,
                ))
                .await?;
            }
        } else {
            let (text, finish) = fold(stream).await?;
            send(text::response(
                &model,
                &req.id,
                &text,
                finish.as_deref(),
                parsed.raw,
            ))
            .await?;
        }
        Ok(())
    }
}

/// All chunks' text and the last finish reason.
async fn fold(mut stream: TextStream) -> Result<(String, Option<String>), Status> {
    let mut text = String::new();
    let mut finish = None;
    while let Some(item) = stream.next().await {
        let (t, f) = item?;
        text.push_str(&t);
        if f.is_some() {
            finish = f;
        }
    }
    Ok((text, finish))
}

fn ks_meta(m: &TensorMetadata) -> KsTensorMetadata {
    KsTensorMetadata {
        name: m.name.clone(),
        datatype: m.data_type.kserve_name().to_owned(),
        shape: m.shape.clone(),
    }
}

/// The interface of a text model (a superset of the reference, which answers
/// `NOT_FOUND` for text models).
fn text_config(model: &str) -> TensorModelConfig {
    let meta = |name: &str, data_type, shape: &[i64]| TensorMetadata {
        name: name.into(),
        data_type,
        shape: shape.to_vec(),
    };
    TensorModelConfig {
        name: model.into(),
        inputs: vec![
            meta("text_input", DataType::Bytes, &[1]),
            meta("stream", DataType::Bool, &[1]),
        ],
        outputs: vec![
            meta("text_output", DataType::Bytes, &[-1]),
            meta("finish_reason", DataType::Bytes, &[-1]),
        ],
    }
}

type StreamOut = BoxStream<'static, Result<ModelStreamInferResponse, Status>>;

#[tonic::async_trait]
impl GrpcInferenceService for Kserve {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: true }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let ready = self.is_known(&request.get_ref().name);
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "dynamo".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec!["model_configuration".into()],
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let name = &request.get_ref().name;
        let config = self.config_of(name)?;
        Ok(Response::new(ModelMetadataResponse {
            name: name.clone(),
            versions: vec!["1".into()],
            platform: "dynamo".into(),
            inputs: config.inputs.iter().map(ks_meta).collect(),
            outputs: config.outputs.iter().map(ks_meta).collect(),
        }))
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let name = &request.get_ref().name;
        let config = self.config_of(name)?;
        let decoupled = self.tensor_target(name).is_none();
        let config = ModelConfig {
            name: name.clone(),
            platform: "dynamo".into(),
            backend: "dynamo".into(),
            input: config
                .inputs
                .iter()
                .map(|m| ModelInput {
                    name: m.name.clone(),
                    data_type: m.data_type.triton_config_type(),
                    dims: m.shape.clone(),
                })
                .collect(),
            output: config
                .outputs
                .iter()
                .map(|m| ModelOutput {
                    name: m.name.clone(),
                    data_type: m.data_type.triton_config_type(),
                    dims: m.shape.clone(),
                })
                .collect(),
            // Text models answer one response per chunk on ModelStreamInfer.
            model_transaction_policy: decoupled.then_some(ModelTransactionPolicy { decoupled }),
            parameters: self
                .runtime_config_of(name)
                .map(|rc| config_parameters(&rc))
                .unwrap_or_default(),
        };
        Ok(Response::new(ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        if let Some(target) = self.tensor_target(&model) {
            let raw = !req.raw_input_contents.is_empty();
            let wanted: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
            let mut stream = self.tensor_open(target, &req).await?;
            let mut first = None;
            // Read to the end so the worker's stream finishes normally (no stop frame).
            while let Some(item) = stream.next().await {
                let item = item?;
                if first.is_none() {
                    first = Some(item);
                }
            }
            let first = first.ok_or_else(|| Status::internal("No response received"))?;
            return Ok(Response::new(Self::tensor_response(
                &model, &req.id, raw, &wanted, first,
            )?));
        }
        let parsed = self.text_request(&req)?;
        if parsed.stream {
            return Err(Status::invalid_argument(
                "Streaming is not supported for this endpoint",
            ));
        }
        let stream = self.text_open(&model, &parsed).await?;
        let (text, finish) = fold(stream).await?;
        Ok(Response::new(text::response(
            &model,
            &req.id,
            &text,
            finish.as_deref(),
            parsed.raw,
        )))
    }

    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<StreamOut>, Status> {
        let mut input = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_WINDOW);
        // Cancelled when the client's stream goes away (the response stream is dropped):
        // every request of the stream stops, dropping its worker stream.
        let cancel = CancellationToken::new();
        let svc = self.clone();
        let reader_cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = reader_cancel.cancelled() => break,
                    next = input.message() => next,
                };
                match next {
                    Ok(Some(req)) => {
                        let (svc, tx, cancel) = (svc.clone(), tx.clone(), reader_cancel.clone());
                        tokio::spawn(async move {
                            let id = req.id.clone();
                            let work = svc.stream_one(req, &tx);
                            let result = tokio::select! {
                                () = cancel.cancelled() => return,
                                r = work => r,
                            };
                            if let Err(status) = result
                                && status.code() != tonic::Code::Cancelled
                            {
                                let _ = tx
                                    .send(Ok(ModelStreamInferResponse {
                                        error_message: status.message().to_owned(),
                                        infer_response: Some(ModelInferResponse {
                                            id,
                                            ..Default::default()
                                        }),
                                    }))
                                    .await;
                            }
                        });
                    }
                    // The client closed its side: the running requests finish, then the
                    // response stream ends (every sender dropped).
                    Ok(None) => break,
                    Err(_) => {
                        reader_cancel.cancel();
                        break;
                    }
                }
            }
        });
        let guard = cancel.drop_guard();
        let out = futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            let item = rx.recv().await?;
            Some((item, (rx, guard)))
        });
        Ok(Response::new(out.boxed()))
    }
}

/// A runtime config's engine-specific values (`runtime_data`) as `ModelConfig` parameters:
/// a JSON string as itself, any other value as its JSON text.
fn config_parameters(rc: &ModelRuntimeConfig) -> HashMap<String, ModelParameter> {
    rc.runtime_data
        .iter()
        .map(|(k, v)| {
            let string_value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), ModelParameter { string_value })
        })
        .collect()
}

impl Kserve {
    /// The runtime config of `name`: a discovered worker's card's, or the one given to
    /// `add_tensor_model`.
    fn runtime_config_of(&self, name: &str) -> Option<Arc<ModelRuntimeConfig>> {
        if let Some(s) = self.tensors.get(name) {
            return s.runtime_config;
        }
        self.models
            .get(name)
            .map(|e| Arc::new(e.card.runtime_config.clone()))
    }

    /// The interface of `name` for `ModelMetadata` / `ModelConfig`.
    fn config_of(&self, name: &str) -> Result<TensorModelConfig, Status> {
        match self.tensor_target(name) {
            Some(TensorTarget::Static(s)) => s
                .config
                .as_deref()
                .cloned()
                // The reference: an added tensor model without a config is not found.
                .ok_or_else(|| not_found(name)),
            Some(TensorTarget::Discovered(e)) => match &e.card.tensor_model_config {
                Some(v) => TensorModelConfig::from_json(v.clone())
                    .map_err(|e| Status::internal(e.to_string())),
                None => Err(Status::invalid_argument(format!(
                    "Model '{name}' has type Tensor but: no model config is provided"
                ))),
            },
            None if self.is_text_model(name) => Ok(text_config(name)),
            None => Err(not_found(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontend_errors_map_to_grpc_codes() {
        let code = |s| status_of(&HttpError::new(s, "x")).code();
        assert_eq!(code(400), tonic::Code::InvalidArgument);
        assert_eq!(code(404), tonic::Code::NotFound);
        assert_eq!(code(503), tonic::Code::Unavailable);
        assert_eq!(code(529), tonic::Code::ResourceExhausted);
        assert_eq!(code(429), tonic::Code::ResourceExhausted);
        assert_eq!(code(500), tonic::Code::Internal);
    }

    #[test]
    fn runtime_data_becomes_model_config_parameters() {
        let mut rc = ModelRuntimeConfig::default();
        rc.runtime_data
            .insert("backend".into(), serde_json::json!("onnx"));
        rc.runtime_data
            .insert("batch".into(), serde_json::json!({"max": 8}));
        let p = config_parameters(&rc);
        assert_eq!(p.len(), 2);
        assert_eq!(p["backend"].string_value, "onnx");
        assert_eq!(p["batch"].string_value, r#"{"max":8}"#);
        assert!(config_parameters(&ModelRuntimeConfig::default()).is_empty());
    }
}
