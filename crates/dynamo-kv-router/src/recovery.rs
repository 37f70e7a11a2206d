//! Detecting lost KV events and repairing the index.
//!
//! Every publisher numbers its events per `(worker, dp_rank)`, starting at 0 and increasing
//! by one. A router keeps, per rank, the id of the last event it applied
//! ([`EventCursors`]): a larger jump means events were lost (the event plane is
//! best-effort), an older id is a duplicate. On a gap the router asks the worker's
//! [`LocalKvIndexer`] for what it missed: the buffered events themselves when the gap is
//! still inside the worker's replay buffer, otherwise a dump of the worker's whole index
//! (which replaces the rank's state in the router).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::indexer::RadixTree;
use crate::protocols::{KvCacheEvent, RouterEvent, WorkerWithDpRank};

/// Events a worker keeps for replay (the reference's `WORKER_KV_INDEXER_BUFFER_SIZE`):
/// enough to bridge a publisher reconnect of a few seconds at high event rates, small
/// enough (a few hundred KB) to keep per rank.
pub const REPLAY_BUFFER_EVENTS: usize = 1024;

/// What to do with an incoming event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorDecision {
    /// The next expected event: apply it.
    Apply,
    /// Already applied (or older): ignore it.
    Duplicate,
    /// Events `expected..got` are missing: recover before applying this one.
    Gap {
        /// First missing event id.
        expected: u64,
        /// The id that arrived.
        got: u64,
    },
}

/// The last applied event id per worker rank.
#[derive(Debug, Default, Clone)]
pub struct EventCursors {
    last: FxHashMap<WorkerWithDpRank, u64>,
}

impl EventCursors {
    /// Classify `event_id` from `worker`. [`CursorDecision::Apply`] advances the cursor;
    /// the other decisions leave it unchanged. A rank seen for the first time must start at
    /// id 0, otherwise its earlier events are a gap.
    pub fn check(&mut self, worker: WorkerWithDpRank, event_id: u64) -> CursorDecision {
        let expected = self.last.get(&worker).map_or(0, |&l| l + 1);
        if event_id == expected {
            self.last.insert(worker, event_id);
            CursorDecision::Apply
        } else if event_id < expected {
            CursorDecision::Duplicate
        } else {
            CursorDecision::Gap {
                expected,
                got: event_id,
            }
        }
    }

    /// Set the cursor after a recovery: `last_event_id` has been applied.
    pub fn set(&mut self, worker: WorkerWithDpRank, last_event_id: u64) {
        self.last.insert(worker, last_event_id);
    }

    /// The last applied id of a rank.
    pub fn last(&self, worker: WorkerWithDpRank) -> Option<u64> {
        self.last.get(&worker).copied()
    }

    /// Forget every rank of a worker.
    pub fn remove_worker(&mut self, worker_id: u64) {
        self.last.retain(|w, _| w.worker_id != worker_id);
    }
}

/// A router's request for events it missed (`start..=end` inclusive; open ends mean
/// "from the beginning" / "up to the latest").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkerKvQueryRequest {
    /// The worker asked.
    pub worker_id: u64,
    /// The data-parallel rank asked.
    #[serde(default)]
    pub dp_rank: u32,
    /// First event id wanted.
    pub start_event_id: Option<u64>,
    /// Last event id wanted.
    pub end_event_id: Option<u64>,
}

/// A worker's answer to a [`WorkerKvQueryRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerKvQueryResponse {
    /// The requested events, with their original ids, oldest first.
    Events {
        /// The events.
        events: Vec<KvCacheEvent>,
        /// The worker's latest event id.
        last_event_id: Option<u64>,
    },
    /// The requested range is no longer buffered: the worker's whole index instead. The
    /// router replaces the rank's state with it and continues after `last_event_id`.
    TreeDump {
        /// One `stored` event per block, parents first (synthetic ids).
        events: Vec<KvCacheEvent>,
        /// The worker's latest event id.
        last_event_id: Option<u64>,
    },
}

/// The worker-side index of one rank's own cache plus a replay buffer of its latest events.
#[derive(Debug)]
pub struct LocalKvIndexer {
    worker: WorkerWithDpRank,
    tree: RadixTree,
    buffer: VecDeque<KvCacheEvent>,
    capacity: usize,
}

impl LocalKvIndexer {
    /// An empty indexer for `worker` keeping the last `capacity` events.
    pub fn new(worker: WorkerWithDpRank, capacity: usize) -> Self {
        Self {
            worker,
            tree: RadixTree::new(None),
            buffer: VecDeque::with_capacity(capacity.min(REPLAY_BUFFER_EVENTS)),
            capacity: capacity.max(1),
        }
    }

    /// Record an event the worker publishes. Index errors (unknown parent, unknown block)
    /// are returned, but the event is buffered regardless: routers must see the same
    /// stream the worker published.
    ///
    /// # Errors
    /// The index's apply error.
    pub fn record(&mut self, event: KvCacheEvent) -> Result<()> {
        let applied = self.tree.apply_event(self.worker.worker_id, &event);
        if self.buffer.len() == self.capacity {
            self.buffer.pop_front();
        }
        self.buffer.push_back(event);
        applied
    }

    /// The latest recorded event id.
    pub fn last_event_id(&self) -> Option<u64> {
        self.buffer.back().map(|e| e.event_id)
    }

    /// Answer a router's query.
    pub fn query(&self, req: &WorkerKvQueryRequest) -> WorkerKvQueryResponse {
        let last_event_id = self.last_event_id();
        let oldest = self.buffer.front().map(|e| e.event_id);
        let start = req.start_event_id.unwrap_or(0);
        let end = req.end_event_id.unwrap_or(u64::MAX);
        let buffered = match oldest {
            Some(oldest) => start >= oldest,
            // Nothing published yet: an empty event list is the complete answer.
            None => true,
        };
        if buffered {
            let events = self
                .buffer
                .iter()
                .filter(|e| e.event_id >= start && e.event_id <= end)
                .cloned()
                .collect();
            return WorkerKvQueryResponse::Events {
                events,
                last_event_id,
            };
        }
        let events = self
            .tree
            .dump_events()
            .into_iter()
            .filter(|e: &RouterEvent| e.event.dp_rank == self.worker.dp_rank)
            .map(|e| e.event)
            .collect();
        WorkerKvQueryResponse::TreeDump {
            events,
            last_event_id,
        }
    }

    /// The worker's own index (for tests and local queries).
    pub fn tree(&self) -> &RadixTree {
        &self.tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::{KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData};

    fn stored(id: u64, parent: Option<u64>, block: u64) -> KvCacheEvent {
        KvCacheEvent {
            event_id: id,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(crate::protocols::ExternalSequenceBlockHash),
                start_position: None,
                blocks: vec![KvCacheStoredBlockData::new(block, block + 1000)],
            }),
            dp_rank: 0,
        }
    }

    #[test]
    fn cursors_detect_gaps_and_duplicates() {
        let w = WorkerWithDpRank::new(1, 0);
        let mut c = EventCursors::default();
        assert_eq!(c.check(w, 0), CursorDecision::Apply);
        assert_eq!(c.check(w, 1), CursorDecision::Apply);
        assert_eq!(c.check(w, 1), CursorDecision::Duplicate);
        assert_eq!(
            c.check(w, 4),
            CursorDecision::Gap {
                expected: 2,
                got: 4
            }
        );
        assert_eq!(c.last(w), Some(1));
        c.set(w, 4);
        assert_eq!(c.check(w, 5), CursorDecision::Apply);
        // A rank first seen mid-stream is a gap from 0.
        let late = WorkerWithDpRank::new(2, 0);
        assert_eq!(
            c.check(late, 7),
            CursorDecision::Gap {
                expected: 0,
                got: 7
            }
        );
        c.remove_worker(1);
        assert_eq!(c.last(w), None);
    }

    #[test]
    fn replay_from_buffer_then_from_dump() {
        let w = WorkerWithDpRank::new(1, 0);
        let mut local = LocalKvIndexer::new(w, 3);
        local.record(stored(0, None, 1)).expect("root");
        for i in 1..5 {
            local.record(stored(i, Some(i), i + 1)).expect("chain");
        }
        // Buffer holds ids 2..=4.
        let buffered = local.query(&WorkerKvQueryRequest {
            worker_id: 1,
            start_event_id: Some(3),
            ..Default::default()
        });
        let WorkerKvQueryResponse::Events {
            events,
            last_event_id,
        } = buffered
        else {
            panic!("expected buffered events");
        };
        assert_eq!(
            events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(last_event_id, Some(4));

        // Id 1 fell out of the buffer: the whole index comes back, and replaying it into an
        // empty router tree reproduces the worker's scores.
        let dump = local.query(&WorkerKvQueryRequest {
            worker_id: 1,
            start_event_id: Some(1),
            ..Default::default()
        });
        let WorkerKvQueryResponse::TreeDump { events, .. } = dump else {
            panic!("expected a dump");
        };
        let mut router = RadixTree::new(None);
        for e in &events {
            router.apply_event(1, e).expect("dump replays");
        }
        let query: Vec<_> = (1..=5)
            .map(|b| crate::hashing::LocalBlockHash(b + 1000))
            .collect();
        assert_eq!(router.find_matches(&query, false).get(w), Some(5));
        assert_eq!(local.tree().find_matches(&query, false).get(w), Some(5));
    }
}
