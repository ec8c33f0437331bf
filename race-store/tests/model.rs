//! Model-based tests: several client threads run random operations against a
//! table that starts as one tiny subtable, so splits and directory doublings
//! happen concurrently with the load.
//!
//! * Disjoint key ranges: each thread owns its keys and checks every result
//!   exactly against its own `HashMap` reference; at the end the table must
//!   hold exactly the union of the references.
//! * Shared keys: every read returns a value some client wrote, no
//!   duplicates remain, and read-modify-write counters lose no increment
//!   (including on keys that start absent).
//! * Readers during splits: keys that never change are always found.
//!
//! `RACE_MODEL_OPS` scales the number of operations per thread.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use common::*;
use race_store::{Client, Error};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn ops_per_thread(default: u64) -> u64 {
    std::env::var("RACE_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn disjoint_keys_exact_against_reference() {
    let cluster = tiny_cluster(2, 2, 64 << 20, 14);
    let threads = 4u64;
    let ops = ops_per_thread(3_000);
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let cluster = cluster.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let mut transport = cluster.transport();
                transport.set_interleave(t % 2 == 0);
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut rng = SmallRng::seed_from_u64(0xD15_0000 + t);
                let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                barrier.wait();
                for n in 0..ops {
                    let k = key(t * 1_000_000 + rng.gen_range(0..250));
                    let v = value(t, n, rng.gen_range(1..200));
                    let cur = model.get(&k).cloned();
                    match rng.gen_range(0..100) {
                        0..=29 => assert_eq!(c.get(&k).unwrap(), cur, "get {k:?}"),
                        30..=44 => match c.insert(&k, &v) {
                            Ok(()) => assert!(model.insert(k, v).is_none()),
                            Err(Error::KeyExists) => assert!(cur.is_some()),
                            Err(e) => panic!("insert: {e:?}"),
                        },
                        45..=59 => {
                            c.put(&k, &v).unwrap();
                            model.insert(k, v);
                        }
                        60..=74 => match c.update(&k, &v) {
                            Ok(()) => assert!(model.insert(k, v).is_some()),
                            Err(Error::NotFound) => assert!(cur.is_none()),
                            Err(e) => panic!("update: {e:?}"),
                        },
                        75..=84 => match c.delete(&k) {
                            Ok(()) => assert!(model.remove(&k).is_some()),
                            Err(Error::NotFound) => assert!(cur.is_none()),
                            Err(e) => panic!("delete: {e:?}"),
                        },
                        _ => {
                            // Append a byte; delete once long.
                            let mut seen = None;
                            let r = c
                                .rmw(&k, |old| {
                                    seen = Some(old.map(<[u8]>::to_vec));
                                    match old {
                                        Some(o) if o.len() > 150 => None,
                                        Some(o) => Some([o, b"+"].concat()),
                                        None => Some(b"+".to_vec()),
                                    }
                                })
                                .unwrap();
                            assert_eq!(seen, Some(cur.clone()), "rmw saw {k:?}");
                            match r {
                                Some(new) => model.insert(k, new),
                                None => model.remove(&k),
                            };
                        }
                    }
                }
                (model, c.stats())
            })
        })
        .collect();
    let mut all = HashMap::new();
    let (mut splits, mut doublings) = (0, 0);
    for h in handles {
        let (model, stats) = h.join().unwrap();
        splits += stats.splits;
        doublings += stats.doublings;
        all.extend(model);
    }
    let mut checker = open(&cluster, system_clock(), system_config());
    let check = checker.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.duplicates, check.frozen_slots), (0, 0));
    let mut expect: Vec<_> = all.into_iter().collect();
    expect.sort();
    assert_eq!(check.pairs, expect);
    eprintln!(
        "disjoint: {} keys, {splits} splits, {doublings} doublings, global depth {}, {} subtables",
        expect.len(),
        check.global_depth,
        check.subtables
    );
    assert!(splits >= 10 && doublings >= 3, "{splits} {doublings}");
}

#[test]
fn shared_keys_reads_see_written_values_and_no_duplicates_remain() {
    let cluster = tiny_cluster(2, 1, 64 << 20, 16);
    let threads = 4u64;
    let ops = ops_per_thread(2_000);
    let written: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cluster, written, barrier) =
                (cluster.clone(), Arc::clone(&written), Arc::clone(&barrier));
            thread::spawn(move || {
                let mut transport = cluster.transport();
                transport.set_interleave(true);
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut rng = SmallRng::seed_from_u64(0x5EA_0000 + t);
                let mut inserted = 0;
                barrier.wait();
                for n in 0..ops {
                    // 24 hot keys, plus a growing set so the table splits.
                    let k = if rng.gen_bool(0.7) {
                        key(rng.gen_range(0..24))
                    } else {
                        key(1_000 + rng.gen_range(0..600))
                    };
                    let v = value(100 + t, n, rng.gen_range(1..100));
                    let op = rng.gen_range(0..100);
                    if op >= 40 {
                        written.lock().unwrap().insert(v.clone());
                    }
                    match op {
                        0..=39 => {
                            if let Some(got) = c.get(&k).unwrap() {
                                assert!(written.lock().unwrap().contains(&got), "read {got:?}");
                            }
                        }
                        40..=59 => match c.insert(&k, &v) {
                            Ok(()) => inserted += 1,
                            Err(Error::KeyExists) => {}
                            Err(e) => panic!("insert: {e:?}"),
                        },
                        60..=79 => c.put(&k, &v).unwrap(),
                        80..=89 => match c.update(&k, &v) {
                            Ok(()) | Err(Error::NotFound) => {}
                            Err(e) => panic!("update: {e:?}"),
                        },
                        _ => match c.delete(&k) {
                            Ok(()) | Err(Error::NotFound) => {}
                            Err(e) => panic!("delete: {e:?}"),
                        },
                    }
                }
                (inserted, c.stats())
            })
        })
        .collect();
    let mut removed = 0;
    for h in handles {
        let (_, stats) = h.join().unwrap();
        removed += stats.dups_removed;
    }
    let mut checker = open(&cluster, system_clock(), system_config());
    let check = checker.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!(check.duplicates, 0);
    let written = written.lock().unwrap();
    for (k, v) in &check.pairs {
        assert!(written.contains(v), "{k:?} holds a value nobody wrote");
    }
    eprintln!(
        "shared: {} keys left, {removed} racing copies withdrawn, depth {}",
        check.pairs.len(),
        check.global_depth
    );
}

#[test]
fn rmw_counters_lose_no_increment() {
    let cluster = tiny_cluster(1, 1, 64 << 20, 16);
    let threads = 4u64;
    let per_thread = ops_per_thread(2_000) / 4;
    let counters = 6u64;
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cluster, barrier) = (cluster.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let mut transport = cluster.transport();
                transport.set_interleave(t % 2 == 1);
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut rng = SmallRng::seed_from_u64(0xC0_0000 + t);
                let mut mine = vec![0u64; counters as usize];
                barrier.wait();
                for n in 0..per_thread {
                    // The counters start absent: the first increments race
                    // as inserts.
                    let i = rng.gen_range(0..counters);
                    c.rmw(&key(i), |old| {
                        let n: u64 =
                            old.map_or(0, |b| std::str::from_utf8(b).unwrap().parse().unwrap());
                        Some((n + 1).to_string().into_bytes())
                    })
                    .unwrap();
                    mine[i as usize] += 1;
                    // Background inserts make the table split under the counters.
                    c.put(&key(10_000 + t * 100_000 + n), b"filler").unwrap();
                }
                mine
            })
        })
        .collect();
    let mut expect = vec![0u64; counters as usize];
    for h in handles {
        for (e, m) in expect.iter_mut().zip(h.join().unwrap()) {
            *e += m;
        }
    }
    let mut c = open(&cluster, system_clock(), system_config());
    for (i, e) in expect.iter().enumerate() {
        let got = c.get(&key(i as u64)).unwrap().unwrap();
        assert_eq!(
            std::str::from_utf8(&got).unwrap(),
            e.to_string(),
            "counter {i}"
        );
    }
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert!(check.global_depth >= 3, "the table grew under the counters");
}

#[test]
fn readers_never_miss_during_splits() {
    let cluster = tiny_cluster(2, 1, 64 << 20, 16);
    let stable: Vec<Vec<u8>> = (0..60).map(key).collect();
    {
        let mut c = open(&cluster, system_clock(), system_config());
        for (i, k) in stable.iter().enumerate() {
            c.insert(k, &value(i as u64, 0, 40)).unwrap();
        }
    }
    let writers = 2u64;
    let per_writer = ops_per_thread(2_000);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (cluster, stable, done) = (cluster.clone(), stable.clone(), Arc::clone(&done));
            thread::spawn(move || {
                let mut transport = cluster.transport();
                transport.set_interleave(r == 0);
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut reads = 0u64;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 200 {
                    let i = (reads * 7 + r) as usize % stable.len();
                    let got = c.get(&stable[i]).unwrap();
                    assert_eq!(got, Some(value(i as u64, 0, 40)), "stable key {i}");
                    reads += 1;
                }
                (reads, c.stats())
            })
        })
        .collect();
    let writer_handles: Vec<_> = (0..writers)
        .map(|w| {
            let cluster = cluster.clone();
            thread::spawn(move || {
                let mut c = open(&cluster, system_clock(), system_config());
                for n in 0..per_writer {
                    c.insert(&key(100_000 * (w + 1) + n), b"grow").unwrap();
                }
                c.stats().splits
            })
        })
        .collect();
    let splits: u64 = writer_handles.into_iter().map(|h| h.join().unwrap()).sum();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in readers {
        let (reads, stats) = r.join().unwrap();
        eprintln!(
            "reader: {reads} reads, {} refreshes, {} split waits",
            stats.dir_refreshes, stats.split_waits
        );
    }
    assert!(splits > 20, "{splits}");
}
