//! CUDA paths: pinned and device storage, host↔device and device↔device copies, offload
//! and onboard through a real device pool. Every test returns early, printing why, when no
//! CUDA device is usable (the only condition under which they do not run).

#![cfg(feature = "cuda")]
#![expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]

use std::sync::Arc;

use dynamo_block_manager::transfer::copy_blocks;
use dynamo_block_manager::{
    BlockLayout, DType, Error, KvBlockManager, KvBlockManagerConfig, KvbmRequest, LayoutConfig,
    LayoutKind, MemoryKind, RecordingEventSink, Storage, StorageRequest, Tier, TokenBlock,
    cuda_available,
};

fn no_device() -> bool {
    if cuda_available() {
        return false;
    }
    eprintln!("skipped: no CUDA device (driver library missing, stub library or no GPU)");
    true
}

const L: usize = 3;
const O: usize = 2;
const P: usize = 4;
const I: usize = 5;

fn config(n: usize) -> LayoutConfig {
    LayoutConfig::new(n, L, O, P, I, DType::Fp32)
}

fn fill(l: &BlockLayout, b: usize, salt: u8) {
    let r = l.block_region(b).unwrap();
    let data: Vec<u8> = (0..r.len)
        .map(|i| (i as u8).wrapping_mul(13) ^ salt)
        .collect();
    l.storages()[0].write_host(r.offset, &data).unwrap();
}

fn read(l: &BlockLayout, b: usize) -> Vec<u8> {
    let r = l.block_region(b).unwrap();
    let mut out = vec![0u8; r.len];
    l.storages()[0].read_host(r.offset, &mut out).unwrap();
    out
}

#[test]
fn pinned_and_device_storage() {
    if no_device() {
        return;
    }
    let pinned = Storage::allocate(StorageRequest::PinnedOrSystem, 1 << 20).unwrap();
    assert_eq!(pinned.kind(), MemoryKind::Pinned);
    pinned.write_host(0, &[1, 2, 3]).unwrap();
    let dev = Storage::device(1 << 20, 0).unwrap();
    assert_eq!(dev.kind(), MemoryKind::Device(0));
    assert!(
        dev.write_host(0, &[1]).is_err(),
        "device memory is not host-accessible"
    );
    assert!(matches!(
        Storage::device(1 << 20, 4096),
        Err(Error::CudaUnavailable(_))
    ));
}

#[test]
fn host_device_host_round_trip_every_byte() {
    if no_device() {
        return;
    }
    let host = BlockLayout::allocate(
        config(4),
        LayoutKind::FullyContiguous,
        StorageRequest::Pinned,
    )
    .unwrap();
    let dev = BlockLayout::allocate(
        config(4),
        LayoutKind::FullyContiguous,
        StorageRequest::Device(0),
    )
    .unwrap();
    // A layer-separate device layout forces the per-page path.
    let dev_pages = BlockLayout::allocate(
        config(4),
        LayoutKind::LayerSeparate {
            outer_contiguous: true,
        },
        StorageRequest::Device(0),
    )
    .unwrap();
    let back = BlockLayout::allocate(
        config(4),
        LayoutKind::FullyContiguous,
        StorageRequest::System,
    )
    .unwrap();
    for b in 0..4 {
        fill(&host, b, 17 * b as u8 + 1);
    }
    copy_blocks(&host, &dev, &[(0, 3), (1, 2), (2, 1), (3, 0)]).unwrap(); // H2D
    copy_blocks(&dev, &dev_pages, &[(0, 0), (1, 1), (2, 2), (3, 3)]).unwrap(); // D2D, pages
    copy_blocks(&dev, &dev, &[(3, 1)]).unwrap(); // D2D within one layout
    copy_blocks(&dev_pages, &back, &[(0, 0), (1, 1), (2, 2), (3, 3)]).unwrap(); // D2H, pages
    assert_eq!(read(&back, 0), read(&host, 3));
    assert_eq!(read(&back, 1), read(&host, 2));
    assert_eq!(read(&back, 2), read(&host, 1));
    assert_eq!(read(&back, 3), read(&host, 0));
    let final_back = BlockLayout::allocate(
        config(4),
        LayoutKind::FullyContiguous,
        StorageRequest::Pinned,
    )
    .unwrap();
    copy_blocks(&dev, &final_back, &[(1, 0)]).unwrap();
    assert_eq!(read(&final_back, 0), read(&host, 0));
}

fn prompt(blocks: usize) -> Vec<TokenBlock> {
    let tokens: Vec<u32> = (0..(blocks * P) as u32).collect();
    TokenBlock::split(&tokens, P, &KvbmRequest::default())
}

#[test]
fn offload_and_onboard_through_a_real_device_pool() {
    if no_device() {
        return;
    }
    let sink = Arc::new(RecordingEventSink::default());
    let cfg = KvBlockManagerConfig::standard(1, L, O, P, I, DType::Fp32, Some(8), Some(8), 0);
    let m = KvBlockManager::new(cfg, sink.clone()).unwrap();
    let host = m.pool(Tier::Host).unwrap().clone();
    let dev = m.pool(Tier::Device).unwrap().clone();
    assert_eq!(host.layout().memory_kind(), MemoryKind::Pinned);
    assert_eq!(dev.layout().memory_kind(), MemoryKind::Device(0));

    // Offload: write device blocks from a scratch buffer, register, find copies on the host.
    let scratch = BlockLayout::allocate(
        config(2),
        LayoutKind::FullyContiguous,
        StorageRequest::Pinned,
    )
    .unwrap();
    fill(&scratch, 0, 5);
    fill(&scratch, 1, 6);
    let tbs = prompt(2);
    let mut blocks = m.allocate_blocks(Tier::Device, 2).unwrap();
    let pairs: Vec<_> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (i, b.block_index()))
        .collect();
    copy_blocks(&scratch, dev.layout(), &pairs).unwrap();
    for (b, tb) in blocks.iter_mut().zip(&tbs) {
        b.apply_token_block(tb.clone()).unwrap();
    }
    let on_dev = m.register_device_blocks(blocks).unwrap();
    assert_eq!(sink.take().len(), 2);
    let hashes: Vec<_> = tbs.iter().map(TokenBlock::sequence_hash).collect();
    let on_host = host.match_sequence_hashes(&hashes);
    assert_eq!(on_host.len(), 2);
    for (i, h) in on_host.iter().enumerate() {
        assert_eq!(read(host.layout(), h.block_index()), read(&scratch, i));
    }

    // Onboard: drop and evict the device copies, then bring them back from the host.
    drop(on_dev);
    let _evict = m.allocate_blocks(Tier::Device, 8).unwrap();
    assert!(
        sink.take().is_empty(),
        "the host copies keep the prefixes cached"
    );
    drop(_evict);
    let onboarded = m.onboard_blocks(&on_host).unwrap();
    let check = BlockLayout::allocate(
        config(2),
        LayoutKind::FullyContiguous,
        StorageRequest::Pinned,
    )
    .unwrap();
    let pairs: Vec<_> = onboarded
        .iter()
        .enumerate()
        .map(|(i, b)| (b.block_index(), i))
        .collect();
    copy_blocks(dev.layout(), &check, &pairs).unwrap();
    assert_eq!(read(&check, 0), read(&scratch, 0));
    assert_eq!(read(&check, 1), read(&scratch, 1));
}
