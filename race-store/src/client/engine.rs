//! The client's machinery shared by every operation: the doorbell funnel,
//! attempts and their deadline, the directory cache, views of the two
//! combined buckets of a key, and reading the KV blocks that match its
//! fingerprint.

use crate::error::Error;
use crate::error::LayoutError;
use crate::hash::KeyHash;
use crate::layout::bucket::{
    choose_insert_slot, BucketLoc, BucketRole, CombinedBucket, COMBINED_SIZE, RETIRED_LOCAL_DEPTH,
};
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{directory_len, DirEntry, DIR_ENTRIES_OFFSET, DIR_ENTRY_SIZE};
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot, FP_SHIFT, SLOT_FROZEN};
use crate::layout::subtable::{SubtableGeometry, Suffix};
use crate::layout::table::DIR_PTR;
use crate::layout::{low_mask, read_u64};
use crate::remote::{Completions, OpResult, RemoteOp, Ticket, Transport, TransportError};

use super::Client;

/// The bytes of READ result `i` (taken out of the vector).
pub(crate) fn take_read(res: &mut [OpResult], i: usize) -> Result<Vec<u8>, Error> {
    match res
        .get_mut(i)
        .map(|r| core::mem::replace(r, OpResult::Written))
    {
        Some(OpResult::Read(b)) => Ok(b),
        _ => Err(bad_response("expected a READ result")),
    }
}

/// The previous value of CAS result `i`.
pub(crate) fn cas_old(res: &[OpResult], i: usize) -> Result<u64, Error> {
    res.get(i)
        .and_then(OpResult::cas_old)
        .ok_or_else(|| bad_response("expected a CAS result"))
}

/// The previous value of FAA result `i`.
pub(crate) fn take_faa(res: &mut [OpResult], i: usize) -> Result<u64, Error> {
    res.get(i)
        .and_then(OpResult::faa_old)
        .ok_or_else(|| bad_response("expected a FAA result"))
}

/// A placeholder op for batches built in place (always overwritten).
pub(super) const NO_OP: RemoteOp<'static> = RemoteOp::Faa {
    ptr: DIR_PTR,
    add: 0,
};

pub(super) fn bad_response(reason: &'static str) -> Error {
    Error::Transport(TransportError::BadResponse { reason })
}

/// The client's copy of the directory. It may be stale: bucket headers tell.
#[derive(Debug, Default, Clone)]
pub(crate) struct DirCache {
    header: DirHeader,
    entries: Vec<DirEntry>,
}

impl DirCache {
    pub(crate) fn global_depth(&self) -> u8 {
        self.header.global_depth()
    }

    pub(crate) fn header(&self) -> DirHeader {
        self.header
    }

    pub(crate) fn entries(&self) -> &[DirEntry] {
        &self.entries
    }

    pub(crate) fn lookup(&self, hash: &KeyHash) -> Option<DirEntry> {
        let i = hash.dir_hash() & low_mask(self.global_depth());
        self.entries.get(usize::try_from(i).ok()?).copied()
    }

    /// Applies a doubling this client just made.
    pub(crate) fn apply_double(&mut self, upper: Vec<DirEntry>, header: DirHeader) {
        self.entries.extend(upper);
        self.header = header;
    }

    /// Applies entry rewrites this client just made.
    pub(crate) fn apply_rewrites(&mut self, rewrites: &[(usize, DirEntry)]) {
        for &(i, e) in rewrites {
            if let Some(slot) = self.entries.get_mut(i) {
                *slot = e;
            }
        }
    }
}

/// Per-operation state: attempts, the current attempt's start, and the KV
/// blocks read so far (by slot word).
#[derive(Debug, Default)]
pub(crate) struct OpCtx {
    pub(crate) attempts: u32,
    pub(crate) start: u64,
    /// Few entries (the fingerprint matches of one key): a vector, searched
    /// linearly, costs less than hashing.
    blocks: Vec<(u64, CachedBlock)>,
}

#[derive(Debug)]
pub(crate) struct CachedBlock {
    /// Start of the attempt that read it.
    start: u64,
    /// The value if the block holds the key, `None` if another key.
    value: Option<Vec<u8>>,
}

impl OpCtx {
    /// Records that the block of `word` holds this operation's key with
    /// `value` (a block the operation wrote itself), as read at `start`.
    pub(crate) fn remember(&mut self, word: Slot, value: &[u8], start: u64) {
        self.cache(
            word.thawed().raw(),
            CachedBlock {
                start,
                value: Some(value.to_vec()),
            },
        );
    }

    /// An operation state whose block cache reuses `blocks`' storage.
    pub(crate) fn reusing(mut blocks: Vec<(u64, CachedBlock)>) -> Self {
        blocks.clear();
        Self {
            attempts: 0,
            start: 0,
            blocks,
        }
    }

    /// The block cache's storage, emptied, for [`OpCtx::reusing`].
    pub(crate) fn into_storage(mut self) -> Vec<(u64, CachedBlock)> {
        self.blocks.clear();
        self.blocks
    }

    /// Takes the value of the cached block of `word` (which then reads as
    /// not holding the key: call only when the operation is done with it).
    pub(crate) fn take_value(&mut self, word: Slot) -> Option<Vec<u8>> {
        let raw = word.thawed().raw();
        self.blocks
            .iter_mut()
            .find(|(w, _)| *w == raw)
            .and_then(|(_, b)| b.value.take())
    }

    fn cached(&self, raw: u64) -> Option<&CachedBlock> {
        self.blocks.iter().find(|(w, _)| *w == raw).map(|(_, b)| b)
    }

    fn cache(&mut self, raw: u64, block: CachedBlock) {
        match self.blocks.iter_mut().find(|(w, _)| *w == raw) {
            Some((_, b)) => *b = block,
            None => self.blocks.push((raw, block)),
        }
    }
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
/// (header words never: their bit is cleared). A branch-free loop; a
/// fingerprint is never 0, so a matching word is never empty (nor the
/// frozen empty word).
fn fp_mask(words: &[u64; COMBINED_WORDS], fp: u8) -> u32 {
    let mut mask = 0u32;
    for (w, &raw) in words.iter().enumerate() {
        mask |= u32::from(raw >> FP_SHIFT == u64::from(fp)) << w;
    }
    mask & SLOT_WORDS
}

/// Filler of unused [`SlotRefs`] room.
pub(super) const NO_SLOT: SlotRef = SlotRef {
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

    /// The distinct slots of both combined buckets whose fingerprint is
    /// `hash`'s (occupied, frozen or not), in address order (the two
    /// combined buckets may share their overflow bucket: each slot appears
    /// once).
    pub(crate) fn matching(&self, hash: &KeyHash) -> SlotRefs {
        let fp = hash.fingerprint().get();
        let masks = self.words.map(|w| fp_mask(&w, fp));
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
                *mask = fp_mask(words, fp);
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

    /// Where to insert (see [`choose_insert_slot`]), `None` if all four
    /// buckets are full.
    pub(crate) fn choose_insert(&self) -> Option<SlotPos> {
        let (b0, b1) = (self.bytes(0)?, self.bytes(1)?);
        let c0 = CombinedBucket::new_checked(&b0[..], self.locs[0].side).ok()?;
        let c1 = CombinedBucket::new_checked(&b1[..], self.locs[1].side).ok()?;
        let t = choose_insert_slot([&c0, &c1])?;
        Some(SlotPos {
            loc: *self.locs.get(t.candidate)?,
            role: t.role,
            index: t.slot,
        })
    }
}

impl<T: Transport> Client<T> {
    /// One doorbell into reusable storage: every round trip of the client
    /// goes through here or [`Client::exec`].
    pub(crate) fn exec_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), Error> {
        self.stats.transport.record(batch);
        self.note_atomics(batch);
        self.transport.execute_into(batch, out)?;
        if out.len() != batch.len() {
            return Err(bad_response("result count differs from the batch"));
        }
        Ok(())
    }

    /// Posts one doorbell that may stay in flight
    /// ([`Transport::post_into`]); [`Client::complete_into`] waits for it.
    pub(crate) fn post_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, Error> {
        self.stats.transport.record(batch);
        self.note_atomics(batch);
        Ok(self.transport.post_into(batch, out)?)
    }

    /// Waits for a doorbell of [`Client::post_into`].
    pub(crate) fn complete_into(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), Error> {
        self.transport.complete_into(ticket, batch, out)?;
        if out.len() != batch.len() {
            return Err(bad_response("result count differs from the batch"));
        }
        Ok(())
    }

    /// One doorbell, results as owned values (the cold paths).
    pub(crate) fn exec(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, Error> {
        self.stats.transport.record(batch);
        self.note_atomics(batch);
        let res = self.transport.execute(batch)?;
        if res.len() != batch.len() {
            return Err(bad_response("result count differs from the batch"));
        }
        Ok(res)
    }

    /// Remembers that the current operation sent an atomic (see
    /// [`Error::OutcomeUnknown`]).
    #[inline]
    fn note_atomics(&mut self, batch: &[RemoteOp<'_>]) {
        if !self.atomic_sent {
            self.atomic_sent = batch
                .iter()
                .any(|op| matches!(op, RemoteOp::Cas { .. } | RemoteOp::Faa { .. }));
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Starts (or restarts) an attempt of an operation.
    pub(crate) fn begin_attempt(&mut self, ctx: &mut OpCtx) -> Result<(), Error> {
        if ctx.attempts >= self.config.max_attempts {
            return Err(Error::Contention {
                attempts: ctx.attempts,
            });
        }
        if ctx.attempts > 0 {
            self.stats.retries += 1;
        }
        ctx.attempts += 1;
        ctx.start = self.now();
        Ok(())
    }

    /// Whether the current attempt may still use what it read.
    pub(crate) fn fresh(&self, ctx: &OpCtx) -> bool {
        self.now().saturating_sub(ctx.start) <= self.config.max_op_ticks
    }

    pub(crate) fn backoff(&self, ctx: &OpCtx) {
        self.clock.backoff(ctx.attempts);
    }

    /// A CAS on a slot of this operation found another writer's word:
    /// counted, and under [`super::ConflictPolicy::Backoff`] waited out
    /// before the retry: a random pause below the lost attempt's own
    /// duration (its window, from `since`: the time another writer needs
    /// to finish the same steps) doubled per loss of the operation
    /// (`losses`, from 1) up to 16 windows, and at most a quarter of
    /// `max_op_ticks`.
    pub(crate) fn lost_cas(&mut self, losses: u32, since: u64) {
        self.stats.cas_failures += 1;
        if self.config.conflict != super::ConflictPolicy::Backoff {
            return;
        }
        let window = self.now().saturating_sub(since).max(1);
        let span = window
            .saturating_mul(1 << losses.clamp(1, 5).saturating_sub(1))
            .min(self.config.max_op_ticks / 4)
            .max(1);
        // xorshift64: a few instructions, per client, seeded at open.
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter = x;
        self.clock.pause(x % (span + 1));
    }

    /// Allocates a KV block, preferably on `node`.
    pub(crate) fn alloc_block(&mut self, node: u8, len: usize) -> Result<RemotePtr, Error> {
        let now = self.now();
        self.alloc.alloc(
            &mut self.transport,
            &mut self.stats.transport,
            node,
            len,
            now,
        )
    }

    /// Retires the block of a slot this client unlinked.
    pub(crate) fn retire(&mut self, word: Slot) {
        let now = self.now();
        self.alloc.retire(word, now);
    }

    /// Re-reads the directory: one READ of the header and the entries at the
    /// cached depth, a second one if the directory has grown.
    pub(crate) fn refresh_directory(&mut self) -> Result<(), Error> {
        self.stats.dir_refreshes += 1;
        let max = self.table.max_global_depth;
        let mut last = LayoutError::MalformedDirWord {
            raw: 0,
            reason: "directory never read",
        };
        for _ in 0..16 {
            let guess = directory_len(self.dir.global_depth().min(max))?;
            let mut res = self.exec(&[RemoteOp::Read {
                ptr: DIR_PTR,
                len: guess as u32,
            }])?;
            let mut buf = take_read(&mut res, 0)?;
            let header = match DirHeader::from_raw(read_u64(&buf, 0)).validate() {
                Ok(h) if h.global_depth() <= max => h,
                Ok(h) => {
                    last = LayoutError::DepthOutOfRange {
                        depth: h.global_depth().into(),
                        max,
                    };
                    continue;
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let g = header.global_depth();
            let need = directory_len(g)?;
            if need > buf.len() {
                let mut res = self.exec(&[RemoteOp::Read {
                    ptr: DIR_PTR.add(buf.len() as u64)?,
                    len: (need - buf.len()) as u32,
                }])?;
                buf.extend(take_read(&mut res, 0)?);
            }
            let entries: Vec<DirEntry> = (0..1usize << g)
                .map(|i| {
                    DirEntry::from_raw(read_u64(&buf, DIR_ENTRIES_OFFSET + i * DIR_ENTRY_SIZE))
                })
                .collect();
            match entries.iter().try_for_each(|e| {
                e.validate(g)?;
                if e.ptr().offset() == 0 {
                    return Err(LayoutError::MalformedDirWord {
                        raw: e.raw(),
                        reason: "entry points to offset 0",
                    });
                }
                Ok(())
            }) {
                Ok(()) => {
                    self.dir = DirCache { header, entries };
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(Error::corrupt("directory", last))
    }

    /// The subtable the cached directory gives for `hash`, and the key's two
    /// bucket locations in it.
    pub(crate) fn locate(&self, hash: &KeyHash) -> Result<(RemotePtr, [BucketLoc; 2]), Error> {
        let entry = self.dir.lookup(hash).ok_or(Error::BadTable {
            reason: "empty directory cache",
        })?;
        Ok((entry.ptr(), hash.bucket_locs(self.table.geometry)))
    }

    /// One doorbell: `pre` (e.g. the WRITE of a new KV block), then READs of
    /// both combined buckets of `hash` (one READ if they coincide).
    pub(crate) fn read_buckets(
        &mut self,
        hash: &KeyHash,
        pre: &[RemoteOp<'_>],
    ) -> Result<BucketsView, Error> {
        let (sub, locs) = self.locate(hash)?;
        let geometry = self.table.geometry;
        // The batch on the stack for the usual `pre` of at most one op.
        let mut small = [NO_OP; 3];
        let mut large = Vec::new();
        let ops: &mut [RemoteOp<'_>] = if pre.len() + 2 <= small.len() {
            &mut small
        } else {
            large.resize(pre.len() + 2, NO_OP);
            &mut large
        };
        ops.get_mut(..pre.len())
            .ok_or_else(|| bad_response("batch too long"))?
            .copy_from_slice(pre);
        let n = BucketsView::put_read_ops(ops, pre.len(), sub, geometry, locs)?;
        let batch = ops.get(..n).unwrap_or(&[]);
        let mut res = std::mem::take(&mut self.results);
        let view = self.exec_into(batch, &mut res).and_then(|()| {
            let second = if locs[0] == locs[1] { 0 } else { 1 };
            BucketsView::from_reads(
                sub,
                geometry,
                locs,
                res.read(pre.len()),
                res.read(pre.len() + second),
            )
        });
        self.results = res;
        view
    }

    /// Reads the KV blocks of `candidates` not read yet in this operation
    /// (or read by an attempt that is too old) into `ctx`'s block cache, in
    /// one doorbell. `Ok(false)` if a block failed its checks (torn or
    /// reused): retry the attempt.
    fn fetch_blocks(
        &mut self,
        candidates: &[SlotRef],
        key: &[u8],
        ctx: &mut OpCtx,
    ) -> Result<bool, Error> {
        let (start, max) = (ctx.start, self.config.max_op_ticks);
        ctx.blocks
            .retain(|(_, b)| start.saturating_sub(b.start) <= max);
        let mut need = InlineList::<Slot, 4>::new(Slot::EMPTY);
        for s in candidates {
            let w = s.word.thawed();
            if ctx.cached(w.raw()).is_none() && !need.contains(&w) {
                need.push(w);
            }
        }
        if need.is_empty() {
            return Ok(true);
        }
        need.as_mut_slice().sort_unstable_by_key(|w| w.raw());
        let mut ops = InlineList::<RemoteOp<'_>, 4>::new(NO_OP);
        for w in need.iter() {
            ops.push(RemoteOp::Read {
                ptr: w.ptr(),
                len: w.block_len() as u32,
            });
        }
        let mut res = std::mem::take(&mut self.results);
        let r = self.exec_into(&ops, &mut res).and_then(|()| {
            for (i, w) in need.iter().enumerate() {
                let buf = res
                    .read(i)
                    .ok_or_else(|| bad_response("expected a READ result"))?;
                let value = match kv::decode_for_key(buf, key) {
                    Ok(kv) if kv.block_len() == w.block_len() => Some(kv.value().to_vec()),
                    Err(LayoutError::KeyMismatch) => None,
                    _ => {
                        self.stats.bad_blocks += 1;
                        return Ok(false);
                    }
                };
                ctx.cache(w.raw(), CachedBlock { start, value });
            }
            Ok(true)
        });
        self.results = res;
        r
    }

    /// The copies of `key` in `view`, lowest address first: the slots whose
    /// fingerprint matches, with their KV blocks read in one doorbell (blocks
    /// already read in this operation are reused while still fresh). `None`
    /// if a block failed its checks (torn or reused): retry the attempt.
    pub(crate) fn copies(
        &mut self,
        view: &BucketsView,
        key: &[u8],
        hash: &KeyHash,
        ctx: &mut OpCtx,
    ) -> Result<Option<Vec<KeyCopy>>, Error> {
        let candidates = view.matching(hash);
        if !self.fetch_blocks(&candidates, key, ctx)? {
            return Ok(None);
        }
        Ok(Some(
            candidates
                .iter()
                .filter_map(|s| {
                    let value = ctx.cached(s.word.thawed().raw())?.value.clone()?;
                    Some(KeyCopy {
                        addr: s.addr,
                        word: s.word,
                        value,
                    })
                })
                .collect(),
        ))
    }

    /// The value a get returns from `candidates` (the fingerprint matches
    /// of a view, [`BucketsView::search`]): that of the copy of `key` at the
    /// lowest slot address, their KV blocks read in one doorbell (blocks
    /// already read in this operation are reused while still fresh).
    /// `Ok(None)` if a block failed its checks (torn or reused: retry the
    /// attempt), `Ok(Some(None))` if the key is absent.
    pub(crate) fn lowest_value(
        &mut self,
        candidates: &[SlotRef],
        key: &[u8],
        ctx: &mut OpCtx,
    ) -> Result<Option<Option<Vec<u8>>>, Error> {
        match candidates {
            [] => Ok(Some(None)),
            // The common case, one match and nothing read yet in this
            // operation: its block, straight from the doorbell's result (a
            // retry never needs it again: it restarts on a failed check,
            // and an attempt that ran out of time drops what it read).
            [c] if ctx.blocks.is_empty() => {
                let w = c.word.thawed();
                let op = [RemoteOp::Read {
                    ptr: w.ptr(),
                    len: w.block_len() as u32,
                }];
                let mut res = std::mem::take(&mut self.results);
                let r = self.exec_into(&op, &mut res).and_then(|()| {
                    let buf = res
                        .read(0)
                        .ok_or_else(|| bad_response("expected a READ result"))?;
                    Ok(match kv::decode_for_key(buf, key) {
                        Ok(kv) if kv.block_len() == w.block_len() => {
                            Some(Some(kv.value().to_vec()))
                        }
                        Err(LayoutError::KeyMismatch) => Some(None),
                        _ => None,
                    })
                });
                self.results = res;
                if matches!(r, Ok(None)) {
                    self.stats.bad_blocks += 1;
                }
                r
            }
            _ => {
                if !self.fetch_blocks(candidates, key, ctx)? {
                    return Ok(None);
                }
                let lowest = candidates
                    .iter()
                    .map(|s| s.word.thawed())
                    .find(|w| ctx.cached(w.raw()).is_some_and(|b| b.value.is_some()));
                Ok(Some(lowest.and_then(|w| ctx.take_value(w))))
            }
        }
    }

    /// Waits for the split of `sub`, which holds `hash`'s buckets and was
    /// seen frozen or retired: re-reads the directory; if it still points
    /// to `sub`, either backs off (a live lease: the splitter is working) or
    /// takes the resize lock over (the lease expired, or nobody holds it) and
    /// finishes the logged split.
    pub(crate) fn await_split(
        &mut self,
        hash: &KeyHash,
        sub: RemotePtr,
        ctx: &OpCtx,
    ) -> Result<(), Error> {
        self.refresh_directory()?;
        if self.locate(hash)?.0 != sub {
            return Ok(());
        }
        self.stats.split_waits += 1;
        let h = self.dir.header();
        let (now, _) = self.lease_clock();
        if !h.is_locked() || h.lease_expired(now) {
            self.take_over(ctx)
        } else {
            self.backoff(ctx);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::bucket::MainSide;
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
