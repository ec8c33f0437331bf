//! A small fixed load on a `sim:mem` RACE cluster, for profiling (callgrind
//! gives repeatable instruction counts) and quick throughput checks:
//! loads `KEYS` keys (8 B keys, 64 B values), then runs `OPS` operations
//! per thread (`get` or `mix` = 50/50 get/put) on `THREADS` threads.
//!
//! `cargo run --release -p race-store --example race_load -- get 100000 200000 1`

use krcore::Node;
use race_store::clock::{Clock, SystemClock};
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeServer, NodeInfo, VqpTransport};
use race_store::{Client, ClientConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("get", String::as_str).to_string();
    let keys: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let ops: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let threads: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    let meta = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .expect("meta");
    let mut servers = Vec::new();
    let mut infos: Vec<NodeInfo> = Vec::new();
    for id in 0..2u8 {
        let node = Node::builder().join(&meta).build().expect("node");
        let s = MemoryNodeServer::start(&node, id, 1 << 30, &TableConfig::default(), 2)
            .expect("server");
        infos.push(s.info());
        servers.push(s.spawn(Duration::from_millis(1)));
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let client = |_: u64| {
        let node = Node::builder().join(&meta).build().expect("client node");
        let t = VqpTransport::connect(&node, &infos).expect("connect");
        Client::open(t, clock.clone(), ClientConfig::default()).expect("open")
    };
    let value = [0x5au8; 64];
    let mut loader = client(0);
    for k in 0..keys {
        loader.put(&k.to_le_bytes(), &value).expect("load");
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let mut c = client(t + 1);
            let mode = mode.clone();
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut found = 0u64;
                for i in 0..ops {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = (x % keys).to_le_bytes();
                    if mode == "mix" && i % 2 == 1 {
                        c.put(&key, &value).expect("put");
                    } else if c.get(&key).expect("get").is_some() {
                        found += 1;
                    }
                }
                assert_eq!(found > 0, keys > 0);
            });
        }
    });
    let el = start.elapsed();
    let total = ops * threads;
    println!(
        "{mode} keys={keys} threads={threads} ops={total} time={el:?} ops/s={:.0}",
        total as f64 / el.as_secs_f64()
    );
}
