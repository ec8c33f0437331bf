use super::gid;
use crate::entry::*;
use rand::{Rng, RngCore, SeedableRng};

fn sample() -> EntryRepr {
    EntryRepr {
        gid: gid(7),
        dct_num: 0x00ab_cdef,
        dc_key: 0x1122_3344_5566_7788,
        lid: 0x0102,
        epoch: 42,
        lease_expiry_ms: 1_000_000,
    }
}

fn parse(bytes: &[u8]) -> Result<EntryRepr, EntryError> {
    EntryRepr::parse(&EntryView::new_checked(bytes)?)
}

#[test]
fn round_trip() {
    let e = sample();
    let img = e.to_image(2);
    assert_eq!(parse(&img), Ok(e));
    let v = EntryView::new_checked(&img[..]).unwrap();
    assert_eq!(v.version_head(), 2);
    assert_eq!(v.version_tail(), 2);
    assert_eq!(v.flags(), FLAG_OCCUPIED);
    assert_eq!(e.dc_target().dct_num, e.dct_num);
    assert_eq!(e.dc_target().dc_key, e.dc_key);
    assert_eq!(e.dc_target().gid, e.gid);
}

#[test]
fn layout_is_little_endian_at_documented_offsets() {
    let img = sample().to_image(0x10);
    assert_eq!(&img[0..8], &0x10u64.to_le_bytes());
    assert_eq!(&img[8..24], gid(7).as_bytes());
    assert_eq!(&img[24..28], &0x00ab_cdefu32.to_le_bytes());
    assert_eq!(&img[28..30], &0x0102u16.to_le_bytes());
    assert_eq!(&img[30..32], &1u16.to_le_bytes());
    assert_eq!(&img[32..40], &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(&img[40..44], &42u32.to_le_bytes());
    assert_eq!(&img[48..56], &1_000_000u64.to_le_bytes());
    assert_eq!(&img[56..64], &0x10u64.to_le_bytes());
}

#[test]
fn longer_buffer_uses_first_entry_only() {
    let mut buf = vec![0xffu8; 100];
    buf[..ENTRY_LEN].copy_from_slice(&sample().to_image(4));
    assert_eq!(parse(&buf), Ok(sample()));
}

#[test]
fn truncated() {
    let img = sample().to_image(2);
    for len in 0..ENTRY_LEN {
        assert_eq!(parse(&img[..len]), Err(EntryError::Truncated { len }));
    }
}

#[test]
fn never_written_slot_is_empty() {
    assert_eq!(
        parse(&[0u8; ENTRY_LEN]),
        Err(EntryError::Empty { version: 0 })
    );
    assert_eq!(empty_image(0), [0u8; ENTRY_LEN]);
}

#[test]
fn deregistered_slot_is_empty() {
    assert_eq!(
        parse(&empty_image(6)),
        Err(EntryError::Empty { version: 6 })
    );
}

#[test]
fn odd_version_is_torn() {
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_version(3);
    assert_eq!(parse(&img), Err(EntryError::Torn { head: 3, tail: 3 }));
    assert!(parse(&img).unwrap_err().is_retryable());
}

#[test]
fn version_copies_differ_is_torn() {
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_version_tail(4);
    assert_eq!(parse(&img), Err(EntryError::Torn { head: 2, tail: 4 }));
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_version_head(0);
    assert_eq!(parse(&img), Err(EntryError::Torn { head: 0, tail: 2 }));
}

#[test]
fn every_single_bit_flip_is_detected() {
    let good = sample().to_image(8);
    for byte in 0..ENTRY_LEN {
        for bit in 0..8 {
            let mut img = good;
            img[byte] ^= 1 << bit;
            let err = parse(&img).unwrap_err();
            let in_version = !(8..56).contains(&byte);
            match err {
                EntryError::Torn { .. } => assert!(in_version, "byte {byte}"),
                EntryError::Checksum { .. } => assert!(!in_version, "byte {byte}"),
                other => panic!("byte {byte} bit {bit}: unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn checksum_covers_the_version() {
    // Same fields, both version copies rewritten to another even value: the
    // checksum was computed for the old version and must not match.
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_version(4);
    assert!(matches!(parse(&img), Err(EntryError::Checksum { .. })));
    assert!(parse(&img).unwrap_err().is_retryable());
}

/// Rewrites the checksum so that only the layout invariants can reject it.
fn reseal(img: &mut [u8; ENTRY_LEN], version: u64) {
    let mut v = EntryView::new_unchecked(&mut img[..]);
    v.fill_checksum(version);
    v.set_version(version);
}

#[test]
fn malformed_unknown_flags() {
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_flags(FLAG_OCCUPIED | 0x8000);
    reseal(&mut img, 2);
    assert_eq!(parse(&img), Err(EntryError::Malformed("unknown flag bits")));
    assert!(!parse(&img).unwrap_err().is_retryable());
}

#[test]
fn malformed_epoch_zero() {
    let mut e = sample();
    e.epoch = 0;
    let img = e.to_image(2);
    assert!(matches!(parse(&img), Err(EntryError::Malformed(_))));
}

#[test]
fn malformed_empty_with_fields() {
    let mut img = sample().to_image(2);
    EntryView::new_unchecked(&mut img[..]).set_flags(0);
    reseal(&mut img, 2);
    assert!(matches!(parse(&img), Err(EntryError::Malformed(_))));
}

#[test]
fn never_written_not_zero() {
    let mut img = [0u8; ENTRY_LEN];
    img[20] = 1;
    assert_eq!(parse(&img), Err(EntryError::UnwrittenNotZero));
    assert!(EntryError::UnwrittenNotZero.is_retryable());
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    let mut buf = [0u8; ENTRY_LEN + 8];
    for _ in 0..20_000 {
        let len = rng.gen_range(0..=buf.len());
        rng.fill_bytes(&mut buf[..len]);
        // Half the time make the version copies agree and even, to get past
        // the first check into the rest of the parser.
        if len >= ENTRY_LEN && rng.gen_bool(0.5) {
            let v = rng.next_u64() & !1;
            let mut view = EntryView::new_unchecked(&mut buf[..]);
            view.set_version(v);
            if rng.gen_bool(0.5) {
                view.fill_checksum(v);
            }
        }
        let _ = parse(&buf[..len]);
    }
}
