//! The indexer scale harness (`benches/scale/src/harness.rs`) on this project's tree only:
//! `cargo bench -p dynamo-kv-router --bench indexer_scale -- --scales 100k,1m`. The side by
//! side run with the published reference crate is the standalone crate in `benches/scale`
//! (feature `bench-reference`; see its Cargo.toml).

#[path = "scale/src/harness.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::Counting = harness::Counting;

fn main() {
    harness::main_with(vec![harness::ours()]);
}
