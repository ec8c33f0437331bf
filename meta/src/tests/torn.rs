//! A reader that copies a bucket while the server rewrites one of its entries
//! sees the old value, the new value, or a retryable error: never a mix.

use super::gid;
use crate::entry::{EntryError, EntryRepr, ENTRY_LEN};
use crate::table::{find_in_bucket, LookupError, SeqlockWrite, TableMemory, WordStore};
use krcore_nic::Gid;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const SLOTS: usize = 4;
const WORDS: usize = ENTRY_LEN / 8;

fn entry(n: u64, epoch: u32, lease: u64) -> EntryRepr {
    EntryRepr {
        gid: gid(n),
        dct_num: 7 + n as u32,
        dc_key: 0xabcd_0000 + n,
        lid: 3,
        epoch,
        lease_expiry_ms: lease,
    }
}

/// The bucket image after 0, 1, ..., all of `steps`.
fn snapshots(start: &[u8], steps: &[WordStore]) -> Vec<Vec<u8>> {
    let mut img = start.to_vec();
    let mut out = vec![img.clone()];
    for s in steps {
        img.store_u64(s.offset, s.value);
        out.push(img.clone());
    }
    out
}

/// Fills `b` with the bucket as a reader sees it when it copies word `i` of
/// the written entry from snapshot `times[i]` (other slots are stable, and
/// `b` already holds them).
fn compose(b: &mut [u8], snaps: &[Vec<u8>], slot: usize, times: &[usize; WORDS]) {
    for (i, &t) in times.iter().enumerate() {
        let off = slot * ENTRY_LEN + i * 8;
        b[off..off + 8].copy_from_slice(&snaps[t][off..off + 8]);
    }
}

/// Every non-decreasing sequence of WORDS times in `0..=max`.
fn monotone(max: usize) -> Vec<[usize; WORDS]> {
    fn rec(
        i: usize,
        lo: usize,
        max: usize,
        cur: &mut [usize; WORDS],
        out: &mut Vec<[usize; WORDS]>,
    ) {
        if i == WORDS {
            out.push(*cur);
            return;
        }
        for t in lo..=max {
            cur[i] = t;
            rec(i + 1, t, max, cur, out);
        }
    }
    let mut out = Vec::new();
    rec(0, 0, max, &mut [0; WORDS], &mut out);
    out
}

type Outcome = Result<Option<EntryRepr>, LookupError>;

/// A scenario: a bucket with stable neighbours, and one write to `slot`.
struct Scenario {
    start: Vec<u8>,
    slot: usize,
    steps: Vec<WordStore>,
    probe: Gid,
}

impl Scenario {
    fn new(slot: usize, old: Option<EntryRepr>, old_version: u64, new: Option<EntryRepr>) -> Self {
        let mut start = vec![0u8; SLOTS * ENTRY_LEN];
        // Stable neighbours in the other slots.
        for s in (0..SLOTS).filter(|&s| s != slot) {
            let e = entry(100 + s as u64, 50 + s as u32, 9_999);
            start[s * ENTRY_LEN..(s + 1) * ENTRY_LEN].copy_from_slice(&e.to_image(2));
        }
        let at = slot * ENTRY_LEN;
        let old_img = match old {
            Some(e) => e.to_image(old_version),
            None => crate::entry::empty_image(old_version),
        };
        start[at..at + ENTRY_LEN].copy_from_slice(&old_img);
        let write = match new {
            Some(e) => SeqlockWrite::for_entry(at, old_version, &e),
            None => SeqlockWrite::for_empty(at, old_version),
        };
        let probe = new.or(old).map(|e| e.gid).unwrap_or(gid(1));
        Scenario {
            start,
            slot,
            steps: write.steps().to_vec(),
            probe,
        }
    }

    /// Checks every outcome of readers with the given word timings; counts
    /// `[old, new, torn, checksum]`, or describes the first bad outcome.
    fn check(
        &self,
        timings: impl IntoIterator<Item = [usize; WORDS]>,
        allow_checksum: bool,
    ) -> Result<[usize; 4], String> {
        let snaps = snapshots(&self.start, &self.steps);
        let old: Outcome = find_in_bucket(&snaps[0], &self.probe);
        let new: Outcome = find_in_bucket(snaps.last().unwrap(), &self.probe);
        assert!(old.is_ok() && new.is_ok());
        assert_ne!(old, new, "the write must change what a reader finds");
        let mut seen = [0usize; 4];
        let mut b = snaps[0].clone();
        for (k, times) in timings.into_iter().enumerate() {
            compose(&mut b, &snaps, self.slot, &times);
            let got = find_in_bucket(&b, &self.probe);
            match got {
                ref g if *g == old => seen[0] += 1,
                ref g if *g == new => seen[1] += 1,
                Err(LookupError::Torn { .. }) => seen[2] += 1,
                Err(LookupError::Corrupt {
                    source: EntryError::Checksum { .. } | EntryError::UnwrittenNotZero,
                    ..
                }) if allow_checksum => seen[3] += 1,
                other => return Err(format!("times {times:?}: mixed or wrong result {other:?}")),
            }
            // A neighbour is never disturbed (sampled: it doubles the cost).
            if k % 64 == 0 {
                let n = 100 + ((self.slot + 1) % SLOTS) as u64;
                assert!(matches!(find_in_bucket(&b, &gid(n)), Ok(Some(_))));
            }
        }
        Ok(seen)
    }

    fn check_all_orders(&self) {
        let times = monotone(self.steps.len());
        // Ascending reader: word i read at times[i].
        let seen = self.check(times.iter().copied(), false).unwrap();
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] > 0, "{seen:?}");
        // Descending reader: word i read at times[WORDS - 1 - i].
        let desc = times.iter().map(|t| {
            let mut r = *t;
            r.reverse();
            r
        });
        let seen = self.check(desc, false).unwrap();
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] > 0, "{seen:?}");
        // Any order: word order a random permutation, times monotone in it.
        // Only the checksum protects such readers, so it may report Checksum.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0x70e4);
        let mut perm: Vec<usize> = (0..WORDS).collect();
        let random = (0..5_000).map(|_| {
            perm.shuffle(&mut rng);
            let mut ts: Vec<usize> = (0..WORDS)
                .map(|_| rng.gen_range(0..=self.steps.len()))
                .collect();
            ts.sort_unstable();
            let mut r = [0usize; WORDS];
            for (k, &w) in perm.iter().enumerate() {
                r[w] = ts[k];
            }
            r
        });
        self.check(random, true).unwrap();
    }
}

#[test]
fn register_into_empty_slot() {
    Scenario::new(1, None, 0, Some(entry(1, 1, 500))).check_all_orders();
}

#[test]
fn re_register_in_place() {
    let old = entry(1, 1, 500);
    let mut new = entry(1, 2, 800);
    new.dct_num = 99;
    new.dc_key = 0x5555;
    Scenario::new(2, Some(old), 2, Some(new)).check_all_orders();
}

#[test]
fn renew_changes_only_the_lease() {
    let old = entry(1, 4, 500);
    let new = entry(1, 4, 501);
    Scenario::new(0, Some(old), 6, Some(new)).check_all_orders();
}

#[test]
fn deregister() {
    Scenario::new(3, Some(entry(1, 4, 500)), 8, None).check_all_orders();
}

#[test]
fn replace_other_gid() {
    // A slot freed by gid 2 and reused by gid 1: a reader looking for gid 1
    // sees absent or present, never gid 2's fields under gid 1.
    Scenario::new(0, Some(entry(2, 4, 500)), 4, Some(entry(1, 5, 900))).check_all_orders();
}

/// The checker has teeth: protocols that leave out a step the reasoning in
/// `SeqlockWrite`'s docs relies on are caught by in-order readers.
#[test]
fn broken_protocols_are_caught() {
    let old = entry(1, 1, 500);
    let mut new = entry(1, 2, 800);
    new.dct_num = 99;
    let mut s = Scenario::new(1, Some(old), 2, Some(new));
    let good = s.steps.clone();
    let ascending = monotone(good.len() - 1);
    let descending: Vec<_> = ascending
        .iter()
        .map(|t| {
            let mut r = *t;
            r.reverse();
            r
        })
        .collect();
    // Without opening the tail, an ascending reader can see head and tail
    // both at the old version around a half-written body.
    s.steps = good.iter().copied().filter(|w| w != &good[1]).collect();
    assert!(s.check(ascending.iter().copied(), false).is_err());
    // Without opening the head, a descending reader can.
    s.steps = good.iter().copied().filter(|w| w != &good[0]).collect();
    assert!(s.check(descending.iter().copied(), false).is_err());
    // The intact protocol passes both.
    s.steps = good;
    let all = monotone(s.steps.len());
    assert!(s.check(all.iter().copied(), false).is_ok());
}
