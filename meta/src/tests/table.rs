use super::gid;
use crate::entry::{empty_image, EntryError, EntryRepr, EntryView, ENTRY_LEN};
use crate::table::*;
use rand::{Rng, RngCore, SeedableRng};

fn entry(n: u64, epoch: u32) -> EntryRepr {
    EntryRepr {
        gid: gid(n),
        dct_num: n as u32 + 100,
        dc_key: n ^ 0xdead_beef,
        lid: n as u16,
        epoch,
        lease_expiry_ms: 5_000,
    }
}

/// A bucket of `slots` slots, each given as an image.
fn bucket(images: &[[u8; ENTRY_LEN]]) -> Vec<u8> {
    images.iter().flatten().copied().collect()
}

#[test]
fn geometry_validation() {
    assert_eq!(Geometry::new(0, 8), Err(GeometryError::ZeroBuckets));
    assert_eq!(
        Geometry::new(4, 0),
        Err(GeometryError::SlotsPerBucket { got: 0 })
    );
    assert_eq!(
        Geometry::new(4, MAX_SLOTS_PER_BUCKET + 1),
        Err(GeometryError::SlotsPerBucket {
            got: MAX_SLOTS_PER_BUCKET + 1
        })
    );
    assert!(Geometry::new(u32::MAX, MAX_SLOTS_PER_BUCKET).is_ok());
    assert_eq!(
        Geometry::with_buckets(3).unwrap().slots_per_bucket(),
        DEFAULT_SLOTS_PER_BUCKET
    );
}

#[test]
fn geometry_offsets() {
    let g = Geometry::new(16, 4).unwrap();
    assert_eq!(g.bucket_len(), 256);
    assert_eq!(g.n_slots(), 64);
    assert_eq!(g.table_len(), 16 * 256);
    assert_eq!(g.bucket_offset(3), 768);
    assert_eq!(g.entry_offset(3, 2), 768 + 128);
    assert_eq!(g.bucket_range(1), 256..512);
    // The largest geometry does not overflow.
    let big = Geometry::new(u32::MAX, MAX_SLOTS_PER_BUCKET).unwrap();
    assert_eq!(
        big.table_len(),
        u64::from(u32::MAX) * u64::from(MAX_SLOTS_PER_BUCKET) * 64
    );
    assert_eq!(
        big.entry_offset(u32::MAX - 1, MAX_SLOTS_PER_BUCKET - 1) + 64,
        big.table_len()
    );
}

#[test]
fn bucket_hash_is_pinned() {
    // The bucket hash is part of the layout: clients and servers built at
    // different times must agree. A change here needs a new LAYOUT_VERSION.
    // (Values recorded from xxhash-rust 0.8's xxh3; a regression pin.)
    let got: Vec<u32> = (0..6).map(|n| bucket_of(&gid(n), 1000)).collect();
    assert_eq!(got, PINNED_BUCKETS);
    let g = Geometry::with_buckets(1000).unwrap();
    assert_eq!(g.bucket_of(&gid(3)), PINNED_BUCKETS[3]);
}

const PINNED_BUCKETS: [u32; 6] = [194, 977, 964, 489, 132, 725];

#[test]
fn bucket_hash_spreads() {
    let n = 64u32;
    let mut counts = vec![0u32; n as usize];
    for i in 0..(64 * 64) {
        counts[bucket_of(&gid(i), n) as usize] += 1;
    }
    // Expected 64 per bucket; a working hash stays well inside 2x.
    assert!(
        counts.iter().all(|&c| (24..=128).contains(&c)),
        "{counts:?}"
    );
}

#[test]
#[should_panic(expected = "n_buckets must be non-zero")]
fn bucket_of_zero_buckets_is_a_programmer_error() {
    bucket_of(&gid(1), 0);
}

#[test]
fn find_hit_miss_and_empty() {
    let b = bucket(&[
        empty_image(0),
        entry(1, 3).to_image(2),
        empty_image(4),
        entry(2, 5).to_image(6),
    ]);
    assert_eq!(find_in_bucket(&b, &gid(1)), Ok(Some(entry(1, 3))));
    assert_eq!(find_in_bucket(&b, &gid(2)), Ok(Some(entry(2, 5))));
    assert_eq!(find_in_bucket(&b, &gid(9)), Ok(None));
    assert_eq!(find_in_bucket(&[0u8; 512], &gid(9)), Ok(None));
}

#[test]
fn find_bad_length() {
    for len in [0, 1, 63, 65, 127] {
        let b = vec![0u8; len];
        assert_eq!(
            find_in_bucket(&b, &gid(1)),
            Err(LookupError::BadLength { len })
        );
        assert!(!LookupError::BadLength { len }.is_retryable());
    }
}

#[test]
fn find_torn_without_match_is_torn() {
    let mut torn = entry(1, 3).to_image(2);
    EntryView::new_unchecked(&mut torn[..]).set_version_head(3);
    let b = bucket(&[entry(2, 4).to_image(2), torn]);
    let err = find_in_bucket(&b, &gid(1)).unwrap_err();
    assert_eq!(
        err,
        LookupError::Torn {
            slot: 1,
            head: 3,
            tail: 2
        }
    );
    assert!(err.is_retryable());
}

#[test]
fn find_stable_match_wins_over_torn_slot() {
    let mut torn = entry(2, 3).to_image(2);
    EntryView::new_unchecked(&mut torn[..]).set_version(5);
    let b = bucket(&[torn, entry(1, 4).to_image(2)]);
    assert_eq!(find_in_bucket(&b, &gid(1)), Ok(Some(entry(1, 4))));
}

#[test]
fn find_corrupt_without_match_is_corrupt() {
    let mut bad = entry(2, 3).to_image(2);
    bad[30] ^= 0x10;
    let b = bucket(&[entry(3, 1).to_image(2), bad]);
    let err = find_in_bucket(&b, &gid(1)).unwrap_err();
    assert!(matches!(
        err,
        LookupError::Corrupt {
            slot: 1,
            source: EntryError::Checksum { .. }
        }
    ));
    assert!(err.is_retryable());
    // A layout violation is not retryable.
    let mut e = entry(2, 3);
    e.epoch = 0;
    let b = bucket(&[e.to_image(2)]);
    let err = find_in_bucket(&b, &gid(1)).unwrap_err();
    assert!(matches!(
        err,
        LookupError::Corrupt {
            slot: 0,
            source: EntryError::Malformed(_)
        }
    ));
    assert!(!err.is_retryable());
}

#[test]
fn find_torn_takes_precedence_over_corrupt() {
    let mut bad = entry(2, 3).to_image(2);
    bad[20] ^= 1;
    let mut torn = entry(3, 3).to_image(2);
    EntryView::new_unchecked(&mut torn[..]).set_version_tail(3);
    let b = bucket(&[bad, torn]);
    assert!(matches!(
        find_in_bucket(&b, &gid(1)),
        Err(LookupError::Torn { slot: 1, .. })
    ));
}

#[test]
fn find_two_matches_newest_epoch_wins() {
    // A READ that spans "deregister slot 0, register again into slot 1".
    let b = bucket(&[entry(1, 9).to_image(2), entry(1, 4).to_image(2)]);
    assert_eq!(find_in_bucket(&b, &gid(1)), Ok(Some(entry(1, 9))));
}

#[test]
fn find_random_bytes_never_panic() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut buf = vec![0u8; 8 * ENTRY_LEN + 5];
    for _ in 0..5_000 {
        let len = rng.gen_range(0..=buf.len());
        rng.fill_bytes(&mut buf[..len]);
        if rng.gen_bool(0.5) {
            // Plant a valid entry for gid(1) now and then.
            let at = rng.gen_range(0..8) * ENTRY_LEN;
            if at + ENTRY_LEN <= len {
                buf[at..at + ENTRY_LEN].copy_from_slice(&entry(1, 2).to_image(4));
            }
        }
        let _ = find_in_bucket(&buf[..len], &gid(1));
    }
}

#[test]
fn seqlock_write_steps() {
    let e = entry(1, 3);
    let w = SeqlockWrite::for_entry(128, 4, &e);
    assert_eq!(w.new_version(), 6);
    let offs: Vec<usize> = w.steps().iter().map(|s| s.offset - 128).collect();
    assert_eq!(offs, [0, 56, 8, 16, 24, 32, 48, 40, 56, 0]);
    let vals: Vec<u64> = w.steps().iter().map(|s| s.value).collect();
    assert_eq!((vals[0], vals[1], vals[8], vals[9]), (5, 5, 6, 6));
    // Applying it yields exactly the stable image.
    let mut mem = vec![0u8; 256];
    w.apply(&mut mem);
    assert_eq!(&mem[128..192], &e.to_image(6));
    // An odd old version (a write that never finished) still moves forward.
    assert_eq!(SeqlockWrite::for_empty(0, 7).new_version(), 8);
    let mut mem = vec![0u8; 64];
    SeqlockWrite::for_empty(0, 0).apply(&mut mem);
    assert_eq!(&mem[..], &empty_image(2));
}

#[test]
fn table_memory_impls_agree() {
    let mut v = vec![0u8; 32];
    v.store_u64(8, 0x0102_0304_0506_0708);
    assert_eq!(v.load_u64(8), 0x0102_0304_0506_0708);
    assert_eq!(v[8], 0x08);
    let mut raw = [0u8; 32];
    {
        let mut s: &mut [u8] = &mut raw[..];
        <&mut [u8] as TableMemory>::store_u64(&mut s, 16, 9);
        assert_eq!(<&mut [u8] as TableMemory>::len_bytes(&s), 32);
    }
    assert_eq!(raw[16], 9);
    let mut out = [0u8; 16];
    v.read_words(8, &mut out);
    assert_eq!(&out[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
}
