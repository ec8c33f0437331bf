//! One test per rejection and per plan outcome, and a property test of the
//! pre-check driving the credit engine.

use super::*;
use crate::credits::{PostedWr, SendQueueCredits};
use crate::wrid::{PhysWrId, VqpId};
use krcore_nic::{DcTarget, InlineData, RemoteAddr, SgList, Sge, UdTarget, WcStatus};
use std::time::Duration;

/// MR 0x1000+0x1000 with LOCAL_WRITE.
const RW: u32 = 0x10;
/// MR 0x4000+0x100 without LOCAL_WRITE.
const RO: u32 = 0x20;
/// Grant 0x10000+0x1000, all remote access, live.
const RKEY_ALL: u32 = 0x55;
/// Grant 0x10000+0x1000, REMOTE_READ only, live.
const RKEY_READ: u32 = 0x66;
/// Grant 0x10000+0x1000, all access, expired.
const RKEY_OLD: u32 = 0x77;
/// No grant known.
const RKEY_UNKNOWN: u32 = 0x1234;

const GRANT_ADDR: u64 = 0x10000;

fn peer() -> Gid {
    Gid([2; 16])
}

fn dc() -> Destination {
    Destination::Dc(DcTarget {
        gid: Gid([3; 16]),
        dct_num: 7,
        dc_key: 9,
    })
}

fn ud() -> Destination {
    Destination::Ud(UdTarget {
        gid: Gid([4; 16]),
        qpn: 5,
        qkey: 6,
    })
}

struct Fixture {
    mrs: HashMap<u32, LocalMr>,
    grants: HashMap<(Gid, u32), RemoteGrant>,
    now: Instant,
}

impl Fixture {
    fn new() -> Fixture {
        let t0 = Instant::now();
        let mut mrs = HashMap::new();
        mrs.insert(
            RW,
            LocalMr {
                addr: 0x1000,
                len: 0x1000,
                access: Access::LOCAL_WRITE,
            },
        );
        mrs.insert(
            RO,
            LocalMr {
                addr: 0x4000,
                len: 0x100,
                access: Access::NONE,
            },
        );
        let mut grants = HashMap::new();
        let all = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        for target in [Gid([3; 16]), peer()] {
            for (rkey, access, ttl) in [
                (RKEY_ALL, all, 10),
                (RKEY_READ, Access::REMOTE_READ, 10),
                (RKEY_OLD, all, 1),
            ] {
                let grant = RemoteGrant {
                    addr: GRANT_ADDR,
                    len: 0x1000,
                    access,
                    expires_at: Some(t0 + Duration::from_secs(ttl)),
                };
                grants.insert((target, rkey), grant);
            }
        }
        Fixture {
            mrs,
            grants,
            now: t0 + Duration::from_secs(5),
        }
    }

    fn ctx(
        &self,
        transport: QpKind,
    ) -> Precheck<'_, HashMap<u32, LocalMr>, HashMap<(Gid, u32), RemoteGrant>> {
        Precheck {
            transport,
            peer: Some(peer()),
            local_mrs: &self.mrs,
            grants: &self.grants,
            // The rule for unknown keys has tests of its own below.
            ungranted: Ungranted::Allow,
            now: self.now,
            queue: q(64, 64, 0),
            policy: Policy::default(),
        }
    }

    /// [`Fixture::ctx`] with no grant table at all.
    fn ctx_without_grants(
        &self,
        transport: QpKind,
    ) -> Precheck<'_, HashMap<u32, LocalMr>, NoGrants> {
        let ctx = self.ctx(transport);
        Precheck {
            transport,
            peer: ctx.peer,
            local_mrs: ctx.local_mrs,
            grants: &NoGrants,
            ungranted: ctx.ungranted,
            now: ctx.now,
            queue: ctx.queue,
            policy: ctx.policy,
        }
    }
}

fn q(depth: u32, free: u32, unsignaled_tail: u32) -> QueueView {
    QueueView {
        depth,
        free,
        unsignaled_tail,
    }
}

fn sge(lkey: u32, addr: u64, length: u32) -> Sge {
    Sge { addr, length, lkey }
}

fn remote(rkey: u32, offset: u64) -> RemoteAddr {
    RemoteAddr {
        addr: GRANT_ADDR + offset,
        rkey,
    }
}

fn read() -> SendWr {
    SendWr::read(1, sge(RW, 0x1000, 64), remote(RKEY_ALL, 0)).to(dc())
}

fn unsignaled(n: usize) -> Vec<SendWr> {
    vec![read().signaled(false); n]
}

fn rejected(f: &Fixture, transport: QpKind, batch: &[SendWr]) -> Rejection {
    f.ctx(transport)
        .check(batch)
        .expect_err("should be rejected")
}

fn reason(f: &Fixture, transport: QpKind, wr: SendWr) -> Reason {
    let r = rejected(f, transport, &[wr]);
    assert_eq!(r.index, 0);
    r.reason
}

#[test]
fn valid_batches_pass_on_every_transport() {
    let f = Fixture::new();
    let local = sge(RW, 0x1000, 8);
    for (transport, dest) in [(QpKind::Rc, Destination::Connected), (QpKind::Dc, dc())] {
        let batch = [
            SendWr::read(1, sge(RW, 0x1000, 0x1000), remote(RKEY_ALL, 0)).to(dest),
            SendWr::write(2, sge(RO, 0x4000, 0x100), remote(RKEY_ALL, 0xf00)).to(dest),
            SendWr::cas(3, local, remote(RKEY_ALL, 8), 0, 1).to(dest),
            SendWr::faa(4, local, remote(RKEY_ALL, 0xff8), 1).to(dest),
            SendWr::send(5, sge(RO, 0x4000, 16), Some(7)).to(dest),
            SendWr::read(6, local, remote(RKEY_UNKNOWN, 1 << 40)).to(dest),
        ];
        let plan = f.ctx(transport).check(&batch).unwrap();
        assert_eq!(
            plan,
            Plan {
                credits_short: 0,
                force_signal: None,
                unsignaled_after: 0
            }
        );
    }
    let send = SendWr::send(1, sge(RO, 0x4000, 16), None).to(ud());
    assert!(f.ctx(QpKind::Ud).check(&[send]).is_ok());
}

#[test]
fn rejects_an_empty_batch() {
    let f = Fixture::new();
    assert_eq!(
        rejected(&f, QpKind::Dc, &[]),
        Rejection {
            index: 0,
            reason: Reason::EmptyBatch
        }
    );
}

#[test]
fn rejects_a_batch_the_queue_can_never_take() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    // depth 64, max_unsignaled 16: at most 48 WRs per batch.
    assert_eq!(ctx.policy.max_batch(64), 48);
    assert!(ctx.check(&unsignaled(48)).is_ok());
    assert_eq!(
        ctx.check(&unsignaled(49)).unwrap_err(),
        Rejection {
            index: 48,
            reason: Reason::BatchTooLarge { len: 49, max: 48 }
        }
    );
    ctx.queue = q(4, 4, 0);
    assert_eq!(
        ctx.check(&unsignaled(2)).unwrap_err().reason,
        Reason::BatchTooLarge { len: 2, max: 1 }
    );
}

#[test]
fn rejects_opcodes_the_transport_does_not_carry() {
    let f = Fixture::new();
    let local = sge(RW, 0x1000, 8);
    for (wr, op) in [
        (SendWr::read(1, local, remote(RKEY_ALL, 0)), OpKind::Read),
        (SendWr::write(1, local, remote(RKEY_ALL, 0)), OpKind::Write),
        (
            SendWr::cas(1, local, remote(RKEY_ALL, 0), 0, 1),
            OpKind::CompareSwap,
        ),
        (
            SendWr::faa(1, local, remote(RKEY_ALL, 0), 1),
            OpKind::FetchAdd,
        ),
    ] {
        assert_eq!(
            reason(&f, QpKind::Ud, wr.to(ud())),
            Reason::OpNotAllowed {
                op,
                transport: QpKind::Ud
            }
        );
    }
}

#[test]
fn rejects_a_destination_of_the_wrong_kind() {
    let f = Fixture::new();
    let send = SendWr::send(1, sge(RW, 0x1000, 8), None);
    for (transport, dest) in [
        (QpKind::Dc, Destination::Connected),
        (QpKind::Rc, dc()),
        (QpKind::Ud, Destination::Connected),
        (QpKind::Dc, ud()),
    ] {
        assert_eq!(
            reason(&f, transport, send.to(dest)),
            Reason::WrongDestination { transport }
        );
    }
}

#[test]
fn rejects_too_many_sges() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_sge = 1;
    let mut wr = read();
    wr.payload =
        Payload::Local(SgList::from_slice(&[sge(RW, 0x1000, 8), sge(RW, 0x1100, 8)]).unwrap());
    assert_eq!(
        ctx.check(&[wr]).unwrap_err().reason,
        Reason::TooManySges { count: 2, max: 1 }
    );
}

#[test]
fn rejects_oversized_inline_data() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_inline = 16;
    let mut wr = SendWr::write(1, Sge::default(), remote(RKEY_ALL, 0)).to(dc());
    wr.payload = Payload::Inline(InlineData::new(&[7; 16]).unwrap());
    assert!(ctx.check(&[wr]).is_ok());
    wr.payload = Payload::Inline(InlineData::new(&[7; 32]).unwrap());
    assert_eq!(
        ctx.check(&[wr]).unwrap_err().reason,
        Reason::InlineTooLarge { len: 32, max: 16 }
    );
}

#[test]
fn rejects_inline_data_where_the_nic_writes_locally() {
    let f = Fixture::new();
    let mut wr = read();
    wr.payload = Payload::Inline(InlineData::new(&[0; 8]).unwrap());
    assert_eq!(
        reason(&f, QpKind::Dc, wr),
        Reason::InlineNotAllowed { op: OpKind::Read }
    );
}

#[test]
fn rejects_atomics_without_one_8_byte_sge() {
    let f = Fixture::new();
    let cas = SendWr::cas(1, sge(RW, 0x1000, 4), remote(RKEY_ALL, 0), 0, 1).to(dc());
    assert_eq!(
        reason(&f, QpKind::Dc, cas),
        Reason::AtomicSgeLength { sges: 1, len: 4 }
    );
    let mut faa = SendWr::faa(1, sge(RW, 0x1000, 8), remote(RKEY_ALL, 0), 1).to(dc());
    faa.payload =
        Payload::Local(SgList::from_slice(&[sge(RW, 0x1000, 4), sge(RW, 0x1004, 4)]).unwrap());
    assert_eq!(
        reason(&f, QpKind::Dc, faa),
        Reason::AtomicSgeLength { sges: 2, len: 8 }
    );
    faa.payload = Payload::Local(SgList::empty());
    assert_eq!(
        reason(&f, QpKind::Dc, faa),
        Reason::AtomicSgeLength { sges: 0, len: 0 }
    );
}

#[test]
fn rejects_misaligned_atomics() {
    let f = Fixture::new();
    let cas = SendWr::cas(1, sge(RW, 0x1000, 8), remote(RKEY_UNKNOWN, 4), 0, 1).to(dc());
    assert_eq!(
        reason(&f, QpKind::Dc, cas),
        Reason::AtomicMisaligned {
            addr: GRANT_ADDR + 4
        }
    );
}

#[test]
fn rejects_lkeys_the_process_does_not_own() {
    let f = Fixture::new();
    let mut wr = SendWr::send(1, sge(0x99, 0x1000, 8), None).to(dc());
    assert_eq!(
        reason(&f, QpKind::Dc, wr),
        Reason::LkeyNotOwned { sge: 0, lkey: 0x99 }
    );
    wr.payload =
        Payload::Local(SgList::from_slice(&[sge(RW, 0x1000, 8), sge(0x98, 0, 8)]).unwrap());
    assert_eq!(
        reason(&f, QpKind::Dc, wr),
        Reason::LkeyNotOwned { sge: 1, lkey: 0x98 }
    );
}

#[test]
fn rejects_sges_outside_their_mr() {
    let f = Fixture::new();
    for (addr, length) in [(0xfff, 8), (0x1ff9, 8), (0x1000, 0x1001), (u64::MAX - 2, 8)] {
        let wr = SendWr::send(1, sge(RW, addr, length), None).to(dc());
        assert_eq!(
            reason(&f, QpKind::Dc, wr),
            Reason::SgeOutOfBounds {
                sge: 0,
                addr,
                length,
                mr_addr: 0x1000,
                mr_len: 0x1000
            }
        );
    }
    // The last byte of the MR is inside.
    let wr = SendWr::send(1, sge(RW, 0x1ff8, 8), None).to(dc());
    assert!(f.ctx(QpKind::Dc).check(&[wr]).is_ok());
}

#[test]
fn rejects_local_writes_into_mrs_without_local_write() {
    let f = Fixture::new();
    let local = sge(RO, 0x4000, 8);
    for (wr, op) in [
        (SendWr::read(1, local, remote(RKEY_ALL, 0)), OpKind::Read),
        (
            SendWr::cas(1, local, remote(RKEY_ALL, 0), 0, 1),
            OpKind::CompareSwap,
        ),
        (
            SendWr::faa(1, local, remote(RKEY_ALL, 0), 1),
            OpKind::FetchAdd,
        ),
    ] {
        assert_eq!(
            reason(&f, QpKind::Dc, wr.to(dc())),
            Reason::LocalWriteMissing {
                sge: 0,
                lkey: RO,
                op
            }
        );
    }
}

#[test]
fn rejects_expired_grants() {
    let f = Fixture::new();
    let wr = SendWr::read(1, sge(RW, 0x1000, 8), remote(RKEY_OLD, 0)).to(dc());
    assert_eq!(
        reason(&f, QpKind::Dc, wr),
        Reason::GrantExpired { rkey: RKEY_OLD }
    );
    // Expiry is inclusive: at `expires_at` the grant is void.
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.now = f.grants[&(Gid([3; 16]), RKEY_ALL)].expires_at.unwrap();
    let wr = SendWr::read(1, sge(RW, 0x1000, 8), remote(RKEY_ALL, 0)).to(dc());
    assert_eq!(
        ctx.check(&[wr]).unwrap_err().reason,
        Reason::GrantExpired { rkey: RKEY_ALL }
    );
}

#[test]
fn a_grant_without_expiry_never_expires() {
    let mut f = Fixture::new();
    let g = f.grants.get_mut(&(Gid([3; 16]), RKEY_OLD)).unwrap();
    g.expires_at = None;
    let mut ctx = f.ctx(QpKind::Dc);
    // Any instant: long after every other grant ended.
    ctx.now += Duration::from_secs(1 << 30);
    let ok = SendWr::read(1, sge(RW, 0x1000, 8), remote(RKEY_OLD, 0)).to(dc());
    assert!(ctx.check(&[ok]).is_ok());
    let expired = SendWr::read(1, sge(RW, 0x1000, 8), remote(RKEY_ALL, 0)).to(dc());
    assert_eq!(
        ctx.check(&[expired]).unwrap_err().reason,
        Reason::GrantExpired { rkey: RKEY_ALL }
    );
}

#[test]
fn rejects_operations_the_grant_does_not_allow() {
    let f = Fixture::new();
    let local = sge(RW, 0x1000, 8);
    let ok = SendWr::read(1, local, remote(RKEY_READ, 0)).to(dc());
    assert!(f.ctx(QpKind::Dc).check(&[ok]).is_ok());
    for (wr, op) in [
        (SendWr::write(1, local, remote(RKEY_READ, 0)), OpKind::Write),
        (
            SendWr::faa(1, local, remote(RKEY_READ, 0), 1),
            OpKind::FetchAdd,
        ),
    ] {
        assert_eq!(
            reason(&f, QpKind::Dc, wr.to(dc())),
            Reason::RemoteAccessMissing {
                rkey: RKEY_READ,
                op
            }
        );
    }
}

#[test]
fn rejects_remote_ranges_outside_the_grant() {
    let f = Fixture::new();
    let cases = [
        (
            SendWr::read(1, sge(RW, 0x1000, 16), remote(RKEY_ALL, 0xff8)),
            0xff8,
            16,
        ),
        (
            SendWr::cas(1, sge(RW, 0x1000, 8), remote(RKEY_ALL, 0x1000), 0, 1),
            0x1000,
            8,
        ),
        (
            SendWr::write(
                1,
                sge(RW, 0x1000, 8),
                RemoteAddr {
                    addr: GRANT_ADDR - 8,
                    rkey: RKEY_ALL,
                },
            ),
            u64::MAX - 7,
            8,
        ),
    ];
    for (wr, offset, len) in cases {
        let addr = GRANT_ADDR.wrapping_add(offset);
        assert_eq!(
            reason(&f, QpKind::Dc, wr.to(dc())),
            Reason::RemoteOutOfGrant {
                addr,
                len,
                grant_addr: GRANT_ADDR,
                grant_len: 0x1000
            }
        );
    }
}

#[test]
fn grants_are_looked_up_per_target() {
    let f = Fixture::new();
    let wr = SendWr::read(1, sge(RW, 0x1000, 8), remote(RKEY_OLD, 0));
    // RC: the grant of the connected peer applies...
    assert_eq!(
        reason(&f, QpKind::Rc, wr),
        Reason::GrantExpired { rkey: RKEY_OLD }
    );
    // ...and without a known peer nothing is checked.
    let mut ctx = f.ctx(QpKind::Rc);
    ctx.peer = None;
    assert!(ctx.check(&[wr]).is_ok());
    // DC: another target's grants do not apply.
    let other = Destination::Dc(DcTarget {
        gid: Gid([9; 16]),
        dct_num: 1,
        dc_key: 1,
    });
    assert!(f.ctx(QpKind::Dc).check(&[wr.to(other)]).is_ok());
    // No grant table at all.
    let no = f.ctx_without_grants(QpKind::Dc);
    assert!(no.check(&[wr.to(dc())]).is_ok());
}

#[test]
fn the_rejection_names_the_first_bad_wr() {
    let f = Fixture::new();
    let bad_lkey = SendWr::send(1, sge(0x99, 0, 8), None).to(dc());
    let misaligned = SendWr::faa(1, sge(RW, 0x1000, 8), remote(RKEY_ALL, 3), 1).to(dc());
    let r = rejected(&f, QpKind::Dc, &[read(), read(), misaligned, bad_lkey]);
    assert_eq!(r.index, 2);
    assert_eq!(
        r.reason,
        Reason::AtomicMisaligned {
            addr: GRANT_ADDR + 3
        }
    );
    assert_eq!(
        r.to_string(),
        "work request 2 rejected: atomic at remote address 0x10003 is not 8-byte aligned"
    );
}

#[test]
fn plan_posts_now_when_the_batch_fits() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.queue = q(64, 3, 2);
    let plan = ctx.check(&unsignaled(3)).unwrap();
    assert!(!plan.must_reclaim());
    assert_eq!(
        plan,
        Plan {
            credits_short: 0,
            force_signal: None,
            unsignaled_after: 5
        }
    );
}

#[test]
fn plan_reclaims_when_the_batch_would_overrun() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.queue = q(64, 2, 0);
    let plan = ctx.check(&unsignaled(5)).unwrap();
    assert!(plan.must_reclaim());
    assert_eq!(plan.credits_short, 3);
    assert_eq!(plan.force_signal, None);
}

#[test]
fn plan_forces_the_last_wr_when_the_tail_would_exceed_the_policy() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_unsignaled = 8;
    ctx.queue = q(64, 64, 5);
    // 5 + 3 = 8: at the limit, no forcing.
    let plan = ctx.check(&unsignaled(3)).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (None, 8));
    // 6 + 3 = 9: the last WR is forced.
    ctx.queue = q(64, 64, 6);
    let plan = ctx.check(&unsignaled(3)).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (Some(2), 0));
    // Both outcomes at once: poll first, and force.
    ctx.queue = q(64, 1, 8);
    let plan = ctx.check(&unsignaled(3)).unwrap();
    assert_eq!(
        plan,
        Plan {
            credits_short: 2,
            force_signal: Some(2),
            unsignaled_after: 0
        }
    );
}

#[test]
fn plan_does_not_force_a_batch_that_ends_signaled() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_unsignaled = 8;
    ctx.queue = q(64, 64, 8);
    let mut batch = unsignaled(4);
    batch[3] = batch[3].signaled(true);
    let plan = ctx.check(&batch).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (None, 0));
}

#[test]
fn plan_counts_only_the_run_after_the_batch_s_last_signaled_wr() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_unsignaled = 8;
    ctx.queue = q(64, 64, 8);
    // [u, S, u, u]: the queue's tail and the first WR are covered by S.
    let mut batch = unsignaled(4);
    batch[1] = batch[1].signaled(true);
    let plan = ctx.check(&batch).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (None, 2));
    // [S, u x 9]: the run after S alone exceeds 8.
    let mut batch = unsignaled(10);
    batch[0] = batch[0].signaled(true);
    let plan = ctx.check(&batch).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (Some(9), 0));
}

#[test]
fn plan_clamps_the_policy_below_the_queue_depth() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    ctx.policy.max_unsignaled = 100;
    assert_eq!(ctx.policy.effective_max_unsignaled(4), 3);
    ctx.queue = q(4, 1, 2);
    let plan = ctx.check(&unsignaled(1)).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (None, 3));
    ctx.queue = q(4, 1, 3);
    let plan = ctx.check(&unsignaled(1)).unwrap();
    assert_eq!((plan.force_signal, plan.unsignaled_after), (Some(0), 0));
}

#[test]
fn apply_sets_the_forced_flag_only() {
    let mut batch = unsignaled(3);
    let plan = Plan {
        credits_short: 0,
        force_signal: Some(2),
        unsignaled_after: 0,
    };
    plan.apply(&mut batch);
    assert_eq!(
        batch.iter().map(SendWr::is_signaled).collect::<Vec<_>>(),
        vec![false, false, true]
    );
    let before = batch.clone();
    Plan {
        force_signal: None,
        ..plan
    }
    .apply(&mut batch);
    assert_eq!(batch, before);
}

/// The pre-check driving the credit engine with random batches: the queue
/// never deadlocks (polling always recovers the credits a plan asks for), the
/// unsignaled tail stays within the policy, and the plan predicts it.
#[test]
fn precheck_keeps_the_credit_engine_live() {
    let f = Fixture::new();
    let mut rng = 0x0123_4567_89ab_cdef_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (depth, max) = (16, 5);
    let mut sq = SendQueueCredits::new(depth);
    let mut seq = 0u64;
    for _ in 0..20_000 {
        let mut ctx = f.ctx(QpKind::Dc);
        ctx.policy.max_unsignaled = max;
        ctx.queue = sq.view();
        let n = 1 + next(u64::from(ctx.policy.max_batch(depth))) as usize;
        let mut batch: Vec<SendWr> = (0..n)
            .map(|_| {
                seq += 1;
                let mut wr = read().signaled(next(8) == 0);
                wr.wr_id = PhysWrId::new(VqpId::new(1 + next(3) as u32).unwrap(), seq).raw();
                wr
            })
            .collect();
        let plan = ctx.check(&batch).unwrap();
        if plan.must_reclaim() {
            assert!(
                sq.reclaimable() >= plan.credits_short,
                "polling cannot free enough: deadlock"
            );
            while sq.free() < n as u32 {
                let oldest_signaled = (sq.head()..sq.next_seq())
                    .find(|&s| sq.get(s).unwrap().signaled)
                    .unwrap();
                sq.complete(oldest_signaled, WcStatus::Success).unwrap();
            }
        }
        plan.apply(&mut batch);
        sq.post(batch.iter().map(PostedWr::of)).unwrap();
        assert_eq!(sq.unsignaled_tail(), plan.unsignaled_after);
        assert!(sq.unsignaled_tail() <= max);
        // Sometimes the NIC completes a signaled WR on its own.
        if next(2) == 0 {
            if let Some(s) = (sq.head()..sq.next_seq()).find(|&s| sq.get(s).unwrap().signaled) {
                sq.complete(s, WcStatus::Success).unwrap();
            }
        }
    }
}

/// Without validation a bad WR passes, but the shape limits and the plan
/// (reclaim, forced signal) are exactly those of the full check.
#[test]
fn plan_unvalidated_skips_validity_but_not_capacity_or_signaling() {
    let f = Fixture::new();
    let mut ctx = f.ctx(QpKind::Dc);
    let foreign = SendWr::read(1, sge(0xdead, 0x1000, 64), remote(RKEY_ALL, 0)).to(dc());
    assert!(ctx.check(&[foreign]).is_err());
    assert!(ctx.plan_unvalidated(&[foreign]).is_ok());
    assert_eq!(
        ctx.plan_unvalidated(&[]).unwrap_err().reason,
        Reason::EmptyBatch
    );
    let max = Policy::default().max_batch(64) as usize;
    assert!(matches!(
        ctx.plan_unvalidated(&unsignaled(max + 1))
            .unwrap_err()
            .reason,
        Reason::BatchTooLarge { .. }
    ));
    for (free, tail, n) in [(64, 0, 4), (2, 0, 4), (64, 15, 2), (10, 3, 20)] {
        ctx.queue = q(64, free, tail);
        let batch = unsignaled(n);
        assert_eq!(
            ctx.plan_unvalidated(&batch).unwrap(),
            ctx.check(&batch).unwrap(),
            "free {free} tail {tail} n {n}"
        );
    }
}

// The fast paths against the full check, and the MR windows.
mod agree_tests;
