//! Running a [`MockEngine`] in real (scaled) time on tokio.
//!
//! [`MockEngineRunner::spawn`] moves an engine into a task that steps it whenever it has
//! work and sleeps for each step's simulated duration (already divided by
//! `speedup_ratio`). Submitted requests get a channel of their output tokens; dropping the
//! receiver cancels the request in the engine. KV events and load metrics of every step go
//! to the callbacks given at spawn time, which the serving layer forwards to the event
//! plane.
//!
//! Timing: tokio timers have millisecond granularity, while a sped-up step may last
//! microseconds. The loop therefore keeps a simulated deadline and only sleeps when it is
//! more than [`MIN_SLEEP`] ahead of the wall clock, so throughput matches the model on
//! average without busy-waiting.

use std::time::Duration;

use dynamo_kv_router::protocols::KvCacheEventData;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{MockEngine, MockEngineArgs, MockOutput, MockRequest, MockerMetrics};
use crate::error::{Error, Result};

/// Sleep only when the simulated clock is at least this far ahead of real time.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// Receives the KV events of each step, in order.
pub type EventSink = Box<dyn FnMut(Vec<KvCacheEventData>) + Send>;

/// Receives the KV events of each step with the token ids of their stored blocks (see
/// [`super::StepResult::event_tokens`]), for engine-format (ZMQ) publishing.
pub type EngineEventSink = Box<dyn FnMut(&[KvCacheEventData], &[Vec<u32>]) + Send>;

/// Receives the forward-pass metrics of each step, in order.
pub type FpmSink = Box<dyn FnMut(dynamo_llm::fpm::FpmSample) + Send>;

enum Command {
    Add(
        MockRequest,
        mpsc::UnboundedSender<MockOutput>,
        oneshot::Sender<Result<()>>,
    ),
    Cancel(String),
}

/// Handle to an engine running on a tokio task. Cloning shares the engine; the task ends
/// when every handle is dropped and the engine is idle.
#[derive(Clone)]
pub struct MockEngineRunner {
    commands: mpsc::UnboundedSender<Command>,
    metrics: watch::Receiver<MockerMetrics>,
}

impl MockEngineRunner {
    /// Start an engine with `args` on the current tokio runtime; `events` receives its KV
    /// events.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`].
    pub fn spawn(args: MockEngineArgs, events: EventSink) -> Result<Self> {
        Self::spawn_with_fpm(args, events, None)
    }

    /// [`Self::spawn`], also handing each step's forward-pass metrics to `fpm`.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`].
    pub fn spawn_with_fpm(
        args: MockEngineArgs,
        events: EventSink,
        fpm: Option<FpmSink>,
    ) -> Result<Self> {
        Self::spawn_with_sinks(args, events, fpm, None)
    }

    /// [`Self::spawn_with_fpm`], also handing each step's KV events with their token ids
    /// to `engine_events` (the engine must record tokens: `zmq_kv_events_port` set).
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`].
    pub fn spawn_with_sinks(
        args: MockEngineArgs,
        events: EventSink,
        fpm: Option<FpmSink>,
        engine_events: Option<EngineEventSink>,
    ) -> Result<Self> {
        let engine = MockEngine::new(args)?;
        let (commands, rx) = mpsc::unbounded_channel();
        let (metrics_tx, metrics) = watch::channel(engine.metrics());
        tokio::spawn(run(engine, rx, events, fpm, engine_events, metrics_tx));
        Ok(Self { commands, metrics })
    }

    /// Submit a request; the receiver yields its tokens and closes after the last one.
    ///
    /// # Errors
    /// [`Error::RequestRejected`] / [`Error::DuplicateRequest`] from the engine, or
    /// [`Error::EngineStopped`] if the engine task is gone.
    pub async fn submit(
        &self,
        request: MockRequest,
    ) -> Result<mpsc::UnboundedReceiver<MockOutput>> {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (ack_tx, ack_rx) = oneshot::channel();
        self.commands
            .send(Command::Add(request, out_tx, ack_tx))
            .map_err(|_| Error::EngineStopped)?;
        ack_rx.await.map_err(|_| Error::EngineStopped)??;
        Ok(out_rx)
    }

    /// Cancel a request (its blocks are released at the next step).
    pub fn cancel(&self, request_id: &str) {
        let _ = self.commands.send(Command::Cancel(request_id.to_owned()));
    }

    /// The latest load figures.
    pub fn metrics(&self) -> MockerMetrics {
        *self.metrics.borrow()
    }

    /// A receiver notified after every step with the engine's load figures.
    pub fn watch_metrics(&self) -> watch::Receiver<MockerMetrics> {
        self.metrics.clone()
    }
}

async fn run(
    mut engine: MockEngine,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut events: EventSink,
    mut fpm: Option<FpmSink>,
    mut engine_events: Option<EngineEventSink>,
    metrics: watch::Sender<MockerMetrics>,
) {
    let mut outputs: FxHashMap<String, mpsc::UnboundedSender<MockOutput>> = FxHashMap::default();
    let mut deadline = Instant::now();
    loop {
        // Block for work when idle; otherwise take whatever has arrived.
        if !engine.has_work() {
            match commands.recv().await {
                Some(cmd) => apply(&mut engine, &mut outputs, cmd),
                None => return,
            }
            deadline = Instant::now();
        }
        while let Ok(cmd) = commands.try_recv() {
            apply(&mut engine, &mut outputs, cmd);
        }
        if !engine.has_work() {
            continue;
        }
        let mut step = engine.step();
        if let Some(f) = fpm.as_mut() {
            f(std::mem::take(&mut step.fpm));
        }
        deadline += Duration::from_secs_f64(step.duration_ms / 1000.0);
        let now = Instant::now();
        if deadline > now + MIN_SLEEP {
            tokio::time::sleep_until(deadline).await;
        } else {
            if deadline < now {
                // Fell behind (the host is slower than the model): do not try to catch up
                // with a burst of zero-delay steps.
                deadline = now;
            }
            tokio::task::yield_now().await;
        }
        for out in step.outputs {
            let finished = out.finished;
            let id = std::sync::Arc::clone(&out.request_id);
            let delivered = outputs.get(&*id).is_some_and(|tx| tx.send(out).is_ok());
            if finished {
                outputs.remove(&*id);
            } else if !delivered {
                // The caller went away: stop generating for it.
                outputs.remove(&*id);
                engine.cancel(&id);
            }
        }
        if !step.events.is_empty() {
            if let Some(sink) = engine_events.as_mut() {
                sink(&step.events, &step.event_tokens);
            }
            events(step.events);
        }
        let _ = metrics.send(engine.metrics());
    }
}

fn apply(
    engine: &mut MockEngine,
    outputs: &mut FxHashMap<String, mpsc::UnboundedSender<MockOutput>>,
    cmd: Command,
) {
    match cmd {
        Command::Add(request, tx, ack) => {
            let id = request.request_id.clone();
            let result = engine.add_request(request);
            if result.is_ok() {
                outputs.insert(id, tx);
            }
            let _ = ack.send(result);
        }
        Command::Cancel(id) => {
            engine.cancel(&id);
            outputs.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn args() -> MockEngineArgs {
        MockEngineArgs {
            num_gpu_blocks: 256,
            block_size: 16,
            speedup_ratio: 1000.0,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn streams_tokens_and_events() {
        let seen = Arc::new(Mutex::new(0usize));
        let sink = seen.clone();
        let runner = MockEngineRunner::spawn(
            args(),
            Box::new(move |ev| *sink.lock().expect("lock") += ev.len()),
        )
        .expect("valid");
        let mut rx = runner
            .submit(MockRequest::new("a", (0..100).collect(), 8))
            .await
            .expect("accepted");
        let mut got = Vec::new();
        while let Some(out) = rx.recv().await {
            got.push(out);
        }
        assert_eq!(got.len(), 8);
        assert!(got[7].finished);
        assert!(
            *seen.lock().expect("lock") > 0,
            "stored events were emitted"
        );
        assert_eq!(runner.metrics().num_requests_running, 0);
        // Errors come back to the caller.
        assert!(matches!(
            runner.submit(MockRequest::new("b", vec![], 1)).await,
            Err(Error::RequestRejected { .. })
        ));
    }

    #[tokio::test]
    async fn dropping_the_receiver_cancels() {
        let runner = MockEngineRunner::spawn(
            MockEngineArgs {
                speedup_ratio: 10.0,
                ..args()
            },
            Box::new(|_| {}),
        )
        .expect("valid");
        let mut rx = runner
            .submit(MockRequest::new("long", (0..50).collect(), 4000))
            .await
            .expect("accepted");
        assert!(rx.recv().await.is_some());
        drop(rx);
        let mut watch = runner.watch_metrics();
        // The engine notices at its next step and frees the request.
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if watch.borrow().num_requests_running == 0 {
                    break;
                }
                if watch.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
        .expect("request cancelled within 5 s");
        assert_eq!(runner.metrics().kv_active_blocks, 0);
    }
}
