//! Recovery of a shared physical QP after an error completion: the NIC
//! steps (reset, drain the old incarnation's completions, bring the QP
//! back; for an RC pair, the re-handshake) around the core's plan
//! (`SharedQp::reset`, `repost`, `flush_all` of [`crate::sharedqp`]).
//! See the parent module's docs.

use krcore_nic::{bring_up, Access, CompletionQueue, Nic, QueuePair, SendWr, Transition, Wc};

use super::qp::{Link, PhysQp, PhysState, POLL_BATCH};
use crate::engine::device::QpHost;
use crate::engine::error::VqpError;

impl<N: Nic> PhysQp<N> {
    /// Brings a QP that reported an error back to RTS (see the module docs).
    pub(super) fn recover(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
    ) -> Result<(), VqpError> {
        let mut buf = [Wc::default(); POLL_BATCH];
        // The failing WR was delivered to its owner when its completion was
        // routed; the NIC flushes every later WR (none of them executed).
        // Reset: the flush completions still to come match nothing.
        if let Some(qp) = &st.qp {
            qp.modify(Transition::Reset)
                .map_err(VqpError::nic("reset a shared QP"))?;
        }
        let (guilty, again) = st.core.reset(&eng.dev().cache);
        let target = self.rc_link().map(|l| l.gid);
        tracing::warn!(
            qpn = self.qpn,
            index = self.index,
            target_gid = target.map(tracing::field::display),
            guilty_vqp = guilty.map(tracing::field::display),
            "shared QP found in ERR, recovering"
        );
        // Completions of the old incarnation still in the CQ match nothing.
        loop {
            let k = self
                .cq
                .poll(&mut buf)
                .map_err(VqpError::nic("poll a shared QP's CQ"))?;
            st.core.note_stale(k);
            if k < buf.len() {
                break;
            }
        }
        match (&st.qp, &self.link) {
            (None, _) => {}
            (Some(qp), Link::Dci) => {
                if let Err(e) = bring_up(qp, Access::NONE, None) {
                    st.core.flush_all(&eng.dev().cache, &again);
                    return Err(VqpError::nic("bring up a DCI")(e));
                }
            }
            (Some(qp), Link::Rc(l)) => match eng.pair_up(qp, l.handshake) {
                Ok(nonce) => st.nonce = nonce,
                Err(e) => {
                    // The target did not answer (or the QP could not be
                    // brought up): close the pair. Its VQPs re-bind on their
                    // next post, and fail, typed, while the target is gone.
                    tracing::warn!(
                        qpn = self.qpn,
                        target_gid = %l.gid,
                        reason = %e,
                        flushed = again.len(),
                        "RC pair lost: re-handshake after an error failed, pair closed"
                    );
                    st.qp = None;
                    st.core.note_lost();
                }
            },
        }
        let PhysState {
            qp: Some(qp), core, ..
        } = st
        else {
            st.core.flush_all(&eng.dev().cache, &again);
            return Ok(());
        };
        let before = core.stats().reposted;
        core.repost(&eng.dev().cache, &again, |wrs: &mut [SendWr]| {
            qp.post_send(wrs)
        });
        let reposted = core.stats().reposted - before;
        tracing::info!(
            qpn = self.qpn,
            target_gid = target.map(tracing::field::display),
            reposted,
            refused = again.len() as u64 - reposted,
            "shared QP recovered"
        );
        Ok(())
    }
}
