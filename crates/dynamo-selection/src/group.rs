//! One model + routing group: the radix-tree index that the group's KV-event listeners
//! feed and the scheduler that selections consult. It sits below both the service (which
//! creates groups and selects in them) and the listeners (which only apply events), so
//! neither has to import the other.

use std::sync::{Mutex, MutexGuard};

use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::scheduling::Scheduler;

/// One model + routing group: its index and scheduler.
pub struct Group {
    /// Tokens per block (every worker of the group has this block size).
    pub block_size: u32,
    /// The cache index, fed by the listeners.
    pub tree: SharedRadixTree,
    /// Worker loads and the selection policy (only the service selects).
    pub(crate) scheduler: Scheduler,
}

/// Lock `m`, taking the data over from a holder that panicked: the service's maps stay
/// consistent between statements, so a poisoned lock carries nothing half-done.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
