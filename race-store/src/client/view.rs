//! Views of the two combined buckets of a key, read in one doorbell:
//! finding the slots whose fingerprint matches (in address order, each
//! once), the view's state (current, frozen by a split, stale, retired),
//! and choosing an empty slot; with the small fixed-capacity list the
//! matches are kept in. Below the client's engine, which reads them.

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::bucket::{
    choose_insert_slot_except, BucketLoc, BucketRole, CombinedBucket, InsertTarget, COMBINED_SIZE,
    RETIRED_LOCAL_DEPTH,
};
use crate::layout::slot::{RemotePtr, Slot, FP_SHIFT, SLOT_FROZEN, SLOT_TENTATIVE};
use crate::layout::subtable::{SubtableGeometry, Suffix};
use crate::layout::table::DIR_PTR;
use crate::remote::{OpResult, RemoteOp, TransportError};

/// A placeholder op for batches built in place (always overwritten).
pub(crate) const NO_OP: RemoteOp<'static> = RemoteOp::Faa {
    ptr: DIR_PTR,
    add: 0,
};

pub(crate) fn bad_response(reason: &'static str) -> Error {
    Error::Transport(TransportError::BadResponse { reason })
}

/// A slot's place in a subtable, independent of the subtable's address (a
/// split copies a slot to the same place in the new subtable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotPos {
    pub(crate) loc: BucketLoc,
    pub(crate) role: BucketRole,
    pub(crate) index: usize,
}

/// A slot seen in a view.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotRef {
    pub(crate) addr: RemotePtr,
    pub(crate) word: Slot,
}

/// A slot that holds the key, with its value.
#[derive(Clone, Debug)]
pub(crate) struct KeyCopy {
    pub(crate) addr: RemotePtr,
    pub(crate) word: Slot,
    pub(crate) value: Vec<u8>,
}

/// What a view says about the key's subtable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ViewState {
    /// Current and writable.
    Ok,
    /// Current, but being split: readable, not writable.
    Frozen,
    /// Another subtable holds the key: the directory cache is stale.
    Stale,
    /// Split (retired), or read torn across the retiring write.
    Retired,
}

/// The two combined buckets of a key, as read in one doorbell (copied into
/// the view as little-endian words: no allocation, and the scans below are
/// plain word loops).
#[derive(Clone, Debug)]
pub(crate) struct BucketsView {
    sub: RemotePtr,
    geometry: SubtableGeometry,
    locs: [BucketLoc; 2],
    /// Where each combined bucket was read.
    at: [RemotePtr; 2],
    words: [[u64; COMBINED_WORDS]; 2],
}

/// Words of a combined bucket: two buckets of a header word and 7 slots.
const COMBINED_WORDS: usize = COMBINED_SIZE / 8;
/// Words per bucket (the header is word 0 of each).
const BUCKET_WORDS: usize = COMBINED_WORDS / 2;
/// The slot words of a combined bucket, as a bit mask (all but the two
/// header words).
const SLOT_WORDS: u32 = ((1 << COMBINED_WORDS) - 1) & !1 & !(1 << BUCKET_WORDS);

/// A short list kept inline (the common case: a key's fingerprint matches
/// one or two slots), spilling to the heap past `N` entries.
#[derive(Clone, Debug)]
pub(crate) struct InlineList<T: Copy, const N: usize> {
    n: usize,
    inline: [T; N],
    spill: Vec<T>,
}

impl<T: Copy, const N: usize> InlineList<T, N> {
    /// An empty list; `fill` only initializes the unused inline room.
    pub(crate) fn new(fill: T) -> Self {
        Self {
            n: 0,
            inline: [fill; N],
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, v: T) {
        if self.spill.is_empty() {
            if let Some(e) = self.inline.get_mut(self.n) {
                *e = v;
                self.n += 1;
                return;
            }
            self.spill.extend_from_slice(&self.inline);
        }
        self.spill.push(v);
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.spill.is_empty() {
            self.inline.get_mut(..self.n).unwrap_or(&mut [])
        } else {
            &mut self.spill
        }
    }
}

impl<T: Copy, const N: usize> core::ops::Deref for InlineList<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.spill.is_empty() {
            self.inline.get(..self.n).unwrap_or(&[])
        } else {
            &self.spill
        }
    }
}

/// Slots of a view, in address order.
pub(crate) type SlotRefs = InlineList<SlotRef, 4>;

/// Bit `w` set iff slot word `w` of a combined bucket has fingerprint `fp`
/// and, unless `tentative`, is committed (header words never: their bit is
/// cleared). A branch-free loop; a fingerprint is never 0, so a matching
/// word is never empty (nor the frozen empty word).
fn fp_mask(words: &[u64; COMBINED_WORDS], fp: u8, tentative: bool) -> u32 {
    let skip = if tentative { 0 } else { SLOT_TENTATIVE };
    let mut mask = 0u32;
    for (w, &raw) in words.iter().enumerate() {
        mask |= u32::from((raw >> FP_SHIFT == u64::from(fp)) & (raw & skip == 0)) << w;
    }
    mask & SLOT_WORDS
}

/// Filler of unused [`SlotRefs`] room.
pub(crate) const NO_SLOT: SlotRef = SlotRef {
    addr: DIR_PTR,
    word: Slot::EMPTY,
};

impl BucketsView {
    /// The subtable.
    pub(crate) fn sub(&self) -> RemotePtr {
        self.sub
    }

    fn distinct(&self) -> usize {
        if self.locs[0] == self.locs[1] {
            1
        } else {
            2
        }
    }

    /// Appends the READs of both combined buckets (one if they coincide) to
    /// `ops`, from index `at`; returns the new length.
    pub(super) fn put_read_ops(
        ops: &mut [RemoteOp<'_>],
        at: usize,
        sub: RemotePtr,
        geometry: SubtableGeometry,
        locs: [BucketLoc; 2],
    ) -> Result<usize, Error> {
        let n = if locs[0] == locs[1] { 1 } else { 2 };
        for (k, &loc) in locs.iter().take(n).enumerate() {
            let op = ops
                .get_mut(at + k)
                .ok_or_else(|| bad_response("batch too long"))?;
            *op = RemoteOp::Read {
                ptr: sub.add(geometry.combined_offset(loc)?)?,
                len: COMBINED_SIZE as u32,
            };
        }
        Ok(at + n)
    }

    /// The READs that re-read this view.
    pub(crate) fn read_ops(&self) -> Result<Vec<RemoteOp<'static>>, Error> {
        let mut ops = [NO_OP; 2];
        let n = Self::put_read_ops(&mut ops, 0, self.sub, self.geometry, self.locs)?;
        Ok(ops.get(..n).unwrap_or(&[]).to_vec())
    }

    /// The same buckets, from READ results at `at..` of a doorbell that
    /// carried [`BucketsView::read_ops`].
    pub(crate) fn reread(&self, res: &mut [OpResult], at: usize) -> Result<Self, Error> {
        let get = |i: usize| res.get(i).and_then(OpResult::read_bytes);
        let second = if self.distinct() == 1 { at } else { at + 1 };
        Self::from_reads(self.sub, self.geometry, self.locs, get(at), get(second))
    }

    pub(super) fn from_reads(
        sub: RemotePtr,
        geometry: SubtableGeometry,
        locs: [BucketLoc; 2],
        first: Option<&[u8]>,
        second: Option<&[u8]>,
    ) -> Result<Self, Error> {
        let copy = |b: Option<&[u8]>| -> Result<[u64; COMBINED_WORDS], Error> {
            let b = b
                .and_then(|b| <&[u8; COMBINED_SIZE]>::try_from(b).ok())
                .ok_or_else(|| bad_response("expected a combined bucket READ result"))?;
            let mut words = [0u64; COMBINED_WORDS];
            for (w, c) in words.iter_mut().zip(b.chunks_exact(8)) {
                *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
            }
            Ok(words)
        };
        let at = |loc: BucketLoc| -> Result<RemotePtr, Error> {
            Ok(sub.add(geometry.combined_offset(loc)?)?)
        };
        Ok(Self {
            sub,
            geometry,
            locs,
            at: [at(locs[0])?, at(locs[1])?],
            words: [copy(first)?, copy(second)?],
        })
    }

    /// The bytes of combined bucket `i` (for the cold paths that parse it
    /// with [`CombinedBucket`]).
    fn bytes(&self, i: usize) -> Option<[u8; COMBINED_SIZE]> {
        let words = self.words.get(i)?;
        let mut buf = [0u8; COMBINED_SIZE];
        for (c, w) in buf.chunks_exact_mut(8).zip(words) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        Some(buf)
    }

    /// What the two headers of a combined bucket say, and whether any of its
    /// slots is frozen; `None` for a retired or torn combined bucket (either
    /// header retired, the two headers differ, or a garbage header): the
    /// answers of [`CombinedBucket::is_retired`] and
    /// [`CombinedBucket::header`], in one pass over the words.
    #[inline]
    fn scan_header(words: &[u64; COMBINED_WORDS], hash: &KeyHash) -> Option<(bool, bool)> {
        let (h0, h1) = (words[0], words[BUCKET_WORDS]);
        // Header word: local depth in the low half, suffix in the high half.
        if h0 as u32 == RETIRED_LOCAL_DEPTH || h1 as u32 == RETIRED_LOCAL_DEPTH || h0 != h1 {
            return None;
        }
        let suffix = Suffix::from_header(h0 as u32, (h0 >> 32) as u32).ok()?;
        // The OR of the slot words (not the headers: their bit 0 is a local
        // depth bit).
        let mut any = 0;
        for (w, &raw) in words.iter().enumerate() {
            if w % BUCKET_WORDS != 0 {
                any |= raw;
            }
        }
        Some((!suffix.contains(hash.dir_hash()), any & SLOT_FROZEN != 0))
    }

    /// What the headers and slots say (see [`ViewState`]).
    pub(crate) fn state(&self, hash: &KeyHash) -> ViewState {
        self.scan(hash, None).0
    }

    /// A search's view of both combined buckets in one pass over their
    /// words: what the headers say ([`BucketsView::state`]) and, unless that
    /// is `Stale` or `Retired`, the slots whose fingerprint is `hash`'s
    /// ([`BucketsView::matching`]).
    pub(crate) fn search(&self, hash: &KeyHash) -> (ViewState, SlotRefs) {
        let fp = hash.fingerprint().get();
        let (state, masks) = self.scan(hash, Some(fp));
        match state {
            ViewState::Ok | ViewState::Frozen => (state, self.slots_of(masks)),
            ViewState::Stale | ViewState::Retired => (state, SlotRefs::new(NO_SLOT)),
        }
    }

    /// The distinct committed slots of both combined buckets whose
    /// fingerprint is `hash`'s (frozen or not), in address order (the two
    /// combined buckets may share their overflow bucket: each slot appears
    /// once). Tentative copies are not the key's yet: readers and writers
    /// never see them.
    pub(crate) fn matching(&self, hash: &KeyHash) -> SlotRefs {
        let fp = hash.fingerprint().get();
        let masks = self.words.map(|w| fp_mask(&w, fp, false));
        self.slots_of(masks)
    }

    /// As [`BucketsView::matching`], the tentative copies included: what an
    /// inserter settles its own copy against.
    pub(crate) fn claims(&self, hash: &KeyHash) -> SlotRefs {
        let fp = hash.fingerprint().get();
        let masks = self.words.map(|w| fp_mask(&w, fp, true));
        self.slots_of(masks)
    }

    /// The state, and with `fp` the masks of the slot words whose
    /// fingerprint is `fp` in each distinct combined bucket.
    fn scan(&self, hash: &KeyHash, fp: Option<u8>) -> (ViewState, [u32; 2]) {
        let (mut stale, mut frozen) = (false, false);
        let mut masks = [0u32; 2];
        for (words, mask) in self.words.iter().zip(&mut masks).take(self.distinct()) {
            let Some((s, f)) = Self::scan_header(words, hash) else {
                return (ViewState::Retired, [0; 2]);
            };
            stale |= s;
            frozen |= f;
            if let Some(fp) = fp {
                *mask = fp_mask(words, fp, false);
            }
        }
        let state = if stale {
            ViewState::Stale
        } else if frozen {
            ViewState::Frozen
        } else {
            ViewState::Ok
        };
        (state, masks)
    }

    /// The slots named by `masks` (bit `w`: word `w` of a combined bucket),
    /// in address order, each once. Combined buckets start on 64 B
    /// boundaries, 128 B apart or more unless they are the two of one group
    /// (64 B apart, sharing the overflow bucket: the upper one's first
    /// bucket is the lower one's second).
    fn slots_of(&self, masks: [u32; 2]) -> SlotRefs {
        let mut out = SlotRefs::new(NO_SLOT);
        let mut order = [(self.at[0], masks[0], 0usize), (self.at[1], masks[1], 1)];
        if self.distinct() == 1 {
            order[1].1 = 0;
        } else if order[1].0 < order[0].0 {
            order.swap(0, 1);
        }
        let overlap = order[0]
            .0
            .offset()
            .saturating_add(COMBINED_SIZE as u64)
            .saturating_sub(order[1].0.offset());
        if overlap > 0 && order[0].0.node() == order[1].0.node() {
            let shared = (overlap / 8).min(COMBINED_WORDS as u64) as u32;
            order[1].1 &= !((1u32 << shared) - 1);
        }
        for (at, mut mask, i) in order {
            let Some(words) = self.words.get(i) else {
                continue;
            };
            while mask != 0 {
                let w = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let (Some(&raw), Ok(addr)) = (words.get(w), at.add(w as u64 * 8)) else {
                    continue;
                };
                out.push(SlotRef {
                    addr,
                    word: Slot::from_raw(raw),
                });
            }
        }
        out
    }

    /// The address of the slot at `pos` in this view's subtable.
    pub(crate) fn addr_of(&self, pos: SlotPos) -> Result<RemotePtr, Error> {
        let off = self.geometry.slot_offset(pos.loc, pos.role, pos.index)?;
        Ok(self.sub.add(off)?)
    }

    /// Where to insert (see [`crate::layout::bucket::choose_insert_slot`]), `None` if all four
    /// buckets are full.
    pub(crate) fn choose_insert(&self) -> Option<SlotPos> {
        self.choose_insert_except(&[])
    }

    /// [`BucketsView::choose_insert`] among the empty slots not in
    /// `claimed` (slots other writes of the same batch wave chose: the
    /// images do not show them taken yet).
    pub(crate) fn choose_insert_except(&self, claimed: &[RemotePtr]) -> Option<SlotPos> {
        let (b0, b1) = (self.bytes(0)?, self.bytes(1)?);
        let c0 = CombinedBucket::new_checked(&b0[..], self.locs[0].side).ok()?;
        let c1 = CombinedBucket::new_checked(&b1[..], self.locs[1].side).ok()?;
        let pos = |t: &InsertTarget| -> Option<SlotPos> {
            Some(SlotPos {
                loc: *self.locs.get(t.candidate)?,
                role: t.role,
                index: t.slot,
            })
        };
        let t = choose_insert_slot_except([&c0, &c1], |t| {
            !claimed.is_empty()
                && pos(t)
                    .and_then(|p| self.addr_of(p).ok())
                    .is_some_and(|a| claimed.contains(&a))
        })?;
        pos(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::bucket::MainSide;
    use crate::layout::read_u64;
    use crate::layout::slot::LEN_SHIFT;

    /// The matches of `fp` found the slow way: every slot of both images at
    /// its address, sorted, each address once.
    fn reference(view: &BucketsView, images: [&[u8]; 2], fp: u8) -> Vec<(RemotePtr, u64)> {
        let mut all = Vec::new();
        for (i, img) in images.iter().enumerate().take(view.distinct()) {
            for w in (0..COMBINED_WORDS).filter(|w| w % BUCKET_WORDS != 0) {
                let raw = read_u64(img, w * 8);
                if raw >> FP_SHIFT == u64::from(fp) {
                    all.push((view.at[i].add(w as u64 * 8).unwrap(), raw));
                }
            }
        }
        all.sort_unstable();
        all.dedup_by_key(|e| e.0);
        all
    }

    #[test]
    fn search_finds_each_matching_slot_once_in_address_order() {
        let sub = RemotePtr::new(1, 1 << 20).unwrap();
        let g = SubtableGeometry::DEFAULT;
        let hash = KeyHash::from_raw(0, 0);
        let fp = hash.fingerprint().get();
        let other = if fp == 255 { 1 } else { fp + 1 };
        // The 24 words of group `group`: headers (0, 0), every third slot
        // word matching `fp`, each word distinct.
        let group = |group: u32| -> Vec<u64> {
            (0..24u64)
                .map(|w| match w % 8 {
                    0 => 0,
                    _ => {
                        let f = if (w + u64::from(group)) % 3 == 0 {
                            fp
                        } else {
                            other
                        };
                        (u64::from(f) << FP_SHIFT)
                            | (1 << LEN_SHIFT)
                            | ((u64::from(group) * 24 + w) * 64)
                    }
                })
                .collect()
        };
        // The bytes of the combined bucket at `loc`: group words 0..16
        // (left) or 8..24 (right).
        let image = |loc: BucketLoc| -> Vec<u8> {
            let start = if loc.side == MainSide::Left { 0 } else { 8 };
            group(loc.group)[start..start + 16]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect()
        };
        let loc = |group, side| BucketLoc { group, side };
        for locs in [
            // The two main buckets of one group: they share the overflow.
            [loc(5, MainSide::Right), loc(5, MainSide::Left)],
            [loc(5, MainSide::Left), loc(5, MainSide::Right)],
            [loc(9, MainSide::Left), loc(2, MainSide::Right)],
            [loc(2, MainSide::Right), loc(3, MainSide::Left)],
            [loc(3, MainSide::Left), loc(3, MainSide::Left)],
        ] {
            let (a, b) = (image(locs[0]), image(locs[1]));
            let view = BucketsView::from_reads(sub, g, locs, Some(&a), Some(&b)).unwrap();
            let (state, found) = view.search(&hash);
            assert_eq!(state, ViewState::Ok);
            let got: Vec<_> = found.iter().map(|s| (s.addr, s.word.raw())).collect();
            let want = reference(&view, [&a, &b], fp);
            assert!(want.len() >= 4, "the layout has matches to find");
            assert_eq!(got, want, "locs {locs:?}");
            let again: Vec<_> = view
                .matching(&hash)
                .iter()
                .map(|s| (s.addr, s.word.raw()))
                .collect();
            assert_eq!(again, got);
        }
    }
}
