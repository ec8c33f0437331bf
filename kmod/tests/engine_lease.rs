//! MR leases: a remote key per lease, enforced by the NIC (revocation and
//! expiry deregister it, whatever the holder's software does) and, for a
//! holder that runs the pre-check, refused before the NIC once expired; an
//! MR with live leases is not deregistered unless they are revoked; after a
//! revocation remote use fails cleanly (REM_ACCESS_ERR on the wire, a typed
//! completion for its caller) and the other VQPs sharing the physical QP
//! are unaffected; a VQP reaches only memory it knows a grant for, unless
//! it opts out.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, counted, wait_wcs, Cluster, WAIT};
use krcore_kmod::{
    Engine, LeaseError, Leased, OwnedMr, Reason, RemoteGrant, Ungranted, Vqp, VqpError,
};
use krcore_nic::conformance::{poll_one, Side};
use krcore_nic::sim::SimNic;
use krcore_nic::{
    bring_up, Access, DcTarget, Destination, MemoryRegion, QpCaps, QpType, QueuePair, RemoteAddr,
    SendWr, WcStatus,
};

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
        let owner = c.engine_granted(config(|_| {}));
        c.register(owner.local_target().unwrap(), 1 << 40, 0)
            .unwrap();
        // ONE DCI: every VQP of the client shares the physical QP.
        let client = c.engine_granted(config(|cfg| cfg.pool_size = 1));
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

    /// A VQP that knows `lease`'s grant.
    fn holder(&self, lease: &Leased) -> Vqp<SimNic> {
        let v = self.vqp();
        v.add_grant(self.owner.gid(), lease.rkey, lease.grant);
        v
    }

    fn read(&self, id: u64, remote: RemoteAddr) -> SendWr {
        SendWr::read(id, self.local.sge(0, 8).unwrap(), remote)
    }
}

/// The address `off` bytes into a lease, under its own key.
fn at(lease: &Leased, off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: lease.grant.addr + off,
        rkey: lease.rkey,
    }
}

/// A peer that skips the pre-check altogether: a DCI of its own, straight
/// on the provider, on another node of the fabric, posting whatever key it
/// remembers.
struct RawPeer {
    side: Side<SimNic>,
    target: DcTarget,
}

impl RawPeer {
    fn new(f: &Fixture) -> RawPeer {
        RawPeer {
            side: Side::new(&f.c.nic(), 4096),
            target: f.owner.local_target().unwrap(),
        }
    }

    /// READs 8 bytes at `remote` into a buffer filled with 0xAB first, on a
    /// fresh DCI (an error leaves a QP in ERR): the status and the buffer.
    fn read(&self, remote: RemoteAddr) -> (WcStatus, u64) {
        let caps = QpCaps {
            max_recv_wr: 0,
            ..QpCaps::default()
        };
        let qp = self.side.qp(QpType::Dci, caps, None, 0);
        bring_up(&qp, Access::NONE, None).unwrap();
        self.side.mr.write(0, &[0xAB; 8]).unwrap();
        let wr = SendWr::read(1, self.side.mr.sge(0, 8).unwrap(), remote)
            .to(Destination::Dc(self.target));
        qp.post_send(&[wr]).unwrap();
        let status = poll_one(&self.side.cq).status;
        (status, self.side.mr.load_u64(0).unwrap())
    }
}

const UNTOUCHED: u64 = u64::from_le_bytes([0xAB; 8]);

#[test]
fn each_lease_has_a_key_of_its_own_limited_to_its_range_at_the_nic() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(4096, Access::ALL).unwrap();
    mr.store_u64(1024, 7).unwrap();
    mr.store_u64(2048, 8).unwrap();
    let a = mr
        .lease(1024, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let b = mr
        .lease(1024, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    assert_ne!(a.rkey, mr.rkey(), "not the MR's key");
    assert_ne!(a.rkey, b.rkey, "one key per lease");
    assert_ne!(a.id, b.id);
    assert_eq!((a.grant.addr, a.grant.len), (mr.addr() + 1024, 64));
    let raw = RawPeer::new(&f);
    assert_eq!(raw.read(at(&a, 0)), (WcStatus::Success, 7));
    // Outside the lease, with the lease's key: refused by the NIC.
    let outside = RemoteAddr {
        addr: mr.addr() + 2048,
        rkey: a.rkey,
    };
    assert_eq!(raw.read(outside), (WcStatus::RemAccessErr, UNTOUCHED));
    assert_eq!(f.owner.lease_stats().live, 2);
    assert_eq!(f.owner.lease_stats().granted, 2);
}

#[test]
fn an_expired_grant_is_refused_by_the_precheck_and_never_reaches_the_nic() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    // A live lease: the READ goes through.
    let live = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let v = f.holder(&live);
    v.post_send(&mut [f.read(1, at(&live, 0))]).unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    // The same range leased until now: expired at the next post.
    let ended = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now())
        .unwrap();
    v.add_grant(f.owner.gid(), ended.rkey, ended.grant);
    let (r, d) = counted(f.client.nic(), || {
        v.post_send(&mut [f.read(2, at(&ended, 0))])
    });
    match r {
        Err(VqpError::Rejected(rej)) => {
            assert_eq!(rej.reason, Reason::GrantExpired { rkey: ended.rkey })
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
    assert!(matches!(
        mr.lease(0, 0, Access::REMOTE_READ, Instant::now() + HOUR),
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
    let a = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let _b = mr
        .lease(64, 64, Access::REMOTE_WRITE, Instant::now() + HOUR)
        .unwrap();
    assert_eq!(mr.live_leases(Instant::now()), 2);
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Live { live: 2, .. }), "{e:?}");
    assert!(mr.revoke(a.id));
    assert!(!mr.revoke(a.id), "revoked once");
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Live { live: 1, .. }), "{e:?}");
    assert_eq!(mr.revoke_all(), 1);
    let other = mr.clone();
    let (mr, e) = mr.deregister(Instant::now()).unwrap_err();
    assert!(matches!(e, LeaseError::Shared { handles: 1 }), "{e:?}");
    drop(other);
    let owned = f.owner.stats().owned_mrs;
    mr.deregister(Instant::now()).unwrap();
    assert_eq!(f.owner.stats().owned_mrs, owned - 1);
    // Leases that expired do not hold an MR either.
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let addr = mr.remote(0);
    mr.lease(0, 8, Access::REMOTE_READ, Instant::now()).unwrap();
    mr.deregister(Instant::now()).unwrap();
    let raw = RawPeer::new(&f);
    assert_eq!(raw.read(addr).0, WcStatus::RemAccessErr, "deregistered");
    let s = f.owner.lease_stats();
    assert_eq!((s.live, s.revoked, s.expired), (0, 2, 1), "{s:?}");
}

/// A peer that skips its pre-check (a raw provider QP) and remembers a
/// lease's key reads nothing once the lease is revoked: the NIC refuses
/// the key, with no deregistration of the MR.
#[test]
fn a_revoked_lease_key_reads_nothing_even_for_a_peer_that_skips_its_precheck() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    mr.store_u64(0, 42).unwrap();
    let lease = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let raw = RawPeer::new(&f);
    assert_eq!(raw.read(at(&lease, 0)), (WcStatus::Success, 42));
    assert!(mr.revoke(lease.id));
    assert_eq!(raw.read(at(&lease, 0)), (WcStatus::RemAccessErr, UNTOUCHED));
    // The MR itself is still registered: its own key works.
    assert_eq!(raw.read(mr.remote(0)), (WcStatus::Success, 42));
}

/// Expiry needs no message: the owner's lease reaper deregisters the key
/// by itself, and a peer that skips its pre-check reads nothing after.
#[test]
fn an_expired_lease_key_reads_nothing_without_any_message() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    mr.store_u64(0, 42).unwrap();
    let ttl = Duration::from_millis(200);
    let end = Instant::now() + ttl;
    let lease = mr.lease(0, 64, Access::REMOTE_READ, end).unwrap();
    let raw = RawPeer::new(&f);
    assert_eq!(raw.read(at(&lease, 0)), (WcStatus::Success, 42));
    // Nobody sweeps: the reaper thread alone ends the lease.
    let start = Instant::now();
    while f.owner.lease_stats().expired == 0 {
        assert!(start.elapsed() < WAIT, "the reaper never ended the lease");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Instant::now() >= end);
    assert_eq!(raw.read(at(&lease, 0)), (WcStatus::RemAccessErr, UNTOUCHED));
    let s = f.owner.lease_stats();
    assert_eq!((s.live, s.expired), (0, 1));
    assert!(s.expiry_lag_max >= Duration::ZERO && s.expiry_lag_total == s.expiry_lag_max);
}

/// The owner revokes a lease: the holder (whose pre-check still knows the
/// live grant) gets REM_ACCESS_ERR from the NIC (typed, to that VQP only);
/// four VQPs sharing the same DCI (with completions still unpolled) see
/// only successes, and the DCI keeps working.
#[test]
fn a_revoked_lease_fails_remote_use_cleanly_and_spares_innocent_vqps() {
    let f = Fixture::new();
    let leased = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let other = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let lease = leased
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let forever = other
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let holder = f.holder(&lease);
    let innocents: Vec<_> = (0..4).map(|_| f.holder(&forever)).collect();
    assert!(innocents
        .iter()
        .all(|v| v.physical_qpn() == holder.physical_qpn()));
    holder.post_send(&mut [f.read(1, at(&lease, 0))]).unwrap();
    assert_eq!(wait_wcs(&holder, 1)[0].status, WcStatus::Success);
    for (i, v) in innocents.iter().enumerate() {
        v.post_send(&mut [f.read(100 + i as u64, at(&forever, 0))])
            .unwrap();
    }
    assert!(leased.revoke(lease.id));
    let (r, d) = counted(f.client.nic(), || {
        holder.post_send(&mut [f.read(2, at(&lease, 0))])
    });
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
        v.post_send(&mut [f.read(200 + i as u64, at(&forever, 0))])
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

/// The last handle of a leased MR is dropped: the MR leaves the owner's
/// pre-check table but stays registered while the lease lives (the holder
/// still reads it), and is deregistered once the lease ended (its own key
/// then fails too).
#[test]
fn dropping_a_leased_mr_defers_its_deregistration_until_the_lease_expires() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    mr.store_u64(0, 42).unwrap();
    let ttl = Duration::from_millis(300);
    let lease = mr
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + ttl)
        .unwrap();
    let own_key = mr.remote(0);
    let v = f.holder(&lease);
    drop(mr);
    assert_eq!(f.owner.sweep_leases(), 1, "live while leased");
    v.post_send(&mut [f.read(1, at(&lease, 0))]).unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    assert_eq!(f.local.load_u64(0).unwrap(), 42);
    let start = Instant::now();
    while f.owner.sweep_leases() > 0 {
        assert!(start.elapsed() < WAIT, "the lease never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The holder's grant expired too: with the pre-check the READ is
    // refused before the NIC; a peer without it finds both keys dead.
    assert!(matches!(
        v.post_send(&mut [f.read(2, at(&lease, 0))]),
        Err(VqpError::Rejected(_))
    ));
    let raw = RawPeer::new(&f);
    assert_eq!(raw.read(at(&lease, 0)).0, WcStatus::RemAccessErr);
    assert_eq!(raw.read(own_key).0, WcStatus::RemAccessErr);
}

/// Grants without expiry cost no clock read at posts; the pre-check reads
/// the clock while the VQP knows a grant with one. The count behind that
/// follows every add, replace and remove: expiry stays exact. A key whose
/// grant is forgotten is refused (the grant rule), unless the VQP opts out.
#[test]
fn expiry_stays_exact_with_grants_with_and_without_expiry_mixed() {
    let f = Fixture::new();
    let (a, b) = (
        f.owner.alloc_mr(64, Access::ALL).unwrap(),
        f.owner.alloc_mr(64, Access::ALL).unwrap(),
    );
    let v = f.vqp();
    let gid = f.owner.gid();
    let grant = |mr: &OwnedMr<SimNic>, expires_at| RemoteGrant {
        addr: mr.addr(),
        len: 64,
        access: Access::REMOTE_READ,
        expires_at,
    };
    let post = |id, mr: &OwnedMr<SimNic>| match v.post_send(&mut [f.read(id, mr.remote(0))]) {
        Ok(()) => Ok(wait_wcs(&v, 1)[0].status),
        Err(VqpError::Rejected(rej)) => Err(rej.reason),
        Err(e) => panic!("{e:?}"),
    };
    // `a` never expires.
    v.add_grant(gid, a.rkey(), grant(&a, None));
    assert_eq!(post(1, &a), Ok(WcStatus::Success));
    // `b`: a grant that ended: refused; `a` still passes.
    v.add_grant(gid, b.rkey(), grant(&b, Some(Instant::now())));
    assert_eq!(post(2, &b), Err(Reason::GrantExpired { rkey: b.rkey() }));
    assert_eq!(post(3, &a), Ok(WcStatus::Success));
    // The ended grant replaced by one without expiry: `b` passes.
    v.add_grant(gid, b.rkey(), grant(&b, None));
    assert_eq!(post(4, &b), Ok(WcStatus::Success));
    // `a`'s grant replaced by an ended one: refused (the clock is read
    // again, with only this one grant carrying an expiry).
    v.add_grant(gid, a.rkey(), grant(&a, Some(Instant::now())));
    assert_eq!(post(5, &a), Err(Reason::GrantExpired { rkey: a.rkey() }));
    assert_eq!(post(6, &b), Ok(WcStatus::Success));
    // Forgotten: no grant known, refused before the NIC...
    assert!(v.remove_grant(&gid, a.rkey()).is_some());
    let not_granted = Reason::NotGranted {
        rkey: a.rkey(),
        addr: a.addr(),
    };
    assert_eq!(post(7, &a), Err(not_granted));
    // ... unless the VQP opts out: left to the NIC, which serves the MR.
    v.set_ungranted(Ungranted::Allow);
    assert_eq!(post(8, &a), Ok(WcStatus::Success));
    v.set_ungranted(Ungranted::Refuse);
    assert!(matches!(post(9, &a), Err(Reason::NotGranted { .. })));
}

/// A VQP that knows no grant at all reaches no remote memory (the fast
/// path and the general path alike), and nothing reaches the NIC; the
/// engine-wide default can be the opt-out.
#[test]
fn a_vqp_without_grants_reaches_no_remote_memory_unless_it_opts_out() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let v = f.vqp();
    for id in 1..=3 {
        let (r, d) = counted(f.client.nic(), || {
            v.post_send(&mut [f.read(id, mr.remote(0))])
        });
        match r {
            Err(VqpError::Rejected(rej)) => assert_eq!(
                rej.reason,
                Reason::NotGranted {
                    rkey: mr.rkey(),
                    addr: mr.addr()
                }
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(d.send_wrs, 0);
    }
    let open =
        f.c.engine_granted(config(|cfg| cfg.ungranted = Ungranted::Allow));
    let local = open.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let v = open.create_vqp().unwrap();
    v.connect(f.owner.gid()).unwrap();
    v.post_send(&mut [SendWr::read(1, local.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
}

/// Posts keep coming while a lease runs out (the fast path checks the
/// expiry per post): every post made wholly before the end passes the
/// pre-check, every post begun after it is refused, never the other way
/// round (a post straddling the end may go either way). A post that passed
/// may still meet the key deregistered by the owner's reaper at the end:
/// then the NIC refuses it, after the end, and the VQP is disconnected
/// (a post then gets `NotConnected` until it connects again). Any cheaper clock for that check
/// must keep this: `CLOCK_MONOTONIC_COARSE` plus its resolution did not
/// (a tickless CPU's coarse clock lags by more than one tick).
#[test]
fn a_lease_running_out_under_posts_passes_before_its_end_and_never_after() {
    let f = Fixture::new();
    let mr = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let end = Instant::now() + Duration::from_millis(300);
    let lease = mr.lease(0, 64, Access::REMOTE_READ, end).unwrap();
    let v = f.holder(&lease);
    let (mut passed, mut refused) = (0u32, 0u32);
    let mut id = 0;
    while Instant::now() < end + Duration::from_millis(20) {
        id += 1;
        let before = Instant::now();
        let r = v.post_send(&mut [f.read(id, at(&lease, 0))]);
        let after = Instant::now();
        match r {
            Ok(()) => {
                assert!(before < end, "post {id} passed, begun after the end");
                let status = wait_wcs(&v, 1)[0].status;
                let done = Instant::now();
                match status {
                    WcStatus::Success => passed += 1,
                    WcStatus::RemAccessErr => {
                        assert!(done >= end, "post {id}: the key died before the end");
                        // A REM_ACCESS_ERR disconnects the VQP (its target's
                        // metadata may be stale): it connects again, keeping
                        // its grants, so its later posts meet the pre-check.
                        v.connect(f.owner.gid()).unwrap();
                    }
                    other => panic!("post {id}: {other:?}"),
                }
            }
            Err(VqpError::Rejected(rej)) => {
                assert_eq!(rej.reason, Reason::GrantExpired { rkey: lease.rkey });
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
    match v.post_send(&mut [f.read(id + 1, at(&lease, 0))]) {
        Err(VqpError::Rejected(rej)) => {
            assert_eq!(rej.reason, Reason::GrantExpired { rkey: lease.rkey })
        }
        other => panic!("{other:?}"),
    }
    // (The first post came right after the lease was made, 300 ms ahead of
    // its end.)
    assert!(passed > 0, "passed {passed}, refused {refused}");
}

/// Revocation under load: a writer and a reader loop on a lease (each
/// through a VQP whose pre-check knows the live grant, so every post
/// reaches the NIC) while the owner revokes it. Every acknowledged write
/// is in memory after the revocation; no write lands after it (the owner
/// poisons the range right after `revoke` returns and finds the poison
/// intact); no READ returns poison; the writer's and the reader's first
/// failures are REM_ACCESS_ERR; VQPs of the same DCI on another lease keep
/// succeeding throughout. Twenty rounds.
#[test]
fn revocation_under_load_loses_no_write_and_never_reads_revoked_memory() {
    const SLOTS: u64 = 64;
    const POISON: u64 = 0xEEEE_EEEE_EEEE_EEEE;
    let f = Arc::new(Fixture::new());
    let mr = f.owner.alloc_mr(SLOTS as usize * 8, Access::ALL).unwrap();
    let spare = f.owner.alloc_mr(64, Access::ALL).unwrap();
    let bystander_lease = spare
        .lease(0, 64, Access::REMOTE_READ, Instant::now() + HOUR)
        .unwrap();
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    for round in 0..20u64 {
        for s in 0..SLOTS {
            mr.store_u64(s as usize * 8, 0).unwrap();
        }
        let lease = mr.lease(0, SLOTS * 8, rw, Instant::now() + HOUR).unwrap();
        let started = Arc::new(std::sync::Barrier::new(4));
        let stop = Arc::new(AtomicBool::new(false));
        // Operations done by the writer and the reader.
        let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        // The writer: slot i % SLOTS gets i + 1; returns the last value
        // acknowledged per slot.
        let writer = {
            let (f, started, done) = (f.clone(), started.clone(), done.clone());
            std::thread::spawn(move || {
                let v = f.holder(&lease);
                let src = f.client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
                let mut acked = vec![0u64; SLOTS as usize];
                started.wait();
                let mut i = 0u64;
                loop {
                    let slot = i % SLOTS;
                    src.store_u64(0, i + 1).unwrap();
                    let wr = SendWr::write(i, src.sge(0, 8).unwrap(), at(&lease, slot * 8));
                    v.post_send(&mut [wr]).unwrap();
                    match wait_wcs(&v, 1)[0].status {
                        WcStatus::Success => acked[slot as usize] = i + 1,
                        WcStatus::RemAccessErr => return acked,
                        other => panic!("round {round}: write {i}: {other:?}"),
                    }
                    i += 1;
                    done[0].store(i, Ordering::Relaxed);
                }
            })
        };
        // The reader: whole-range READs until the first failure; none may
        // see the poison.
        let reader = {
            let (f, started, done) = (f.clone(), started.clone(), done.clone());
            std::thread::spawn(move || {
                let v = f.holder(&lease);
                let dst = f
                    .client
                    .alloc_mr(SLOTS as usize * 8, Access::LOCAL_WRITE)
                    .unwrap();
                started.wait();
                let mut i = 0u64;
                loop {
                    let wr = SendWr::read(i, dst.sge(0, SLOTS as u32 * 8).unwrap(), at(&lease, 0));
                    v.post_send(&mut [wr]).unwrap();
                    match wait_wcs(&v, 1)[0].status {
                        WcStatus::Success => {
                            for s in 0..SLOTS as usize {
                                assert_ne!(
                                    dst.load_u64(s * 8).unwrap(),
                                    POISON,
                                    "round {round}: READ {i} returned revoked memory"
                                );
                            }
                        }
                        WcStatus::RemAccessErr => return i,
                        other => panic!("round {round}: read {i}: {other:?}"),
                    }
                    i += 1;
                    done[1].store(i, Ordering::Relaxed);
                }
            })
        };
        // A bystander on the same DCI, on another lease, all along.
        let bystander = {
            let (f, started, stop) = (f.clone(), started.clone(), stop.clone());
            std::thread::spawn(move || {
                let v = f.holder(&bystander_lease);
                let dst = f.client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
                started.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let wr = SendWr::read(n, dst.sge(0, 8).unwrap(), at(&bystander_lease, 0));
                    v.post_send(&mut [wr]).unwrap();
                    let status = wait_wcs(&v, 1)[0].status;
                    assert_eq!(status, WcStatus::Success, "round {round}: bystander {n}");
                    n += 1;
                }
                n
            })
        };
        started.wait();
        // Both loops under way (a few operations each, more each round).
        let t0 = Instant::now();
        while done
            .iter()
            .any(|d| d.load(Ordering::Relaxed) < 4 + 3 * round)
        {
            assert!(t0.elapsed() < WAIT, "round {round}: the loops stalled");
            std::thread::yield_now();
        }
        assert!(mr.revoke(lease.id));
        // What the writer's acknowledged writes left, before the poison.
        let after_revoke: Vec<u64> = (0..SLOTS)
            .map(|s| mr.load_u64(s as usize * 8).unwrap())
            .collect();
        for s in 0..SLOTS {
            mr.store_u64(s as usize * 8, POISON).unwrap();
        }
        let acked = writer.join().unwrap();
        let reads = reader.join().unwrap();
        stop.store(true, Ordering::Release);
        let bystanding = bystander.join().unwrap();
        for s in 0..SLOTS as usize {
            assert_eq!(
                after_revoke[s], acked[s],
                "round {round}: slot {s}: an acknowledged write is lost, or an unacknowledged one landed"
            );
            assert_eq!(
                mr.load_u64(s * 8).unwrap(),
                POISON,
                "round {round}: slot {s}: a write landed after the revocation"
            );
        }
        let _ = (reads, bystanding);
    }
}
