//! The collection steps and the end of a client's leases, as runs
//! requests to the memory nodes' allocation ports (see
//! [`crate::client::Client::collect`] and [`crate::holders`]).

use super::{VqpTransport, Want};
use crate::collection::{CollectStart, Collected};
use crate::rdma::proto::{
    RunsKind, RunsReply, FEATURE_COLLECT, FEATURE_LEASE_END, RUNS_DRAINING, RUNS_REFUSED,
};
use crate::remote::{Cause, Transport, TransportError};
use krcore_nic::Nic;
use std::time::Duration;

impl<N: Nic> VqpTransport<N> {
    pub(super) fn collect_begin_raw(
        &mut self,
        node: u8,
        token: u64,
    ) -> Result<CollectStart, TransportError> {
        let r = self.collect_step(node, RunsKind::CollectBegin { token })?;
        match (r.status, r.runs.first()) {
            (0, _) => Ok(CollectStart::Ready),
            (RUNS_DRAINING, Some(&(wait_us, leases))) => Ok(CollectStart::Draining {
                wait: Duration::from_micros(wait_us),
                leases,
            }),
            _ => Err(collect_refused(node, r.status)),
        }
    }

    /// The runs in as many requests as the endpoint's longest message
    /// needs.
    pub(super) fn collect_live_raw(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        let per = self.alloc.max_runs(node)?;
        for chunk in runs.chunks(per.max(1)) {
            let kind = RunsKind::CollectLive {
                token,
                runs: chunk.to_vec(),
            };
            let r = self.collect_step(node, kind)?;
            if r.status != 0 {
                return Err(collect_refused(node, r.status));
            }
        }
        Ok(())
    }

    pub(super) fn collect_finish_raw(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        let r = self.collect_step(node, RunsKind::CollectFinish { token, apply })?;
        match (r.status, r.runs.first()) {
            (0, Some(&(bytes, runs))) => Ok(Collected { bytes, runs }),
            _ => Err(collect_refused(node, r.status)),
        }
    }

    /// One step of a collection on node `node`, its answer as it came.
    fn collect_step(&mut self, node: u8, kind: RunsKind) -> Result<RunsReply, TransportError> {
        if !self.has(node, FEATURE_COLLECT) {
            return Err(TransportError::Unsupported {
                what: "collecting a memory node of an older version",
            });
        }
        let to = self.alloc_port(node)?;
        self.alloc.exchange_reply(node, to, &Want::Collect(kind))
    }

    pub(super) fn end_grant_leases_raw(
        &mut self,
        only: Option<u8>,
        wait: bool,
    ) -> Result<usize, TransportError> {
        let (mut told, mut first_err) = (0, None);
        for node in 0..self.nodes() {
            if only.is_some_and(|n| n != node) {
                continue;
            }
            let ends = self.has(node, FEATURE_LEASE_END);
            let Some(holder) = self.holder_for(node).filter(|_| ends) else {
                continue;
            };
            if self.alloc.leases.generation(node).is_none() {
                continue;
            }
            // A renewal still out is answered first (or left: the end
            // follows it on the channel either way).
            if let Some(ask) = self
                .renewing
                .get_mut(usize::from(node))
                .and_then(Option::take)
            {
                let _ = self.alloc.answer(ask, wait);
            }
            self.alloc.leases.forget(node);
            let want = Want::End { holder };
            let r = self.alloc_port(node).and_then(|to| {
                if wait {
                    self.alloc.exchange(node, to, &want).map(drop)
                } else {
                    self.alloc.send_only(node, to, &want)
                }
            });
            match r {
                Ok(()) => told += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(told), Err)
    }
}

/// A collection step's refusal (status `status`).
fn collect_refused(node: u8, status: u32) -> TransportError {
    TransportError::Refused {
        node,
        source: Cause::msg(if status == RUNS_REFUSED {
            "the memory node refused the collection step (another collection under way, or \
             this one abandoned)"
        } else {
            "unexpected answer to a collection step"
        }),
    }
}
