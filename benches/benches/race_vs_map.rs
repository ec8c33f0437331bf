//! The RACE store on `sim:mem` (2 memory nodes, clients on compute nodes of
//! their own, VQPs over the DC pool) against an in-process `DashMap` doing
//! the same load (the upper bound): 100,000 keys of 8 B with 64 B values,
//! uniform keys.
//!
//! * a summary first, all in this one run: doorbells (RTTs) per get and put
//!   from the client node's NIC counters and from the client's own round
//!   trip count, single-client latency, and throughput with 1 and 2 client
//!   threads for 100% get and 50/50 get/put, each beside DashMap's and as a
//!   ratio;
//! * then criterion groups `race_vs_map/latency` (get, put) and
//!   `race_vs_map/throughput` (`{race,dashmap}/{get,mix}/{1,2}t`; one
//!   iteration = one operation on every thread).
//!
//! Figures are measured software time on the sim (no latency model).
//!
//! Run: `cargo bench -p krcore-benches --bench race_vs_map`
//! (`RACE_BENCH_SUMMARY_OPS` sets the summary's operations per thread,
//! default 200,000; `RACE_BENCH_SUMMARY_ONLY=1` skips criterion.)

use criterion::{Criterion, Throughput};
use dashmap::DashMap;
use krcore::Node;
use race_store::clock::{Clock, SystemClock};
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeHandle, MemoryNodeServer, NodeInfo, VqpTransport};
use race_store::{Client, ClientConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: u64 = 100_000;
const VALUE: [u8; 64] = [0x5a; 64];
/// Alternating timed rounds per backend in the summary.
const ROUNDS: u64 = 10;

struct Cluster {
    meta: Node,
    infos: Vec<NodeInfo>,
    _servers: Vec<MemoryNodeHandle>,
    clock: Arc<dyn Clock>,
}

type RaceClient = Client<VqpTransport<krcore_nic::AnyNic>>;

impl Cluster {
    fn start() -> Cluster {
        let meta = Node::builder()
            .fabric("sim:mem")
            .host_meta()
            .build()
            .unwrap();
        let mut servers = Vec::new();
        let mut infos = Vec::new();
        for id in 0..2u8 {
            let node = Node::builder().join(&meta).build().unwrap();
            let s =
                MemoryNodeServer::start(&node, id, 1 << 30, &TableConfig::default(), 2).unwrap();
            infos.push(s.info());
            servers.push(s.spawn(Duration::from_millis(1)));
        }
        Cluster {
            meta,
            infos,
            _servers: servers,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// A client on a compute node of its own.
    fn client(&self) -> (Node, RaceClient) {
        let node = Node::builder().join(&self.meta).build().unwrap();
        let t = VqpTransport::connect(&node, &self.infos).unwrap();
        let c = Client::open(t, self.clock.clone(), ClientConfig::default()).unwrap();
        (node, c)
    }
}

/// Uniform keys, the same sequence for every backend.
struct Keys(u64);

impl Keys {
    fn new(thread: usize) -> Keys {
        Keys(0x9e37_79b9_7f4a_7c15 ^ (thread as u64 + 1).wrapping_mul(0xdead_beef_1234_5678))
    }

    fn next(&mut self) -> [u8; 8] {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % KEYS).to_le_bytes()
    }
}

/// One backend client: the operations of the load.
trait Kv: Send {
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>>;
    fn put(&mut self, key: &[u8], value: &[u8]);
}

impl Kv for RaceClient {
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        Client::get(self, key).unwrap()
    }
    fn put(&mut self, key: &[u8], value: &[u8]) {
        Client::put(self, key, value).unwrap();
    }
}

struct MapClient(Arc<DashMap<Vec<u8>, Vec<u8>>>);

impl Kv for MapClient {
    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key).map(|v| v.value().clone())
    }
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.0.insert(key.to_vec(), value.to_vec());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    Get,
    GetPut,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Get => "get",
            Mix::GetPut => "mix",
        }
    }
}

/// `ops` operations on each client's thread; returns the wall time.
fn run<K: Kv>(clients: &mut [K], mix: Mix, ops: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, c) in clients.iter_mut().enumerate() {
            s.spawn(move || {
                let mut keys = Keys::new(t);
                let mut hits = 0u64;
                for i in 0..ops {
                    let k = keys.next();
                    if mix == Mix::GetPut && i % 2 == 1 {
                        c.put(&k, &VALUE);
                    } else if c.get(&k).is_some() {
                        hits += 1;
                    }
                }
                std::hint::black_box(hits);
            });
        }
    });
    start.elapsed()
}

fn load(c: &mut impl Kv) {
    for k in 0..KEYS {
        c.put(&k.to_le_bytes(), &VALUE);
    }
}

fn summary_ops() -> u64 {
    std::env::var("RACE_BENCH_SUMMARY_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000)
}

/// Doorbells per op from the client node's NIC counters and round trips
/// from the client's own count, and mean time per op, over `n` ops.
fn per_op(node: &Node, c: &mut RaceClient, n: u64, put: bool) -> (f64, f64, Duration) {
    let mut keys = Keys::new(7);
    let (d0, r0) = (node.counters().doorbells, c.stats().transport.round_trips);
    let start = Instant::now();
    for _ in 0..n {
        let k = keys.next();
        if put {
            Kv::put(c, &k, &VALUE);
        } else {
            assert!(Kv::get(c, &k).is_some());
        }
    }
    let el = start.elapsed();
    let d = node.counters().doorbells - d0;
    let r = c.stats().transport.round_trips - r0;
    (d as f64 / n as f64, r as f64 / n as f64, el / n as u32)
}

fn summary(cluster: &Cluster, map: &Arc<DashMap<Vec<u8>, Vec<u8>>>) {
    let ops = summary_ops();
    println!(
        "race_vs_map summary: {KEYS} keys, 8 B keys, 64 B values, sim:mem, measured software time"
    );
    let (node, mut c) = cluster.client();
    let n = (ops / 4).max(1000);
    let (gd, gr, gt) = per_op(&node, &mut c, n, false);
    let (pd, pr, pt) = per_op(&node, &mut c, n, true);
    println!("  latency 1 client: get {gt:?} ({gd:.3} doorbells/op on the NIC, {gr:.3} round trips/op), put {pt:?} ({pd:.3} doorbells/op, {pr:.3} round trips/op)");
    let mut m = MapClient(map.clone());
    let mt = {
        let mut keys = Keys::new(7);
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(m.get(&keys.next()));
        }
        start.elapsed() / n as u32
    };
    println!("  latency dashmap: get {mt:?}");
    for mix in [Mix::Get, Mix::GetPut] {
        for threads in [1usize, 2] {
            let mut races: Vec<RaceClient> = (0..threads).map(|_| cluster.client().1).collect();
            let mut maps: Vec<MapClient> = (0..threads).map(|_| MapClient(map.clone())).collect();
            // Warm up both (directory caches, allocator refills), then time
            // them in alternating rounds, so that a change of the machine's
            // load hits both alike.
            run(&mut races, mix, ops / 10);
            run(&mut maps, mix, ops / 10);
            let (mut rt, mut mt) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..ROUNDS {
                rt += run(&mut races, mix, ops / ROUNDS);
                mt += run(&mut maps, mix, ops / ROUNDS);
            }
            let total = (ops / ROUNDS * ROUNDS * threads as u64) as f64;
            let (r, m) = (total / rt.as_secs_f64(), total / mt.as_secs_f64());
            println!(
                "  throughput {:<3} {threads} thread(s): race {r:>12.0} ops/s, dashmap {m:>12.0} ops/s, race/dashmap {:.2}%",
                mix.name(),
                100.0 * r / m
            );
        }
    }
}

fn criterion_benches(c: &mut Criterion, cluster: &Cluster, map: &Arc<DashMap<Vec<u8>, Vec<u8>>>) {
    let mut g = c.benchmark_group("race_vs_map/latency");
    let (_node, mut client) = cluster.client();
    let mut keys = Keys::new(3);
    g.bench_function("get", |b| {
        b.iter(|| Kv::get(&mut client, &keys.next()));
    });
    g.bench_function("put", |b| {
        b.iter(|| Kv::put(&mut client, &keys.next(), &VALUE));
    });
    g.finish();

    let mut g = c.benchmark_group("race_vs_map/throughput");
    for mix in [Mix::Get, Mix::GetPut] {
        for threads in [1usize, 2] {
            g.throughput(Throughput::Elements(threads as u64));
            let mut races: Vec<RaceClient> = (0..threads).map(|_| cluster.client().1).collect();
            g.bench_function(format!("race/{}/{threads}t", mix.name()), |b| {
                b.iter_custom(|iters| run(&mut races, mix, iters));
            });
            let mut maps: Vec<MapClient> = (0..threads).map(|_| MapClient(map.clone())).collect();
            g.bench_function(format!("dashmap/{}/{threads}t", mix.name()), |b| {
                b.iter_custom(|iters| run(&mut maps, mix, iters));
            });
        }
    }
    g.finish();
}

fn main() {
    let cluster = Cluster::start();
    let (_n, mut loader) = cluster.client();
    load(&mut loader);
    let map = Arc::new(DashMap::new());
    load(&mut MapClient(map.clone()));
    summary(&cluster, &map);
    if std::env::var("RACE_BENCH_SUMMARY_ONLY").as_deref() == Ok("1") {
        return;
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    criterion_benches(&mut c, &cluster, &map);
    c.final_summary();
}
