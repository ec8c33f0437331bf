//! loom model of completion routing and send-queue credit accounting on a
//! shared physical QP, driving kmod's real shared-QP core
//! ([`krcore_kmod::sharedqp::SharedQp`]) the way its host
//! (`kmod/src/engine/physqp/`: `post`, `drain`) drives it: the core under
//! the QP's one lock; a post plans and rings in one call, the doorbell
//! being the model NIC's; a poll drains the CQ and routes every
//! completion through the core, then pops the VQP's ring.
//!
//! The model NIC executes a WR when its doorbell rings and pushes the
//! completion of a signaled WR into the CQ (its own lock, like a CQ
//! ring).
//!
//! Invariants: every WR a user signaled is delivered to its own VQP exactly
//! once (no lost, no duplicate, no misrouted completion); the core never
//! counts a completion stale or orphaned (no credit counted twice or for an
//! unposted WR); when everything has completed every credit is free again
//! and no VQP has a WR in flight.
//!
//! The core stages, rings and commits a batch in one `&mut` call, so the
//! host cannot ring a doorbell whose records are not yet committed (the
//! first mutation of the hand-made mirror this model replaced cannot be
//! written any more). The host's remaining protocol step is switchable, and
//! the `mutation_*` model removes it and must fail (`should_panic`): that is
//! the proof that the invariants are checked, not hoped.
#![cfg(krcore_loom)]

use std::collections::VecDeque;
use std::time::Instant;

use krcore_kmod::sharedqp::{QpShape, SharedQp, VqpState};
use krcore_kmod::{CachedTarget, DcCache, Policy, Ungranted, VqpId};
use krcore_nic::{DcTarget, Gid, PostError, RemoteAddr, SendWr, Sge, Wc, WcStatus};
use loom::sync::{Arc, Mutex};
use loom::thread;

const DEPTH: u32 = 4;
const VQPS: usize = 2;

/// Which protected steps the host performs.
#[derive(Clone, Copy)]
struct Steps {
    /// Completions are taken from the CQ and routed under the QP lock (else:
    /// taken under the CQ lock only, routed afterwards).
    drain_under_qp_lock: bool,
}

const CORRECT: Steps = Steps {
    drain_under_qp_lock: true,
};

/// What the QP lock guards: the core, and what each VQP has polled.
struct Phys {
    core: SharedQp,
    delivered: Vec<Vec<u64>>,
}

struct Qp {
    steps: Steps,
    phys: Mutex<Phys>,
    cq: Mutex<VecDeque<Wc>>,
    cache: DcCache,
}

fn vqp(v: usize) -> VqpId {
    VqpId::new(v as u32 + 1).unwrap()
}

/// One queue of depth 4 taking batches of up to 3 (one unsignaled WR at
/// most after a signaled one).
fn policy() -> Policy {
    Policy {
        max_unsignaled: 1,
        ..Policy::default()
    }
}

impl Qp {
    fn new(steps: Steps) -> Qp {
        let mut core = SharedQp::new(
            QpShape {
                depth: DEPTH,
                precheck: false,
                policy: policy(),
                peer: None,
            },
            Instant::now(),
        );
        let target = CachedTarget {
            target: DcTarget {
                gid: Gid([1; 16]),
                dct_num: 1,
                dc_key: 1,
            },
            epoch: 1,
        };
        for v in 0..VQPS {
            let mut st = VqpState::new(DEPTH, Ungranted::Allow);
            st.set_target(Some(target));
            core.attach(vqp(v), st);
        }
        Qp {
            steps,
            phys: Mutex::new(Phys {
                core,
                delivered: vec![Vec::new(); VQPS],
            }),
            cq: Mutex::new(VecDeque::new()),
            cache: DcCache::new(8),
        }
    }

    /// The NIC: executes the doorbell's WRs; signaled ones complete.
    fn ring(&self, wrs: &mut [SendWr]) -> Result<(), PostError> {
        let mut cq = self.cq.lock().unwrap();
        for w in wrs.iter().filter(|w| w.is_signaled()) {
            cq.push_back(Wc {
                wr_id: w.wr_id,
                status: WcStatus::Success,
                ..Wc::default()
            });
        }
        Ok(())
    }

    /// VQP `v` posts user WRs `(user_wr_id, signaled)` as one doorbell,
    /// through the core's general path (plan, then ring).
    fn post(&self, v: usize, user: &[(u64, bool)]) {
        let mut wrs: Vec<SendWr> = user
            .iter()
            .map(|&(id, s)| SendWr::read(id, Sge::default(), RemoteAddr::default()).signaled(s))
            .collect();
        let mut p = self.phys.lock().unwrap();
        let plan = p
            .core
            .plan(vqp(v), &mut wrs, &policy(), || unreachable!("no grant"))
            .expect("the pre-check takes the batch")
            .expect("the VQP has room");
        assert!(!plan.must_reclaim(), "the model's queue always has room");
        p.core
            .ring(
                vqp(v),
                &mut wrs,
                plan.force_signal.is_some(),
                |w: &mut [SendWr]| self.ring(w),
            )
            .expect("the doorbell");
    }

    /// Routes `wcs` through the core and moves what each VQP was
    /// delivered into its list.
    fn route(&self, p: &mut Phys, wcs: &[Wc]) {
        for wc in wcs {
            p.core.route(&self.cache, wc, None);
        }
        let s = p.core.stats();
        assert_eq!(
            (s.stale_completions, s.orphaned),
            (0, 0),
            "account refused a completion"
        );
        for v in 0..VQPS {
            let mut out = [Wc::default(); 4];
            let n = p.core.pop(vqp(v), &mut out);
            for wc in &out[..n] {
                assert_eq!(wc.qp_num, vqp(v).get(), "misrouted");
                p.delivered[v].push(wc.wr_id);
            }
        }
    }

    /// Drains the CQ and routes every completion.
    fn poll(&self) {
        if self.steps.drain_under_qp_lock {
            let mut p = self.phys.lock().unwrap();
            let wcs: Vec<Wc> = self.cq.lock().unwrap().drain(..).collect();
            self.route(&mut p, &wcs);
        } else {
            let wcs: Vec<Wc> = self.cq.lock().unwrap().drain(..).collect();
            let mut p = self.phys.lock().unwrap();
            self.route(&mut p, &wcs);
        }
    }

    /// What VQP `v` has been delivered so far.
    fn delivered(&self, v: usize) -> Vec<u64> {
        self.phys.lock().unwrap().delivered[v].clone()
    }
}

/// VQP `v` posts an unsignaled WR and a signaled one (one doorbell), then
/// polls until its signaled WR is delivered (bounded).
fn user(qp: &Qp, v: usize) {
    let base = 100 * (v as u64 + 1);
    qp.post(v, &[(base, false), (base + 1, true)]);
    for _ in 0..3 {
        qp.poll();
        if !qp.delivered(v).is_empty() {
            return;
        }
        thread::yield_now();
    }
}

fn model(steps: Steps) {
    loom::model(move || {
        let qp = Arc::new(Qp::new(steps));
        let other = {
            let qp = qp.clone();
            thread::spawn(move || user(&qp, 1))
        };
        user(&qp, 0);
        other.join().unwrap();
        qp.poll();
        let mut p = qp.phys.lock().unwrap();
        for v in 0..VQPS {
            let want = vec![100 * (v as u64 + 1) + 1];
            assert_eq!(
                p.delivered[v], want,
                "VQP {v}: lost, duplicate or misrouted"
            );
        }
        assert_eq!(p.core.free(), DEPTH, "a credit leaked or was counted twice");
        assert_eq!(p.core.outstanding(), 0);
        for v in 0..VQPS {
            let st = p.core.vqp_mut(vqp(v)).expect("still attached");
            assert_eq!(st.in_flight(), 0, "a WR never left its VQP's count");
        }
    });
}

#[test]
fn shared_qp_routes_every_completion_once_and_credits_exactly() {
    model(CORRECT);
}

/// Mutation: completions are taken from the CQ without the QP lock and
/// routed later. Two pollers can route them out of send-queue order: the
/// later one credits the earlier signaled WR too, and the earlier one's
/// completion then matches nothing (counted stale: lost).
#[test]
#[should_panic(expected = "account refused a completion")]
fn mutation_draining_outside_the_qp_lock_routes_out_of_order() {
    model(Steps {
        drain_under_qp_lock: false,
    });
}
