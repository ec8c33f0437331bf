//! Polling a shared physical QP: the inline synchronous case, the drain
//! of its CQ and the routing of each completion to its VQP. See the
//! parent module's docs.

use std::ops::Range;

use krcore_nic::{CompletionQueue, Nic, Wc};

use super::qp::{PhysQp, PhysState, POLL_BATCH};
use crate::engine::device::QpHost;
use crate::engine::error::VqpError;
use crate::sharedqp::Sink;
use crate::wrid::VqpId;

impl<N: Nic> PhysQp<N> {
    /// Polls up to `out.len()` completions of the VQP `id` (see
    /// [`crate::engine::Vqp::poll`]): its ring first, then the CQ drained
    /// and routed. `None` when this QP does not hold the VQP's state.
    ///
    /// The common case is inlined: the CQ is polled straight into the
    /// caller's free entries, and each CQE that is this VQP's own success,
    /// retiring only its own WRs (the oldest WR on the QP, or any while all
    /// outstanding WRs are its own), is rewritten in place into the user's
    /// completion (no other VQP's WR is involved, nothing to route). The
    /// first CQE that is anything else (another VQP's, an error, one the
    /// credits cannot retire alone) continues in [`PhysQp::poll_rest`] with
    /// every CQE read after it, in order. A poll that fills its free entries
    /// with CQEs, not all of them delivered (unsignaled by the user), polls
    /// again, as the drain would. One free entry, or one CQE read (the
    /// synchronous cases), take the same steps without the loop.
    #[inline(always)]
    pub(crate) fn poll(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        id: VqpId,
        out: &mut [Wc],
    ) -> Result<Option<usize>, VqpError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(mut own) = st.core.poller(id) else {
            return Ok(None);
        };
        let n = own.pop(out);
        if n == out.len() {
            return Ok(Some(n));
        }
        // The ring is empty now: this VQP's completions go straight into
        // `out` (no ring round trip) until it is full.
        if own.needs_recovery() {
            return self.poll_rest(eng, st, id, out, n, n..n);
        }
        if out.len() - n == 1 {
            // One CQE, read straight into the caller's last entry.
            match self.cq.poll(&mut out[n..]) {
                Ok(0) => return Ok(Some(n)),
                Ok(_) => {}
                Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
                Err(_) => return Ok(Some(n)),
            }
            return match own.own(&mut out[n]) {
                Some(true) => Ok(Some(n + 1)),
                Some(false) => self.poll_rest(eng, st, id, out, n, n..n),
                None => self.poll_rest(eng, st, id, out, n, n..n + 1),
            };
        }
        // CQEs read straight into the caller's free entries: rewritten in
        // place into the user's completions below, or handed on.
        let mut k = match self.cq.poll(&mut out[n..]) {
            Ok(0) => return Ok(Some(n)),
            Ok(k) => k,
            Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
            Err(_) => return Ok(Some(n)),
        };
        if k == 1 {
            // The usual case: one CQE (the synchronous one).
            return match own.own(&mut out[n]) {
                Some(true) => Ok(Some(n + 1)),
                // Room was left (more than one entry was free): the CQ
                // had no more.
                Some(false) => Ok(Some(n)),
                None => self.poll_rest(eng, st, id, out, n, n..n + 1),
            };
        }
        // Entries of `out` filled; free entries the last CQ poll asked for.
        let mut n = n;
        let mut room = out.len() - n;
        loop {
            let end = n + k;
            // The next CQE read and not yet applied (`n <= r`: each CQE
            // delivers at most one completion).
            let mut r = n;
            while r < end {
                match own.own(&mut out[r]) {
                    Some(true) => {
                        if n != r {
                            out[n] = out[r];
                        }
                        n += 1;
                    }
                    Some(false) => {}
                    None => return self.poll_rest(eng, st, id, out, n, r..end),
                }
                r += 1;
            }
            // Full, or the CQ had no more than asked for: done. Otherwise
            // (user-unsignaled WRs took entries) the CQ may hold more.
            if n == out.len() || k < room {
                return Ok(Some(n));
            }
            room = out.len() - n;
            k = match self.cq.poll(&mut out[n..]) {
                Ok(0) => return Ok(Some(n)),
                Ok(k) => k,
                Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
                Err(_) => return Ok(Some(n)),
            };
        }
    }

    /// The rest of [`PhysQp::poll`]: `n` entries of `out` filled, the
    /// VQP's ring empty; `out[polled]` CQEs read and not yet applied, in
    /// order (`n <= polled.start`). Routes them, then drains the CQ into
    /// `out` (recovering the QP if needed).
    #[cold]
    #[inline(never)]
    fn poll_rest(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
        id: VqpId,
        out: &mut [Wc],
        n: usize,
        polled: Range<usize>,
    ) -> Result<Option<usize>, VqpError> {
        debug_assert!(n <= polled.start && polled.end <= out.len());
        let mut sink = Sink::new(id, out, n);
        if !polled.is_empty() {
            // Routed as the drain would. Each delivers at most one
            // completion into the sink, so the sink's next entry never
            // passes the next CQE to read.
            for r in polled {
                let wc = sink.entry(r);
                st.core.route(&eng.dev().cache, &wc, Some(&mut sink));
            }
            if sink.room() == 0 && !st.core.needs_recovery() {
                return Ok(Some(sink.filled()));
            }
        }
        let drained = self.drain_for(eng, st, Some(&mut sink));
        let (out, mut n) = sink.into_parts();
        match drained {
            Ok(_) => {}
            Err(e) if n == 0 => return Err(e),
            Err(_) => return Ok(Some(n)),
        }
        if n < out.len() {
            // A recovery may have reported flushes to the ring.
            n += st.core.pop(id, &mut out[n..]);
        }
        Ok(Some(n))
    }

    /// Polls the CQ until it is empty, routing each completion; recovers the
    /// QP if one of them was an error.
    pub(super) fn drain(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
    ) -> Result<usize, VqpError> {
        self.drain_for(eng, st, None)
    }

    /// [`PhysQp::drain`], delivering the completions of the polling VQP
    /// (`sink`) straight into its buffer while its ring is empty, and
    /// stopping early once that buffer is full (a poll needs no more; the
    /// rest stays in the CQ, in order, for the next drain). The first CQ
    /// poll asks for just the room left, so a synchronous poll costs one
    /// CQE read, like a raw one.
    fn drain_for(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
        mut sink: Option<&mut Sink<'_>>,
    ) -> Result<usize, VqpError> {
        let mut buf = std::mem::take(&mut st.buf);
        let want = sink.as_ref().map_or(usize::MAX, |s| s.room());
        let mut chunk = want.clamp(1, POLL_BATCH);
        let mut total = 0;
        let polled = loop {
            let k = match self.cq.poll(&mut buf[..chunk]) {
                Ok(k) => k,
                Err(e) => break Err(e),
            };
            for wc in &buf[..k] {
                st.core.route(&eng.dev().cache, wc, sink.as_deref_mut());
            }
            let enough = sink.as_ref().is_some_and(|s| s.room() == 0);
            total += k;
            if k < chunk || enough || st.core.needs_recovery() {
                break Ok(());
            }
            chunk = POLL_BATCH;
        };
        st.buf = buf;
        polled.map_err(VqpError::nic("poll a shared QP's CQ"))?;
        if st.core.needs_recovery() {
            self.recover(eng, st)?;
        }
        Ok(total)
    }
}
