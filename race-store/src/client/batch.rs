//! Batched operations: one client keeps a whole batch of operations in
//! flight, and each round of their protocol goes out as one doorbell for
//! all of them (one per memory node, as [`Transport::execute`] posts it).
//!
//! A batch of gets costs 2 round trips however many keys it holds (on
//! hits: the combined buckets of every key, then every matching KV block);
//! a batch of updates or deletes 3 (buckets, blocks, then the new blocks'
//! WRITEs with their CASes). That is the single operations' protocol
//! ([`super::protocol`]) with the rounds of several keys sharing doorbells:
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
//! * Inserts, and puts of absent keys, run as single operations at the end
//!   of their wave (the insert's de-duplication re-reads are per key).
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
use crate::remote::{Completions, RemoteOp, Transport};

use super::engine::{BucketsView, InlineList, SlotRef, SlotRefs, ViewState, NO_OP};
use super::{check_key, check_kv, Client};

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
    /// Round 3: the new KV block (update, put) and the slot word naming it.
    block: Option<(RemotePtr, Vec<u8>, Slot)>,
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
                let fate = match op {
                    Op::Insert(..) => Fate::Single { retry: false },
                    _ => Fate::Flying,
                };
                flights.push(Flight {
                    i,
                    op: *op,
                    hash,
                    fate,
                    buckets_at: 0,
                    sub: crate::layout::table::DIR_PTR,
                    locs: hash.bucket_locs(self.table.geometry),
                    slots: SlotRefs::new(super::engine::NO_SLOT),
                    blocks_at: 0,
                    words: InlineList::new(Slot::EMPTY),
                    block: None,
                    cas_at: 0,
                });
            }
            self.run_wave(&mut flights, out, &mut scratch.ops, &mut scratch.values);
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

    /// One wave: the batched rounds, then the single operations.
    fn run_wave(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        ops: &mut Vec<RemoteOp<'static>>,
        values: &mut Vec<Vec<u8>>,
    ) {
        let mut res = std::mem::take(&mut self.results);
        let start = self.now();
        *ops = self.round_buckets(flights, out, &mut res, recycle(std::mem::take(ops)));
        *ops = self.round_blocks(
            flights,
            out,
            &mut res,
            start,
            recycle(std::mem::take(ops)),
            values,
        );
        *ops = self.round_cas(flights, out, &mut res, start, recycle(std::mem::take(ops)));
        self.results = res;
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

    /// Round 1: the combined buckets of every key in one doorbell; keeps
    /// the fingerprint matches of the operations whose view allows them to
    /// go on.
    /// `ops`: empty storage for the doorbell, handed back emptied.
    fn round_buckets(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        mut ops: Vec<RemoteOp<'static>>,
    ) -> Vec<RemoteOp<'static>> {
        let geometry = self.table.geometry;
        ops.reserve(flights.len() * 2);
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let placed = self.locate(&f.hash).and_then(|(sub, locs)| {
                let at = ops.len();
                ops.resize(at + 2, NO_OP);
                let end = BucketsView::put_read_ops(&mut ops, at, sub, geometry, locs)?;
                ops.truncate(end);
                Ok((at, sub, locs))
            });
            match placed {
                Ok((at, sub, locs)) => (f.buckets_at, f.sub, f.locs) = (at, sub, locs),
                Err(e) => answer(f, out, Err(e)),
            }
        }
        if ops.is_empty() {
            return ops;
        }
        if let Err(e) = self.exec_into(&ops, res) {
            fail_flying(flights, out, &e);
            return ops;
        }
        let mut stale = false;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let second = if f.locs[0] == f.locs[1] { 0 } else { 1 };
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
            } else {
                f.fate = Fate::Single { retry: true };
            }
        }
        if stale {
            // Once for the wave; the single operations then find their
            // subtables. A failure there is theirs to report.
            let _ = self.refresh_directory();
        }
        ops
    }

    /// Round 2: every KV block with a matching fingerprint in one doorbell;
    /// answers the gets, and the writes with no copy to act on.
    /// `ops` as for [`Client::round_buckets`]; `values`: spare buffers
    /// for the gets' values.
    fn round_blocks(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        start: u64,
        mut ops: Vec<RemoteOp<'static>>,
        values: &mut Vec<Vec<u8>>,
    ) -> Vec<RemoteOp<'static>> {
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
        if !ops.is_empty() {
            if let Err(e) = self.exec_into(&ops, res) {
                fail_flying(flights, out, &e);
                return ops;
            }
        }
        let fresh = self.now().saturating_sub(start) <= self.config.max_op_ticks;
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            if !fresh {
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
                f.fate = Fate::Single { retry: true };
                continue;
            }
            match f.op {
                Op::Get(_) => answer(f, out, Ok(value)),
                Op::Update(..) | Op::Delete(_) if copies.is_empty() => {
                    answer(f, out, Err(Error::NotFound));
                }
                // An upsert of an absent key is an insert.
                Op::Put(..) if copies.is_empty() => f.fate = Fate::Single { retry: false },
                _ => f.slots = copies,
            }
        }
        ops
    }

    /// Round 3: the new blocks' WRITEs and the CASes of every write in one
    /// doorbell (a block on its slot's node, so ordered before its CAS).
    /// `spare` as `ops` for [`Client::round_buckets`].
    fn round_cas(
        &mut self,
        flights: &mut [Flight<'_>],
        out: &mut [Reply],
        res: &mut Completions,
        start: u64,
        spare: Vec<RemoteOp<'static>>,
    ) -> Vec<RemoteOp<'static>> {
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
            let (Op::Update(key, value) | Op::Put(key, value)) = f.op else {
                continue;
            };
            let Some(lowest) = f.slots.first().copied() else {
                f.fate = Fate::Single { retry: true };
                continue;
            };
            let made = kv::encode(key, value)
                .map_err(Error::from_kv)
                .and_then(|block| {
                    let ptr = self.alloc_block(lowest.addr.node(), block.len())?;
                    let slot = Slot::for_block(f.hash.fingerprint(), block.len(), ptr)?;
                    Ok((ptr, block, slot))
                });
            match made {
                Ok((ptr, block, _)) if ptr.node() != lowest.addr.node() => {
                    // The slot's node had no room: the single update
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
                if let Some((ptr, block, _)) = f.block.take() {
                    self.alloc.release(ptr, block.len());
                }
                f.fate = Fate::Single { retry: true };
                continue;
            }
            f.cas_at = n;
            n += cas_op_count(f);
        }
        if n == 0 {
            return spare;
        }
        let mut ops: Vec<RemoteOp<'_>> = recycle(spare);
        ops.reserve(n);
        for f in flights.iter().filter(|f| matches!(f.fate, Fate::Flying)) {
            push_cas_ops(f, &mut ops);
        }
        let done = self.exec_into(&ops, res);
        let spare = recycle(ops);
        if let Err(e) = done {
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
            return spare;
        }
        for f in flights
            .iter_mut()
            .filter(|f| matches!(f.fate, Fate::Flying))
        {
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
        spare
    }
}

/// How many ops [`push_cas_ops`] posts for `f`.
fn cas_op_count(f: &Flight<'_>) -> usize {
    match f.block {
        Some(_) => 2,
        None => f.slots.len(),
    }
}

/// The WRITE (update, put) and the CASes of one write of round 3.
fn push_cas_ops<'b>(f: &'b Flight<'_>, ops: &mut Vec<RemoteOp<'b>>) {
    let Some((lowest, others)) = f.slots.split_first() else {
        return;
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
}

fn answer(f: &mut Flight<'_>, out: &mut [Reply], reply: Reply) {
    if let Some(slot) = out.get_mut(f.i) {
        *slot = reply;
    }
    f.fate = Fate::Done;
}

/// A doorbell before any CAS failed: every operation in it fails with the
/// error (nothing it posted can have applied).
fn fail_flying(flights: &mut [Flight<'_>], out: &mut [Reply], e: &Error) {
    for f in flights
        .iter_mut()
        .filter(|f| matches!(f.fate, Fate::Flying))
    {
        answer(f, out, Err(e.clone()));
    }
}

/// How [`combine`] treats one operation of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combined {
    /// Runs as given.
    Alone,
    /// Overwritten by operation `j`, the next on its key, before anyone
    /// can read it: not sent; it answers as `j` does.
    Into(usize),
    /// An update that follows combined puts of its key: the key exists
    /// once they apply, so it runs as a put.
    AsPut,
}

/// Local combining of same-key writes inside a batch (write-conflict
/// avoidance: a hot key written twice in a batch costs one CAS). A put or
/// an update directly followed, among the batch's operations on its key,
/// by a put or an update is linearized just before that one, its value
/// overwritten at once: it sends nothing and answers as that one does
/// (two updates: both find the key or neither; an update after puts: the
/// key exists, so it runs as a put and succeeds). An update followed by a
/// put is not combined (its answer depends on whether the key existed);
/// gets, inserts and deletes are never combined.
///
/// Writes one entry per operation into `out` (cleared first).
fn combine(ops: &[Op<'_>], hashes: &[KeyHash], out: &mut Vec<Combined>) {
    out.clear();
    out.resize(ops.len(), Combined::Alone);
    if !ops
        .iter()
        .any(|op| matches!(op, Op::Put(..) | Op::Update(..)))
    {
        return;
    }
    // Whether operation i is a put, or an update that runs as one.
    let mut put_like: Vec<bool> = ops.iter().map(|op| matches!(op, Op::Put(..))).collect();
    for (i, op) in ops.iter().enumerate() {
        if !matches!(op, Op::Put(..) | Op::Update(..)) || op.check().is_err() {
            continue;
        }
        let Some(h) = hashes.get(i) else { continue };
        let next = (i + 1..ops.len())
            .find(|&j| hashes.get(j) == Some(h) && ops.get(j).map(Op::key) == Some(op.key()));
        let Some(j) = next.filter(|&j| ops.get(j).is_some_and(|o| o.check().is_ok())) else {
            continue;
        };
        let me_put = put_like.get(i).copied().unwrap_or(false);
        match ops.get(j) {
            Some(Op::Put(..)) if me_put => {}
            Some(Op::Update(..)) => {
                if me_put {
                    if let Some(p) = put_like.get_mut(j) {
                        *p = true;
                    }
                    if let Some(c) = out.get_mut(j) {
                        *c = Combined::AsPut;
                    }
                }
            }
            _ => continue,
        }
        if let Some(c) = out.get_mut(i) {
            *c = Combined::Into(j);
        }
    }
}

/// The wave of each operation: its position among the earlier operations
/// on the same key (0 for a key's first), so that a key appears at most
/// once per wave and a key's operations run in submission order.
/// Into `out` (cleared first); `kept` is storage.
fn waves_of(
    hashes: &[KeyHash],
    combined: &[Combined],
    kept: &mut Vec<usize>,
    out: &mut Vec<usize>,
) {
    if !combined.iter().any(|c| matches!(c, Combined::Into(_))) {
        waves_into(hashes, out);
        return;
    }
    kept.clear();
    kept.extend((0..hashes.len()).filter(|&i| !matches!(combined.get(i), Some(Combined::Into(_)))));
    let kept_hashes: Vec<KeyHash> = kept
        .iter()
        .filter_map(|&i| hashes.get(i).copied())
        .collect();
    // Combined operations get a wave no kept operation has (never run).
    out.clear();
    out.resize(hashes.len(), usize::MAX);
    for (&i, w) in kept.iter().zip(waves(&kept_hashes)) {
        if let Some(o) = out.get_mut(i) {
            *o = w;
        }
    }
}

fn waves(hashes: &[KeyHash]) -> Vec<usize> {
    let mut out = Vec::with_capacity(hashes.len());
    waves_into(hashes, &mut out);
    out
}

/// [`waves`] into `out` (cleared first).
fn waves_into(hashes: &[KeyHash], out: &mut Vec<usize>) {
    out.clear();
    if hashes.len() <= 32 {
        // Few operations: comparing pairs costs less than sorting.
        out.extend(hashes.iter().enumerate().map(|(i, h)| {
            let earlier = hashes.get(..i).unwrap_or_default();
            earlier.iter().filter(|e| *e == h).count()
        }));
        return;
    }
    let mut order: Vec<usize> = (0..hashes.len()).collect();
    let h = |i: usize| hashes.get(i).map(|h| (h.h1(), h.h2()));
    order.sort_unstable_by_key(|&i| (h(i), i));
    out.resize(hashes.len(), 0);
    let mut run = 0;
    for k in 1..order.len() {
        let (Some(&prev), Some(&cur)) = (order.get(k - 1), order.get(k)) else {
            continue;
        };
        run = if h(prev) == h(cur) { run + 1 } else { 0 };
        if let Some(w) = out.get_mut(cur) {
            *w = run;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_put_each_key_once_per_wave_in_submission_order() {
        let (a, b, c) = (KeyHash::of(b"a"), KeyHash::of(b"b"), KeyHash::of(b"c"));
        assert_eq!(waves(&[]), Vec::<usize>::new());
        assert_eq!(waves(&[a, b, c]), vec![0, 0, 0]);
        assert_eq!(waves(&[a, b, a, a, c, b]), vec![0, 0, 1, 2, 0, 1]);
        // The sorting path (past 32 operations) agrees.
        let many: Vec<KeyHash> = (0..40u32)
            .map(|i| KeyHash::of(&(i % 7).to_le_bytes()))
            .collect();
        let want: Vec<usize> = (0..40).map(|i| i / 7).collect();
        assert_eq!(waves(&many), want);
    }

    #[test]
    fn same_key_writes_combine_into_the_next_write_of_their_key() {
        use Combined::*;
        let ops = [
            Op::Put(b"a", b"1"),
            Op::Put(b"a", b"2"),
            Op::Update(b"a", b"3"),
            Op::Update(b"b", b"1"),
            Op::Get(b"b"),
            Op::Update(b"b", b"2"),
            Op::Update(b"b", b"3"),
            Op::Put(b"b", b"4"),
            Op::Delete(b"a"),
            Op::Put(b"c", b"1"),
            Op::Put(b"c", b""),
            Op::Update(b"", b"1"),
            Op::Update(b"", b"2"),
        ];
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let mut combined = vec![Alone; 3];
        combine(&ops, &hashes, &mut combined);
        assert_eq!(
            combined,
            vec![
                Into(1),
                Into(2),
                // After puts: a put; the delete ends the chain.
                AsPut,
                // A get in between.
                Alone,
                Alone,
                Into(6),
                // An update before a put: its answer depends on the key.
                Alone,
                Alone,
                Alone,
                Into(10),
                Alone,
                // Bad input is never combined.
                Alone,
                Alone,
            ]
        );
    }
}
