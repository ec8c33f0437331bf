//! A UD endpoint: one UD QP with a receive and a send CQ, and one registered
//! buffer cut into receive and send slots. The transport of the RC
//! handshake (and, on a fallback meta host, of the meta RPC).
//!
//! ```text
//! buffer: [recv slot 0] .. [recv slot R-1] [send slot 0] .. [send slot S-1]
//!         each SLOT_LEN bytes; a receive lands as GRH (40 B) + message
//! ```
//!
//! # Invariants
//!
//! - Every receive slot is posted exactly once at any time: it is re-posted
//!   only after its completion was polled, never after a flush (the QP is in
//!   ERR then, and `recover` re-posts them all).
//! - Every send is signaled and uses send slot `seq % S`; a send is posted
//!   only while the QP has a free credit, so the slot's previous send has
//!   completed (a UD QP completes in order) and its bytes are free.
//! - The receive CQ is twice as deep as the receive slots (receives plus
//!   their flushes), the send CQ as deep as the send slots: neither
//!   overflows.
//! - Datagrams are best effort, as on the wire: a send without a free slot
//!   is dropped and counted, and the protocols above retry.

use krcore_nic::{
    Access, CompletionQueue, Destination, Gid, MemoryRegion, Nic, PostErrorKind, QpCaps, QpInit,
    QpState, QpType, QueuePair, RecvWr, SendWr, Transition, UdTarget, Wc, WcStatus, GRH_LEN,
};

use super::error::EngineError;

/// Bytes of one buffer slot: a GRH and the longest message, rounded up.
pub(crate) const SLOT_LEN: usize = 256;
/// The longest message a datagram carries.
pub(crate) const MAX_DATAGRAM: usize = SLOT_LEN - GRH_LEN;

/// Receive completions taken per poll.
const POLL_BATCH: usize = 32;

/// One received datagram, copied out of its slot.
#[derive(Clone, Copy)]
pub(crate) struct Datagram {
    /// Source GID, from the GRH.
    pub src: Gid,
    /// Source QP number, from the completion.
    pub src_qp: u32,
    len: usize,
    bytes: [u8; MAX_DATAGRAM],
}

impl Datagram {
    /// The message (after the GRH).
    pub fn payload(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What the endpoint saw (totals since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UdCounters {
    pub received: u64,
    /// Receives shorter than a GRH, or error completions.
    pub bad_receives: u64,
    pub sent: u64,
    pub send_errors: u64,
    /// Sends given up for lack of a free send slot.
    pub no_credit: u64,
    /// Times the QP was found in ERR and brought back.
    pub recoveries: u64,
}

pub(crate) struct UdEndpoint<N: Nic> {
    qp: N::Qp,
    recv_cq: N::Cq,
    send_cq: N::Cq,
    mr: N::Mr,
    qkey: u32,
    recv_slots: u32,
    send_slots: u32,
    next_send: u64,
    wcs: Vec<Wc>,
    pub counters: UdCounters,
}

impl<N: Nic> UdEndpoint<N> {
    /// Creates the QP (brought to RTS with `qkey`), its CQs and buffer, and
    /// posts every receive slot.
    pub fn new(
        nic: &N,
        pd: &N::Pd,
        qkey: u32,
        recv_slots: u32,
        send_slots: u32,
    ) -> Result<UdEndpoint<N>, EngineError> {
        let max = nic.caps().max_qp_wr;
        for (what, n) in [("receive slots", recv_slots), ("send slots", send_slots)] {
            if n == 0 || n > max {
                return Err(EngineError::Config(format!(
                    "{n} UD {what}: must be in 1..={max}"
                )));
            }
        }
        let recv_cq = nic
            .create_cq(recv_slots.saturating_mul(2))
            .map_err(EngineError::nic("create the handshake receive CQ"))?;
        let send_cq = nic
            .create_cq(send_slots)
            .map_err(EngineError::nic("create the handshake send CQ"))?;
        let qp = nic
            .create_qp(
                pd,
                &QpInit {
                    qp_type: QpType::Ud,
                    caps: QpCaps {
                        max_send_wr: send_slots,
                        max_recv_wr: recv_slots,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                    },
                    send_cq: &send_cq,
                    recv_cq: &recv_cq,
                    srq: None,
                    dc_key: 0,
                },
            )
            .map_err(EngineError::nic("create the handshake UD QP"))?;
        let len = (recv_slots as usize + send_slots as usize) * SLOT_LEN;
        let mr = nic
            .alloc_mr(pd, len, Access::LOCAL_WRITE)
            .map_err(EngineError::nic("register the handshake buffers"))?;
        let mut ep = UdEndpoint {
            qp,
            recv_cq,
            send_cq,
            mr,
            qkey,
            recv_slots,
            send_slots,
            next_send: 0,
            wcs: vec![Wc::default(); POLL_BATCH],
            counters: UdCounters::default(),
        };
        ep.bring_up()?;
        Ok(ep)
    }

    /// The QP number peers send to.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    fn bring_up(&mut self) -> Result<(), EngineError> {
        let nic = EngineError::nic;
        self.qp
            .modify(Transition::Init {
                access: Access::NONE,
                qkey: self.qkey,
            })
            .map_err(nic("handshake UD QP to INIT"))?;
        self.qp
            .modify(Transition::Rtr { peer: None })
            .map_err(nic("handshake UD QP to RTR"))?;
        self.qp
            .modify(Transition::Rts {
                rnr_retry: 0,
                retry_cnt: 0,
            })
            .map_err(nic("handshake UD QP to RTS"))?;
        let wrs = (0..self.recv_slots)
            .map(|i| self.recv_wr(i))
            .collect::<Result<Vec<_>, _>>()?;
        self.qp
            .post_recv(&wrs)
            .map_err(EngineError::post("post the handshake receives"))
    }

    fn recv_wr(&self, slot: u32) -> Result<RecvWr, EngineError> {
        let sge = self
            .mr
            .sge(slot as usize * SLOT_LEN, SLOT_LEN as u32)
            .map_err(EngineError::nic("handshake receive slot"))?;
        Ok(RecvWr::new(u64::from(slot), sge))
    }

    /// Brings a QP found in ERR back: discards every completion (their
    /// senders retry), resets the QP, brings it up, re-posts every slot.
    fn recover(&mut self) -> Result<(), EngineError> {
        self.counters.recoveries += 1;
        let nic = EngineError::nic;
        while self
            .recv_cq
            .poll(&mut self.wcs)
            .map_err(nic("drain the handshake receive CQ"))?
            > 0
        {}
        while self
            .send_cq
            .poll(&mut self.wcs)
            .map_err(nic("drain the handshake send CQ"))?
            > 0
        {}
        self.qp
            .modify(Transition::Reset)
            .map_err(nic("reset the handshake UD QP"))?;
        self.bring_up()
    }

    fn reap_sends(&mut self) -> Result<(), EngineError> {
        loop {
            let n = self
                .send_cq
                .poll(&mut self.wcs)
                .map_err(EngineError::nic("poll the handshake send CQ"))?;
            for wc in &self.wcs[..n] {
                if wc.status != WcStatus::Success {
                    self.counters.send_errors += 1;
                }
            }
            if n < self.wcs.len() {
                return Ok(());
            }
        }
    }

    /// Sends `msg` to `dest` from a free send slot. Returns `false` (and
    /// counts it) when no slot is free even after polling the send CQ: the
    /// datagram is not sent, as if the network had lost it.
    ///
    /// # Errors
    /// `Config` for a message longer than [`MAX_DATAGRAM`]; provider
    /// failures (CQ overflow, a refused post).
    pub fn send(&mut self, dest: UdTarget, msg: &[u8]) -> Result<bool, EngineError> {
        if msg.len() > MAX_DATAGRAM {
            return Err(EngineError::Config(format!(
                "a datagram of {} bytes exceeds {MAX_DATAGRAM}",
                msg.len()
            )));
        }
        self.reap_sends()?;
        if self.qp.state() == QpState::Err {
            self.recover()?;
        }
        if self.qp.send_credits() == 0 {
            self.counters.no_credit += 1;
            return Ok(false);
        }
        let slot = u64::from(self.recv_slots) + self.next_send % u64::from(self.send_slots);
        let off = slot as usize * SLOT_LEN;
        self.mr
            .write(off, msg)
            .map_err(EngineError::nic("copy a datagram to its send slot"))?;
        let sge = self
            .mr
            .sge(off, msg.len() as u32)
            .map_err(EngineError::nic("handshake send slot"))?;
        let wr = SendWr::send(self.next_send, sge, None).to(Destination::Ud(dest));
        match self.qp.post_send(&[wr]) {
            Ok(()) => {}
            Err(e) if matches!(e.kind, PostErrorKind::QueueFull { .. }) => {
                self.counters.no_credit += 1;
                return Ok(false);
            }
            Err(e) => return Err(EngineError::post("post a handshake datagram")(e)),
        }
        self.next_send += 1;
        self.counters.sent += 1;
        Ok(true)
    }

    /// Polls up to one batch of receive completions, appending each
    /// datagram to `out`, and re-posts their slots. Returns how many
    /// completions were polled (errors included). Never blocks.
    ///
    /// # Errors
    /// Provider failures (CQ overflow, a refused post).
    pub fn poll_recv(&mut self, out: &mut Vec<Datagram>) -> Result<usize, EngineError> {
        let n = self
            .recv_cq
            .poll(&mut self.wcs)
            .map_err(EngineError::nic("poll the handshake receive CQ"))?;
        let mut repost = Vec::with_capacity(n);
        let mut flushed = false;
        for i in 0..n {
            let wc = self.wcs[i];
            let slot = wc.wr_id;
            if slot >= u64::from(self.recv_slots) {
                self.counters.bad_receives += 1;
                continue;
            }
            if wc.status == WcStatus::WrFlushErr {
                self.counters.bad_receives += 1;
                flushed = true;
                continue;
            }
            repost.push(self.recv_wr(slot as u32)?);
            let len = (wc.byte_len as usize).min(SLOT_LEN);
            if wc.status != WcStatus::Success || len < GRH_LEN {
                self.counters.bad_receives += 1;
                continue;
            }
            let mut grh = [0u8; GRH_LEN];
            let base = slot as usize * SLOT_LEN;
            self.mr
                .read(base, &mut grh)
                .map_err(EngineError::nic("copy out a GRH"))?;
            let mut d = Datagram {
                src: Gid([0; 16]),
                src_qp: wc.src_qp,
                len: len - GRH_LEN,
                bytes: [0; MAX_DATAGRAM],
            };
            self.mr
                .read(base + GRH_LEN, &mut d.bytes[..len - GRH_LEN])
                .map_err(EngineError::nic("copy out a datagram"))?;
            d.src = krcore_nic::grh_source_gid(&grh);
            self.counters.received += 1;
            out.push(d);
        }
        if flushed || self.qp.state() == QpState::Err {
            // The QP left RTS: re-posting would only flush again.
            self.recover()?;
        } else if !repost.is_empty() {
            self.qp
                .post_recv(&repost)
                .map_err(EngineError::post("re-post the handshake receives"))?;
        }
        Ok(n)
    }
}
