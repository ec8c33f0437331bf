//! Batched operations: one client keeps a whole batch of operations in
//! flight, and each round of their protocol goes out as one doorbell for
//! all of them (one per memory node, as [`Transport::execute`] posts it).
//!
//! A batch of gets costs 2 round trips however many keys it holds (on
//! hits: the combined buckets of every key, then every matching KV block);
//! a batch of updates or deletes 3 (buckets, blocks, then the new blocks'
//! WRITEs with their CASes); a batch of inserts 3 when no other key's
//! fingerprint matches (the new blocks' WRITEs with the buckets, then the
//! CASes of tentative copies into empty slots with the buckets' re-reads,
//! then the commits), puts of absent keys 3 or 4 likewise (their blocks
//! written with the CASes). That is the
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
//! * An insert, or a put of an absent key, that won its empty slot and
//!   is alone in the re-read buckets (no other slot with its fingerprint)
//!   commits in round 4 with the others; one that is not settles against
//!   the other copies from the re-read buckets as the single insert does
//!   (further doorbells, if any, are its own); one that meets full buckets
//!   is finished by the single operation (which splits).
//! * Same-key writes are combined ([`combine`]): a put or update that the
//!   next operation on its key overwrites sends nothing and answers as that
//!   one (an update that then runs as a put reports a lost outcome as
//!   `put`). Same-key gets in a row are combined too: they answer as the
//!   first of the run (read once, in one wave, linearized together); and a
//!   get right after a write of its key, with only gets after it on that
//!   key, answers from the write's outcome (the value written, or none
//!   after a delete), read only when that outcome does not tell.
//! * A wave of more than [`MAX_WAVE_PART`] operations runs as consecutive
//!   parts, so that each group's doorbell keeps to one per memory node.
//!
//! Failures are per operation, as the single operation reports them. A
//! doorbell that fails fails every operation in it: before any CAS was
//! posted with [`Error::Transport`], in the CAS or commit rounds with
//! [`Error::OutcomeUnknown`] (that write may have applied).

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::slot::{RemotePtr, Slot};
use crate::remote::{Completions, RemoteOp, Ticket, Transport};

use super::engine::{BucketsView, InlineList, SlotPos, SlotRefs};
use super::{check_key, check_kv, Client};

mod plan;
mod rounds;

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

/// Operations of a wave run together at most (as two groups of 16): the
/// rest of the wave runs after them, so that each group's doorbell keeps
/// to one per memory node (32 ops each, see the VQP transport) for gets
/// and updates.
pub const MAX_WAVE_PART: usize = 32;

/// The rounds of a wave.
#[derive(Clone, Copy, Debug)]
enum Round {
    /// The combined buckets of every key (and an insert's block WRITE).
    Buckets,
    /// The KV blocks whose fingerprint matches.
    Blocks,
    /// The new blocks' WRITEs and the CASes.
    Cas,
    /// The commits of the inserts' tentative copies.
    Commit,
}

/// An insert's tentative copy, alone in its re-read buckets, to commit in
/// round 4.
#[derive(Clone, Copy, Debug)]
struct Commit {
    pos: SlotPos,
    addr: RemotePtr,
    /// The tentative word placed.
    mine: Slot,
    /// When the CAS that placed it was sent.
    placed: u64,
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
    /// Round 4: the tentative copy to commit.
    commit: Option<Commit>,
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
            if ops.iter().any(|op| !matches!(op, Op::Get(_))) {
                if out
                    .iter()
                    .any(|r| r.as_ref().is_err_and(Error::may_leave_work))
                {
                    self.hold_early_ends();
                }
                self.trim();
            }
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
                    Some(Combined::Into(_) | Combined::Reads(_)) => continue,
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
                    commit: None,
                });
            }
            // A large wave runs as consecutive parts whose groups'
            // doorbells still fit one per node (the transport executes a
            // larger one at once, without overlap). Its keys are distinct:
            // the parts have no order between them.
            for part in flights.chunks_mut(MAX_WAVE_PART) {
                self.run_wave(
                    part,
                    out,
                    &mut scratch.ops,
                    &mut scratch.ops_b,
                    &mut scratch.res_b,
                    &mut scratch.values,
                );
            }
        }
        scratch.flights = recycle(flights);
        // A get that reads a write of the batch answers from its outcome.
        for i in 0..ops.len() {
            let Some(&Combined::Reads(j)) = combined.get(i) else {
                continue;
            };
            let (Some(&op), Some(&write), Some(outcome)) = (ops.get(i), ops.get(j), out.get(j))
            else {
                continue;
            };
            let reply = match (write, outcome) {
                (Op::Put(_, v) | Op::Update(_, v) | Op::Insert(_, v), Ok(_)) => {
                    Ok(Some(v.to_vec()))
                }
                (Op::Delete(_), Ok(_)) => Ok(None),
                (Op::Update(..) | Op::Delete(_), Err(Error::NotFound)) => Ok(None),
                // The outcome does not tell (an insert of a key that was
                // there, a failure): the get itself, after every other
                // operation on its key.
                _ => self.single(op),
            };
            if let Some(slot) = out.get_mut(i) {
                *slot = reply;
            }
        }
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
        self.wave_claims.clear();
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
        let (sa, done) = self.round_complete(pa, &mut res_a);
        self.round_finish(Round::Cas, fa, out, &mut res_a, done, start, values);
        let pa = self.round_post(Round::Commit, fa, out, &mut res_a, recycle(sa), start);
        let pb = match pb {
            Some(pb) => {
                let (sb, done) = self.round_complete(pb, res_b);
                self.round_finish(Round::Cas, fb, out, res_b, done, start, values);
                Some(self.round_post(Round::Commit, fb, out, res_b, recycle(sb), start))
            }
            None => None,
        };
        let (spare_a, done) = self.round_complete(pa, &mut res_a);
        self.round_finish(Round::Commit, fa, out, &mut res_a, done, start, values);
        let spare_bb = match pb {
            Some(pb) => {
                let (sb, done) = self.round_complete(pb, res_b);
                self.round_finish(Round::Commit, fb, out, res_b, done, start, values);
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
}
