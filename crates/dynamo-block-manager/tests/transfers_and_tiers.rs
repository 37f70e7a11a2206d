//! Host transfers, offload/onboard and cross-tier events, without a GPU: the "device" tier
//! of these managers is backed by system memory, which exercises the same pool, registry
//! and copy logic the CUDA tier uses.

#![expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]

use std::sync::Arc;

use dynamo_block_manager::events::KvCacheEventData;
use dynamo_block_manager::transfer::copy_blocks;
use dynamo_block_manager::{
    BlockLayout, DType, Error, KvBlockManager, KvBlockManagerConfig, KvbmRequest, LayoutConfig,
    LayoutKind, RecordingEventSink, StorageRequest, Tier, TierConfig, TokenBlock,
};

const LAYERS: usize = 3;
const OUTER: usize = 2;
const PAGE: usize = 4;
const INNER: usize = 5;

fn layout(n: usize, kind: LayoutKind) -> BlockLayout {
    BlockLayout::allocate(
        LayoutConfig::new(n, LAYERS, OUTER, PAGE, INNER, DType::Fp16),
        kind,
        StorageRequest::System,
    )
    .unwrap()
}

/// Write a distinct byte pattern into every page of block `b`.
fn fill(l: &BlockLayout, b: usize, salt: u8) {
    for layer in 0..LAYERS {
        for o in 0..OUTER {
            let r = l.memory_region(b, layer, o).unwrap();
            let data: Vec<u8> = (0..r.len)
                .map(|i| (i as u8).wrapping_mul(7) ^ salt ^ (layer as u8 * 16 + o as u8))
                .collect();
            l.storages()[r.storage].write_host(r.offset, &data).unwrap();
        }
    }
}

/// Every page of block `b`, in (layer, outer) order.
fn read(l: &BlockLayout, b: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for layer in 0..LAYERS {
        for o in 0..OUTER {
            let r = l.memory_region(b, layer, o).unwrap();
            let mut page = vec![0u8; r.len];
            l.storages()[r.storage]
                .read_host(r.offset, &mut page)
                .unwrap();
            out.extend(page);
        }
    }
    out
}

#[test]
fn host_copies_between_every_layout_pair() {
    let kinds = [
        LayoutKind::FullyContiguous,
        LayoutKind::LayerSeparate {
            outer_contiguous: false,
        },
        LayoutKind::LayerSeparate {
            outer_contiguous: true,
        },
    ];
    for src_kind in kinds {
        for dst_kind in kinds {
            let src = layout(4, src_kind);
            let dst = layout(4, dst_kind);
            for b in 0..4 {
                fill(&src, b, b as u8 * 31 + 1);
            }
            copy_blocks(&src, &dst, &[(0, 3), (2, 1), (3, 0)]).unwrap();
            assert_eq!(read(&dst, 3), read(&src, 0), "{src_kind:?} -> {dst_kind:?}");
            assert_eq!(read(&dst, 1), read(&src, 2));
            assert_eq!(read(&dst, 0), read(&src, 3));
            assert!(
                read(&dst, 2).iter().all(|&x| x == 0),
                "untouched block stays zero"
            );
        }
    }
}

#[test]
fn whole_block_copy_moves_all_outer_pages() {
    // The upstream bug: a whole-block copy of L × P × I bytes leaves the V half behind.
    let src = layout(2, LayoutKind::FullyContiguous);
    let dst = layout(2, LayoutKind::FullyContiguous);
    fill(&src, 1, 9);
    copy_blocks(&src, &dst, &[(1, 0)]).unwrap();
    let last = dst.memory_region(0, LAYERS - 1, OUTER - 1).unwrap();
    let mut page = vec![0u8; last.len];
    dst.storages()[0].read_host(last.offset, &mut page).unwrap();
    assert!(page.iter().any(|&x| x != 0));
    assert_eq!(read(&dst, 0), read(&src, 1));
}

#[test]
fn copy_rejects_bad_requests() {
    let a = layout(2, LayoutKind::FullyContiguous);
    let other = BlockLayout::allocate(
        LayoutConfig::new(2, LAYERS, OUTER, PAGE, INNER, DType::Fp32),
        LayoutKind::FullyContiguous,
        StorageRequest::System,
    )
    .unwrap();
    assert!(matches!(
        copy_blocks(&a, &other, &[(0, 0)]),
        Err(Error::IncompatibleLayouts(_))
    ));
    assert!(matches!(
        copy_blocks(&a, &a, &[(1, 1)]),
        Err(Error::InvalidCopy(_))
    ));
    let b = layout(2, LayoutKind::FullyContiguous);
    assert!(matches!(
        copy_blocks(&a, &b, &[(0, 1), (1, 1)]),
        Err(Error::InvalidCopy(_))
    ));
    assert!(matches!(
        copy_blocks(&a, &b, &[(2, 0)]),
        Err(Error::IndexOutOfRange { .. })
    ));
    // Within one layout, distinct blocks copy fine.
    fill(&a, 0, 3);
    copy_blocks(&a, &a, &[(0, 1)]).unwrap();
    assert_eq!(read(&a, 1), read(&a, 0));
}

/// A manager whose device tier lives in system memory.
fn manager(device: usize, host: usize) -> (KvBlockManager, Arc<RecordingEventSink>) {
    let sink = Arc::new(RecordingEventSink::default());
    let tier = |n| TierConfig {
        num_blocks: n,
        storage: StorageRequest::System,
        layout: LayoutKind::FullyContiguous,
    };
    let config = KvBlockManagerConfig {
        worker_id: 7,
        num_layers: LAYERS,
        outer_dim: OUTER,
        page_size: PAGE,
        inner_dim: INNER,
        dtype: DType::Fp16,
        alignment: 1,
        device: Some(tier(device)),
        host: (host > 0).then(|| tier(host)),
    };
    (KvBlockManager::new(config, sink.clone()).unwrap(), sink)
}

fn prompt(blocks: usize) -> Vec<TokenBlock> {
    let tokens: Vec<u32> = (0..(blocks * PAGE) as u32).collect();
    TokenBlock::split(
        &tokens,
        PAGE,
        &KvbmRequest::new("r", None, Some("s".into())),
    )
}

#[test]
fn registering_device_blocks_offloads_them_to_host() {
    let (m, sink) = manager(4, 8);
    let tbs = prompt(3);
    let mut blocks = m.allocate_blocks(Tier::Device, 3).unwrap();
    let dev_layout = m.pool(Tier::Device).unwrap().layout().clone();
    for (i, (b, tb)) in blocks.iter_mut().zip(&tbs).enumerate() {
        fill(&dev_layout, b.block_index(), i as u8 + 1);
        b.apply_token_block(tb.clone()).unwrap();
    }
    let dev = m.register_device_blocks(blocks).unwrap();
    // One Stored per prefix; the host copies share the registration and publish nothing.
    let events = sink.take();
    assert_eq!(events.len(), 3);
    assert!(
        events
            .iter()
            .all(|e| matches!(e.event.data, KvCacheEventData::Stored { .. }))
    );
    let host = m.pool(Tier::Host).unwrap();
    let hashes: Vec<_> = tbs.iter().map(TokenBlock::sequence_hash).collect();
    let on_host = host.match_sequence_hashes(&hashes);
    assert_eq!(on_host.len(), 3);
    for (h, d) in on_host.iter().zip(&dev) {
        assert_eq!(
            read(host.layout(), h.block_index()),
            read(&dev_layout, d.block_index())
        );
    }
    // Registering the same prefix again does not offload twice.
    drop(on_host);
    let in_use = host.in_use_blocks();
    let mut again = m.allocate_blocks(Tier::Device, 1).unwrap();
    again[0].apply_token_block(tbs[0].clone()).unwrap();
    let again = m.register_device_blocks(again).unwrap();
    assert!(again[0].ptr_eq(&dev[0]));
    assert!(sink.take().is_empty());
    // Still three cached host blocks (inactive) and five free ones.
    assert_eq!(host.available_blocks(), 8);
    assert_eq!(host.in_use_blocks(), in_use);
    assert_eq!(in_use, 0);
}

#[test]
fn removed_is_published_only_when_the_last_tier_drops_a_prefix() {
    let (m, sink) = manager(2, 1);
    let tbs = prompt(2);
    let mut blocks = m.allocate_blocks(Tier::Device, 2).unwrap();
    for (b, tb) in blocks.iter_mut().zip(&tbs) {
        b.apply_token_block(tb.clone()).unwrap();
    }
    // The host pool has one block: only the first is offloaded.
    let dev = m.register_device_blocks(blocks).unwrap();
    assert_eq!(sink.take().len(), 2);
    let host = m.pool(Tier::Host).unwrap();
    assert!(host.contains(tbs[0].sequence_hash()));
    assert!(!host.contains(tbs[1].sequence_hash()));
    drop(dev);
    // Evict both device blocks: block 1 has no other copy (Removed), block 0 lives on the
    // host (no event).
    let _x = m.allocate_blocks(Tier::Device, 2).unwrap();
    let events: Vec<_> = sink.take().into_iter().map(|e| e.event.data).collect();
    assert_eq!(
        events,
        vec![KvCacheEventData::Removed {
            block_hashes: vec![tbs[1].sequence_hash()]
        }]
    );
    // Evicting the host copy removes the prefix.
    let _y = m.allocate_blocks(Tier::Host, 1).unwrap();
    let events: Vec<_> = sink.take().into_iter().map(|e| e.event.data).collect();
    assert_eq!(
        events,
        vec![KvCacheEventData::Removed {
            block_hashes: vec![tbs[0].sequence_hash()]
        }]
    );
}

#[test]
fn onboard_copies_host_blocks_to_the_device() {
    let (m, sink) = manager(4, 4);
    let tbs = prompt(2);
    let host = m.pool(Tier::Host).unwrap();
    let mut blocks = m.allocate_blocks(Tier::Host, 2).unwrap();
    for (i, (b, tb)) in blocks.iter_mut().zip(&tbs).enumerate() {
        fill(host.layout(), b.block_index(), 100 + i as u8);
        b.apply_token_block(tb.clone()).unwrap();
    }
    let on_host = m.register_host_blocks(blocks).unwrap();
    assert_eq!(sink.take().len(), 2);
    let on_dev = m.onboard_blocks(&on_host).unwrap();
    assert_eq!(on_dev.len(), 2);
    assert!(
        sink.take().is_empty(),
        "the device copy shares the registration"
    );
    let dev = m.pool(Tier::Device).unwrap();
    for (d, h) in on_dev.iter().zip(&on_host) {
        assert_eq!(d.tier(), Tier::Device);
        assert_eq!(d.sequence_hash(), h.sequence_hash());
        assert_eq!(
            read(dev.layout(), d.block_index()),
            read(host.layout(), h.block_index())
        );
    }
    // Onboarding again finds the blocks already on the device.
    let again = m.onboard_blocks(&on_host).unwrap();
    assert!(again[0].ptr_eq(&on_dev[0]) && again[1].ptr_eq(&on_dev[1]));
    assert_eq!(dev.in_use_blocks(), 2);
    // Device blocks cannot be onboarded, and a full device pool fails all-or-nothing.
    assert!(matches!(
        m.onboard_blocks(&on_dev),
        Err(Error::InvalidConfig(_))
    ));
    drop((on_dev, again));
    // Three allocations take the two free blocks and evict the leaf; the parent is still
    // cached on the device, so onboarding needs one block and none is left.
    let _fill = m.allocate_blocks(Tier::Device, 3).unwrap();
    let err = m.onboard_blocks(&on_host).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotEnoughBlocks {
                requested: 1,
                available: 0
            }
        ),
        "{err}"
    );
    assert_eq!(
        dev.available_blocks(),
        1,
        "the failed onboard released the matched prefix"
    );
}

#[test]
fn unconfigured_pools_and_bad_shapes_are_typed_errors() {
    let (m, _) = manager(1, 0);
    assert!(matches!(
        m.allocate_blocks(Tier::Host, 1),
        Err(Error::PoolNotConfigured(Tier::Host))
    ));
    assert_eq!(
        m.pool(Tier::Host).unwrap_err().to_string(),
        "Host allocator not available (the block manager was built without Host blocks)"
    );
    let sink = Arc::new(RecordingEventSink::default());
    let zero = KvBlockManagerConfig::standard(0, 0, 2, 4, 8, DType::Fp16, None, None, 0);
    assert!(matches!(
        KvBlockManager::new(zero, sink.clone()),
        Err(Error::ZeroDimension("num_layers"))
    ));
    let none = KvBlockManagerConfig::standard(0, 1, 2, 4, 8, DType::Fp16, None, None, 0);
    let m = KvBlockManager::new(none, sink).unwrap();
    assert_eq!(m.block_size(), 4);
    assert!(matches!(
        m.allocate_blocks(Tier::Device, 1),
        Err(Error::PoolNotConfigured(Tier::Device))
    ));
}

#[test]
fn device_pool_without_cuda_is_a_typed_error() {
    if dynamo_block_manager::cuda_available() {
        eprintln!("CUDA is available; the no-CUDA error path is not exercised here");
        return;
    }
    let sink = Arc::new(RecordingEventSink::default());
    let config = KvBlockManagerConfig::standard(0, 2, 2, 4, 8, DType::Fp16, Some(2), Some(2), 0);
    let err = KvBlockManager::new(config, sink).unwrap_err();
    assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
    assert_eq!(dynamo_block_manager::cuda_device_count(), 0);
}
