//! Batched operations: one client keeps a whole batch of operations in
//! flight, and each round of their protocol goes out as one doorbell for
//! all of them (one per memory node, as [`Transport::execute`] posts it).
//!
//! A batch of gets costs 2 round trips however many keys it holds (on
//! hits: the combined buckets of every key, then every matching KV block);
//! a batch of updates or deletes 3 (buckets, blocks, then the new blocks'
//! WRITEs with their CASes); a batch of inserts 2 when no other key's
//! fingerprint matches (the new blocks' WRITEs with the buckets, then the
//! CASes on empty slots with the buckets' re-reads), puts of absent keys
//! 2 or 3 likewise (their blocks written with the CASes). That is the
//! single operations' protocol ([`super::protocol`]) with the rounds of
//! several keys sharing doorbells. On a transport that keeps two doorbells
//! in flight ([`Transport::max_in_flight`]), a wave of [`PIPELINE_MIN`] or
//! more operations runs as two groups whose round trips overlap (see
//! [`Client::run_wave`]): twice the doorbells, each round trip hidden
//! behind the other group's work.
//!
//! * Each operation is linearizable on its own: it reads, checks and CASes
//!   exactly as the single operation does, with the same deadline (one
//!   attempt's `max_op_ticks`, checked after the block READs and before
//!   the CASes).
//! * Operations on the same key take effect in submission order: the batch
//!   runs in *waves*, a key appearing at most once per wave, and a wave
//!   starts after the previous one has finished (operations on different
//!   keys have no order, as for concurrent clients).
//! * An operation whose fast attempt cannot finish (a stale directory
//!   cache, a subtable being split, a torn block, a lost CAS, an expired
//!   attempt, a new block not on its slot's node) is finished by the single
//!   operation at the end of its wave, before the next wave: counted as a
//!   retry in [`super::ClientStats::retries`].
//! * An insert, or a put of an absent key, that won its empty slot settles
//!   concurrent inserts of its key from the re-read buckets as the single
//!   insert does (further re-reads, if any, are its own); one that meets
//!   full buckets is finished by the single operation (which splits).
//! * Same-key writes are combined ([`combine`]): a put or update that the
//!   next operation on its key overwrites sends nothing and answers as that
//!   one (an update that then runs as a put reports a lost outcome as
//!   `put`).
//!
//! Failures are per operation, as the single operation reports them. A
//! doorbell that fails fails every operation in it: before any CAS was
//! posted with [`Error::Transport`], in the CAS round with
//! [`Error::OutcomeUnknown`] (that write may have applied).

use crate::error::{Error, LayoutError};
use crate::hash::KeyHash;
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::SubtableGeometry;
use crate::remote::{Completions, RemoteOp, Ticket, Transport};

use super::engine::{
    bad_response, BucketsView, InlineList, OpCtx, SlotPos, SlotRef, SlotRefs, ViewState, NO_OP,
};
use super::{check_key, check_kv, Client};

mod plan;

use plan::{combine, waves_of, Combined};

/// One operation of a batch ([`Client::batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// [`Client::get`] this key.
    Get(&'a [u8]),
    /// [`Client::insert`] (key, value).
    Insert(&'a [u8], &'a [u8]),
    /// [`Client::put`] (key, value).
    Put(&'a [u8], &'a [u8]),
    /// [`Client::update`] (key, value).
    Update(&'a [u8], &'a [u8]),
    /// [`Client::delete`] this key.
    Delete(&'a [u8]),
}

impl<'a> Op<'a> {
    /// The key.
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Op::Get(k) | Op::Delete(k) => k,
            Op::Insert(k, _) | Op::Put(k, _) | Op::Update(k, _) => k,
        }
    }

    /// The operation's name, as [`Error::OutcomeUnknown`] gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Get(_) => "get",
            Op::Insert(..) => "insert",
            Op::Put(..) => "put",
            Op::Update(..) => "update",
            Op::Delete(_) => "delete",
        }
    }

    fn check(&self) -> Result<(), Error> {
        match *self {
            Op::Get(k) | Op::Delete(k) => check_key(k),
            Op::Insert(k, v) | Op::Put(k, v) | Op::Update(k, v) => check_kv(k, v),
        }
    }
}

/// The outcome of one operation of a batch: a get's value (`None` if the
/// key is absent); `Ok(None)` for every write that succeeded. The errors
/// are the single operation's ([`Error::KeyExists`], [`Error::NotFound`],
/// ...).
pub type Reply = Result<Option<Vec<u8>>, Error>;

/// Operations a wave needs before it runs as two overlapping groups (see
/// [`Client::run_wave`]): each group's doorbell then still carries 4 keys
/// or more.
pub const PIPELINE_MIN: usize = 8;

/// The rounds of a wave.
#[derive(Clone, Copy, Debug)]
enum Round {
    /// The combined buckets of every key (and an insert's block WRITE).
    Buckets,
    /// The KV blocks whose fingerprint matches.
    Blocks,
    /// The new blocks' WRITEs and the CASes.
    Cas,
}

/// A round's doorbell, posted: its ops (borrowing the group's flights),
/// its ticket or why it was not posted, and when its CASes were sent.
struct Posted<'b> {
    ops: Vec<RemoteOp<'b>>,
    sent: Result<Ticket, Error>,
    at: u64,
}

/// Where an operation of the current wave stands.
#[derive(Debug)]
enum Fate {
    /// Still on the batched path.
    Flying,
    /// Answered.
    Done,
    /// To finish with the single operation; `retry`: its fast attempt was
    /// spent (counted in the stats).
    Single { retry: bool },
}

/// One operation of a wave on the batched path.
#[derive(Debug)]
struct Flight<'a> {
    /// Its index in the batch.
    i: usize,
    op: Op<'a>,
    hash: KeyHash,
    fate: Fate,
    /// Round 1: where its bucket READs start in the doorbell.
    buckets_at: usize,
    sub: RemotePtr,
    locs: [crate::layout::bucket::BucketLoc; 2],
    /// The fingerprint matches (round 1), then the copies of the key
    /// (round 2), lowest address first.
    slots: SlotRefs,
    /// Round 2: where its block READs start, and the words they read.
    blocks_at: usize,
    words: InlineList<Slot, 4>,
    /// The new KV block and the slot word naming it: an insert's (written
    /// in round 1, with its bucket READs, as the single insert does), an
    /// update's or a put's (round 3). Released unless a CAS that may have
    /// installed it was posted.
    block: Option<(RemotePtr, Vec<u8>, Slot)>,
    /// Whether `block` was written (round 1).
    written: bool,
    /// An insert's, or a put's of an absent key: the buckets of round 1
    /// (for the empty slot and the re-read of round 3).
    view: Option<BucketsView>,
    /// Round 3, inserting: the empty slot taken and its address.
    empty: Option<(SlotPos, RemotePtr)>,
    /// Round 3: where its WRITE and CASes start.
    cas_at: usize,
}

/// Storage a client reuses from batch to batch, so that a warm batch
/// allocates nothing but its new KV blocks: the per-operation tables, the
/// flights and doorbells (kept empty between uses, their lifetimes
/// renewed by [`recycle`]), and the value buffers of earlier replies.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    hashes: Vec<KeyHash>,
    combined: Vec<Combined>,
    waves: Vec<usize>,
    kept: Vec<usize>,
    flights: Vec<Flight<'static>>,
    ops: Vec<RemoteOp<'static>>,
    /// The second group's doorbell and results (see [`Client::run_wave`]).
    ops_b: Vec<RemoteOp<'static>>,
    res_b: Completions,
    /// Value buffers of the replies a caller handed back to
    /// [`Client::batch_into`], for the next gets to fill.
    values: Vec<Vec<u8>>,
}

/// Spare value buffers kept at most (the rest are freed).
const MAX_SPARE_VALUES: usize = 256;

/// `v` emptied, as a vector of another element type with its storage
/// (the standard library collects a vector's `into_iter` in place when
/// the element layouts match, as they do for one type under two
/// lifetimes; otherwise this allocates nothing either, the result being
/// empty).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

impl<T: Transport> Client<T> {
    /// Runs `ops` with their round trips shared (see the module docs):
    /// one reply per operation, in order.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use race_store::client::{Client, ClientConfig, Op};
    /// use race_store::clock::SystemClock;
    /// use race_store::memory::{ClusterConfig, LocalCluster};
    ///
    /// # fn main() -> Result<(), race_store::Error> {
    /// let cluster = LocalCluster::new(ClusterConfig::default())?;
    /// let mut c = Client::open(cluster.transport(), Arc::new(SystemClock::new()), ClientConfig::default())?;
    /// c.put(b"a", b"1")?;
    /// c.put(b"b", b"2")?;
    /// let before = c.stats().transport.round_trips;
    /// let r = c.batch(&[Op::Get(b"a"), Op::Get(b"b"), Op::Get(b"zz")]);
    /// assert_eq!(c.stats().transport.round_trips - before, 2);
    /// assert_eq!(r[0].as_ref().ok(), Some(&Some(b"1".to_vec())));
    /// assert_eq!(r[2].as_ref().ok(), Some(&None));
    /// // Same key: in submission order.
    /// let r = c.batch(&[Op::Update(b"a", b"3"), Op::Get(b"a"), Op::Delete(b"b"), Op::Get(b"b")]);
    /// assert_eq!(r[1].as_ref().ok(), Some(&Some(b"3".to_vec())));
    /// assert_eq!(r[3].as_ref().ok(), Some(&None));
    /// # Ok(()) }
    /// ```
    pub fn batch(&mut self, ops: &[Op<'_>]) -> Vec<Reply> {
        let mut out = Vec::with_capacity(ops.len());
        self.batch_into(ops, &mut out);
        out
    }

    /// [`Client::batch`] into `out` (cleared first), reusing its storage:
    /// the value buffers of the replies already in `out` are filled again
    /// by this batch's gets (hand the same vector back to batch without
    /// allocating per get).
    pub fn batch_into(&mut self, ops: &[Op<'_>], out: &mut Vec<Reply>) {
        let mut scratch = std::mem::take(&mut self.batch);
        for r in out.drain(..) {
            if let Ok(Some(v)) = r {
                if scratch.values.len() < MAX_SPARE_VALUES {
                    scratch.values.push(v);
                }
            }
        }
        if let [op] = ops {
            // Nothing to share: the single operation, without the batch's
            // bookkeeping.
            out.push(self.single(*op));
        } else {
            self.batch_scratch(ops, out, &mut scratch);
        }
        self.batch = scratch;
    }

    fn batch_scratch(&mut self, ops: &[Op<'_>], out: &mut Vec<Reply>, scratch: &mut Scratch) {
        out.resize_with(ops.len(), || Ok(None));
        let hashes = &mut scratch.hashes;
        hashes.clear();
        hashes.extend(ops.iter().map(|op| KeyHash::of(op.key())));
        combine(ops, hashes, &mut scratch.combined);
        let combined = &scratch.combined;
        // Combined writes take no wave of their own.
        waves_of(hashes, combined, &mut scratch.kept, &mut scratch.waves);
        let waves = &scratch.waves;
        let last = waves
            .iter()
            .copied()
            .filter(|&w| w != usize::MAX)
            .max()
            .unwrap_or(0);
        let mut flights: Vec<Flight<'_>> = recycle(std::mem::take(&mut scratch.flights));
        for wave in 0..=last {
            flights.clear();
            for (i, op) in ops.iter().enumerate() {
                if waves.get(i) != Some(&wave) {
                    continue;
                }
                let op = match combined.get(i) {
                    Some(Combined::Into(_)) => continue,
                    Some(Combined::AsPut) => match *op {
                        Op::Update(k, v) => &Op::Put(k, v),
                        _ => op,
                    },
                    _ => op,
                };
                let (Some(slot), Some(&hash)) = (out.get_mut(i), hashes.get(i)) else {
                    continue;
                };
                if let Err(e) = op.check() {
                    *slot = Err(e);
                    continue;
                }
                flights.push(Flight {
                    i,
                    op: *op,
                    hash,
                    fate: Fate::Flying,
                    buckets_at: 0,
                    sub: crate::layout::table::DIR_PTR,
                    locs: hash.bucket_locs(self.table.geometry),
                    slots: SlotRefs::new(super::engine::NO_SLOT),
                    blocks_at: 0,
                    words: InlineList::new(Slot::EMPTY),
                    block: None,
                    written: false,
                    view: None,
                    empty: None,
                    cas_at: 0,
                });
            }
            self.run_wave(
                &mut flights,
                out,
                &mut scratch.ops,
                &mut scratch.ops_b,
                &mut scratch.res_b,
                &mut scratch.values,
            );
        }
        scratch.flights = recycle(flights);
        // A combined write answers as the write that carried its key on.
        for i in (0..ops.len()).rev() {
            if let Some(&Combined::Into(j)) = combined.get(i) {
                let reply = out.get(j).cloned().unwrap_or(Ok(None));
                if let Some(slot) = out.get_mut(i) {
                    *slot = reply;
                }
            }
        }
    }

    /// `op` as the single operation.
    fn single(&mut self, op: Op<'_>) -> Reply {
        match op {
            Op::Get(k) => self.get(k),
            Op::Insert(k, v) => self.insert(k, v).map(|()| None),
            Op::Put(k, v) => self.put(k, v).map(|()| None),
            Op::Update(k, v) => self.update(k, v).map(|()| None),
            Op::Delete(k) => self.delete(k).map(|()| None),
        }
    }

    /// One wave: the batched rounds, then the single operations. When the
    /// transport keeps two doorbells in flight and the wave has at least
    /// [`PIPELINE_MIN`] operations, they run as two groups whose rounds
    /// overlap, staggered: both groups post their first round; then each
    /// in turn waits for its doorbell, acts on it and posts its next round
    /// before the other group is waited for, so one group's doorbell is
    /// always in flight while the other's results are worked on (the keys
    /// of a wave are distinct: the groups' operations have no order between
    /// them, as between two clients).
    fn run_wave(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        scratch_ops: &mut Vec<RemoteOp<'static>>,
        spare_b: &mut Vec<RemoteOp<'static>>,
        res_b: &mut Completions,
        values: &mut Vec<Vec<u8>>,
    ) {
        let mut res_a = std::mem::take(&mut self.results);
        let start = self.now();
        let mid = if flights.len() >= PIPELINE_MIN && self.transport.max_in_flight() >= 2 {
            flights.len() / 2
        } else {
            flights.len()
        };
        let (fa, fb) = flights.split_at_mut(mid);
        if !fb.is_empty() {
            self.stats.overlapped_waves += 1;
        }
        let spare_a = recycle(std::mem::take(scratch_ops));
        let spare_bb = recycle(std::mem::take(spare_b));
        // Staggered: a group posts its next round as soon as it finished
        // one, before waiting for the other group's doorbell. (Unrolled:
        // each posted doorbell borrows its group's flights until it is
        // completed.)
        let pa = self.round_post(Round::Buckets, fa, out, &mut res_a, spare_a, start);
        let pb = if fb.is_empty() {
            None
        } else {
            Some(self.round_post(Round::Buckets, fb, out, res_b, spare_bb, start))
        };
        let (sa, done) = self.round_complete(pa, &mut res_a);
        self.round_finish(Round::Buckets, fa, out, &mut res_a, done, start, values);
        let pa = self.round_post(Round::Blocks, fa, out, &mut res_a, recycle(sa), start);
        let pb = match pb {
            Some(pb) => {
                let (sb, done) = self.round_complete(pb, res_b);
                self.round_finish(Round::Buckets, fb, out, res_b, done, start, values);
                Some(self.round_post(Round::Blocks, fb, out, res_b, recycle(sb), start))
            }
            None => None,
        };
        let (sa, done) = self.round_complete(pa, &mut res_a);
        self.round_finish(Round::Blocks, fa, out, &mut res_a, done, start, values);
        let pa = self.round_post(Round::Cas, fa, out, &mut res_a, recycle(sa), start);
        let pb = match pb {
            Some(pb) => {
                let (sb, done) = self.round_complete(pb, res_b);
                self.round_finish(Round::Blocks, fb, out, res_b, done, start, values);
                Some(self.round_post(Round::Cas, fb, out, res_b, recycle(sb), start))
            }
            None => None,
        };
        let (spare_a, done) = self.round_complete(pa, &mut res_a);
        self.round_finish(Round::Cas, fa, out, &mut res_a, done, start, values);
        let spare_bb = match pb {
            Some(pb) => {
                let (sb, done) = self.round_complete(pb, res_b);
                self.round_finish(Round::Cas, fb, out, res_b, done, start, values);
                sb
            }
            None => Vec::new(),
        };
        *scratch_ops = spare_a;
        *spare_b = spare_bb;
        self.results = res_a;
        for f in flights.iter_mut() {
            let Fate::Single { retry } = f.fate else {
                continue;
            };
            if retry {
                self.stats.retries += 1;
            }
            let reply = self.single(f.op);
            if let Some(slot) = out.get_mut(f.i) {
                *slot = reply;
            }
            f.fate = Fate::Done;
        }
    }

    /// Builds `round`'s doorbell for the flying operations of `flights` and
    /// posts it (nothing when none has an op in it).
    fn round_post<'b>(
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
    fn round_complete(
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
    fn round_finish(
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
            let mut copies = SlotRefs::new(super::engine::NO_SLOT);
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
                    let Some(pos) = view.choose_insert() else {
                        // All four buckets full: the single operation
                        // splits the subtable.
                        self.drop_block(f);
                        f.fate = Fate::Single { retry: true };
                        continue;
                    };
                    match view.addr_of(pos) {
                        Ok(addr) => {
                            f.empty = Some((pos, addr));
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
                    let e = match &e {
                        Error::Transport(source) => Error::OutcomeUnknown {
                            op: f.op.name(),
                            source: source.clone(),
                        },
                        other => other.clone(),
                    };
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
    /// the block is published and the re-read buckets settle concurrent
    /// inserts of the key as the single insert does.
    fn inserted(
        &mut self,
        f: &mut Flight<'_>,
        out: &mut [Reply],
        res: &Completions,
        start: u64,
        cas_start: u64,
    ) {
        let (Some((pos, _)), Some(view)) = (f.empty, f.view.as_ref()) else {
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
        // Published: from now on whoever unlinks it retires it.
        let Some((_, _, slot)) = f.block.take() else {
            return;
        };
        let second = bucket_reads(f.locs);
        let reread = BucketsView::from_reads(
            view.sub(),
            self.table.geometry,
            f.locs,
            res.read(at + 1),
            res.read(at + second),
        );
        let value = match f.op {
            Op::Insert(_, v) | Op::Put(_, v) | Op::Update(_, v) => v,
            Op::Get(_) | Op::Delete(_) => &[],
        };
        let mut ctx = OpCtx::default();
        (ctx.attempts, ctx.start) = (1, cas_start);
        ctx.remember(slot, value, cas_start);
        let settled = reread.and_then(|reread| {
            self.dedup(f.op.key(), &f.hash, pos, slot, reread, cas_start, &mut ctx)
        });
        match settled {
            Ok(true) => answer(f, out, Ok(None)),
            // Another copy holds the key (this one withdrew): the single
            // operation finds it (an insert: `KeyExists`; a put replaces
            // it).
            Ok(false) => f.fate = Fate::Single { retry: true },
            Err(Error::Transport(source)) => {
                let op = f.op.name();
                answer(f, out, Err(Error::OutcomeUnknown { op, source }));
            }
            Err(e) => answer(f, out, Err(e)),
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
            new: slot.raw(),
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

fn answer(f: &mut Flight<'_>, out: &mut [Reply], reply: Reply) {
    if let Some(slot) = out.get_mut(f.i) {
        *slot = reply;
    }
    f.fate = Fate::Done;
}
