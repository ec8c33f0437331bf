//! Pairing an RC QP with its peer: INIT, a handshake (over UD in RC
//! fallback mode, over messaging for the DC -> RC upgrade), RTR, RTS. The
//! engine chooses the handshake (`QpHost::pair_up` of the engine object). Used
//! to make a pair (`super::rc`), to re-pair one after an error
//! (`super::physqp`'s recovery) and to reach the meta node in RC fallback
//! mode (`super::meta`).

use krcore_nic::{Access, DcTarget, Nic, QueuePair, Transition, UdTarget};

use super::config::HandshakeConfig;
use super::error::EngineError;
use super::handshake_ud::{HandshakeResponder, Paired};

/// The handshake endpoint a meta entry (or a meta location) names in RC
/// fallback mode: `dct_num` is the UD QPN, `dc_key` the qkey.
///
/// # Errors
/// [`EngineError::NotAFallbackNode`] when `dc_key` does not fit a qkey (the
/// entry is a DC node's).
pub(crate) fn handshake_target(t: &DcTarget) -> Result<UdTarget, EngineError> {
    let qkey = u32::try_from(t.dc_key).map_err(|_| EngineError::NotAFallbackNode {
        gid: t.gid,
        dc_key: t.dc_key,
    })?;
    Ok(UdTarget {
        gid: t.gid,
        qpn: t.dct_num,
        qkey,
    })
}

/// Pairs `qp` (an RC QP in RESET, in `hs`'s PD's device) with the responder
/// at `target`: INIT, handshake, RTR, RTS. Returns the pairing's nonce. On
/// any failure the QP is left in RESET.
///
/// # Errors
/// [`EngineError::Handshake`] when the target does not answer or refuses;
/// [`EngineError::Nic`] when the QP cannot be brought up.
pub(crate) fn pair_with<N: Nic>(
    hs: &HandshakeResponder<N>,
    qp: &N::Qp,
    target: UdTarget,
) -> Result<u64, EngineError> {
    pair_via(qp, hs.config(), |qpn| hs.handshake(qpn, target))
}

/// INIT, `exchange` (the handshake, whatever carries it), RTR, RTS; the QP
/// back in RESET on any failure. Returns the pairing's nonce.
pub(crate) fn pair_via<Q: QueuePair>(
    qp: &Q,
    cfg: &HandshakeConfig,
    exchange: impl FnOnce(u32) -> Result<Paired, EngineError>,
) -> Result<u64, EngineError> {
    let r = (|| {
        qp.modify(Transition::Init {
            access: Access::NONE,
            qkey: 0,
        })
        .map_err(EngineError::nic("bring an RC QP to INIT"))?;
        let paired = exchange(qp.qpn())?;
        qp.modify(Transition::Rtr {
            peer: Some(paired.peer),
        })
        .map_err(EngineError::nic("bring an RC QP to RTR"))?;
        qp.modify(Transition::Rts {
            rnr_retry: cfg.rnr_retry,
            retry_cnt: cfg.retry_cnt,
        })
        .map_err(EngineError::nic("bring an RC QP to RTS"))?;
        Ok(paired.nonce)
    })();
    if r.is_err() {
        let _ = qp.modify(Transition::Reset);
    }
    r
}
