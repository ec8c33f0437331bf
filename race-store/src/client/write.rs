//! Writes: insert (a tentative copy, settled, then committed), update,
//! delete and read-modify-write.
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

/// Backoffs an inserter makes while a tentative rival at a lower address
/// settles, before it waits in longer pauses (an eighth of the time after
/// which the rival counts as dead).
const RIVAL_BACKOFFS: u32 = 8;

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
            // Doorbell 2: CAS the empty slot to the tentative copy, then
            // re-read both buckets (same node, so the READs see the CAS).
            // Doorbell 3 (in `settle`): commit it.
            let addr = view.addr_of(pos)?;
            let mine = p.slot.tentative();
            let mut ops = vec![RemoteOp::Cas {
                ptr: addr,
                expect: Slot::EMPTY.raw(),
                new: mine.raw(),
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
            if self.settle(key, hash, pos, mine, reread, start, start, ctx)? {
                return Ok(true);
            }
            // Not committed: search again (it finds the key, or inserts
            // anew if no copy committed).
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

    /// After this client's tentative copy `mine` was installed at `pos` (by
    /// a CAS sent at `placed`): settles concurrent inserts of the same key,
    /// and commits `mine` if it wins. `Ok(true)`: committed, the insert took
    /// effect. `Ok(false)`: it did not, and the copy is gone: withdrawn by
    /// this client (the key is there, or the commit deadline passed), or
    /// removed by another inserter whose copy was in a better place (that
    /// one retires the block). The caller searches again.
    ///
    /// From each re-read (the first is `view`, read at `start`, after the
    /// CAS), with `mine` still in place:
    /// * a committed copy of the key: the key exists; withdraw `mine`;
    /// * tentative rivals at higher addresses, or that this operation has
    ///   seen unchanged for longer than an owner may take to commit (dead
    ///   inserters): remove them (CAS to empty, retiring their blocks);
    /// * a younger tentative rival at a lower address: wait (it commits,
    ///   and `mine` withdraws; or it removes `mine`);
    /// * no other copy: commit (CAS `mine` to its committed word), unless
    ///   `max_op_ticks` have passed since `placed`: then withdraw, so that
    ///   no commit ever lands after the time rivals wait for it.
    ///
    /// If the subtable is split meanwhile, the slot is looked for at the
    /// same position in the new subtable (a split copies slots in place,
    /// tentative or not).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle(
        &mut self,
        key: &[u8],
        hash: &KeyHash,
        pos: SlotPos,
        mine: Slot,
        mut view: BucketsView,
        mut start: u64,
        placed: u64,
        ctx: &mut OpCtx,
    ) -> Result<bool, Error> {
        let mut waits = 0u32;
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
                self.copies_in(&view.claims(hash), key, ctx)?
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
            if !copies.iter().any(|c| c.addr == addr && c.word == mine) {
                // Removed by a rival (or this client's earlier withdrawal
                // CAS did apply after all): not this client's any more.
                return Ok(false);
            }
            let now = self.now();
            let late = now.saturating_sub(placed) > self.config.max_op_ticks;
            // A tentative rival's owner commits within `max_op_ticks` of
            // placing it; seen for longer (and the skew margin), it is dead.
            let dead_after = self.tentative_dead_after();
            let mut exists = false;
            let mut wait = false;
            let mut remove = Vec::new();
            for c in copies.iter().filter(|c| c.addr != addr) {
                if !c.word.is_tentative() {
                    exists = true;
                } else if c.addr > addr || ctx.rival_age(c.addr, c.word, now) > dead_after {
                    remove.push((c.addr, c.word));
                } else {
                    wait = true;
                }
            }
            // Withdraw when the key is there, or when this copy can no
            // longer commit.
            let withdraw = exists || late;
            if !withdraw && wait {
                // A live rival commits or removes this copy within a round
                // trip or two; a dead one is waited out in longer pauses.
                waits += 1;
                if waits <= RIVAL_BACKOFFS {
                    self.backoff(ctx);
                } else {
                    self.clock.pause((dead_after / 8).max(1));
                }
                start = self.now();
                view = self.read_buckets(hash, &[])?;
                continue;
            }
            if !withdraw && remove.is_empty() {
                // Alone: commit.
                let res = self.exec(&[RemoteOp::Cas {
                    ptr: addr,
                    expect: mine.raw(),
                    new: mine.committed().raw(),
                }])?;
                let old = cas_old(&res, 0)?;
                if old == mine.raw() {
                    return Ok(true);
                }
                if old != mine.frozen().raw() {
                    return Ok(false);
                }
                // Frozen under the commit: settle in the split's half.
                start = self.now();
                view = self.read_buckets(hash, &[])?;
                continue;
            }
            let mut ops: Vec<RemoteOp<'_>> = if withdraw {
                vec![RemoteOp::Cas {
                    ptr: addr,
                    expect: mine.raw(),
                    new: Slot::EMPTY.raw(),
                }]
            } else {
                remove
                    .iter()
                    .map(|&(ptr, word)| RemoteOp::Cas {
                        ptr,
                        expect: word.raw(),
                        new: Slot::EMPTY.raw(),
                    })
                    .collect()
            };
            let n = ops.len();
            ops.extend(view.read_ops()?);
            start = self.now();
            let mut res = self.exec(&ops)?;
            if withdraw {
                if cas_old(&res, 0)? == mine.raw() {
                    self.retire(mine);
                    self.stats.dups_removed += 1;
                    return Ok(false);
                }
            } else {
                for (i, &(_, word)) in remove.iter().enumerate() {
                    if cas_old(&res, i)? == word.raw() {
                        self.retire(word);
                        self.stats.rivals_removed += 1;
                    }
                }
            }
            view = view.reread(&mut res, n)?;
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
