//! The meta client: one one-sided READ of the meta server's table bucket per
//! DCCache miss.
//!
//! The READ goes through a DC initiator the engine owns for its own traffic
//! (created at start, so a miss creates no QP), not through a data DCI: a
//! dead meta server fails the READ with `RETRY_EXC_ERR`, which moves the
//! initiator to ERR, and on a data DCI that would flush every other VQP's
//! work. The meta DCI is reset and brought up again after any failure.
//! Lookups serialize on the meta DCI's lock (each holds it for one READ round
//! trip, plus retries); the data path never takes it.
//!
//! # RC fallback mode
//!
//! Without DC the table is READ through an RC QP of the engine's own, paired
//! by a handshake with the meta node's handshake endpoint. The location
//! then reads differently: [`MetaLocation::server`]'s `dct_num` is the UD
//! QPN of that endpoint and its `dc_key` the endpoint's qkey (what a
//! fallback meta host, [`super::RcMetaHost`], publishes in its bootstrap;
//! the table's MR and the endpoint's passive QPs share one PD there, so the
//! READ passes the target's protection check). The QP is created at start
//! (a miss creates no QP) and paired at the first lookup; after a failed
//! READ it is reset and paired again by the next lookup (a new handshake:
//! the meta node's end entered ERR too).

use std::time::{Duration, Instant};

use krcore_meta::entry::EntryRepr;
use krcore_meta::table::{find_in_bucket, Geometry};
use krcore_meta::wire::BootstrapRepr;
use krcore_nic::{
    bring_up, Access, CompletionQueue, DcTarget, Destination, Gid, MemoryRegion, Nic, QpCaps,
    QpInit, QpType, QueuePair, RemoteAddr, SendWr, Transition, Wc, WcStatus,
};
use parking_lot::Mutex;

use super::error::{EngineError, MetaFailure};
use super::responder::HandshakeResponder;

/// Where the meta server's table is: what a client needs to READ it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaLocation {
    /// The server's DC target (the table is READ through it). In RC
    /// fallback mode: the meta node's handshake endpoint (`dct_num` = its
    /// UD QPN, `dc_key` = its qkey), see the module docs.
    pub server: DcTarget,
    /// Remote address and rkey of the table's first byte.
    pub table: RemoteAddr,
    /// The table's shape.
    pub geometry: Geometry,
}

impl MetaLocation {
    /// The location a bootstrap reply describes.
    ///
    /// # Errors
    /// [`EngineError::Bootstrap`] when the table's layout is not one this
    /// build reads.
    pub fn from_bootstrap(b: &BootstrapRepr) -> Result<MetaLocation, EngineError> {
        Ok(MetaLocation {
            server: b.server,
            table: b.table,
            geometry: b.geometry()?,
        })
    }
}

/// How lookups retry and wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MetaPolicy {
    /// READs after the first when the bucket is torn (or fails a checksum).
    pub retries: u32,
    /// First pause between READs; doubles up to 1 ms.
    pub backoff: Duration,
    /// Longest wait for one READ's completion.
    pub timeout: Duration,
}

/// Lookup statistics (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Table READs issued.
    pub reads: u64,
    /// READs repeated because the bucket was torn or failed a checksum.
    pub torn_retries: u64,
    /// Lookups that failed because the server did not answer.
    pub unavailable: u64,
    /// Resets of the meta QP after a failed READ.
    pub resets: u64,
    /// RC fallback mode: handshakes with the meta node.
    pub handshakes: u64,
}

/// The meta client's QP: a DCI, or an RC QP paired with the meta node.
enum MetaLink<N: Nic> {
    Dci,
    Rc {
        hs: HandshakeResponder<N>,
        /// The nonce of the pairing while the QP is paired (RTS).
        paired: Option<u64>,
    },
}

struct MetaDci<N: Nic> {
    qp: N::Qp,
    cq: N::Cq,
    buf: N::Mr,
    next_wr_id: u64,
    stats: MetaStats,
    link: MetaLink<N>,
}

pub(crate) struct MetaClient<N: Nic> {
    pub(crate) location: MetaLocation,
    policy: MetaPolicy,
    dci: Mutex<MetaDci<N>>,
}

impl<N: Nic> MetaClient<N> {
    /// A client READing through a DCI, or (with `hs`, RC fallback mode)
    /// through an RC QP paired with the meta node by `hs`.
    pub(crate) fn start(
        nic: &N,
        pd: &N::Pd,
        location: MetaLocation,
        policy: MetaPolicy,
        hs: Option<HandshakeResponder<N>>,
    ) -> Result<MetaClient<N>, EngineError> {
        if hs.is_some() {
            // Check the location names a handshake endpoint before use.
            super::rc::handshake_target(&location.server)?;
        }
        let cq = nic
            .create_cq(8)
            .map_err(EngineError::nic("create the meta CQ"))?;
        let qp = nic
            .create_qp(
                pd,
                &QpInit {
                    qp_type: if hs.is_some() {
                        QpType::Rc
                    } else {
                        QpType::Dci
                    },
                    caps: QpCaps {
                        max_send_wr: 4,
                        max_recv_wr: 0,
                        max_send_sge: 1,
                        max_recv_sge: 0,
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    dc_key: 0,
                },
            )
            .map_err(EngineError::nic("create the meta QP"))?;
        let link = match hs {
            // Paired at the first lookup.
            Some(hs) => MetaLink::Rc { hs, paired: None },
            None => {
                bring_up(&qp, Access::NONE, None)
                    .map_err(EngineError::nic("bring up the meta DCI"))?;
                MetaLink::Dci
            }
        };
        let buf = nic
            .alloc_mr(pd, location.geometry.bucket_len(), Access::LOCAL_WRITE)
            .map_err(EngineError::nic("allocate the meta READ buffer"))?;
        Ok(MetaClient {
            location,
            policy,
            dci: Mutex::new(MetaDci {
                qp,
                cq,
                buf,
                next_wr_id: 1,
                stats: MetaStats::default(),
                link,
            }),
        })
    }

    pub(crate) fn stats(&self) -> MetaStats {
        self.dci.lock().stats
    }

    /// RC fallback mode: tells the meta node the pair is going away (best
    /// effort), so that it frees its end.
    pub(crate) fn close(&self) {
        let mut dci = self.dci.lock();
        let qpn = dci.qp.qpn();
        if let MetaLink::Rc { hs, paired } = &mut dci.link {
            if let (Some(nonce), Ok(target)) = (
                paired.take(),
                super::rc::handshake_target(&self.location.server),
            ) {
                hs.close(qpn, target, nonce);
            }
        }
    }

    /// Looks `gid` up: `Ok(None)` when the table has no entry for it.
    ///
    /// # Errors
    /// [`EngineError::MetaUnavailable`], [`EngineError::MetaInconsistent`],
    /// [`EngineError::Nic`].
    pub(crate) fn lookup(&self, gid: &Gid) -> Result<Option<EntryRepr>, EngineError> {
        let loc = &self.location;
        let g = loc.geometry;
        let remote = loc.table.offset(g.bucket_offset(g.bucket_of(gid)));
        let len = g.bucket_len();
        let mut bytes = vec![0u8; len];
        let mut dci = self.dci.lock();
        let mut backoff = self.policy.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            dci.read_bucket(remote, &mut bytes, loc.server, self.policy.timeout)
                .map_err(|e| match e {
                    ReadError::Failed(failure) => {
                        EngineError::MetaUnavailable { gid: *gid, failure }
                    }
                    ReadError::Nic(e) => e,
                })?;
            match find_in_bucket(&bytes, gid) {
                Ok(found) => return Ok(found),
                Err(last) if !last.is_retryable() || attempts > self.policy.retries => {
                    return Err(EngineError::MetaInconsistent {
                        gid: *gid,
                        attempts,
                        last,
                    })
                }
                Err(_) => {}
            }
            dci.stats.torn_retries += 1;
            if !backoff.is_zero() {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(1));
            }
        }
    }
}

enum ReadError {
    Failed(MetaFailure),
    Nic(EngineError),
}

impl<N: Nic> MetaDci<N> {
    /// RC fallback mode: pairs the QP with the meta node if it is not.
    fn pair(&mut self, server: DcTarget) -> Result<(), ReadError> {
        let MetaLink::Rc { hs, paired } = &mut self.link else {
            return Ok(());
        };
        if paired.is_some() {
            return Ok(());
        }
        self.stats.handshakes += 1;
        let target = super::rc::handshake_target(&server).map_err(ReadError::Nic)?;
        match super::rc::pair_with(hs, &self.qp, target) {
            Ok(nonce) => {
                *paired = Some(nonce);
                Ok(())
            }
            Err(EngineError::Handshake { failure, .. }) => {
                self.stats.unavailable += 1;
                Err(ReadError::Failed(MetaFailure::Handshake(failure)))
            }
            Err(e) => Err(ReadError::Nic(e)),
        }
    }

    /// One READ of `out.len()` bytes at `remote`, waited for.
    fn read_bucket(
        &mut self,
        remote: RemoteAddr,
        out: &mut [u8],
        server: DcTarget,
        timeout: Duration,
    ) -> Result<(), ReadError> {
        let nic = |op| move |e| ReadError::Nic(EngineError::nic(op)(e));
        self.pair(server)?;
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let sge = self
            .buf
            .sge(0, out.len() as u32)
            .map_err(nic("meta READ buffer"))?;
        let dest = match self.link {
            MetaLink::Dci => Destination::Dc(server),
            MetaLink::Rc { .. } => Destination::Connected,
        };
        let wr = SendWr::read(wr_id, sge, remote).to(dest);
        self.stats.reads += 1;
        if let Err(e) = self.qp.post_send(&[wr]) {
            // Not in RTS (a reset that failed half way): re-arm and report.
            self.rearm().map_err(nic("re-arm the meta QP"))?;
            return Err(ReadError::Nic(EngineError::Config(format!(
                "meta QP refused the READ: {e}"
            ))));
        }
        let start = Instant::now();
        let mut wc = [Wc::default()];
        let status = loop {
            match self.cq.poll(&mut wc).map_err(nic("poll the meta CQ"))? {
                1 if wc[0].wr_id == wr_id => break Some(wc[0].status),
                1 => {} // a stale completion from before a reset
                _ if start.elapsed() > timeout => break None,
                _ => std::hint::spin_loop(),
            }
        };
        match status {
            Some(WcStatus::Success) => {
                self.buf.read(0, out).map_err(nic("meta READ buffer"))?;
                Ok(())
            }
            other => {
                self.stats.unavailable += 1;
                self.rearm().map_err(nic("re-arm the meta QP"))?;
                Err(ReadError::Failed(match other {
                    Some(s) => MetaFailure::Completion(s),
                    None => MetaFailure::Timeout(timeout),
                }))
            }
        }
    }

    /// Reset (discarding whatever is outstanding) and RESET -> RTS again
    /// (a DCI), or left in RESET to be paired again by the next lookup (RC).
    fn rearm(&mut self) -> krcore_nic::Result<()> {
        self.stats.resets += 1;
        self.qp.modify(Transition::Reset)?;
        let mut wc = [Wc::default(); 4];
        while self.cq.poll(&mut wc)? > 0 {}
        match &mut self.link {
            MetaLink::Dci => bring_up(&self.qp, Access::NONE, None),
            MetaLink::Rc { paired, .. } => {
                *paired = None;
                Ok(())
            }
        }
    }
}
