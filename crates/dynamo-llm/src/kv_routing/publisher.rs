//! Worker side: KV events and load metrics.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use dynamo_kv_router::protocols::{
    KvCacheEvent, KvCacheEventData, RouterEvent, StorageTier, WorkerWithDpRank,
    encode_json_router_event,
};
use dynamo_kv_router::publisher::{PublishInput, PublisherCore, StoredInput};
use dynamo_kv_router::recovery::{LocalKvIndexer, WorkerKvQueryRequest, WorkerKvQueryResponse};
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::transport::{ErrorKind, WireError, codec};
use dynamo_runtime::{DistributedRuntime, EndpointId};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::bus::TopicPublisher;
use super::{KV_EVENTS_TOPIC, KV_METRICS_TOPIC, Result, lock, query_endpoint_name};

/// Replay buffer of a worker-local indexer fed with raw engine events.
const RAW_REPLAY_BUFFER: usize = 1024;

enum Numbering {
    /// Engine reports (`publish_stored` & co.) through the shared publisher pipeline.
    Core(PublisherCore),
    /// Raw events (the mocker's sink): numbered here, optionally recorded locally.
    Raw {
        next_event_id: u64,
        local: Option<LocalKvIndexer>,
    },
}

struct State {
    numbering: Numbering,
}

/// Publishes one worker rank's KV-cache events on the component's `kv_events` topic and,
/// with the local indexer enabled, answers replay queries on
/// `worker_kv_indexer_query_dp{rank}` so routers can recover after losing events.
///
/// Event ids are assigned here, from 0, monotonically per publisher.
pub struct KvEventPublisher {
    worker: WorkerWithDpRank,
    topic: TopicPublisher,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

struct QueryHandler {
    state: Arc<Mutex<State>>,
}

impl Handler for QueryHandler {
    fn start(&self, request: Request, mut out: Responder) {
        let req: WorkerKvQueryRequest = match codec::decode(&request.body) {
            Ok(r) => r,
            Err(e) => {
                out.fail(WireError::new(
                    ErrorKind::InvalidArgument,
                    e.to_string(),
                    false,
                ));
                return;
            }
        };
        let answer = {
            let state = lock(&self.state);
            let local = match &state.numbering {
                Numbering::Core(core) => core.local_indexer(),
                Numbering::Raw { local, .. } => local.as_ref(),
            };
            local.map(|l| l.query(&req))
        };
        match answer.map(|a| codec::encode(&a)) {
            Some(Ok(bytes)) => {
                let _ = out.send(&bytes);
                out.finish();
            }
            Some(Err(e)) => out.fail(WireError::new(ErrorKind::Unknown, e.to_string(), false)),
            None => out.fail(WireError::new(
                ErrorKind::NotFound,
                "the worker-local indexer is not enabled",
                false,
            )),
        }
    }
}

impl KvEventPublisher {
    fn start(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        worker: WorkerWithDpRank,
        numbering: Numbering,
        serve_query: bool,
    ) -> Result<Self> {
        let topic = TopicPublisher::new(
            runtime,
            &endpoint.namespace,
            &endpoint.component,
            KV_EVENTS_TOPIC,
        )?;
        let state = Arc::new(Mutex::new(State { numbering }));
        let stop = CancellationToken::new();
        if serve_query {
            let query = EndpointId::new(
                &endpoint.namespace,
                &endpoint.component,
                &query_endpoint_name(worker.dp_rank),
            )?;
            let handler = Arc::new(QueryHandler {
                state: Arc::clone(&state),
            });
            let rt = runtime.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                if let Err(e) = rt.serve_endpoint_until(&query, handler, false, stop).await {
                    tracing::warn!(endpoint = %query, error = %e, "KV query endpoint stopped");
                }
            });
        }
        Ok(Self {
            worker,
            topic,
            state,
            stop,
        })
    }

    /// A publisher of engine reports (token ids + engine block hashes; `tokens_hash` is
    /// recomputed) for `worker` of `endpoint`'s component. Must be called inside the tokio
    /// runtime.
    ///
    /// # Errors
    /// A zero block size or an invalid name.
    pub fn new(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        worker: WorkerWithDpRank,
        block_size: usize,
        enable_local_indexer: bool,
    ) -> Result<Self> {
        let core = PublisherCore::new(worker, block_size, enable_local_indexer)?;
        Self::start(
            runtime,
            endpoint,
            worker,
            Numbering::Core(core),
            enable_local_indexer,
        )
    }

    /// A publisher of raw events (e.g. the mocker's event sink, which already computes
    /// both hashes): [`KvEventPublisher::publish_raw`] numbers them.
    /// Must be called inside the tokio runtime.
    ///
    /// # Errors
    /// An invalid name.
    pub fn new_raw(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        worker: WorkerWithDpRank,
        enable_local_indexer: bool,
    ) -> Result<Self> {
        let local = enable_local_indexer.then(|| LocalKvIndexer::new(worker, RAW_REPLAY_BUFFER));
        Self::start(
            runtime,
            endpoint,
            worker,
            Numbering::Raw {
                next_event_id: 0,
                local,
            },
            enable_local_indexer,
        )
    }

    /// The rank this publisher speaks for.
    pub fn worker(&self) -> WorkerWithDpRank {
        self.worker
    }

    /// The id the next event will get.
    pub fn next_event_id(&self) -> u64 {
        match &lock(&self.state).numbering {
            Numbering::Core(core) => core.next_event_id(),
            Numbering::Raw { next_event_id, .. } => *next_event_id,
        }
    }

    /// Routers currently connected.
    pub fn subscriber_count(&self) -> usize {
        self.topic.subscriber_count()
    }

    /// Number the next `n` events but do not send them: routers see an id gap and
    /// recover from the local indexer. A fault-injection hook for tests.
    pub fn drop_next_events(&self, n: u64) {
        self.topic.drop_next(n);
    }

    fn send(&self, events: &[RouterEvent]) {
        if !self.topic.wanted() {
            // Nobody would receive them (the ids were still taken: numbering is unchanged).
            return;
        }
        for e in events {
            self.topic
                .publish(Bytes::from(encode_json_router_event(e).into_bytes()));
        }
    }

    fn with_core<T>(&self, f: impl FnOnce(&mut PublisherCore) -> T) -> Result<T> {
        let mut state = lock(&self.state);
        match &mut state.numbering {
            Numbering::Core(core) => Ok(f(core)),
            Numbering::Raw { .. } => Err(super::Error::InvalidArgument(
                "this publisher takes raw events (publish_raw)".into(),
            )),
        }
    }

    /// Publish stored blocks.
    ///
    /// # Errors
    /// Invalid input (nothing is published).
    pub fn publish_stored(&self, input: &StoredInput) -> Result<()> {
        let event = self.with_core(|c| c.stored(input))??;
        self.send(event.as_slice());
        Ok(())
    }

    /// Publish removed blocks (engine hashes).
    ///
    /// # Errors
    /// A raw publisher.
    pub fn publish_removed(&self, block_hashes: &[i64]) -> Result<()> {
        let event = self.with_core(|c| c.removed(block_hashes))?;
        self.send(event.as_slice());
        Ok(())
    }

    /// Publish "every block dropped".
    ///
    /// # Errors
    /// A raw publisher.
    pub fn publish_cleared(&self) -> Result<()> {
        let event = self.with_core(PublisherCore::cleared)?;
        self.send(&[event]);
        Ok(())
    }

    /// Validate the whole batch, then publish it (coalescing compatible neighbours).
    ///
    /// # Errors
    /// Any invalid item (nothing is published).
    pub fn publish_batch(&self, items: &[PublishInput]) -> Result<()> {
        let events = self.with_core(|c| c.batch(items))??;
        self.send(&events);
        Ok(())
    }

    /// Number and publish raw events (one per item, in order).
    ///
    /// # Errors
    /// A publisher of engine reports.
    pub fn publish_raw(&self, data: Vec<KvCacheEventData>) -> Result<()> {
        let mut events = Vec::with_capacity(data.len());
        {
            let mut state = lock(&self.state);
            let Numbering::Raw {
                next_event_id,
                local,
            } = &mut state.numbering
            else {
                return Err(super::Error::InvalidArgument(
                    "this publisher takes engine reports (publish_stored)".into(),
                ));
            };
            for d in data {
                let event = KvCacheEvent {
                    event_id: *next_event_id,
                    data: d,
                    dp_rank: self.worker.dp_rank,
                };
                *next_event_id += 1;
                if let Some(l) = local.as_mut() {
                    // The local tree rejects what the router's would; the event is still
                    // published so that ids stay contiguous.
                    let _ = l.record(event.clone());
                }
                events.push(RouterEvent {
                    worker_id: self.worker.worker_id,
                    storage_tier: StorageTier::Device,
                    event,
                });
            }
        }
        self.send(&events);
        Ok(())
    }

    /// Relay mode: read the engine's KV events from its ZMQ PUB socket at `zmq_endpoint`
    /// (`tcp://host:port`, messages whose topic starts with `zmq_topic`) and publish them
    /// (engine reports: `tokens_hash` is recomputed). Runs until [`KvEventPublisher::shutdown`]
    /// or the last handle is dropped. Must be called inside the tokio runtime.
    pub fn start_zmq_relay(self: &Arc<Self>, zmq_endpoint: &str, zmq_topic: &str) {
        tokio::spawn(super::zmq::relay(
            zmq_endpoint.to_owned(),
            zmq_topic.to_owned(),
            Arc::downgrade(self),
            self.stop.clone(),
        ));
    }

    /// An event sink for an engine that reports each step's events (the mocker's runner
    /// takes one): numbers and publishes them through this (raw) publisher.
    pub fn event_sink(self: &Arc<Self>) -> Box<dyn FnMut(Vec<KvCacheEventData>) + Send> {
        let me = Arc::clone(self);
        Box::new(move |data| {
            if !data.is_empty()
                && let Err(e) = me.publish_raw(data)
            {
                tracing::warn!(error = %e, "KV events not published");
            }
        })
    }

    /// Stop serving the replay endpoint (the topic stops with the last publisher).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A worker rank's load, as published on the `kv_metrics` topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ActiveLoad {
    /// The worker.
    pub worker_id: u64,
    /// Its rank.
    #[serde(default)]
    pub dp_rank: u32,
    /// Decode blocks in use (engine view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_decode_blocks: Option<u64>,
    /// KV blocks in use (authoritative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_used_blocks: Option<u64>,
    /// The rank's KV capacity in blocks (extension: the reference takes it from the model
    /// card's runtime config; busy thresholds need it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_kv_blocks: Option<u64>,
    /// The engine's largest token batch (extension, as `total_kv_blocks`; the router queue
    /// needs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u64>,
}

/// Publishes a worker's load metrics on the component's `kv_metrics` topic.
#[derive(Clone)]
pub struct WorkerMetricsPublisher {
    worker_id: u64,
    topic: TopicPublisher,
}

impl WorkerMetricsPublisher {
    /// A publisher for `worker_id` of `endpoint`'s component. Must be called inside the
    /// tokio runtime.
    ///
    /// # Errors
    /// An invalid name.
    pub fn new(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        worker_id: u64,
    ) -> Result<Self> {
        let topic = TopicPublisher::new(
            runtime,
            &endpoint.namespace,
            &endpoint.component,
            KV_METRICS_TOPIC,
        )?;
        Ok(Self { worker_id, topic })
    }

    /// Publish one rank's load.
    pub fn publish(
        &self,
        dp_rank: u32,
        active_decode_blocks: Option<u64>,
        kv_used_blocks: Option<u64>,
    ) {
        self.publish_load(&ActiveLoad {
            worker_id: self.worker_id,
            dp_rank,
            active_decode_blocks,
            kv_used_blocks,
            ..ActiveLoad::default()
        });
    }

    /// Publish a full load report (including capacity). `load.worker_id` is replaced by
    /// this publisher's worker.
    pub fn publish_load(&self, load: &ActiveLoad) {
        let load = ActiveLoad {
            worker_id: self.worker_id,
            ..*load
        };
        if let Ok(bytes) = serde_json::to_vec(&load) {
            self.topic.publish(Bytes::from(bytes));
        }
    }

    /// Routers currently connected.
    pub fn subscriber_count(&self) -> usize {
        self.topic.subscriber_count()
    }
}

/// Ask a worker's local indexer for events from `start_event_id` on.
pub(crate) async fn query_worker(
    runtime: &DistributedRuntime,
    namespace: &str,
    component: &str,
    worker: WorkerWithDpRank,
    start_event_id: Option<u64>,
) -> Result<WorkerKvQueryResponse> {
    let ep = EndpointId::new(namespace, component, &query_endpoint_name(worker.dp_rank))?;
    let client = runtime.client(&ep);
    let req = WorkerKvQueryRequest {
        worker_id: worker.worker_id,
        dp_rank: worker.dp_rank,
        start_event_id,
        end_event_id: None,
    };
    let body =
        Bytes::from(codec::encode(&req).map_err(|e| super::Error::InvalidArgument(e.to_string()))?);
    // Discovery may not have caught up with the worker yet: a few bounded retries.
    let mut last_err = None;
    for _ in 0..20 {
        match client
            .generate(
                body.clone(),
                dynamo_runtime::Route::Direct(worker.worker_id),
                dynamo_runtime::Context::default(),
                None,
            )
            .await
        {
            Ok(mut stream) => {
                let item = stream.next().await.ok_or_else(|| {
                    super::Error::InvalidArgument("empty KV query answer".into())
                })??;
                return codec::decode(&item)
                    .map_err(|e| super::Error::InvalidArgument(e.to_string()));
            }
            Err(e @ dynamo_runtime::Error::UnknownInstance { .. }) => {
                last_err = Some(e);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(last_err.map_or_else(
        || super::Error::InvalidArgument("KV query failed".into()),
        Into::into,
    ))
}
