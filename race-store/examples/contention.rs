//! Writers racing on hot keys, under each conflict policy side by side:
//! lost CASes and restarted attempts per write, and writes per second.
//!
//! Every doorbell is delayed by a round trip (`remote::Delayed`), so the
//! client threads overlap as clients on different machines do; on a
//! 2-core machine, without it, a thread mostly runs alone and its writes
//! rarely meet. Each thread updates keys drawn uniformly from a small hot
//! set (the head of a zipf 0.99 distribution, where YCSB-A's conflicts
//! are).
//!
//! Run: `cargo run --release -p race-store --example contention --
//! [THREADS] [WRITES] [RTT_US] [HOT_KEYS] [ROUNDS]` (default 8 200 100 4 3).
//! Measured software time on in-process memory nodes with the delay as
//! the only modeled part: the ratio is the figure, not the rates.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use race_store::clock::{Clock, SystemClock};
use race_store::memory::{ClusterConfig, LocalCluster};
use race_store::remote::Delayed;
use race_store::{Client, ClientConfig, ConflictPolicy};

struct Outcome {
    lost_per_write: f64,
    retries_per_write: f64,
    writes_per_s: f64,
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("argument {i}: not a number: {a}"))
        })
        .unwrap_or(default)
}

fn round(policy: ConflictPolicy, threads: u64, writes: u64, rtt: Duration, hot: u64) -> Outcome {
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    })
    .expect("cluster");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let config = ClientConfig {
        conflict: policy,
        ..ClientConfig::default()
    };
    let mut setup = Client::open(cluster.transport(), clock.clone(), config).expect("open");
    for k in 0..hot {
        setup.put(format!("hot{k}").as_bytes(), b"0").expect("load");
    }
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cluster, clock, barrier) = (cluster.clone(), clock.clone(), barrier.clone());
            std::thread::spawn(move || {
                let transport = Delayed::new(cluster.transport(), rtt);
                let mut c = Client::open(transport, clock, config).expect("open");
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                barrier.wait();
                for i in 0..writes {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = format!("hot{}", x % hot);
                    c.update(key.as_bytes(), format!("t{t}:{i}").as_bytes())
                        .expect("update");
                }
                c.stats()
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let stats: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("writer"))
        .collect();
    let took = start.elapsed();
    let total = (threads * writes) as f64;
    Outcome {
        lost_per_write: stats.iter().map(|s| s.cas_failures).sum::<u64>() as f64 / total,
        retries_per_write: stats.iter().map(|s| s.retries).sum::<u64>() as f64 / total,
        writes_per_s: total / took.as_secs_f64(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads = arg(1, 8).max(1);
    let writes = arg(2, 200).max(1);
    let rtt = Duration::from_micros(arg(3, 100));
    let hot = arg(4, 4).max(1);
    let rounds = arg(5, 3).max(1);
    println!(
        "# contention: {threads} writers x {writes} updates on {hot} hot keys, \
         {} us round trip per doorbell (modeled delay; software time measured)",
        rtt.as_micros()
    );
    let policies = [ConflictPolicy::Retry, ConflictPolicy::Backoff];
    let mut lost: Vec<Vec<f64>> = vec![Vec::new(); 2];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); 2];
    for r in 0..rounds {
        for (i, &p) in policies.iter().enumerate() {
            let o = round(p, threads, writes, rtt, hot);
            println!(
                "round {r} {p:?}: lost CAS/write {:.3}, retries/write {:.3}, {:.0} writes/s",
                o.lost_per_write, o.retries_per_write, o.writes_per_s
            );
            lost[i].push(o.lost_per_write);
            rate[i].push(o.writes_per_s);
        }
    }
    for (i, p) in policies.iter().enumerate() {
        let (lo, hi) = lost[i]
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "{p:?}: lost CAS per write median {:.3} ({lo:.3}-{hi:.3}), writes/s median {:.0}",
            median(lost[i].clone()),
            median(rate[i].clone())
        );
    }
}
