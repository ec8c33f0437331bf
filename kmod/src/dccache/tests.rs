//! Deterministic, single-threaded tests of the DCCache; the multi-threaded
//! stress test is `kmod/tests/dccache_stress.rs`.

use super::*;
use std::collections::HashMap;

fn gid(i: u64) -> Gid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[8..].copy_from_slice(&(!i).to_be_bytes());
    Gid(b)
}

fn target(i: u64, dct_num: u32) -> DcTarget {
    DcTarget {
        gid: gid(i),
        dct_num,
        dc_key: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

fn cached(i: u64, dct_num: u32, epoch: MetaEpoch) -> CachedTarget {
    CachedTarget {
        target: target(i, dct_num),
        epoch,
    }
}

#[test]
fn insert_get_replace_invalidate() {
    let c = DcCache::new(64);
    assert!(c.is_empty());
    assert_eq!(c.lookup(&gid(1)), Lookup::Miss);
    assert_eq!(c.insert(target(1, 10), 3), Insert::Inserted);
    assert_eq!(c.lookup(&gid(1)), Lookup::Hit(cached(1, 10, 3)));
    assert_eq!(c.get(&gid(2)), None);
    // Same epoch refreshes, newer epoch replaces.
    assert_eq!(
        c.insert(target(1, 11), 3),
        Insert::Replaced {
            previous: cached(1, 10, 3)
        }
    );
    assert_eq!(
        c.insert(target(1, 12), 4),
        Insert::Replaced {
            previous: cached(1, 11, 3)
        }
    );
    assert_eq!(c.get(&gid(1)), Some(cached(1, 12, 4)));
    assert_eq!(c.len(), 1);
    assert!(c.invalidate(&gid(1)));
    assert!(!c.invalidate(&gid(1)));
    assert_eq!(c.get(&gid(1)), None);
    assert!(c.is_empty());
}

#[test]
fn an_older_epoch_never_replaces_a_newer_one() {
    let c = DcCache::new(8);
    c.insert(target(5, 1), 7);
    assert_eq!(c.insert(target(5, 2), 6), Insert::Stale { newest: 7 });
    assert_eq!(c.get(&gid(5)), Some(cached(5, 1, 7)));
}

#[test]
fn epoch_change_drops_older_entries_and_refuses_older_inserts() {
    let c = DcCache::new(64);
    for i in 0..10 {
        assert_eq!(c.insert(target(i, i as u32), i as u32), Insert::Inserted);
    }
    assert_eq!(c.invalidate_all_older_than(4), 4);
    assert_eq!(c.epoch_floor(), 4);
    assert_eq!(c.len(), 6);
    for i in 0..10 {
        assert_eq!(c.get(&gid(i)).is_some(), i >= 4, "gid {i}");
    }
    assert_eq!(c.insert(target(1, 1), 3), Insert::Stale { newest: 4 });
    assert_eq!(c.insert(target(1, 1), 4), Insert::Inserted);
    // The floor never goes down.
    assert_eq!(c.invalidate_all_older_than(2), 0);
    assert_eq!(c.epoch_floor(), 4);
}

#[test]
fn clock_eviction_gives_referenced_entries_a_second_chance() {
    // One bucket: every GID competes for the same ways.
    let c = DcCache::with_buckets(1, DEFAULT_SEED);
    assert_eq!(c.capacity(), 8);
    for i in 0..8 {
        assert_eq!(c.insert(target(i, 0), 1), Insert::Inserted);
    }
    // Every entry was referenced once (by its insert): the sweep clears them
    // all and the hand's way, the oldest, goes.
    assert_eq!(
        c.insert(target(8, 0), 1),
        Insert::Evicted {
            victim: cached(0, 0, 1)
        }
    );
    // 1 is read, so the next sweep spares it and takes 2.
    assert!(c.get(&gid(1)).is_some());
    assert_eq!(
        c.insert(target(9, 0), 1),
        Insert::Evicted {
            victim: cached(2, 0, 1)
        }
    );
    assert!(c.get(&gid(1)).is_some());
    assert_eq!(c.len(), 8);
}

#[test]
fn invalidated_slots_are_reused_before_evicting() {
    let c = DcCache::with_buckets(1, DEFAULT_SEED);
    for i in 0..8 {
        c.insert(target(i, 0), 1);
    }
    assert!(c.invalidate(&gid(3)));
    assert_eq!(c.insert(target(100, 0), 1), Insert::Inserted);
    assert_eq!(c.len(), 8);
    for i in [0, 1, 2, 4, 5, 6, 7, 100] {
        assert!(c.get(&gid(i)).is_some());
    }
}

#[test]
fn slots_are_the_capacity_with_headroom_in_whole_buckets() {
    assert_eq!(DcCache::new(0).slots(), WAYS);
    assert_eq!(DcCache::new(1).slots(), WAYS);
    assert_eq!(DcCache::new(5).slots(), WAYS);
    assert_eq!(DcCache::new(6).slots(), 2 * WAYS);
    assert_eq!(DcCache::new(10_000).slots(), 16_000);
    assert_eq!(DcCache::new(10_000).capacity(), 10_000);
    assert_eq!(DcCache::with_buckets(3, 1).slots(), 3 * WAYS);
    assert_eq!(DcCache::with_buckets(3, 1).capacity(), 3 * WAYS);
}

#[test]
fn memory_accounting_counts_the_arrays() {
    assert_eq!(BYTES_PER_SLOT, 34);
    let c = DcCache::new(10_000);
    let fixed = std::mem::size_of::<DcCache>();
    assert_eq!(c.memory_bytes(), fixed + 16_000 * 32 + (16_000 / WAYS) * 16);
    assert_eq!(c.memory_bytes(), fixed + c.slots() * BYTES_PER_SLOT);
    assert!(c.memory_bytes() < 1 << 20, "10,000 targets in under 1 MiB");
    // Full or empty, the footprint is the same.
    for i in 0..40_000 {
        c.insert(target(i, 0), 1);
    }
    assert_eq!(c.len(), c.slots(), "evictions fill every slot");
    assert_eq!(c.memory_bytes(), fixed + 16_000 * BYTES_PER_SLOT);
}

/// A cache sized for 10,000 targets holds 10,000 random GIDs, every one
/// readable afterwards with what was inserted (two-choice placement; one
/// choice in the same slots overflows buckets). Several seeds of GIDs and
/// of the bucket hash.
#[test]
fn ten_thousand_random_gids_all_fit() {
    for seed in 1..=4u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let c = DcCache::with_seed(10_000, next());
        let targets: Vec<DcTarget> = (0..10_000)
            .map(|i| {
                let mut g = [0u8; 16];
                g[..8].copy_from_slice(&next().to_le_bytes());
                g[8..].copy_from_slice(&next().to_le_bytes());
                DcTarget {
                    gid: Gid(g),
                    dct_num: i,
                    dc_key: next(),
                }
            })
            .collect();
        for (i, t) in targets.iter().enumerate() {
            assert_eq!(c.insert(*t, 1), Insert::Inserted, "seed {seed}, target {i}");
        }
        assert_eq!(c.len(), 10_000);
        for t in &targets {
            assert_eq!(
                c.get(&t.gid),
                Some(CachedTarget {
                    target: *t,
                    epoch: 1
                })
            );
        }
    }
}

/// With one bucket choice, the same slots overflow: what two choices buy.
#[test]
fn two_choices_place_what_one_bucket_each_could_not() {
    let c = DcCache::new(10_000);
    let mut per_first = vec![0usize; c.slots() / WAYS];
    for i in 0..10_000u64 {
        per_first[c.buckets_of(gid_words(&gid(i))).0] += 1;
        assert_eq!(c.insert(target(i, 0), 1), Insert::Inserted);
    }
    let overflow: usize = per_first.iter().map(|&n| n.saturating_sub(WAYS)).sum();
    assert!(overflow > 0, "first buckets alone would have overflowed");
    assert_eq!(c.len(), 10_000);
}

#[test]
fn the_full_gid_is_the_key() {
    let c = DcCache::new(8);
    // Two GIDs equal in one half.
    let a = Gid([1; 16]);
    let mut b_bytes = [1u8; 16];
    b_bytes[15] = 2;
    let b = Gid(b_bytes);
    c.insert(
        DcTarget {
            gid: a,
            dct_num: 1,
            dc_key: 1,
        },
        1,
    );
    assert_eq!(c.get(&b), None);
    assert_eq!(c.get(&a).unwrap().target.gid, a);
}

/// Random operations against a `HashMap` reference. Single-threaded, so the
/// cache must agree exactly: every hit and miss, and every eviction it reports
/// must be of an entry the reference holds.
#[test]
fn model_against_a_hashmap_reference() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let c = DcCache::with_seed(24, 7);
    let mut reference: HashMap<Gid, CachedTarget> = HashMap::new();
    let mut floor = 0;
    let (mut evictions, mut stale) = (0, 0);
    for _ in 0..50_000 {
        let i = next(96);
        match next(100) {
            0..=44 => {
                let epoch = floor + next(4) as u32;
                let t = target(i, next(1 << 20) as u32);
                let got = c.insert(t, epoch);
                let want_stale = match reference.get(&t.gid) {
                    _ if epoch < floor => Some(floor),
                    Some(p) if epoch < p.epoch => Some(p.epoch),
                    _ => None,
                };
                match (got, want_stale) {
                    (Insert::Stale { newest }, Some(w)) => {
                        assert_eq!(newest, w);
                        stale += 1;
                    }
                    (Insert::Replaced { previous }, None) => {
                        assert_eq!(reference.get(&t.gid), Some(&previous));
                    }
                    (Insert::Inserted, None) => {
                        assert!(!reference.contains_key(&t.gid));
                    }
                    (Insert::Evicted { victim }, None) => {
                        assert!(!reference.contains_key(&t.gid));
                        assert_eq!(reference.remove(&victim.target.gid), Some(victim));
                        evictions += 1;
                    }
                    (got, want) => panic!("insert {t:?}@{epoch}: got {got:?}, want stale {want:?}"),
                }
                if want_stale.is_none() {
                    reference.insert(t.gid, CachedTarget { target: t, epoch });
                }
            }
            45..=59 => {
                assert_eq!(c.invalidate(&gid(i)), reference.remove(&gid(i)).is_some());
            }
            60 => {
                floor += 1;
                let before = reference.len();
                reference.retain(|_, v| v.epoch >= floor);
                assert_eq!(c.invalidate_all_older_than(floor), before - reference.len());
            }
            _ => {}
        }
        let probe = gid(next(96));
        assert_eq!(c.lookup(&probe).hit(), reference.get(&probe).copied());
        assert_eq!(c.len(), reference.len());
        assert!(c.len() <= c.slots());
    }
    assert!(
        evictions > 1000 && stale > 100,
        "{evictions} evictions, {stale} stale"
    );
}
