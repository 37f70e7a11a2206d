//! `dynamo-kv-router-scale-bench`: the indexer scale harness (see `harness.rs`), with the
//! published reference crate beside ours under the `bench-reference` feature, and the
//! run-node spike (`runs.rs`) when named with `--cands`.

mod harness;
#[cfg(feature = "bench-reference")]
mod reference;
mod runs;

#[global_allocator]
static ALLOC: harness::Counting = harness::Counting;

fn main() {
    let mut cands = vec![harness::ours()];
    #[cfg(feature = "bench-reference")]
    cands.push(reference::reference());
    cands.push(harness::run_tree());
    cands.push(runs::runs());
    cands.push(runs::runs_checked());
    harness::main_with(cands);
}
