//! Round trips per operation, counted at the client's doorbell funnel: the
//! figures the protocol promises (see `race_store::client::protocol`).

mod common;

use common::*;
use race_store::hash::KeyHash;
use race_store::memory::LocalTransport;
use race_store::remote::TransportStats;
use race_store::Client;

fn delta<F: FnOnce(&mut Client<LocalTransport>)>(
    c: &mut Client<LocalTransport>,
    f: F,
) -> TransportStats {
    let before = c.stats().transport;
    f(c);
    c.stats().transport.since(&before)
}

/// Keys whose fingerprint matches no other key in `keys` nor each other
/// within the same table (so no extra block READs).
fn distinct_fp_keys(n: usize) -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    (0u64..)
        .map(key)
        .filter(|k| seen.insert(KeyHash::of(k).fingerprint()))
        .take(n)
        .collect()
}

#[test]
fn round_trips_per_operation() {
    // A table big enough to never split here, one node.
    let cluster = tiny_cluster(1, 512, 32 << 20, 8);
    let mut c = open(&cluster, manual_clock(), manual_config());
    let keys = distinct_fp_keys(40);
    // Warm up the allocator so that no block RPC hides in the figures.
    c.put(b"warm", b"up").unwrap();
    c.delete(b"warm").unwrap();

    for (i, k) in keys.iter().enumerate() {
        let miss = delta(&mut c, |c| assert_eq!(c.get(k).unwrap(), None));
        assert_eq!(miss.round_trips, 1, "get miss, no fingerprint match");
        let ins = delta(&mut c, |c| c.insert(k, &value(i as u64, 0, 30)).unwrap());
        assert_eq!(
            ins.round_trips, 3,
            "insert: WRITE+READ, tentative CAS+READ, commit CAS"
        );
        assert_eq!((ins.writes, ins.atomics), (1, 2));
        let hit = delta(&mut c, |c| {
            assert_eq!(c.get(k).unwrap(), Some(value(i as u64, 0, 30)))
        });
        assert_eq!(hit.round_trips, 2, "get hit: buckets, then block");
        assert_eq!(
            hit.bytes_read,
            2 * 128 + 64,
            "two combined buckets and one 64 B block"
        );
        let dup = delta(&mut c, |c| {
            assert_eq!(c.insert(k, b"x"), Err(race_store::Error::KeyExists))
        });
        assert_eq!(
            dup.round_trips, 2,
            "insert of a present key: WRITE+READ, block"
        );
        let upd = delta(&mut c, |c| c.update(k, &value(i as u64, 1, 30)).unwrap());
        assert_eq!(upd.round_trips, 3, "update: buckets, block, WRITE+CAS");
        let put = delta(&mut c, |c| c.put(k, &value(i as u64, 2, 30)).unwrap());
        assert_eq!(
            put.round_trips, 3,
            "put on a present key: WRITE+READ, block, CAS"
        );
    }
    for k in &keys {
        let del = delta(&mut c, |c| c.delete(k).unwrap());
        assert_eq!(del.round_trips, 3, "delete: buckets, block, CAS");
    }
}

#[test]
fn fingerprint_match_costs_one_more_round_trip() {
    // One group: every key's buckets cover the whole group.
    let cluster = tiny_cluster(1, 1, 1 << 20, 4);
    let mut c = open(&cluster, manual_clock(), manual_config());
    let first = key(0);
    let fp = KeyHash::of(&first).fingerprint();
    let twin = (1u64..)
        .map(key)
        .find(|k| KeyHash::of(k).fingerprint() == fp)
        .unwrap();
    c.insert(&first, b"first").unwrap();
    let ins = delta(&mut c, |c| c.insert(&twin, b"twin").unwrap());
    assert_eq!(
        ins.round_trips, 4,
        "WRITE+READ, the matching block, tentative CAS+READ, commit CAS"
    );
    let hit = delta(&mut c, |c| {
        assert_eq!(c.get(&twin).unwrap().as_deref(), Some(&b"twin"[..]))
    });
    assert_eq!(hit.round_trips, 2, "both matching blocks in one doorbell");
    assert_eq!(hit.reads, 2 + 2);
    assert_eq!(c.get(&first).unwrap().as_deref(), Some(&b"first"[..]));
}

#[test]
fn open_and_stale_cache_costs() {
    let cluster = tiny_cluster(1, 1, 16 << 20, 10);
    let mut a = open(&cluster, manual_clock(), manual_config());
    let opened = a.stats().transport;
    assert_eq!(
        opened.round_trips, 2,
        "superblock + FAA id, then the directory"
    );
    let mut b = open(&cluster, manual_clock(), manual_config());
    assert_ne!(a.id(), b.id());
    for i in 0..300 {
        a.insert(&key(i), b"v").unwrap();
    }
    assert!(a.stats().splits > 0);
    // b's cache is stale: a lookup detects it from the bucket headers and
    // re-reads the directory once, then costs 2 round trips again.
    let first = delta(&mut b, |b| {
        assert_eq!(b.get(&key(7)).unwrap().as_deref(), Some(&b"v"[..]))
    });
    assert!(first.round_trips > 2 && first.round_trips <= 6, "{first:?}");
    assert_eq!(b.stats().dir_refreshes, 2);
    let hit = delta(&mut b, |b| {
        assert_eq!(b.get(&key(7)).unwrap().as_deref(), Some(&b"v"[..]))
    });
    assert_eq!(hit.round_trips, 2);
}
