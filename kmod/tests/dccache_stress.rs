//! Multi-threaded stress test of the DCCache with a reference check.
//!
//! Every value a writer stores is a function of (GID, epoch), so a reader can
//! tell a consistent entry from a torn or mixed one: `dc_key` and `dct_num`
//! must both match the returned epoch and the GID that was looked up. Readers
//! also check the epoch-floor guarantee: once `invalidate_all_older_than(e)`
//! has returned, no later lookup sees an epoch below `e`.
//!
//! `KRCORE_STRESS_ITERS` (default 50,000 per thread) scales the run; use a
//! release build for long runs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use krcore_kmod::dccache::{CachedTarget, DcCache, Insert, Lookup};
use krcore_nic::{DcTarget, Gid};

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn gid(i: u64) -> Gid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&mix(i).to_le_bytes());
    b[8..].copy_from_slice(&mix(i ^ 0xffff).to_le_bytes());
    Gid(b)
}

/// The one value a writer ever stores for (`i`, `epoch`).
fn make(i: u64, epoch: u32) -> DcTarget {
    DcTarget {
        gid: gid(i),
        dct_num: (mix(i + 1) as u32) ^ epoch.wrapping_mul(0x9e37_79b9),
        dc_key: mix(i + 2) ^ u64::from(epoch).wrapping_mul(0xd6e8_feb8_6659_fd93),
    }
}

fn check(i: u64, got: &CachedTarget) {
    assert_eq!(
        got.target,
        make(i, got.epoch),
        "torn or mixed entry for gid #{i} at epoch {}",
        got.epoch
    );
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Default)]
struct Stats {
    hits: AtomicU64,
    misses: AtomicU64,
    contended: AtomicU64,
    evictions: AtomicU64,
    stale: AtomicU64,
}

/// Counts a reader out of the readers still running when it ends, however
/// it ends.
struct LeftOnDrop(Arc<AtomicU32>);

impl Drop for LeftOnDrop {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

fn iters() -> u64 {
    std::env::var("KRCORE_STRESS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000)
}

fn run(cache: DcCache, pool: u64) {
    let capacity = cache.capacity();
    let iters = iters();
    let cache = Arc::new(cache);
    let bytes = cache.memory_bytes();
    // The epoch writers insert at (they read it, so some inserts go stale).
    let clock = Arc::new(AtomicU32::new(2));
    // The highest `e` whose `invalidate_all_older_than(e)` has returned.
    let swept = Arc::new(AtomicU32::new(0));
    let stats = Arc::new(Stats::default());
    let (writers, readers) = (2, 2);
    let start = Arc::new(Barrier::new(writers + readers + 1));
    let mut handles = Vec::new();

    // Readers still running: the writers go on until none is (so that a
    // reader a loaded machine schedules late still races with inserts).
    let readers_left = Arc::new(AtomicU32::new(readers as u32));
    for w in 0..writers {
        let (cache, clock, stats, start, readers_left) = (
            cache.clone(),
            clock.clone(),
            stats.clone(),
            start.clone(),
            readers_left.clone(),
        );
        handles.push(thread::spawn(move || {
            let mut rng = Rng(0x1234_5678 + w as u64);
            start.wait();
            let mut n = 0;
            while n < iters || readers_left.load(Ordering::Acquire) > 0 {
                n += 1;
                let i = rng.below(pool);
                let epoch = clock.load(Ordering::Relaxed) - rng.below(2) as u32;
                match cache.insert(make(i, epoch), epoch) {
                    Insert::Evicted { victim } => {
                        assert_ne!(victim.target.gid, gid(i));
                        stats.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    Insert::Stale { .. } => {
                        stats.stale.fetch_add(1, Ordering::Relaxed);
                    }
                    Insert::Replaced { previous } => {
                        assert_eq!(previous.target.gid, gid(i));
                        assert!(previous.epoch <= epoch);
                    }
                    _ => {}
                }
            }
        }));
    }
    for r in 0..readers {
        let (cache, swept, stats, start, readers_left) = (
            cache.clone(),
            swept.clone(),
            stats.clone(),
            start.clone(),
            readers_left.clone(),
        );
        handles.push(thread::spawn(move || {
            // Counted out even when the reader panics (the writers wait
            // for it).
            let _left = LeftOnDrop(readers_left);
            let mut rng = Rng(0x8765_4321 + r as u64);
            start.wait();
            // `iters` lookups, and on until one hit (bounded: a reader that
            // never hits fails the run below).
            let (mut n, mut hit) = (0, false);
            while n < iters || (!hit && n < 200 * iters) {
                n += 1;
                let i = rng.below(pool);
                let floor = swept.load(Ordering::Acquire);
                match cache.lookup(&gid(i)) {
                    Lookup::Hit(got) => {
                        check(i, &got);
                        assert!(
                            got.epoch >= floor,
                            "epoch {} below swept floor {floor}",
                            got.epoch
                        );
                        stats.hits.fetch_add(1, Ordering::Relaxed);
                        hit = true;
                    }
                    Lookup::Miss => {
                        stats.misses.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        stats.contended.fetch_add(1, Ordering::Relaxed);
                        // A writer holds the bucket (perhaps preempted on a
                        // loaded machine): let it finish.
                        thread::yield_now();
                    }
                }
            }
        }));
    }

    // This thread invalidates: single GIDs, and now and then a whole epoch.
    let mut rng = Rng(0xabcd_ef01);
    start.wait();
    for n in 0..iters / 4 {
        cache.invalidate(&gid(rng.below(pool)));
        if n % 512 == 511 {
            let e = clock.fetch_add(1, Ordering::Relaxed) + 1;
            cache.invalidate_all_older_than(e - 2);
            swept.store(e - 2, Ordering::Release);
        }
    }
    for h in handles {
        h.join().expect("stress thread panicked");
    }

    // Quiescent: every entry is consistent and above the floor.
    let floor = swept.load(Ordering::Relaxed);
    for i in 0..pool {
        if let Some(got) = cache.get(&gid(i)) {
            check(i, &got);
            assert!(got.epoch >= floor);
        }
    }
    assert!(cache.len() <= cache.slots());
    assert_eq!(cache.memory_bytes(), bytes, "the cache never grows");
    let s = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "capacity {capacity}, pool {pool}, {iters} iters/thread: {} hits, {} misses, {} contended, \
         {} evictions, {} stale inserts",
        s(&stats.hits),
        s(&stats.misses),
        s(&stats.contended),
        s(&stats.evictions),
        s(&stats.stale)
    );
    assert!(
        s(&stats.hits) > 0,
        "the readers never hit: the test checks nothing"
    );
    assert!(s(&stats.evictions) > 0, "no eviction happened");
}

/// Many buckets, a pool four times the capacity: eviction-heavy.
#[test]
fn stress_many_buckets() {
    // 64 targets: 13 buckets of two-choice placement.
    run(DcCache::new(64), 256);
}

/// One bucket: every reader and writer fights over the same seqlock.
#[test]
fn stress_one_bucket() {
    run(DcCache::with_buckets(1, 7), 12);
}
