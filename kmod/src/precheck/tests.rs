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

/// The common-WR pass accepts exactly what the full check accepts:
/// random WRs (every opcode, SGEs around and across MR bounds and the end
/// of the address space, every destination kind, known, unknown and
/// expired grants, on every transport) get the same verdict and reason
/// both ways.
#[test]
fn the_common_path_agrees_with_the_full_check() {
    let mut f = Fixture::new();
    f.mrs.insert(
        0x30,
        LocalMr {
            addr: u64::MAX - 0xff,
            len: 0x100,
            access: Access::LOCAL_WRITE,
        },
    );
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let lkeys = [RW, RO, 0x30, 0x99];
    let addrs = [
        0x0,
        0xfff,
        0x1000,
        0x1ff8,
        0x2000,
        0x4000,
        0x40f8,
        u64::MAX - 0xff,
        u64::MAX - 7,
    ];
    let rkeys = [RKEY_ALL, RKEY_READ, RKEY_OLD, RKEY_UNKNOWN];
    let mut common = 0;
    for _ in 0..20_000 {
        let pick = |r: u64, n: usize| (r % n as u64) as usize;
        let s = sge(
            lkeys[pick(next(), lkeys.len())],
            addrs[pick(next(), addrs.len())],
            [0, 1, 8, 8, 64, 64, 0x1000, u32::MAX][pick(next(), 8)],
        );
        let r = remote(rkeys[pick(next(), rkeys.len())], next() % 0x1100);
        let mut wr = match next() % 5 {
            0 => SendWr::read(1, s, r),
            1 => SendWr::write(1, s, r),
            2 => SendWr::cas(1, s, r, 0, 1),
            3 => SendWr::send(1, s, None),
            _ => SendWr::faa(1, s, r, 1),
        };
        if next() % 6 == 0 {
            wr.payload = Payload::Local(SgList::from_slice(&[s, s]).unwrap());
        }
        if next() % 8 == 0 {
            wr.payload = Payload::Inline(InlineData::new(&[1, 2, 3]).unwrap());
        }
        wr.dest = [dc(), Destination::Connected, ud()][pick(next(), 3)];
        let transport = [QpKind::Dc, QpKind::Rc, QpKind::Ud][pick(next(), 3)];
        if next() % 2 == 0 {
            // Mostly the destination the transport takes.
            wr.dest = match transport {
                QpKind::Dc => dc(),
                QpKind::Rc => Destination::Connected,
                _ => ud(),
            };
        }
        let mut ctx = f.ctx(transport);
        if next() % 4 == 0 {
            ctx.policy.max_sge = 0;
        }
        if next() % 2 == 0 {
            ctx.ungranted = Ungranted::Refuse;
        }
        let quick = ctx.check_batch(&[wr], true);
        let full = ctx.check_batch(&[wr], false);
        assert_eq!(quick, full, "{wr:?} on {transport:?}");
        common += usize::from(ctx.common_wr_ok(&wr));
    }
    assert!(common > 30, "the common path was exercised ({common})");
}

/// The engine's fast path judges an SGE through [`MrWindow::holds`]: the
/// same verdict as [`local_ok`], for a READ and a WRITE alike, for every MR
/// it has a window of. None for an MR whose end wraps around (which
/// `local_ok` never accepts) or without `LOCAL_WRITE` (its WRs take the
/// general path).
#[test]
fn mr_window_agrees_with_local_ok() {
    let edges = [
        0u64,
        1,
        7,
        8,
        4096,
        u64::MAX / 2,
        u64::MAX - 64,
        u64::MAX - 1,
        u64::MAX,
    ];
    let lens = [0u32, 1, 8, 64, u32::MAX];
    let accesses = [Access::ALL, Access::REMOTE_READ];
    let mut checked = 0;
    for &mr_addr in &edges {
        for &mr_len in &[0u64, 8, 4096, u64::MAX / 2, u64::MAX] {
            for &access in &accesses {
                let mr = LocalMr {
                    addr: mr_addr,
                    len: mr_len,
                    access,
                };
                let window = MrWindow::of(7, &mr);
                assert_eq!(
                    window.is_some(),
                    access.contains(Access::LOCAL_WRITE) && mr_addr.checked_add(mr_len).is_some(),
                    "{mr:?}"
                );
                for &addr in &edges {
                    for &length in &lens {
                        for lkey in [7, 8] {
                            let sge = krcore_nic::Sge { addr, length, lkey };
                            for op in [OpKind::Read, OpKind::Write] {
                                let want = lkey == 7 && local_ok(&sge, &mr, op);
                                match window {
                                    Some(w) => {
                                        assert_eq!(w.holds(&sge), want, "{mr:?} {sge:?} {op}");
                                        checked += 1;
                                    }
                                    None => assert!(
                                        !want || !access.contains(Access::LOCAL_WRITE),
                                        "{mr:?} {sge:?} {op}"
                                    ),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000);
}

/// The engine's fast path's gate ([`fast_wr_ok`]) against the full check
/// ([`Precheck::check_wr`]), on atomics above all: every combination of
/// opcode (CAS, FAA, READ, WRITE, SEND), SGE (4, 8, 16 and 64 bytes; in,
/// across and outside the window's MR; an MR without `LOCAL_WRITE`; a
/// foreign lkey; two SGEs; inline data), remote address (aligned or not,
/// inside, across and outside the grant) and rkey (a grant with every
/// access, one without atomic access, an expired one, none known), with
/// no grant known to the VQP or its memo naming the WR's rkey, on DC and
/// RC. Within the fast path's domain (one SGE with the window's lkey, a
/// one-sided opcode, the memo's rkey) the two verdicts are identical;
/// outside it the gate refuses (the general path decides). A gate loosened in any check (SGE length,
/// alignment, MR bounds, local write, access, range, expiry) fails here.
#[test]
fn the_fast_gate_agrees_with_the_full_check() {
    let mut f = Fixture::new();
    // A second MR with LOCAL_WRITE (the SDK's scratch MR for atomics).
    const RW2: u32 = 0x40;
    f.mrs.insert(
        RW2,
        LocalMr {
            addr: 0x8000,
            len: 0x100,
            access: Access::LOCAL_WRITE,
        },
    );
    let w = |lkey| MrWindow::of(lkey, &f.mrs[&lkey]).expect("allows local writes");
    // One window, and two in either order.
    for (window, held) in [
        (MrWindows::one(w(RW)), &[RW][..]),
        (MrWindows::one(w(RW)).with(w(RW2)), &[RW, RW2][..]),
        (MrWindows::one(w(RW2)).with(w(RW)), &[RW, RW2][..]),
    ] {
        fast_gate_agrees(&f, &window, held);
    }
}

/// [`the_fast_gate_agrees_with_the_full_check`] with `window`, holding the
/// windows of the MRs `held`.
fn fast_gate_agrees(f: &Fixture, window: &MrWindows, held: &[u32]) {
    let lkeys = [RW, RO, 0x40, 0x99];
    let addrs = [
        0x1000u64, 0x1008, 0x1ff8, 0x1ffc, 0x2000, 0xff8, 0x4000, 0x8000, 0x80f8, 0x80fc,
    ];
    let lens = [4u32, 8, 16, 64];
    let offsets = [0u64, 4, 8, 0xff8, 0xffc, 0x1000, 1];
    let rkeys = [RKEY_ALL, RKEY_READ, RKEY_OLD, RKEY_UNKNOWN];
    let mut accepted = HashMap::<OpKind, usize>::new();
    let mut atomic_reasons = std::collections::HashSet::new();
    let mut checked = 0;
    for transport in [QpKind::Dc, QpKind::Rc] {
        let (dest, target) = match transport {
            QpKind::Dc => (dc(), Gid([3; 16])),
            _ => (Destination::Connected, peer()),
        };
        for op in 0..5 {
            for &lkey in &lkeys {
                for &addr in &addrs {
                    for &len in &lens {
                        for &off in &offsets {
                            for &rkey in &rkeys {
                                for shape in 0..3 {
                                    let s = sge(lkey, addr, len);
                                    let r = remote(rkey, off);
                                    let mut wr = match op {
                                        0 => SendWr::cas(1, s, r, 0, 1),
                                        1 => SendWr::faa(1, s, r, 1),
                                        2 => SendWr::read(1, s, r),
                                        3 => SendWr::write(1, s, r),
                                        _ => SendWr::send(1, s, None),
                                    };
                                    match shape {
                                        1 => {
                                            wr.payload =
                                                Payload::Local(SgList::from_slice(&[s, s]).unwrap())
                                        }
                                        2 if lkey == RW && addr == 0x1000 && len == 8 => {
                                            wr.payload =
                                                Payload::Inline(InlineData::new(&[0; 8]).unwrap())
                                        }
                                        2 => continue,
                                        _ => {}
                                    }
                                    wr.dest = dest;
                                    let kind = OpKind::of(&wr.op);
                                    // The fast path's domain: one SGE in
                                    // the window's MR, one-sided.
                                    let domain =
                                        held.contains(&lkey) && shape == 0 && kind != OpKind::Send;
                                    // No grant known to the VQP: the full
                                    // check with none.
                                    let none = f.ctx_without_grants(transport);
                                    let full = none.check_wr(&wr);
                                    let fast = fast_wr_ok(&wr, window, &FastGrants::None);
                                    assert_eq!(
                                        fast,
                                        domain && full.is_ok(),
                                        "no grants: {wr:?} on {transport:?}: {full:?}"
                                    );
                                    // The memo of the WR's rkey (what the
                                    // VQP knows for it), and of another.
                                    let known = f.grants.lookup(&target, rkey);
                                    let full = f.ctx(transport).check_wr(&wr);
                                    let fast = FastGrants::memo(rkey, known.as_ref(), || f.now)
                                        .is_some_and(|memo| fast_wr_ok(&wr, window, &memo));
                                    assert_eq!(
                                        fast,
                                        domain && full.is_ok(),
                                        "memo: {wr:?} on {transport:?}: {full:?}"
                                    );
                                    let other = FastGrants::Memo {
                                        rkey: rkey ^ 1,
                                        grant: known.as_ref(),
                                    };
                                    assert!(!fast_wr_ok(&wr, window, &other), "{wr:?}");
                                    if fast {
                                        *accepted.entry(kind).or_default() += 1;
                                    }
                                    if let (true, Err(reason)) = (wr.op.is_atomic(), &full) {
                                        atomic_reasons.insert(std::mem::discriminant(reason));
                                    }
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 20_000, "{checked}");
    for kind in [
        OpKind::CompareSwap,
        OpKind::FetchAdd,
        OpKind::Read,
        OpKind::Write,
    ] {
        assert!(
            accepted.get(&kind).copied().unwrap_or(0) > 10,
            "{kind}: {accepted:?}"
        );
    }
    assert!(!accepted.contains_key(&OpKind::Send), "{accepted:?}");
    // Every way an atomic can be wrong was among the cases.
    let sample = |lkey, addr, len, off, rkey| {
        let wr = SendWr::cas(1, sge(lkey, addr, len), remote(rkey, off), 0, 1).to(dc());
        f.ctx(QpKind::Dc).check_wr(&wr).unwrap_err()
    };
    for reason in [
        sample(RW, 0x1000, 4, 0, RKEY_ALL),
        sample(RW, 0x1000, 8, 4, RKEY_ALL),
        sample(0x99, 0x1000, 8, 0, RKEY_ALL),
        sample(RW, 0x1ffc, 8, 0, RKEY_ALL),
        sample(RO, 0x4000, 8, 0, RKEY_ALL),
        sample(RW, 0x1000, 8, 0, RKEY_OLD),
        sample(RW, 0x1000, 8, 0, RKEY_READ),
        sample(RW, 0x1000, 8, 0x1000, RKEY_ALL),
    ] {
        assert!(
            atomic_reasons.contains(&std::mem::discriminant(&reason)),
            "{reason:?} not covered"
        );
    }
}

/// The fast gate's memo of a grant with an expiry is made only before it
/// expires (then the general path decides, and finds it expired); the
/// clock is read only for a grant with an expiry.
#[test]
fn the_fast_gate_takes_a_grant_only_before_it_expires() {
    let f = Fixture::new();
    let window = MrWindows::one(MrWindow::of(RW, &f.mrs[&RW]).unwrap());
    let wr = SendWr::faa(1, sge(RW, 0x1008, 8), remote(RKEY_ALL, 8), 1).to(dc());
    let grant = f.grants.lookup(&Gid([3; 16]), RKEY_ALL).unwrap();
    let expires = grant.expires_at.unwrap();
    let memo = FastGrants::memo(RKEY_ALL, Some(&grant), || f.now).unwrap();
    assert!(fast_wr_ok(&wr, &window, &memo));
    assert!(FastGrants::memo(RKEY_ALL, Some(&grant), || expires).is_none());
    let late = Precheck {
        now: expires,
        ..f.ctx(QpKind::Dc)
    };
    assert_eq!(
        late.check_wr(&wr),
        Err(Reason::GrantExpired { rkey: RKEY_ALL })
    );
    let forever = RemoteGrant {
        expires_at: None,
        ..grant
    };
    let memo = FastGrants::memo(RKEY_ALL, Some(&forever), || unreachable!("no clock"));
    assert!(memo.is_some_and(|m| fast_wr_ok(&wr, &window, &m)));
}

/// [`MrWindows`] holds the windows of exactly the last two distinct MRs
/// pushed (a reference list, most recent first), through a fixed
/// pseudo-random sequence of pushes of four MRs; an SGE of any other MR
/// is never held (nor by the empty second window of [`MrWindows::one`],
/// even at the ends of the address space or with lkey 0).
#[test]
fn mr_windows_hold_the_last_two_mrs() {
    let mr = |k: u32| LocalMr {
        addr: 0x1000 * u64::from(k + 1),
        len: 0x100,
        access: Access::LOCAL_WRITE,
    };
    let window = |k: u32| MrWindow::of(k, &mr(k)).unwrap();
    let inside = |k: u32| sge(k, mr(k).addr + 8, 8);
    let mut w = MrWindows::one(window(0));
    let mut reference = vec![0u32];
    let mut x = 0x9e37_79b9_u32;
    for _ in 0..500 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let k = x % 4;
        w = w.with(window(k));
        reference.retain(|&r| r != k);
        reference.insert(0, k);
        reference.truncate(2);
        for j in 0..4 {
            assert_eq!(
                w.holds(&inside(j)),
                reference.contains(&j),
                "{j} {reference:?}"
            );
        }
    }
    let one = MrWindows::one(window(1));
    for s in [
        sge(0, u64::MAX, 0),
        sge(0, u64::MAX - 8, 8),
        sge(0, 0, 0),
        sge(1, 0, 0),
    ] {
        assert!(!one.holds(&s), "{s:?}");
    }
    assert!(one.holds(&inside(1)));
}

/// Under [`Ungranted::Refuse`] a one-sided WR must fall under a grant the
/// VQP knows: an unknown rkey is refused with its key and address, on both
/// transports, the common path and the full check alike; two-sided WRs
/// need no grant; [`Ungranted::Allow`] leaves the key to the NIC. An RC
/// check that knows no peer cannot look a grant up: refused too.
#[test]
fn an_unknown_rkey_is_refused_unless_the_vqp_opts_out() {
    let f = Fixture::new();
    let local = sge(RW, 0x1000, 8);
    for (transport, dest) in [(QpKind::Rc, Destination::Connected), (QpKind::Dc, dc())] {
        let refuse = Precheck {
            ungranted: Ungranted::Refuse,
            ..f.ctx(transport)
        };
        let unknown = remote(RKEY_UNKNOWN, 16);
        for wr in [
            SendWr::read(1, local, unknown).to(dest),
            SendWr::write(1, local, unknown).to(dest),
            SendWr::cas(1, local, unknown, 0, 1).to(dest),
            SendWr::faa(1, local, unknown, 1).to(dest),
        ] {
            let want = Reason::NotGranted {
                rkey: RKEY_UNKNOWN,
                addr: unknown.addr,
            };
            assert_eq!(refuse.check(&[wr]).unwrap_err().reason, want, "{wr:?}");
            assert_eq!(refuse.check_batch(&[wr], false).unwrap_err().reason, want);
            assert!(f.ctx(transport).check(&[wr]).is_ok(), "allowed: {wr:?}");
        }
        // A known grant passes; a SEND needs none.
        let known = SendWr::read(2, local, remote(RKEY_ALL, 16)).to(dest);
        let send = SendWr::send(3, sge(RO, 0x4000, 16), None).to(dest);
        assert!(refuse.check(&[known, send]).is_ok());
        // The refusal names the first WR without a grant.
        let batch = [known, SendWr::read(4, local, unknown).to(dest)];
        assert_eq!(refuse.check(&batch).unwrap_err().index, 1);
    }
    let no_peer = Precheck {
        ungranted: Ungranted::Refuse,
        peer: None,
        ..f.ctx(QpKind::Rc)
    };
    let wr = SendWr::read(1, local, remote(RKEY_ALL, 0)).to(Destination::Connected);
    assert!(matches!(
        no_peer.check(&[wr]).unwrap_err().reason,
        Reason::NotGranted { .. }
    ));
}
