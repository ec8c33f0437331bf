//! The data path between an attached process and the daemon: one shared
//! file per VQP holding its submission queue (the process writes, the
//! daemon drains), its completion queue (the daemon fills, the process
//! drains) and the verdict of the last doorbell; one page per attached
//! process holding the daemon's idle flag and its data thread's CPU.
//!
//! Layout of a VQP's ring file (little-endian words; each side's indices
//! on lines of their own, the other words beside them on the lines of the
//! side that writes them):
//!
//! ```text
//!   0  sq_tail      entries the process has published (it writes)
//!   8  sq_cpu       the CPU the process published them from, plus one
//!                   (0: not said), read with the tail
//!  64  sq_head      entries the daemon has taken (it writes, after the verdict)
//!  80  verdict      code (0: posted), WR index, two detail words,
//! 112               message length, then 192 bytes of message at 128
//! 320  sleepers     process threads asleep on wake_seq (they count it;
//!                   a line the process writes only to sleep)
//! 384  cq_tail      completions the daemon has written
//! 392  wake_seq     (4 bytes, a futex) bumped by the daemon when it moves
//!                   sq_head or cq_tail while a process thread sleeps
//! 448  cq_head      completions the process has taken
//! 512  SQ           SQ_CAP slots of 64 bytes
//!      CQ           CQ_CAP entries of 16 bytes
//! ```
//!
//! A submission entry (SQE) is one slot, 8 words: `wr_id`;
//! `op | flags << 8 | kind << 16 | count << 24`; local address;
//! `length | lkey << 32`; remote address; `rkey`; compare or add; swap.
//! `kind` says where the payload is: 0, the one SGE in the entry; 1,
//! `count` SGEs (0..=4), the first in the entry and the others in the
//! next slot (a continuation: `addr`, `length | lkey << 32` per SGE); 2,
//! inline data (a WRITE's), `length` bytes (at most 64) in the next slot.
//! A WR with a continuation takes two slots; the tail and head count
//! slots. A completion entry (CQE), 2 words: `wr_id`;
//! `status | opcode << 8 | byte_len << 32`.
//!
//! An entry's bytes are coded by [`encode_sqe_bytes`]/[`decode_sqe_bytes`]
//! and [`encode_cqe_bytes`]/[`decode_cqe_bytes`], which touch no map (the
//! fuzz target `kmod_daemon` runs them on arbitrary bytes); the ring
//! functions copy one entry between the map and those, a word at a time.
//!
//! Invariants: indices only grow (wrapping u64); `sq_tail - sq_head` is at
//! most `SQ_CAP` and `cq_tail - cq_head` at most `CQ_CAP` when both sides
//! behave. The daemon never trusts the process's words: a tail that runs
//! more than `SQ_CAP` ahead, a head that runs past the tail, an entry that
//! does not decode, are that VQP's error alone (see `super::host`). A
//! doorbell is synchronous: the process publishes its entries, then waits
//! for `sq_head` to reach them and reads the verdict, so a post fails or
//! succeeds as in-process, typed.

use krcore_nic::shared::SharedMap;
use krcore_nic::{
    Payload, RemoteAddr, SendFlags, SendWr, SgList, Sge, Wc, WcOpcode, WcStatus, WrOp,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// Submission slots per VQP: the most WRs one doorbell carries (half as
/// many with continuations: several SGEs, inline data).
pub const SQ_CAP: usize = 64;
/// Completion entries per VQP.
pub const CQ_CAP: usize = 256;

pub(crate) const SQ_TAIL: usize = 0;
/// The CPU the process's thread published the last doorbell from, plus one
/// (0: not said, as by a process of an older build): a data thread that
/// served it on that CPU gives the CPU back as soon as it finds no more
/// work (see `super::host`).
pub(crate) const SQ_CPU: usize = 8;
pub(crate) const SQ_HEAD: usize = 64;
pub(crate) const V_CODE: usize = 80;
pub(crate) const V_INDEX: usize = 88;
pub(crate) const V_A: usize = 96;
pub(crate) const V_B: usize = 104;
pub(crate) const V_MSG_LEN: usize = 112;
pub(crate) const V_MSG: usize = 128;
pub(crate) const V_MSG_MAX: usize = 192;
pub(crate) const CQ_TAIL: usize = 384;
pub(crate) const CQ_HEAD: usize = 448;
/// The futex word (only ever accessed as a 4-byte atomic).
const WAKE_SEQ: usize = 392;
/// Process threads asleep (or about to sleep) on [`WAKE_SEQ`]: on a line
/// of its own, which the process writes only when a thread goes to sleep,
/// so the daemon's look at it after every head or tail it moves is a hit
/// in its own cache (beside `cq_head`, it cost a line transfer each).
const SLEEPERS: usize = 320;
const SQ_AT: usize = 512;
/// Bytes of a submission entry (SQE).
pub const SQE_BYTES: usize = 64;
const CQ_AT: usize = SQ_AT + SQ_CAP * SQE_BYTES;
/// Bytes of a completion entry (CQE).
pub const CQE_BYTES: usize = 16;
/// Bytes of a VQP's ring file.
pub const RING_BYTES: usize = (CQ_AT + CQ_CAP * CQE_BYTES).next_multiple_of(4096);

/// The client page: the daemon's idle flag (1 while its data thread
/// sleeps: a process that publishes entries then writes the eventfd).
pub(crate) const PAGE_SLEEPING: usize = 0;
/// The client page, on a line of its own: the CPU the data thread serving
/// the process last ran on, plus one (0: not said, as by a daemon of an
/// older build). A process thread waiting on that CPU yields to it at once
/// instead of spinning: the data thread cannot run until it does.
pub(crate) const PAGE_DATA_CPU: usize = 64;
/// The client page, on a line of its own: which of the process's VQPs
/// rang their doorbell since the data thread last looked, as 256 bits
/// (bit `handle % 256` of a VQP, in 4 words; VQPs that share a bit are
/// looked at together). A process sets its VQP's bit after it moves the
/// ring's tail; the data thread takes the bits (a swap to 0) and looks at
/// the rings they name, and at the VQPs with WRs in flight, not at every
/// ring: with 200 idle rings, loading each one's tail every round was
/// most of the data thread's time (one page and one line each).
pub(crate) const PAGE_DOORBELLS: usize = 128;
/// Words of [`PAGE_DOORBELLS`].
pub(crate) const DOORBELL_WORDS: usize = 4;
/// Bytes of a client page.
pub const PAGE_BYTES: usize = 4096;

/// The process's side, after it moved the tail of VQP `handle`'s ring:
/// marks the doorbell on the page.
pub(crate) fn ring_doorbell(page: &SharedMap, handle: u32) {
    let (w, bit) = doorbell_bit(handle);
    word(page, PAGE_DOORBELLS + w * 8).fetch_or(bit, Ordering::SeqCst);
}

/// The data thread's side: the doorbells marked on `page` since the last
/// take, cleared.
pub(crate) fn take_doorbells(page: &SharedMap) -> [u64; DOORBELL_WORDS] {
    let mut bits = [0u64; DOORBELL_WORDS];
    for (i, b) in bits.iter_mut().enumerate() {
        let w = word(page, PAGE_DOORBELLS + i * 8);
        // A load first: a swap of an empty word would take the line from
        // the process's cache every round.
        if w.load(Ordering::Relaxed) != 0 {
            *b = w.swap(0, Ordering::SeqCst);
        }
    }
    bits
}

/// Whether doorbells are marked on `page` (the data thread's look before
/// it sleeps).
pub(crate) fn doorbells_marked(page: &SharedMap) -> bool {
    (0..DOORBELL_WORDS).any(|i| word(page, PAGE_DOORBELLS + i * 8).load(Ordering::SeqCst) != 0)
}

/// Whether `bits` (of [`take_doorbells`]) mark VQP `handle`.
pub(crate) fn rang(bits: &[u64; DOORBELL_WORDS], handle: u32) -> bool {
    let (w, bit) = doorbell_bit(handle);
    bits.get(w).is_some_and(|b| b & bit != 0)
}

/// The word and the bit of VQP `handle` in [`PAGE_DOORBELLS`].
fn doorbell_bit(handle: u32) -> (usize, u64) {
    let b = handle as usize % (DOORBELL_WORDS * 64);
    (b / 64, 1 << (b % 64))
}

/// The CPU this thread runs on, plus one (as [`SQ_CPU`] and
/// [`PAGE_DATA_CPU`] hold it): a vDSO call, a few ns. The thread may move
/// right after; the two sides use it to pace their waits only.
pub(crate) fn this_cpu() -> u64 {
    rustix::thread::sched_getcpu() as u64 + 1
}

const OP_READ: u64 = 1;
const OP_WRITE: u64 = 2;
const OP_CAS: u64 = 3;
const OP_FAA: u64 = 4;

/// Payload kinds (bits 16..24 of an SQE's second word).
const KIND_ONE: u64 = 0;
const KIND_SGES: u64 = 1;
const KIND_INLINE: u64 = 2;

/// Why a WR cannot travel through the ring (the process's side refuses
/// it before publishing anything).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Inline data other than a WRITE's.
    #[error("WR {index}: only a WRITE carries inline data")]
    Inline {
        /// Index in the batch.
        index: usize,
    },
    /// Only one-sided READ, WRITE, CAS and FAA to the VQP's target.
    #[error(
        "WR {index}: only READ, WRITE, CAS and FAA to the VQP's target go through the node daemon"
    )]
    Op {
        /// Index in the batch.
        index: usize,
    },
}

/// Why the daemon refused a submission entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The entry's opcode byte (the low byte of its second word) is none
    /// of READ (1), WRITE (2), CAS (3), FAA (4).
    #[error("submission entry with unknown opcode {0}")]
    Opcode(u64),
    /// The entry's payload is impossible: an unknown kind, more than four
    /// SGEs, inline data longer than 64 bytes or on another op than WRITE.
    #[error("submission entry with payload kind {kind}, count {count}, length {len}")]
    Payload {
        /// The kind byte.
        kind: u8,
        /// The count byte.
        count: u8,
        /// The length field.
        len: u32,
    },
    /// The entry needs a continuation slot the doorbell does not have.
    #[error("submission entry's continuation is past the doorbell's last slot")]
    Truncated,
}

/// The word at `off` of a ring (the offsets are this module's constants,
/// inside `RING_BYTES` and aligned: the mapping was checked to be that
/// long when it was made, so this cannot fail; a zero word stands in
/// should it ever).
#[inline]
pub(crate) fn word(map: &SharedMap, off: usize) -> &AtomicU64 {
    static ZERO: AtomicU64 = AtomicU64::new(0);
    map.word(off).unwrap_or(&ZERO)
}

/// The ring's futex word (see [`word`] for why this cannot fail).
fn wake_seq(map: &SharedMap) -> &std::sync::atomic::AtomicU32 {
    static ZERO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    map.word32(WAKE_SEQ).unwrap_or(&ZERO)
}

/// The daemon's side, after it moved `sq_head` or `cq_tail`: wakes the
/// process's threads asleep on the ring, if any (a fence and one load
/// when none sleeps).
pub(crate) fn notify(map: &SharedMap) {
    std::sync::atomic::fence(Ordering::SeqCst);
    if word(map, SLEEPERS).load(Ordering::SeqCst) != 0 {
        let seq = wake_seq(map);
        seq.fetch_add(1, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(seq, rustix::thread::futex::Flags::empty(), u32::MAX);
    }
}

/// The process's side: sleeps until the daemon notifies the ring or
/// `timeout` passes, unless `done()` holds once this thread is counted as
/// a sleeper (so a notify after that check cannot be missed).
pub(crate) fn sleep_unless(map: &SharedMap, done: impl Fn() -> bool, timeout: std::time::Duration) {
    let sleepers = word(map, SLEEPERS);
    let seq = wake_seq(map);
    sleepers.fetch_add(1, Ordering::SeqCst);
    let before = seq.load(Ordering::SeqCst);
    if !done() {
        let ts = rustix::thread::futex::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // A wake-up, a timeout, a changed word, a signal: all mean "look
        // again" to the caller.
        let _ = rustix::thread::futex::wait(
            seq,
            rustix::thread::futex::Flags::empty(),
            before,
            Some(&ts),
        );
    }
    sleepers.fetch_sub(1, Ordering::SeqCst);
}

fn put(map: &SharedMap, off: usize, v: u64) {
    word(map, off).store(v, Ordering::Relaxed);
}

fn get(map: &SharedMap, off: usize) -> u64 {
    word(map, off).load(Ordering::Relaxed)
}

fn sqe_at(seq: u64) -> usize {
    SQ_AT + (seq as usize % SQ_CAP) * SQE_BYTES
}

fn cqe_at(seq: u64) -> usize {
    CQ_AT + (seq as usize % CQ_CAP) * CQE_BYTES
}

/// The little-endian words of an entry (`W` words of `bytes`; an entry
/// constant sizes both, so the zip never runs short).
fn le_words<const W: usize>(bytes: &[u8]) -> [u64; W] {
    let mut words = [0u64; W];
    for (w, c) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
    }
    words
}

/// Copies an entry's bytes into the map at `at`, a word at a time, in order.
fn put_entry(map: &SharedMap, at: usize, entry: &[u8]) {
    // The entry offsets are this module's layout, inside RING_BYTES and
    // aligned (see `word`): the words are always there.
    let Ok(words) = map.words(at, entry.len() / 8) else {
        return;
    };
    for (w, c) in words.iter().zip(entry.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(c.try_into().unwrap_or_default()),
            Ordering::Relaxed,
        );
    }
}

/// Copies the entry at `at` out of the map, a word at a time, in order.
fn get_entry<const B: usize>(map: &SharedMap, at: usize) -> [u8; B] {
    let mut entry = [0u8; B];
    // As in `put_entry`; zeros (an entry that does not decode) otherwise.
    if let Ok(words) = map.words(at, B / 8) {
        for (c, w) in entry.chunks_exact_mut(8).zip(words) {
            c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    entry
}

/// Writes `wr` as the SQE at slot `seq` (the process's side); returns the
/// slots it took (1, or 2 with a continuation).
pub(crate) fn encode_sqe(
    map: &SharedMap,
    seq: u64,
    index: usize,
    wr: &SendWr,
) -> Result<u64, EncodeError> {
    let (head, cont) = encode_sqe_bytes(index, wr)?;
    put_entry(map, sqe_at(seq), &head);
    match cont {
        Some(c) => {
            put_entry(map, sqe_at(seq.wrapping_add(1)), &c);
            Ok(2)
        }
        None => Ok(1),
    }
}

/// The slots `wr` takes in the ring: 2 for several SGEs or inline
/// data (a continuation), 1 otherwise. Whether it can travel at all is
/// [`encode_sqe_bytes`]'s to say.
pub fn sqe_slots(wr: &SendWr) -> usize {
    match &wr.payload {
        Payload::Local(list) if list.as_slice().len() < 2 => 1,
        _ => 2,
    }
}

fn words_to_bytes<const B: usize>(words: &[u64]) -> [u8; B] {
    let mut entry = [0u8; B];
    for (c, w) in entry.chunks_exact_mut(8).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    entry
}

fn sge_words(sge: &Sge) -> [u64; 2] {
    [sge.addr, u64::from(sge.length) | u64::from(sge.lkey) << 32]
}

/// `wr` as the bytes of its SQE and, for several SGEs or inline data, of
/// its continuation slot; `index` (its place in the batch) is only for
/// the error.
///
/// # Errors
/// [`EncodeError`]: a WR that is not a READ, WRITE, CAS or FAA to the
/// connected target, or inline data on another op than WRITE.
#[allow(clippy::type_complexity)]
pub fn encode_sqe_bytes(
    index: usize,
    wr: &SendWr,
) -> Result<([u8; SQE_BYTES], Option<[u8; SQE_BYTES]>), EncodeError> {
    if !matches!(wr.dest, krcore_nic::Destination::Connected) {
        return Err(EncodeError::Op { index });
    }
    let (op, remote, a, b) = match wr.op {
        WrOp::Read { remote } => (OP_READ, remote, 0, 0),
        WrOp::Write { remote } => (OP_WRITE, remote, 0, 0),
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (OP_CAS, remote, compare, swap),
        WrOp::FetchAdd { remote, add } => (OP_FAA, remote, add, 0),
        _ => return Err(EncodeError::Op { index }),
    };
    let (kind, count, first, cont) = match &wr.payload {
        Payload::Local(list) => match list.as_slice() {
            [one] => (KIND_ONE, 1, sge_words(one), None),
            sges => {
                let first = sges.first().map_or([0, 0], sge_words);
                let rest: Vec<u64> = sges.iter().skip(1).flat_map(sge_words).collect();
                let cont = (sges.len() > 1).then(|| words_to_bytes::<SQE_BYTES>(&rest));
                (KIND_SGES, sges.len() as u64, first, cont)
            }
        },
        Payload::Inline(data) => {
            if op != OP_WRITE {
                return Err(EncodeError::Inline { index });
            }
            let bytes = data.as_slice();
            let mut cont = [0u8; SQE_BYTES];
            cont[..bytes.len()].copy_from_slice(bytes);
            (KIND_INLINE, 0, [0, bytes.len() as u64], Some(cont))
        }
    };
    let head = words_to_bytes::<SQE_BYTES>(&[
        wr.wr_id,
        op | u64::from(wr.flags.0) << 8 | kind << 16 | count << 24,
        first[0],
        first[1],
        remote.addr,
        u64::from(remote.rkey),
        a,
        b,
    ]);
    Ok((head, cont))
}

/// Loads one word of each of the `n` slots from `seq` on, so that their
/// cache lines come over together (the daemon's side, before decoding).
pub(crate) fn touch_sq(map: &SharedMap, seq: u64, n: u64) {
    let mut acc = 0u64;
    for i in 0..n.min(SQ_CAP as u64) {
        acc ^= get(map, sqe_at(seq.wrapping_add(i)));
    }
    std::hint::black_box(acc);
}

/// Whether the SQE `head` takes a continuation slot (by its kind and
/// count alone; total on any bytes).
pub fn sqe_continues(head: &[u8; SQE_BYTES]) -> bool {
    let opf = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    match (opf >> 16) & 0xff {
        KIND_SGES => (opf >> 24) & 0xff >= 2,
        KIND_INLINE => true,
        _ => false,
    }
}

/// Reads the SQE at slot `seq` (the daemon's side), and its continuation
/// when it has one and it is before `end`: the WR as the process wrote it
/// and the slots it took; its local keys and ranges are for the caller to
/// check.
pub(crate) fn decode_sqe(
    map: &SharedMap,
    seq: u64,
    end: u64,
) -> Result<(SendWr, u64), DecodeError> {
    let head = get_entry::<SQE_BYTES>(map, sqe_at(seq));
    if !sqe_continues(&head) {
        return Ok((decode_sqe_bytes(&head, None)?, 1));
    }
    let next = seq.wrapping_add(1);
    if next == end {
        return Err(DecodeError::Truncated);
    }
    let cont = get_entry::<SQE_BYTES>(map, sqe_at(next));
    Ok((decode_sqe_bytes(&head, Some(&cont))?, 2))
}

/// The WR one SQE's bytes (and its continuation's, when
/// [`sqe_continues`]) describe. Total on any bytes (the process wrote
/// them: untrusted). What it returns is always a WR with at most four
/// local SGEs or (a WRITE's) at most 64 bytes of inline data, the
/// connected destination, flags among `SIGNALED` and `FENCE` (other bits
/// are dropped), and a READ, WRITE, CAS or FAA; the upper 32 bits of the
/// `rkey` word, and the continuation's words past its SGEs, are ignored.
/// The SGEs are as written: whether they name the process's memory is the
/// caller's check.
///
/// # Errors
/// [`DecodeError::Opcode`]: the opcode byte is none of the four;
/// [`DecodeError::Payload`]: an impossible payload;
/// [`DecodeError::Truncated`]: a continuation needed and not given.
pub fn decode_sqe_bytes(
    head: &[u8; SQE_BYTES],
    cont: Option<&[u8; SQE_BYTES]>,
) -> Result<SendWr, DecodeError> {
    let [wr_id, opf, addr, len_key, raddr, rkey, a, b] = le_words(head);
    let first = Sge {
        addr,
        length: len_key as u32,
        lkey: (len_key >> 32) as u32,
    };
    let remote = RemoteAddr {
        addr: raddr,
        rkey: rkey as u32,
    };
    let op = match opf & 0xff {
        OP_READ => WrOp::Read { remote },
        OP_WRITE => WrOp::Write { remote },
        OP_CAS => WrOp::CompareSwap {
            remote,
            compare: a,
            swap: b,
        },
        OP_FAA => WrOp::FetchAdd { remote, add: a },
        other => return Err(DecodeError::Opcode(other)),
    };
    let kind = (opf >> 16) & 0xff;
    let count = (opf >> 24) & 0xff;
    let bad = || DecodeError::Payload {
        kind: kind as u8,
        count: count as u8,
        len: first.length,
    };
    let payload = match kind {
        KIND_ONE => Payload::Local(SgList::one(first)),
        KIND_SGES if count == 0 => Payload::Local(SgList::empty()),
        KIND_SGES if count == 1 => Payload::Local(SgList::one(first)),
        KIND_SGES if count as usize <= krcore_nic::MAX_SGE => {
            let rest = le_words::<8>(cont.ok_or(DecodeError::Truncated)?);
            let mut sges = [first; krcore_nic::MAX_SGE];
            for (i, pair) in rest.chunks_exact(2).take(count as usize - 1).enumerate() {
                sges[i + 1] = Sge {
                    addr: pair[0],
                    length: pair[1] as u32,
                    lkey: (pair[1] >> 32) as u32,
                };
            }
            Payload::Local(SgList::from_slice(&sges[..count as usize]).ok_or_else(bad)?)
        }
        KIND_INLINE if matches!(op, WrOp::Write { .. }) => {
            let bytes = cont.ok_or(DecodeError::Truncated)?;
            let len = first.length as usize;
            let data = bytes
                .get(..len)
                .and_then(krcore_nic::InlineData::new)
                .ok_or_else(bad)?;
            Payload::Inline(data)
        }
        _ => return Err(bad()),
    };
    // Only the flags the SDK defines (signaled, fence) pass.
    let flags = SendFlags(((opf >> 8) as u8) & (SendFlags::SIGNALED.0 | SendFlags::FENCE.0));
    Ok(SendWr {
        wr_id,
        op,
        payload,
        flags,
        dest: krcore_nic::Destination::Connected,
    })
}

/// Writes `wc` as the CQE of sequence `seq` (the daemon's side).
pub(crate) fn encode_cqe(map: &SharedMap, seq: u64, wc: &Wc) {
    put_entry(map, cqe_at(seq), &encode_cqe_bytes(wc));
}

/// `wc` as the bytes of one CQE: its `wr_id`, status, opcode and length
/// (the ring carries no immediate data, QP number or source QP).
pub fn encode_cqe_bytes(wc: &Wc) -> [u8; CQE_BYTES] {
    words_to_bytes::<CQE_BYTES>(&[
        wc.wr_id,
        wc.status as u64 | (wc.opcode as u64) << 8 | u64::from(wc.byte_len) << 32,
    ])
}

/// Reads the CQE of sequence `seq` (the process's side), for the VQP `qp_num`.
pub(crate) fn decode_cqe(map: &SharedMap, seq: u64, qp_num: u32) -> Wc {
    decode_cqe_bytes(&get_entry(map, cqe_at(seq)), qp_num)
}

/// The completion one CQE's bytes describe, for the VQP `qp_num`. Total
/// on any bytes: an unknown status reads as `GeneralErr`, an unknown
/// opcode as `Send` (as `WcStatus::from_u8` and `WcOpcode::from_u8`);
/// the bits between the opcode and the length are ignored.
pub fn decode_cqe_bytes(entry: &[u8; CQE_BYTES], qp_num: u32) -> Wc {
    let [wr_id, w] = le_words(entry);
    Wc {
        wr_id,
        status: WcStatus::from_u8(w as u8),
        opcode: WcOpcode::from_u8((w >> 8) as u8),
        byte_len: (w >> 32) as u32,
        imm: None,
        qp_num,
        src_qp: 0,
    }
}

/// A doorbell's verdict as the daemon wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub code: u64,
    pub index: u64,
    pub a: u64,
    pub b: u64,
    pub message: String,
}

/// Writes the verdict of the doorbell being answered (before `sq_head`).
pub(crate) fn write_verdict(map: &SharedMap, v: &Verdict) {
    put(map, V_CODE, v.code);
    put(map, V_INDEX, v.index);
    put(map, V_A, v.a);
    put(map, V_B, v.b);
    let msg = v.message.as_bytes();
    let n = msg.len().min(V_MSG_MAX);
    let _ = map.write(V_MSG, &msg[..n]);
    put(map, V_MSG_LEN, n as u64);
}

/// Reads the verdict (after `sq_head` reached the doorbell).
pub(crate) fn read_verdict(map: &SharedMap) -> Verdict {
    let n = (get(map, V_MSG_LEN) as usize).min(V_MSG_MAX);
    let mut msg = vec![0u8; n];
    let _ = map.read(V_MSG, &mut msg);
    Verdict {
        code: get(map, V_CODE),
        index: get(map, V_INDEX),
        a: get(map, V_A),
        b: get(map, V_B),
        message: String::from_utf8_lossy(&msg).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_bits_are_taken_once_and_name_their_vqps() {
        let (page, _file) = SharedMap::create("page-test", PAGE_BYTES).unwrap();
        assert!(!doorbells_marked(&page));
        for h in [0u32, 63, 64, 255, 256 + 5, 1000] {
            ring_doorbell(&page, h);
        }
        assert!(doorbells_marked(&page));
        let bits = take_doorbells(&page);
        assert!(!doorbells_marked(&page), "taken: cleared");
        for h in [0u32, 63, 64, 255, 5, 261, 1000, 232] {
            assert!(rang(&bits, h), "{h}");
        }
        for h in [1u32, 62, 65, 254, 256 + 6, 999] {
            assert!(!rang(&bits, h), "{h}");
        }
        assert_eq!(take_doorbells(&page), [0; DOORBELL_WORDS]);
        // The other words of the page are left alone.
        assert_eq!(word(&page, PAGE_SLEEPING).load(Ordering::Relaxed), 0);
        assert_eq!(word(&page, PAGE_DATA_CPU).load(Ordering::Relaxed), 0);
    }

    #[test]
    fn entries_round_trip_through_the_ring() {
        let (map, _file) = SharedMap::create("ring-test", RING_BYTES).unwrap();
        let local = Sge {
            addr: 0x1000,
            length: 8,
            lkey: 7,
        };
        let remote = RemoteAddr {
            addr: 0xdead_0000,
            rkey: 9,
        };
        let wrs = [
            SendWr::read(1, local, remote),
            SendWr::write(2, local, remote).signaled(false),
            SendWr::cas(3, local, remote, 5, 6),
            SendWr::faa(4, local, remote, 11),
        ];
        let more = SgList::from_slice(&[local, local, local, local]).unwrap();
        let two = SgList::from_slice(&[
            local,
            Sge {
                addr: 0x2000,
                ..local
            },
        ])
        .unwrap();
        let inline = krcore_nic::InlineData::new(b"sixty-four bytes at most").unwrap();
        let extended = [
            SendWr {
                payload: Payload::Local(more),
                ..SendWr::read(5, local, remote)
            },
            SendWr {
                payload: Payload::Local(two),
                ..SendWr::write(6, local, remote)
            },
            SendWr {
                payload: Payload::Inline(inline),
                ..SendWr::write(7, local, remote)
            },
            SendWr {
                payload: Payload::Local(SgList::empty()),
                ..SendWr::write(8, local, remote)
            },
        ];
        // Past the end of the SQ: the ring wraps, continuations too.
        let mut seq = SQ_CAP as u64 - 2;
        for (i, wr) in wrs.iter().chain(&extended).enumerate() {
            let slots = encode_sqe(&map, seq, i, wr).unwrap();
            assert_eq!(slots as usize, sqe_slots(wr));
            let (got, took) = decode_sqe(&map, seq, seq + slots).unwrap();
            assert_eq!((&got, took), (wr, slots));
            if slots == 2 {
                // Its continuation cut off by the doorbell's end.
                assert_eq!(decode_sqe(&map, seq, seq + 1), Err(DecodeError::Truncated));
            }
            seq += slots;
        }
        let cas_inline = SendWr {
            payload: Payload::Inline(inline),
            ..SendWr::cas(9, local, remote, 1, 2)
        };
        assert_eq!(
            encode_sqe_bytes(3, &cas_inline),
            Err(EncodeError::Inline { index: 3 })
        );
        let wc = Wc {
            wr_id: 77,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RdmaRead,
            byte_len: 8,
            imm: None,
            qp_num: 3,
            src_qp: 0,
        };
        encode_cqe(&map, CQ_CAP as u64 + 1, &wc);
        assert_eq!(decode_cqe(&map, CQ_CAP as u64 + 1, 3), wc);
        let v = Verdict {
            code: 4,
            index: 2,
            a: 1,
            b: 2,
            message: "x".repeat(300),
        };
        write_verdict(&map, &v);
        let got = read_verdict(&map);
        assert_eq!((got.code, got.index, got.message.len()), (4, 2, V_MSG_MAX));
    }

    #[test]
    fn garbage_entries_decode_to_errors_or_plain_wrs() {
        let (map, _file) = SharedMap::create("ring-test", RING_BYTES).unwrap();
        put(&map, sqe_at(0) + 8, 0xff);
        assert_eq!(decode_sqe(&map, 0, 1), Err(DecodeError::Opcode(0xff)));
        // Unknown flag bits are dropped.
        put(&map, sqe_at(1) + 8, OP_READ | 0xfc << 8);
        assert_eq!(decode_sqe(&map, 1, 2).unwrap().0.flags, SendFlags::NONE);
        // Impossible payloads: an unknown kind, five SGEs, inline data on a
        // READ, longer than 64 bytes.
        for (opf, len) in [
            (OP_READ | 3 << 16, 0),
            (OP_READ | KIND_SGES << 16 | 5 << 24, 0),
            (OP_READ | KIND_INLINE << 16, 4),
            (OP_WRITE | KIND_INLINE << 16, 65),
        ] {
            put(&map, sqe_at(2) + 8, opf);
            put(&map, sqe_at(2) + 24, len);
            assert!(
                matches!(decode_sqe(&map, 2, 4), Err(DecodeError::Payload { .. })),
                "{opf:#x}"
            );
        }
    }

    /// A thread asleep on the ring (a long timeout) is woken by the
    /// daemon's notify once it counts as a sleeper; a notify with no
    /// sleeper leaves the futex word alone.
    #[test]
    fn a_notify_wakes_a_sleeper_and_costs_nothing_without_one() {
        let (map, _file) = SharedMap::create("ring-test", RING_BYTES).unwrap();
        notify(&map);
        assert_eq!(
            wake_seq(&map).load(Ordering::SeqCst),
            0,
            "no sleeper, no bump"
        );
        let woke = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // Nothing to be done but the notify: the sleeper returns
                // only once woken (a spurious return sleeps again). (With
                // a `done` the test set, the sleeper could see it before
                // sleeping and leave without any notify: no bump.)
                while wake_seq(&map).load(Ordering::SeqCst) == 0 {
                    sleep_unless(&map, || false, std::time::Duration::from_secs(60));
                }
                woke.store(true, Ordering::SeqCst);
            });
            while word(&map, SLEEPERS).load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            // The sleeper may not be in the kernel yet: notify until it is
            // out (a lost wake-up would keep it asleep for a minute).
            for _ in 0..5_000 {
                notify(&map);
                if woke.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(woke.load(Ordering::SeqCst), "the sleeper was not woken");
        });
        assert!(wake_seq(&map).load(Ordering::SeqCst) >= 1);
        assert_eq!(word(&map, SLEEPERS).load(Ordering::SeqCst), 0);
    }

    /// xorshift64: deterministic bytes, no dependency.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn random_entries_decode_to_wrs_the_ring_carries_or_to_opcode_errors() {
        let (map, _file) = SharedMap::create("ring-test", RING_BYTES).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let (mut ok, mut refused) = (0, 0);
        for i in 0..4096u64 {
            let mut entry = [0u8; SQE_BYTES];
            for c in entry.chunks_exact_mut(8) {
                c.copy_from_slice(&next(&mut x).to_le_bytes());
            }
            let mut cont = [0u8; SQE_BYTES];
            for c in cont.chunks_exact_mut(8) {
                c.copy_from_slice(&next(&mut x).to_le_bytes());
            }
            // Half the entries get a valid opcode byte and payload kind, or
            // almost none would; some of those a small inline length.
            if i % 2 == 0 {
                entry[8] = (next(&mut x) % 4 + 1) as u8;
                entry[10] = (next(&mut x) % 3) as u8;
                entry[11] = (next(&mut x) % 5) as u8;
                if i % 4 == 0 {
                    entry[8] = OP_WRITE as u8;
                    entry[24] %= 65;
                }
            }
            let wr = match decode_sqe_bytes(&entry, Some(&cont)) {
                Ok(wr) => wr,
                Err(DecodeError::Opcode(op)) => {
                    assert!(!(1..=4).contains(&op) && op <= 0xff, "opcode {op}");
                    assert_eq!(op, u64::from(entry[8]));
                    refused += 1;
                    continue;
                }
                Err(DecodeError::Payload { kind, count, .. }) => {
                    assert_eq!((kind, count), (entry[10], entry[11]));
                    refused += 1;
                    continue;
                }
                Err(DecodeError::Truncated) => panic!("the continuation was given"),
            };
            ok += 1;
            match &wr.payload {
                Payload::Local(l) => assert!(l.as_slice().len() <= krcore_nic::MAX_SGE),
                Payload::Inline(d) => {
                    assert!(matches!(wr.op, WrOp::Write { .. }));
                    assert!(d.as_slice().len() <= 64);
                }
            }
            assert!(matches!(wr.dest, krcore_nic::Destination::Connected));
            assert_eq!(
                wr.flags.0 & !(SendFlags::SIGNALED.0 | SendFlags::FENCE.0),
                0
            );
            // What decodes, the process's side encodes (through the ring,
            // at a wrapping sequence) to entries that decode the same.
            let slots = encode_sqe(&map, i, 0, &wr).unwrap();
            assert_eq!(decode_sqe(&map, i, i + slots), Ok((wr, slots)));
            let (head, cont) = encode_sqe_bytes(0, &wr).unwrap();
            assert_eq!(sqe_continues(&head), cont.is_some());
            assert_eq!(decode_sqe_bytes(&head, cont.as_ref()), Ok(wr));
            assert_eq!(get_entry::<SQE_BYTES>(&map, sqe_at(i)), head);
        }
        assert!(
            ok > 1000 && refused > 1000,
            "{ok} decoded, {refused} refused"
        );

        // CQEs: any bytes decode; what decodes re-encodes to the same.
        for i in 0..1024u64 {
            let mut entry = [0u8; CQE_BYTES];
            for c in entry.chunks_exact_mut(8) {
                c.copy_from_slice(&next(&mut x).to_le_bytes());
            }
            let wc = decode_cqe_bytes(&entry, 3);
            encode_cqe(&map, i, &wc);
            assert_eq!(decode_cqe(&map, i, 3), wc);
            assert_eq!(decode_cqe_bytes(&encode_cqe_bytes(&wc), 3), wc);
        }
    }
}

/// What the daemon said to a doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostCode {
    /// Posted.
    Posted = 0,
    /// The ring's indices were impossible: the VQP is broken for good.
    BadRing = 1,
    /// An entry did not decode.
    BadEntry = 2,
    /// An SGE names memory that is not this process's.
    ForeignMemory = 3,
    /// The engine's pre-check refused a WR.
    Rejected = 4,
    /// The VQP has no target.
    NotConnected = 5,
    /// The post failed otherwise.
    Failed = 6,
    /// The VQP's ring broke earlier.
    Broken = 7,
    /// The VQP has as many WRs outstanding as it holds: poll, then post
    /// again (nothing was posted).
    Full = 8,
}

impl PostCode {
    pub(crate) fn from_u64(v: u64) -> PostCode {
        match v {
            0 => PostCode::Posted,
            1 => PostCode::BadRing,
            2 => PostCode::BadEntry,
            3 => PostCode::ForeignMemory,
            4 => PostCode::Rejected,
            5 => PostCode::NotConnected,
            7 => PostCode::Broken,
            8 => PostCode::Full,
            _ => PostCode::Failed,
        }
    }
}

impl std::fmt::Display for PostCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
