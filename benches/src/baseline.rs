//! The baseline KRCore is measured against: a plain verbs application that
//! connects with RC. Both sides create an RC QP, exchange `(GID, QPN)` over a
//! TCP socket on loopback, and bring their QP to RTS.
//!
//! Generic over the provider, so the same code measures `sim` (optionally
//! under a latency model, whose control-path cost lands in the counters) and
//! the `verbs` provider.

use krcore_nic::{bring_up, Access, Gid, Nic, QpCaps, QpInit, QpType, QueuePair, RcPeer};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// One side's objects for RC connections: a PD and a CQ.
pub struct RcEndpoint<N: Nic> {
    pub nic: N,
    pub pd: N::Pd,
    pub cq: N::Cq,
}

impl<N: Nic> RcEndpoint<N> {
    /// A PD and a CQ of `cq_depth` entries on `nic`.
    ///
    /// # Errors
    /// The provider's errors.
    pub fn new(nic: N, cq_depth: u32) -> krcore_nic::Result<RcEndpoint<N>> {
        let pd = nic.alloc_pd()?;
        let cq = nic.create_cq(cq_depth)?;
        Ok(RcEndpoint { nic, pd, cq })
    }

    /// A fresh RC QP in this endpoint's PD, both queues on its CQ.
    ///
    /// # Errors
    /// The provider's.
    pub fn create(&self) -> krcore_nic::Result<N::Qp> {
        self.nic.create_qp(
            &self.pd,
            &QpInit {
                qp_type: QpType::Rc,
                caps: QpCaps::default(),
                send_cq: &self.cq,
                recv_cq: &self.cq,
                srq: None,
                dc_key: 0,
            },
        )
    }
}

/// The 20 bytes a side sends: its GID and QPN.
pub fn encode(gid: &Gid, qpn: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..16].copy_from_slice(gid.as_bytes());
    b[16..].copy_from_slice(&qpn.to_le_bytes());
    b
}

/// The peer [`encode`] describes.
pub fn decode(b: &[u8; 20]) -> RcPeer {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[..16]);
    RcPeer {
        gid: Gid(g),
        qpn: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
    }
}

/// Why a baseline connect failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A provider call failed.
    #[error(transparent)]
    Nic(#[from] krcore_nic::NicError),
    /// The TCP exchange failed.
    #[error("QPN exchange: {0}")]
    Tcp(#[from] std::io::Error),
    /// The server thread panicked.
    #[error("server side panicked")]
    Panicked,
}

/// Connects one RC pair the way a plain verbs application does: the server
/// side listens on loopback TCP; both create an RC QP, swap `(GID, QPN)`
/// over the socket, and bring their QP up to RTS. Returns `(client QP,
/// server QP)`.
///
/// # Errors
/// Provider or socket failures.
pub fn rc_connect_over_tcp<N: Nic>(
    client: &RcEndpoint<N>,
    server: &RcEndpoint<N>,
) -> Result<(N::Qp, N::Qp), ConnectError>
where
    N::Qp: Send,
    N::Pd: Sync,
    N::Cq: Sync,
{
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::scope(|s| {
        let srv = s.spawn(move || -> Result<N::Qp, ConnectError> {
            let (mut sock, _) = listener.accept()?;
            let qp = server.create()?;
            let mut theirs = [0u8; 20];
            sock.read_exact(&mut theirs)?;
            sock.write_all(&encode(&server.nic.gid(), qp.qpn()))?;
            bring_up(&qp, Access::ALL, Some(decode(&theirs)))?;
            // Tell the client we are ready to receive (RTR) before it sends.
            sock.write_all(&[1])?;
            Ok(qp)
        });
        let client_side = (|| -> Result<N::Qp, ConnectError> {
            let mut sock = TcpStream::connect(addr)?;
            sock.set_nodelay(true)?;
            let qp = client.create()?;
            sock.write_all(&encode(&client.nic.gid(), qp.qpn()))?;
            let mut theirs = [0u8; 20];
            sock.read_exact(&mut theirs)?;
            bring_up(&qp, Access::ALL, Some(decode(&theirs)))?;
            let mut ready = [0u8; 1];
            sock.read_exact(&mut ready)?;
            Ok(qp)
        })();
        let server_qp = srv.join().map_err(|_| ConnectError::Panicked)?;
        Ok((client_side?, server_qp?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use krcore_nic::conformance::{poll_one, Side};
    use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
    use krcore_nic::{MemoryRegion, SendWr, WcStatus};

    #[test]
    fn baseline_pair_carries_a_read() {
        let f = SimFabric::in_memory();
        let a = SimNic::open(&f, SimConfig::default()).unwrap();
        let b = SimNic::open(&f, SimConfig::default()).unwrap();
        let ea = RcEndpoint::new(a.clone(), 64).unwrap();
        let eb = RcEndpoint::new(b.clone(), 64).unwrap();
        let before = a.counters();
        let (qa, _qb) = rc_connect_over_tcp(&ea, &eb).unwrap();
        assert_eq!((a.counters() - before).qps_created, 1);
        let sa = Side::new(&a, 64);
        // The QP lives in ea's PD: use an MR of that PD.
        let mr = a.alloc_mr(&ea.pd, 64, Access::ALL).unwrap();
        let target = b.alloc_mr(&eb.pd, 64, Access::ALL).unwrap();
        target.write(0, b"baseline").unwrap();
        qa.post_send(&[SendWr::read(1, mr.sge(0, 8).unwrap(), target.remote(0))])
            .unwrap();
        assert_eq!(poll_one(&ea.cq).status, WcStatus::Success);
        let mut got = [0u8; 8];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"baseline");
        drop(sa);
    }
}
