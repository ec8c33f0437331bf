//! loom models of the RACE protocol: the real [`race_store::Client`] over
//! in-process memory nodes whose every 8-byte word is a loom atomic (the
//! `sync` shim of race-store), so one-sided READs, WRITEs and CASes of two
//! clients interleave word by word.
//!
//! Setup (writes before the threads exist) runs once per execution outside
//! any race; each model then races two operations and checks the invariant
//! it protects. The clock is a counter only the models advance (plus the
//! clients' backoff), read without loom synchronization: loom runs one
//! thread at a time, so it behaves sequentially.
#![cfg(krcore_loom)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use loom::thread;
use race_store::clock::Clock;
use race_store::hash::KeyHash;
use race_store::layout::subtable::SubtableGeometry;
use race_store::layout::table::node0_heap_start;
use race_store::memory::{ClusterConfig, LocalCluster, LocalTransport, TableConfig};
use race_store::{Client, ClientConfig, Error};

/// A clock the model controls; a backoff yields to loom's scheduler.
#[derive(Debug, Default)]
struct ModelClock(AtomicU64);

impl ModelClock {
    fn advance(&self, ticks: u64) {
        self.0.fetch_add(ticks, Ordering::SeqCst);
    }
}

impl Clock for ModelClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn backoff(&self, _attempt: u32) {
        self.0.fetch_add(1, Ordering::SeqCst);
        thread::yield_now();
    }

    fn pause(&self, ticks: u64) {
        self.0.fetch_add(ticks, Ordering::SeqCst);
        thread::yield_now();
    }
}

/// `loom::model` with room for the client's many word accesses per
/// operation (every word of a 128-byte bucket READ is a loom atomic).
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b.check(f);
}

const MAX_OP: u64 = 100;
const GRACE: u64 = 250;

fn config() -> ClientConfig {
    ClientConfig {
        max_op_ticks: MAX_OP,
        grace_ticks: GRACE,
        lease_ticks: 1_000_000,
        coarse_block_bytes: 256,
        ..ClientConfig::default()
    }
}

/// One memory node with the smallest table: a single subtable.
fn cluster() -> LocalCluster {
    let geometry = SubtableGeometry::new(1).unwrap();
    // The directory area, one subtable, and room for a few KV blocks.
    let node_bytes = node0_heap_start(0).unwrap() + geometry.bytes() + 1024;
    LocalCluster::new(ClusterConfig {
        nodes: 1,
        node_bytes,
        table: TableConfig {
            geometry,
            initial_global_depth: 0,
            max_global_depth: 0,
        },
    })
    .unwrap()
}

fn client(c: &LocalCluster, clock: &Arc<ModelClock>) -> Client<LocalTransport> {
    let clock: Arc<dyn Clock> = clock.clone();
    Client::open(c.transport(), clock, config()).unwrap()
}

/// Keys `k`, `z`: `k`'s two candidate buckets differ, and `z`'s first
/// candidate is `k`'s first (an empty table puts `z` there).
fn keys_sharing_first_bucket() -> (Vec<u8>, Vec<u8>) {
    let g = SubtableGeometry::new(1).unwrap();
    let locs = |key: &[u8]| KeyHash::of(key).bucket_locs(g);
    let k = (0..1000)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| {
            let [l1, l2] = locs(k);
            l1 != l2
        })
        .expect("a key with two different buckets");
    let z = (0..1000)
        .map(|i| format!("z{i}").into_bytes())
        .find(|z| locs(z)[0] == locs(&k)[0])
        .expect("a key sharing the first bucket");
    (k, z)
}

/// Invariant: two clients inserting one key at once leave exactly one copy
/// once both inserts settle (each placed a tentative copy, and one of them
/// committed); exactly one insert succeeds and its value is the one read.
///
/// Identical views make both inserters pick the same slot (a CAS decides).
/// So the key `k` has two different candidate buckets and another key `z`
/// sits in the first: `a`, seeing `z`, picks the second (less loaded);
/// `b` deletes `z` first and then picks the first. Both CASes can succeed,
/// and only settling leaves one copy.
#[test]
fn racing_inserts_of_one_key_leave_one_copy() {
    model(|| {
        let c = cluster();
        let clock = Arc::new(ModelClock::default());
        let (mut a, mut b) = (client(&c, &clock), client(&c, &clock));
        let (k, z) = keys_sharing_first_bucket();
        a.insert(&z, b"zz").unwrap();
        let t = {
            let (k, z) = (k.clone(), z.clone());
            thread::spawn(move || {
                b.delete(&z).unwrap();
                let r = b.insert(&k, b"from-b");
                (r, b)
            })
        };
        let ra = a.insert(&k, b"from-a");
        let (rb, mut b) = t.join().unwrap();
        let winner: &[u8] = match (&ra, &rb) {
            (Ok(()), Err(Error::KeyExists)) => b"from-a",
            (Err(Error::KeyExists), Ok(())) => b"from-b",
            other => panic!("exactly one insert must win: {other:?}"),
        };
        assert_eq!(a.get(&k).unwrap().as_deref(), Some(winner));
        assert_eq!(b.get(&k).unwrap().as_deref(), Some(winner));
        let report = a.check_table().unwrap();
        assert_eq!(report.duplicates, 0, "duplicate key visible: {report:?}");
        assert_eq!(report.tentative_slots, 0, "a copy left: {report:?}");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    });
}

/// Inserts `k` = `v` with `a`, then plants a second committed copy of its
/// slot word in the neighbouring slot of the same bucket (as an inserter
/// that died between its CAS and its duplicate removal left it before
/// copies were placed tentative: a table written then still has them).
fn insert_with_leftover_duplicate(c: &LocalCluster, a: &mut Client<LocalTransport>) {
    let node = c.node(0).unwrap();
    let base = node0_heap_start(0).unwrap();
    let len = SubtableGeometry::new(1).unwrap().bytes() as usize;
    let words = |b: Vec<u8>| -> Vec<u64> {
        b.chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect()
    };
    let before = words(node.read(base, len).unwrap());
    a.insert(b"k", b"v1").unwrap();
    let after = words(node.read(base, len).unwrap());
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    let [i] = changed[..] else {
        panic!("an insert into an empty table changes one slot: {changed:?}");
    };
    // Word 0 of a bucket is its header, words 1..=7 its slots.
    let j = if i % 8 < 7 { i + 1 } else { i - 1 };
    assert_eq!(after[j], 0, "the neighbouring slot is empty");
    let old = node.cas(base + 8 * j as u64, 0, after[i]).unwrap();
    assert_eq!(old, 0);
}

/// Invariant: with a leftover duplicate copy of the key in the table, a
/// reader racing an update and then a delete returns the old value, the new
/// one or nothing, never a value older than one it knows was replaced (no
/// stale read): once the update returned, never the old value; after it
/// read the new value or nothing, never the old value again. The update
/// replaces the lowest copy; the delete removes the other copies first
/// (highest address first), then the lowest, so no copy surfaces.
#[test]
fn reads_racing_update_and_delete_are_never_stale() {
    model(|| {
        let c = cluster();
        let clock = Arc::new(ModelClock::default());
        let (mut a, mut b) = (client(&c, &clock), client(&c, &clock));
        insert_with_leftover_duplicate(&c, &mut a);
        let done = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let t = {
            let done = done.clone();
            thread::spawn(move || {
                // The key goes v1 -> v2 -> absent.
                let rank = |r: &Option<Vec<u8>>| match r.as_deref() {
                    Some(b"v1") => 0,
                    Some(b"v2") => 1,
                    None => 2,
                    Some(other) => panic!("read a value never written: {other:?}"),
                };
                let after = done.load(Ordering::SeqCst);
                let first = rank(&b.get(b"k").unwrap());
                assert!(!after || first >= 1, "stale read after the update returned");
                let second = rank(&b.get(b"k").unwrap());
                assert!(
                    second >= first,
                    "a later read went back: {first} then {second}"
                );
            })
        };
        a.update(b"k", b"v2").unwrap();
        done.store(true, Ordering::SeqCst);
        a.delete(b"k").unwrap();
        t.join().unwrap();
        assert_eq!(
            a.get(b"k").unwrap(),
            None,
            "a copy surfaced after the delete"
        );
        let report = a.check_table().unwrap();
        assert_eq!(report.duplicates, 0);
    });
}

/// The reclamation race: `a` unlinks the block of `k` (update), lets
/// `ticks` pass, and inserts another key of the same size class, which
/// reuses that block if its grace period has passed. `b` reads `k`
/// meanwhile.
fn reclamation_race(ticks: u64) {
    model(move || {
        let c = cluster();
        let clock = Arc::new(ModelClock::default());
        let (mut a, mut b) = (client(&c, &clock), client(&c, &clock));
        a.insert(b"k", b"v1").unwrap();
        let t = thread::spawn(move || {
            let r = b.get(b"k").unwrap();
            assert!(
                matches!(r.as_deref(), Some(b"v1") | Some(b"v2")),
                "reader saw {r:?}: a reused block behind a live slot"
            );
            assert_eq!(b.stats().bad_blocks, 0, "reader read a reused block");
        });
        a.update(b"k", b"v2").unwrap();
        clock.advance(ticks);
        a.insert(b"x", b"v3").unwrap();
        t.join().unwrap();
        if ticks > GRACE {
            // The race above really had the block reused.
            let mem = a.stats().kv_memory;
            assert_eq!(mem.quarantined_bytes, 0, "the grace period passed: {mem:?}");
        }
    });
}

/// Invariant (reclamation, the grace period): a block unlinked less than
/// `grace_ticks` ago is not reused, so a reader that saw its slot reads
/// the old value, never another key's block.
#[test]
fn a_block_is_not_reused_within_its_grace_period() {
    reclamation_race(0);
}

/// Invariant (reclamation, the reader's deadline): once the grace period
/// has passed and the block is reused, a reader whose attempt started
/// before the unlink is past its `max_op_ticks` deadline and restarts
/// instead of using what it read: it never returns "absent" from another
/// key's block behind its slot, and never reads a reused block.
#[test]
fn a_reader_never_uses_a_block_reused_after_its_grace_period() {
    reclamation_race(GRACE + 1);
}
