//! loom model of the VQP switch from DC to RC with in-flight work (kmod's
//! `engine::upgrade`), and of the way back when the pair is evicted,
//! driving kmod's real shared-QP core ([`SharedQp`]) on both physical QPs:
//! each one's account keeps ONE record per WR, completions are routed by
//! the core, and the VQP's state (the real [`VqpState`]: its COUNT of WRs
//! in flight and its ring of unpolled completions) moves between the two
//! cores ([`SharedQp::detach_drained`], [`SharedQp::attach`]); the records
//! stay with the QP that posted them.
//!
//! The modeled host mirrors `engine/upgrade.rs` and `engine/physqp/`:
//! - a physical QP (the DCI, the RC pair) has one lock guarding its core,
//!   its send queue, its CQ and its doorbell; a doorbelled WR stays in
//!   flight (in the send queue) until the next poll of that QP, when the
//!   NIC has executed it into the CQ; a poll then routes the whole CQ
//!   through the core (as `PhysQp::drain` does) and pops one completion,
//!   so a switch or an eviction can find WRs in flight and completions not
//!   yet polled;
//! - the VQP's binding: a lock over `{rc, pending}`, an `on_rc` flag read
//!   without it by the fast paths, and `due` (`next_at == 0`: the next post
//!   tries to switch);
//! - the switch (`Vqp::switch` over `PhysQp::detach_drained`): the state
//!   leaves the DCI only if its count of WRs in flight there is 0,
//!   checked and taken under the DCI's single lock; the state carries its
//!   unpolled completions along;
//! - the background build (`upgrade::request_build` and the builder
//!   thread): a thread of its own makes the pair (`built`) at any moment
//!   while the VQP, due to upgrade, keeps posting on its DCI; a post that
//!   looks (`Vqp::try_upgrade`) and finds the pair takes it as pending and
//!   switches under the same drain rule;
//! - eviction (`PhysQp::close_if_idle`): drains the pair's CQ and closes it
//!   only with nothing in flight; the next post finds it closed (`Stale`) and
//!   moves the state back to the DCI (`Vqp::downgrade`).
//!
//! Every WR gets the next value of one global ticket counter under its QP's
//! lock, as its user wr_id: the post order. Invariants: the VQP is
//! delivered exactly the tickets `0..n` in that order (no lost, no
//! duplicate completion; per-VQP order kept across the switch), nothing is
//! posted on one QP while the VQP has WRs in flight on the other, no
//! completion is refused by a core, and at the end both accounts are empty
//! and the state is in exactly one place.
//!
//! The protected steps are switchable; each `mutation_*` model removes one
//! and must fail (`should_panic`).
#![cfg(krcore_loom)]

use std::collections::VecDeque;
use std::time::Instant;

use krcore_kmod::sharedqp::{QpShape, SharedQp, VqpState};
use krcore_kmod::{CachedTarget, DcCache, Policy, Ungranted, VqpId};
use krcore_nic::{DcTarget, Gid, PostError, RemoteAddr, SendWr, Sge, Wc, WcStatus};
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use loom::sync::{Arc, Mutex};
use loom::thread;

const DEPTH: u32 = 4;

fn vqp_id() -> VqpId {
    VqpId::new(1).unwrap()
}

/// One signaled WR per post; the queue takes batches of up to 3.
fn policy() -> Policy {
    Policy {
        max_unsignaled: 1,
        ..Policy::default()
    }
}

/// The VQP's target: the pair's peer (an RC post names no other).
fn target() -> CachedTarget {
    CachedTarget {
        target: DcTarget {
            gid: Gid([1; 16]),
            dct_num: 1,
            dc_key: 1,
        },
        epoch: 1,
    }
}

/// Which protected steps the host performs.
#[derive(Clone, Copy)]
struct Steps {
    /// The switch checks "drained" and detaches in one DCI critical section
    /// (else: checks under one acquisition, detaches under a second).
    check_and_move_under_one_lock: bool,
    /// The switch waits for the VQP's DCI WRs to drain (else: moves at once).
    wait_for_drain: bool,
    /// The moved state keeps its unpolled completions (else: they stay
    /// behind on the DCI's side and are dropped with its entry).
    move_unpolled: bool,
    /// Eviction closes a pair only with nothing in flight (else: whatever
    /// is in flight is destroyed with the QP).
    evict_only_idle: bool,
}

const CORRECT: Steps = Steps {
    check_and_move_under_one_lock: true,
    wait_for_drain: true,
    move_unpolled: true,
    evict_only_idle: true,
};

struct QpState {
    open: bool,
    /// The real core (account, VQP table, routing).
    core: SharedQp,
    /// Doorbelled WRs the NIC has not executed yet.
    sq: VecDeque<Wc>,
    cq: VecDeque<Wc>,
}

/// A physical QP (the DCI or the RC pair).
struct Qp {
    name: &'static str,
    state: Mutex<QpState>,
    /// Oracle: the VQP's WRs posted here and not yet routed.
    inflight: AtomicU32,
    /// The DCCache the core invalidates a failed target in (none fails
    /// here).
    cache: DcCache,
}

enum PostFail {
    /// This QP does not hold the VQP's state, or is closed.
    Stale,
}

impl Qp {
    fn new(name: &'static str, vqp: bool, peer: Option<Gid>) -> Qp {
        let mut core = SharedQp::new(
            QpShape {
                depth: DEPTH,
                precheck: false,
                policy: policy(),
                peer,
            },
            Instant::now(),
        );
        if vqp {
            let mut v = VqpState::new(DEPTH, Ungranted::Allow);
            v.set_target(Some(target()));
            core.attach(vqp_id(), v);
        }
        Qp {
            name,
            state: Mutex::new(QpState {
                open: true,
                core,
                sq: VecDeque::new(),
                cq: VecDeque::new(),
            }),
            inflight: AtomicU32::new(0),
            cache: DcCache::new(8),
        }
    }

    /// Posts one signaled WR for the VQP (`PhysQp::post`, the core's plan
    /// and doorbell); `other` is the VQP's other QP, checked by the oracle.
    fn post(&self, other: &Qp, ticket: &AtomicU64) -> Result<(), PostFail> {
        let mut guard = self.state.lock().unwrap();
        let QpState { open, core, sq, .. } = &mut *guard;
        if !*open {
            return Err(PostFail::Stale);
        }
        let Some(v) = core.vqp_mut(vqp_id()) else {
            return Err(PostFail::Stale);
        };
        assert_eq!(
            other.inflight.load(SeqCst),
            0,
            "posted on {} while WRs of the VQP are in flight on {}",
            self.name,
            other.name
        );
        assert!(v.occupied() < DEPTH, "VQP has room");
        let id = ticket.fetch_add(1, SeqCst);
        let mut wrs = [SendWr::read(id, Sge::default(), RemoteAddr::default()).signaled(true)];
        let plan = core
            .plan(vqp_id(), &mut wrs, &policy(), || unreachable!("no grant"))
            .expect("the pre-check takes it")
            .expect("room");
        // The doorbell: the WR is the NIC's now; it completes later.
        core.ring(
            vqp_id(),
            &mut wrs,
            plan.force_signal.is_some(),
            |w: &mut [SendWr]| -> Result<(), PostError> {
                sq.extend(w.iter().map(|w| Wc {
                    wr_id: w.wr_id,
                    status: WcStatus::Success,
                    ..Wc::default()
                }));
                Ok(())
            },
        )
        .expect("the doorbell");
        self.inflight.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Routes the CQ's oldest completion through the core (`route`).
    fn route_one(&self, st: &mut QpState) -> bool {
        let Some(wc) = st.cq.pop_front() else {
            return false;
        };
        let before = st.core.outstanding();
        let stale = st.core.stats().stale_completions;
        st.core.route(&self.cache, &wc, None);
        assert_eq!(
            st.core.stats().stale_completions,
            stale,
            "{}: account refused a completion",
            self.name
        );
        let retired = before - st.core.outstanding();
        self.inflight.fetch_sub(retired, SeqCst);
        true
    }

    /// Polls one completion for the VQP (`PhysQp::poll`) into `delivered`:
    /// `None` when this QP does not hold its state.
    fn poll(&self, delivered: &std::sync::Mutex<Vec<u64>>) -> Option<usize> {
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        st.core.vqp_mut(vqp_id())?;
        // The NIC has executed what was posted before this poll.
        let done: Vec<Wc> = st.sq.drain(..).collect();
        st.cq.extend(done);
        while self.route_one(st) {}
        let mut out = [Wc::default(); 1];
        let n = st.core.pop(vqp_id(), &mut out);
        if n == 1 {
            delivered.lock().unwrap().push(out[0].wr_id);
        }
        Some(n)
    }

    /// `PhysQp::detach_drained`: the state, if none of its WRs is in flight.
    fn detach_drained(&self, steps: Steps) -> Option<VqpState> {
        let mut st = self.state.lock().unwrap();
        let mut v = if !steps.wait_for_drain {
            st.core.detach(vqp_id())?
        } else if steps.check_and_move_under_one_lock {
            st.core.detach_drained(vqp_id())?.ok()?
        } else {
            if st.core.vqp_mut(vqp_id())?.in_flight() > 0 {
                return None;
            }
            drop(st);
            st = self.state.lock().unwrap();
            st.core.detach(vqp_id())?
        };
        if !steps.move_unpolled {
            let mut out = [Wc::default(); DEPTH as usize];
            while v.pop(&mut out) > 0 {}
        }
        Some(v)
    }

    /// `PhysQp::detach` (a closed pair: nothing of the VQP in flight).
    fn detach(&self) -> Option<VqpState> {
        self.state.lock().unwrap().core.detach(vqp_id())
    }

    fn attach(&self, v: VqpState) {
        let mut st = self.state.lock().unwrap();
        assert!(
            st.core.vqp_mut(vqp_id()).is_none(),
            "{} already holds the VQP",
            self.name
        );
        st.core.attach(vqp_id(), v);
    }

    /// `PhysQp::close_if_idle` (eviction): drains the CQ, closes if idle.
    fn close_if_idle(&self, steps: Steps) -> bool {
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        while self.route_one(st) {}
        if steps.evict_only_idle && st.core.outstanding() > 0 {
            return false;
        }
        st.open = false;
        // Destroying the QP: whatever was still in flight is gone.
        st.sq.clear();
        st.cq.clear();
        true
    }
}

/// The binding's lock-guarded part (`upgrade::Slot`).
struct Bound {
    rc: bool,
    pending: bool,
}

/// The VQP and its binding (`DcBinding`).
struct Vqp {
    steps: Steps,
    dci: Qp,
    rc: Qp,
    slot: Mutex<Bound>,
    on_rc: AtomicBool,
    /// `next_at == 0`: the next post goes down the slow path to switch.
    due: AtomicBool,
    /// The builder thread made the pair (it is in the pair cache).
    built: AtomicBool,
    ticket: AtomicU64,
    /// What the user has polled, in order (moves with the state: appended
    /// under the lock of the QP that holds it; not a loom lock, so that it
    /// adds no interleaving of its own).
    delivered: std::sync::Mutex<Vec<u64>>,
}

impl Vqp {
    fn new(steps: Steps, on_rc: bool) -> Vqp {
        Vqp {
            steps,
            dci: Qp::new("the DCI", !on_rc, None),
            rc: Qp::new("the RC pair", on_rc, Some(target().target.gid)),
            slot: Mutex::new(Bound {
                rc: on_rc,
                pending: false,
            }),
            on_rc: AtomicBool::new(on_rc),
            due: AtomicBool::new(false),
            built: AtomicBool::new(false),
            ticket: AtomicU64::new(0),
            delivered: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// `Vqp::switch`: moves the state to the pending pair if drained.
    fn switch(&self, slot: &mut Bound) -> bool {
        if !slot.pending {
            return false;
        }
        match self.dci.detach_drained(self.steps) {
            Some(v) => {
                self.rc.attach(v);
                slot.pending = false;
                slot.rc = true;
                self.on_rc.store(true, SeqCst);
                true
            }
            None => false,
        }
    }

    /// The hint (`Vqp::upgrade`), the pair already made.
    fn upgrade(&self) -> bool {
        let mut slot = self.slot.lock().unwrap();
        if slot.rc {
            return true;
        }
        slot.pending = true;
        let moved = self.switch(&mut slot);
        if !moved {
            self.due.store(true, SeqCst);
        }
        moved
    }

    /// `Vqp::downgrade`: the pair is closed; the state goes back.
    fn downgrade(&self, slot: &mut Bound) {
        if !std::mem::take(&mut slot.rc) {
            return;
        }
        let v = self.rc.detach().expect("the closed pair held the state");
        self.dci.attach(v);
        self.on_rc.store(false, SeqCst);
        self.due.store(false, SeqCst);
    }

    /// `Vqp::post_send` in DC mode (`dc_direct`, then `post_dc_rest`): one
    /// signaled WR.
    fn post(&self) {
        if !self.on_rc.load(SeqCst)
            && !self.due.load(SeqCst)
            && self.dci.post(&self.rc, &self.ticket).is_ok()
        {
            return;
        }
        for _ in 0..4 {
            let mut slot = self.slot.lock().unwrap();
            if slot.rc {
                match self.rc.post(&self.dci, &self.ticket) {
                    Ok(()) => return,
                    Err(PostFail::Stale) => {
                        self.downgrade(&mut slot);
                        continue;
                    }
                }
            }
            if self.due.load(SeqCst) {
                // `try_upgrade`: an existing pair becomes the pending one.
                if !slot.pending && self.built.load(SeqCst) {
                    slot.pending = true;
                }
                if self.switch(&mut slot) {
                    continue;
                }
            }
            if self.dci.post(&self.rc, &self.ticket).is_ok() {
                return;
            }
        }
        panic!("post found the VQP's state nowhere");
    }

    /// `Vqp::poll` in DC mode (then `poll_dc_rest`): one completion at most.
    fn poll(&self) -> usize {
        if !self.on_rc.load(SeqCst) {
            if let Some(n) = self.dci.poll(&self.delivered) {
                return n;
            }
        }
        // Under the binding lock: no move in between.
        let slot = self.slot.lock().unwrap();
        let q = if slot.rc { &self.rc } else { &self.dci };
        q.poll(&self.delivered)
            .expect("the current QP holds the state")
    }

    /// After every thread joined: polls everything, checks the invariants.
    fn settle_and_check(&self) {
        let n = self.ticket.load(SeqCst);
        for _ in 0..n {
            self.poll();
        }
        let slot = self.slot.lock().unwrap();
        let (cur, other) = if slot.rc {
            (&self.rc, &self.dci)
        } else {
            (&self.dci, &self.rc)
        };
        let mut o = other.state.lock().unwrap();
        assert!(
            o.core.vqp_mut(vqp_id()).is_none(),
            "the state is in two places"
        );
        assert_eq!(o.core.outstanding(), 0, "a WR never completed");
        let mut c = cur.state.lock().unwrap();
        assert_eq!(
            *self.delivered.lock().unwrap(),
            (0..n).collect::<Vec<_>>(),
            "lost, duplicate or reordered completion"
        );
        assert_eq!(c.core.outstanding(), 0, "a WR never completed");
        let v = c.core.vqp_mut(vqp_id()).expect("the state is lost");
        assert_eq!(v.in_flight(), 0, "a WR stayed counted in flight");
    }
}

/// A user thread: posts a WR, polls once, posts another.
fn post_poll_post(vqp: &Vqp) {
    vqp.post();
    vqp.poll();
    vqp.post();
}

/// The switch: one WR already in flight on the DCI; a user posts, polls and
/// posts, another posts and polls, while the hint switches the VQP to its
/// pair.
fn upgrade_model(steps: Steps) {
    loom::model(move || {
        let vqp = Arc::new(Vqp::new(steps, false));
        vqp.post();
        let poster = {
            let vqp = vqp.clone();
            thread::spawn(move || post_poll_post(&vqp))
        };
        let poller = {
            let vqp = vqp.clone();
            thread::spawn(move || {
                vqp.post();
                vqp.poll();
            })
        };
        vqp.upgrade();
        poster.join().unwrap();
        poller.join().unwrap();
        vqp.settle_and_check();
    });
}

/// The background build: the VQP is due (its threshold crossed, the build
/// asked for) with one WR in flight; the builder makes the pair while a
/// user posts, polls and posts and another posts and polls. Once everything
/// settled, the next post switches.
fn background_model(steps: Steps) {
    loom::model(move || {
        let vqp = Arc::new(Vqp::new(steps, false));
        vqp.post();
        vqp.due.store(true, SeqCst);
        let builder = {
            let vqp = vqp.clone();
            thread::spawn(move || vqp.built.store(true, SeqCst))
        };
        let poster = {
            let vqp = vqp.clone();
            thread::spawn(move || post_poll_post(&vqp))
        };
        vqp.post();
        vqp.poll();
        builder.join().unwrap();
        poster.join().unwrap();
        vqp.settle_and_check();
        vqp.post();
        assert!(vqp.on_rc.load(SeqCst), "a drained, due VQP did not switch");
        vqp.settle_and_check();
    });
}

/// The way back: the VQP is on its pair with one WR in flight; a user
/// posts and polls while the pair is evicted, then posts again.
fn evict_model(steps: Steps) {
    loom::model(move || {
        let vqp = Arc::new(Vqp::new(steps, true));
        vqp.post();
        let poster = {
            let vqp = vqp.clone();
            thread::spawn(move || post_poll_post(&vqp))
        };
        vqp.rc.close_if_idle(vqp.steps);
        poster.join().unwrap();
        vqp.settle_and_check();
    });
}

#[test]
fn upgrade_switch_keeps_every_completion_once_and_in_order() {
    upgrade_model(CORRECT);
}

#[test]
fn eviction_moves_the_vqp_back_to_its_dci_losing_nothing() {
    evict_model(CORRECT);
}

#[test]
fn a_pair_built_in_the_background_is_taken_at_a_later_post_losing_nothing() {
    background_model(CORRECT);
}

/// Mutation: the VQP takes the pair built in the background without
/// waiting for its DCI WRs to drain.
#[test]
#[should_panic(expected = "in flight on the DCI")]
fn mutation_background_switch_without_waiting_for_drain() {
    background_model(Steps {
        wait_for_drain: false,
        ..CORRECT
    });
}

/// Mutation: "drained" is checked under one DCI lock acquisition and the
/// state taken under a second. A post on the DCI in between moves to the
/// pair with its WR in flight on the DCI.
#[test]
#[should_panic(expected = "in flight on the DCI")]
fn mutation_drain_check_and_move_under_two_locks() {
    upgrade_model(Steps {
        check_and_move_under_one_lock: false,
        ..CORRECT
    });
}

/// Mutation: the switch does not wait for the VQP's DCI WRs to drain.
#[test]
#[should_panic(expected = "in flight on the DCI")]
fn mutation_switching_without_waiting_for_drain() {
    upgrade_model(Steps {
        wait_for_drain: false,
        ..CORRECT
    });
}

/// Mutation: completions routed but not yet polled stay behind on the DCI.
#[test]
#[should_panic(expected = "lost, duplicate or reordered completion")]
fn mutation_switch_leaves_unpolled_completions_behind() {
    upgrade_model(Steps {
        move_unpolled: false,
        ..CORRECT
    });
}

/// Mutation: the pair is evicted with a WR in flight.
#[test]
#[should_panic(expected = "in flight on the RC pair")]
fn mutation_evicting_a_pair_with_work_in_flight() {
    evict_model(Steps {
        evict_only_idle: false,
        ..CORRECT
    });
}
