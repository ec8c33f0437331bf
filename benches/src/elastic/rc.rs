//! The verbs baseline of the elastic experiment: a plain verbs application
//! that connects one RC QP to every memory node when it joins.
//!
//! - Memory node side ([`RcAcceptor`]): a TCP listener on loopback; for each
//!   connection it creates an RC QP in the memory node's protection domain
//!   (where the node's region is registered), swaps `(GID, QPN)` with the
//!   client ([`crate::baseline::encode`]), brings the QP to RTS, and answers
//!   with a ready byte and the modeled control-path nanoseconds it spent
//!   (the server half of the join's hardware cost).
//! - Client side ([`RcTransport::connect`]): a PD, a CQ, one RC QP per memory
//!   node over that exchange and a scratch MR, then the RACE [`Transport`]
//!   over them: one doorbell per memory node per batch, its last WR
//!   signaled. It only reads (the experiment's joining processes issue
//!   gets; the store is loaded through KRCore clients): it has no channel
//!   to the memory nodes' allocators, and [`Transport::alloc_block`] is a
//!   typed refusal. (The KRCore transport makes its messaging endpoint,
//!   which carries allocations, only at its first allocation: a get-only
//!   join never does.)

use crate::baseline::{decode, encode, RcEndpoint};
use krcore::Node;
use krcore_nic::sim::SimNic;
use krcore_nic::AnyNic;
use krcore_nic::{
    bring_up, Access, CompletionQueue, Destination, InlineData, MemoryRegion, Nic, Payload, QpCaps,
    QpInit, QpType, QueuePair, SendFlags, SendWr, SgList, Wc, WcStatus, WrOp, MAX_INLINE,
};
use race_store::layout::slot::RemotePtr;
use race_store::rdma::NodeInfo;
use race_store::remote::{Cause, OpResult, RemoteOp, Transport, TransportError};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A memory node's RC acceptor; stops (and joins) on drop. The QPs it made
/// live as long as it does.
#[derive(Debug)]
pub struct RcAcceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn accept_one(
    node: &Node,
    cq: &<AnyNic as Nic>::Cq,
    mut sock: TcpStream,
) -> std::io::Result<<AnyNic as Nic>::Qp> {
    let io = |e: krcore_nic::NicError| std::io::Error::other(e.to_string());
    sock.set_nonblocking(false)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let engine = node
        .engine()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let nic = engine.nic();
    let before = nic.counters().modeled_control_ns;
    let mut theirs = [0u8; 20];
    sock.read_exact(&mut theirs)?;
    let qp = nic
        .create_qp(
            engine.pd(),
            &QpInit {
                qp_type: QpType::Rc,
                caps: QpCaps::default(),
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                dc_key: 0,
            },
        )
        .map_err(io)?;
    sock.write_all(&encode(&nic.gid(), qp.qpn()))?;
    bring_up(&qp, Access::ALL, Some(decode(&theirs))).map_err(io)?;
    let modeled = nic.counters().modeled_control_ns.saturating_sub(before);
    let mut ready = [0u8; 9];
    ready[0] = 1;
    ready[1..].copy_from_slice(&modeled.to_le_bytes());
    sock.write_all(&ready)?;
    Ok(qp)
}

impl RcAcceptor {
    /// Listens on `127.0.0.1:0` for connections to memory node `node`.
    ///
    /// # Errors
    /// Socket or CQ creation failures.
    pub fn start(node: &Node) -> std::io::Result<RcAcceptor> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let cq = node
            .engine()
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .nic()
            .create_cq(4096)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let node = node.clone();
        let thread = std::thread::Builder::new()
            .name("rc-acceptor".into())
            .spawn(move || {
                let mut qps = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => match accept_one(&node, &cq, s) {
                            Ok(qp) => qps.push(qp),
                            Err(e) => eprintln!("rc-acceptor: a connection failed: {e}"),
                        },
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })?;
        Ok(RcAcceptor {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RcAcceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn setup(what: &'static str) -> impl Fn(String) -> TransportError {
    move |reason| TransportError::Setup {
        what,
        source: Cause::msg(reason),
    }
}

fn refused(node: u8, reason: String) -> TransportError {
    TransportError::Refused {
        node,
        source: Cause::msg(reason),
    }
}

/// Client side of one exchange: returns the QP and the server's modeled
/// control-path nanoseconds.
fn connect_rc(
    ep: &RcEndpoint<SimNic>,
    addr: SocketAddr,
) -> Result<(<SimNic as Nic>::Qp, u64), TransportError> {
    let io = |e: std::io::Error| setup("RC exchange over TCP")(e.to_string());
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io)?;
    sock.set_nodelay(true).map_err(io)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let qp = ep
        .create()
        .map_err(|e| setup("create an RC QP")(e.to_string()))?;
    sock.write_all(&encode(&ep.nic.gid(), qp.qpn()))
        .map_err(io)?;
    let mut theirs = [0u8; 20];
    sock.read_exact(&mut theirs).map_err(io)?;
    bring_up(&qp, Access::ALL, Some(decode(&theirs)))
        .map_err(|e| setup("bring the RC QP up")(e.to_string()))?;
    let mut ready = [0u8; 9];
    sock.read_exact(&mut ready).map_err(io)?;
    let mut m = [0u8; 8];
    m.copy_from_slice(&ready[1..]);
    Ok((qp, u64::from_le_bytes(m)))
}

/// Scratch buffer size.
const SCRATCH: usize = 1 << 20;
/// Most ops per doorbell per node.
const CHUNK: usize = 32;
/// How long one batch may take.
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The RACE transport of the verbs baseline (see the module docs).
pub struct RcTransport {
    ep: RcEndpoint<SimNic>,
    qps: Vec<<SimNic as Nic>::Qp>,
    infos: Vec<NodeInfo>,
    scratch: <SimNic as Nic>::Mr,
    batch: u64,
    wcs: Vec<Wc>,
    /// Modeled control-path ns the memory nodes spent on our connections.
    pub server_modeled_ns: u64,
}

impl std::fmt::Debug for RcTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcTransport")
            .field("nodes", &self.qps.len())
            .finish()
    }
}

impl RcTransport {
    /// Connects `ep` (a PD and a CQ, see [`RcEndpoint::new`]) to every
    /// memory node: `acceptors[i]` is node `i`'s.
    ///
    /// # Errors
    /// [`TransportError::Setup`].
    pub fn connect(
        ep: RcEndpoint<SimNic>,
        infos: &[NodeInfo],
        acceptors: &[SocketAddr],
    ) -> Result<RcTransport, TransportError> {
        if infos.len() != acceptors.len() {
            return Err(setup("memory node list")(format!(
                "{} nodes, {} acceptors",
                infos.len(),
                acceptors.len()
            )));
        }
        let mut qps = Vec::new();
        let mut server_modeled_ns = 0;
        for a in acceptors {
            let (qp, ns) = connect_rc(&ep, *a)?;
            qps.push(qp);
            server_modeled_ns += ns;
        }
        let scratch = ep
            .nic
            .alloc_mr(&ep.pd, SCRATCH, Access::LOCAL_WRITE)
            .map_err(|e| setup("scratch memory")(e.to_string()))?;
        Ok(RcTransport {
            ep,
            qps,
            infos: infos.to_vec(),
            scratch,
            batch: 0,
            wcs: vec![Wc::default(); 64],
            server_modeled_ns,
        })
    }

    fn chunk(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let mut offs = Vec::with_capacity(batch.len());
        let mut need = 0usize;
        for op in batch {
            offs.push(need);
            need += match op {
                RemoteOp::Read { len, .. } => *len as usize,
                RemoteOp::Write { bytes, .. } if bytes.len() > MAX_INLINE => bytes.len(),
                RemoteOp::Write { .. } => 0,
                RemoteOp::Cas { .. } | RemoteOp::Faa { .. } => 8,
            }
            .next_multiple_of(8);
        }
        if need > self.scratch.len() {
            return Err(refused(0, format!("batch needs {need} bytes of scratch")));
        }
        self.batch += 1;
        let tag = self.batch << 24;
        let mut wrs: Vec<Vec<SendWr>> = vec![Vec::new(); self.qps.len()];
        for (i, op) in batch.iter().enumerate() {
            let n = usize::from(op.node());
            let info = self
                .infos
                .get(n)
                .ok_or(TransportError::NoSuchNode { node: op.node() })?;
            let remote = krcore_nic::RemoteAddr {
                addr: info.base + op.ptr().offset(),
                rkey: info.rkey,
            };
            let sge = |len: u32| {
                self.scratch
                    .sge(offs[i], len)
                    .map_err(|e| setup("scratch SGE")(e.to_string()))
            };
            let id = tag | i as u64;
            let wr = match *op {
                RemoteOp::Read { len, .. } => SendWr::read(id, sge(len)?, remote),
                RemoteOp::Write { bytes, .. } => {
                    let payload = match InlineData::new(bytes) {
                        Some(d) => Payload::Inline(d),
                        None => {
                            self.scratch
                                .write(offs[i], bytes)
                                .map_err(|e| setup("scratch copy")(e.to_string()))?;
                            Payload::Local(SgList::one(sge(bytes.len() as u32)?))
                        }
                    };
                    SendWr {
                        wr_id: id,
                        op: WrOp::Write { remote },
                        payload,
                        flags: SendFlags::SIGNALED,
                        dest: Destination::Connected,
                    }
                }
                RemoteOp::Cas { expect, new, .. } => SendWr::cas(id, sge(8)?, remote, expect, new),
                RemoteOp::Faa { add, .. } => SendWr::faa(id, sge(8)?, remote, add),
            };
            wrs[n].push(wr.signaled(false));
        }
        let mut waiting = 0;
        let mut last = vec![None; self.qps.len()];
        for (n, w) in wrs.iter_mut().enumerate() {
            if let Some(l) = w.last_mut() {
                *l = l.signaled(true);
                last[n] = Some(l.wr_id);
                self.qps[n]
                    .post_send(w)
                    .map_err(|e| TransportError::Refused {
                        node: n as u8,
                        source: Cause::new(e),
                    })?;
                waiting += 1;
            }
        }
        let start = Instant::now();
        let mut failure = None;
        while waiting > 0 {
            let k = self
                .ep
                .cq
                .poll(&mut self.wcs)
                .map_err(|e| setup("poll the CQ")(e.to_string()))?;
            for wc in &self.wcs[..k] {
                if wc.wr_id >> 24 != self.batch {
                    continue;
                }
                if wc.status != WcStatus::Success && failure.is_none() {
                    let n = last.iter().position(|l| *l == Some(wc.wr_id)).unwrap_or(0) as u8;
                    failure = Some(match wc.status {
                        WcStatus::RetryExcErr => TransportError::NodeDown { node: n },
                        other => TransportError::Failed {
                            node: n,
                            status: other,
                        },
                    });
                }
                if last.contains(&Some(wc.wr_id)) {
                    waiting -= 1;
                }
            }
            if waiting > 0 && start.elapsed() > BATCH_TIMEOUT {
                return Err(TransportError::Timeout {
                    node: 0,
                    after: BATCH_TIMEOUT,
                });
            }
        }
        if let Some(f) = failure {
            return Err(f);
        }
        let mut out = Vec::with_capacity(batch.len());
        for (i, op) in batch.iter().enumerate() {
            let read_err = |e: krcore_nic::NicError| setup("scratch read")(e.to_string());
            out.push(match op {
                RemoteOp::Read { len, .. } => {
                    let mut v = vec![0u8; *len as usize];
                    self.scratch.read(offs[i], &mut v).map_err(read_err)?;
                    OpResult::Read(v)
                }
                RemoteOp::Write { .. } => OpResult::Written,
                RemoteOp::Cas { .. } => OpResult::Cas {
                    old: self.scratch.load_u64(offs[i]).map_err(read_err)?,
                },
                RemoteOp::Faa { .. } => OpResult::Faa {
                    old: self.scratch.load_u64(offs[i]).map_err(read_err)?,
                },
            });
        }
        Ok(out)
    }
}

impl Transport for RcTransport {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let mut out = Vec::with_capacity(batch.len());
        for c in batch.chunks(CHUNK) {
            out.extend(self.chunk(c)?);
        }
        Ok(out)
    }

    fn alloc_block(&mut self, node: u8, _size: u64) -> Result<RemotePtr, TransportError> {
        Err(TransportError::Refused {
            node,
            source: Cause::msg(
                "the verbs baseline only reads: it has no channel to the memory nodes' allocators \
                 (load the store through KRCore clients)",
            ),
        })
    }

    fn nodes(&self) -> u8 {
        self.qps.len() as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterHost, ClusterOptions};
    use krcore_nic::sim::{SimConfig, SimFabric};
    use race_store::{Client, ClientConfig};

    #[test]
    fn the_verbs_baseline_reads_and_writes_the_store() {
        let fabric = SimFabric::in_memory();
        let host = ClusterHost::start(
            fabric.clone(),
            &ClusterOptions {
                memory_nodes: 2,
                node_bytes: 16 << 20,
                ..ClusterOptions::default()
            },
            None,
        )
        .unwrap();
        let acceptors: Vec<_> = host
            .memory_nodes()
            .iter()
            .map(|n| RcAcceptor::start(n).unwrap())
            .collect();
        let addrs: Vec<_> = acceptors.iter().map(RcAcceptor::addr).collect();
        let nic = SimNic::open(&fabric, SimConfig::default()).unwrap();
        let before = nic.counters();
        let ep = RcEndpoint::new(nic.clone(), 1024).unwrap();
        let t = RcTransport::connect(ep, host.infos(), &addrs).unwrap();
        let d = nic.counters() - before;
        assert_eq!(d.qps_created, 2, "one RC QP per memory node");
        let remote = host.remote().unwrap();
        let mut loader = remote
            .race_client(&SimConfig::default(), ClientConfig::default())
            .unwrap();
        for i in 0..300u32 {
            loader
                .put(format!("k{i}").as_bytes(), &i.to_le_bytes())
                .unwrap();
        }
        let mut c = Client::open(t, remote.clock.clone(), ClientConfig::default()).unwrap();
        for i in 0..300u32 {
            assert_eq!(
                c.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
                Some(&i.to_le_bytes()[..])
            );
        }
        // It only reads: a write that needs a block is a typed refusal.
        assert!(matches!(
            c.put(b"new-key", b"v"),
            Err(race_store::Error::Transport(TransportError::Refused { .. }))
                | Err(race_store::Error::OutcomeUnknown { .. })
        ));
    }
}
