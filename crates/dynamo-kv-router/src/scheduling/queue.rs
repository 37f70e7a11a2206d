//! The router queue: when every eligible worker is saturated, requests wait here and are
//! dispatched in policy order as capacity frees up (selection happens at dispatch time).
//!
//! Order: higher `strict_priority` first; then the policy score, higher first; then arrival
//! order. Scores:
//! * FCFS: `max(0, priority_jump) - arrival_offset_secs` (tail time-to-first-token);
//! * LCFS: `max(0, priority_jump) + arrival_offset_secs`;
//! * WSPT: `(1 + max(0, priority_jump)) / max(1, isl_tokens - best_cached_tokens)` (Smith's
//!   rule: least uncached work first, which minimises mean time-to-first-token).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::config::QueuePolicy;
use super::selector::UNKNOWN_MAX_BATCHED_TOKENS;

/// What the queue needs to know about a waiting request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueEntryInfo {
    /// Priority tier; a higher tier always goes first.
    pub strict_priority: u32,
    /// Soft boost within a tier (negative values count as 0).
    pub priority_jump: f64,
    /// Arrival time relative to the queue's epoch, in seconds.
    pub arrival_offset_secs: f64,
    /// Prompt length in tokens.
    pub isl_tokens: u64,
    /// Prompt tokens already cached on the best worker.
    pub best_cached_tokens: u64,
}

/// The policy score of a request (higher is dispatched first).
pub fn policy_score(policy: QueuePolicy, info: &QueueEntryInfo) -> f64 {
    let jump = info.priority_jump.max(0.0);
    match policy {
        QueuePolicy::Fcfs => jump - info.arrival_offset_secs,
        QueuePolicy::Lcfs => jump + info.arrival_offset_secs,
        QueuePolicy::Wspt => {
            let uncached = info
                .isl_tokens
                .saturating_sub(info.best_cached_tokens)
                .max(1);
            (1.0 + jump) / uncached as f64
        }
    }
}

/// Whether a new request must wait: every worker's prefill load is above
/// `threshold × max_num_batched_tokens`. `loads` yields `(active_prefill_tokens,
/// max_num_batched_tokens)` per eligible worker. No threshold or no worker: never queue.
pub fn should_queue(
    threshold: Option<f64>,
    loads: impl IntoIterator<Item = (u64, Option<u64>)>,
) -> bool {
    let Some(threshold) = threshold else {
        return false;
    };
    let mut any = false;
    for (active, max) in loads {
        any = true;
        let max = max.unwrap_or(UNKNOWN_MAX_BATCHED_TOKENS);
        if active as f64 <= threshold * max as f64 {
            return false;
        }
    }
    any
}

struct Entry<T> {
    strict_priority: u32,
    score: f64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    // Max-heap order: the greatest entry is dispatched first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.strict_priority
            .cmp(&other.strict_priority)
            .then_with(|| self.score.total_cmp(&other.score))
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A priority queue of waiting requests under one policy.
pub struct RouterQueue<T> {
    policy: QueuePolicy,
    heap: BinaryHeap<Entry<T>>,
    next_seq: u64,
}

impl<T> RouterQueue<T> {
    /// An empty queue.
    pub fn new(policy: QueuePolicy) -> Self {
        Self {
            policy,
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    /// Add a waiting request.
    pub fn push(&mut self, item: T, info: &QueueEntryInfo) {
        let entry = Entry {
            strict_priority: info.strict_priority,
            score: policy_score(self.policy, info),
            seq: self.next_seq,
            item,
        };
        self.next_seq += 1;
        self.heap.push(entry);
    }

    /// Remove and return the request to dispatch next.
    pub fn pop(&mut self) -> Option<T> {
        self.heap.pop().map(|e| e.item)
    }

    /// Number of waiting requests.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(strict: u32, jump: f64, arrival: f64, isl: u64, cached: u64) -> QueueEntryInfo {
        QueueEntryInfo {
            strict_priority: strict,
            priority_jump: jump,
            arrival_offset_secs: arrival,
            isl_tokens: isl,
            best_cached_tokens: cached,
        }
    }

    #[test]
    fn wspt_score_matches_reference_example() {
        // ISL 1024 with 60 cached blocks of 16 tokens: 64 uncached tokens.
        let s = policy_score(QueuePolicy::Wspt, &info(0, 0.0, 0.0, 1024, 960));
        assert_eq!(s, 1.0 / 64.0);
        // Fully cached prompts still count one token of work.
        assert_eq!(
            policy_score(QueuePolicy::Wspt, &info(0, -3.0, 0.0, 10, 10)),
            1.0
        );
    }

    #[test]
    fn fcfs_lcfs_and_strict_priority_order() {
        let mut q = RouterQueue::new(QueuePolicy::Fcfs);
        q.push("late", &info(0, 0.0, 2.0, 0, 0));
        q.push("early", &info(0, 0.0, 1.0, 0, 0));
        q.push("boosted", &info(0, 5.0, 3.0, 0, 0));
        q.push("tier1", &info(1, 0.0, 9.0, 0, 0));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["tier1", "boosted", "early", "late"]);

        let mut q = RouterQueue::new(QueuePolicy::Lcfs);
        q.push("a", &info(0, 0.0, 1.0, 0, 0));
        q.push("b", &info(0, 0.0, 2.0, 0, 0));
        assert_eq!(q.pop(), Some("b"));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn equal_scores_keep_arrival_order() {
        let mut q = RouterQueue::new(QueuePolicy::Wspt);
        for i in 0..5 {
            q.push(i, &info(0, 0.0, 0.0, 100, 0));
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn queue_only_when_every_worker_is_saturated() {
        assert!(!should_queue(None, [(u64::MAX, Some(1))]));
        assert!(!should_queue(Some(1.0), []));
        assert!(should_queue(
            Some(1.0),
            [(101, Some(100)), (200, Some(100))]
        ));
        assert!(!should_queue(
            Some(1.0),
            [(101, Some(100)), (100, Some(100))]
        ));
        // Unknown capacity is effectively never saturated.
        assert!(!should_queue(Some(1.0), [(101, Some(100)), (5_000, None)]));
    }
}
