//! The rounds of a wave (see the module docs of `batch`): each builds its
//! doorbell from the flying operations of a group, posts it, and acts on
//! its results; the single-operation fallbacks they hand on run in
//! `Client::run_wave`.

use crate::error::{Error, LayoutError};
use crate::hash::KeyHash;
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::SubtableGeometry;
use crate::remote::{Completions, RemoteOp, Ticket, Transport};

use super::{recycle, Commit, Fate, Flight, Op, Posted, Reply, Round};
use crate::client::engine::{
    bad_response, BucketsView, OpCtx, SlotRef, SlotRefs, ViewState, NO_OP,
};
use crate::client::Client;

impl<T: Transport> Client<T> {
    /// Builds `round`'s doorbell for the flying operations of `flights` and
    /// posts it (nothing when none has an op in it).
    pub(super) fn round_post<'b>(
        &mut self,
        round: Round,
        flights: &'b mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        spare: Vec<RemoteOp<'b>>,
        start: u64,
    ) -> Posted<'b> {
        let built = match round {
            Round::Buckets => self.buckets_ops(flights, out, spare),
            Round::Blocks => Ok(blocks_ops(flights, spare)),
            Round::Cas => self.cas_ops(flights, out, spare, start),
            Round::Commit => Ok(self.commit_ops(flights, out, spare)),
        };
        let (ops, at) = match built {
            Ok(b) => b,
            Err((ops, e)) => {
                return Posted {
                    ops,
                    sent: Err(e),
                    at: 0,
                }
            }
        };
        let sent = if ops.is_empty() {
            res.clear();
            Ok(Ticket::DONE)
        } else {
            self.post_into(&ops, res)
        };
        Posted { ops, sent, at }
    }

    /// Waits for a posted round's doorbell: its storage back (emptied), and
    /// whether it completed (with when its CASes were sent).
    pub(super) fn round_complete(
        &mut self,
        p: Posted<'_>,
        res: &mut Completions,
    ) -> (Vec<RemoteOp<'static>>, Result<u64, Error>) {
        let done = match p.sent {
            Ok(t) if p.ops.is_empty() => {
                let _ = t;
                Ok(p.at)
            }
            Ok(t) => self.complete_into(t, &p.ops, res).map(|()| p.at),
            Err(e) => Err(e),
        };
        (recycle(p.ops), done)
    }

    /// Acts on a round's results for `flights`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn round_finish(
        &mut self,
        round: Round,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        done: Result<u64, Error>,
        start: u64,
        values: &mut Vec<Vec<u8>>,
    ) {
        match round {
            Round::Buckets => self.buckets_done(flights, out, res, done),
            Round::Blocks => self.blocks_done(flights, out, res, done, start, values),
            Round::Cas => self.cas_done(flights, out, res, done, start),
            Round::Commit => self.commit_done(flights, out, res, done),
        }
    }

    /// Round 1's doorbell: the combined buckets of every key; an insert's
    /// new block is written in the same doorbell, before its buckets (as
    /// the single insert does).
    #[allow(clippy::type_complexity)]
    fn buckets_ops<'b>(
        &mut self,
        flights: &'b mut [Flight<'_>],
        out: &mut [Reply],
        spare: Vec<RemoteOp<'b>>,
    ) -> Result<(Vec<RemoteOp<'b>>, u64), (Vec<RemoteOp<'b>>, Error)> {
        let geometry = self.table.geometry;
        let mut n = 0;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let placed = self.locate(&f.hash).and_then(|(sub, locs)| {
                if let Op::Insert(key, value) = f.op {
                    f.block = Some(self.new_block(&f.hash, key, value, sub.node())?);
                }
                Ok((sub, locs))
            });
            match placed {
                Ok((sub, locs)) => {
                    n += usize::from(f.block.is_some());
                    (f.buckets_at, f.sub, f.locs) = (n, sub, locs);
                    n += bucket_reads(locs);
                }
                Err(e) => answer(f, out, Err(e)),
            }
        }
        let mut ops = spare;
        ops.clear();
        if n == 0 {
            return Ok((ops, 0));
        }
        ops.reserve(n);
        let mut bad = None;
        for f in flights.iter().filter(|f| matches!(f.fate, Fate::Flying)) {
            if let Some((ptr, bytes, _)) = &f.block {
                ops.push(RemoteOp::Write { ptr: *ptr, bytes });
            }
            let at = ops.len();
            ops.resize(at + 2, NO_OP);
            match BucketsView::put_read_ops(&mut ops, at, f.sub, geometry, f.locs) {
                Ok(end) => ops.truncate(end),
                Err(e) => bad = bad.or(Some(e)),
            }
        }
        match bad {
            Some(e) => Err((ops, e)),
            None if ops.len() != n => Err((ops, bad_response("batch round 1 miscounted"))),
            None => Ok((ops, 0)),
        }
    }

    /// Round 1's results: keeps the fingerprint matches of the operations
    /// whose view allows them to go on.
    fn buckets_done(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        done: Result<u64, Error>,
    ) {
        if let Err(e) = done {
            self.fail_unpublished(flights, out, &e);
            return;
        }
        let geometry = self.table.geometry;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying) && f.block.is_some())
        {
            f.written = true;
        }
        let mut stale = false;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let second = bucket_reads(f.locs) - 1;
            let view = BucketsView::from_reads(
                f.sub,
                geometry,
                f.locs,
                res.read(f.buckets_at),
                res.read(f.buckets_at + second),
            );
            let view = match view {
                Ok(v) => v,
                Err(e) => {
                    self.drop_block(f);
                    answer(f, out, Err(e));
                    continue;
                }
            };
            let (state, slots) = view.search(&f.hash);
            let go_on = match state {
                ViewState::Ok => true,
                // Readable while splitting; writers wait for the split.
                ViewState::Frozen => matches!(f.op, Op::Get(_)),
                ViewState::Stale => {
                    stale = true;
                    false
                }
                ViewState::Retired => false,
            };
            if go_on {
                f.slots = slots;
                if matches!(f.op, Op::Insert(..) | Op::Put(..)) {
                    f.view = Some(view);
                }
            } else {
                self.drop_block(f);
                f.fate = Fate::Single { retry: true };
            }
        }
        if stale {
            // Once for the wave; the single operations then find their
            // subtables. A failure there is theirs to report.
            let _ = self.refresh_directory();
        }
    }

    /// Round 2's results: answers the gets, and the writes with no copy to
    /// act on. `values`: spare buffers for the gets' values.
    fn blocks_done(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        done: Result<u64, Error>,
        start: u64,
        values: &mut Vec<Vec<u8>>,
    ) {
        if let Err(e) = done {
            self.fail_unpublished(flights, out, &e);
            return;
        }
        let fresh = self.now().saturating_sub(start) <= self.config.max_op_ticks;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            if !fresh {
                self.drop_block(f);
                f.fate = Fate::Single { retry: true };
                continue;
            }
            let mut copies = SlotRefs::new(crate::client::engine::NO_SLOT);
            let mut value = None;
            let mut torn = false;
            for s in f.slots.iter() {
                let w = s.word.thawed();
                let Some(k) = f.words.iter().position(|x| *x == w) else {
                    continue;
                };
                let Some(buf) = res.read(f.blocks_at + k) else {
                    torn = true;
                    break;
                };
                match kv::decode_for_key(buf, f.op.key()) {
                    Ok(kv) if kv.block_len() == w.block_len() => {
                        if copies.is_empty() && matches!(f.op, Op::Get(_)) {
                            let mut buf = values.pop().unwrap_or_default();
                            buf.clear();
                            buf.extend_from_slice(kv.value());
                            value = Some(buf);
                        }
                        copies.push(*s);
                    }
                    Err(LayoutError::KeyMismatch) => {}
                    _ => {
                        torn = true;
                        break;
                    }
                }
            }
            if torn {
                self.stats.bad_blocks += 1;
                self.drop_block(f);
                f.fate = Fate::Single { retry: true };
                continue;
            }
            match f.op {
                Op::Get(_) => answer(f, out, Ok(value)),
                Op::Update(..) | Op::Delete(_) if copies.is_empty() => {
                    answer(f, out, Err(Error::NotFound));
                }
                Op::Insert(..) if !copies.is_empty() => {
                    self.drop_block(f);
                    answer(f, out, Err(Error::KeyExists));
                }
                // Absent: an insert takes an empty slot in round 3, and so
                // does a put (an upsert of an absent key is an insert).
                _ => f.slots = copies,
            }
        }
    }

    /// Round 3's doorbell: the new blocks' WRITEs and the CASes of every
    /// write (a block on its slot's node, so ordered before its CAS); with
    /// when the CASes were sent.
    #[allow(clippy::type_complexity)]
    fn cas_ops<'b>(
        &mut self,
        flights: &'b mut [Flight<'_>],
        out: &mut [Reply],
        spare: Vec<RemoteOp<'b>>,
        start: u64,
    ) -> Result<(Vec<RemoteOp<'b>>, u64), (Vec<RemoteOp<'b>>, Error)> {
        // Empty slots chosen by this wave's writes (`wave_claims`, of this
        // group's round and of the other group's, built before it): another
        // write of the wave whose buckets are the same (keys next to each
        // other in the table: a load of a dump, which lists them in table
        // order) takes another one instead of losing its CAS to the first.
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let (Op::Update(key, value) | Op::Put(key, value) | Op::Insert(key, value)) = f.op
            else {
                continue;
            };
            // The slot to CAS: the key's lowest copy, or (an insert, a put
            // of an absent key) an empty slot of the buckets read.
            let target = match (f.slots.first(), &f.view) {
                (Some(lowest), _) => lowest.addr,
                (None, Some(view)) if !matches!(f.op, Op::Update(..)) => {
                    let Some(pos) = view.choose_insert_except(&self.wave_claims) else {
                        // All four buckets full: the single operation
                        // splits the subtable.
                        self.drop_block(f);
                        f.fate = Fate::Single { retry: true };
                        continue;
                    };
                    match view.addr_of(pos) {
                        Ok(addr) => {
                            f.empty = Some((pos, addr));
                            self.wave_claims.push(addr);
                            addr
                        }
                        Err(e) => {
                            self.drop_block(f);
                            answer(f, out, Err(e));
                            continue;
                        }
                    }
                }
                _ => {
                    f.fate = Fate::Single { retry: true };
                    continue;
                }
            };
            if f.block.is_some() {
                continue; // an insert's, written in round 1
            }
            match self.new_block(&f.hash, key, value, target.node()) {
                Ok((ptr, block, _)) if ptr.node() != target.node() => {
                    // The slot's node had no room: the single operation
                    // writes the block in a doorbell of its own.
                    self.alloc.release(ptr, block.len());
                    f.fate = Fate::Single { retry: true };
                }
                Ok(b) => f.block = Some(b),
                Err(e) => answer(f, out, Err(e)),
            }
        }
        let fresh = self.now().saturating_sub(start) <= self.config.max_op_ticks;
        let mut n = 0;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            if !fresh {
                self.drop_block(f);
                f.fate = Fate::Single { retry: true };
                continue;
            }
            f.cas_at = n;
            n += cas_op_count(f);
        }
        let mut ops = spare;
        ops.clear();
        if n == 0 {
            return Ok((ops, 0));
        }
        let geometry = self.table.geometry;
        ops.reserve(n);
        let mut bad = None;
        for f in flights.iter().filter(|f| matches!(f.fate, Fate::Flying)) {
            if let Err(e) = push_cas_ops(f, geometry, &mut ops) {
                bad = bad.or(Some(e));
            }
        }
        let cas_start = self.now();
        match bad {
            Some(e) => Err((ops, e)),
            None if ops.len() != n => Err((ops, bad_response("batch round 3 miscounted"))),
            None => Ok((ops, cas_start)),
        }
    }

    /// Round 3's results: the CASes won publish, the lost ones go to the
    /// single operation; a failed doorbell leaves its writes' outcome
    /// unknown.
    fn cas_done(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        done: Result<u64, Error>,
        start: u64,
    ) {
        let cas_start = match done {
            Ok(at) => at,
            Err(e) => {
                for f in flights
                    .iter_mut()
                    .filter(|f| matches!(f.fate, Fate::Flying))
                {
                    let e = outcome_error(f.op, &e);
                    // The block may be published: never recycled.
                    f.block = None;
                    answer(f, out, Err(e));
                }
                return;
            }
        };
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            if f.empty.is_some() {
                self.inserted(f, out, res, start, cas_start);
                continue;
            }
            let Some((lowest, others)) = f.slots.split_first() else {
                continue;
            };
            let mut at = f.cas_at + usize::from(f.block.is_some());
            if f.block.is_none() {
                // A delete: the other copies first, highest address first.
                for c in others.iter().rev() {
                    if res.cas_old(at) == Some(c.word.raw()) {
                        self.retire(c.word);
                        self.stats.dups_removed += 1;
                    }
                    at += 1;
                }
            }
            if res.cas_old(at) == Some(lowest.word.raw()) {
                self.retire(lowest.word);
                f.block = None;
                answer(f, out, Ok(None));
            } else {
                // Lost the CAS: not published.
                if let Some((ptr, block, _)) = f.block.take() {
                    self.alloc.release(ptr, block.len());
                }
                self.lost_cas(1, start);
                f.fate = Fate::Single { retry: true };
            }
        }
    }

    /// Round 3 of an insert (or a put of an absent key) after its CAS on
    /// an empty slot: lost, it is retried as the single operation; won,
    /// its tentative copy is in place. Alone in the re-read buckets (no
    /// other slot with its fingerprint, tentative or not), it commits in
    /// round 4; otherwise it settles concurrent inserts of its key as the
    /// single insert does.
    fn inserted(
        &mut self,
        f: &mut Flight<'_>,
        out: &mut [Reply],
        res: &Completions,
        start: u64,
        cas_start: u64,
    ) {
        let (Some((pos, addr)), Some(view)) = (f.empty, f.view.as_ref()) else {
            return;
        };
        let at = f.cas_at + usize::from(!f.written);
        if res.cas_old(at) != Some(Slot::EMPTY.raw()) {
            // Lost the slot to another writer: not published.
            self.drop_block(f);
            self.lost_cas(1, start);
            f.fate = Fate::Single { retry: true };
            return;
        }
        // Placed: from now on whoever unlinks it retires it.
        let Some((_, _, slot)) = f.block.take() else {
            return;
        };
        let mine = slot.tentative();
        let second = bucket_reads(f.locs);
        let reread = BucketsView::from_reads(
            view.sub(),
            self.table.geometry,
            f.locs,
            res.read(at + 1),
            res.read(at + second),
        );
        if let Ok(v) = &reread {
            let claims = v.claims(&f.hash);
            if v.state(&f.hash) == ViewState::Ok
                && matches!(&claims[..], [c] if c.addr == addr && c.word == mine)
            {
                f.commit = Some(Commit {
                    pos,
                    addr,
                    mine,
                    placed: cas_start,
                });
                return;
            }
        }
        let settled = reread.and_then(|reread| {
            let mut ctx = self.settle_ctx(f, slot, cas_start);
            self.settle(
                f.op.key(),
                &f.hash,
                pos,
                mine,
                reread,
                cas_start,
                cas_start,
                &mut ctx,
            )
        });
        settled_answer(f, out, settled);
    }

    /// An operation state for settling `f`'s copy (`slot`, placed at
    /// `placed`): its block known to hold its key and value.
    fn settle_ctx(&self, f: &Flight<'_>, slot: Slot, placed: u64) -> OpCtx {
        let value = match f.op {
            Op::Insert(_, v) | Op::Put(_, v) | Op::Update(_, v) => v,
            Op::Get(_) | Op::Delete(_) => &[],
        };
        let mut ctx = OpCtx::default();
        (ctx.attempts, ctx.start) = (1, placed);
        ctx.remember(slot, value, placed);
        ctx
    }

    /// Round 4's doorbell: the commits of the inserts alone in their
    /// buckets. One whose deadline passed (`max_op_ticks` since its copy
    /// was placed) must not commit: it settles as the single insert does
    /// (which withdraws it).
    fn commit_ops<'b>(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        spare: Vec<RemoteOp<'b>>,
    ) -> (Vec<RemoteOp<'b>>, u64) {
        let mut ops = spare;
        ops.clear();
        let now = self.now();
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let Some(c) = f.commit else {
                continue;
            };
            if now.saturating_sub(c.placed) > self.config.max_op_ticks {
                f.commit = None;
                self.settle_again(f, out, c);
                continue;
            }
            ops.push(RemoteOp::Cas {
                ptr: c.addr,
                expect: c.mine.raw(),
                new: c.mine.committed().raw(),
            });
        }
        (ops, now)
    }

    /// Settles `f`'s copy `c` as the single insert does, from a fresh read
    /// of its buckets.
    fn settle_again(&mut self, f: &mut Flight<'_>, out: &mut [Reply], c: Commit) {
        let settled = self.read_buckets(&f.hash, &[]).and_then(|view| {
            let mut ctx = self.settle_ctx(f, c.mine, c.placed);
            let start = self.now();
            self.settle(
                f.op.key(),
                &f.hash,
                c.pos,
                c.mine,
                view,
                start,
                c.placed,
                &mut ctx,
            )
        });
        settled_answer(f, out, settled);
    }

    /// Round 4's results: a commit that applied answers its insert; one
    /// that did not (the subtable froze, a rival removed the copy, the
    /// deadline passed before it was sent) settles as the single insert
    /// does; a failed doorbell leaves the commits' outcome unknown.
    fn commit_done(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        done: Result<u64, Error>,
    ) {
        let committing = flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying) && f.commit.is_some());
        for (at, f) in committing.enumerate() {
            let Some(c) = f.commit.take() else {
                continue;
            };
            if let Err(e) = &done {
                answer(f, out, Err(outcome_error(f.op, e)));
                continue;
            }
            if res.cas_old(at) == Some(c.mine.raw()) {
                answer(f, out, Ok(None));
                continue;
            }
            self.settle_again(f, out, c);
        }
    }

    /// A new KV block for (key, value), allocated on `node` if it has room
    /// (the caller checks), with the slot word naming it.
    fn new_block(
        &mut self,
        hash: &KeyHash,
        key: &[u8],
        value: &[u8],
        node: u8,
    ) -> Result<(RemotePtr, Vec<u8>, Slot), Error> {
        let block = kv::encode(key, value).map_err(Error::from_kv)?;
        let ptr = self.alloc_block(node, block.len())?;
        match Slot::for_block(hash.fingerprint(), block.len(), ptr) {
            Ok(slot) => Ok((ptr, block, slot)),
            Err(e) => {
                self.alloc.release(ptr, block.len());
                Err(e.into())
            }
        }
    }

    /// Releases `f`'s new block: no CAS that may install it was posted.
    fn drop_block(&mut self, f: &mut Flight<'_>) {
        if let Some((ptr, block, _)) = f.block.take() {
            self.alloc.release(ptr, block.len());
        }
    }

    /// A doorbell before any CAS failed: every operation in it fails with
    /// the error (nothing it posted can have applied), its new block
    /// released.
    fn fail_unpublished(&mut self, flights: &mut [Flight<'_>], out: &mut [Reply], e: &Error) {
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            self.drop_block(f);
            answer(f, out, Err(e.clone()));
        }
    }
}

/// Round 2's doorbell: every KV block with a matching fingerprint (each
/// block once per operation).
fn blocks_ops<'b>(
    flights: &mut [Flight<'_>],
    spare: Vec<RemoteOp<'b>>,
) -> (Vec<RemoteOp<'b>>, u64) {
    let mut ops = spare;
    ops.clear();
    for f in flights
        .iter_mut()
        .filter(|f| matches!(f.fate, Fate::Flying))
    {
        f.blocks_at = ops.len();
        for s in f.slots.iter() {
            let w = s.word.thawed();
            if !f.words.contains(&w) {
                f.words.push(w);
                ops.push(RemoteOp::Read {
                    ptr: w.ptr(),
                    len: w.block_len() as u32,
                });
            }
        }
    }
    (ops, 0)
}

/// The bucket READs of a key: 1 if its two combined buckets coincide.
fn bucket_reads(locs: [crate::layout::bucket::BucketLoc; 2]) -> usize {
    if locs[0] == locs[1] {
        1
    } else {
        2
    }
}

/// How many ops [`push_cas_ops`] posts for `f`.
fn cas_op_count(f: &Flight<'_>) -> usize {
    match (&f.empty, &f.view, &f.block) {
        (Some(_), Some(_), _) => usize::from(!f.written) + 1 + bucket_reads(f.locs),
        (_, _, Some(_)) => 2,
        _ => f.slots.len(),
    }
}

/// The WRITE (update, put, unless written in round 1) and the CASes of
/// one write of round 3; an insert's CAS on its empty slot is followed by
/// the re-read of its buckets (same node: the READs see the CAS).
fn push_cas_ops<'b>(
    f: &'b Flight<'_>,
    geometry: SubtableGeometry,
    ops: &mut Vec<RemoteOp<'b>>,
) -> Result<(), Error> {
    if let (Some((_, addr)), Some(view), Some((ptr, bytes, slot))) = (&f.empty, &f.view, &f.block) {
        if !f.written {
            ops.push(RemoteOp::Write { ptr: *ptr, bytes });
        }
        ops.push(RemoteOp::Cas {
            ptr: *addr,
            expect: Slot::EMPTY.raw(),
            new: slot.tentative().raw(),
        });
        let at = ops.len();
        ops.resize(at + 2, NO_OP);
        let end = BucketsView::put_read_ops(ops, at, view.sub(), geometry, f.locs)?;
        ops.truncate(end);
        return Ok(());
    }
    let Some((lowest, others)) = f.slots.split_first() else {
        return Ok(());
    };
    match &f.block {
        Some((ptr, bytes, slot)) => {
            ops.push(RemoteOp::Write { ptr: *ptr, bytes });
            ops.push(RemoteOp::Cas {
                ptr: lowest.addr,
                expect: lowest.word.raw(),
                new: slot.raw(),
            });
        }
        None => {
            ops.extend(others.iter().rev().map(|c: &SlotRef| RemoteOp::Cas {
                ptr: c.addr,
                expect: c.word.raw(),
                new: Slot::EMPTY.raw(),
            }));
            ops.push(RemoteOp::Cas {
                ptr: lowest.addr,
                expect: lowest.word.raw(),
                new: Slot::EMPTY.raw(),
            });
        }
    }
    Ok(())
}

/// What settling an insert's copy means for its flight.
fn settled_answer(f: &mut Flight<'_>, out: &mut [Reply], settled: Result<bool, Error>) {
    match settled {
        Ok(true) => answer(f, out, Ok(None)),
        // Not committed (another copy holds the key, or none does): the
        // single operation searches again (an insert: `KeyExists`, or a new
        // attempt; a put replaces the key's value).
        Ok(false) => f.fate = Fate::Single { retry: true },
        Err(e) => answer(f, out, Err(outcome_error(f.op, &e))),
    }
}

/// `e` as the error of `op` after a doorbell that may have installed its
/// write: a transport failure leaves the outcome unknown.
fn outcome_error(op: Op<'_>, e: &Error) -> Error {
    match e {
        Error::Transport(source) => Error::OutcomeUnknown {
            op: op.name(),
            source: source.clone(),
        },
        other => other.clone(),
    }
}

fn answer(f: &mut Flight<'_>, out: &mut [Reply], reply: Reply) {
    if let Some(slot) = out.get_mut(f.i) {
        *slot = reply;
    }
    f.fate = Fate::Done;
}
