//! The RACE store's operations, one client thread: get, update and insert
//! on in-process memory nodes (`LocalTransport`, the protocol's CPU cost
//! alone) and through KRCore VQPs on `sim:mem` (the full stack); and the
//! YCSB key generators the drivers draw from.
//!
//! Batches of 1, 4, 16 and 64 gets and updates (`Client::batch`) report
//! throughput per operation beside the single calls.
//!
//! Run: `cargo bench -p krcore-benches --bench race_store`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use krcore_benches::cluster::{ClusterHost, ClusterOptions};
use krcore_benches::ycsb::{ScrambledZipfianGenerator, SkewedLatestGenerator};
use krcore_nic::sim::{SimConfig, SimFabric};
use race_store::client::Op;
use race_store::clock::SystemClock;
use race_store::memory::{ClusterConfig, LocalCluster};
use race_store::remote::Transport;
use race_store::{Client, ClientConfig};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;

const KEYS: u64 = 10_000;

fn key(i: u64) -> String {
    format!("user{i:012}")
}

fn ops<T: Transport>(c: &mut Criterion, label: &str, client: &mut Client<T>) {
    let value = [7u8; 100];
    for i in 0..KEYS {
        client.put(key(i).as_bytes(), &value).unwrap();
    }
    let mut g = c.benchmark_group(format!("race/{label}"));
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    g.bench_function("get", |b| {
        b.iter(|| {
            i = (i + 7919) % KEYS;
            client.get(key(i).as_bytes()).unwrap()
        })
    });
    g.bench_function("update", |b| {
        b.iter(|| {
            i = (i + 7919) % KEYS;
            client.update(key(i).as_bytes(), &value).unwrap()
        })
    });
    g.finish();
    // Batches of B operations (`Client::batch`): throughput per operation,
    // so the curve over B reads directly against the single calls above.
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let mut g = c.benchmark_group(format!("race/{label}/batch"));
    for b in [1usize, 4, 16, 64] {
        g.throughput(Throughput::Elements(b as u64));
        g.bench_function(format!("get/{b}"), |bench| {
            bench.iter(|| {
                let batch: Vec<Op<'_>> = (0..b)
                    .map(|_| {
                        i = (i + 7919) % KEYS;
                        Op::Get(keys[i as usize].as_bytes())
                    })
                    .collect();
                client.batch(&batch)
            })
        });
        g.bench_function(format!("update/{b}"), |bench| {
            bench.iter(|| {
                let batch: Vec<Op<'_>> = (0..b)
                    .map(|_| {
                        i = (i + 7919) % KEYS;
                        Op::Update(keys[i as usize].as_bytes(), &value)
                    })
                    .collect();
                client.batch(&batch)
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group(format!("race/{label}"));
    g.throughput(Throughput::Elements(1));
    let mut n = KEYS;
    g.bench_function("insert", |b| {
        b.iter(|| {
            n += 1;
            client.insert(key(n).as_bytes(), &value).unwrap()
        })
    });
    g.finish();
}

fn race(c: &mut Criterion) {
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        node_bytes: 256 << 20,
        ..ClusterConfig::default()
    })
    .unwrap();
    let mut local = Client::open(
        cluster.transport(),
        Arc::new(SystemClock::new()),
        ClientConfig::default(),
    )
    .unwrap();
    ops(c, "local", &mut local);

    let host = ClusterHost::start(
        SimFabric::in_memory(),
        &ClusterOptions {
            memory_nodes: 2,
            node_bytes: 256 << 20,
            ..ClusterOptions::default()
        },
        None,
    )
    .unwrap();
    let mut vqp = host
        .remote()
        .unwrap()
        .race_client(&SimConfig::default(), ClientConfig::default())
        .unwrap();
    ops(c, "vqp-sim-mem", &mut vqp);
}

fn generators(c: &mut Criterion) {
    let mut g = c.benchmark_group("ycsb/generators");
    g.throughput(Throughput::Elements(1));
    let mut rng = SmallRng::seed_from_u64(1);
    let mut z = ScrambledZipfianGenerator::new(0, 1_000_000 - 1).unwrap();
    g.bench_function("scrambled_zipfian_1M", |b| {
        b.iter(|| z.next_value(&mut rng))
    });
    let mut l = SkewedLatestGenerator::new(1_000_000 - 1);
    g.bench_function("skewed_latest_1M", |b| {
        b.iter(|| l.next_value(&mut rng, 1_000_000 - 1))
    });
    g.finish();
}

criterion_group!(benches, race, generators);
criterion_main!(benches);
