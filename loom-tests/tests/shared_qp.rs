//! loom model of completion routing and send-queue credit accounting on a
//! shared physical QP, with kmod's pure pieces: [`SendQueueCredits`] (the
//! QP's account) and one [`SlotTable`] per VQP (physical wr_id -> the user's
//! wr_id), driven the way the engine host drives them.
//!
//! The modeled host: a QP lock guards the account, the slot tables and the
//! doorbell; the NIC executes a WR when its doorbell rings and pushes the
//! completion of a signaled WR into the CQ (its own lock, like a CQ ring).
//! A poll drains the CQ and routes every completion to its VQP.
//!
//! Invariants: every WR a user signaled is delivered to its own VQP exactly
//! once (no lost, no duplicate, no misrouted completion); the account never
//! refuses a completion (no credit counted twice or for an unposted WR); and
//! when everything has completed every credit is free again.
//!
//! The two steps the protocol needs are switchable, and the `mutation_*`
//! models remove one each and must fail (`should_panic`): that is the proof
//! that the invariants are checked, not hoped.
#![cfg(krcore_loom)]

use std::collections::VecDeque;

use krcore_kmod::{PhysWrId, PostedWr, SendQueueCredits, SlotTable, VqpId};
use krcore_nic::{Wc, WcStatus};
use loom::sync::{Arc, Mutex};
use loom::thread;

const DEPTH: u32 = 4;
const VQPS: usize = 2;

/// Which protected steps the host performs.
#[derive(Clone, Copy)]
struct Steps {
    /// The account and slot table are updated in the same critical section
    /// as the doorbell (else: doorbell first, account afterwards).
    record_with_doorbell: bool,
    /// Completions are taken from the CQ and routed under the QP lock (else:
    /// taken under the CQ lock only, routed afterwards).
    drain_under_qp_lock: bool,
}

const CORRECT: Steps = Steps {
    record_with_doorbell: true,
    drain_under_qp_lock: true,
};

struct Phys {
    credits: SendQueueCredits,
    slots: Vec<SlotTable>,
    /// User wr_ids delivered to each VQP.
    delivered: Vec<Vec<u64>>,
}

struct Qp {
    steps: Steps,
    phys: Mutex<Phys>,
    cq: Mutex<VecDeque<Wc>>,
}

impl Qp {
    fn new(steps: Steps) -> Qp {
        Qp {
            steps,
            phys: Mutex::new(Phys {
                credits: SendQueueCredits::new(DEPTH),
                slots: (0..VQPS).map(|_| SlotTable::new(DEPTH)).collect(),
                delivered: vec![Vec::new(); VQPS],
            }),
            cq: Mutex::new(VecDeque::new()),
        }
    }

    /// The NIC: executes the doorbell's WRs; signaled ones complete.
    fn ring(&self, wrs: &[PostedWr]) {
        let mut cq = self.cq.lock().unwrap();
        for w in wrs.iter().filter(|w| w.signaled) {
            cq.push_back(Wc {
                wr_id: w.wr_id.raw(),
                status: WcStatus::Success,
                ..Wc::default()
            });
        }
    }

    /// VQP `v` posts user WRs `(user_wr_id, signaled)` as one doorbell.
    fn post(&self, v: usize, user: &[(u64, bool)]) {
        let vqp = VqpId::new(v as u32 + 1).unwrap();
        let mut p = self.phys.lock().unwrap();
        let wrs: Vec<PostedWr> = user
            .iter()
            .map(|&(id, signaled)| {
                let seq = p.slots[v].push(id, signaled).expect("VQP has room");
                PostedWr {
                    wr_id: PhysWrId::new(vqp, seq),
                    signaled,
                }
            })
            .collect();
        if self.steps.record_with_doorbell {
            p.credits.post(wrs.iter().copied()).expect("credits");
            self.ring(&wrs);
        } else {
            drop(p);
            self.ring(&wrs);
            let mut p = self.phys.lock().unwrap();
            p.credits.post(wrs.iter().copied()).expect("credits");
        }
    }

    /// Routes one completion: credits the account, retires the VQP's slots
    /// and delivers what the user signaled.
    fn route(p: &mut Phys, wc: &Wc) {
        let retired: Vec<PostedWr> = p
            .credits
            .complete_wr_id(PhysWrId::from_raw(wc.wr_id), wc.status)
            .unwrap_or_else(|e| panic!("account refused a completion: {e}"))
            .map(|(_, w)| w)
            .collect();
        for w in retired {
            let v = w.wr_id.vqp().get() as usize - 1;
            let seq = p.slots[v]
                .resolve(w.wr_id.wire_seq())
                .expect("a retired WR has a slot");
            let slots: Vec<_> = p.slots[v].retire_through(seq).unwrap().collect();
            for (_, s) in slots {
                if s.user_signaled {
                    p.delivered[v].push(s.user_wr_id);
                }
            }
        }
    }

    /// Drains the CQ and routes every completion.
    fn poll(&self) {
        if self.steps.drain_under_qp_lock {
            let mut p = self.phys.lock().unwrap();
            let wcs: Vec<Wc> = self.cq.lock().unwrap().drain(..).collect();
            for wc in &wcs {
                Qp::route(&mut p, wc);
            }
        } else {
            let wcs: Vec<Wc> = self.cq.lock().unwrap().drain(..).collect();
            let mut p = self.phys.lock().unwrap();
            for wc in &wcs {
                Qp::route(&mut p, wc);
            }
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
        let p = qp.phys.lock().unwrap();
        for v in 0..VQPS {
            let want = vec![100 * (v as u64 + 1) + 1];
            assert_eq!(
                p.delivered[v], want,
                "VQP {v}: lost, duplicate or misrouted"
            );
        }
        assert_eq!(
            p.credits.free(),
            DEPTH,
            "a credit leaked or was counted twice"
        );
        assert_eq!(p.credits.outstanding(), 0);
    });
}

#[test]
fn shared_qp_routes_every_completion_once_and_credits_exactly() {
    model(CORRECT);
}

/// Mutation: the account is updated after the doorbell, outside its
/// critical section. A poller can then see a completion the account does
/// not know yet: the completion is refused (lost).
#[test]
#[should_panic(expected = "account refused a completion")]
fn mutation_recording_after_the_doorbell_loses_completions() {
    model(Steps {
        record_with_doorbell: false,
        ..CORRECT
    });
}

/// Mutation: completions are taken from the CQ without the QP lock and
/// routed later. Two pollers can route them out of send-queue order: the
/// later one credits the earlier signaled WR too, and the earlier one's
/// completion is then refused (lost).
#[test]
#[should_panic(expected = "account refused a completion")]
fn mutation_draining_outside_the_qp_lock_routes_out_of_order() {
    model(Steps {
        drain_under_qp_lock: false,
        ..CORRECT
    });
}
