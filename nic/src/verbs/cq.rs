//! Completion queues: `ibv_poll_cq`, and the translation of device
//! completions back to the caller's `wr_id`s with send-queue credit release.
//!
//! ## The poll lock
//! Each CQ has one lock, [`CqPoll`], held by a poller across `ibv_poll_cq`
//! AND the translation of everything that call returned (and by the
//! control paths that change what translation reads: QP registration,
//! removal, reset). Invariants, with any number of threads polling one CQ:
//! - Completions are translated in the order the device queued them. A
//!   send queue's completions are queued in sequence order, so when a
//!   completion for `seq` is translated, every earlier completion of its QP
//!   has been translated already: freeing the send slots up to `seq`
//!   (`SendShared::complete`) can never let a poster reuse the slot of a
//!   completion that some other poller has taken from the device but not
//!   yet read (the lost-completion race of unserialized pollers).
//! - `sq_done` of a QP is written only under the poll lock of its send CQ
//!   (completions, reset), so a plain load and store advance it.
//! - Sequences are never reused on a CQ: a QP registered on a CQ starts
//!   its sequences at the CQ's floor, one past the last sequence posted by
//!   any QP removed from it (`CqPoll::unregister`). A completion left in the
//!   CQ by a destroyed QP therefore never matches a slot of a later QP with
//!   the same QP number (QP numbers are reused by the device): it is
//!   dropped, like every completion of a destroyed QP.
//! - A reset QP drops its ring (under the poll lock), so every completion
//!   of its discarded work still in the CQ is dropped, deterministically
//!   (libmlx5 removes such CQEs from the CQ at RESET; rxe leaves them).
//!
//! Cost: one uncontended lock and unlock per `poll` (librxe's `ibv_poll_cq`
//! takes its own CQ spinlock anyway), inline on the success path; the
//! table lookup needs no lock of its own (it had a read lock per
//! completion) and `sq_done` no atomic read-modify-write. User-space
//! instructions (`prof_verbs` under callgrind, rxe, N 2000): an empty poll
//! 90 -> 105, a CAS round trip 676 -> 671, a 64 B READ 672 -> 667.
//!
//! ## Overflow and the device's async events
//! A CQ that overflows is reported by the device as an async event
//! (`IBV_EVENT_CQ_ERR`, rxe and mlx5), or by a failing `ibv_poll_cq`. The
//! provider starts no thread to read those events (see `device`): the poll
//! path reads them itself, lazily. Every empty poll counts one in the poll
//! lock's state (an increment and a test, under the lock the poller holds
//! anyway; nothing on the success path), and every
//! [`EVENT_CHECK_EMPTY_POLLS`]th empty poll of a CQ, and every poll whose
//! device poll fails, drains the device's async events
//! (`DeviceInner::drain_events`, out of line and cold, after the poll lock
//! is released), which flags the overflowed CQs. Invariant: a CQ's overflow
//! is reported (`CqOverflow`, sticky) by its first poll that finds it empty
//! after the provider has read the event, which is at the latest its
//! `EVENT_CHECK_EMPTY_POLLS`th empty poll after the event was queued (a
//! drain triggered by another CQ of the device, or by
//! `VerbsNic::read_async_events`, reads it sooner), or the poll that fails.
//!
//! Cost, against the event thread it replaced (`prof_verbs` under
//! callgrind in one Soft-RoCE guest session, rxe, N 2000, user-space Ir per
//! operation): an empty poll 105 -> 109 (the count and its test), a CAS
//! round trip 671 -> 628 and a 64 B READ 667 -> 624: a single-threaded
//! process skips glibc's cancellation wrappers around librxe's doorbell
//! `write` (52 -> 7 Ir in `write`, `__pthread_{en,dis}able_asynccancel`
//! gone). A drain that finds nothing is one failing `read`, once per 4096
//! empty polls.

use super::device::DeviceInner;
use super::error::VerbsError;
use super::ffi::{self, sys};
use super::qptable::QpTable;
use super::recv::{RecvTable, RECV_TAG};
use super::send::{SendShared, SendState};
use crate::error::{NicError, Result};
use crate::provider::CompletionQueue;
use crate::types::{Wc, WcOpcode, WcStatus};
use parking_lot::Mutex;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Device completions read per `ibv_poll_cq` call.
pub(crate) const POLL_BATCH: usize = 16;

/// Empty polls of a CQ between two reads of the device's async events (a
/// power of two: the test is a mask). An empty poll costs ~20-50 ns on
/// hardware and ~1 us in the emulated guest; a drain that finds nothing
/// costs one failing `read` system call (~0.2-1 us on hardware, a few us
/// emulated). At 4096 the drain adds at most ~1% to a spinning poller on
/// hardware and well under that in the guest, and an overflow is still
/// reported within 4096 empty polls: ~80-200 us on hardware, ~4 ms
/// emulated, far below what a caller would wait for a completion.
pub(crate) const EVENT_CHECK_EMPTY_POLLS: u32 = 4096;
const _: () = assert!(EVENT_CHECK_EMPTY_POLLS.is_power_of_two());

/// What the poll lock guards (see the module docs).
#[derive(Default)]
pub(crate) struct CqPoll {
    /// Send queues completing here, by QP number (credits and `wr_id`s).
    send_qps: QpTable,
    /// One past the last sequence posted by any QP removed from this CQ:
    /// where a newly registered QP's sequences start.
    seq_floor: u64,
    /// Empty polls of this CQ so far (wrapping): every
    /// [`EVENT_CHECK_EMPTY_POLLS`]th drains the device's async events.
    empty_polls: u32,
}

impl CqPoll {
    /// Registers the send queue of a new QP `qpn` (`max_send_wr` >= 1)
    /// completing on this CQ: its sequences start at the CQ's floor.
    pub(crate) fn register(&mut self, qpn: u32, max_send_wr: u32) -> Arc<SendShared> {
        let shared = Arc::new(SendShared::new(max_send_wr, self.seq_floor));
        self.send_qps.insert(qpn, shared.clone());
        shared
    }

    /// Removes QP `qpn`, which posted sequences below `posted`, before its
    /// number can be reused: the floor moves past them.
    pub(crate) fn unregister(&mut self, qpn: u32, posted: u64) {
        self.send_qps.remove(qpn);
        self.seq_floor = self.seq_floor.max(posted);
    }

    /// The caller's `wr_id` and the opcode of the send WR a completion is
    /// for, freeing its QP's send slots up to it; `None` when stale.
    #[inline(always)]
    fn complete_send(&self, w: &sys::ibv_wc) -> Option<(u64, WcOpcode)> {
        self.send_qps
            .get(w.qp_num)
            .and_then(|sh| sh.complete(w.wr_id))
    }
}

/// What translation needs besides the poll lock's state: the device's
/// receive table and error counter (apart so that host tests drive the
/// poll path without a device).
pub(crate) struct Translate<'a> {
    pub recv: &'a RecvTable,
    pub errors: &'a AtomicU64,
}

/// Polls through `raw` (`ibv_poll_cq`, or a fake in host tests: it writes
/// up to `want` device completions into the buffer and returns how many,
/// or a negative value on error) under `lock`, translating into `out` with
/// what `ctx` gives (called only once there is something to translate, so
/// that the empty poll does not compute it). Polls on while batches come
/// back full and `out` has room. Returns how many completions it wrote
/// (stale ones are dropped); a failed device poll (a CQ in error) sets
/// `failed`. Calls `drain` (reading the device's async events, which may
/// set `failed` too) after releasing the lock, on every
/// [`EVENT_CHECK_EMPTY_POLLS`]th empty poll of the CQ and after a failed
/// device poll, never on a poll that returned completions. See the module
/// docs for the lock and the events.
#[inline(always)]
pub(crate) fn poll_locked<'t, C, F, D>(
    lock: &Mutex<CqPoll>,
    ctx: C,
    failed: &AtomicBool,
    out: &mut [Wc],
    mut raw: F,
    drain: D,
) -> usize
where
    C: FnOnce() -> Translate<'t>,
    F: FnMut(&mut [MaybeUninit<sys::ibv_wc>; POLL_BATCH], usize) -> i32,
    D: FnOnce(),
{
    // The empty poll (the common case of a spinning caller) stays small:
    // the lock, one device poll, one increment and test, the unlock;
    // translation and the event drain behind one branch each.
    let mut want = out.len().min(POLL_BATCH);
    if want == 0 {
        return 0;
    }
    let mut buf: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
        [const { MaybeUninit::uninit() }; POLL_BATCH];
    let mut p = lock.lock();
    let mut got = raw(&mut buf, want);
    if got <= 0 {
        if got == 0 {
            p.empty_polls = p.empty_polls.wrapping_add(1);
            if p.empty_polls & (EVENT_CHECK_EMPTY_POLLS - 1) != 0 {
                return 0;
            }
        } else {
            failed.store(true, Ordering::Release);
        }
        drop(p);
        drain();
        return 0;
    }
    let t = &ctx();
    let mut n = 0;
    loop {
        for w in &buf[..got as usize] {
            // SAFETY: the first `got` entries were written by the poll.
            let w = unsafe { w.assume_init_ref() };
            if translate(&p, t, w, &mut out[n]) {
                n += 1;
            }
        }
        if (got as usize) < want || n == out.len() {
            return n;
        }
        want = (out.len() - n).min(POLL_BATCH);
        got = raw(&mut buf, want);
        if got <= 0 {
            if got < 0 {
                failed.store(true, Ordering::Release);
                drop(p);
                drain();
            }
            return n;
        }
    }
}

/// What a poll that wrote `n` completions returns: `CqOverflow` (sticky)
/// once nothing is left to return and the CQ is flagged.
#[inline(always)]
fn poll_result(n: usize, overflowed: &AtomicBool, depth: u32) -> Result<usize> {
    if n == 0 && overflowed.load(Ordering::Acquire) {
        return Err(NicError::CqOverflow { depth });
    }
    Ok(n)
}

/// Translates one device completion into `wc`; `false` (and `wc`
/// untouched) for a stale one (its QP was reset or destroyed). The send
/// completion of a successful WR is the inline fast path; receives and
/// errors are out of line.
#[inline(always)]
fn translate(p: &CqPoll, t: &Translate<'_>, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
    if w.wr_id & RECV_TAG != 0 {
        return translate_recv(t, w, wc);
    }
    if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
        return translate_send_error(p, t, w, wc);
    }
    let Some((wr_id, _)) = p.complete_send(w) else {
        return false;
    };
    *wc = Wc {
        wr_id,
        status: WcStatus::Success,
        opcode: ffi::wc_opcode(w.opcode),
        byte_len: w.byte_len,
        imm: None,
        qp_num: w.qp_num,
        src_qp: 0,
    };
    true
}

#[cold]
#[inline(never)]
fn translate_send_error(p: &CqPoll, t: &Translate<'_>, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
    let Some((wr_id, opcode)) = p.complete_send(w) else {
        return false;
    };
    t.errors.fetch_add(1, Ordering::Relaxed);
    // Verbs leaves the opcode of an error completion undefined: report the
    // WR's own, as the contract asks.
    *wc = Wc {
        wr_id,
        status: ffi::wc_status(w.status),
        opcode,
        byte_len: w.byte_len,
        imm: None,
        qp_num: w.qp_num,
        src_qp: 0,
    };
    true
}

#[inline(never)]
fn translate_recv(t: &Translate<'_>, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
    let Some(wr_id) = t.recv.take(w.wr_id) else {
        return false;
    };
    let status = ffi::wc_status(w.status);
    let imm = if status.is_ok() && w.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
        // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate
        // (network byte order); every bit pattern is a valid u32.
        let be = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
        Some(u32::from_be(be))
    } else {
        None
    };
    if !status.is_ok() {
        t.errors.fetch_add(1, Ordering::Relaxed);
    }
    *wc = Wc {
        wr_id,
        status,
        opcode: ffi::wc_opcode(w.opcode),
        byte_len: w.byte_len,
        imm,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
    };
    true
}

/// RESET of a QP on this CQ (here, where the poll lock is, so that the
/// send side does not name the CQ).
impl SendShared {
    /// RESET: every outstanding WR is discarded without a completion. Frees
    /// every slot and drops the ring, so that completions of the discarded
    /// work still in the CQ are dropped. Called with the send lock held
    /// (`st`) and `poll`, the send CQ's poll lock, held.
    pub(crate) fn discard(&self, st: &SendState, _poll: &mut CqPoll) {
        if st.posted > self.sq_done.load(Ordering::Relaxed) {
            self.sq_done.store(st.posted, Ordering::Release);
        }
        self.ring.clear();
    }
}

/// Owner of an `ibv_cq`.
pub(crate) struct CqInner {
    pub cq: *mut sys::ibv_cq,
    depth: u32,
    /// The poll lock and what it guards (see the module docs). Lock order:
    /// a QP's send lock `st`, then this; the poll path takes no other lock
    /// but the receive table's (receives only).
    pub poll: Mutex<CqPoll>,
    /// Set by a drain of the device's async events that read
    /// `IBV_EVENT_CQ_ERR` for this CQ, or by a failed poll. Sticky.
    overflowed: Arc<AtomicBool>,
    pub dev: Arc<DeviceInner>,
}

// SAFETY: the CQ handle is only passed to thread-safe libibverbs calls
// (`ibv_poll_cq` is moreover serialized by the poll lock).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        self.dev.cq_flags.lock().remove(&(self.cq as usize));
        // SAFETY: `cq` came from `ibv_create_cq`; every QP using it holds
        // an `Arc` to this struct, so none is left; destroyed once.
        unsafe { sys::ibv_destroy_cq(self.cq) };
    }
}

/// A completion queue of a verbs device.
#[derive(Clone)]
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("depth", &self.inner.depth)
            .finish()
    }
}

impl VerbsCq {
    pub(crate) fn create(dev: &Arc<DeviceInner>, depth: u32) -> Result<VerbsCq> {
        if depth == 0 || depth > dev.caps.max_cqe {
            return Err(NicError::InvalidArgument(format!(
                "CQ depth {depth} outside 1..={}",
                dev.caps.max_cqe
            )));
        }
        // SAFETY: valid context; no completion channel, no vector.
        let cq = unsafe {
            sys::ibv_create_cq(
                dev.ctx(),
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(VerbsError::from_os("ibv_create_cq", ffi::errno()).into());
        }
        // SAFETY: `cq` is valid; `cqe` is the depth the device granted.
        let granted = unsafe { (*cq).cqe }.max(depth as i32) as u32;
        let overflowed = Arc::new(AtomicBool::new(false));
        dev.cq_flags.lock().insert(cq as usize, overflowed.clone());
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                depth: granted,
                poll: Mutex::new(CqPoll::default()),
                overflowed,
                dev: dev.clone(),
            }),
        })
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.inner.dev, dev) {
            Ok(())
        } else {
            Err(NicError::InvalidArgument("CQ of another device".into()))
        }
    }
}

impl CompletionQueue for VerbsCq {
    fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Inlined into callers, as `VerbsQp::post_send`.
    #[inline(always)]
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let i = &*self.inner;
        let ctx = || Translate {
            recv: &i.dev.recv,
            errors: &i.dev.counters.error_completions,
        };
        // A failed poll is a CQ in error (mlx5 reports overflow this way
        // too): it sets the overflow flag. Every EVENT_CHECK_EMPTY_POLLS-th
        // empty poll, and a failed one, reads the device's async events
        // (out of line), which flags an overflowed CQ for this same poll.
        let n = poll_locked(
            &i.poll,
            ctx,
            &i.overflowed,
            out,
            |buf, want| {
                // SAFETY: `buf` has room for `want <= POLL_BATCH`
                // completions; the CQ is live.
                unsafe { sys::ibv_poll_cq(i.cq, want as i32, buf[0].as_mut_ptr()) }
            },
            || {
                i.dev.drain_events();
            },
        );
        poll_result(n, &i.overflowed, i.depth)
    }
}

#[cfg(test)]
mod tests {
    //! The poll path driven by a fake device CQ (a queue behind a mutex, as
    //! librxe's CQ is behind a spinlock), with reference checks.

    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

    /// A device CQ: `ibv_poll_cq` pops up to `want` completions.
    #[derive(Default)]
    struct FakeCq {
        q: parking_lot::Mutex<VecDeque<sys::ibv_wc>>,
    }

    impl FakeCq {
        fn push(&self, w: sys::ibv_wc) {
            self.q.lock().push_back(w);
        }

        fn poll(&self, buf: &mut [MaybeUninit<sys::ibv_wc>; POLL_BATCH], want: usize) -> i32 {
            let mut q = self.q.lock();
            let mut n = 0;
            while n < want {
                let Some(w) = q.pop_front() else { break };
                buf[n].write(w);
                n += 1;
            }
            n as i32
        }

        fn is_empty(&self) -> bool {
            self.q.lock().is_empty()
        }
    }

    fn ibv_opcode(op: WcOpcode) -> u32 {
        use sys::ibv_wc_opcode::*;
        match op {
            WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
            WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
            WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
            WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
            _ => IBV_WC_SEND,
        }
    }

    /// The device completion of send sequence `seq` of QP `qpn`.
    fn send_wc(qpn: u32, seq: u64, op: WcOpcode, status: u32) -> sys::ibv_wc {
        // SAFETY: `ibv_wc` is plain old data; all-zero is valid.
        let mut w: sys::ibv_wc = unsafe { std::mem::zeroed() };
        w.wr_id = seq;
        w.qp_num = qpn;
        w.status = status;
        w.opcode = ibv_opcode(op);
        w
    }

    const OK: u32 = sys::ibv_wc_status::IBV_WC_SUCCESS;

    /// What `post_one` does to the ring and the credits (under the send
    /// lock): `None` without credits, else the WR's sequence.
    fn post(sh: &SendShared, wr_id: u64, op: WcOpcode) -> Option<u64> {
        let mut st = sh.st.lock();
        if sh.credits(&st) == 0 {
            return None;
        }
        let seq = st.posted;
        sh.ring.record(seq, wr_id, op);
        st.posted = seq + 1;
        Some(seq)
    }

    struct Env {
        lock: Mutex<CqPoll>,
        recv: RecvTable,
        errors: AtomicU64,
        dev: FakeCq,
        /// Drains of the (fake) device's async events so far.
        drains: AtomicU64,
        /// The device has queued `IBV_EVENT_CQ_ERR` for this CQ (unread).
        cq_err_queued: AtomicBool,
        /// The CQ's overflow flag (`CqInner::overflowed`).
        overflowed: AtomicBool,
        /// The next device poll fails (a CQ in error).
        fail_next: AtomicBool,
    }

    const DEPTH: u32 = 8;

    impl Env {
        fn new() -> Env {
            Env {
                lock: Mutex::new(CqPoll::default()),
                recv: RecvTable::default(),
                errors: AtomicU64::new(0),
                dev: FakeCq::default(),
                drains: AtomicU64::new(0),
                cq_err_queued: AtomicBool::new(false),
                overflowed: AtomicBool::new(false),
                fail_next: AtomicBool::new(false),
            }
        }

        /// What `DeviceInner::drain_events` does with the fake device's
        /// queue: reads (and so consumes) a queued CQ error, flagging the CQ.
        fn drain_events(&self) {
            self.drains.fetch_add(1, Relaxed);
            if self.cq_err_queued.swap(false, Relaxed) {
                self.overflowed.store(true, Release);
            }
        }

        /// Exactly `VerbsCq::poll` over the fake device and event queue.
        fn poll_cq(&self, out: &mut [Wc]) -> Result<usize> {
            let ctx = || Translate {
                recv: &self.recv,
                errors: &self.errors,
            };
            let n = poll_locked(
                &self.lock,
                ctx,
                &self.overflowed,
                out,
                |buf, want| {
                    if self.fail_next.swap(false, Relaxed) {
                        return -1;
                    }
                    self.dev.poll(buf, want)
                },
                || self.drain_events(),
            );
            poll_result(n, &self.overflowed, DEPTH)
        }

        /// One `VerbsCq::poll` of up to `out.len()` completions;
        /// `pause` runs after every device poll that returned something
        /// (to widen the window between taking and translating).
        fn poll(&self, out: &mut [Wc], pause: impl Fn()) -> usize {
            let ctx = || Translate {
                recv: &self.recv,
                errors: &self.errors,
            };
            let failed = AtomicBool::new(false);
            let n = poll_locked(
                &self.lock,
                ctx,
                &failed,
                out,
                |buf, want| {
                    let got = self.dev.poll(buf, want);
                    if got > 0 {
                        pause();
                    }
                    got
                },
                || self.drain_events(),
            );
            assert!(!failed.load(Relaxed));
            n
        }

        /// Everything in the CQ, as `(wr_id, status, opcode)`.
        fn drain(&self) -> Vec<(u64, WcStatus, WcOpcode)> {
            let mut out = [Wc::default(); 3];
            let mut got = Vec::new();
            loop {
                let n = self.poll(&mut out, || {});
                got.extend(out[..n].iter().map(|w| (w.wr_id, w.status, w.opcode)));
                if n == 0 && self.dev.is_empty() {
                    return got;
                }
            }
        }
    }

    /// Several threads poll one CQ while two posters keep 4-deep send
    /// queues full (so that a freed slot is reused at once). A poller
    /// pauses between taking completions from the device and translating
    /// them, the window in which another poller used to free (and a poster
    /// reuse) the slot of a completion not yet read. Reference check:
    /// every signaled WR is delivered exactly once, with its own `wr_id`
    /// and opcode, in order per QP, and every credit comes back.
    #[test]
    fn several_pollers_deliver_every_completion_once() {
        const N: u64 = 20_000;
        const QPNS: [u32; 2] = [0x11, 0x12];
        let env = Env::new();
        let qps: Vec<Arc<SendShared>> = QPNS
            .iter()
            .map(|&q| env.lock.lock().register(q, 4))
            .collect();
        let op = |i: u64| match i % 3 {
            0 => WcOpcode::RdmaRead,
            1 => WcOpcode::CompSwap,
            _ => WcOpcode::RdmaWrite,
        };
        // WR i's caller wr_id; every fourth WR unsignaled (the last one of
        // each QP signaled, to free the queue).
        let wr_id = |k: usize, i: u64| (k as u64) << 40 | i;
        let signaled = |i: u64| i % 4 != 3 || i == N - 1;
        let posters_done = AtomicU64::new(0);
        let delivered: Vec<Vec<Wc>> = std::thread::scope(|s| {
            for (k, sh) in qps.iter().enumerate() {
                let (env, posters_done) = (&env, &posters_done);
                s.spawn(move || {
                    for i in 0..N {
                        let mut spins = 0u64;
                        let seq = loop {
                            if let Some(seq) = post(sh, wr_id(k, i), op(i)) {
                                break seq;
                            }
                            spins += 1;
                            assert!(spins < 1 << 28, "no credits at WR {i} of QP {k}");
                            std::thread::yield_now();
                        };
                        if signaled(i) {
                            env.dev.push(send_wc(QPNS[k], seq, op(i), OK));
                        }
                    }
                    posters_done.fetch_add(1, Release);
                });
            }
            let pollers: Vec<_> = (0..3u64)
                .map(|p| {
                    let (env, posters_done) = (&env, &posters_done);
                    s.spawn(move || {
                        let mut got = Vec::new();
                        let mut out = [Wc::default(); 4];
                        let calls = std::cell::Cell::new(0u64);
                        loop {
                            let done = posters_done.load(Acquire) == QPNS.len() as u64;
                            let n = env.poll(&mut out[..1 + p as usize], || {
                                calls.set(calls.get() + 1);
                                if calls.get() % 2 == 0 {
                                    std::thread::yield_now();
                                }
                            });
                            got.extend_from_slice(&out[..n]);
                            if n == 0 {
                                if done && env.dev.is_empty() {
                                    return got;
                                }
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            pollers
                .into_iter()
                .map(|h| h.join().expect("poller"))
                .collect()
        });
        for (k, sh) in qps.iter().enumerate() {
            let want: Vec<u64> = (0..N).filter(|&i| signaled(i)).collect();
            let mut all: Vec<u64> = Vec::new();
            for per_poller in &delivered {
                let mine: Vec<&Wc> = per_poller.iter().filter(|w| w.qp_num == QPNS[k]).collect();
                for w in &mine {
                    let i = w.wr_id & ((1 << 40) - 1);
                    assert_eq!(w.wr_id, wr_id(k, i), "{w:?}");
                    assert_eq!((w.status, w.opcode), (WcStatus::Success, op(i)), "{w:?}");
                }
                assert!(
                    mine.windows(2).all(|p| p[0].wr_id < p[1].wr_id),
                    "one poller sees a QP's completions in order"
                );
                all.extend(mine.iter().map(|w| w.wr_id & ((1 << 40) - 1)));
            }
            all.sort_unstable();
            let mut seen = std::collections::BTreeMap::new();
            for i in &all {
                *seen.entry(*i).or_insert(0u32) += 1;
            }
            let lost: Vec<u64> = want
                .iter()
                .filter(|i| !seen.contains_key(i))
                .copied()
                .collect();
            let doubled: Vec<u64> = seen.iter().filter(|e| *e.1 > 1).map(|e| *e.0).collect();
            let foreign: Vec<u64> = seen.keys().filter(|&&i| !signaled(i)).copied().collect();
            assert!(
                lost.is_empty() && doubled.is_empty() && foreign.is_empty(),
                "QP {k}: {} lost {:?}.., {} doubled {:?}.., {} of unsignaled WRs {:?}..",
                lost.len(),
                &lost[..lost.len().min(5)],
                doubled.len(),
                &doubled[..doubled.len().min(5)],
                foreign.len(),
                &foreign[..foreign.len().min(5)],
            );
            assert_eq!(all, want, "QP {k}");
            let st = sh.st.lock();
            assert_eq!(
                sh.sq_done.load(Relaxed),
                st.posted,
                "QP {k}: every credit back"
            );
            assert_eq!(sh.credits(&st), 4);
        }
    }

    /// A QP is destroyed with completions still in a shared CQ (one
    /// success, one flush error, one it never polled), and the device
    /// reuses its QP number for a new QP on the same CQ. Reference check:
    /// the leftovers are dropped (they neither deliver the new QP's
    /// `wr_id`s nor free its credits); the new QP's own completions are
    /// delivered once each.
    #[test]
    fn a_reused_qp_number_never_matches_leftover_completions() {
        const QPN: u32 = 0x2a;
        let env = Env::new();
        let old = env.lock.lock().register(QPN, 4);
        let other = env.lock.lock().register(QPN + 1, 4);
        let mut seqs = Vec::new();
        for i in 0..3 {
            seqs.push(post(&old, 100 + i, WcOpcode::RdmaRead).unwrap());
        }
        let s = post(&other, 7, WcOpcode::Send).unwrap();
        env.dev.push(send_wc(QPN, seqs[0], WcOpcode::RdmaRead, OK));
        env.dev.push(send_wc(QPN + 1, s, WcOpcode::Send, OK));
        env.dev.push(send_wc(
            QPN,
            seqs[1],
            WcOpcode::Send,
            sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
        ));
        env.dev.push(send_wc(QPN, seqs[2], WcOpcode::RdmaRead, OK));
        // Destroyed (what `QpInner::drop` does), its number reused.
        let posted = old.st.lock().posted;
        env.lock.lock().unregister(QPN, posted);
        drop(old);
        let new = env.lock.lock().register(QPN, 4);
        for i in 0..4 {
            let seq = post(&new, 200 + i, WcOpcode::CompSwap).unwrap();
            env.dev.push(send_wc(QPN, seq, WcOpcode::CompSwap, OK));
        }
        assert_eq!(new.credits(&new.st.lock()), 0);
        let got = env.drain();
        let ok = |w, op| (w, WcStatus::Success, op);
        assert_eq!(
            got,
            vec![
                ok(7, WcOpcode::Send),
                ok(200, WcOpcode::CompSwap),
                ok(201, WcOpcode::CompSwap),
                ok(202, WcOpcode::CompSwap),
                ok(203, WcOpcode::CompSwap),
            ],
            "leftovers dropped, the new QP's completions once each"
        );
        assert_eq!(env.errors.load(Relaxed), 0, "the flush was dropped too");
        assert_eq!(new.credits(&new.st.lock()), 4);
    }

    /// RESET discards outstanding work without completions: completions of
    /// it still in the CQ are dropped, whether or not their ring slots were
    /// reused since, and free nothing; the QP's later work completes
    /// normally.
    #[test]
    fn reset_drops_completions_of_discarded_work() {
        const QPN: u32 = 0x40;
        let env = Env::new();
        let sh = env.lock.lock().register(QPN, 4);
        for i in 0..3 {
            let seq = post(&sh, 100 + i, WcOpcode::RdmaRead).unwrap();
            env.dev.push(send_wc(QPN, seq, WcOpcode::RdmaRead, OK));
        }
        let mut one = [Wc::default()];
        assert_eq!(env.poll(&mut one, || {}), 1);
        assert_eq!(one[0].wr_id, 100);
        // Reset (what `modify` does after `ibv_modify_qp`), then new work
        // that reuses the slot of one leftover (ring of 4: 3 and 0).
        {
            let st = sh.st.lock();
            sh.discard(&st, &mut env.lock.lock());
            assert_eq!(sh.credits(&st), 4);
        }
        for i in 0..2 {
            let seq = post(&sh, 200 + i, WcOpcode::FetchAdd).unwrap();
            env.dev.push(send_wc(QPN, seq, WcOpcode::FetchAdd, OK));
        }
        let got: Vec<u64> = env.drain().iter().map(|g| g.0).collect();
        assert_eq!(got, vec![200, 201]);
        assert_eq!(sh.credits(&sh.st.lock()), 4);
    }

    /// The async events are read every `EVENT_CHECK_EMPTY_POLLS`th empty
    /// poll exactly, never by a poll that returned completions (those
    /// neither drain nor count), and by every failed device poll; a CQ
    /// whose overflow event such a drain reads reports `CqOverflow` from
    /// that same poll (and stays so), not one poll earlier.
    #[test]
    fn events_are_drained_every_n_empty_polls_and_report_overflow_at_once() {
        const N: u64 = EVENT_CHECK_EMPTY_POLLS as u64;
        const QPN: u32 = 0x50;
        let env = Env::new();
        let sh = env.lock.lock().register(QPN, 4);
        let mut out = [Wc::default(); 4];
        let drains = || env.drains.load(Relaxed);
        let empty = |k: u64| {
            let mut out = [Wc::default(); 4];
            for _ in 0..k {
                assert_eq!(env.poll_cq(&mut out).unwrap(), 0);
            }
        };
        // One completion per poll, each a non-empty poll.
        let busy = |k: u64, out: &mut [Wc]| {
            for i in 0..k {
                let seq = post(&sh, 1000 + i, WcOpcode::RdmaRead).unwrap();
                env.dev.push(send_wc(QPN, seq, WcOpcode::RdmaRead, OK));
                assert_eq!(env.poll_cq(out).unwrap(), 1);
                assert_eq!(out[0].wr_id, 1000 + i);
            }
        };

        empty(N - 1);
        assert_eq!(drains(), 0, "no drain before the Nth empty poll");
        busy(3 * N, &mut out);
        assert_eq!(drains(), 0, "non-empty polls neither drain nor count");
        empty(1);
        assert_eq!(drains(), 1, "the Nth empty poll drains");
        // An overflow event queued by the device: unseen until the next
        // drain, reported by the poll that drains.
        env.cq_err_queued.store(true, Relaxed);
        empty(N - 1);
        assert_eq!(drains(), 1);
        assert!(env.cq_err_queued.load(Relaxed), "not read yet");
        assert!(
            matches!(
                env.poll_cq(&mut out),
                Err(NicError::CqOverflow { depth: DEPTH })
            ),
            "the draining poll reports the overflow itself"
        );
        assert_eq!(drains(), 2);
        assert!(!env.cq_err_queued.load(Relaxed), "read by that drain");
        // Sticky; completions still queued are returned first.
        assert!(env.poll_cq(&mut out).is_err());
        let seq = post(&sh, 7, WcOpcode::CompSwap).unwrap();
        env.dev.push(send_wc(QPN, seq, WcOpcode::CompSwap, OK));
        assert_eq!(env.poll_cq(&mut out).unwrap(), 1);
        assert!(env.poll_cq(&mut out).is_err());
    }

    /// A failed device poll drains the events at once (whatever the empty
    /// count) and reports the overflow from that same poll.
    #[test]
    fn a_failed_poll_drains_events_and_reports_overflow() {
        let env = Env::new();
        let mut out = [Wc::default(); 2];
        for _ in 0..5 {
            assert_eq!(env.poll_cq(&mut out).unwrap(), 0);
        }
        assert_eq!(env.drains.load(Relaxed), 0);
        env.fail_next.store(true, Relaxed);
        assert!(matches!(
            env.poll_cq(&mut out),
            Err(NicError::CqOverflow { .. })
        ));
        assert_eq!(env.drains.load(Relaxed), 1);
        // A poll with no room (empty `out`) polls nothing and
        // drains nothing; the flag stays.
        assert!(env.poll_cq(&mut []).is_err());
        assert_eq!(env.drains.load(Relaxed), 1);
    }
}
