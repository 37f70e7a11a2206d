//! The runner's load figures published to routers: after every engine step that changed the
//! blocks in use, one load report (active, used and total KV blocks) through a
//! [`WorkerMetricsPublisher`], as a real engine's metrics publisher would send it.

use dynamo_llm::kv_routing::{ActiveLoad, WorkerMetricsPublisher};
use tokio::sync::watch;

use crate::engine::MockerMetrics;

/// Publish `metrics`' `kv_used_blocks` for `dp_rank` through `publisher` whenever it changes,
/// until the engine stops (its sender is dropped). Must be called inside the tokio runtime.
pub fn follow_load(
    publisher: &WorkerMetricsPublisher,
    dp_rank: u32,
    mut metrics: watch::Receiver<MockerMetrics>,
) {
    let publisher = publisher.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let m = *metrics.borrow_and_update();
            // Only changes are sent: a decode step that keeps the same blocks is not news to
            // a router, and at high speed-up most steps are such steps.
            if last != Some(m.kv_used_blocks) {
                last = Some(m.kv_used_blocks);
                publisher.publish_load(&ActiveLoad {
                    worker_id: 0,
                    dp_rank,
                    active_decode_blocks: Some(m.kv_active_blocks as u64),
                    kv_used_blocks: Some(m.kv_used_blocks as u64),
                    total_kv_blocks: Some(m.kv_total_blocks as u64),
                    max_num_batched_tokens: None,
                });
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
    });
}
