//! Batched operations (`Client::batch`): the round trips they share, their
//! replies against a `HashMap` reference while splits run (every operation
//! kind, repeated keys in one batch), and a client that dies at every
//! doorbell of a batch.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::*;
use race_store::client::Op;
use race_store::memory::{ClusterConfig, LocalCluster};
use race_store::remote::{CrashPlan, Delayed, FaultInjector, TransportError};
use race_store::{Client, Error};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[test]
fn batch_into_refills_the_value_buffers_it_is_handed_back() {
    let cluster = LocalCluster::new(ClusterConfig::default()).unwrap();
    let mut c = open(&cluster, system_clock(), system_config());
    let keys: Vec<Vec<u8>> = (0..8).map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        c.insert(k, &value(i as u64, 0, 300)).unwrap();
    }
    let gets: Vec<Op<'_>> = keys.iter().map(|k| Op::Get(k)).collect();
    let mut out = Vec::new();
    c.batch_into(&gets, &mut out);
    let buffers: Vec<*const u8> = out
        .iter()
        .filter_map(|r| r.as_ref().ok()?.as_ref().map(|v| v.as_ptr()))
        .collect();
    assert_eq!(buffers.len(), 8);
    // Shorter values now, and a miss: the old, longer contents never show.
    for (i, k) in keys.iter().enumerate().skip(1) {
        c.update(k, &value(i as u64, 1, 20)).unwrap();
    }
    c.delete(&keys[0]).unwrap();
    c.batch_into(&gets, &mut out);
    assert_eq!(out[0], Ok(None));
    for (i, reply) in out.iter().enumerate().skip(1) {
        assert_eq!(reply, &Ok(Some(value(i as u64, 1, 20))), "key {i}");
        let at = reply
            .as_ref()
            .ok()
            .and_then(|v| v.as_ref())
            .map(|v| v.as_ptr());
        assert!(
            at.is_some_and(|p| buffers.contains(&p)),
            "reply {i} in a buffer of the previous batch"
        );
    }
}

#[test]
fn a_batch_shares_its_round_trips() {
    let cluster = LocalCluster::new(ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    })
    .unwrap();
    let mut c = open(&cluster, system_clock(), system_config());
    let keys: Vec<Vec<u8>> = (0..16).map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        c.insert(k, &value(i as u64, 0, 40)).unwrap();
    }
    let rts = |c: &Client<_>| c.stats().transport.round_trips;

    let before = rts(&c);
    let gets: Vec<Op<'_>> = keys.iter().map(|k| Op::Get(k)).collect();
    let r = c.batch(&gets);
    assert_eq!(rts(&c) - before, 2, "16 hits: buckets, then blocks");
    for (i, reply) in r.iter().enumerate() {
        assert_eq!(reply, &Ok(Some(value(i as u64, 0, 40))), "key {i}");
    }

    let new: Vec<Vec<u8>> = (0..16).map(|i| value(i, 1, 40)).collect();
    let before = rts(&c);
    let updates: Vec<Op<'_>> = keys
        .iter()
        .zip(&new)
        .map(|(k, v)| Op::Update(k, v))
        .collect();
    let r = c.batch(&updates);
    assert_eq!(rts(&c) - before, 3, "buckets, blocks, WRITE + CAS");
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");
    assert_eq!(c.stats().retries, 0);
    for (k, v) in keys.iter().zip(&new) {
        assert_eq!(c.get(k).unwrap().as_ref(), Some(v));
    }

    // Misses cost one round trip; bad input is refused alone.
    let absent = key(1000);
    let before = rts(&c);
    let r = c.batch(&[
        Op::Get(&absent),
        Op::Update(&absent, b"x"),
        Op::Delete(&absent),
        Op::Get(b""),
        Op::Get(&keys[3]),
    ]);
    assert_eq!(r[0], Ok(None));
    assert_eq!(r[1], Err(Error::NotFound));
    // Same key: the delete is a second wave.
    assert_eq!(r[2], Err(Error::NotFound));
    assert_eq!(r[3], Err(Error::EmptyKey));
    assert_eq!(r[4], Ok(Some(new[3].clone())));
    // Wave 1: buckets, blocks; wave 2: buckets (and blocks if the absent
    // key's fingerprint matches another key's slot).
    let n = rts(&c) - before;
    assert!((3..=4).contains(&n), "{n} round trips");

    let before = rts(&c);
    let deletes: Vec<Op<'_>> = keys.iter().map(|k| Op::Delete(k)).collect();
    let r = c.batch(&deletes);
    assert_eq!(rts(&c) - before, 3);
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");

    // Inserts of absent keys: their blocks with the buckets, then the
    // tentative CASes on empty slots with the re-reads (no other key's
    // fingerprint in their buckets: 16 keys in a table of thousands of
    // buckets), then the commits; puts of absent keys likewise, their
    // blocks written with the CASes.
    let fresh: Vec<Vec<u8>> = (100..116).map(key).collect();
    let before = rts(&c);
    let inserts: Vec<Op<'_>> = fresh
        .iter()
        .zip(&new)
        .map(|(k, v)| Op::Insert(k, v))
        .collect();
    let r = c.batch(&inserts);
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");
    assert_eq!(
        rts(&c) - before,
        3,
        "16 inserts: WRITE + buckets, CAS + re-read, commit"
    );
    let r = c.batch(&inserts);
    assert!(r.iter().all(|r| r == &Err(Error::KeyExists)), "{r:?}");
    let before = rts(&c);
    let puts: Vec<Op<'_>> = keys.iter().zip(&new).map(|(k, v)| Op::Put(k, v)).collect();
    let r = c.batch(&puts);
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");
    assert_eq!(rts(&c) - before, 3, "16 puts of absent keys");
    for (k, v) in fresh.iter().chain(&keys).zip(new.iter().chain(&new)) {
        assert_eq!(c.get(k).unwrap().as_ref(), Some(v));
    }
    let deletes: Vec<Op<'_>> = keys.iter().chain(&fresh).map(|k| Op::Delete(k)).collect();
    let r = c.batch(&deletes);
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");
    let r = c.batch(&gets);
    assert!(r.iter().all(|r| r == &Ok(None)), "{r:?}");
    let check = c.check_table().unwrap();
    assert!(
        check.problems.is_empty() && check.pairs.is_empty(),
        "{check:?}"
    );
}

/// Threads batch-insert and batch-put the same keys at once (each batch
/// holding every key once, in a thread's own order): per key exactly one
/// insert succeeds and every other one finds the key; the table ends with
/// one copy of each key, holding the value of its last write (a put of some
/// thread, or the winning insert if no put came after it).
#[test]
fn racing_batched_inserts_settle_to_one_copy_per_key() {
    let cluster = tiny_cluster(2, 2, 64 << 20, 14);
    let threads = 4u64;
    let keys: Vec<Vec<u8>> = (0..120).map(key).collect();
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            // Round trips of 100 us: the threads' rounds overlap.
            let transport = Delayed::new(cluster.transport(), Duration::from_micros(100));
            let barrier = barrier.clone();
            let keys = keys.clone();
            thread::spawn(move || {
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut rng = SmallRng::seed_from_u64(t);
                let mut order: Vec<usize> = (0..keys.len()).collect();
                let mut won = Vec::new();
                for round in 0..2u64 {
                    // Every insert is over before the first put.
                    barrier.wait();
                    for j in (1..order.len()).rev() {
                        order.swap(j, rng.gen_range(0..=j));
                    }
                    let vals: Vec<Vec<u8>> = order
                        .iter()
                        .map(|&i| value(i as u64, t * 10 + round, 24))
                        .collect();
                    for (chunk, vchunk) in order.chunks(16).zip(vals.chunks(16)) {
                        let ops: Vec<Op<'_>> = chunk
                            .iter()
                            .zip(vchunk)
                            .map(|(&i, v)| match round {
                                0 => Op::Insert(&keys[i], v),
                                _ => Op::Put(&keys[i], v),
                            })
                            .collect();
                        for (&i, r) in chunk.iter().zip(c.batch(&ops)) {
                            match (round, r) {
                                (0, Ok(None)) => won.push(i),
                                (0, Err(Error::KeyExists)) | (1, Ok(None)) => {}
                                (_, other) => panic!("thread {t} key {i}: {other:?}"),
                            }
                        }
                    }
                }
                (won, c.stats().dups_removed, c.stats().cas_failures)
            })
        })
        .collect();
    let mut winners = vec![0u32; keys.len()];
    let (mut dups, mut lost) = (0, 0);
    for h in handles {
        let (won, removed, cas_failures) = h.join().unwrap();
        (dups, lost) = (dups + removed, lost + cas_failures);
        for i in won {
            winners[i] += 1;
        }
    }
    eprintln!("racing inserts: {lost} CASes lost, {dups} duplicate copies withdrawn");
    assert!(lost > 0, "the inserts raced for slots");
    assert!(winners.iter().all(|&w| w == 1), "{winners:?}");
    let mut checker = open(&cluster, system_clock(), system_config());
    let check = checker.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.duplicates, check.frozen_slots), (0, 0));
    assert_eq!(check.pairs.len(), keys.len());
    for (k, v) in &check.pairs {
        let i = keys.iter().position(|x| x == k).expect("a key of the test") as u64;
        let put_by = (0..threads).any(|t| *v == value(i, t * 10 + 1, 24));
        assert!(put_by, "key {i}: the last write is some thread's put");
    }
}

#[test]
fn operations_on_one_key_take_effect_in_submission_order() {
    let cluster = LocalCluster::new(ClusterConfig::default()).unwrap();
    let mut c = open(&cluster, system_clock(), system_config());
    let k = key(7);
    let r = c.batch(&[
        Op::Get(&k),
        Op::Insert(&k, b"one"),
        Op::Insert(&k, b"two"),
        Op::Get(&k),
        Op::Update(&k, b"three"),
        Op::Put(&k, b"four"),
        Op::Get(&k),
        Op::Delete(&k),
        Op::Get(&k),
        Op::Put(&k, b"five"),
    ]);
    let want: Vec<Result<Option<Vec<u8>>, Error>> = vec![
        Ok(None),
        Ok(None),
        Err(Error::KeyExists),
        Ok(Some(b"one".to_vec())),
        Ok(None),
        Ok(None),
        Ok(Some(b"four".to_vec())),
        Ok(None),
        Ok(None),
        Ok(None),
    ];
    assert_eq!(r, want);
    assert_eq!(c.get(&k).unwrap(), Some(b"five".to_vec()));
}

#[test]
fn gets_of_one_key_in_a_row_share_one_read() {
    let cluster = LocalCluster::new(ClusterConfig::default()).unwrap();
    let mut c = open(&cluster, system_clock(), system_config());
    let (k, other) = (key(7), key(8));
    c.put(&other, b"o").unwrap();
    let before = c.stats().transport.round_trips;
    let r = c.batch(&[Op::Get(&k), Op::Get(&other), Op::Get(&k), Op::Get(&k)]);
    assert_eq!(
        r,
        vec![Ok(None), Ok(Some(b"o".to_vec())), Ok(None), Ok(None)]
    );
    // One wave: the bucket READs, then the KV block READs.
    assert_eq!(c.stats().transport.round_trips - before, 2);
    let r = c.batch(&[
        Op::Put(&k, b"x"),
        Op::Get(&k),
        Op::Get(&k),
        Op::Get(&other),
        Op::Get(&k),
        Op::Update(&k, b"y"),
        Op::Get(&k),
        Op::Get(&k),
        Op::Delete(&other),
        Op::Get(&other),
    ]);
    let x = Ok(Some(b"x".to_vec()));
    let y = Ok(Some(b"y".to_vec()));
    assert_eq!(
        r,
        vec![
            Ok(None),
            x.clone(),
            x.clone(),
            Ok(Some(b"o".to_vec())),
            x,
            Ok(None),
            y.clone(),
            y,
            Ok(None),
            Ok(None),
        ]
    );
}

#[test]
fn a_get_after_a_write_of_its_key_reads_what_the_write_did() {
    let cluster = LocalCluster::new(ClusterConfig::default()).unwrap();
    let mut c = open(&cluster, system_clock(), system_config());
    let (k, old, absent) = (key(1), key(2), key(3));
    c.put(&old, b"before").unwrap();
    let before = c.stats().transport.round_trips;
    let r = c.batch(&[Op::Put(&k, b"x"), Op::Get(&k)]);
    assert_eq!(r, vec![Ok(None), Ok(Some(b"x".to_vec()))]);
    // The put's rounds only: no wave for the get.
    assert!(c.stats().transport.round_trips - before <= 3);
    let r = c.batch(&[
        Op::Update(&absent, b"y"),
        Op::Get(&absent),
        // The insert fails (the key is there): the get reads it.
        Op::Insert(&old, b"new"),
        Op::Get(&old),
        Op::Get(&old),
        Op::Delete(&k),
        Op::Get(&k),
    ]);
    assert_eq!(
        r,
        vec![
            Err(Error::NotFound),
            Ok(None),
            Err(Error::KeyExists),
            Ok(Some(b"before".to_vec())),
            Ok(Some(b"before".to_vec())),
            Ok(None),
            Ok(None),
        ]
    );
    assert_eq!(c.get(&k).unwrap(), None);
    assert_eq!(c.get(&old).unwrap(), Some(b"before".to_vec()));
}

/// Random batches (1 to 24 operations of every kind, keys drawn from a
/// small range so that batches repeat keys) from several threads with
/// disjoint keys, on a table that starts as one tiny subtable: every reply
/// exactly as the reference says, applied in submission order; at the end
/// the table holds exactly the union of the references.
#[test]
fn batches_exact_against_reference_with_splits() {
    let cluster = tiny_cluster(2, 2, 64 << 20, 14);
    let threads = 4u64;
    let batches = std::env::var("RACE_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(300, |n| n / 10);
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let cluster = cluster.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let mut transport = cluster.transport();
                transport.set_interleave(t % 2 == 0);
                // Two doorbells in flight, each executed only when
                // completed: large waves run as two overlapping groups.
                transport.set_in_flight(1 + (t as usize % 2));
                let mut c = Client::open(transport, system_clock(), system_config()).unwrap();
                let mut rng = SmallRng::seed_from_u64(0xBA7C_0000 + t);
                let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                barrier.wait();
                for b in 0..batches {
                    let n = rng.gen_range(1..=24);
                    // One batch in four on 6 keys: runs of the same key
                    // (combined gets and writes, gets reading a write).
                    let span = if b % 4 == 3 { 6 } else { 200 };
                    let items: Vec<(u32, Vec<u8>, Vec<u8>)> = (0..n)
                        .map(|j| {
                            let k = key(t * 1_000_000 + rng.gen_range(0..span));
                            let v = value(t, b * 100 + j, rng.gen_range(1..200));
                            (rng.gen_range(0..100), k, v)
                        })
                        .collect();
                    let ops: Vec<Op<'_>> = items
                        .iter()
                        .map(|(p, k, v)| match p {
                            0..=34 => Op::Get(k),
                            35..=49 => Op::Insert(k, v),
                            50..=64 => Op::Put(k, v),
                            65..=84 => Op::Update(k, v),
                            _ => Op::Delete(k),
                        })
                        .collect();
                    let replies = c.batch(&ops);
                    assert_eq!(replies.len(), ops.len());
                    for (op, reply) in ops.iter().zip(replies) {
                        let k = op.key().to_vec();
                        let cur = model.get(&k).cloned();
                        let want = match *op {
                            Op::Get(_) => Ok(cur),
                            Op::Insert(_, v) => match cur {
                                Some(_) => Err(Error::KeyExists),
                                None => {
                                    model.insert(k, v.to_vec());
                                    Ok(None)
                                }
                            },
                            Op::Put(_, v) => {
                                model.insert(k, v.to_vec());
                                Ok(None)
                            }
                            Op::Update(_, v) => match cur {
                                Some(_) => {
                                    model.insert(k, v.to_vec());
                                    Ok(None)
                                }
                                None => Err(Error::NotFound),
                            },
                            Op::Delete(_) => match model.remove(&k) {
                                Some(_) => Ok(None),
                                None => Err(Error::NotFound),
                            },
                        };
                        assert_eq!(reply, want, "thread {t} batch {b}: {op:?}");
                    }
                }
                (model, c.stats())
            })
        })
        .collect();
    let mut all = HashMap::new();
    let (mut splits, mut retries, mut overlapped) = (0, 0, 0);
    for h in handles {
        let (model, stats) = h.join().unwrap();
        splits += stats.splits;
        retries += stats.retries;
        overlapped += stats.overlapped_waves;
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
        "batches: {} keys, {splits} splits, {retries} retries, {overlapped} overlapped waves",
        expect.len()
    );
    assert!(splits >= 10, "splits ran during the batches: {splits}");
    assert!(overlapped > 0, "no wave ran as two overlapping groups");
}

/// A batch of gets, updates, deletes, a put and an insert whose client dies
/// at every doorbell (with none, one or all of that doorbell's ops
/// executed): each operation is answered as done or failed with a
/// transport error (`OutcomeUnknown` once its CAS may have run), and a
/// survivor finds every key old or new, and a sound table.
#[test]
fn a_client_dying_at_every_doorbell_of_a_batch() {
    let clock = manual_clock();
    let fill = |c: &mut Client<_>| {
        for i in 0..20 {
            c.insert(&key(i), &value(i, 0, 24)).unwrap();
        }
    };
    let batch_values: Vec<Vec<u8>> = (0..20).map(|i| value(i, 9, 24)).collect();
    let keys: Vec<Vec<u8>> = (0..30).map(key).collect();
    fn ops<'a>(keys: &'a [Vec<u8>], vals: &'a [Vec<u8>]) -> Vec<Op<'a>> {
        let mut ops = Vec::new();
        for i in 0..6 {
            ops.push(Op::Update(&keys[i], &vals[i]));
        }
        ops.extend(keys[6..10].iter().map(|k| Op::Delete(k)));
        ops.extend(keys[10..14].iter().map(|k| Op::Get(k)));
        ops.push(Op::Put(&keys[14], &vals[14]));
        ops.push(Op::Insert(&keys[25], &vals[15]));
        // A second wave.
        ops.push(Op::Update(&keys[0], &vals[16]));
        ops
    }
    // One doorbell in flight, then two: the first wave (16 operations)
    // runs as two overlapping groups, and the client dies at every
    // doorbell of either.
    let in_flight = |cluster: &LocalCluster, n: usize| {
        let mut t = cluster.transport();
        t.set_in_flight(n);
        t
    };
    for n in [1, 2] {
        let cluster = tiny_cluster(2, 4, 4 << 20, 6);
        let mut probe = Client::open(
            FaultInjector::new(in_flight(&cluster, n), None),
            clock.clone(),
            manual_config(),
        )
        .unwrap();
        fill(&mut probe);
        let before = probe.transport().doorbells();
        let r = probe.batch(&ops(&keys, &batch_values));
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        let total = probe.transport().doorbells() - before;
        assert_eq!(probe.stats().overlapped_waves, u64::from(n == 2));
        // Buckets (with the insert's block), blocks, CASes (with the insert's
        // re-read): the second update of key 0 combines into the first.
        assert!(total >= 3, "{total} doorbells");
        for k in 1..=total {
            for prefix in [0, 1, usize::MAX] {
                let label = format!("die at doorbell {k}/{total}, prefix {prefix}");
                let cluster = tiny_cluster(2, 4, 4 << 20, 6);
                let mut c = Client::open(
                    FaultInjector::new(in_flight(&cluster, n), None),
                    clock.clone(),
                    manual_config(),
                )
                .unwrap();
                fill(&mut c);
                c.transport_mut().set_plan(Some(CrashPlan {
                    at_doorbell: k,
                    executed_prefix: prefix,
                }));
                let batch = ops(&keys, &batch_values);
                let replies = c.batch(&batch);
                for (op, r) in batch.iter().zip(&replies) {
                    let ok = match r {
                        Ok(_) => true,
                        Err(Error::Transport(TransportError::Disconnected)) => true,
                        Err(Error::OutcomeUnknown {
                            op: name,
                            source: TransportError::Disconnected,
                        }) => *name == op.name() && !matches!(op, Op::Get(_)),
                        Err(_) => false,
                    };
                    assert!(ok, "{label}: {op:?} -> {r:?}");
                }
                drop(c);
                clock.advance(2 * manual_config().lease_ticks);
                let mut s = open(&cluster, clock.clone(), manual_config());
                for i in 0..20u64 {
                    let got = s.get(&key(i)).unwrap();
                    let old = Some(value(i, 0, 24));
                    let ok = match i {
                        0 => {
                            got == old
                                || got == Some(value(0, 9, 24))
                                || got == Some(value(16, 9, 24))
                        }
                        1..=5 | 14 => got == old || got == Some(value(i, 9, 24)),
                        6..=9 => got.is_none() || got == old,
                        _ => got == old,
                    };
                    assert!(ok, "{label}: key {i} = {got:?}");
                }
                let k25 = s.get(&key(25)).unwrap();
                assert!(
                    k25.is_none() || k25 == Some(value(15, 9, 24)),
                    "{label}: {k25:?}"
                );
                s.put(&key(0), b"after").unwrap();
                s.put(&key(25), b"after").unwrap();
                let check = s.check_table().unwrap();
                assert!(
                    check.problems.is_empty() && check.duplicates == 0,
                    "{label}: {check:?}"
                );
            }
        }
    }
}

/// Batched puts of new keys over two memory nodes take their fast path:
/// each block is placed on its slot's node (a grant of that node is asked
/// for before another node's room is used), so none falls back to the
/// single operation for a block on the wrong node. Before, a client that
/// had room on one node placed every block there, and half the puts
/// (those whose slots were on the other node) were retried as single
/// operations: 150,096 retries for 300,000 puts, 328,168 round trips
/// against 28,144 now (in process, release).
#[test]
fn batched_puts_of_new_keys_place_blocks_on_their_slots_nodes() {
    let cluster = race_store::memory::LocalCluster::new(race_store::memory::ClusterConfig {
        nodes: 2,
        node_bytes: 256 << 20,
        table: race_store::memory::TableConfig::default().presized_for(40_000, 2),
    })
    .unwrap();
    // A manual clock: no attempt expires however slow the machine, so
    // every retry counted is the placement's (or a lost CAS).
    let mut c = open(&cluster, manual_clock(), manual_config());
    let keys = 20_000u64;
    for chunk in 0..keys / 64 {
        let ks: Vec<Vec<u8>> = (0..64).map(|j| key(chunk * 64 + j)).collect();
        let vs: Vec<Vec<u8>> = (0..64).map(|j| value(chunk * 64 + j, 0, 500)).collect();
        let ops: Vec<race_store::client::Op<'_>> = ks
            .iter()
            .zip(&vs)
            .map(|(k, v)| race_store::client::Op::Put(k, v))
            .collect();
        for r in c.batch(&ops) {
            r.unwrap();
        }
    }
    let s = c.stats();
    assert!(
        s.retries < keys / 100,
        "{} retries for {keys} puts",
        s.retries
    );
    let heaps: Vec<u64> = cluster.stats().iter().map(|n| n.heap_used).collect();
    assert!(
        heaps[0] < 2 * heaps[1] && heaps[1] < 2 * heaps[0],
        "the data spreads: {heaps:?}"
    );
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty() && check.pairs.len() as u64 == keys - keys % 64);
}

/// Keys in table order (as a dump lists them: neighbours share buckets)
/// put in batches into a table of the same geometry: writes of one wave
/// that chose empty slots of the same buckets take different slots
/// instead of losing their CASes to each other, also when the wave runs as
/// two overlapped groups (two doorbells in flight). Before, 9,096 of
/// 20,000 such puts lost their CAS and were retried (with the lost-CAS
/// back-off: a deployed `race-kv load` of 300,000 pairs took 371 s, now
/// 2.1 s); with claims per group only, 396 of 20,000 did. The writer is
/// alone: every CAS it loses is lost to itself.
#[test]
fn batched_puts_in_table_order_take_distinct_empty_slots() {
    let table = race_store::memory::TableConfig::default().presized_for(20_000, 1);
    let new_cluster = || {
        race_store::memory::LocalCluster::new(race_store::memory::ClusterConfig {
            nodes: 1,
            node_bytes: 256 << 20,
            table,
        })
        .unwrap()
    };
    let first = new_cluster();
    let mut c = open(&first, manual_clock(), manual_config());
    for i in 0..10_000u64 {
        c.insert(&key(i), &value(i, 0, 100)).unwrap();
    }
    let mut pairs = Vec::new();
    assert!(c
        .scan(|k, v| {
            pairs.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap()
        .complete());
    for in_flight in [1, 2] {
        let second = new_cluster();
        let mut t = second.transport();
        t.set_in_flight(in_flight);
        let mut d = Client::open(t, manual_clock(), manual_config()).unwrap();
        for chunk in pairs.chunks(64) {
            let ops: Vec<Op<'_>> = chunk.iter().map(|(k, v)| Op::Put(k, v)).collect();
            for r in d.batch(&ops) {
                r.unwrap();
            }
        }
        let s = d.stats();
        assert_eq!(
            s.cas_failures,
            0,
            "{in_flight} in flight: lost CASes for {} puts",
            pairs.len()
        );
        assert_eq!(s.overlapped_waves > 0, in_flight == 2);
        let check = d.check_table().unwrap();
        assert!(check.problems.is_empty());
        assert_eq!(check.pairs.len(), pairs.len());
    }
}
