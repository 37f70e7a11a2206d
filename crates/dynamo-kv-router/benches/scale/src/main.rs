//! `dynamo-kv-router-scale-bench`: the indexer scale harness (see `harness.rs`), with the
//! published reference crate beside ours under the `bench-reference` feature.

mod harness;
#[cfg(feature = "bench-reference")]
mod reference;

#[global_allocator]
static ALLOC: harness::Counting = harness::Counting;

fn main() {
    let mut cands = vec![harness::ours()];
    #[cfg(feature = "bench-reference")]
    cands.push(reference::reference());
    harness::main_with(cands);
}
