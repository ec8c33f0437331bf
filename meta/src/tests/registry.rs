use super::gid;
use crate::entry::{EntryRepr, EntryView, ENTRY_LEN};
use crate::registry::*;
use crate::table::{find_in_bucket, Geometry, LookupError, TableMemory};
use krcore_nic::{DcTarget, Gid};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

fn target(n: u64) -> DcTarget {
    DcTarget {
        gid: gid(n),
        dct_num: 1000 + n as u32,
        dc_key: 0x0dc0_0000_0000 + n,
    }
}

/// What a client finds for `gid` with one READ of its bucket in the image.
fn read<M: TableMemory>(t: &MetaTable<M>, g: &Gid) -> Result<Option<EntryRepr>, LookupError> {
    let geo = t.geometry();
    let mut buf = vec![0u8; geo.bucket_len()];
    let off = geo.bucket_offset(geo.bucket_of(g)) as usize;
    t.memory().read_words(off, &mut buf);
    find_in_bucket(&buf, g)
}

/// GIDs that all hash to bucket `b` of `geo`.
fn gids_in_bucket(geo: Geometry, b: u32, n: usize) -> Vec<u64> {
    (0..)
        .filter(|&i| geo.bucket_of(&gid(i)) == b)
        .take(n)
        .collect()
}

fn table(buckets: u32, slots: u32) -> MetaTable {
    MetaTable::with_vec(Geometry::new(buckets, slots).unwrap())
}

#[test]
fn register_is_visible_to_a_reader() {
    let mut t = table(16, 4);
    let lease = t.register(target(1), 7, 500, 1_000).unwrap();
    assert_eq!(
        lease,
        Lease {
            epoch: 1,
            lease_expiry_ms: 1_500,
            replaced_dct: 0,
        }
    );
    let e = read(&t, &gid(1)).unwrap().unwrap();
    assert_eq!(e.dc_target(), target(1));
    assert_eq!((e.lid, e.epoch, e.lease_expiry_ms), (7, 1, 1_500));
    assert_eq!(t.get(&gid(1)), Some(e));
    assert_eq!(read(&t, &gid(2)), Ok(None));
    assert_eq!(t.len(), 1);
    assert!(!t.is_empty());
}

#[test]
fn re_registration_bumps_epoch_in_place() {
    let mut t = table(1, 4);
    assert_eq!(t.register(target(1), 0, 100, 0).unwrap().epoch, 1);
    assert_eq!(t.register(target(2), 0, 100, 0).unwrap().epoch, 2);
    // The node restarts with a new DCT and registers again.
    let mut restarted = target(1);
    restarted.dct_num = 77;
    let l = t.register(restarted, 0, 100, 50).unwrap();
    assert_eq!(l.epoch, 3);
    assert_eq!(l.replaced_dct, 1001, "the old DCT's lease still ran");
    let e = read(&t, &gid(1)).unwrap().unwrap();
    assert_eq!((e.epoch, e.dct_num, e.lease_expiry_ms), (3, 77, 150));
    assert_eq!(t.len(), 2, "same slot, not a second entry");
    // Deregister + register also gets a new epoch.
    t.deregister(&gid(1), 77).unwrap();
    assert_eq!(t.register(target(1), 0, 100, 60).unwrap().epoch, 4);
}

#[test]
fn first_epoch_is_configurable() {
    let g = Geometry::new(4, 2).unwrap();
    let mut t = MetaTable::with_first_epoch(g, vec![0u8; 512], 1_000).unwrap();
    assert_eq!(t.register(target(1), 0, 1, 0).unwrap().epoch, 1_000);
    let mut t = MetaTable::with_first_epoch(g, vec![0u8; 512], 0).unwrap();
    assert_eq!(t.register(target(1), 0, 1, 0).unwrap().epoch, 1);
}

#[test]
fn epoch_exhausted_leaves_table_unchanged() {
    let g = Geometry::new(4, 2).unwrap();
    let mut t = MetaTable::with_first_epoch(g, vec![0u8; 512], u32::MAX).unwrap();
    assert_eq!(t.register(target(1), 0, 10, 0).unwrap().epoch, u32::MAX);
    let before = t.memory().clone();
    assert_eq!(
        t.register(target(2), 0, 10, 0),
        Err(TableError::EpochExhausted)
    );
    assert_eq!(t.memory(), &before);
    assert_eq!(t.len(), 1);
}

#[test]
fn invalid_lease() {
    let mut t = table(4, 2);
    assert_eq!(
        t.register(target(1), 0, 0, 0),
        Err(TableError::InvalidLease)
    );
    assert!(t.is_empty());
}

#[test]
fn lease_expiry_saturates() {
    let mut t = table(4, 2);
    let l = t.register(target(1), 0, u64::MAX, 10).unwrap();
    assert_eq!(l.lease_expiry_ms, u64::MAX);
    assert!(t.sweep(u64::MAX - 1).is_empty());
}

#[test]
fn renew_extends_and_never_shortens() {
    let mut t = table(4, 2);
    t.register(target(1), 0, 100, 0).unwrap();
    let l = t.renew(&gid(1), target(1).dct_num, 60).unwrap();
    assert_eq!(
        l,
        Lease {
            epoch: 1,
            lease_expiry_ms: 160,
            replaced_dct: 0,
        }
    );
    assert_eq!(read(&t, &gid(1)).unwrap().unwrap().lease_expiry_ms, 160);
    // A clock that went backwards does not shorten the lease.
    assert_eq!(
        t.renew(&gid(1), target(1).dct_num, 10)
            .unwrap()
            .lease_expiry_ms,
        160
    );
}

#[test]
fn renew_without_change_does_not_rewrite() {
    let mut t = table(1, 1);
    t.register(target(1), 0, 100, 0).unwrap();
    t.renew(&gid(1), target(1).dct_num, 50).unwrap();
    let v = EntryView::new_checked(&t.memory()[..ENTRY_LEN])
        .unwrap()
        .version_head();
    t.renew(&gid(1), target(1).dct_num, 50).unwrap();
    let v2 = EntryView::new_checked(&t.memory()[..ENTRY_LEN])
        .unwrap()
        .version_head();
    assert_eq!(v, v2);
}

#[test]
fn renew_errors() {
    let mut t = table(4, 2);
    assert_eq!(
        t.renew(&gid(1), target(1).dct_num, 0),
        Err(TableError::NotRegistered { gid: gid(1) })
    );
    t.register(target(1), 0, 100, 0).unwrap();
    assert_eq!(
        t.renew(&gid(1), target(1).dct_num, 100),
        Err(TableError::LeaseExpired {
            gid: gid(1),
            expired_at_ms: 100
        })
    );
    // Still there until swept; re-registration revives it with a new epoch.
    assert!(t.get(&gid(1)).is_some());
    assert_eq!(t.register(target(1), 0, 100, 200).unwrap().epoch, 2);
}

#[test]
fn a_second_engine_at_a_gid_replaces_the_first_which_can_no_longer_renew_or_remove() {
    let mut t = table(4, 2);
    let first = target(1);
    let second = DcTarget {
        dct_num: 5_000,
        ..first
    };
    assert_eq!(t.register(first, 0, 100, 0).unwrap().replaced_dct, 0);
    // Registering the same DCT again replaces nothing.
    assert_eq!(t.register(first, 0, 100, 10).unwrap().replaced_dct, 0);
    let l = t.register(second, 0, 100, 20).unwrap();
    assert_eq!(
        l.replaced_dct, first.dct_num,
        "a live registration of another DCT"
    );
    let refused = Err(TableError::Replaced {
        gid: gid(1),
        asked: first.dct_num,
        holder: second.dct_num,
    });
    assert_eq!(t.renew(&gid(1), first.dct_num, 30), refused);
    assert_eq!(
        t.deregister(&gid(1), first.dct_num).map(|_| ()),
        refused.map(|_: Lease| ())
    );
    let e = read(&t, &gid(1)).unwrap().unwrap();
    assert_eq!(
        (e.dct_num, e.lease_expiry_ms),
        (second.dct_num, 120),
        "untouched"
    );
    assert_eq!(t.renew(&gid(1), second.dct_num, 30).unwrap().epoch, l.epoch);
    // A registration whose lease ran out is not reported as replaced.
    assert_eq!(t.register(first, 0, 100, 500).unwrap().replaced_dct, 0);
    assert_eq!(
        t.deregister(&gid(1), first.dct_num).unwrap().dct_num,
        first.dct_num
    );
}

#[test]
fn deregister_clears_the_slot() {
    let mut t = table(4, 2);
    t.register(target(1), 0, 100, 0).unwrap();
    let e = t.deregister(&gid(1), target(1).dct_num).unwrap();
    assert_eq!(e.gid, gid(1));
    assert_eq!(read(&t, &gid(1)), Ok(None));
    assert!(t.is_empty());
    assert_eq!(t.next_expiry_ms(), None);
    assert_eq!(
        t.deregister(&gid(1), target(1).dct_num),
        Err(TableError::NotRegistered { gid: gid(1) })
    );
}

#[test]
fn sweep_removes_expired_leases() {
    let mut t = table(8, 4);
    t.register(target(1), 0, 300, 0).unwrap();
    t.register(target(2), 0, 100, 0).unwrap();
    t.register(target(3), 0, 200, 0).unwrap();
    t.register(target(4), 0, 1_000, 0).unwrap();
    assert_eq!(t.next_expiry_ms(), Some(100));
    assert!(t.sweep(99).is_empty());
    // Expiry is inclusive: a lease ending at 100 is gone at 100.
    assert_eq!(t.sweep(100), vec![gid(2)]);
    t.renew(&gid(1), target(1).dct_num, 150).unwrap(); // 1 now expires at 450
    assert_eq!(t.sweep(460), vec![gid(3), gid(1)]);
    assert_eq!(t.len(), 1);
    assert_eq!(t.next_expiry_ms(), Some(1_000));
    for g in [1, 2, 3] {
        assert_eq!(read(&t, &gid(g)), Ok(None));
    }
    assert!(read(&t, &gid(4)).unwrap().is_some());
    assert_eq!(t.sweep(u64::MAX), vec![gid(4)]);
    assert!(t.is_empty());
}

#[test]
fn full_bucket_is_an_error() {
    let geo = Geometry::new(4, 2).unwrap();
    let mut t = MetaTable::with_vec(geo);
    let same = gids_in_bucket(geo, 1, 3);
    t.register(target(same[0]), 0, 100, 0).unwrap();
    t.register(target(same[1]), 0, 100, 0).unwrap();
    let before = t.memory().clone();
    assert_eq!(
        t.register(target(same[2]), 0, 100, 0),
        Err(TableError::BucketFull {
            gid: gid(same[2]),
            bucket: 1,
            slots: 2
        })
    );
    assert_eq!(t.memory(), &before, "a refused registration writes nothing");
    // Re-registering a present GID in a full bucket is fine.
    t.register(target(same[0]), 0, 100, 0).unwrap();
    // A freed slot is reused.
    t.deregister(&gid(same[1]), target(same[1]).dct_num)
        .unwrap();
    t.register(target(same[2]), 0, 100, 0).unwrap();
    assert!(read(&t, &gid(same[2])).unwrap().is_some());
    // Other buckets are unaffected.
    let other = gids_in_bucket(geo, 2, 1)[0];
    t.register(target(other), 0, 100, 0).unwrap();
}

#[test]
fn memory_too_small() {
    let g = Geometry::new(4, 2).unwrap();
    assert_eq!(
        MetaTable::new(g, vec![0u8; 511]).unwrap_err(),
        TableError::MemoryTooSmall {
            need: 512,
            have: 511
        }
    );
}

#[test]
fn over_a_borrowed_slice_that_starts_dirty() {
    let g = Geometry::new(2, 2).unwrap();
    let mut raw = vec![0xa5u8; 300];
    {
        let mut t = MetaTable::new(g, &mut raw[..]).unwrap();
        assert_eq!(read(&t, &gid(1)), Ok(None), "new() zeroes the table");
        t.register(target(1), 0, 10, 0).unwrap();
    }
    assert!(
        raw[256..].iter().all(|&b| b == 0xa5),
        "beyond the table untouched"
    );
    let b = g.bucket_of(&gid(1));
    let found = find_in_bucket(&raw[g.bucket_range(b)], &gid(1)).unwrap();
    assert_eq!(found.unwrap().gid, gid(1));
}

/// A memory that lets a reader look at one bucket after every word store.
struct Snoop {
    image: Vec<u8>,
    watch: std::ops::Range<usize>,
    seen: Vec<Result<Option<EntryRepr>, LookupError>>,
    probe: Gid,
}

impl TableMemory for Snoop {
    fn len_bytes(&self) -> usize {
        self.image.len()
    }
    fn load_u64(&self, offset: usize) -> u64 {
        self.image.load_u64(offset)
    }
    fn store_u64(&mut self, offset: usize, value: u64) {
        self.image.store_u64(offset, value);
        self.seen
            .push(find_in_bucket(&self.image[self.watch.clone()], &self.probe));
    }
}

/// Runs `op` and checks what a reader of `probe`'s bucket saw after each of
/// its word stores: the value before, the value after, or Torn.
fn check_op(t: &mut MetaTable<Snoop>, op: impl FnOnce(&mut MetaTable<Snoop>)) {
    let probe = t.memory().probe;
    let old = read(t, &probe).unwrap();
    let start = t.memory().seen.len();
    op(t);
    let new = read(t, &probe).unwrap();
    assert_ne!(old, new);
    let seen = &t.memory().seen[start..];
    assert_eq!(seen.len(), 10, "one seqlock write of ten stores");
    for (i, r) in seen.iter().enumerate() {
        let ok = matches!(r, Err(LookupError::Torn { .. }))
            || r.as_ref() == Ok(&old)
            || r.as_ref() == Ok(&new);
        assert!(ok, "after store {i}: {r:?} (old {old:?}, new {new:?})");
    }
    assert!(matches!(seen[0], Err(LookupError::Torn { .. })));
    assert!(matches!(seen[8], Err(LookupError::Torn { .. })));
    assert_eq!(seen[9], Ok(new));
}

#[test]
fn reader_between_engine_stores_sees_old_new_or_torn() {
    let geo = Geometry::new(2, 2).unwrap();
    let probe = gid(1);
    let snoop = Snoop {
        image: vec![0u8; geo.table_len() as usize],
        watch: geo.bucket_range(geo.bucket_of(&probe)),
        seen: Vec::new(),
        probe,
    };
    let mut t = MetaTable::new(geo, snoop).unwrap();
    assert_eq!(t.memory().seen.len(), geo.table_len() as usize / 8);
    check_op(&mut t, |t| {
        t.register(target(1), 1, 100, 0).unwrap();
    });
    check_op(&mut t, |t| {
        t.renew(&gid(1), target(1).dct_num, 10).unwrap();
    });
    check_op(&mut t, |t| {
        t.register(target(1), 2, 100, 20).unwrap();
    });
    check_op(&mut t, |t| {
        t.deregister(&gid(1), target(1).dct_num).unwrap();
    });
    check_op(&mut t, |t| {
        t.register(target(1), 3, 100, 30).unwrap();
    });
    check_op(&mut t, |t| {
        assert_eq!(t.sweep(1_000), vec![gid(1)]);
    });
}

/// Random operations from several nodes against a `HashMap` reference; after
/// every step the image a client reads agrees with the reference.
#[test]
fn model_based_random_operations() {
    let geo = Geometry::new(8, 2).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x3e7a);
    let mut t = MetaTable::with_vec(geo);
    // gid -> (epoch, expiry, lease_ms, lid)
    let mut model: HashMap<u64, (u32, u64, u64, u16)> = HashMap::new();
    let mut last_epoch = 0u32;
    let mut now = 0u64;
    for step in 0..5_000 {
        now += rng.gen_range(0..20);
        let n = rng.gen_range(0..40u64);
        let g = gid(n);
        match rng.gen_range(0..10) {
            0..=3 => {
                let lease = rng.gen_range(0..200);
                let lid = rng.gen();
                let full = !model.contains_key(&n)
                    && model
                        .keys()
                        .filter(|&&k| geo.bucket_of(&gid(k)) == geo.bucket_of(&g))
                        .count()
                        == 2;
                match t.register(target(n), lid, lease, now) {
                    Ok(l) => {
                        assert!(lease > 0 && !full, "step {step}");
                        assert!(l.epoch > last_epoch);
                        last_epoch = l.epoch;
                        assert_eq!(l.lease_expiry_ms, now + lease);
                        model.insert(n, (l.epoch, now + lease, lease, lid));
                    }
                    Err(TableError::InvalidLease) => assert_eq!(lease, 0),
                    Err(TableError::BucketFull { .. }) => assert!(full, "step {step}"),
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            4..=6 => match (t.renew(&g, target(n).dct_num, now), model.get_mut(&n)) {
                (Ok(l), Some(m)) => {
                    assert!(now < m.1);
                    m.1 = m.1.max(now + m.2);
                    assert_eq!(
                        l,
                        Lease {
                            epoch: m.0,
                            lease_expiry_ms: m.1,
                            replaced_dct: 0,
                        }
                    );
                }
                (Err(TableError::LeaseExpired { expired_at_ms, .. }), Some(m)) => {
                    assert!(now >= m.1);
                    assert_eq!(expired_at_ms, m.1);
                }
                (Err(TableError::NotRegistered { .. }), None) => {}
                (r, m) => panic!("step {step}: renew {r:?} vs model {m:?}"),
            },
            7 => match (t.deregister(&g, target(n).dct_num), model.remove(&n)) {
                (Ok(e), Some(m)) => assert_eq!(e.epoch, m.0),
                (Err(TableError::NotRegistered { .. }), None) => {}
                (r, m) => panic!("step {step}: deregister {r:?} vs model {m:?}"),
            },
            _ => {
                let mut gone = t.sweep(now);
                let mut expect: Vec<Gid> = model
                    .iter()
                    .filter(|(_, m)| m.1 <= now)
                    .map(|(&k, _)| gid(k))
                    .collect();
                model.retain(|_, m| m.1 > now);
                gone.sort();
                expect.sort();
                assert_eq!(gone, expect, "step {step}");
            }
        }
        assert_eq!(t.len(), model.len());
        for k in 0..40u64 {
            let got = read(&t, &gid(k)).unwrap();
            match (got, model.get(&k)) {
                (None, None) => {}
                (Some(e), Some(m)) => {
                    assert_eq!((e.epoch, e.lease_expiry_ms, e.lid), (m.0, m.1, m.3));
                    assert_eq!(e.dc_target(), target(k));
                }
                (g, m) => panic!("step {step} gid {k}: image {g:?} vs model {m:?}"),
            }
        }
    }
}

#[test]
fn debug_does_not_dump_memory() {
    let mut t = table(1024, 8);
    t.register(target(1), 0, 10, 0).unwrap();
    let d = format!("{t:?}");
    assert!(d.contains("live: 1") && d.contains("last_epoch: 1"), "{d}");
    assert!(d.len() < 300, "{d}");
}
