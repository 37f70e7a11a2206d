//! The KV block manager's events on the event plane.
//!
//! `dynamo-block-manager` reports prefixes through its own [`EventSink`] trait and stays
//! independent of the runtime; this adapter numbers its events through a raw
//! [`KvEventPublisher`] and publishes them on the component's `kv-events` topic, where
//! [`super::KvRouter`] and the indexers consume them like any engine's.

use std::sync::Arc;

use dynamo_block_manager::events::{EventSink, KvCacheEventData as BlockEventData, RouterEvent};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData,
};

use super::KvEventPublisher;

/// An [`EventSink`] for `KvBlockManager::new` that publishes through `publisher`.
///
/// The events go out under the publisher's worker rank (its event ids restart from the
/// publisher's numbering, not the manager's), so create the publisher with the manager's
/// `worker_id`. Publishing never blocks: the block manager calls the sink while holding its
/// registry lock.
pub struct BlockManagerEventSink {
    publisher: Arc<KvEventPublisher>,
}

impl BlockManagerEventSink {
    /// A sink over a publisher made with [`KvEventPublisher::new_raw`].
    pub fn new(publisher: Arc<KvEventPublisher>) -> Arc<Self> {
        Arc::new(Self { publisher })
    }

    /// The publisher events go through.
    pub fn publisher(&self) -> &Arc<KvEventPublisher> {
        &self.publisher
    }
}

/// The router's form of a block-manager event (the two share the wire shape; the router's
/// Stored also carries an optional start position and multimodal data, absent here).
/// `None` for a kind the router does not know.
pub(crate) fn to_router_data(data: BlockEventData) -> Option<KvCacheEventData> {
    Some(match data {
        BlockEventData::Stored {
            parent_hash,
            blocks,
        } => KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent_hash.map(|h| ExternalSequenceBlockHash(h.0)),
            start_position: None,
            blocks: blocks
                .into_iter()
                .map(|b| KvCacheStoredBlockData::new(b.block_hash.0, b.tokens_hash.0))
                .collect(),
        }),
        BlockEventData::Removed { block_hashes } => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: block_hashes
                .into_iter()
                .map(|h| ExternalSequenceBlockHash(h.0))
                .collect(),
        }),
        BlockEventData::Cleared => KvCacheEventData::Cleared,
        // The block manager's enum is non-exhaustive: a future kind is skipped (publishing
        // it as anything else, Cleared above all, would corrupt the routers' index).
        _ => return None,
    })
}

impl EventSink for BlockManagerEventSink {
    fn publish(&self, event: RouterEvent) {
        if event.worker_id != self.publisher.worker().worker_id {
            tracing::debug!(
                manager = event.worker_id,
                publisher = self.publisher.worker().worker_id,
                "block-manager event published under the publisher's worker id"
            );
        }
        let Some(data) = to_router_data(event.event.data) else {
            tracing::warn!("block-manager KV event of an unknown kind not published");
            return;
        };
        if let Err(e) = self.publisher.publish_raw(vec![data]) {
            tracing::warn!(error = %e, "block-manager KV event not published");
        }
    }
}
