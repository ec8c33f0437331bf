//! loom model of completion routing and send-queue credit accounting on a
//! shared physical QP, with kmod's pure pieces as the engine uses them: the
//! QP's [`SendQueueCredits`] keeping ONE record per WR (the WR as posted,
//! physical wr_id `(VQP, QP sequence)`), staged, rung and committed
//! ([`SendQueueCredits::stage`], [`SendQueueCredits::commit`]), the user's
//! wr_id and signal flag beside it ([`Slot`], same index), and a count of
//! outstanding WRs per VQP; completions are resolved by their sequence bits
//! ([`SendQueueCredits::resolve`]) and credit every record up to theirs
//! ([`SendQueueCredits::complete_range`]), driven the way the engine host
//! (`kmod/src/engine/physqp.rs`: `post`, `ring_doorbell`, `route`,
//! `deliver`) drives them.
//!
//! The modeled host: a QP lock guards the account, the user slots, the
//! counts and the doorbell; the NIC executes a WR when its doorbell rings
//! and pushes the completion of a signaled WR into the CQ (its own lock,
//! like a CQ ring). A poll drains the CQ and routes every completion to its
//! VQP.
//!
//! Invariants: every WR a user signaled is delivered to its own VQP exactly
//! once (no lost, no duplicate, no misrouted completion); the account never
//! refuses a completion (no credit counted twice or for an unposted WR); no
//! VQP's count of outstanding WRs goes negative; and when everything has
//! completed every credit is free again and every count is 0.
//!
//! The two steps the protocol needs are switchable, and the `mutation_*`
//! models remove one each and must fail (`should_panic`): that is the proof
//! that the invariants are checked, not hoped.
#![cfg(krcore_loom)]

use std::collections::VecDeque;

use krcore_kmod::{PhysWrId, Posted, SendQueueCredits, Slot, VqpId};
use krcore_nic::{RemoteAddr, SendWr, Sge, Wc, WcStatus};
use loom::sync::{Arc, Mutex};
use loom::thread;

const DEPTH: u32 = 4;
const VQPS: usize = 2;

/// Which protected steps the host performs.
#[derive(Clone, Copy)]
struct Steps {
    /// The records are committed to the account in the same critical
    /// section as the doorbell (else: doorbell first, commit afterwards).
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
    credits: SendQueueCredits<SendWr>,
    /// The user's wr_id and flag of each record, at sequence mod its length.
    users: Vec<Slot>,
    /// WRs outstanding per VQP.
    outstanding: Vec<u32>,
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
        let len = DEPTH.next_power_of_two();
        let empty = SendWr::read(0, Sge::default(), RemoteAddr::default());
        Qp {
            steps,
            phys: Mutex::new(Phys {
                credits: SendQueueCredits::with_records(DEPTH, len - 1, empty),
                users: vec![Slot::default(); len as usize],
                outstanding: vec![0; VQPS],
                delivered: vec![Vec::new(); VQPS],
            }),
            cq: Mutex::new(VecDeque::new()),
        }
    }

    /// The NIC: executes the doorbell's WRs; signaled ones complete.
    fn ring(&self, wrs: &[SendWr]) {
        let mut cq = self.cq.lock().unwrap();
        for w in wrs.iter().filter(|w| w.is_signaled()) {
            cq.push_back(Wc {
                wr_id: w.wr_id,
                status: WcStatus::Success,
                ..Wc::default()
            });
        }
    }

    /// VQP `v` posts user WRs `(user_wr_id, signaled)` as one doorbell:
    /// staged into the records, rung, committed.
    fn post(&self, v: usize, user: &[(u64, bool)]) {
        let vqp = VqpId::new(v as u32 + 1).unwrap();
        let mut guard = self.phys.lock().unwrap();
        let p = &mut *guard;
        let first = p.credits.next_seq();
        let mask = p.users.len() - 1;
        let staged = p.credits.stage(user.len()).expect("credits");
        for (i, (rec, &(id, signaled))) in staged.iter_mut().zip(user).enumerate() {
            let seq = first + i as u64;
            let wr_id = PhysWrId::new(vqp, seq).raw();
            *rec = SendWr::read(wr_id, Sge::default(), RemoteAddr::default()).signaled(signaled);
            p.users[(seq as usize) & mask] = Slot {
                user_wr_id: id,
                user_signaled: signaled,
            };
        }
        if self.steps.record_with_doorbell {
            self.ring(staged);
            p.credits.commit(user.len());
            p.outstanding[v] += user.len() as u32;
        } else {
            let rung: Vec<SendWr> = staged.to_vec();
            drop(guard);
            self.ring(&rung);
            let mut p = self.phys.lock().unwrap();
            p.credits.commit(user.len());
            p.outstanding[v] += user.len() as u32;
        }
    }

    /// Routes one completion: credits the account through its record, and
    /// retires every record up to it from its VQP's count; the completed
    /// one is delivered when its user signaled it.
    fn route(p: &mut Phys, wc: &Wc) {
        let wr_id = PhysWrId::from_raw(wc.wr_id);
        let retired = p
            .credits
            .resolve(wr_id)
            .ok_or_else(|| format!("no outstanding WR has {wr_id:?}"))
            .and_then(|seq| {
                p.credits
                    .complete_range(seq, wc.status)
                    .map_err(|e| e.to_string())
            })
            .unwrap_or_else(|e| panic!("account refused a completion: {e}"));
        let mask = p.users.len() - 1;
        let last = retired.end - 1;
        for seq in retired {
            let v = p.credits.record(seq).wr_id().vqp().get() as usize - 1;
            p.outstanding[v] = p.outstanding[v]
                .checked_sub(1)
                .expect("a VQP's outstanding count went negative");
            let slot = p.users[(seq as usize) & mask];
            if seq == last {
                if slot.user_signaled {
                    p.delivered[v].push(slot.user_wr_id);
                }
            } else {
                assert!(!slot.user_signaled, "a signaled WR retired silently");
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
        assert_eq!(
            p.outstanding,
            vec![0; VQPS],
            "a WR never left its VQP's count"
        );
    });
}

#[test]
fn shared_qp_routes_every_completion_once_and_credits_exactly() {
    model(CORRECT);
}

/// Mutation: the records are committed after the doorbell, outside its
/// critical section. A poller can then see a completion the account does
/// not know yet (and another poster can stage over the uncommitted
/// records): the completion is refused (lost).
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
