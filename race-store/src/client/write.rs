//! Writes: insert with de-duplication, update, delete and read-modify-write.
//! The protocol and its invariants are in [`super::protocol`].

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::remote::{RemoteOp, Transport};

use super::engine::{cas_old, BucketsView, KeyCopy, OpCtx, SlotPos, ViewState};
use super::Client;

/// What `insert_or_put` does when the key is already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InsertMode {
    /// Fail (`Ok(false)`).
    Insert,
    /// Replace the value.
    Put,
}

/// What a read-modify-write decided from the current value.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Leave the key as it is.
    Keep,
    /// Store this value.
    Write(Vec<u8>),
    /// Remove the key.
    Remove,
}

/// Re-reads the lowest of several racing copies makes before it withdraws.
const DEDUP_WAITS: u32 = 8;

/// The decision function of [`Client::modify`].
pub(crate) type Decide<'a> = dyn FnMut(Option<&[u8]>) -> Result<Decision, Error> + 'a;

/// A KV block this operation wrote and may publish.
#[derive(Clone, Copy, Debug)]
struct Pending {
    ptr: RemotePtr,
    slot: Slot,
    len: usize,
    written: bool,
    /// A CAS that installs it may have executed: never recycle it directly.
    maybe_published: bool,
}

impl<T: Transport> Client<T> {
    /// Inserts (or, with [`InsertMode::Put`], upserts) `key`. `Ok(false)`:
    /// the key exists (insert mode only).
    pub(crate) fn insert_or_put(
        &mut self,
        key: &[u8],
        value: &[u8],
        hash: &KeyHash,
        mode: InsertMode,
    ) -> Result<bool, Error> {
        let block = kv::encode(key, value).map_err(Error::from_kv)?;
        let mut ctx = OpCtx::default();
        let mut pending = None;
        let result = self.insert_loop(key, value, hash, &block, mode, &mut ctx, &mut pending);
        if let Some(p) = pending {
            if !p.maybe_published {
                self.alloc.release(p.ptr, p.len);
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_loop(
        &mut self,
        key: &[u8],
        value: &[u8],
        hash: &KeyHash,
        block: &[u8],
        mode: InsertMode,
        ctx: &mut OpCtx,
        pending: &mut Option<Pending>,
    ) -> Result<bool, Error> {
        loop {
            self.begin_attempt(ctx)?;
            let mut p = match *pending {
                Some(p) => p,
                None => {
                    let node = self.locate(hash)?.0.node();
                    let ptr = self.alloc_block(node, block.len())?;
                    let slot = Slot::for_block(hash.fingerprint(), block.len(), ptr)?;
                    Pending {
                        ptr,
                        slot,
                        len: block.len(),
                        written: false,
                        maybe_published: false,
                    }
                }
            };
            *pending = Some(p);
            // Doorbell 1: WRITE the block (first attempt) + READ both buckets.
            let write = [RemoteOp::Write {
                ptr: p.ptr,
                bytes: block,
            }];
            let pre: &[RemoteOp<'_>] = if p.written { &[] } else { &write };
            let view = self.read_buckets(hash, pre)?;
            p.written = true;
            *pending = Some(p);
            if !self.writable(&view, hash, ctx)? {
                continue;
            }
            let Some(copies) = self.copies(&view, key, hash, ctx)? else {
                continue;
            };
            if !copies.is_empty() {
                if mode == InsertMode::Insert {
                    return Ok(false);
                }
                if !self.fresh(ctx) {
                    continue;
                }
                p.maybe_published = true;
                *pending = Some(p);
                if self.replace(&copies, p.slot, None, ctx)? {
                    *pending = None;
                    return Ok(true);
                }
                p.maybe_published = false;
                *pending = Some(p);
                continue;
            }
            let Some(pos) = view.choose_insert() else {
                // All four buckets full: split the subtable, then retry.
                self.split(hash, view.sub(), ctx)?;
                continue;
            };
            if !self.fresh(ctx) {
                continue;
            }
            // Doorbell 2: CAS the empty slot, then re-read both buckets (same
            // node, so the READs see the CAS).
            let addr = view.addr_of(pos)?;
            let mut ops = vec![RemoteOp::Cas {
                ptr: addr,
                expect: Slot::EMPTY.raw(),
                new: p.slot.raw(),
            }];
            ops.extend(view.read_ops()?);
            p.maybe_published = true;
            *pending = Some(p);
            let start = self.now();
            let mut res = self.exec(&ops)?;
            if cas_old(&res, 0)? != Slot::EMPTY.raw() {
                p.maybe_published = false;
                *pending = Some(p);
                self.lost_cas(ctx.attempts, ctx.start);
                continue;
            }
            // Published: from now on whoever unlinks it retires it.
            *pending = None;
            ctx.remember(p.slot, value, start);
            let reread = view.reread(&mut res, 1)?;
            if self.dedup(key, hash, pos, p.slot, reread, start, ctx)? {
                return Ok(true);
            }
            // Lost to another copy: search again (it finds the key, or
            // inserts anew if the other copy withdrew as well).
        }
    }

    /// Checks that a writer may act on `view`: refreshes a stale directory
    /// cache or waits for a split, and says whether to go on.
    fn writable(&mut self, view: &BucketsView, hash: &KeyHash, ctx: &OpCtx) -> Result<bool, Error> {
        match view.state(hash) {
            ViewState::Ok => Ok(true),
            ViewState::Stale => {
                self.refresh_directory()?;
                Ok(false)
            }
            ViewState::Frozen | ViewState::Retired => {
                self.await_split(hash, view.sub(), ctx)?;
                Ok(false)
            }
        }
    }

    /// After this client's slot `mine` was installed at `pos`: settles
    /// concurrent inserts of the same key. `Ok(true)`: this insert won (its
    /// copy is the only one, possibly updated since by another writer).
    /// `Ok(false)`: another copy holds the key; this client's copy has been
    /// removed (by its own CAS, or by a delete), or was updated by a writer
    /// that took it for the key's copy.
    ///
    /// Each inserter removes only its own copy, so a copy that has won is
    /// never removed by de-duplication: a copy that is not the lowest
    /// addressed withdraws at once; the lowest waits a few re-reads for the
    /// others to withdraw and withdraws itself if they stay (their owner
    /// already won, or died).
    ///
    /// `view` was read at `start`, after the CAS. If the subtable is split
    /// meanwhile, the slot is looked for at the same position in the new
    /// subtable (a split copies slots in place).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dedup(
        &mut self,
        key: &[u8],
        hash: &KeyHash,
        pos: SlotPos,
        mine: Slot,
        mut view: BucketsView,
        mut start: u64,
        ctx: &mut OpCtx,
    ) -> Result<bool, Error> {
        let mut waits = 0;
        loop {
            if ctx.attempts >= self.config.max_attempts {
                return Err(Error::Contention {
                    attempts: ctx.attempts,
                });
            }
            ctx.attempts += 1;
            ctx.start = start;
            let ready = match view.state(hash) {
                ViewState::Ok => true,
                ViewState::Stale => {
                    self.refresh_directory()?;
                    false
                }
                ViewState::Frozen | ViewState::Retired => {
                    self.await_split(hash, view.sub(), ctx)?;
                    false
                }
            };
            let copies = if ready {
                self.copies(&view, key, hash, ctx)?
            } else {
                None
            };
            let Some(copies) = copies.filter(|_| self.fresh(ctx)) else {
                self.stats.retries += 1;
                start = self.now();
                view = self.read_buckets(hash, &[])?;
                continue;
            };
            let addr = view.addr_of(pos)?;
            let at_mine = copies.iter().find(|c| c.addr == addr);
            if copies.iter().all(|c| c.addr == addr) {
                // Alone (or gone with no other copy: deleted after it won).
                return Ok(true);
            }
            let Some(copy) = at_mine.filter(|c| c.word.thawed() == mine) else {
                return Ok(false);
            };
            let lowest = copies.first().is_some_and(|c| c.addr == addr);
            if lowest && waits < DEDUP_WAITS {
                waits += 1;
                self.backoff(ctx);
                start = self.now();
                view = self.read_buckets(hash, &[])?;
                continue;
            }
            let mut ops = vec![RemoteOp::Cas {
                ptr: copy.addr,
                expect: copy.word.raw(),
                new: Slot::EMPTY.raw(),
            }];
            ops.extend(view.read_ops()?);
            start = self.now();
            let mut res = self.exec(&ops)?;
            if cas_old(&res, 0)? == copy.word.raw() {
                self.retire(mine);
                self.stats.dups_removed += 1;
                return Ok(false);
            }
            view = view.reread(&mut res, 1)?;
        }
    }

    /// Update, delete and read-modify-write: search, let `decide` look at
    /// the current value, apply its decision with CAS; retried (with
    /// `decide` called again) until a CAS applies to the value it saw.
    pub(crate) fn modify(
        &mut self,
        key: &[u8],
        decide: &mut Decide<'_>,
    ) -> Result<Option<Vec<u8>>, Error> {
        let hash = KeyHash::of(key);
        let mut ctx = OpCtx::default();
        loop {
            self.begin_attempt(&mut ctx)?;
            let view = self.read_buckets(&hash, &[])?;
            if !self.writable(&view, &hash, &ctx)? {
                continue;
            }
            let Some(copies) = self.copies(&view, key, &hash, &mut ctx)? else {
                continue;
            };
            let current = copies.first().map(|c| c.value.as_slice());
            match decide(current)? {
                Decision::Keep => return Ok(current.map(<[u8]>::to_vec)),
                Decision::Remove => {
                    if copies.is_empty() {
                        return Ok(None);
                    }
                    if self.fresh(&ctx) && self.replace(&copies, Slot::EMPTY, None, &ctx)? {
                        return Ok(None);
                    }
                }
                Decision::Write(value) => {
                    let Some(lowest) = copies.first() else {
                        if self.insert_or_put(key, &value, &hash, InsertMode::Insert)? {
                            return Ok(Some(value));
                        }
                        continue;
                    };
                    let block = kv::encode(key, &value).map_err(Error::from_kv)?;
                    let ptr = self.alloc_block(lowest.addr.node(), block.len())?;
                    let slot = Slot::for_block(hash.fingerprint(), block.len(), ptr)?;
                    if self.fresh(&ctx) && self.replace(&copies, slot, Some((ptr, &block)), &ctx)? {
                        return Ok(Some(value));
                    }
                    // Not published (the CAS failed or never ran).
                    self.alloc.release(ptr, block.len());
                }
            }
        }
    }

    /// One doorbell that CASes the lowest copy to `new`. For a delete (`new`
    /// empty), the other copies (left by a crashed or racing inserter) are
    /// removed too, highest address first, so that none surfaces. `block`
    /// (the new KV block) is written first: in the same doorbell when it is
    /// on the slot's node (ordered), else in a doorbell of its own. Retires
    /// what it unlinks. `Ok(true)` if the lowest copy was replaced.
    fn replace(
        &mut self,
        copies: &[KeyCopy],
        new: Slot,
        block: Option<(RemotePtr, &[u8])>,
        ctx: &OpCtx,
    ) -> Result<bool, Error> {
        let Some((lowest, others)) = copies.split_first() else {
            return Ok(false);
        };
        let others = if new.is_empty() { others } else { &[] };
        let mut ops = Vec::with_capacity(copies.len() + 1);
        if let Some((ptr, bytes)) = block {
            let write = RemoteOp::Write { ptr, bytes };
            if ptr.node() == lowest.addr.node() {
                ops.push(write);
            } else {
                self.exec(&[write])?;
                if !self.fresh(ctx) {
                    return Ok(false);
                }
            }
        }
        let first = ops.len();
        ops.extend(others.iter().rev().map(|c| RemoteOp::Cas {
            ptr: c.addr,
            expect: c.word.raw(),
            new: Slot::EMPTY.raw(),
        }));
        ops.push(RemoteOp::Cas {
            ptr: lowest.addr,
            expect: lowest.word.raw(),
            new: new.raw(),
        });
        let res = self.exec(&ops)?;
        for (i, c) in others.iter().rev().enumerate() {
            if cas_old(&res, first + i)? == c.word.raw() {
                self.retire(c.word);
                self.stats.dups_removed += 1;
            }
        }
        let replaced = cas_old(&res, ops.len() - 1)? == lowest.word.raw();
        if replaced {
            self.retire(lowest.word);
        } else {
            self.lost_cas(ctx.attempts, ctx.start);
        }
        Ok(replaced)
    }
}
