//! The client's machinery shared by every operation: the doorbell funnel,
//! attempts and their deadline, the directory cache, reading a key's two
//! combined buckets (their views are `view`, re-exported here) and the KV
//! blocks that match its fingerprint.

use crate::error::Error;
use crate::error::LayoutError;
use crate::hash::KeyHash;
use crate::layout::bucket::BucketLoc;
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{directory_len, DirEntry, DIR_ENTRIES_OFFSET, DIR_ENTRY_SIZE};
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::table::DIR_PTR;
use crate::layout::{low_mask, read_u64};
use crate::remote::{Completions, OpResult, RemoteOp, Ticket, Transport, TransportError};

pub(crate) use super::view::{
    bad_response, BucketsView, InlineList, KeyCopy, SlotPos, SlotRef, SlotRefs, ViewState, NO_OP,
    NO_SLOT,
};
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
    /// An insert's tentative rivals (other inserters' uncommitted copies of
    /// its key): slot address, word, and when this operation first saw
    /// that word there.
    rivals: Vec<(RemotePtr, u64, u64)>,
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
            word.plain().raw(),
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
            rivals: Vec::new(),
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
        let raw = word.plain().raw();
        self.blocks
            .iter_mut()
            .find(|(w, _)| *w == raw)
            .and_then(|(_, b)| b.value.take())
    }

    /// How long this operation has seen the tentative `word` at `addr`
    /// (first sighting now if never: 0).
    pub(crate) fn rival_age(&mut self, addr: RemotePtr, word: Slot, now: u64) -> u64 {
        self.rivals
            .retain(|&(a, w, _)| a != addr || w == word.raw());
        match self.rivals.iter().find(|&&(a, _, _)| a == addr) {
            Some(&(_, _, first)) => now.saturating_sub(first),
            None => {
                self.rivals.push((addr, word.raw(), now));
                0
            }
        }
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

    /// How long a tentative copy must be seen unchanged before it is taken
    /// for a dead inserter's: an owner commits within `max_op_ticks` of
    /// placing its copy, or withdraws; the rest of the grace period is the
    /// skew margin (`ClientConfig` keeps `grace_ticks > 2 * max_op_ticks`).
    /// A settling insert and the sweep use it.
    pub(crate) fn tentative_dead_after(&self) -> u64 {
        self.config.grace_ticks - self.config.max_op_ticks
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

    /// Allocates a KV block, preferably on `node`. While the nodes it
    /// could use are collecting (`race-kv collect` moves from node to node;
    /// a client that met one collecting skips it for an eighth of a grace
    /// period), it waits and asks again, for up to `lease_ticks`.
    pub(crate) fn alloc_block(&mut self, node: u8, len: usize) -> Result<RemotePtr, Error> {
        let mut first = None;
        loop {
            let now = self.now();
            let r = self.alloc.alloc(
                &mut self.transport,
                &mut self.stats.transport,
                node,
                len,
                now,
            );
            let since = *first.get_or_insert(now);
            match r {
                Err(Error::Transport(TransportError::Collecting { .. }))
                    if now.saturating_sub(since) < self.config.lease_ticks =>
                {
                    self.clock.pause(self.alloc.collecting_skip());
                }
                r => return r,
            }
        }
    }

    /// Waits until more than `ticks` have passed since `since` (on this
    /// client's clock); the ticks that had passed when it returned.
    pub(crate) fn wait_past(&self, since: u64, ticks: u64) -> u64 {
        loop {
            let age = self.now().saturating_sub(since);
            if age > ticks {
                return age;
            }
            self.clock.pause(ticks - age + 1);
        }
    }

    /// No lease ends early for a lease from now (see
    /// `KvAllocator::hold_early_ends`): an operation failed with a transport
    /// error.
    pub(crate) fn hold_early_ends(&mut self) {
        let now = self.now();
        self.alloc
            .hold_early_ends(now.saturating_add(self.config.lease_ticks));
    }

    /// Gives back the surplus of the free lists, if any, and ends the
    /// leases on nodes found collecting (after a write).
    pub(crate) fn trim(&mut self) {
        let now = self.now();
        self.alloc.trim(&mut self.transport, now);
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
            let w = s.word.plain();
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
        self.copies_in(&view.matching(hash), key, ctx)
    }

    /// As [`Client::copies`], of the slots `candidates` (tentative ones
    /// included if they are in it).
    pub(crate) fn copies_in(
        &mut self,
        candidates: &[SlotRef],
        key: &[u8],
        ctx: &mut OpCtx,
    ) -> Result<Option<Vec<KeyCopy>>, Error> {
        if !self.fetch_blocks(candidates, key, ctx)? {
            return Ok(None);
        }
        Ok(Some(
            candidates
                .iter()
                .filter_map(|s| {
                    let value = ctx.cached(s.word.plain().raw())?.value.clone()?;
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
                    .map(|s| s.word.plain())
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
