//! Block manager micro-benchmarks.
//!
//! * `pool/*`: allocation and free latency per block on the CPU path (the pool mutex, the
//!   FIFO free list, eviction of registered blocks, synchronous return on drop).
//! * `copy_h2h/*`: host → host whole-block copy bandwidth for 0.5, 1 and 2 MiB blocks (the
//!   block sizes of Llama-3-8B-like models with 4, 8 and 16 tokens per block).
//! * `copy_h2d` / `copy_d2h`: the same over PCIe, through pinned memory and the CUDA copy
//!   streams. Without a CUDA device these print "no device" and measure nothing.

#![expect(
    clippy::unwrap_used,
    reason = "a failing unwrap is a failed benchmark setup"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dynamo_block_manager::transfer::copy_blocks;
use dynamo_block_manager::{
    BlockLayout, BlockPool, DType, KvbmRequest, LayoutConfig, LayoutKind, NullEventSink,
    StorageRequest, Tier, TokenBlock, events::Registry,
};

/// Blocks per copy batch in the bandwidth benches: 16 blocks is one CUDA batch.
const COPY_BLOCKS: usize = 16;

fn host_pool(num_blocks: usize) -> BlockPool {
    let layout = BlockLayout::allocate(
        LayoutConfig::new(num_blocks, 2, 2, 16, 128, DType::Fp16),
        LayoutKind::FullyContiguous,
        StorageRequest::System,
    )
    .unwrap();
    BlockPool::new(
        Tier::Host,
        Arc::new(layout),
        Registry::new(0, Arc::new(NullEventSink)),
    )
}

fn bench_pool(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    for batch in [1usize, 16, 256] {
        let pool = host_pool(1024);
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::new("allocate_free", batch), &batch, |b, &n| {
            b.iter(|| drop(black_box(pool.allocate_blocks(n).unwrap())))
        });
    }
    // Baseline: the bare FIFO operations (pop front, push back) without locking or handles.
    let mut fifo: std::collections::VecDeque<usize> = (0..1024).collect();
    group.throughput(Throughput::Elements(1));
    group.bench_function("baseline_vecdeque_pop_push", |b| {
        b.iter(|| {
            let x = fifo.pop_front().unwrap();
            fifo.push_back(black_box(x));
        });
    });
    // Allocation that must evict registered (cached) blocks: fill the pool with registered
    // inactive blocks first, then every allocation evicts the LRU ones, and re-registering
    // puts them back.
    for batch in [1usize, 16] {
        let pool = host_pool(256);
        let tokens: Vec<u32> = (0..256 * 16).collect();
        let tbs = TokenBlock::split(&tokens, 16, &KvbmRequest::default());
        let mut blocks = pool.allocate_blocks(256).unwrap();
        for (blk, tb) in blocks.iter_mut().zip(&tbs) {
            blk.apply_token_block(tb.clone()).unwrap();
        }
        drop(pool.register_blocks(blocks).unwrap());
        let mut next = 0usize;
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(
            BenchmarkId::new("evict_register", batch),
            &batch,
            |b, &n| {
                b.iter(|| {
                    let mut blocks = pool.allocate_blocks(n).unwrap();
                    for blk in &mut blocks {
                        // Distinct single-block sequences so each registration is new.
                        let tb = TokenBlock::new(vec![next as u32; 16], 1337, None);
                        next += 1;
                        blk.apply_token_block(tb).unwrap();
                    }
                    drop(black_box(pool.register_blocks(blocks).unwrap()));
                });
            },
        );
    }
    group.finish();
}

/// Llama-3-8B-like blocks: 32 layers × K/V × `page` tokens × 1024 fp16 elements.
fn big_config(num_blocks: usize, page: usize) -> LayoutConfig {
    LayoutConfig::new(num_blocks, 32, 2, page, 1024, DType::Fp16)
}

fn bench_copy_h2h(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy_h2h");
    group.sample_size(20);
    for page in [4usize, 8, 16] {
        let cfg = big_config(COPY_BLOCKS, page);
        let src = BlockLayout::allocate(cfg, LayoutKind::FullyContiguous, StorageRequest::System)
            .unwrap();
        let dst = BlockLayout::allocate(cfg, LayoutKind::FullyContiguous, StorageRequest::System)
            .unwrap();
        let pairs: Vec<_> = (0..COPY_BLOCKS).map(|i| (i, COPY_BLOCKS - 1 - i)).collect();
        // Touch every page once so the first sample does not measure page faults.
        copy_blocks(&src, &dst, &pairs).unwrap();
        let bytes = cfg.block_bytes() * COPY_BLOCKS;
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(
            BenchmarkId::new("block_KiB", cfg.block_bytes() / 1024),
            &pairs,
            |b, pairs| b.iter(|| copy_blocks(&src, &dst, pairs).unwrap()),
        );
        // Baseline: one plain memcpy of the same bytes between two Vecs, in the same run.
        let from = vec![1u8; bytes];
        let mut to = vec![0u8; bytes];
        group.bench_with_input(
            BenchmarkId::new("baseline_memcpy_KiB", cfg.block_bytes() / 1024),
            &bytes,
            |b, _| b.iter(|| to.copy_from_slice(black_box(&from))),
        );
    }
    group.finish();
}

fn bench_copy_device(c: &mut Criterion) {
    if !dynamo_block_manager::cuda_available() {
        eprintln!("copy_h2d/copy_d2h: no device (CUDA driver or GPU not available), skipped");
        return;
    }
    for (name, host_to_device) in [("copy_h2d", true), ("copy_d2h", false)] {
        let mut group = c.benchmark_group(name);
        group.sample_size(20);
        for page in [4usize, 8, 16] {
            let cfg = big_config(COPY_BLOCKS, page);
            let host =
                BlockLayout::allocate(cfg, LayoutKind::FullyContiguous, StorageRequest::Pinned)
                    .unwrap();
            let dev =
                BlockLayout::allocate(cfg, LayoutKind::FullyContiguous, StorageRequest::Device(0))
                    .unwrap();
            let pairs: Vec<_> = (0..COPY_BLOCKS).map(|i| (i, i)).collect();
            let (src, dst) = if host_to_device {
                (&host, &dev)
            } else {
                (&dev, &host)
            };
            copy_blocks(src, dst, &pairs).unwrap();
            group.throughput(Throughput::Bytes((cfg.block_bytes() * COPY_BLOCKS) as u64));
            group.bench_with_input(
                BenchmarkId::new("block_KiB", cfg.block_bytes() / 1024),
                &pairs,
                |b, pairs| b.iter(|| copy_blocks(src, dst, pairs).unwrap()),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench_pool, bench_copy_h2h, bench_copy_device);
criterion_main!(benches);
