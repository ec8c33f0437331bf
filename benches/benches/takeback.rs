//! How long a memory node's allocations stall while it takes back what a
//! dead client never wrote (`race_store::holders`).
//!
//! A client dies holding `DEAD_MIB` of grants of 64-byte blocks, half of
//! them written (every other block, the worst case for the pool: one run
//! per block). Once its lease ended, one thread takes its blocks back
//! (`MemoryNode::reclaim_expired`, as a node's upkeep thread does, and the
//! node's own requests when the look is due) while another keeps asking the node for grants and giving them back (a live
//! client's allocation traffic), timing each request. Printed: the
//! takeback's own time and the live client's slowest and 99th-percentile
//! request while it ran, beside the same requests' figures with nothing to
//! take back. Rounds in turn; medians over the rounds.
//!
//! Run: `cargo bench -p krcore-benches --bench takeback`

use race_store::memory::MemoryNode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEAD_MIB: u64 = 64;
const BLOCK: u64 = 64;
const GRANT: u64 = 4 << 20;
const LEASE: Duration = Duration::from_millis(200);
const ROUNDS: usize = 5;

struct Round {
    takeback: Duration,
    taken: u64,
    live_max: Duration,
    live_p99: Duration,
    live_requests: usize,
}

/// The live client's requests (a 64 KiB grant of 128-byte blocks, given
/// straight back) until `stop`; their latencies.
fn live_client(node: &MemoryNode, stop: &AtomicBool) -> Vec<Duration> {
    let mut lat = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let (runs, _) = node.grant(2, 64 << 10, 128).expect("live grant");
        node.give_back_as(2, 128, &runs, Duration::ZERO)
            .expect("live give-back");
        lat.push(t.elapsed());
    }
    lat
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn round(with_dead: bool) -> Round {
    let node = Arc::new(MemoryNode::new(1, (DEAD_MIB + 64) << 20));
    node.set_grant_lease(LEASE);
    if with_dead {
        let mut granted = 0;
        while granted < DEAD_MIB << 20 {
            let (runs, _) = node.grant(1, GRANT, BLOCK).expect("dead grant");
            for (start, len) in runs {
                let mut at = start;
                while at < start + len {
                    node.write(at, b"RKwritten").expect("write");
                    at += 2 * BLOCK;
                }
                granted += len;
            }
        }
    }
    // Both holders' leases end; the live one renews with its first request.
    std::thread::sleep(LEASE + Duration::from_millis(20));
    let stop = Arc::new(AtomicBool::new(false));
    let live = {
        let (node, stop) = (node.clone(), stop.clone());
        std::thread::spawn(move || live_client(&node, &stop))
    };
    std::thread::sleep(Duration::from_millis(20));
    // The upkeep thread's part: until all is taken back (the live
    // client's requests may take part of it, or all).
    let t = Instant::now();
    let want = if with_dead { (DEAD_MIB << 20) / 2 } else { 0 };
    while node.stats().holders.reclaimed < want {
        node.reclaim_expired();
    }
    let taken = node.stats().holders.reclaimed;
    let takeback = t.elapsed();
    // As long again after the takeback, so the baseline sees as many.
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    let mut lat = live.join().expect("live client");
    lat.sort();
    Round {
        takeback,
        taken,
        live_max: lat.last().copied().unwrap_or_default(),
        live_p99: percentile(&lat, 0.99),
        live_requests: lat.len(),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too:
    // one short round then.
    let rounds = if std::env::args().any(|a| a == "--bench") {
        ROUNDS
    } else {
        1
    };
    let mut dead = Vec::new();
    let mut idle = Vec::new();
    for _ in 0..rounds {
        dead.push(round(true));
        idle.push(round(false));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (i, (d, n)) in dead.iter().zip(&idle).enumerate() {
        println!(
            "round {}: takeback of {} MiB in {:.1} ms ({:.0} MiB taken back); \
             live requests during it: max {:.2} ms, p99 {:.3} ms ({}); \
             nothing to take back: max {:.2} ms, p99 {:.3} ms ({})",
            i + 1,
            DEAD_MIB,
            ms(d.takeback),
            d.taken as f64 / f64::from(1 << 20),
            ms(d.live_max),
            ms(d.live_p99),
            d.live_requests,
            ms(n.live_max),
            ms(n.live_p99),
            n.live_requests,
        );
    }
    println!(
        "median over {rounds} rounds: takeback {:.1} ms; live max {:.2} ms against {:.2} ms \
         with nothing to take back; live p99 {:.3} ms against {:.3} ms",
        ms(median(dead.iter().map(|r| r.takeback).collect())),
        ms(median(dead.iter().map(|r| r.live_max).collect())),
        ms(median(idle.iter().map(|r| r.live_max).collect())),
        ms(median(dead.iter().map(|r| r.live_p99).collect())),
        ms(median(idle.iter().map(|r| r.live_p99).collect())),
    );
}
