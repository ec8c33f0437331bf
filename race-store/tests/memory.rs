//! Memory stays bounded under an update-heavy load: every update retires
//! the old KV block, which is reused after the grace period.
//!
//! Time is logical here: the shared manual clock advances one tick per
//! operation (all threads together), and the grace period is a few hundred
//! ticks, so "one grace period of updates" is a few hundred blocks. Each
//! thread owns its keys (no concurrent writers of one key), which is what
//! makes this tiny grace period safe with descheduled threads.
//!
//! `memory_bound_full_size` (ignored; run it in release) is the issue's
//! full-size run: 1,000,000 updates over 10,000 keys.

mod common;

use std::sync::Arc;
use std::thread;

use common::*;
use race_store::clock::{Clock, ManualClock};
use race_store::layout::kv;
use race_store::{Client, ClientConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

struct Figures {
    live_kv: u64,
    allocated_kv: u64,
    quarantined: u64,
    free: u64,
    uncarved: u64,
    node_heap: u64,
    splits: u64,
}

fn update_heavy(keys: u64, updates: u64, threads: u64) -> Figures {
    let cluster = tiny_cluster(2, 64, 256 << 20, 16);
    let clock = Arc::new(ManualClock::new(0, 1));
    let config = ClientConfig {
        lease_ticks: 1 << 30,
        lease_unit_ticks: 1,
        max_op_ticks: 64,
        grace_ticks: 256,
        ..ClientConfig::default()
    };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cluster, clock) = (cluster.clone(), Arc::clone(&clock));
            thread::spawn(move || {
                let mut c =
                    Client::open(cluster.transport(), clock.clone() as Arc<dyn Clock>, config)
                        .unwrap();
                let mine: Vec<u64> = (0..keys).filter(|k| k % threads == t).collect();
                let mut rng = SmallRng::seed_from_u64(t);
                let mut sizes = vec![0usize; mine.len()];
                for (i, &k) in mine.iter().enumerate() {
                    sizes[i] = rng.gen_range(8..200);
                    c.insert(&key(k), &value(k, 0, sizes[i])).unwrap();
                    clock.advance(1);
                }
                for n in 0..updates / threads {
                    let i = rng.gen_range(0..mine.len());
                    sizes[i] = rng.gen_range(8..200);
                    c.update(&key(mine[i]), &value(mine[i], n + 1, sizes[i]))
                        .unwrap();
                    clock.advance(1);
                }
                let live: u64 = mine
                    .iter()
                    .zip(&sizes)
                    .map(|(&k, &s)| kv::block_len(key(k).len(), s).unwrap() as u64)
                    .sum();
                (live, c.stats())
            })
        })
        .collect();
    let mut f = Figures {
        live_kv: 0,
        allocated_kv: 0,
        quarantined: 0,
        free: 0,
        uncarved: 0,
        node_heap: 0,
        splits: 0,
    };
    for h in handles {
        let (live, stats) = h.join().unwrap();
        f.live_kv += live;
        f.allocated_kv += stats.kv_memory.coarse_bytes;
        f.quarantined += stats.kv_memory.quarantined_bytes;
        f.free += stats.kv_memory.free_bytes;
        f.uncarved += stats.kv_memory.uncarved_bytes;
        f.splits += stats.splits;
    }
    f.node_heap = cluster.stats().iter().map(|s| s.heap_used).sum();
    let mut c = open(&cluster, clock, config);
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!(check.pairs.len() as u64, keys);
    eprintln!(
        "{updates} updates over {keys} keys, {threads} clients: live KV {} KiB, allocated KV {} KiB \
         ({:.2}x; {} KiB free, {} KiB in grace, {} KiB uncarved); {} splits; node heaps {} KiB",
        f.live_kv >> 10,
        f.allocated_kv >> 10,
        f.allocated_kv as f64 / f.live_kv as f64,
        f.free >> 10,
        f.quarantined >> 10,
        f.uncarved >> 10,
        f.splits,
        f.node_heap >> 10
    );
    f
}

#[test]
fn memory_bound_200k_updates_over_2k_keys() {
    let f = update_heavy(2_000, 200_000, 4);
    assert!(
        f.allocated_kv <= 2 * f.live_kv,
        "allocated {} B for {} B live",
        f.allocated_kv,
        f.live_kv
    );
}

#[test]
#[ignore = "full-size run: cargo test --release -p race-store --test memory -- --ignored"]
fn memory_bound_full_size() {
    let f = update_heavy(10_000, 1_000_000, 4);
    assert!(f.allocated_kv <= 2 * f.live_kv);
}
