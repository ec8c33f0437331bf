//! A UD endpoint: one UD QP, a receive CQ and a send CQ, and one
//! registered buffer cut into receive and send slots. Used where no
//! connection exists yet: the RC fallback's handshake endpoint (kmod), the
//! RACE memory servers' allocation RPC and the elastic driver's RC
//! baseline. (The meta server's requests no longer travel over UD: they
//! are two-sided messages to an engine, see `krcore_kmod::MsgMetaHost`.)
//!
//! ```text
//! buffer: [recv slot 0] .. [recv slot R-1] [send slot 0] .. [send slot S-1]
//!         each SLOT_LEN bytes; a receive lands as GRH (40 B) + message
//! ```
//!
//! Invariants:
//! - Every receive slot is posted exactly once at any time: a slot is
//!   re-posted only after its completion was polled, never after a flush
//!   (the QP is in ERR then, and the endpoint's recovery re-posts them all).
//! - Every send is signaled and uses send slot `seq % S`; a send is posted
//!   only with a free credit, so the slot's previous send has completed (a
//!   UD QP completes in order) and its bytes are no longer needed.
//! - Both CQs are at least as deep as what can be outstanding on them, so
//!   they never overflow.

use crate::error::{Ctx, MetaResult};
use crate::wire::{Repr, MAX_MESSAGE_LEN};
use krcore_nic::{Access, PostErrorKind};
use krcore_nic::{
    CompletionQueue, Destination, Gid, MemoryRegion, Nic, QpCaps, QpInit, QpState, QpType,
    QueuePair, RecvWr, SendWr, Transition, UdTarget, Wc, WcStatus, GRH_LEN,
};

/// Bytes of one buffer slot: a GRH and the longest message, rounded up.
pub const SLOT_LEN: usize = 256;
/// The longest datagram [`UdEndpoint::send_bytes`] carries.
pub const MAX_DATAGRAM: usize = SLOT_LEN - GRH_LEN;
const _: () = assert!(GRH_LEN + MAX_MESSAGE_LEN <= SLOT_LEN);

/// Receive completions taken per poll.
const POLL_BATCH: usize = 32;

/// One received datagram, copied out of its slot.
#[derive(Clone, Copy)]
pub struct Incoming {
    /// Source GID, from the GRH.
    pub src: Gid,
    /// Source QP number, from the completion.
    pub src_qp: u32,
    len: usize,
    bytes: [u8; SLOT_LEN],
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("src", &self.src)
            .field("src_qp", &self.src_qp)
            .field("len", &self.len)
            .finish()
    }
}

impl Incoming {
    /// The message after the GRH.
    pub fn payload(&self) -> &[u8] {
        &self.bytes[GRH_LEN..GRH_LEN + self.len]
    }
}

/// What the endpoint saw (totals since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdCounters {
    /// Datagrams received and handed out.
    pub received: u64,
    /// Receives shorter than a GRH (dropped).
    pub runts: u64,
    /// Receive completions with an error status.
    pub recv_errors: u64,
    /// Datagrams sent.
    pub sent: u64,
    /// Sends refused (too long, or the message did not encode).
    pub send_errors: u64,
    /// Sends given up for lack of a free send slot.
    pub no_credit: u64,
    /// Times the QP was found in ERR and brought back.
    pub recoveries: u64,
}

impl<N: Nic> std::fmt::Debug for UdEndpoint<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdEndpoint")
            .field("qpn", &self.qp.qpn())
            .field("counters", &self.counters)
            .finish()
    }
}

/// A UD QP with its own receive and send CQs and one registered buffer cut
/// into slots (see the module docs): a small request/reply endpoint.
pub struct UdEndpoint<N: Nic> {
    qp: N::Qp,
    recv_cq: N::Cq,
    send_cq: N::Cq,
    mr: N::Mr,
    qkey: u32,
    recv_slots: u32,
    send_slots: u32,
    next_send: u64,
    wcs: Vec<Wc>,
    /// What the endpoint saw.
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
    ) -> MetaResult<UdEndpoint<N>> {
        let max = nic.caps().max_qp_wr;
        for (what, n) in [("receive slots", recv_slots), ("send slots", send_slots)] {
            if n == 0 || n > max {
                return Err(crate::MetaError::Config(format!(
                    "{n} UD {what}: must be in 1..={max}"
                )));
            }
        }
        let recv_cq = nic
            .create_cq(recv_slots.saturating_mul(2))
            .ctx("create UD receive CQ")?;
        let send_cq = nic.create_cq(send_slots).ctx("create UD send CQ")?;
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
            .ctx("create UD QP")?;
        let len = (recv_slots as usize + send_slots as usize) * SLOT_LEN;
        let mr = nic
            .alloc_mr(pd, len, Access::LOCAL_WRITE)
            .ctx("register UD buffers")?;
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

    fn bring_up(&mut self) -> MetaResult<()> {
        self.qp
            .modify(Transition::Init {
                access: Access::NONE,
                qkey: self.qkey,
            })
            .ctx("UD QP to INIT")?;
        self.qp
            .modify(Transition::Rtr { peer: None })
            .ctx("UD QP to RTR")?;
        self.qp
            .modify(Transition::Rts {
                rnr_retry: 0,
                retry_cnt: 0,
            })
            .ctx("UD QP to RTS")?;
        let wrs = (0..self.recv_slots)
            .map(|i| self.recv_wr(i))
            .collect::<MetaResult<Vec<_>>>()?;
        self.qp.post_recv(&wrs).ctx("post UD receives")
    }

    fn recv_wr(&self, slot: u32) -> MetaResult<RecvWr> {
        let sge = self
            .mr
            .sge(slot as usize * SLOT_LEN, SLOT_LEN as u32)
            .ctx("receive slot SGE")?;
        Ok(RecvWr::new(u64::from(slot), sge))
    }

    /// Brings a QP found in ERR back: discards every completion (flushes and
    /// receives not yet polled: their senders retry), resets the QP, brings
    /// it up and re-posts every receive slot.
    fn recover(&mut self) -> MetaResult<()> {
        self.counters.recoveries += 1;
        while self
            .recv_cq
            .poll(&mut self.wcs)
            .ctx("drain UD receive CQ")?
            > 0
        {}
        while self.send_cq.poll(&mut self.wcs).ctx("drain UD send CQ")? > 0 {}
        self.qp.modify(Transition::Reset).ctx("reset UD QP")?;
        self.bring_up()
    }

    /// Polls send completions, freeing send slots.
    fn reap_sends(&mut self) -> MetaResult<()> {
        loop {
            let n = self.send_cq.poll(&mut self.wcs).ctx("poll UD send CQ")?;
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
    /// Provider failures (CQ overflow, a refused post).
    pub fn send(&mut self, dest: UdTarget, msg: &Repr) -> MetaResult<bool> {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let Ok(len) = msg.emit(&mut buf) else {
            // Unreachable: every message fits MAX_MESSAGE_LEN.
            self.counters.send_errors += 1;
            return Ok(false);
        };
        self.send_bytes(dest, &buf[..len])
    }

    /// Sends the raw datagram `bytes` (at most [`MAX_DATAGRAM`] bytes) to
    /// `dest`, like [`UdEndpoint::send`]; for other protocols than meta's
    /// (the RACE memory node's block allocation uses it).
    ///
    /// # Errors
    /// Provider failures; `MetaError::Nic`-style context when `bytes` is too
    /// long.
    pub fn send_bytes(&mut self, dest: UdTarget, bytes: &[u8]) -> MetaResult<bool> {
        self.reap_sends()?;
        if self.qp.state() == QpState::Err {
            self.recover()?;
        }
        if self.qp.send_credits() == 0 {
            self.counters.no_credit += 1;
            return Ok(false);
        }
        if bytes.len() > MAX_DATAGRAM {
            self.counters.send_errors += 1;
            return Ok(false);
        }
        let buf = bytes;
        let len = bytes.len();
        let slot = self.recv_slots as u64 + self.next_send % u64::from(self.send_slots);
        let off = slot as usize * SLOT_LEN;
        self.mr
            .write(off, &buf[..len])
            .ctx("copy message to send slot")?;
        let sge = self.mr.sge(off, len as u32).ctx("send slot SGE")?;
        let wr = SendWr::send(self.next_send, sge, None).to(Destination::Ud(dest));
        match self.qp.post_send(&[wr]) {
            Ok(()) => {}
            Err(e) if matches!(e.kind, PostErrorKind::QueueFull { .. }) => {
                self.counters.no_credit += 1;
                return Ok(false);
            }
            Err(e) => return Err(e).ctx("post UD send"),
        }
        self.next_send += 1;
        self.counters.sent += 1;
        Ok(true)
    }

    /// Polls up to one batch of receive completions, appending each
    /// datagram to `out`, and re-posts the slots. Returns how many
    /// completions were polled (including errors and runts).
    ///
    /// # Errors
    /// Provider failures (CQ overflow, a refused post).
    pub fn poll_recv(&mut self, out: &mut Vec<Incoming>) -> MetaResult<usize> {
        let n = self.recv_cq.poll(&mut self.wcs).ctx("poll UD receive CQ")?;
        let mut repost = Vec::with_capacity(n);
        let mut flushed = false;
        for i in 0..n {
            let wc = self.wcs[i];
            let slot = wc.wr_id;
            if slot >= u64::from(self.recv_slots) {
                // Not one of ours: cannot be re-posted.
                self.counters.recv_errors += 1;
                continue;
            }
            if wc.status == WcStatus::WrFlushErr {
                self.counters.recv_errors += 1;
                flushed = true;
                continue;
            }
            repost.push(self.recv_wr(slot as u32)?);
            if wc.status != WcStatus::Success {
                self.counters.recv_errors += 1;
                continue;
            }
            let len = (wc.byte_len as usize).min(SLOT_LEN);
            if len < GRH_LEN {
                self.counters.runts += 1;
                continue;
            }
            let mut m = Incoming {
                src: Gid([0; 16]),
                src_qp: wc.src_qp,
                len: len - GRH_LEN,
                bytes: [0; SLOT_LEN],
            };
            self.mr
                .read(slot as usize * SLOT_LEN, &mut m.bytes[..len])
                .ctx("copy out receive slot")?;
            let mut grh = [0u8; GRH_LEN];
            grh.copy_from_slice(&m.bytes[..GRH_LEN]);
            // Not bytes 8..24: on RoCE v2 over IPv4 this area holds an IPv4
            // header instead of a GRH.
            m.src = krcore_nic::grh_source_gid(&grh);
            self.counters.received += 1;
            out.push(m);
        }
        // A QP that left RTS flushes the receives it holds (every slot is
        // always posted), so an idle poll (nothing polled) asks the device
        // nothing: no `ibv_query_qp` system call per idle progress call.
        if flushed || (n > 0 && self.qp.state() == QpState::Err) {
            // The QP left RTS: the reposts would only flush again.
            self.recover()?;
        } else if !repost.is_empty() {
            self.qp.post_recv(&repost).ctx("re-post UD receives")?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use krcore_nic::sim::{SimConfig, SimFabric, SimNic};

    fn endpoint(nic: &SimNic) -> UdEndpoint<SimNic> {
        let pd = nic.alloc_pd().unwrap();
        UdEndpoint::new(nic, &pd, 0x1234, 4, 4).unwrap()
    }

    /// Polls `ep` until a datagram arrives (bounded), returning its payload.
    fn receive(ep: &mut UdEndpoint<SimNic>) -> Vec<u8> {
        let mut got = Vec::new();
        for _ in 0..100_000 {
            ep.poll_recv(&mut got).unwrap();
            if let Some(m) = got.first() {
                return m.payload().to_vec();
            }
            std::thread::yield_now();
        }
        panic!("no datagram arrived");
    }

    /// An idle poll does not ask the device for the QP's state (see
    /// `poll_recv`): a QP that left RTS must still be found through the
    /// flushes of the receives it holds, and recovered by the next poll,
    /// with no traffic arriving meanwhile.
    #[test]
    fn an_idle_endpoint_whose_qp_fell_into_err_recovers_at_its_next_poll() {
        let f = SimFabric::in_memory();
        let (na, nb) = (
            SimNic::open(&f, SimConfig::default()).unwrap(),
            SimNic::open(&f, SimConfig::default()).unwrap(),
        );
        let (mut a, mut b) = (endpoint(&na), endpoint(&nb));
        let to_b = UdTarget {
            gid: nb.gid(),
            qpn: b.qpn(),
            qkey: 0x1234,
        };
        assert!(a.send_bytes(to_b, b"first").unwrap());
        assert_eq!(receive(&mut b), b"first");

        b.qp.modify(Transition::Err).unwrap();
        let mut got = Vec::new();
        let polled = b.poll_recv(&mut got).unwrap();
        assert!(polled > 0, "the flushed receives are what the poll sees");
        assert!(got.is_empty());
        assert_eq!(b.counters.recoveries, 1);
        assert_eq!(b.qp.state(), QpState::Rts);

        assert!(a.send_bytes(to_b, b"second").unwrap());
        assert_eq!(receive(&mut b), b"second");
        // Idle polls of a healthy endpoint recover nothing.
        for _ in 0..10 {
            assert_eq!(b.poll_recv(&mut got).unwrap(), 0);
        }
        assert_eq!(b.counters.recoveries, 1);
    }
}
