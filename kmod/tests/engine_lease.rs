//! MR leases: grants with an expiry, enforced by the pre-check; an MR with
//! live leases is not deregistered unless they are revoked; after a
//! revocation remote use fails cleanly (REM_ACCESS_ERR on the wire, a typed
//! completion for its caller) and the other VQPs sharing the physical QP
//! are unaffected.

mod common;

use std::time::{Duration, Instant};

use common::{config, counted, wait_wcs, Cluster, WAIT};
use krcore_kmod::{Engine, LeaseError, OwnedMr, Reason, RemoteGrant, Vqp, VqpError};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, MemoryRegion, RemoteAddr, SendWr, WcStatus};

const HOUR: Duration = Duration::from_secs(3600);

struct Fixture {
    c: Cluster,
    owner: Engine<SimNic>,
    client: Engine<SimNic>,
    local: OwnedMr<SimNic>,
}

impl Fixture {
    fn new() -> Fixture {
        let c = Cluster::new();
        let owner = c.engine(config(|_| {}));
        c.register(owner.local_target().unwrap(), 1 << 40, 0)
            .unwrap();
        // ONE DCI: every VQP of the client shares the physical QP.
        let client = c.engine(config(|cfg| cfg.pool_size = 1));
        let local = client.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        Fixture {
            c,
            owner,
            client,
            local,
        }
    }

    fn vqp(&self) -> Vqp<SimNic> {
        let v = self.client.create_vqp().unwrap();
        v.connect(self.owner.gid()).unwrap();
        v
    }

    fn read(&self, id: u64, remote: RemoteAddr) -> SendWr {
        SendWr::read(id, self.local.sge(0, 8).unwrap(), remote)
    }
}

#[test]
fn an_expired_grant_is_refused_by_the_precheck_and_never_reaches_the_nic() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let v = f.vqp();
    // A live lease: the READ goes through.
    let (_, grant) = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    v.add_grant(f.owner.gid(), mr.rkey(), grant);
    v.post_send(&mut [f.read(1, mr.remote(0))]).unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    // The same range leased until now: expired at the next post.
    let (_, grant) = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now())
        .unwrap();
    v.add_grant(f.owner.gid(), mr.rkey(), grant);
    let (r, d) = counted(f.client.nic(), || {
        v.post_send(&mut [f.read(2, mr.remote(0))])
    });
    match r {
        Err(VqpError::Rejected(rej)) => {
            assert_eq!(rej.reason, Reason::GrantExpired { rkey: mr.rkey() })
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((d.reads, d.send_wrs), (0, 0), "never reached the NIC");
}

#[test]
fn deregistering_with_live_leases_is_refused_unless_revoked() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(128, Access::ALL).unwrap();
    assert!(matches!(
        mr.lease(64, 65, Access::REMOTE_READ, Instant::now() + HOUR),
        Err(LeaseError::OutOfRange { .. })
    ));
    let ro = f
        .owner
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    assert!(matches!(
        ro.lease(0, 8, Access::REMOTE_WRITE, Instant::now() + HOUR),
        Err(LeaseError::AccessMissing(_))
    ));
    let (a, _) = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let (_b, _) = mr
        .lease(64, 64, Access::REMOTE_WRITE, Instant::now() + HOUR)
        .unwrap();
    assert_eq!(mr.live_leases(Instant::now()), 2);
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Live { live: 2, .. }), "{e:?}");
    assert!(mr.revoke(a));
    assert!(!mr.revoke(a), "revoked once");
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Live { live: 1, .. }), "{e:?}");
    assert_eq!(mr.revoke_all(), 1);
    let other = mr.clone();
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert_eq!(e, LeaseError::Shared { handles: 1 });
    drop(other);
    let owned = f.owner.stats().owned_mrs;
    mr.deregister(Instant::now()).unwrap();
    assert_eq!(f.owner.stats().owned_mrs, owned - 1);
    // Leases that expired do not hold an MR either.
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    mr.lease(0, 8, Access::REMOTE_READ, Instant::now()).unwrap();
    mr.deregister(Instant::now()).unwrap();
}

/// The owner revokes a lease and deregisters: the holder's next READ
/// fails with REM_ACCESS_ERR (typed, to that VQP only); VQPs sharing the
/// same DCI (one with a completion still unpolled) see only successes, and
/// the DCI keeps working.
#[test]
fn a_revoked_lease_fails_remote_use_cleanly_and_spares_innocent_vqps() {
    let f = Fixture::new();
    let leased = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let other = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let holder = f.vqp();
    let innocents: Vec<_> = (0..4).map(|_| f.vqp()).collect();
    assert!(innocents
        .iter()
        .all(|v| v.physical_qpn() == holder.physical_qpn()));
    let (id, grant) = leased
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    holder.add_grant(f.owner.gid(), leased.rkey(), grant);
    holder
        .post_send(&mut [f.read(1, leased.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&holder, 1)[0].status, WcStatus::Success);
    for (i, v) in innocents.iter().enumerate() {
        v.post_send(&mut [f.read(100 + i as u64, other.remote(0))])
            .unwrap();
    }
    // Revoke, then deregister (refused before the revocation).
    let addr = leased.remote(0);
    let (leased, e) = leased.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Live { .. }));
    assert!(leased.revoke(id));
    leased.deregister(Instant::now()).unwrap();
    let (r, d) = counted(f.client.nic(), || holder.post_send(&mut [f.read(2, addr)]));
    r.unwrap();
    assert_eq!(d.send_wrs, 1, "it reached the NIC: {d:?}");
    let wc = wait_wcs(&holder, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RemAccessErr));
    // The innocents' completions (posted before the failure, polled
    // after) and their later READs all succeed.
    for (i, v) in innocents.iter().enumerate() {
        let wc = wait_wcs(v, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (100 + i as u64, WcStatus::Success)
        );
        v.post_send(&mut [f.read(200 + i as u64, other.remote(0))])
            .unwrap();
        let wc = wait_wcs(v, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (200 + i as u64, WcStatus::Success)
        );
    }
    assert!(
        f.client.stats().dci.recoveries >= 1,
        "the shared DCI was recovered"
    );
}

/// The last handle of a leased MR is dropped: deregistration is deferred
/// while the lease lives (the holder still reads it), and done once the
/// lease expired (the holder then gets REM_ACCESS_ERR).
#[test]
fn dropping_a_leased_mr_defers_its_deregistration_until_the_lease_expires() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    mr.store_u64(0, 42).unwrap();
    let ttl = Duration::from_millis(300);
    let (_, grant) = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + ttl)
        .unwrap();
    let addr = mr.remote(0);
    let v = f.vqp();
    v.add_grant(f.owner.gid(), addr.rkey, grant);
    drop(mr);
    assert_eq!(f.owner.sweep_leases(), 1, "parked while leased");
    v.post_send(&mut [f.read(1, addr)]).unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    assert_eq!(f.local.load_u64(0).unwrap(), 42);
    let start = Instant::now();
    while f.owner.sweep_leases() > 0 {
        assert!(start.elapsed() < WAIT, "the lease never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The holder's grant expired too: with the pre-check the READ is
    // refused before the NIC; without the grant the NIC refuses the rkey.
    assert!(matches!(
        v.post_send(&mut [f.read(2, addr)]),
        Err(VqpError::Rejected(_))
    ));
    v.remove_grant(&f.owner.gid(), addr.rkey);
    v.post_send(&mut [f.read(3, addr)]).unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::RemAccessErr);
    let _ = &f.c;
}

/// Grants without expiry cost no clock read at posts; the pre-check reads
/// the clock while the VQP knows a grant with one. The count behind that
/// follows every add, replace and remove: expiry stays exact.
#[test]
fn expiry_stays_exact_with_grants_with_and_without_expiry_mixed() {
    let f = Fixture::new();
    let (a, b) = (
        f.owner.alloc_mr(64, Access::ALL).unwrap(),
        f.owner.alloc_mr(64, Access::ALL).unwrap(),
    );
    let v = f.vqp();
    let gid = f.owner.gid();
    let forever = |mr: &OwnedMr<SimNic>| RemoteGrant {
        addr: mr.addr(),
        len: 64,
        access: Access::REMOTE_READ,
        expires_at: None,
    };
    let post = |id, mr: &OwnedMr<SimNic>| match v.post_send(&mut [f.read(id, mr.remote(0))]) {
        Ok(()) => Ok(wait_wcs(&v, 1)[0].status),
        Err(VqpError::Rejected(rej)) => Err(rej.reason),
        Err(e) => panic!("{e:?}"),
    };
    // `a` never expires.
    v.add_grant(gid, a.rkey(), forever(&a));
    assert_eq!(post(1, &a), Ok(WcStatus::Success));
    // `b`: a lease that ended: refused; `a` still passes.
    let (_, ended) = b.lease(0, 64, Access::REMOTE_READ, Instant::now()).unwrap();
    v.add_grant(gid, b.rkey(), ended);
    assert_eq!(post(2, &b), Err(Reason::GrantExpired { rkey: b.rkey() }));
    assert_eq!(post(3, &a), Ok(WcStatus::Success));
    // The ended lease replaced by a grant without expiry: `b` passes.
    v.add_grant(gid, b.rkey(), forever(&b));
    assert_eq!(post(4, &b), Ok(WcStatus::Success));
    // `a`'s grant replaced by an ended lease: refused (the clock is read
    // again, with only this one grant carrying an expiry).
    let (_, ended) = a.lease(0, 64, Access::REMOTE_READ, Instant::now()).unwrap();
    v.add_grant(gid, a.rkey(), ended);
    assert_eq!(post(5, &a), Err(Reason::GrantExpired { rkey: a.rkey() }));
    assert_eq!(post(6, &b), Ok(WcStatus::Success));
    // Forgotten: left to the NIC, which serves the registered MR.
    assert!(v.remove_grant(&gid, a.rkey()).is_some());
    assert_eq!(post(7, &a), Ok(WcStatus::Success));
}

/// Posts keep coming while a lease runs out (the fast path checks the
/// expiry per post): every post made wholly before the end passes, every
/// post begun after it is refused, never the other way round (a post
/// straddling the end may go either way). Any cheaper clock for that check
/// must keep this: `CLOCK_MONOTONIC_COARSE` plus its resolution did not
/// (a tickless CPU's coarse clock lags by more than one tick).
#[test]
fn a_lease_running_out_under_posts_passes_before_its_end_and_never_after() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let v = f.vqp();
    let end = Instant::now() + Duration::from_millis(300);
    let (_, grant) = mr.lease(0, 64, Access::REMOTE_READ, end).unwrap();
    v.add_grant(f.owner.gid(), mr.rkey(), grant);
    let (mut passed, mut refused) = (0u32, 0u32);
    let mut id = 0;
    while Instant::now() < end + Duration::from_millis(20) {
        id += 1;
        let before = Instant::now();
        let r = v.post_send(&mut [f.read(id, mr.remote(0))]);
        let after = Instant::now();
        match r {
            Ok(()) => {
                assert!(before < end, "post {id} passed, begun after the end");
                assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
                passed += 1;
            }
            Err(VqpError::Rejected(rej)) => {
                assert_eq!(rej.reason, Reason::GrantExpired { rkey: mr.rkey() });
                assert!(
                    after >= end,
                    "post {id} refused, made wholly before the end"
                );
                refused += 1;
            }
            Err(e) => panic!("post {id}: {e:?}"),
        }
    }
    // Begun after the end: refused.
    match v.post_send(&mut [f.read(id + 1, mr.remote(0))]) {
        Err(VqpError::Rejected(rej)) => {
            assert_eq!(rej.reason, Reason::GrantExpired { rkey: mr.rkey() })
        }
        other => panic!("{other:?}"),
    }
    // (The first post came right after the lease was made, 300 ms ahead of
    // its end.)
    assert!(passed > 0, "passed {passed}, refused {refused}");
}
