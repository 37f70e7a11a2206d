//! Block-hashing throughput: ns per block for common block sizes, plain and chained.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kv_router::hashing::{
    BlockHashOptions, compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use std::hint::black_box;

/// Prompt length used for every case: long enough that per-call overhead is negligible and
/// a whole number of blocks for every block size measured.
const PROMPT_TOKENS: usize = 65_536;

fn bench_local_hashes(c: &mut Criterion) {
    // Deterministic pseudo-random tokens in a realistic vocabulary range.
    let tokens: Vec<u32> = (0..PROMPT_TOKENS as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 152_064)
        .collect();
    let mut group = c.benchmark_group("local_block_hash");
    for bs in [16usize, 32, 64] {
        group.throughput(Throughput::Elements((PROMPT_TOKENS / bs) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bs), &bs, |b, &bs| {
            b.iter(|| {
                compute_block_hash_for_seq(black_box(&tokens), bs, &BlockHashOptions::default())
            })
        });
    }
    group.finish();

    // Baseline for the ratio: plain xxh3 over each block's bytes, no API around it.
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut group = c.benchmark_group("raw_xxh3_baseline");
    for bs in [16usize, 32, 64] {
        group.throughput(Throughput::Elements((PROMPT_TOKENS / bs) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bs), &bs, |b, &bs| {
            b.iter(|| {
                black_box(&bytes)
                    .chunks_exact(bs * 4)
                    .map(|c| xxhash_rust::xxh3::xxh3_64_with_seed(c, 1337))
                    .collect::<Vec<u64>>()
            })
        });
    }
    group.finish();

    let local = compute_block_hash_for_seq(&tokens, 16, &BlockHashOptions::default())
        .expect("block size is non-zero");
    let mut group = c.benchmark_group("sequence_hash");
    group.throughput(Throughput::Elements(local.len() as u64));
    group.bench_function("chain_16", |b| {
        b.iter(|| compute_seq_hash_for_block(black_box(&local)))
    });
    group.finish();
}

criterion_group!(benches, bench_local_hashes);
criterion_main!(benches);
