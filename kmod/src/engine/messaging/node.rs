//! The node's messaging host: the receive side over the node's SRQ
//! (receive buffers, the drain, demultiplexing to ports and endpoints) and
//! [`MsgHost`], what messaging needs of its engine. See the room's docs
//! ([`super`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use krcore_nic::CompletionQueue;
use krcore_nic::{Access, Gid, MemoryRegion, Nic, RecvWr, SharedReceiveQueue, Wc};
use parking_lot::{Mutex, RwLock};

use super::state::{EndpointShared, Opener, PortShared};
use super::types::*;
use crate::engine::config::MsgConfig;
use crate::engine::device::Device;
use crate::engine::error::{EngineError, VqpError};
use crate::engine::mrs::OwnedMr;
use crate::engine::rc::RcHost;
use crate::engine::vqp::Vqp;
use crate::msg::{MsgDst, MsgKind, MsgPacket, MsgRepr, RefuseCode, HEADER_LEN};

/// What messaging needs of its engine: the data path ([`RcHost`]: the
/// device, a VQP's path), the receive side, the slot of the node's
/// messaging host and new VQPs. The engine object implements it; ports,
/// endpoints and the host hold their engine as `Arc<dyn MsgHost<N>>`, so
/// that messaging does not name the engine object.
pub(crate) trait MsgHost<N: Nic>: RcHost<N> {
    /// The SRQ and receive CQ messages arrive at, and this node's address
    /// for answers (`dct_num`, `dc_key` of `Engine::local_target`).
    ///
    /// # Errors
    /// DC mode: the DCT's creation (made on first need); in a forked child
    /// that would have to make it, [`EngineError::Unsupported`].
    fn msg_rx(&self) -> Result<(N::Srq, N::Cq, u32, u64), EngineError>;

    /// The node's messaging host once made, and the lock its making holds.
    fn msg_slot(&self) -> (&OnceLock<Arc<MsgNode<N>>>, &Mutex<()>);

    /// RC fallback mode: closes the pairs to peers that restarted on their
    /// GID since the last look (one load when none did).
    fn forget_restarted_peers(&self);

    /// A new VQP of this engine.
    ///
    /// # Errors
    /// As `Engine::create_vqp`.
    fn create_vqp(&self) -> Result<Vqp<N>, EngineError>;

    /// An owning handle (`None` while the engine is being dropped).
    fn msg_host(&self) -> Option<Arc<dyn MsgHost<N>>>;
}

/// Field access through the engine as messaging holds it (`eng.cfg`).
impl<N: Nic> std::ops::Deref for dyn MsgHost<N> + '_ {
    type Target = Device<N>;

    #[inline(always)]
    fn deref(&self) -> &Device<N> {
        self.dev()
    }
}

/// The node's messaging host (see the module docs).
pub(crate) struct MsgNode<N: Nic> {
    pub(crate) cfg: MsgConfig,
    pub(crate) slot_len: usize,
    /// Bytes of a staging ring.
    pub(crate) ring_len: usize,
    pub(crate) bufs: OwnedMr<N>,
    pub(crate) srq: N::Srq,
    pub(crate) cq: N::Cq,
    /// Held (try-lock) by the one thread draining the receive CQ; holds
    /// the receive slots whose re-post was refused (retried first thing by
    /// every drain).
    pub(crate) recv: Mutex<Receiving>,
    pub(crate) budget: Mutex<u32>,
    pub(crate) ports: RwLock<HashMap<u16, Arc<PortShared<N>>>>,
    pub(crate) endpoints: RwLock<HashMap<u32, Arc<EndpointShared<N>>>>,
    pub(crate) counters: Counters,
    pub(crate) thread: Mutex<Option<Worker>>,
    /// The next sender id of an only message (see `Endpoint::send_only`):
    /// from `1 << VQP_ID_BITS` on, never a VQP's id.
    pub(crate) next_only: AtomicU32,
}

/// The receive side's own state (under [`MsgNode::recv`]).
#[derive(Default)]
pub(crate) struct Receiving {
    /// Slots (wr_ids) handled whose re-post the SRQ refused: posted again
    /// by the next drain. A refused re-post never costs the message that
    /// was in the slot (it was copied out first).
    pub(crate) deferred: Vec<u64>,
    /// Test hook: this many upcoming re-posts are refused as if the SRQ
    /// were full.
    #[cfg(test)]
    pub(crate) refuse_reposts: u32,
}

pub(crate) fn run_progress<N: Nic>(
    eng: std::sync::Weak<dyn MsgHost<N>>,
    stop: &std::sync::atomic::AtomicBool,
    idle_sleep: Duration,
) {
    let mut wait = crate::engine::idle::IdleWait::new(idle_sleep);
    while !stop.load(Ordering::Acquire) {
        let Some(e) = eng.upgrade() else {
            return;
        };
        let n = match e.msg_slot().0.get() {
            Some(m) => m.progress(&*e).unwrap_or(0),
            None => 0,
        };
        drop(e);
        wait.after(n);
    }
}

impl<N: Nic> MsgNode<N> {
    /// The node's messaging host, made on first use.
    pub(crate) fn get(eng: &dyn MsgHost<N>) -> Result<Arc<MsgNode<N>>, MsgError> {
        if eng.forked.load(Ordering::Relaxed) {
            return Err(MsgError::Unsupported {
                reason: "a forked child does not receive (the parent owns the SRQ)",
            });
        }
        let (slot, init) = eng.msg_slot();
        if let Some(m) = slot.get() {
            return Ok(m.clone());
        }
        let (srq, cq, _, _) = eng.msg_rx()?;
        let _guard = init.lock();
        if let Some(m) = slot.get() {
            return Ok(m.clone());
        }
        let cfg = eng.cfg.msg.clone();
        let depth = eng.cfg.recv_depth;
        if cfg.ctl_slots >= depth
            || cfg.window == 0
            || cfg.reply_window == 0
            || cfg.control_window == 0
        {
            return Err(MsgError::Config(format!(
                "ctl_slots {} must be below recv_depth {depth}; windows non-zero",
                cfg.ctl_slots
            )));
        }
        if (eng.policy.max_inline) < HEADER_LEN {
            return Err(MsgError::Unsupported {
                reason: "the device's inline limit is below the message header",
            });
        }
        let slot_len = HEADER_LEN + cfg.inline_max;
        let mr = eng
            .nic
            .alloc_mr(&eng.pd, slot_len * depth as usize, Access::LOCAL_WRITE)
            .map_err(MsgError::nic("allocate the receive buffers"))?;
        let bufs = OwnedMr::new(mr, &eng.nic, &eng.mrs);
        for i in 0..depth {
            let sge = MemoryRegion::sge(&*bufs, i as usize * slot_len, slot_len as u32)
                .map_err(MsgError::nic("a receive buffer"))?;
            srq.post_recv(&[RecvWr::new(u64::from(i), sge)])
                .map_err(|e| MsgError::Vqp(VqpError::Post(e)))?;
        }
        let node = Arc::new(MsgNode {
            budget: Mutex::new(depth - cfg.ctl_slots),
            cfg,
            slot_len,
            ring_len: slot_len * (eng.cfg.vqp_depth as usize + 1),
            bufs,
            srq,
            cq,
            recv: Mutex::new(Receiving::default()),
            ports: RwLock::new(HashMap::new()),
            endpoints: RwLock::new(HashMap::new()),
            counters: Counters::default(),
            thread: Mutex::new(None),
            next_only: AtomicU32::new(1 << crate::wrid::VQP_ID_BITS),
        });
        let _ = slot.set(node.clone());
        if node.cfg.progress_thread {
            let me = eng.msg_host().ok_or(MsgError::Unsupported {
                reason: "the engine is being dropped",
            })?;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flag, weak, sleep) = (stop.clone(), Arc::downgrade(&me), node.cfg.idle_sleep);
            let handle = std::thread::Builder::new()
                .name("krcore-msg".into())
                .spawn(move || run_progress(weak, &flag, sleep))
                .map_err(|e| MsgError::Config(format!("spawn the messaging thread: {e}")))?;
            *node.thread.lock() = Some(Worker {
                stop,
                handle: Some(handle),
            });
        }
        Ok(node)
    }

    /// A staging ring for inline sends: `vqp_depth + 1` slots of a receive
    /// slot's size, used round-robin ([`MsgNode::ring_slot`]). A slot is
    /// written again `vqp_depth + 1` posts of its VQP later, BEFORE that post
    /// is checked for room: at that moment the `vqp_depth` WRs in between
    /// may all be outstanding, so (a VQP holds at most `vqp_depth`, retired
    /// in order) the WR that used the slot was retired. With only
    /// `vqp_depth` slots it could still be outstanding: a NIC reading it
    /// late, or a recovery re-posting it, would send the newer message.
    pub(crate) fn staging_ring(&self, eng: &dyn MsgHost<N>) -> Result<OwnedMr<N>, MsgError> {
        let slots = eng.cfg.vqp_depth as usize + 1;
        let mr = eng
            .nic
            .alloc_mr(&eng.pd, slots * self.slot_len, Access::LOCAL_WRITE)
            .map_err(MsgError::nic("allocate a send staging ring"))?;
        Ok(OwnedMr::new(mr, &eng.nic, &eng.mrs))
    }

    /// The offset of the next staging slot (every post of the VQP counts).
    pub(crate) fn ring_slot(&self, posts: &mut u64) -> usize {
        let slots = self.ring_len / self.slot_len;
        let off = (*posts % slots as u64) as usize * self.slot_len;
        *posts += 1;
        off
    }

    pub(crate) fn reserve(&self, n: u32) -> Result<(), MsgError> {
        let mut b = self.budget.lock();
        if *b < n {
            return Err(MsgError::NoBuffers {
                wanted: n,
                free: *b,
            });
        }
        *b -= n;
        Ok(())
    }

    pub(crate) fn unreserve(&self, n: u32) {
        *self.budget.lock() += n;
    }

    pub(crate) fn stats(&self) -> MsgStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MsgStats {
            received: l(&c.received),
            inline_delivered: l(&c.inline_delivered),
            descriptors_delivered: l(&c.descriptors_delivered),
            pulled: l(&c.pulled),
            control: l(&c.control),
            granted: l(&c.granted),
            refused: l(&c.refused),
            out_of_order: l(&c.out_of_order),
            malformed: l(&c.malformed),
            orphaned: l(&c.orphaned),
            recv_errors: l(&c.recv_errors),
            send_errors: l(&c.send_errors),
            progress_errors: l(&c.progress_errors),
            reposts_deferred: l(&c.reposts_deferred),
            credits_deferred: l(&c.credits_deferred),
            releases_deferred: l(&c.releases_deferred),
            closed: l(&c.closed),
            reclaimed: l(&c.reclaimed),
            replaced: l(&c.replaced),
            open_resent: l(&c.open_resent),
            credits_asked: l(&c.credits_asked),
        }
    }

    /// Drains the receive CQ (one thread at a time; others return 0 at
    /// once) and demultiplexes what arrived.
    pub(crate) fn progress(&self, eng: &dyn MsgHost<N>) -> Result<usize, MsgError> {
        let Some(mut receiving) = self.recv.try_lock() else {
            return Ok(0);
        };
        let rx = &mut *receiving;
        eng.forget_restarted_peers();
        if !rx.deferred.is_empty() {
            for slot in std::mem::take(&mut rx.deferred) {
                self.repost(rx, slot);
            }
        }
        let mut wcs = [Wc::default(); 16];
        let mut total = 0;
        let mut first_error = None;
        loop {
            let k = self
                .cq
                .poll(&mut wcs)
                .map_err(MsgError::nic("poll the receive CQ"))?;
            // Every polled completion is handled, whatever fails for one of
            // them: a completion is polled once.
            for wc in &wcs[..k] {
                if let Err(e) = self.handle(eng, rx, wc) {
                    bump(&self.counters.progress_errors);
                    first_error.get_or_insert(e);
                }
            }
            total += k;
            if k < wcs.len() {
                return match first_error {
                    Some(e) => Err(e),
                    None => Ok(total),
                };
            }
        }
    }

    /// Posts receive slot `slot` on the SRQ again; a refused post (the SRQ
    /// can report itself full for a moment while a sender is taking a
    /// buffer) leaves it in `rx.deferred` for the next drain.
    pub(crate) fn repost(&self, rx: &mut Receiving, slot: u64) {
        #[cfg(test)]
        if rx.refuse_reposts > 0 {
            rx.refuse_reposts -= 1;
            bump(&self.counters.reposts_deferred);
            rx.deferred.push(slot);
            return;
        }
        let off = slot as usize * self.slot_len;
        let posted = self
            .bufs
            .sge(off, self.slot_len as u32)
            .is_ok_and(|sge| self.srq.post_recv(&[RecvWr::new(slot, sge)]).is_ok());
        if !posted {
            bump(&self.counters.reposts_deferred);
            rx.deferred.push(slot);
        }
    }

    /// Handles one receive completion. Whatever fails, a message that
    /// arrived intact is delivered (a polled completion is never lost: the
    /// channel's next message would otherwise overtake it).
    pub(crate) fn handle(
        &self,
        eng: &dyn MsgHost<N>,
        rx: &mut Receiving,
        wc: &Wc,
    ) -> Result<(), MsgError> {
        bump(&self.counters.received);
        let slot = wc.wr_id as usize;
        let off = slot * self.slot_len;
        if !wc.status.is_ok() {
            bump(&self.counters.recv_errors);
            self.repost(rx, wc.wr_id);
            return Ok(());
        }
        // The header, then the body straight into its own buffer (one copy
        // out of the receive slot).
        let len = (wc.byte_len as usize).min(self.slot_len);
        let mut head = [0u8; HEADER_LEN];
        let mut body = vec![0u8; len.saturating_sub(HEADER_LEN)];
        let head_len = len.min(HEADER_LEN);
        let read = self
            .bufs
            .read(off, &mut head[..head_len])
            .and_then(|()| self.bufs.read(off + HEADER_LEN, &mut body))
            .map_err(MsgError::nic("read a receive buffer"));
        let parsed = MsgPacket::new_checked(&head[..head_len])
            .and_then(|p| MsgRepr::parse_with_body(&p, body.len()));
        // The buffer goes back to the SRQ whatever happens next (or to the
        // deferred list: the message, copied out above, is delivered anyway).
        self.repost(rx, wc.wr_id);
        read?;
        let Ok(m) = parsed else {
            bump(&self.counters.malformed);
            return Ok(());
        };
        let Some(imm) = wc.imm else {
            bump(&self.counters.malformed);
            return Ok(());
        };
        match m.dst {
            MsgDst::Port(p) => self.to_port(
                eng,
                m,
                p,
                Sender {
                    gid: m.src,
                    vqp: imm,
                },
                body,
            ),
            MsgDst::Vqp { vqp, from } => {
                self.to_endpoint(m, vqp, from, body);
                Ok(())
            }
        }
    }

    pub(crate) fn to_port(
        &self,
        eng: &dyn MsgHost<N>,
        m: MsgRepr,
        p: u16,
        from: Sender,
        body: Vec<u8>,
    ) -> Result<(), MsgError> {
        let port = self.ports.read().get(&p).cloned();
        match m.kind {
            MsgKind::Open {
                window,
                reply_window,
                dct_num,
                dc_key,
                carries,
            } => {
                bump(&self.counters.control);
                learn_sender(eng.dev(), m.src, dct_num, dc_key);
                let reserved =
                    p >= FIRST_RESERVED_PORT || port.as_ref().is_some_and(|q| q.reclaims);
                let mut reclaimed = Vec::new();
                let mut replaced = false;
                let carried = carries.map(|c| (c, body));
                let only = carries.is_some_and(|c| c.only);
                let (answer, delivered, total) = match &port {
                    None => (MsgKind::Refuse(RefuseCode::Unbound), false, None),
                    Some(port) => port.admit(
                        from,
                        Opener { dct_num, dc_key },
                        (window, reply_window),
                        reserved.then_some(self.cfg.control_idle),
                        &mut reclaimed,
                        &mut replaced,
                        carried,
                    ),
                };
                if replaced {
                    bump(&self.counters.replaced);
                    tracing::info!(
                        peer = %from.gid,
                        vqp = from.vqp,
                        port = p,
                        "a channel opened by another process at its sender's GID: the old one dropped"
                    );
                }
                if delivered {
                    bump(&self.counters.inline_delivered);
                } else if carries.is_some() && (only || !matches!(answer, MsgKind::Grant { .. })) {
                    // Not delivered: a refused Open says so to its sender
                    // (not an "only" one: nobody waits for its answer).
                    bump(&self.counters.orphaned);
                }
                // Each reclaimed sender is told (best effort: one that
                // does not hear it finds out at its next push, answered
                // `Reclaimed` below).
                for s in reclaimed {
                    bump(&self.counters.reclaimed);
                    let refuse = MsgRepr {
                        src: eng.nic.gid(),
                        dst: MsgDst::Vqp {
                            vqp: s.vqp,
                            from: p,
                        },
                        kind: MsgKind::Refuse(RefuseCode::Reclaimed),
                    };
                    let _ = self.send_ctl(eng, s.gid, &refuse);
                }
                match answer {
                    MsgKind::Grant { .. } => bump(&self.counters.granted),
                    _ => bump(&self.counters.refused),
                }
                // The sender of an only message waits for no answer.
                if only {
                    return Ok(());
                }
                let reply = MsgRepr {
                    src: eng.nic.gid(),
                    dst: MsgDst::Vqp {
                        vqp: from.vqp,
                        from: p,
                    },
                    kind: answer,
                };
                self.send_ctl(eng, from.gid, &reply)?;
                if let Some(total) = total {
                    let credit = MsgRepr {
                        kind: MsgKind::Credit { total },
                        ..reply
                    };
                    self.send_ctl(eng, from.gid, &credit)?;
                }
                Ok(())
            }
            MsgKind::Release { token } => {
                bump(&self.counters.control);
                if let Some(port) = port {
                    port.state.lock().released.push(token);
                }
                Ok(())
            }
            MsgKind::Close => {
                bump(&self.counters.control);
                // A Close for a channel the port does not know (unbound
                // and bound again, or a repeated Close) has nothing to free.
                if port.is_some_and(|port| port.close(from)) {
                    bump(&self.counters.closed);
                }
                Ok(())
            }
            MsgKind::Credit { total } => {
                bump(&self.counters.control);
                if let Some(port) = port {
                    let mut st = port.state.lock();
                    let ok = st
                        .channels
                        .get_mut(&from)
                        .is_some_and(|c| c.reply.credit_total(total).is_ok());
                    if !ok {
                        bump(&self.counters.malformed);
                    }
                }
                Ok(())
            }
            // The engine's reserved ports take inline messages only (their
            // payloads are small; a descriptor would make the serving
            // step READ from a peer): a descriptor there is dropped.
            MsgKind::Desc { .. } if p >= FIRST_RESERVED_PORT => {
                bump(&self.counters.malformed);
                Ok(())
            }
            MsgKind::Data { seq, .. } | MsgKind::Desc { seq, .. } => {
                // A message for a port unbound since it granted the
                // channel: not delivered, and its sender is told (its next
                // push fails with `Refused { code: Unbound }`).
                // On a reserved port still bound, an unknown channel is
                // one the port reclaimed (see `PortShared::admit`).
                let orphan = |this: &MsgNode<N>, code: RefuseCode| {
                    bump(&this.counters.orphaned);
                    let refuse = MsgRepr {
                        src: eng.nic.gid(),
                        dst: MsgDst::Vqp {
                            vqp: from.vqp,
                            from: p,
                        },
                        kind: MsgKind::Refuse(code),
                    };
                    this.send_ctl(eng, from.gid, &refuse)
                };
                let Some(port) = port else {
                    return orphan(self, RefuseCode::Unbound);
                };
                let body = self.delivered_body(&m.kind, body);
                let mut st = port.state.lock();
                let Some(c) = st.channels.get_mut(&from) else {
                    let code = if reserved_bound(p, st.bound) {
                        RefuseCode::Reclaimed
                    } else {
                        RefuseCode::Unbound
                    };
                    drop(st);
                    return orphan(self, code);
                };
                c.last = Instant::now();
                if c.seq.accept(seq).is_err() {
                    bump(&self.counters.out_of_order);
                }
                st.ring.push_back(Message {
                    from,
                    port: p,
                    seq,
                    body,
                });
                Ok(())
            }
            _ => {
                bump(&self.counters.malformed);
                Ok(())
            }
        }
    }

    pub(crate) fn to_endpoint(&self, m: MsgRepr, vqp: u32, from: u16, body: Vec<u8>) {
        let Some(ep) = self.endpoints.read().get(&vqp).cloned() else {
            bump(&self.counters.orphaned);
            return;
        };
        let key = (m.src, from);
        let mut st = ep.state.lock();
        match m.kind {
            MsgKind::Grant { window } => {
                bump(&self.counters.control);
                if let Some(c) = st.channels.get_mut(&key) {
                    c.answered(Ok(window));
                    // A Grant of an open channel asks for the reply
                    // credits again: the next settle sends them.
                    st.credits_owed |= c.resend_total;
                }
            }
            MsgKind::Refuse(code) => {
                bump(&self.counters.control);
                if let Some(c) = st.channels.get_mut(&key) {
                    c.answered(Err(code));
                }
            }
            MsgKind::Credit { total } => {
                bump(&self.counters.control);
                let ok = st.channels.get_mut(&key).is_some_and(|c| c.credited(total));
                if !ok {
                    bump(&self.counters.malformed);
                }
            }
            MsgKind::Release { token } => {
                bump(&self.counters.control);
                st.released.push(token);
            }
            MsgKind::Data { seq, .. } | MsgKind::Desc { seq, .. } => {
                let Some(c) = st.channels.get_mut(&key) else {
                    bump(&self.counters.orphaned);
                    return;
                };
                if c.reply_seq.accept(seq).is_err() {
                    bump(&self.counters.out_of_order);
                }
                let body = self.delivered_body(&m.kind, body);
                st.replies.push_back(Message {
                    from: Sender { gid: m.src, vqp: 0 },
                    port: from,
                    seq,
                    body,
                });
            }
            MsgKind::Open { .. } | MsgKind::Close => bump(&self.counters.malformed),
        }
    }

    /// The body of a data message or reply delivered with `kind`: its
    /// bytes when they came inline, its descriptor (pulled by the pop)
    /// otherwise; counted either way.
    fn delivered_body(&self, kind: &MsgKind, body: Vec<u8>) -> Body<N> {
        match *kind {
            MsgKind::Desc { len, desc, .. } => {
                bump(&self.counters.descriptors_delivered);
                Body::Pending { len, desc }
            }
            _ => {
                bump(&self.counters.inline_delivered);
                Body::Inline(body)
            }
        }
    }
}

/// Whether port `p` is one of the engine's reserved ports and bound.
fn reserved_bound(p: u16, bound: bool) -> bool {
    bound && p >= FIRST_RESERVED_PORT
}

/// An Open names its sender's DCT: answers go there. A sender this node
/// has no entry for (a compute node registers nowhere) is cached with the
/// lowest epoch (0), so that any meta entry replaces it and it never
/// replaces one; it is dropped like any entry when a send to it fails.
/// Trust: as the rest of a cluster's control plane, the header's source
/// is believed (DC carries no verified source).
///
/// A cached entry naming another DCT is stale: a node has one DCT for its
/// life, so its GID now belongs to a new process (a restarted client, a
/// process at an address an earlier one used), and answers sent to the old
/// DCT would be lost until they failed. The entry is replaced by the
/// learned one (epoch 0: a meta entry, the new process's registration,
/// replaces it in turn).
fn learn_sender<N: Nic>(eng: &Device<N>, gid: Gid, dct_num: u32, dc_key: u64) {
    if dct_num == 0 {
        return;
    }
    if let Some(old_dct) = eng.forget_other_address(&gid, dct_num) {
        tracing::info!(
            peer = %gid,
            old_dct,
            new_dct = dct_num,
            "a peer restarted on its GID: its cached DCT is replaced"
        );
    } else if eng.cache.get(&gid).is_some() {
        return;
    }
    let _ = eng.cache.insert(
        krcore_nic::DcTarget {
            gid,
            dct_num,
            dc_key,
        },
        0,
    );
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
