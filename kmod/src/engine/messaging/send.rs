//! Messaging I/O helpers: posting message sends on a VQP, descriptor
//! READs, staging and landing buffers (see [`super::node`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::{
    Access, Gid, InlineData, MemoryRegion, Nic, Payload, SendFlags, SendWr, SgList, Sge, Wc,
    WcStatus, WrOp,
};
use parking_lot::Mutex;

use super::node::*;
use super::types::*;
use crate::engine::error::VqpError;
use crate::engine::mrs::OwnedMr;
use crate::engine::vqp::Vqp;
use crate::msg::{Descriptor, MsgDst, MsgKind, MsgRepr};

/// The wr_id bit of an endpoint's data message SEND: the rest of the
/// wr_id is the endpoint's tag of the message (see `Endpoint::send`).
pub(crate) const MSG_TAG: u64 = 1 << 63;

/// Where a VQP's recent data messages went, by tag (their SEND's wr_id
/// with [`MSG_TAG`]), to report the ones whose SEND failed as
/// [`MsgError::Lost`].
///
/// A message's entry outlives its SEND's completion: at most the VQP's
/// depth of WRs can follow it before that completion is reaped (they
/// complete after it and hold the VQP's room till then), and lost ones are
/// collected before the next data message is tagged; the table has two
/// entries more than that.
pub(crate) struct SentTags {
    next: u64,
    /// By `tag % len`: (tag, node, destination (an endpoint's port, a
    /// port's endpoint VQP), seq).
    table: Vec<(u64, Gid, u32, u64)>,
    /// Messages found lost, reported one per call.
    pub(crate) lost: std::collections::VecDeque<MsgError>,
}

impl SentTags {
    /// The table of a VQP `depth` deep.
    pub(crate) fn new(depth: u32) -> SentTags {
        SentTags {
            next: 0,
            table: vec![(u64::MAX, Gid::default(), 0, 0); depth as usize + 2],
            lost: std::collections::VecDeque::new(),
        }
    }

    /// Tags the next data message (to `dst` at `gid`, `seq`): its wr_id.
    pub(crate) fn tag(&mut self, gid: Gid, dst: u32, seq: u64) -> u64 {
        let tag = self.next;
        self.next += 1;
        let n = self.table.len() as u64;
        self.table[(tag % n) as usize] = (tag, gid, dst, seq);
        MSG_TAG | tag
    }

    /// Turns the failures filed for `vqp` into errors made by `lost(gid,
    /// dst, seq, status)` (which also gives the message's credit back), in
    /// posting order.
    pub(crate) fn collect(
        &mut self,
        vqp: u32,
        counters: &Counters,
        mut lost: impl FnMut(Gid, u32, u64, WcStatus) -> MsgError,
    ) {
        let Some(failed) = counters.failed.lock().remove(&vqp) else {
            return;
        };
        for (tag, status) in failed {
            let n = self.table.len() as u64;
            let (t, gid, dst, seq) = self.table[(tag % n) as usize];
            if t != tag {
                // Overwritten (the depth bound forbids it): counted.
                bump(&counters.progress_errors);
                continue;
            }
            self.lost.push_back(lost(gid, dst, seq, status));
        }
    }
}

/// A buffer of at least `len` bytes from `pool`, or a new one.
pub(crate) fn take_buffer<N: Nic>(
    eng: &dyn MsgHost<N>,
    pool: &Mutex<Vec<OwnedMr<N>>>,
    len: usize,
    access: Access,
) -> Result<OwnedMr<N>, MsgError> {
    let mut p = pool.lock();
    if let Some(i) = p.iter().position(|m| m.len() >= len) {
        return Ok(p.swap_remove(i));
    }
    drop(p);
    let size = len.max(MIN_BUFFER).next_power_of_two();
    let mr = eng
        .nic
        .alloc_mr(&eng.pd, size, access)
        .map_err(MsgError::nic("allocate a message buffer"))?;
    Ok(OwnedMr::new(mr, &eng.nic, &eng.mrs))
}

/// Points `vqp` at `to` (a DCCache hit after the first time). RC
/// fallback mode: a VQP moves to another target's pair only with no WR in
/// flight; its message sends are signaled there, so reaping them (bounded
/// by the messaging timeout) lets it move.
///
/// A VQP aimed at `to` stays, unless the DCCache names another address for
/// `to` now: the GID's process restarted, and an Open from the new one
/// replaced the entry (`learn_sender`); a reply sent to the dead process's
/// address would be lost.
pub(crate) fn aim<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    if let Some(cur) = vqp.target().filter(|t| t.target.gid == to) {
        let moved = vqp
            .dev
            .cache
            .lookup(&to)
            .hit()
            .is_some_and(|now| now.target != cur.target);
        if !moved {
            return Ok(());
        }
    }
    let start = Instant::now();
    loop {
        match vqp.connect(to) {
            Ok(()) => return Ok(()),
            Err(e @ crate::engine::error::EngineError::VqpBusy { .. }) => {
                if start.elapsed() >= timeout {
                    return Err(e.into());
                }
                reap(vqp, counters)?;
                std::thread::yield_now();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Message sends are unsignaled on DC (the pre-check signals one in
/// `max_unsignaled`); in RC fallback mode they are signaled, so that a VQP
/// that sends to several targets can leave one pair for the next
/// (see [`aim`]).
fn send_flags<N: Nic>(vqp: &Vqp<N>) -> SendFlags {
    match vqp.engine.mode() {
        crate::engine::config::EngineMode::Dc => SendFlags::NONE,
        _ => SendFlags::SIGNALED,
    }
}

/// Counts an error completion of a message send; files a tagged data
/// message's for its endpoint (it reports the message lost).
pub(crate) fn failed_send(wc: &Wc, counters: &Counters) {
    bump(&counters.send_errors);
    if wc.wr_id & MSG_TAG != 0 {
        counters
            .failed
            .lock()
            .entry(wc.qp_num)
            .or_default()
            .push((wc.wr_id & !MSG_TAG, wc.status));
    }
}

/// Polls `vqp`'s completions away, counting errors of message sends (and
/// filing those of tagged data messages, see [`failed_send`]).
pub(crate) fn reap<N: Nic>(vqp: &Vqp<N>, counters: &Counters) -> Result<(), MsgError> {
    let mut wcs = [Wc::default(); 16];
    loop {
        let k = vqp.poll(&mut wcs)?;
        for wc in &wcs[..k] {
            if !wc.status.is_ok() {
                failed_send(wc, counters);
            }
        }
        if k < wcs.len() {
            return Ok(());
        }
    }
}

/// The pause schedule of a control message sent again while a call waits
/// (a repeated Open, a credit asked again): due after `first`, then after
/// twice as long each time, up to `max`.
pub(crate) struct Resend {
    after: Duration,
    max: Duration,
    last: Instant,
}

impl Resend {
    /// A schedule starting now.
    pub(crate) fn new(first: Duration, max: Duration) -> Resend {
        Resend {
            after: first,
            max,
            last: Instant::now(),
        }
    }

    /// Whether the next send is due; if so, the schedule moves on (the
    /// send counts as made, whether it went out or not).
    pub(crate) fn due(&mut self) -> bool {
        if self.last.elapsed() < self.after {
            return false;
        }
        self.last = Instant::now();
        self.after = (self.after * 2).min(self.max);
        true
    }
}

/// Posts one unsignaled WR on `vqp`, reaping completions while the VQP is
/// full (bounded by `timeout`).
pub(crate) fn post_one<N: Nic>(
    vqp: &Vqp<N>,
    mut wr: SendWr,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    let start = Instant::now();
    loop {
        match vqp.post_send(std::slice::from_mut(&mut wr)) {
            Ok(()) => return Ok(()),
            Err(VqpError::VqpFull { .. }) if start.elapsed() < timeout => {
                reap(vqp, counters)?;
                std::thread::yield_now();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `header` then `body` into `out` (sized for one inline WR);
/// returns the bytes written. The caller checked that they fit.
pub(crate) fn with_body(
    out: &mut [u8; krcore_nic::MAX_INLINE],
    header: &[u8],
    body: &[u8],
) -> usize {
    let n = (header.len() + body.len()).min(out.len());
    let h = header.len().min(n);
    out[..h].copy_from_slice(&header[..h]);
    out[h..n].copy_from_slice(&body[..n - h]);
    n
}

pub(crate) fn send_inline<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    imm: u32,
    bytes: &[u8],
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    send_inline_wr(vqp, to, imm, bytes, timeout, counters, 0)
}

/// [`send_inline`] with the WR's `wr_id` (a data message's tag).
pub(crate) fn send_inline_wr<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    imm: u32,
    bytes: &[u8],
    timeout: Duration,
    counters: &Counters,
    wr_id: u64,
) -> Result<(), MsgError> {
    aim(vqp, to, timeout, counters)?;
    let data = InlineData::new(bytes).ok_or(MsgError::Unsupported {
        reason: "control message longer than the inline limit",
    })?;
    let wr = SendWr {
        wr_id,
        op: WrOp::SendImm { imm },
        payload: Payload::Inline(data),
        flags: send_flags(vqp),
        dest: krcore_nic::Destination::Connected,
    };
    post_one(vqp, wr, timeout, counters)
}

/// Descriptor buffers lent out until the receiver's Release.
pub(crate) struct Staging<N: Nic> {
    pub(crate) free: Arc<Mutex<Vec<OwnedMr<N>>>>,
    pub(crate) lent: HashMap<u64, (OwnedMr<N>, bool)>,
    pub(crate) next_token: u64,
}

impl<N: Nic> Default for Staging<N> {
    fn default() -> Self {
        Staging {
            free: Arc::new(Mutex::new(Vec::new())),
            lent: HashMap::new(),
            next_token: 1,
        }
    }
}

impl<N: Nic> Staging<N> {
    /// Takes back a released buffer (`pooled`: it came from the pool).
    pub(crate) fn release(&mut self, token: u64) {
        if let Some((mr, pooled)) = self.lent.remove(&token) {
            let mut f = self.free.lock();
            if pooled && f.len() < POOL_KEEP {
                f.push(mr);
            }
        }
    }

    /// Lends `mr` for one descriptor; returns its token.
    pub(crate) fn lend(&mut self, mr: OwnedMr<N>, pooled: bool) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        self.lent.insert(t, (mr, pooled));
        t
    }
}

/// The wr_ids of descriptor READs: `PULL_TAG | seq` (below [`MSG_TAG`]).
const PULL_TAG: u64 = 0x5055_4c4c << 32; // "PULL"
const PULL_SEQ: u64 = (1 << 32) - 1;
/// Descriptor READs posted by this process (their wr_ids' sequence).
static PULLS: AtomicU64 = AtomicU64::new(0);

/// READs `len` bytes at `desc` from `from` into `landing`, waiting for the
/// completion (bounded). A READ given up on may still complete later: its
/// completion is told apart by its wr_id and dropped.
pub(crate) fn read_into<N: Nic>(
    vqp: &Vqp<N>,
    from: Gid,
    landing: &OwnedMr<N>,
    len: u32,
    desc: Descriptor,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    aim(vqp, from, timeout, counters)?;
    // Each READ has a wr_id of its own: the late completion of one given
    // up on (its landing buffer was dropped, deregistered) must not be
    // taken for a later one's, whose bytes may not have landed yet.
    let pull = PULL_TAG | (PULLS.fetch_add(1, Ordering::Relaxed) & PULL_SEQ);
    let sge = landing
        .sge(0, len)
        .map_err(MsgError::nic("a landing buffer"))?;
    let wr = SendWr::read(
        pull,
        sge,
        krcore_nic::RemoteAddr {
            addr: desc.addr,
            rkey: desc.rkey,
        },
    );
    post_one(vqp, wr, timeout, counters)?;
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    loop {
        let k = vqp.poll(&mut wcs)?;
        for wc in &wcs[..k] {
            if wc.wr_id == pull {
                return if wc.status.is_ok() {
                    Ok(())
                } else {
                    Err(MsgError::Failed {
                        what: "descriptor READ",
                        status: wc.status,
                    })
                };
            }
            if !wc.status.is_ok() {
                failed_send(wc, counters);
            }
        }
        if start.elapsed() >= timeout {
            return Err(MsgError::Timeout(start.elapsed()));
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
}

/// Sends `header` followed by `body` in one SEND: inline when both fit
/// the device's inline limit, else through the staging slot `(ring, off)`
/// of the sending VQP's ring (see `MsgNode::staging_ring`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_with_body<N: Nic>(
    eng: &dyn MsgHost<N>,
    vqp: &Vqp<N>,
    (ring, off): (&OwnedMr<N>, usize),
    to: Gid,
    imm: u32,
    (header, body): (&[u8], &[u8]),
    node: &MsgNode<N>,
    wr_id: u64,
) -> Result<(), MsgError> {
    let cfg = &node.cfg;
    if header.len() + body.len() <= eng.policy.max_inline {
        let mut b = [0u8; krcore_nic::MAX_INLINE];
        let n = with_body(&mut b, header, body);
        return send_inline_wr(vqp, to, imm, &b[..n], cfg.timeout, &node.counters, wr_id);
    }
    aim(vqp, to, cfg.timeout, &node.counters)?;
    ring.write(off, header)
        .and_then(|()| ring.write(off + header.len(), body))
        .map_err(MsgError::nic("write a staging buffer"))?;
    let sge = ring
        .sge(off, (header.len() + body.len()) as u32)
        .map_err(MsgError::nic("a staging buffer"))?;
    let wr = SendWr {
        wr_id,
        flags: send_flags(vqp),
        ..send_wr(sge, imm)
    };
    post_one(vqp, wr, cfg.timeout, &node.counters)
}

/// The oldest message of the queue `queue` picks in `state` (a port's
/// ring, an endpoint's replies). A descriptor whose sender cannot be
/// reached now (its body is pulled from there) stays queued, at the head
/// (pops are serialized by the caller's `tx` lock): the error is typed and
/// the next pop tries again.
///
/// # Errors
/// Engine errors of reaching a descriptor's sender.
pub(crate) fn take_next<N: Nic, S>(
    vqp: &Vqp<N>,
    node: &MsgNode<N>,
    state: &Mutex<S>,
    queue: impl Fn(&mut S) -> &mut std::collections::VecDeque<Message<N>>,
) -> Result<Option<Message<N>>, MsgError> {
    let Some(msg) = queue(&mut state.lock()).pop_front() else {
        return Ok(None);
    };
    if let (Body::Pending { .. }, Err(e)) = (
        &msg.body,
        aim(vqp, msg.from.gid, node.cfg.timeout, &node.counters),
    ) {
        queue(&mut state.lock()).push_front(msg);
        return Err(e);
    }
    Ok(Some(msg))
}

/// Pulls a descriptor message's body (the zero-copy receive, of a port's
/// message or an endpoint's reply): one READ from its sender into a
/// landing buffer of `pool`, then `release(token)` whatever the READ did
/// (the sender's buffer is not read again; the caller sends the Release,
/// or owes it). An inline or pulled body is left as it is.
///
/// # Errors
/// [`MsgError::Failed`] for a failed READ (the message is consumed and
/// reported); buffer and post errors.
pub(crate) fn pull_body<N: Nic>(
    eng: &dyn MsgHost<N>,
    node: &MsgNode<N>,
    vqp: &Vqp<N>,
    pool: &Arc<Mutex<Vec<OwnedMr<N>>>>,
    msg: &mut Message<N>,
    release: impl FnOnce(u64),
) -> Result<(), MsgError> {
    let Body::Pending { len, desc } = msg.body else {
        return Ok(());
    };
    let landing = take_buffer(eng, pool, len as usize, Access::LOCAL_WRITE)?;
    let cfg = &node.cfg;
    let read = read_into(
        vqp,
        msg.from.gid,
        &landing,
        len,
        desc,
        cfg.timeout,
        &node.counters,
    );
    release(desc.token);
    read?;
    bump(&node.counters.pulled);
    msg.body = Body::Pulled {
        mr: Landing {
            mr: Some(landing),
            pool: Arc::downgrade(pool),
        },
        len: len as usize,
    };
    Ok(())
}

/// Sends one data message (inline, or a descriptor of a staging buffer or
/// of `region`) from `vqp`, unsignaled.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_data<N: Nic>(
    eng: &dyn MsgHost<N>,
    vqp: &Vqp<N>,
    staging: &mut Staging<N>,
    (ring, off): (&OwnedMr<N>, usize),
    to: Gid,
    dst: MsgDst,
    imm: u32,
    seq: u64,
    data: &[u8],
    node: &MsgNode<N>,
    wr_id: u64,
) -> Result<(), MsgError> {
    let cfg = &node.cfg;
    aim(vqp, to, cfg.timeout, &node.counters)?;
    let src = eng.nic.gid();
    if data.len() <= cfg.inline_max {
        let header = MsgRepr {
            src,
            dst,
            kind: MsgKind::Data {
                seq,
                len: data.len() as u32,
            },
        }
        .emit();
        return send_with_body(eng, vqp, (ring, off), to, imm, (&header, data), node, wr_id);
    }
    let mr = take_buffer(
        eng,
        &staging.free,
        data.len(),
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    )?;
    mr.write(0, data)
        .map_err(MsgError::nic("write a staging buffer"))?;
    let desc = Descriptor {
        addr: mr.addr(),
        rkey: mr.rkey(),
        token: 0,
    };
    let token = staging.lend(mr, true);
    send_descriptor(
        vqp,
        to,
        dst,
        imm,
        seq,
        data.len() as u32,
        Descriptor { token, ..desc },
        src,
        cfg.timeout,
        &node.counters,
        wr_id,
    )
    .inspect_err(|_| staging.release(token))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn send_descriptor<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    dst: MsgDst,
    imm: u32,
    seq: u64,
    len: u32,
    desc: Descriptor,
    src: Gid,
    timeout: Duration,
    counters: &Counters,
    wr_id: u64,
) -> Result<(), MsgError> {
    let header = MsgRepr {
        src,
        dst,
        kind: MsgKind::Desc { seq, len, desc },
    }
    .emit();
    send_inline_wr(vqp, to, imm, &header, timeout, counters, wr_id)
}

pub(crate) fn send_wr(sge: Sge, imm: u32) -> SendWr {
    SendWr {
        wr_id: 0,
        op: WrOp::SendImm { imm },
        payload: Payload::Local(SgList::one(sge)),
        flags: SendFlags::NONE,
        dest: krcore_nic::Destination::Connected,
    }
}

impl<N: Nic> MsgNode<N> {
    /// Sends an answer to an Open from a VQP made for it (Opens are rare:
    /// once per channel). The VQP is dropped after the post: the inline
    /// send needs no buffer, and its completion is not needed. (The node
    /// keeps no VQP of its own: a VQP holds the engine, which holds this.)
    /// Should the send fail (a dead sender), the DCI's next post finds the
    /// failure and recovers the QP first (`SharedQp::orphans_until`); an
    /// answer lost anyway (flushed behind such a failure before it was
    /// seen) is asked for again: an endpoint repeats an unanswered Open.
    pub(crate) fn send_ctl(
        &self,
        eng: &dyn MsgHost<N>,
        to: Gid,
        m: &MsgRepr,
    ) -> Result<(), MsgError> {
        let vqp = eng.create_vqp()?;
        let imm = vqp.id().get();
        send_inline(&vqp, to, imm, &m.emit(), self.cfg.timeout, &self.counters)
    }
}

/// A VQP for messaging's own one-sided traffic (a pulled region's READs,
/// credit returns): the keys it posts are those its peer's messaging put
/// in the message, for buffers that messaging exposes, not grants a user
/// handed out, so it leaves them to the NIC ([`Ungranted::Allow`]); every
/// other part of the pre-check applies.
///
/// [`Ungranted::Allow`]: crate::precheck::Ungranted::Allow
pub(crate) fn messaging_vqp<N: Nic>(eng: &dyn MsgHost<N>) -> Result<Vqp<N>, MsgError> {
    let vqp = eng.create_vqp()?;
    vqp.set_ungranted(crate::precheck::Ungranted::Allow);
    Ok(vqp)
}
