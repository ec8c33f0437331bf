//! The client's machinery shared by every operation: the doorbell funnel,
//! attempts and their deadline, the directory cache, views of the two
//! combined buckets of a key, and reading the KV blocks that match its
//! fingerprint.

use crate::error::Error;
use crate::error::LayoutError;
use crate::hash::KeyHash;
use crate::layout::bucket::{choose_insert_slot, BucketLoc, BucketRole, CombinedBucket};
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{directory_len, DirEntry, DIR_ENTRIES_OFFSET, DIR_ENTRY_SIZE};
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::SubtableGeometry;
use crate::layout::table::DIR_PTR;
use crate::layout::{low_mask, read_u64};
use crate::remote::{OpResult, RemoteOp, Transport, TransportError};

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

fn bad_response(reason: &'static str) -> Error {
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
struct CachedBlock {
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

/// The two combined buckets of a key, as read in one doorbell.
#[derive(Clone, Debug)]
pub(crate) struct BucketsView {
    sub: RemotePtr,
    geometry: SubtableGeometry,
    locs: [BucketLoc; 2],
    bufs: [Vec<u8>; 2],
}

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

    fn read_ops_for(
        sub: RemotePtr,
        geometry: SubtableGeometry,
        locs: [BucketLoc; 2],
    ) -> Result<Vec<RemoteOp<'static>>, Error> {
        let mut ops = Vec::with_capacity(2);
        Self::push_read_ops(&mut ops, sub, geometry, locs)?;
        Ok(ops)
    }

    /// Appends the READs of both combined buckets (one if they coincide).
    fn push_read_ops(
        ops: &mut Vec<RemoteOp<'_>>,
        sub: RemotePtr,
        geometry: SubtableGeometry,
        locs: [BucketLoc; 2],
    ) -> Result<(), Error> {
        let n = if locs[0] == locs[1] { 1 } else { 2 };
        for &loc in locs.iter().take(n) {
            ops.push(RemoteOp::Read {
                ptr: sub.add(geometry.combined_offset(loc)?)?,
                len: crate::layout::bucket::COMBINED_SIZE as u32,
            });
        }
        Ok(())
    }

    /// The READs that re-read this view.
    pub(crate) fn read_ops(&self) -> Result<Vec<RemoteOp<'static>>, Error> {
        Self::read_ops_for(self.sub, self.geometry, self.locs)
    }

    /// The same buckets, from READ results at `at..` of a doorbell that
    /// carried [`BucketsView::read_ops`].
    pub(crate) fn reread(&self, res: &mut [OpResult], at: usize) -> Result<Self, Error> {
        Self::from_results(self.sub, self.geometry, self.locs, res, at)
    }

    fn from_results(
        sub: RemotePtr,
        geometry: SubtableGeometry,
        locs: [BucketLoc; 2],
        res: &mut [OpResult],
        at: usize,
    ) -> Result<Self, Error> {
        let first = take_read(res, at)?;
        let second = if locs[0] == locs[1] {
            first.clone()
        } else {
            take_read(res, at + 1)?
        };
        Ok(Self {
            sub,
            geometry,
            locs,
            bufs: [first, second],
        })
    }

    fn combined(&self, i: usize) -> Option<CombinedBucket<&[u8]>> {
        let buf = self.bufs.get(i)?;
        let loc = self.locs.get(i)?;
        CombinedBucket::new_checked(&buf[..], loc.side).ok()
    }

    /// What the headers and slots say (see [`ViewState`]).
    pub(crate) fn state(&self, hash: &KeyHash) -> ViewState {
        let (mut stale, mut frozen) = (false, false);
        for i in 0..self.distinct() {
            let Some(c) = self.combined(i) else {
                return ViewState::Retired;
            };
            if c.is_retired() {
                return ViewState::Retired;
            }
            match c.header() {
                Ok(h) => stale |= !h.contains(hash.dir_hash()),
                Err(_) => return ViewState::Retired,
            }
            frozen |= [c.main(), c.overflow()]
                .iter()
                .any(|b| b.slots().iter().any(|s| s.is_frozen()));
        }
        if stale {
            ViewState::Stale
        } else if frozen {
            ViewState::Frozen
        } else {
            ViewState::Ok
        }
    }

    /// The distinct slots of both combined buckets whose word satisfies
    /// `keep`, in address order (the two combined buckets may share their
    /// overflow bucket: each slot appears once).
    pub(crate) fn slots_where(&self, keep: impl Fn(Slot) -> bool) -> Vec<SlotRef> {
        let mut out = Vec::new();
        for i in 0..self.distinct() {
            let (Some(c), Some(&loc)) = (self.combined(i), self.locs.get(i)) else {
                continue;
            };
            for role in [BucketRole::Main, BucketRole::Overflow] {
                for (index, word) in c.bucket(role).slots().into_iter().enumerate() {
                    if !keep(word) {
                        continue;
                    }
                    let pos = SlotPos { loc, role, index };
                    if let Ok(addr) = self.addr_of(pos) {
                        out.push(SlotRef { addr, word });
                    }
                }
            }
        }
        if out.len() > 1 {
            out.sort_unstable_by_key(|s| s.addr);
            out.dedup_by_key(|s| s.addr);
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
        let c0 = self.combined(0)?;
        let c1 = self.combined(1)?;
        let t = choose_insert_slot([&c0, &c1])?;
        Some(SlotPos {
            loc: *self.locs.get(t.candidate)?,
            role: t.role,
            index: t.slot,
        })
    }
}

impl<T: Transport> Client<T> {
    /// One doorbell: every round trip of the client goes through here.
    pub(crate) fn exec(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, Error> {
        self.stats.transport.record(batch);
        let res = self.transport.execute(batch)?;
        if res.len() != batch.len() {
            return Err(bad_response("result count differs from the batch"));
        }
        Ok(res)
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
        let mut ops = Vec::with_capacity(pre.len() + 2);
        ops.extend_from_slice(pre);
        BucketsView::push_read_ops(&mut ops, sub, geometry, locs)?;
        let mut res = self.exec(&ops)?;
        BucketsView::from_results(sub, geometry, locs, &mut res, pre.len())
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
        let fp = hash.fingerprint();
        let candidates = view.slots_where(|w| !w.thawed().is_empty() && w.matches(fp));
        let (start, max) = (ctx.start, self.config.max_op_ticks);
        ctx.blocks
            .retain(|(_, b)| start.saturating_sub(b.start) <= max);
        let mut need: Vec<Slot> = candidates
            .iter()
            .map(|s| s.word.thawed())
            .filter(|w| ctx.cached(w.raw()).is_none())
            .collect();
        need.sort_unstable_by_key(|w| w.raw());
        need.dedup();
        if !need.is_empty() {
            let ops: Vec<RemoteOp<'_>> = need
                .iter()
                .map(|w| RemoteOp::Read {
                    ptr: w.ptr(),
                    len: w.block_len() as u32,
                })
                .collect();
            let mut res = self.exec(&ops)?;
            for (i, w) in need.iter().enumerate() {
                let mut buf = take_read(&mut res, i)?;
                let value = match kv::decode_for_key(&buf, key) {
                    Ok(kv) if kv.block_len() == w.block_len() => {
                        // The value in place: no second allocation.
                        let vlen = kv.value().len();
                        buf.truncate(kv::KV_HEADER_SIZE + key.len() + vlen);
                        buf.drain(..kv::KV_HEADER_SIZE + key.len());
                        Some(buf)
                    }
                    Err(LayoutError::KeyMismatch) => None,
                    _ => {
                        self.stats.bad_blocks += 1;
                        return Ok(None);
                    }
                };
                ctx.cache(w.raw(), CachedBlock { start, value });
            }
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
