//! The user's VQP: the verbs-shaped layer (post a slice of WRs = one
//! doorbell, poll completions) and, on top of it, Infinity-style requests
//! (`read`/`write`/`compare_and_swap`/`fetch_add` returning a [`Request`]).
//!
//! Both layers share the VQP's completions: requests use wr_ids with
//! [`REQUEST_WR_ID_BIT`] set, which [`Vqp::post`] refuses from users, and
//! their completions are kept aside for [`Request::wait`] instead of being
//! returned by [`Vqp::poll`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::AnyNic;
use krcore_nic::{Access, Gid, Nic, SendWr, Wc, WcStatus};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::memory::{check, MemoryRegion, RemoteRegion};
use crate::node::{Backend, Node};
use crate::raw::{is_full, RawVqp};

/// The wr_id bit the SDK reserves for its [`Request`]s.
pub const REQUEST_WR_ID_BIT: u64 = 1 << 63;

/// A request's wr_id is `REQUEST_WR_ID_BIT | seq << SLOT_BITS | slot`:
/// `slot` is its scratch slot plus one for an atomic, 0 otherwise.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const SEQ_MASK: u64 = (REQUEST_WR_ID_BIT - 1) >> SLOT_BITS;

/// The atomics' old-value words.
///
/// Invariant: a slot is either in `free` or owned by exactly one atomic
/// request, from its post until its completion's word was read (or the
/// completion was discarded). The engine frees the request's VQP slot
/// when it polls the completion, before the word is read; so the word
/// cannot be named by the VQP slot, or a request posted by another thread
/// in between could overwrite it.
struct Scratch<N: Nic> {
    mr: MemoryRegion<N>,
    free: Vec<u32>,
}

/// What a finished [`Request`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work completion (status `Success`; failed requests are errors).
    pub wc: Wc,
    /// For `compare_and_swap`/`fetch_add`: the remote word's value before
    /// the operation.
    pub old_value: Option<u64>,
}

#[derive(Default)]
struct Stash {
    /// Request completions, by wr_id, with the atomic's old value.
    requests: HashMap<u64, (Wc, Option<u64>)>,
    /// The user's own completions, in order.
    user: VecDeque<Wc>,
    /// Requests dropped before they finished: their completions are dropped.
    abandoned: HashSet<u64>,
}

/// How many completions [`Vqp::pump`] moves per engine poll.
const PUMP_BATCH: usize = 8;

/// How many spins [`Request::wait_timeout`] makes between clock reads (a
/// clock read can be a system call, e.g. on an HPET clocksource).
const SPINS_PER_CLOCK_READ: u32 = 64;

// In declaration order, from a 64-byte boundary: what every `post` and
// `poll` reads (`stashed_user`, then the engine VQP, whose own hot fields
// lead) shares a cache line and so a page.
#[repr(C, align(64))]
struct Inner<N: Nic> {
    /// `stash.user.len()`, written under the stash lock: a poller that
    /// reads 0 owes no stash lock. A thread sees its own pump's stashing
    /// (program order), so its completions stay in order; between threads
    /// polling one VQP at once there is no order to keep.
    stashed_user: AtomicUsize,
    vqp: RawVqp<N>,
    node: Node<N>,
    stash: Mutex<Stash>,
    /// `stash.requests.len()`, written under the stash lock: a waiter that
    /// reads 0 has nothing to look up (it looks again on its next spin).
    stashed_requests: AtomicUsize,
    next_request: AtomicU64,
    /// Atomics' old-value words (two per VQP slot, so that one in a
    /// poller's hands never holds up a post), allocated on first use.
    scratch: Mutex<Option<Scratch<N>>>,
    /// The messaging endpoint, made by the first push.
    endpoint: std::sync::OnceLock<crate::messaging::Endpoint<N>>,
    /// The token whose grant `prepare` made known last, and the VQP's
    /// grants epoch right after (its own change): while the epoch stays
    /// there, the grant is known unchanged and requests skip `add_grant`.
    granted: Mutex<Option<(RemoteRegion, u64)>>,
}

/// A virtual QP (see the crate docs). Cheap to clone; `Send + Sync`.
pub struct Vqp<N: Nic = AnyNic> {
    inner: Arc<Inner<N>>,
}

impl<N: Nic> Clone for Vqp<N> {
    fn clone(&self) -> Self {
        Vqp {
            inner: self.inner.clone(),
        }
    }
}

impl<N: Nic> std::fmt::Debug for Vqp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.vqp.fmt(f)
    }
}

impl<N: Nic> Vqp<N> {
    pub(crate) fn new(vqp: RawVqp<N>, node: Node<N>) -> Vqp<N> {
        Vqp {
            inner: Arc::new(Inner {
                vqp,
                node,
                stash: Mutex::new(Stash::default()),
                stashed_user: AtomicUsize::new(0),
                stashed_requests: AtomicUsize::new(0),
                next_request: AtomicU64::new(0),
                scratch: Mutex::new(None),
                endpoint: std::sync::OnceLock::new(),
                granted: Mutex::new(None),
            }),
        }
    }

    /// The VQP's id (the `qp_num` of its completions).
    pub fn id(&self) -> u32 {
        self.inner.vqp.id()
    }

    /// Points the VQP at node `gid`: a cache hit costs nothing, a miss one
    /// READ of the meta table.
    ///
    /// # Errors
    /// [`Error::Engine`] with `UnknownNode`, `MetaUnavailable`, ...
    pub fn connect(&self, gid: Gid) -> Result<()> {
        self.inner.vqp.connect(gid)
    }

    /// The node the VQP posts to.
    pub fn target(&self) -> Option<Gid> {
        self.inner.vqp.target()
    }

    /// How the VQP reaches its target now: DC, or an RC pair after the
    /// engine upgraded it (see [`krcore_kmod::Vqp::path`]). Drivers
    /// show upgrade events by watching it change.
    pub fn path(&self) -> krcore_kmod::VqpPath {
        let rc = self.inner.node.mode() == krcore_kmod::EngineMode::RcFallback;
        self.inner.vqp.path(rc)
    }

    /// Hint: moves the VQP to an RC pair with its target now (DC mode, the
    /// engine built with `upgrade_endpoint`; see
    /// [`krcore_kmod::Vqp::upgrade`]). Returns the path after the call.
    ///
    /// # Errors
    /// [`Error::Engine`]: `Unsupported`, `NotConnected`, `UnknownNode` (the
    /// target runs no endpoint), `Handshake`, `RcPairsBusy`. The VQP then
    /// stays on DC, working. On an attached node the daemon's engine
    /// upgrades (the pair serves every process of the node), and its
    /// refusal is [`Error::Daemon`].
    pub fn upgrade(&self) -> Result<krcore_kmod::VqpPath> {
        self.inner.vqp.upgrade()
    }

    /// Whether the VQP has made its messaging endpoint yet (at its first
    /// push or reply pop: a VQP that only posts one-sided WRs never does).
    pub fn has_endpoint(&self) -> bool {
        self.inner.endpoint.get().is_some()
    }

    /// The VQP's messaging endpoint (made at the first call).
    fn endpoint(&self) -> Result<&crate::messaging::Endpoint<N>> {
        if let Some(e) = self.inner.endpoint.get() {
            return Ok(e);
        }
        let e = self.inner.node.endpoint()?;
        Ok(self.inner.endpoint.get_or_init(|| e))
    }

    fn msg_target(&self) -> Result<Gid> {
        self.target()
            .ok_or(Error::Vqp(krcore_kmod::VqpError::NotConnected {
                vqp: krcore_kmod::VqpId::new(self.id()).unwrap_or(krcore_kmod::VqpId::MAX),
            }))
    }

    /// Pushes `data` to `port` of the VQP's target node, blocking (up to
    /// `msg.timeout`) while the channel has no credit; see [`crate::messaging`].
    ///
    /// # Errors
    /// [`Error::Msg`]: `Refused` (no such port, port busy), `TooLarge`,
    /// `Timeout` (the receiver does not pop); [`Error::Vqp`] when not
    /// connected.
    pub fn push(&self, port: u16, data: &[u8]) -> Result<()> {
        let to = self.msg_target()?;
        Ok(self.endpoint()?.push(to, port, data)?)
    }

    /// Pushes without waiting for a credit: [`crate::MsgError::WouldBlock`]
    /// when the receiver has not popped enough yet.
    ///
    /// # Errors
    /// As [`Vqp::push`], and `WouldBlock`.
    pub fn try_push(&self, port: u16, data: &[u8]) -> Result<()> {
        let to = self.msg_target()?;
        Ok(self.endpoint()?.try_push(to, port, data)?)
    }

    /// Pops the oldest reply to this VQP's messages, waiting up to
    /// `msg.timeout`.
    ///
    /// # Errors
    /// [`Error::Msg`] (`Timeout`, a failed pull).
    pub fn pop_reply(&self) -> Result<crate::Message<N>> {
        Ok(self.endpoint()?.pop_reply()?)
    }

    /// The oldest reply, if any, without waiting.
    ///
    /// # Errors
    /// As [`Vqp::pop_reply`].
    pub fn try_pop_reply(&self) -> Result<Option<crate::Message<N>>> {
        Ok(self.endpoint()?.try_pop_reply()?)
    }

    /// The engine-level VQP (grants, statistics); `None` on an attached
    /// node (the VQP is the daemon's).
    pub fn raw(&self) -> Option<&krcore_kmod::Vqp<N>> {
        self.inner.vqp.local()
    }

    /// Makes a grant over `rkey` on node `gid` known to this VQP's
    /// pre-check (what [`Vqp::grant`] does for a token): for WRs posted
    /// with [`Vqp::post`] that name remote keys by hand.
    ///
    /// # Errors
    /// On an attached node, [`Error::Daemon`]: the daemon refuses a key of
    /// another process attached to it, or went.
    pub fn add_grant(&self, gid: Gid, rkey: u32, grant: krcore_kmod::RemoteGrant) -> Result<()> {
        self.inner.vqp.add_grant(gid, rkey, grant)
    }

    /// Makes `token`'s grant known to this VQP (connecting to its node
    /// first if needed), so that WRs posted with [`Vqp::post`] may reach
    /// its range: the pre-check refuses a remote key no known grant covers
    /// ([`Error::NotGranted`]). The request API ([`Vqp::read`] and the
    /// others) does this by itself.
    ///
    /// # Errors
    /// As [`Vqp::connect`].
    pub fn grant(&self, token: &RemoteRegion) -> Result<()> {
        self.prepare(token)
    }

    /// What the pre-check does with WRs to a remote key this VQP knows no
    /// grant for: refused with [`Error::NotGranted`]
    /// ([`krcore_kmod::Ungranted::Refuse`], the default), or left to the
    /// NIC ([`krcore_kmod::Ungranted::Allow`]): the opt-out for raw verbs
    /// users who pass rkeys by hand (a bad key then fails at the NIC with
    /// `REM_ACCESS_ERR`, and costs the shared QP a recovery).
    ///
    /// # Errors
    /// [`Error::Unsupported`]: `Allow` on an attached node (the daemon's
    /// pre-check guards the other attached processes' memory).
    pub fn set_ungranted(&self, rule: krcore_kmod::Ungranted) -> Result<()> {
        self.inner.vqp.set_ungranted(rule)
    }

    /// Posts `wrs` as one doorbell (see [`krcore_kmod::Vqp::post_send`]):
    /// the VQP names its target in each WR; on return the WRs hold the
    /// caller's wr_ids again.
    ///
    /// # Errors
    /// [`Error::ReservedWrId`]; [`Error::NotGranted`] for a remote key no
    /// grant this VQP knows covers ([`Vqp::grant`]); [`Error::Vqp`] with
    /// the pre-check's other typed rejections (nothing was posted) or
    /// another post failure.
    #[inline(always)]
    pub fn post(&self, wrs: &mut [SendWr]) -> Result<()> {
        if let Some(wr) = wrs.iter().find(|w| w.wr_id & REQUEST_WR_ID_BIT != 0) {
            return Err(Error::ReservedWrId(wr.wr_id));
        }
        self.inner.vqp.post_send(wrs)
    }

    /// Polls up to `out.len()` completions of WRs posted with [`Vqp::post`].
    ///
    /// Completions the requests' waiters moved aside come first (they are
    /// older); then the engine's, straight into `out`, with the requests'
    /// own completions taken out and kept for [`Request::wait`].
    ///
    /// # Errors
    /// [`Error::Vqp`] when the shared CQ failed.
    #[inline(always)]
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        if self.inner.stashed_user.load(Ordering::Acquire) > 0 {
            return self.poll_stashed(out);
        }
        let k = self.inner.vqp.poll(out)?;
        if !out[..k].iter().any(|wc| wc.wr_id & REQUEST_WR_ID_BIT != 0) {
            return Ok(k);
        }
        Ok(self.sort_out_requests(out, 0, 0..k))
    }

    /// Between polls of this VQP that found nothing, while waiting for
    /// completions (one `w` per wait, carried across its polls): on an
    /// engine of this process a pause (the CQ is busy-polled, as a NIC's
    /// is); on a node attached to `krcored` a short spin, then yields,
    /// then a sleep until the daemon writes a completion for this VQP (at
    /// most 1 ms): a thread that spun would keep the CPU from the daemon's
    /// data thread that serves it. Returns after one such step; the caller
    /// polls again and bounds its wait.
    ///
    /// # Errors
    /// [`Error::Daemon`] when the daemon went away.
    #[inline]
    pub fn idle(&self, w: &mut PollWait) -> Result<()> {
        self.inner.vqp.idle(&mut w.cq)
    }

    /// Polls until at least one completion came (up to `out.len()`) or
    /// `timeout` passed (`Ok(0)`), with [`Vqp::idle`] between empty
    /// polls: the poll loop a caller would write, right on both an engine
    /// of this process and a node attached to `krcored`.
    ///
    /// # Errors
    /// As [`Vqp::poll`] and [`Vqp::idle`].
    pub fn poll_wait(&self, out: &mut [Wc], timeout: Duration) -> Result<usize> {
        let n = self.poll(out)?;
        if n > 0 || out.is_empty() {
            return Ok(n);
        }
        let (start, mut w, mut looks) = (Instant::now(), PollWait::default(), 0u32);
        loop {
            if timed_out(&mut looks, start, timeout) {
                return Ok(0);
            }
            self.idle(&mut w)?;
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// [`Vqp::poll`] with completions moved aside by the requests' waiters
    /// (out of line: rare, and kept off the common poll's code).
    #[cold]
    #[inline(never)]
    fn poll_stashed(&self, out: &mut [Wc]) -> Result<usize> {
        let n = {
            let mut stash = self.inner.stash.lock();
            let n = out.len().min(stash.user.len());
            for (slot, wc) in out.iter_mut().zip(stash.user.drain(..n)) {
                *slot = wc;
            }
            self.inner
                .stashed_user
                .store(stash.user.len(), Ordering::Release);
            if n == out.len() || !stash.user.is_empty() {
                return Ok(n);
            }
            n
        };
        let k = self.inner.vqp.poll(&mut out[n..])?;
        Ok(self.sort_out_requests(out, n, n..n + k))
    }

    /// The user's completions among `out[fresh]` (polled from the engine
    /// after the `n` already in `out`) kept in order at the front; the
    /// requests' go to the stash. Returns how many entries of `out` are
    /// the user's. Out of line: only a VQP that also carries requests
    /// needs it.
    #[cold]
    #[inline(never)]
    fn sort_out_requests(&self, out: &mut [Wc], n: usize, fresh: Range<usize>) -> usize {
        if !out[fresh.clone()]
            .iter()
            .any(|wc| wc.wr_id & REQUEST_WR_ID_BIT != 0)
        {
            return fresh.end;
        }
        let mut stash = self.inner.stash.lock();
        let mut kept = n;
        for i in fresh {
            let wc = out[i];
            if wc.wr_id & REQUEST_WR_ID_BIT == 0 {
                out[kept] = wc;
                kept += 1;
            } else {
                self.stash_request(&mut stash, &wc);
            }
        }
        self.publish(&stash);
        kept
    }

    /// Moves the engine's completions into the stash, reading atomics' old
    /// values before their scratch slot can be reused. When `want`'s
    /// completion is among them, it is returned instead of stashed.
    fn pump(&self, want: Option<u64>) -> Result<Option<(Wc, Option<u64>)>> {
        let mut buf = [Wc::default(); PUMP_BATCH];
        let mut found = None;
        loop {
            let k = self.inner.vqp.poll(&mut buf)?;
            if k == 0 {
                return Ok(found);
            }
            if k == 1 && found.is_none() && want == Some(buf[0].wr_id) {
                // A synchronous wait's usual poll: its own completion
                // alone, nothing to stash (no stash lock).
                return Ok(Some((buf[0], self.settle(&buf[0]))));
            }
            let mut stash = self.inner.stash.lock();
            for wc in &buf[..k] {
                if wc.wr_id & REQUEST_WR_ID_BIT == 0 {
                    stash.user.push_back(*wc);
                } else if Some(wc.wr_id) == want && found.is_none() {
                    found = Some((*wc, self.settle(wc)));
                } else {
                    self.stash_request(&mut stash, wc);
                }
            }
            self.publish(&stash);
            if k < buf.len() {
                return Ok(found);
            }
        }
    }

    /// Keeps a request's completion (with the atomic's old value) for its
    /// waiter, or drops it when the request was dropped unfinished.
    fn stash_request(&self, stash: &mut Stash, wc: &Wc) {
        let old = self.settle(wc);
        if !stash.abandoned.remove(&wc.wr_id) {
            stash.requests.insert(wc.wr_id, (*wc, old));
        }
    }

    /// Republishes the stash's sizes (caller holds the stash lock).
    fn publish(&self, stash: &Stash) {
        self.inner
            .stashed_user
            .store(stash.user.len(), Ordering::Release);
        self.inner
            .stashed_requests
            .store(stash.requests.len(), Ordering::Release);
    }

    /// Settles a request's completion: a successful atomic's old value is
    /// read from its scratch slot, and the slot (whatever the status) goes
    /// back to the free list. Called once per request completion.
    fn settle(&self, wc: &Wc) -> Option<u64> {
        let slot = wc.wr_id & SLOT_MASK;
        if slot == 0 {
            return None;
        }
        let mut scratch = self.inner.scratch.lock();
        let s = scratch.as_mut()?;
        let old = match (wc.status, wc.opcode) {
            (
                WcStatus::Success,
                krcore_nic::WcOpcode::CompSwap | krcore_nic::WcOpcode::FetchAdd,
            ) => s.mr.load_u64(scratch_offset(slot)).ok(),
            _ => None,
        };
        s.free.push(slot as u32);
        old
    }

    /// Gives back the scratch slot of a request that was never posted.
    fn release_unposted(&self, wr_id: u64) {
        let slot = wr_id & SLOT_MASK;
        if slot != 0 {
            if let Some(s) = self.inner.scratch.lock().as_mut() {
                s.free.push(slot as u32);
            }
        }
    }

    /// A request wr_id with `slot` (0: none).
    fn next_wr_id(&self, slot: u64) -> u64 {
        let seq = self.inner.next_request.fetch_add(1, Ordering::Relaxed) + 1;
        REQUEST_WR_ID_BIT | ((seq & SEQ_MASK) << SLOT_BITS) | slot
    }

    /// Connects to the token's node if needed and makes its grant known:
    /// not again when this token's grant was the last one made known and
    /// nobody changed the VQP's grants since (no lock of the shared QP,
    /// no map insert per request).
    fn prepare(&self, remote: &RemoteRegion) -> Result<()> {
        if self.target() != Some(remote.gid) {
            self.connect(remote.gid)?;
        }
        let v = &self.inner.vqp;
        let mut granted = self.inner.granted.lock();
        let before = v.grants_epoch();
        if *granted == Some((*remote, before)) {
            return Ok(());
        }
        v.add_grant(remote.gid, remote.rkey, remote.grant())?;
        let after = v.grants_epoch();
        // Remembered only when the one change was this one.
        *granted = (after == before + 1).then_some((*remote, after));
        Ok(())
    }

    /// Posts one request. When the VQP is full, moves finished completions
    /// out of the engine and retries: requests never fail for lack of room
    /// (completions always come, so this ends). A request that fails to
    /// post gives its scratch slot back.
    fn submit(&self, mut wr: SendWr) -> Result<Request<N>> {
        let wr_id = wr.wr_id;
        loop {
            let e = match self.inner.vqp.post_send(std::slice::from_mut(&mut wr)) {
                Ok(()) => break,
                Err(e) if is_full(&e) => match self.pump(None) {
                    Ok(_) => {
                        std::hint::spin_loop();
                        continue;
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            self.release_unposted(wr_id);
            return Err(e);
        }
        Ok(Request {
            vqp: self.clone(),
            wr_id,
            done: None,
        })
    }

    /// READs `len` bytes at `remote_offset` of `remote` into `local` at
    /// `local_offset`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`]; [`Error::Engine`] if connecting fails;
    /// [`Error::Vqp`] when the post is refused.
    pub fn read(
        &self,
        local: &MemoryRegion<N>,
        local_offset: u64,
        remote: &RemoteRegion,
        remote_offset: u64,
        len: u32,
    ) -> Result<Request<N>> {
        self.one_sided(
            SendWr::read,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    /// WRITEs `len` bytes of `local` at `local_offset` to `remote` at
    /// `remote_offset`.
    ///
    /// # Errors
    /// As [`Vqp::read`].
    pub fn write(
        &self,
        local: &MemoryRegion<N>,
        local_offset: u64,
        remote: &RemoteRegion,
        remote_offset: u64,
        len: u32,
    ) -> Result<Request<N>> {
        self.one_sided(
            SendWr::write,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    /// A READ or WRITE between `local` and `remote` after range checks.
    fn one_sided(
        &self,
        make: fn(u64, krcore_nic::Sge, krcore_nic::RemoteAddr) -> SendWr,
        local: &MemoryRegion<N>,
        local_offset: u64,
        remote: &RemoteRegion,
        remote_offset: u64,
        len: u32,
    ) -> Result<Request<N>> {
        check(local_offset, len.into(), local.len() as u64, "local")?;
        check(remote_offset, len.into(), remote.len, "remote")?;
        self.prepare(remote)?;
        let sge = local.sge(local_offset as usize, len)?;
        self.submit(make(self.next_wr_id(0), sge, remote.at(remote_offset)))
    }

    /// Takes a scratch slot for an atomic: its wr_id and the SGE of its
    /// old-value word. While every slot is held, moves completions out of
    /// the engine (which settles theirs) and tries again: slots are held
    /// only by requests in flight, whose completions always come, or by a
    /// poller about to read one.
    fn atomic_slot(&self) -> Result<(u64, krcore_nic::Sge)> {
        loop {
            {
                let mut scratch = self.inner.scratch.lock();
                if scratch.is_none() {
                    let depth = match self.inner.node.backend() {
                        Backend::Engine(e) => e.config().vqp_depth as u64,
                        // The completion ring bounds what can be in flight.
                        Backend::Daemon(_) => krcore_kmod::daemon::CQ_CAP as u64,
                    };
                    let slots = (2 * depth).min(SLOT_MASK) as u32;
                    *scratch = Some(Scratch {
                        mr: self
                            .inner
                            .node
                            .alloc(slots as usize * 8, Access::LOCAL_WRITE)?,
                        free: (1..=slots).rev().collect(),
                    });
                }
                if let Some(s) = scratch.as_mut() {
                    if let Some(slot) = s.free.pop() {
                        let slot = u64::from(slot);
                        match s.mr.sge(scratch_offset(slot), 8) {
                            Ok(sge) => return Ok((self.next_wr_id(slot), sge)),
                            Err(e) => {
                                s.free.push(slot as u32);
                                return Err(e);
                            }
                        }
                    }
                }
            }
            self.pump(None)?;
            std::hint::spin_loop();
        }
    }

    /// Compare-and-swap of the 8-byte word at `remote_offset` of `remote`:
    /// the [`Completion::old_value`] is the word before (the swap happened
    /// iff it equals `compare`).
    ///
    /// # Errors
    /// As [`Vqp::read`]; a misaligned offset is a pre-check rejection.
    pub fn compare_and_swap(
        &self,
        remote: &RemoteRegion,
        remote_offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<Request<N>> {
        check(remote_offset, 8, remote.len, "remote")?;
        self.prepare(remote)?;
        let (wr_id, sge) = self.atomic_slot()?;
        self.submit(SendWr::cas(
            wr_id,
            sge,
            remote.at(remote_offset),
            compare,
            swap,
        ))
    }

    /// Fetch-and-add of `add` to the 8-byte word at `remote_offset`; the
    /// [`Completion::old_value`] is the word before.
    ///
    /// # Errors
    /// As [`Vqp::compare_and_swap`].
    pub fn fetch_add(
        &self,
        remote: &RemoteRegion,
        remote_offset: u64,
        add: u64,
    ) -> Result<Request<N>> {
        check(remote_offset, 8, remote.len, "remote")?;
        self.prepare(remote)?;
        let (wr_id, sge) = self.atomic_slot()?;
        self.submit(SendWr::faa(wr_id, sge, remote.at(remote_offset), add))
    }
}

/// The byte offset of scratch slot `slot` (1-based) in its region.
fn scratch_offset(slot: u64) -> usize {
    (slot as usize - 1) * 8
}

/// A posted request (Infinity's `RequestToken`): wait for it, or check it.
///
/// Dropping an unfinished request is fine: its completion is discarded
/// when it arrives.
pub struct Request<N: Nic = AnyNic> {
    vqp: Vqp<N>,
    wr_id: u64,
    done: Option<(Wc, Option<u64>)>,
}

impl<N: Nic> std::fmt::Debug for Request<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("wr_id", &format_args!("{:#x}", self.wr_id))
            .field("done", &self.done.is_some())
            .finish()
    }
}

impl<N: Nic> Drop for Request<N> {
    fn drop(&mut self) {
        if self.done.is_none() {
            let mut stash = self.vqp.inner.stash.lock();
            if stash.requests.remove(&self.wr_id).is_none() {
                stash.abandoned.insert(self.wr_id);
            }
            self.vqp.publish(&stash);
        }
    }
}

impl<N: Nic> Request<N> {
    /// The request's wr_id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    fn finish(&self, (wc, old_value): (Wc, Option<u64>)) -> Result<Completion> {
        if wc.status == WcStatus::Success {
            Ok(Completion { wc, old_value })
        } else {
            Err(Error::Failed {
                wr_id: self.wr_id,
                status: wc.status,
            })
        }
    }

    /// Whether the request finished: `Ok(Some(..))` once it succeeded.
    ///
    /// # Errors
    /// [`Error::Failed`] when it completed with an error status;
    /// [`Error::Vqp`] when polling failed.
    pub fn try_wait(&mut self) -> Result<Option<Completion>> {
        if self.done.is_none() {
            self.done = self.vqp.pump(Some(self.wr_id))?;
        }
        if self.done.is_none() && self.vqp.inner.stashed_requests.load(Ordering::Acquire) > 0 {
            let mut stash = self.vqp.inner.stash.lock();
            self.done = stash.requests.remove(&self.wr_id);
            self.vqp.publish(&stash);
        }
        match self.done {
            Some(d) => self.finish(d).map(Some),
            None => Ok(None),
        }
    }

    /// Waits for the request (completions always come: errors included).
    ///
    /// # Errors
    /// As [`Request::try_wait`].
    pub fn wait(mut self) -> Result<Completion> {
        // (Drop sees `done` set once this returns a result.)
        let mut w = PollWait::default();
        loop {
            if let Some(c) = self.try_wait()? {
                return Ok(c);
            }
            self.vqp.idle(&mut w)?;
        }
    }

    /// Waits at most `timeout`; `Ok(None)` when it has not finished.
    ///
    /// # Errors
    /// As [`Request::try_wait`].
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<Completion>> {
        let start = Instant::now();
        let mut spins = 0u32;
        let mut w = PollWait::default();
        loop {
            if let Some(c) = self.try_wait()? {
                return Ok(Some(c));
            }
            if timed_out(&mut spins, start, timeout) {
                return Ok(None);
            }
            self.vqp.idle(&mut w)?;
        }
    }
}

/// Whether a wait begun at `start` is past `timeout`, counting `looks`:
/// the clock is read every few looks, then (an attached VQP may sleep
/// between looks) at every look.
fn timed_out(looks: &mut u32, start: Instant, timeout: Duration) -> bool {
    *looks = looks.saturating_add(1);
    (*looks % SPINS_PER_CLOCK_READ == 0 || *looks > SPINS_PER_CLOCK_READ * 16)
        && start.elapsed() >= timeout
}

/// One wait for completions across empty polls ([`Vqp::idle`]): a new
/// one (`PollWait::default()`) for each wait.
#[derive(Debug, Default)]
pub struct PollWait {
    pub(crate) cq: krcore_kmod::daemon::CqWait,
}

/// The VQPs a node makes (here, above the node, so that the node does not
/// import its VQPs).
impl<N: Nic> Node<N> {
    /// A new VQP, not connected yet.
    ///
    /// # Errors
    /// [`Error::Engine`]; on an attached node [`Error::Daemon`] (its
    /// quota of VQPs).
    pub fn vqp(&self) -> Result<Vqp<N>> {
        let raw = match &self.backend() {
            Backend::Engine(e) => RawVqp::Local(e.create_vqp()?),
            Backend::Daemon(a) => RawVqp::attached(a.create_vqp()?),
        };
        Ok(Vqp::new(raw, self.clone()))
    }

    /// A new VQP connected to `gid`.
    ///
    /// # Errors
    /// [`Error::Engine`] (`UnknownNode`, `MetaUnavailable`, ...).
    pub fn connect(&self, gid: Gid) -> Result<Vqp<N>> {
        let v = self.vqp()?;
        v.connect(gid)?;
        Ok(v)
    }

    /// A new VQP connected to `gid` with the grant over `rkey` known to its
    /// pre-check: [`Node::connect`] and [`Vqp::add_grant`] together. On an
    /// attached node that is one control call to the daemon instead of
    /// three (create, connect, grant): what a joining client that reaches
    /// each of its memory nodes once wants.
    ///
    /// # Errors
    /// As [`Node::connect`] and [`Vqp::add_grant`].
    pub fn connect_granted(
        &self,
        gid: Gid,
        rkey: u32,
        grant: krcore_kmod::RemoteGrant,
    ) -> Result<Vqp<N>> {
        match &self.backend() {
            Backend::Engine(_) => {
                let v = self.connect(gid)?;
                v.add_grant(gid, rkey, grant)?;
                Ok(v)
            }
            Backend::Daemon(a) => {
                let opened = a
                    .open_vqp(gid, rkey, grant)
                    .map_err(|e| crate::raw::connect_error(gid, e))?;
                let raw = RawVqp::attached_open(opened, gid, rkey, grant);
                Ok(Vqp::new(raw, self.clone()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Access, Error, Node, Reason, VqpError};

    #[test]
    fn requests_make_a_token_known_once_and_again_after_a_change() {
        let server = Node::builder()
            .fabric("sim:mem")
            .host_meta()
            .build()
            .unwrap();
        let client = Node::builder().join(&server).build().unwrap();
        let region = server.alloc(4096, Access::ALL).unwrap();
        let token = region.remote_region(64, 64, Access::REMOTE_READ).unwrap();
        let other = region.remote_region(0, 4096, Access::ALL).unwrap();
        let vqp = client.connect(server.gid()).unwrap();
        let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
        let epoch = || vqp.raw().unwrap().grants_epoch();
        assert_eq!(epoch(), 0);
        vqp.read(&buf, 0, &token, 0, 64).unwrap().wait().unwrap();
        assert_eq!(epoch(), 1, "the first request makes the grant known");
        for _ in 0..10 {
            vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
        }
        assert_eq!(epoch(), 1, "the same token again: no add_grant");
        vqp.read(&buf, 0, &other, 0, 8).unwrap().wait().unwrap();
        assert_eq!(epoch(), 2, "another token is made known");
        vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
        assert_eq!(epoch(), 3);
        // Someone forgets the read-only grant behind the SDK's back: the
        // next request makes it known again, so the pre-check still
        // refuses a WRITE through the read-only token (were it skipped,
        // the grant would be unknown and the WRITE left to the NIC, which
        // allows it: the region is registered with every access).
        assert!(vqp
            .raw()
            .unwrap()
            .remove_grant(&token.gid, token.rkey)
            .is_some());
        match vqp.write(&buf, 0, &token, 0, 8) {
            Err(Error::Vqp(VqpError::Rejected(r))) => {
                assert!(
                    matches!(r.reason, Reason::RemoteAccessMissing { .. }),
                    "{r}"
                )
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        assert_eq!(epoch(), 5);
    }
}
