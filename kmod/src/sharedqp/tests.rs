//! Scenario tests of the shared-QP core, stepped deterministically: a
//! model NIC takes each doorbell into its send queue and executes WRs one
//! at a time when a test says so, as hardware would: a signaled success
//! completes, an error completes and puts the QP in ERR, and every WR
//! after it is flushed (`WR_FLUSH_ERR`, signaled or not). No thread, no
//! clock, no timeout.

use std::collections::VecDeque;
use std::time::Instant;

use krcore_nic::{DcTarget, Gid, PostError, PostErrorKind, RemoteAddr, SendWr, Sge, Wc, WcStatus};

use super::{QpShape, Refusal, SharedQp, Sink, VqpState};
use crate::dccache::{CachedTarget, DcCache, Lookup};
use crate::precheck::{Policy, Ungranted};
use crate::wrid::VqpId;

const DEPTH: u32 = 64;

/// The NIC's side of one QP.
#[derive(Default)]
struct ModelNic {
    /// Rung and not yet executed.
    sq: VecDeque<SendWr>,
    cq: VecDeque<Wc>,
    /// In ERR: every WR left is flushed.
    err: bool,
    /// The next doorbell is refused from this index on.
    refuse_from: Option<usize>,
    doorbells: usize,
}

impl ModelNic {
    fn ring(&mut self, wrs: &mut [SendWr]) -> Result<(), PostError> {
        self.doorbells += 1;
        let take = self
            .refuse_from
            .take()
            .map_or(wrs.len(), |k| k.min(wrs.len()));
        self.sq.extend(wrs[..take].iter().copied());
        if take < wrs.len() {
            return Err(PostError {
                index: take,
                kind: PostErrorKind::QueueFull { depth: DEPTH },
            });
        }
        Ok(())
    }

    /// Executes the oldest WR, with `status` unless the QP is in ERR.
    fn exec(&mut self, status: WcStatus) {
        let wr = self.sq.pop_front().expect("a WR to execute");
        let status = if self.err {
            WcStatus::WrFlushErr
        } else {
            status
        };
        if !status.is_ok() {
            self.err = true;
        }
        if wr.is_signaled() || !status.is_ok() {
            self.cq.push_back(Wc {
                wr_id: wr.wr_id,
                status,
                ..Wc::default()
            });
        }
    }

    fn exec_all(&mut self) {
        while !self.sq.is_empty() {
            self.exec(WcStatus::Success);
        }
    }

    /// The host's reset: nothing left to execute, out of ERR.
    fn reset(&mut self) {
        self.sq.clear();
        self.err = false;
    }
}

fn vqp(n: u32) -> VqpId {
    VqpId::new(n).unwrap()
}

fn target(n: u8) -> CachedTarget {
    CachedTarget {
        target: DcTarget {
            gid: Gid([n; 16]),
            dct_num: u32::from(n),
            dc_key: 7,
        },
        epoch: 1,
    }
}

fn wr(user: u64, signaled: bool) -> SendWr {
    SendWr::read(user, Sge::default(), RemoteAddr::default()).signaled(signaled)
}

/// A DCI's core (pre-check off: the tests are about routing), with the
/// VQPs `ids` attached and connected to target 1.
fn dci(ids: &[u32]) -> SharedQp {
    let mut qp = SharedQp::new(
        QpShape {
            depth: DEPTH,
            precheck: false,
            policy: Policy::default(),
            peer: None,
        },
        Instant::now(),
    );
    for &id in ids {
        let mut st = VqpState::new(DEPTH, Ungranted::Allow);
        st.set_target(Some(target(1)));
        qp.attach(vqp(id), st);
    }
    qp
}

/// The general post: plan, then ring on `nic`.
fn post(qp: &mut SharedQp, nic: &mut ModelNic, id: u32, wrs: &mut [SendWr]) -> Result<(), Refusal> {
    let plan = qp
        .plan(vqp(id), wrs, &Policy::default(), || {
            unreachable!("no grant expires")
        })?
        .expect("room");
    qp.ring(
        vqp(id),
        wrs,
        plan.force_signal.is_some(),
        |w: &mut [SendWr]| nic.ring(w),
    )
}

/// Routes every completion in the CQ.
fn drain(qp: &mut SharedQp, cache: &DcCache, nic: &mut ModelNic) {
    while let Some(wc) = nic.cq.pop_front() {
        qp.route(cache, &wc, None);
    }
}

/// What the VQP `id` has been delivered: (user wr_id, status).
fn delivered(qp: &mut SharedQp, id: u32) -> Vec<(u64, WcStatus)> {
    let mut out = [Wc::default(); 64];
    let n = qp.pop(vqp(id), &mut out);
    out[..n].iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn two_vqps_get_their_own_completions_once_and_every_credit_returns() {
    let (mut qp, cache, mut nic) = (dci(&[1, 2]), DcCache::new(64), ModelNic::default());
    post(&mut qp, &mut nic, 1, &mut [wr(10, false), wr(11, true)]).unwrap();
    // VQP 2 posts while VQP 1's WRs are in flight: by copy.
    post(
        &mut qp,
        &mut nic,
        2,
        &mut [wr(20, true), wr(21, false), wr(22, true)],
    )
    .unwrap();
    assert_eq!(qp.outstanding(), 5);
    nic.exec_all();
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(
        delivered(&mut qp, 1),
        [(11, WcStatus::Success)],
        "the unsignaled WR retired silently"
    );
    assert_eq!(
        delivered(&mut qp, 2),
        [(20, WcStatus::Success), (22, WcStatus::Success)]
    );
    assert_eq!((qp.outstanding(), qp.free()), (0, DEPTH));
    let s = qp.stats();
    assert_eq!(
        (s.doorbells, s.wrs, s.completions, s.orphaned),
        (2, 5, 3, 0)
    );
}

#[test]
fn a_poll_of_its_own_applies_its_completions_in_place() {
    let (mut qp, cache, mut nic) = (dci(&[1]), DcCache::new(64), ModelNic::default());
    post(&mut qp, &mut nic, 1, &mut [wr(1, false), wr(2, true)]).unwrap();
    nic.exec_all();
    let mut wc = nic.cq.pop_front().unwrap();
    let mut own = qp.poller(vqp(1)).unwrap();
    assert_eq!(own.own(&mut wc), Some(true));
    assert_eq!((wc.wr_id, wc.qp_num), (2, 1), "rewritten into the user's");
    assert_eq!(qp.outstanding(), 0);
    // Another VQP's completion is not its own: it needs routing.
    let mut qp = dci(&[1, 2]);
    post(&mut qp, &mut nic, 2, &mut [wr(5, true)]).unwrap();
    nic.exec_all();
    let mut wc = nic.cq.pop_front().unwrap();
    assert_eq!(qp.poller(vqp(1)).unwrap().own(&mut wc), None);
    let mut out = [Wc::default(); 1];
    let mut sink = Sink::new(vqp(2), &mut out, 0);
    qp.route(&cache, &wc, Some(&mut sink));
    assert_eq!(sink.filled(), 1, "straight into the polling VQP's buffer");
    assert_eq!(out[0].wr_id, 5);
}

#[test]
fn a_long_unsignaled_run_gets_its_last_wr_signaled_for_the_user_silently() {
    let (mut qp, cache, mut nic) = (dci(&[1]), DcCache::new(64), ModelNic::default());
    let max = Policy::default().effective_max_unsignaled(DEPTH) as u64;
    let mut wrs: Vec<SendWr> = (0..=max).map(|i| wr(i, false)).collect();
    post(&mut qp, &mut nic, 1, &mut wrs).unwrap();
    assert!(
        wrs.iter().all(|w| !w.is_signaled()),
        "the caller's WRs as they were"
    );
    assert_eq!(qp.stats().forced_signals, 1);
    nic.exec_all();
    assert_eq!(nic.cq.len(), 1, "the NIC saw one signaled WR");
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(delivered(&mut qp, 1), [], "the user asked for none");
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn an_error_flushes_the_failing_vqps_later_wrs_and_reposts_the_others() {
    let (mut qp, cache, mut nic) = (dci(&[1, 2]), DcCache::new(64), ModelNic::default());
    cache.insert(target(1).target, 1);
    post(&mut qp, &mut nic, 1, &mut [wr(10, true), wr(11, true)]).unwrap();
    post(&mut qp, &mut nic, 2, &mut [wr(20, false), wr(21, true)]).unwrap();
    // VQP 1's first WR fails (its target is gone); the NIC flushes the rest.
    nic.exec(WcStatus::RetryExcErr);
    nic.exec_all();
    let before_reset = nic.cq.len();
    assert_eq!(before_reset, 4, "the error and three flushes");
    // The host routes the error, then stops (it recovers before posting).
    let err = nic.cq.pop_front().unwrap();
    qp.route(&cache, &err, None);
    assert!(qp.needs_recovery());
    assert_eq!(delivered(&mut qp, 1), [(10, WcStatus::RetryExcErr)]);
    assert_eq!(
        cache.lookup(&Gid([1; 16])),
        Lookup::Miss,
        "a dead target's entry is invalidated"
    );
    // A flush routed before the reset is not delivered.
    let flush = nic.cq.pop_front().unwrap();
    qp.route(&cache, &flush, None);
    // The host resets the QP; the core plans.
    nic.reset();
    let (guilty, again) = qp.reset(&cache);
    assert_eq!(guilty, Some(vqp(1)));
    assert!(!qp.needs_recovery());
    assert_eq!(delivered(&mut qp, 1), [(11, WcStatus::WrFlushErr)]);
    assert_eq!(
        again.iter().map(|(_, s)| s.user_wr_id).collect::<Vec<_>>(),
        [20, 21],
        "the innocent VQP's WRs, in order"
    );
    // Completions of the old incarnation still in the CQ match nothing.
    let stale = nic.cq.len();
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(qp.stats().stale_completions, stale as u64);
    qp.repost(&cache, &again, |w: &mut [SendWr]| nic.ring(w));
    assert_eq!(qp.outstanding(), 2);
    nic.exec_all();
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(
        delivered(&mut qp, 2),
        [(21, WcStatus::Success)],
        "the innocent VQP sees its own results once, as if nothing failed"
    );
    let s = qp.stats();
    // Error completions: the failure and its three flushes (one routed
    // before the reset, two drained after it as stale).
    assert_eq!(
        (
            s.recoveries,
            s.reposted,
            s.flushed_by_reset,
            s.error_completions
        ),
        (1, 2, 1, 4)
    );
    assert_eq!((qp.outstanding(), qp.free()), (0, DEPTH));
}

#[test]
fn a_qp_that_cannot_come_back_flushes_every_vqps_wrs() {
    let (mut qp, cache, mut nic) = (dci(&[1, 2]), DcCache::new(64), ModelNic::default());
    post(&mut qp, &mut nic, 1, &mut [wr(10, true)]).unwrap();
    post(&mut qp, &mut nic, 2, &mut [wr(20, true)]).unwrap();
    nic.exec(WcStatus::RemAccessErr);
    drain(&mut qp, &cache, &mut nic);
    let (_, again) = qp.reset(&cache);
    qp.flush_all(&cache, &again);
    assert_eq!(delivered(&mut qp, 1), [(10, WcStatus::RemAccessErr)]);
    assert_eq!(delivered(&mut qp, 2), [(20, WcStatus::WrFlushErr)]);
    assert_eq!(qp.vqp_mut(vqp(2)).unwrap().in_flight(), 0);
}

#[test]
fn a_doorbell_the_nic_takes_in_part_commits_what_it_took() {
    let (mut qp, cache, mut nic) = (dci(&[1]), DcCache::new(64), ModelNic::default());
    nic.refuse_from = Some(2);
    let err = post(
        &mut qp,
        &mut nic,
        1,
        &mut [wr(1, true), wr(2, true), wr(3, true)],
    );
    assert!(matches!(
        err,
        Err(Refusal::Post(PostError { index: 2, .. }))
    ));
    assert_eq!(qp.outstanding(), 2);
    nic.exec_all();
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(
        delivered(&mut qp, 1),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn a_vqp_leaves_only_drained_and_a_dropped_ones_wrs_complete_as_orphans() {
    let (mut qp, cache, mut nic) = (dci(&[1, 2]), DcCache::new(64), ModelNic::default());
    post(&mut qp, &mut nic, 1, &mut [wr(1, true)]).unwrap();
    assert!(matches!(qp.detach_drained(vqp(1)), Some(Err(1))));
    assert!(qp.detach_drained(vqp(2)).unwrap().is_ok(), "none in flight");
    assert!(qp.detach_drained(vqp(2)).is_none(), "no longer held");
    // A VQP dropped with a WR in flight: its completion is an orphan.
    assert!(qp.detach(vqp(1)).is_some());
    assert!(qp.orphans_in_flight());
    nic.exec_all();
    drain(&mut qp, &cache, &mut nic);
    assert_eq!(qp.stats().orphaned, 1);
    assert!(!qp.orphans_in_flight());
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn an_rc_pair_refuses_a_vqp_whose_target_moved_and_a_full_vqp_waits() {
    let mut qp = SharedQp::new(
        QpShape {
            depth: DEPTH,
            precheck: false,
            policy: Policy::default(),
            peer: Some(Gid([1; 16])),
        },
        Instant::now(),
    );
    let mut st = VqpState::new(2, Ungranted::Allow);
    st.set_target(Some(target(2)));
    qp.attach(vqp(1), st);
    let mut wrs = [wr(1, true)];
    assert!(matches!(
        qp.plan(vqp(1), &mut wrs, &Policy::default(), || unreachable!()),
        Err(Refusal::Stale)
    ));
    qp.vqp_mut(vqp(1)).unwrap().set_target(Some(target(1)));
    let mut nic = ModelNic::default();
    post(&mut qp, &mut nic, 1, &mut [wr(1, true), wr(2, true)]).unwrap();
    assert!(
        qp.plan(vqp(1), &mut wrs, &Policy::default(), || unreachable!())
            .unwrap()
            .is_none(),
        "no room: the host drains, then refuses"
    );
    assert!(matches!(
        qp.full(vqp(1), 1),
        Refusal::VqpFull {
            outstanding: 2,
            capacity: 2,
            ..
        }
    ));
    qp.vqp_mut(vqp(1)).unwrap().set_target(None);
    nic.exec_all();
    drain(&mut qp, &DcCache::new(8), &mut nic);
    let _ = delivered(&mut qp, 1);
    assert!(matches!(
        qp.plan(vqp(1), &mut wrs, &Policy::default(), || unreachable!()),
        Err(Refusal::NotConnected { .. })
    ));
}
