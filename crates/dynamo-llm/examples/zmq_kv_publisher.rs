//! A fast engine-style ZMQ KV-event publisher for `benches/bench_selection.py`: `N` PUB
//! sockets (the project's `EnginePublisher`) on loopback, each sending the same
//! single-block `BlockStored` chain, with every message encoded before the burst so the
//! publisher is not what a subscriber's ingest rate measures.
//!
//! Usage: `zmq_kv_publisher N K BLOCK_SIZE`; prints the ports as a JSON list, then reads
//! commands on stdin: `warm` (block 0 on every socket), `burst` (blocks 1..=K on every
//! socket, then prints `sent`), `clear` (`AllBlocksCleared` on every socket), `exit`. Block `j` holds tokens `j*BS .. (j+1)*BS` and has
//! hash `1000 + j`, parent `999 + j` (vLLM's tagged-array event encoding).

#![expect(
    clippy::print_stdout,
    reason = "the ports and acknowledgements go to stdout"
)]
#![expect(clippy::unwrap_used, reason = "a bench helper: any failure ends it")]

use std::io::BufRead;

use dynamo_llm::kv_routing::zmq_pub::EnginePublisher;

fn payload(j: u64, bs: u64) -> Vec<u8> {
    let tokens: Vec<u64> = (j * bs..(j + 1) * bs).collect();
    let parent = (j > 0).then(|| 999 + j);
    let event = (
        "BlockStored",
        [1000 + j],
        parent,
        tokens,
        bs,
        Option::<u32>::None,
        "GPU",
    );
    rmp_serde::to_vec(&(now(), [event], 0u32)).expect("in-memory encode")
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// vLLM's `AllBlocksCleared` (a tagged array with no fields).
fn cleared() -> Vec<u8> {
    rmp_serde::to_vec(&(now(), [("AllBlocksCleared",)], 0u32)).expect("in-memory encode")
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let [n, k, bs] = args[..] else {
        panic!("usage: zmq_kv_publisher N K BLOCK_SIZE");
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let pubs: Vec<EnginePublisher> = (0..n)
        .map(|_| {
            EnginePublisher::bind(rt.handle(), "127.0.0.1", 0, None, 1, b"").expect("bind PUB")
        })
        .collect();
    let ports: Vec<u16> = pubs.iter().map(|p| p.local_addr().port()).collect();
    println!("{ports:?}");
    let burst: Vec<Vec<u8>> = (1..=k).map(|j| payload(j, bs)).collect();
    for line in std::io::stdin().lock().lines() {
        match line.expect("stdin").trim() {
            "warm" => {
                let m = payload(0, bs);
                for p in &pubs {
                    p.publish(m.clone());
                }
            }
            "burst" => {
                for m in &burst {
                    for p in &pubs {
                        p.publish(m.clone());
                    }
                }
                println!("sent");
            }
            "clear" => {
                let m = cleared();
                for p in &pubs {
                    p.publish(m.clone());
                }
            }
            "exit" => break,
            _ => {}
        }
    }
}
