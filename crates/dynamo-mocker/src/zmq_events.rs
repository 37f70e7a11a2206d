//! Publishing the mocker's KV events on ZMQ like a vLLM engine (`zmq_kv_events_port`,
//! `zmq_replay_port`).
//!
//! Each step's events become one message `[topic "", seq (8-byte big-endian, from 0),
//! payload]` on a PUB socket, where `payload` is msgpack `[timestamp, [event, ...],
//! dp_rank]` and each event a map: `{"type": "BlockStored", "block_hashes", "parent_block_hash",
//! "token_ids", "block_size", "medium": "GPU"}`, `{"type": "BlockRemoved", "block_hashes",
//! "medium": "GPU"}` or `{"type": "AllBlocksCleared"}` — what
//! `dynamo_kv_router::engine_events` (the KV relay, the selection services) and the
//! reference's consumers decode. Block hashes are the mocker's sequence hashes (the
//! consumer recomputes content hashes from `token_ids`). With a replay port, the last
//! [`dynamo_llm::kv_routing::zmq_pub::DEFAULT_REPLAY_BUFFER`] messages are served on a ROUTER
//! socket (vLLM's replay protocol, see `kv_routing::zmq_pub`).
//!
//! Image (multimodal) block information is not carried: consumers hash the tokens alone.

use std::time::{SystemTime, UNIX_EPOCH};

use dynamo_kv_router::protocols::KvCacheEventData;
use dynamo_llm::kv_routing::zmq_pub::{DEFAULT_REPLAY_BUFFER, EnginePublisher};
use serde::Serialize;

use crate::error::{Error, Result};

#[derive(Serialize)]
#[serde(tag = "type")]
enum WireEvent<'a> {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: &'a [u32],
        block_size: usize,
        medium: &'static str,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: &'static str,
    },
    AllBlocksCleared,
}

/// The msgpack payload of one step's events (`tokens[i]`: the token ids of `events[i]`'s
/// stored blocks). `None` when there is nothing to send.
///
/// # Errors
/// A stored event without the tokens of all its blocks.
pub fn encode_payload(
    events: &[KvCacheEventData],
    tokens: &[Vec<u32>],
    block_size: usize,
    dp_rank: u32,
) -> Result<Option<Vec<u8>>> {
    let mut wire = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        wire.push(match e {
            KvCacheEventData::Stored(s) => {
                let token_ids = tokens.get(i).map_or(&[][..], Vec::as_slice);
                if token_ids.len() != s.blocks.len() * block_size {
                    return Err(Error::Runtime(format!(
                        "stored event with {} blocks of {block_size} has {} token ids",
                        s.blocks.len(),
                        token_ids.len()
                    )));
                }
                WireEvent::BlockStored {
                    block_hashes: s.blocks.iter().map(|b| b.block_hash.0).collect(),
                    parent_block_hash: s.parent_hash.map(|p| p.0),
                    token_ids,
                    block_size,
                    medium: "GPU",
                }
            }
            KvCacheEventData::Removed(r) => WireEvent::BlockRemoved {
                block_hashes: r.block_hashes.iter().map(|h| h.0).collect(),
                medium: "GPU",
            },
            KvCacheEventData::Cleared => WireEvent::AllBlocksCleared,
        });
    }
    if wire.is_empty() {
        return Ok(None);
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    rmp_serde::to_vec_named(&(timestamp, wire, dp_rank))
        .map(Some)
        .map_err(|e| Error::Runtime(format!("encoding KV events: {e}")))
}

/// One engine rank's ZMQ KV-event output.
pub struct ZmqKvEventSink {
    publisher: EnginePublisher,
    block_size: usize,
    dp_rank: u32,
}

impl ZmqKvEventSink {
    /// Bind the PUB socket on `0.0.0.0:port` (as engines bind `tcp://*:port`) and, with
    /// `replay_port`, the replay socket. Must be called inside the tokio runtime.
    ///
    /// # Errors
    /// [`Error::Runtime`] naming the port that cannot be bound.
    pub fn bind(
        port: u16,
        replay_port: Option<u16>,
        block_size: usize,
        dp_rank: u32,
    ) -> Result<Self> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Runtime("ZMQ KV events need a tokio runtime".to_owned()))?;
        let publisher = EnginePublisher::bind(
            &handle,
            "0.0.0.0",
            port,
            replay_port,
            DEFAULT_REPLAY_BUFFER,
            b"",
        )
        .map_err(|e| Error::Runtime(e.to_string()))?;
        tracing::info!(
            endpoint = %publisher.local_addr(),
            replay = ?publisher.replay_addr(),
            "mocker publishes KV events on ZMQ"
        );
        Ok(Self {
            publisher,
            block_size,
            dp_rank,
        })
    }

    /// The PUB socket's port.
    pub fn port(&self) -> u16 {
        self.publisher.local_addr().port()
    }

    /// The replay socket's port, when there is one.
    pub fn replay_port(&self) -> Option<u16> {
        self.publisher.replay_addr().map(|a| a.port())
    }

    /// Publish one step's events (`tokens` as in [`encode_payload`]).
    pub fn publish(&self, events: &[KvCacheEventData], tokens: &[Vec<u32>]) {
        match encode_payload(events, tokens, self.block_size, self.dp_rank) {
            Ok(Some(payload)) => {
                self.publisher.publish(payload);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "KV events not published on ZMQ"),
        }
    }
}

#[cfg(test)]
mod tests {
    use dynamo_kv_router::engine_events::{EngineEvent, decode_engine_batch};
    use dynamo_kv_router::hashing::LocalBlockHash;
    use dynamo_kv_router::protocols::{
        ExternalSequenceBlockHash, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData,
    };

    use super::*;

    #[test]
    fn payload_decodes_as_engine_events() {
        let stored = KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: Some(ExternalSequenceBlockHash(7)),
            start_position: None,
            blocks: vec![
                KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(u64::MAX - 1),
                    tokens_hash: LocalBlockHash(1),
                    mm_extra_info: None,
                },
                KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(9),
                    tokens_hash: LocalBlockHash(2),
                    mm_extra_info: None,
                },
            ],
        });
        let removed = KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: vec![ExternalSequenceBlockHash(9)],
        });
        let payload = encode_payload(
            &[stored, removed, KvCacheEventData::Cleared],
            &[vec![1, 2, 3, 4], vec![], vec![]],
            2,
            3,
        )
        .unwrap()
        .unwrap();
        let batch = decode_engine_batch(&payload).unwrap();
        assert_eq!(batch.dp_rank, Some(3));
        assert_eq!(
            batch.events,
            vec![
                EngineEvent::BlockStored {
                    block_hashes: vec![-2, 9],
                    parent_block_hash: Some(7),
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_name: None,
                    tier: dynamo_kv_router::protocols::StorageTier::Device,
                },
                EngineEvent::BlockRemoved {
                    block_hashes: vec![9],
                    tier: dynamo_kv_router::protocols::StorageTier::Device,
                },
                EngineEvent::AllBlocksCleared,
            ]
        );
        assert!(encode_payload(&[], &[], 2, 0).unwrap().is_none());
        // Stores need their tokens.
        let bad = KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: None,
            start_position: None,
            blocks: vec![KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(1),
                tokens_hash: LocalBlockHash(1),
                mm_extra_info: None,
            }],
        });
        assert!(encode_payload(&[bad], &[], 2, 0).is_err());
    }
}
