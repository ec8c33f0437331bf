//! loom models of the DCCache (kmod/src/dccache.rs): per-bucket seqlocks over
//! arrays of atomics, two bucket choices per GID.
#![cfg(krcore_loom)]

use krcore_kmod::{DcCache, Insert, Lookup};
use krcore_loom_tests::derive::{gid, target, version_of};
use loom::sync::Arc;
use loom::thread;

/// Invariant: a reader racing a writer that replaces an entry sees a miss,
/// the old entry, or the new one, never a mix of the two (no torn read).
#[test]
fn lookup_racing_replace_is_never_torn() {
    loom::model(|| {
        let cache = Arc::new(DcCache::new(8));
        cache.insert(target(1, 1), 1);
        let reader = {
            let cache = cache.clone();
            thread::spawn(move || match cache.lookup(&gid(1)) {
                Lookup::Hit(t) => {
                    let v = version_of(1, &t.target).expect("torn entry");
                    assert!(v == 1 || v == 2, "unexpected version {v}");
                    assert_eq!(t.epoch, v, "epoch and fields from one write");
                }
                _ => {}
            })
        };
        cache.insert(target(1, 2), 2);
        reader.join().unwrap();
        assert_eq!(cache.get(&gid(1)).map(|t| t.target), Some(target(1, 2)));
    });
}

/// Invariant: two writers inserting different targets into one bucket both
/// end up cached (the bucket has room), each entry whole.
#[test]
fn concurrent_inserts_into_one_bucket_both_land() {
    loom::model(|| {
        let cache = Arc::new(DcCache::new(8));
        let w = {
            let cache = cache.clone();
            thread::spawn(move || {
                assert!(matches!(cache.insert(target(2, 1), 1), Insert::Inserted));
            })
        };
        assert!(matches!(cache.insert(target(3, 1), 1), Insert::Inserted));
        w.join().unwrap();
        for k in [2, 3] {
            let t = cache.get(&gid(k)).expect("both inserts must land");
            assert_eq!(version_of(k, &t.target), Some(1));
        }
    });
}

/// Invariant: once `invalidate_all_older_than(e)` returns, no lookup returns
/// an entry older than `e`, even with an insert of an old epoch racing it.
#[test]
fn epoch_sweep_is_final_against_racing_old_insert() {
    loom::model(|| {
        let cache = Arc::new(DcCache::new(8));
        cache.insert(target(4, 1), 1);
        let inserter = {
            let cache = cache.clone();
            thread::spawn(move || {
                // An insert of an old epoch (a lookup that started before the
                // epoch change) may race the sweep.
                let _ = cache.insert(target(5, 1), 1);
            })
        };
        cache.invalidate_all_older_than(2);
        for k in [4, 5] {
            if let Some(t) = cache.get(&gid(k)) {
                assert!(
                    t.epoch >= 2,
                    "entry of epoch {} survived the sweep",
                    t.epoch
                );
            }
        }
        inserter.join().unwrap();
        for k in [4, 5] {
            if let Some(t) = cache.get(&gid(k)) {
                assert!(
                    t.epoch >= 2,
                    "entry of epoch {} inserted after the sweep",
                    t.epoch
                );
            }
        }
    });
}

/// Invariant: invalidate racing a reader: the reader sees the whole entry or
/// a miss; after both, the entry is gone.
#[test]
fn invalidate_racing_lookup() {
    loom::model(|| {
        let cache = Arc::new(DcCache::new(8));
        cache.insert(target(6, 3), 3);
        let reader = {
            let cache = cache.clone();
            thread::spawn(move || {
                if let Lookup::Hit(t) = cache.lookup(&gid(6)) {
                    assert_eq!(version_of(6, &t.target), Some(3), "torn entry");
                }
            })
        };
        assert!(cache.invalidate(&gid(6)));
        reader.join().unwrap();
        assert_eq!(cache.get(&gid(6)), None);
    });
}

/// Two model keys (from 1 up) whose bucket pairs in a two-bucket cache are
/// (0, 1) and (1, 0): inserting both takes the buckets in opposite orders.
fn crossed_pair(cache: &DcCache) -> (u8, u8) {
    let first = |k: u8| cache.buckets_for(&gid(k)).0;
    let a = (1..=255)
        .find(|&k| first(k) == 0)
        .expect("a key on bucket 0");
    let b = (1..=255)
        .find(|&k| first(k) == 1)
        .expect("a key on bucket 1");
    (a, b)
}

/// Invariant: writers take a GID's two buckets lowest index first, so two
/// inserts whose GIDs name the buckets in opposite orders never deadlock
/// (loom reports a deadlock), and both land whole.
#[test]
fn inserts_with_crossed_bucket_pairs_both_land() {
    loom::model(|| {
        let cache = Arc::new(DcCache::with_buckets(2, 1));
        let (a, b) = crossed_pair(&cache);
        let w = {
            let cache = cache.clone();
            thread::spawn(move || {
                assert!(matches!(cache.insert(target(a, 1), 1), Insert::Inserted));
            })
        };
        assert!(matches!(cache.insert(target(b, 1), 1), Insert::Inserted));
        w.join().unwrap();
        for k in [a, b] {
            let t = cache.get(&gid(k)).expect("both inserts must land");
            assert_eq!(version_of(k, &t.target), Some(1));
        }
    });
}

/// Invariant: an entry placed in its SECOND bucket (the first was fuller)
/// is seen whole or missed by a racing reader, never torn; a reader that
/// starts after the insert returned finds it; an invalidate racing a reader
/// leaves it gone.
#[test]
fn second_bucket_entry_racing_reader_and_invalidate() {
    loom::model(|| {
        let cache = Arc::new(DcCache::with_buckets(2, 1));
        let (a, _) = crossed_pair(&cache);
        // Another key on bucket 0 makes it the fuller one.
        let other = (1..=255u8)
            .find(|&k| k != a && cache.buckets_for(&gid(k)).0 == 0)
            .expect("a second key on bucket 0");
        cache.insert(target(other, 1), 1);
        let reader = {
            let cache = cache.clone();
            thread::spawn(move || {
                if let Lookup::Hit(t) = cache.lookup(&gid(a)) {
                    assert_eq!(version_of(a, &t.target), Some(2), "torn entry");
                }
            })
        };
        assert!(matches!(cache.insert(target(a, 2), 2), Insert::Inserted));
        assert_eq!(cache.get(&gid(a)).map(|t| t.target), Some(target(a, 2)));
        assert!(cache.invalidate(&gid(a)));
        reader.join().unwrap();
        assert_eq!(cache.get(&gid(a)), None);
        assert_eq!(cache.len(), 1);
    });
}
