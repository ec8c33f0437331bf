//! Writers that overlap on hot keys (every doorbell delayed by a modeled
//! round trip, `remote::Delayed`, so threads race as machines do), under
//! both conflict policies: CASes are lost (the test forces the conflict it
//! is about), and still no increment of a read-modify-write counter is
//! lost, every hot key ends at a value some writer wrote, and the table
//! checks out.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::*;
use race_store::memory::{ClusterConfig, LocalCluster};
use race_store::remote::Delayed;
use race_store::{Client, ClientConfig, ConflictPolicy};

const THREADS: u64 = 6;
const ROUNDS: u64 = 25;

fn run(policy: ConflictPolicy) -> u64 {
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    })
    .unwrap();
    let config = ClientConfig {
        conflict: policy,
        ..system_config()
    };
    let mut setup = open(&cluster, system_clock(), config);
    for k in 0..2 {
        setup.put(&key(k), b"start").unwrap();
    }
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let cluster = cluster.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let transport = Delayed::new(cluster.transport(), Duration::from_micros(200));
                let mut c = Client::open(transport, system_clock(), config).unwrap();
                barrier.wait();
                for i in 0..ROUNDS {
                    c.update(&key(i % 2), &value(t, i, 32)).unwrap();
                    c.rmw(b"counter", |cur| {
                        let n = cur.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
                        Some((n + 1).to_le_bytes().to_vec())
                    })
                    .unwrap();
                }
                c.stats()
            })
        })
        .collect();
    let lost: u64 = handles
        .into_iter()
        .map(|h| h.join().unwrap().cas_failures)
        .sum();
    let counter = setup.get(b"counter").unwrap().unwrap();
    assert_eq!(
        u64::from_le_bytes(counter.try_into().unwrap()),
        THREADS * ROUNDS,
        "{policy:?}: no increment lost"
    );
    for k in 0..2 {
        let v = setup.get(&key(k)).unwrap().unwrap();
        let written = (0..THREADS).any(|t| (0..ROUNDS).any(|i| value(t, i, 32) == v));
        assert!(written, "{policy:?}: key {k} holds a value nobody wrote");
    }
    let check = setup.check_table().unwrap();
    assert!(
        check.problems.is_empty() && check.duplicates == 0,
        "{check:?}"
    );
    lost
}

#[test]
fn overlapping_writers_lose_cases_and_no_update_under_either_policy() {
    for policy in [ConflictPolicy::Retry, ConflictPolicy::Backoff] {
        let lost = run(policy);
        eprintln!("{policy:?}: {lost} CASes lost");
        assert!(lost > 0, "{policy:?}: the writers overlapped");
    }
}
