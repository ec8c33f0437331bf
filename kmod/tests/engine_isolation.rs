//! 64 VQPs share ONE physical QP; one more VQP posts bad WRs. With the
//! pre-check, the bad WRs are typed rejections that never reach the NIC and
//! every other VQP completes everything. Without it, the NIC moves the
//! shared QP to ERR and flushes the innocent VQPs' WRs behind the bad one:
//! the engine then reports the failure to the bad VQP only, resets the QP
//! and posts the innocent WRs again (they never executed), so every
//! innocent VQP still sees only successes, each exactly once, in order;
//! the QP's counters show what the NIC did (recoveries, re-posted WRs).
//!
//! Each scenario runs twice: on a DC initiator of the pool (DC mode), and
//! on the RC QP of the client's pair with the memory node (RC fallback
//! mode, devices without DC), where recovery re-handshakes the pair because
//! the target's end failed too.

mod common;

use std::any::Any;
use std::time::Instant;

use common::fallback::Fabric;
use common::{config, counted, Cluster, MemNode, WAIT};
use krcore_kmod::{DciStats, Engine, EngineMode, OwnedMr, Reason, Vqp, VqpError};
use krcore_nic::sim::{SimMr, SimNic};
use krcore_nic::{Access, MemoryRegion, Nic, RemoteAddr, SendWr, Wc, WcStatus};

const GOOD: usize = 64;
const REGION: u64 = 64;

struct Fixture {
    _c: Box<dyn Any>,
    mem: MemNode,
    client: Engine<SimNic>,
    local: OwnedMr<SimNic>,
    good: Vec<Vqp<SimNic>>,
    bad: Vqp<SimNic>,
    /// An MR of the client node in another PD: not the engine's.
    foreign: SimMr,
}

#[derive(Clone, Copy, Debug)]
enum Bad {
    /// A READ past the end of the grant (and of the MR).
    OutOfGrant,
    /// A READ into memory the engine does not own.
    ForeignLkey,
    /// A CAS at an address that is not 8-byte aligned.
    MisalignedCas,
}

impl Fixture {
    fn new(precheck: bool, mode: EngineMode) -> Fixture {
        let len = (GOOD as u64 + 1) as usize * REGION as usize;
        let cfg = config(|cfg| {
            cfg.pool_size = 1;
            cfg.precheck = precheck;
            cfg.handshake_thread = true;
        });
        let (c, mem, client): (Box<dyn Any>, _, _) = match mode {
            EngineMode::Dc => {
                let c = Cluster::new();
                let (mem, client) = (c.memory_node(len), c.engine(cfg));
                (Box::new(c), mem, client)
            }
            _ => {
                let f = Fabric::new();
                let (mem, client) = (f.memory_node(len), f.engine(cfg));
                (Box::new(f), mem, client)
            }
        };
        assert_eq!(client.mode(), mode);
        let local = client
            .alloc_mr((GOOD + 1) * REGION as usize, Access::LOCAL_WRITE)
            .unwrap();
        let all = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let vqp = |i: usize| {
            let v = client.create_vqp().unwrap();
            v.connect(mem.gid()).unwrap();
            v.add_grant(
                mem.gid(),
                mem.mr.rkey(),
                mem.grant(i as u64 * REGION, REGION, all),
            );
            v
        };
        let good: Vec<_> = (0..GOOD).map(vqp).collect();
        let bad = vqp(GOOD);
        let qpn = bad.physical_qpn();
        assert!(good.iter().all(|v| v.physical_qpn() == qpn));
        let s = client.stats();
        match mode {
            EngineMode::Dc => assert_eq!(s.dcis, 1, "ONE shared DCI"),
            _ => assert_eq!((s.dcis, s.rc.pairs), (0, 1), "ONE shared RC QP"),
        }
        let pd = client.nic().alloc_pd().unwrap();
        let foreign = client.nic().alloc_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        Fixture {
            _c: c,
            mem,
            client,
            local,
            good,
            bad,
            foreign,
        }
    }

    /// The shared QP's statistics.
    fn qp_stats(&self) -> DciStats {
        let s = self.client.stats();
        match s.mode {
            EngineMode::Dc => s.dci,
            _ => s.rc.qp,
        }
    }

    fn remote(&self, i: usize, off: u64) -> RemoteAddr {
        self.mem.mr.remote((i as u64 * REGION + off) as usize)
    }

    fn value(i: usize, round: u64) -> u64 {
        (round << 32) | i as u64
    }

    /// WRITE (unsignaled) a value, READ it back, CAS a counter: one doorbell.
    fn good_batch(&self, i: usize, round: u64) -> [SendWr; 3] {
        let base = i * REGION as usize;
        self.local
            .write(base, &Self::value(i, round).to_le_bytes())
            .unwrap();
        let id = round * 10;
        [
            SendWr::write(id, self.local.sge(base, 8).unwrap(), self.remote(i, 0)).signaled(false),
            SendWr::read(
                id + 1,
                self.local.sge(base + 8, 8).unwrap(),
                self.remote(i, 0),
            ),
            SendWr::cas(
                id + 2,
                self.local.sge(base + 24, 8).unwrap(),
                self.remote(i, 16),
                round,
                round + 1,
            ),
        ]
    }

    fn bad_wr(&self, kind: Bad) -> SendWr {
        let base = GOOD * REGION as usize;
        let local = self.local.sge(base, 8).unwrap();
        match kind {
            Bad::OutOfGrant => SendWr::read(
                900,
                local,
                self.mem.mr.remote(0).offset(self.mem.mr.len() as u64),
            ),
            Bad::ForeignLkey => {
                SendWr::read(901, self.foreign.sge(0, 8).unwrap(), self.remote(GOOD, 0))
            }
            Bad::MisalignedCas => SendWr::cas(902, local, self.remote(GOOD, 4), 0, 1),
        }
    }

    /// Polls VQP `v` until the completion of `last` arrives.
    fn wait_for(v: &Vqp<SimNic>, last: u64) -> Vec<Wc> {
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [Wc::default(); 8];
        while !got.iter().any(|w: &Wc| w.wr_id == last) {
            let k = v.poll(&mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            assert!(
                start.elapsed() < WAIT,
                "no completion {last} on {v:?}: {got:?}"
            );
        }
        for w in &got {
            assert_eq!(
                w.qp_num,
                v.id().get(),
                "a VQP sees only its own completions"
            );
        }
        got
    }

    /// Checks a round that succeeded for VQP `i`.
    fn check_success(&self, i: usize, round: u64, wcs: &[Wc]) {
        let ids: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        let id = round * 10;
        assert_eq!(
            ids,
            [(id + 1, WcStatus::Success), (id + 2, WcStatus::Success)],
            "VQP {i} round {round}: the user's signaled WRs, with the user's wr_ids"
        );
        let base = i * REGION as usize;
        let mut read = [0u8; 8];
        self.local.read(base + 8, &mut read).unwrap();
        assert_eq!(u64::from_le_bytes(read), Self::value(i, round));
        assert_eq!(
            self.local.load_u64(base + 24).unwrap(),
            round,
            "CAS old value"
        );
    }
}

/// With the pre-check every bad WR is a typed rejection; nothing reaches the
/// NIC, nothing fails, every innocent VQP completes every round.
#[test]
fn the_precheck_protects_the_vqps_sharing_a_dci() {
    precheck_protects(EngineMode::Dc);
}

#[test]
fn the_precheck_protects_the_vqps_sharing_an_rc_qp() {
    precheck_protects(EngineMode::RcFallback);
}

fn precheck_protects(mode: EngineMode) {
    let f = Fixture::new(true, mode);
    let kinds = [Bad::OutOfGrant, Bad::ForeignLkey, Bad::MisalignedCas];
    let (_, d) = counted(f.client.nic(), || {
        for round in 0..6u64 {
            for (i, v) in f.good.iter().enumerate() {
                v.post_send(&mut f.good_batch(i, round)).unwrap();
                if i == GOOD / 2 {
                    let kind = kinds[round as usize % 3];
                    let mut wr = [f.bad_wr(kind)];
                    let err = f.bad.post_send(&mut wr).unwrap_err();
                    let VqpError::Rejected(r) = err else {
                        panic!("{kind:?}: expected a rejection, got {err}");
                    };
                    match (kind, &r.reason) {
                        (Bad::OutOfGrant, Reason::RemoteOutOfGrant { .. })
                        | (Bad::ForeignLkey, Reason::LkeyNotOwned { .. })
                        | (Bad::MisalignedCas, Reason::AtomicMisaligned { .. }) => {}
                        _ => panic!("{kind:?}: wrong reason {r}"),
                    }
                    assert_eq!(wr[0].wr_id, f.bad_wr(kind).wr_id, "wr_id given back");
                }
            }
            for (i, v) in f.good.iter().enumerate() {
                let wcs = Fixture::wait_for(v, round * 10 + 2);
                f.check_success(i, round, &wcs);
            }
        }
    });
    assert_eq!(d.error_completions, 0, "{d:?}");
    assert_eq!(d.qps_created, 0, "{d:?}");
    assert_eq!(
        d.send_wrs,
        6 * GOOD as u64 * 3,
        "only the good WRs reached the NIC"
    );
    let s = f.qp_stats();
    assert_eq!(s.recoveries, 0);
    assert_eq!(s.rejected, 6);
    assert_eq!(s.error_completions, 0);
    assert_eq!(f.bad.outstanding(), 0);
    assert_eq!(
        f.mem.mr.load_u64(GOOD * REGION as usize + 16).unwrap(),
        0,
        "the bad VQP's region was never touched"
    );
}

/// The same traffic without the pre-check: the bad WR reaches the NIC, the
/// shared QP goes to ERR and the NIC flushes the innocent WRs posted behind
/// it. The engine reports the failure to the bad VQP only, resets and
/// re-arms the QP (an RC pair: re-handshakes it) and re-posts the innocent
/// WRs: every innocent VQP sees only successes, each exactly once (the
/// CAS's old value proves it ran once), and the QP's counters show the
/// flushes the NIC made.
#[test]
fn without_the_precheck_innocent_vqps_are_flushed_and_reposted() {
    without_precheck(EngineMode::Dc);
}

#[test]
fn without_the_precheck_innocent_vqps_on_an_rc_qp_are_flushed_and_reposted() {
    without_precheck(EngineMode::RcFallback);
}

fn without_precheck(mode: EngineMode) {
    let f = Fixture::new(false, mode);
    let cases = [
        (Bad::OutOfGrant, WcStatus::RemAccessErr),
        (Bad::ForeignLkey, WcStatus::LocProtErr),
        (Bad::MisalignedCas, WcStatus::RemInvReqErr),
    ];
    let mut round = 0u64;
    let mut flushed_innocents = 0;
    let mut reposted = 0;
    for (n, (kind, status)) in cases.into_iter().enumerate() {
        // A clean round first: everyone succeeds.
        for (i, v) in f.good.iter().enumerate() {
            v.post_send(&mut f.good_batch(i, round)).unwrap();
        }
        for (i, v) in f.good.iter().enumerate() {
            let wcs = Fixture::wait_for(v, round * 10 + 2);
            f.check_success(i, round, &wcs);
        }
        round += 1;
        // The poisoned round: the bad WR goes in among the others.
        for (i, v) in f.good.iter().enumerate() {
            if i == GOOD / 2 {
                f.bad.post_send(&mut [f.bad_wr(kind)]).unwrap();
            }
            v.post_send(&mut f.good_batch(i, round)).unwrap();
        }
        let wc = Fixture::wait_for(&f.bad, f.bad_wr(kind).wr_id);
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, status, "{kind:?}: the NIC's verdict");
        // Every innocent VQP: its two signaled WRs succeed, once each, with
        // the READ seeing its WRITE and the CAS returning this round's value
        // (it ran exactly once), although the NIC flushed some of them.
        for (i, v) in f.good.iter().enumerate() {
            let wcs = Fixture::wait_for(v, round * 10 + 2);
            f.check_success(i, round, &wcs);
        }
        // Nothing else arrives later (no duplicate).
        for v in &f.good {
            assert_eq!(v.poll(&mut [Wc::default(); 4]).unwrap(), 0);
        }
        let stats = f.qp_stats();
        assert!(
            stats.reposted > reposted,
            "the NIC flushed innocent WRs, which the engine re-posted: {stats:?}"
        );
        flushed_innocents += stats.reposted - reposted;
        reposted = stats.reposted;
        assert_eq!(stats.recoveries, n as u64 + 1);
        if mode == EngineMode::RcFallback {
            // Each recovery re-armed the target's end of the same pair.
            let hs = f.mem.engine.stats().handshake;
            assert_eq!((hs.rearmed, hs.passive_qps), (n as u64 + 1, 1), "{hs:?}");
            assert_eq!(f.client.stats().rc.created, 1, "the same pair throughout");
        }
        // A REM_ACCESS_ERR disconnected the bad VQP (and invalidated the
        // target): it connects again like any user would.
        if f.bad.target().is_none() {
            assert_eq!(status, WcStatus::RemAccessErr);
            f.bad.connect(f.mem.gid()).unwrap();
        }
        round += 1;
    }
    // The DCI was re-armed each time: a last round succeeds for everyone.
    for (i, v) in f.good.iter().enumerate() {
        v.post_send(&mut f.good_batch(i, round)).unwrap();
    }
    for (i, v) in f.good.iter().enumerate() {
        let wcs = Fixture::wait_for(v, round * 10 + 2);
        f.check_success(i, round, &wcs);
    }
    eprintln!(
        "{flushed_innocents} innocent WRs flushed by the NIC and re-posted over 3 poisoned rounds"
    );
}

/// CASes and FAAs of one 8-byte SGE take the engine's fast path once the
/// pre-check has seen their MR and grant: they complete with the right old
/// values (FAAs into the VQP's MR, CASes into a scratch MR, as the SDK
/// posts them), and every bad atomic posted in between, with the fast
/// path armed (a 4-byte and a 16-byte SGE, a misaligned remote address, a
/// foreign lkey, an MR without LOCAL_WRITE, an SGE past the end of the
/// scratch MR, a range outside the grant, a grant without atomic access,
/// an expired grant), is still the
/// pre-check's typed rejection and never reaches the NIC.
#[test]
fn atomics_on_the_fast_path_keep_the_precheck_s_verdicts_on_a_dci() {
    atomics_keep_the_verdicts(EngineMode::Dc);
}

#[test]
fn atomics_on_the_fast_path_keep_the_precheck_s_verdicts_on_an_rc_qp() {
    atomics_keep_the_verdicts(EngineMode::RcFallback);
}

fn atomics_keep_the_verdicts(mode: EngineMode) {
    let f = Fixture::new(true, mode);
    let v = &f.good[0];
    let (gid, rkey) = (f.mem.gid(), f.mem.mr.rkey());
    let all = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    // The VQP's grant covers region 0 of the memory node; its counter.
    let counter = f.remote(0, 32);
    let local = |off: usize, len: u32| f.local.sge(off, len).unwrap();
    let no_local_write = f.client.alloc_mr(64, Access::REMOTE_READ).unwrap();
    // The CASes land in a scratch MR of their own (as the SDK's do): the
    // fast path holds the windows of both MRs.
    let scratch = f.client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let bad = |round: u64| -> (SendWr, fn(&Reason) -> bool) {
        let id = 900 + round;
        match round % 7 {
            6 => {
                let past_the_end = krcore_nic::Sge {
                    addr: scratch.addr() + 60,
                    length: 8,
                    lkey: scratch.lkey(),
                };
                (SendWr::cas(id, past_the_end, counter, 0, 1), |r| {
                    matches!(r, Reason::SgeOutOfBounds { .. })
                })
            }
            0 => (SendWr::cas(id, local(16, 4), counter, 0, 1), |r| {
                matches!(r, Reason::AtomicSgeLength { .. })
            }),
            1 => (SendWr::faa(id, local(16, 16), counter, 1), |r| {
                matches!(r, Reason::AtomicSgeLength { .. })
            }),
            2 => (
                SendWr::cas(id, local(16, 8), counter.offset(4), 0, 1),
                |r| matches!(r, Reason::AtomicMisaligned { .. }),
            ),
            3 => (
                SendWr::faa(id, f.foreign.sge(0, 8).unwrap(), counter, 1),
                |r| matches!(r, Reason::LkeyNotOwned { .. }),
            ),
            4 => (
                SendWr::cas(id, no_local_write.sge(0, 8).unwrap(), counter, 0, 1),
                |r| matches!(r, Reason::LocalWriteMissing { .. }),
            ),
            _ => (SendWr::faa(id, local(16, 8), f.remote(1, 0), 1), |r| {
                matches!(r, Reason::RemoteOutOfGrant { .. })
            }),
        }
    };
    let rejected = |wr: SendWr, want: fn(&Reason) -> bool| {
        let err = v.post_send(&mut [wr]).unwrap_err();
        match err {
            VqpError::Rejected(r) if want(&r.reason) => {}
            e => panic!("{wr:?}: not the expected rejection: {e}"),
        }
    };
    let mut expect = 0u64;
    let mut atomic = |id: u64, faa: bool| {
        let wr = if faa {
            SendWr::faa(id, local(0, 8), counter, 1)
        } else {
            SendWr::cas(id, scratch.sge(8, 8).unwrap(), counter, expect, expect + 1)
        };
        v.post_send(&mut [wr]).unwrap();
        let wcs = Fixture::wait_for(v, id);
        assert_eq!(wcs.len(), 1);
        assert_eq!(wcs[0].status, WcStatus::Success);
        let old = if faa {
            f.local.load_u64(0).unwrap()
        } else {
            scratch.load_u64(8).unwrap()
        };
        assert_eq!(old, expect, "{wr:?}: the old value");
        expect += 1;
    };
    let (_, d) = counted(f.client.nic(), || {
        for round in 0..28u64 {
            atomic(10 * round, round % 2 == 0);
            atomic(10 * round + 1, round % 2 == 1);
            let (wr, want) = bad(round);
            rejected(wr, want);
        }
        // A grant without atomic access: READs pass, atomics do not (the
        // second one with the VQP's grant memo holding the grant).
        v.add_grant(gid, rkey, f.mem.grant(0, REGION, Access::REMOTE_READ));
        for k in 0..2 {
            let read = SendWr::read(500 + k, local(24, 8), counter);
            v.post_send(&mut [read]).unwrap();
            Fixture::wait_for(v, 500 + k);
            rejected(SendWr::cas(510 + k, local(8, 8), counter, 0, 1), |r| {
                matches!(r, Reason::RemoteAccessMissing { .. })
            });
        }
        // A grant that expires: atomics pass until it does, then not.
        let until = Instant::now() + std::time::Duration::from_millis(200);
        let grant = krcore_kmod::RemoteGrant {
            expires_at: Some(until),
            ..f.mem.grant(0, REGION, all)
        };
        v.add_grant(gid, rkey, grant);
        atomic(600, true);
        atomic(601, false);
        while Instant::now() < until {
            std::thread::sleep(until - Instant::now());
        }
        for k in 0..2 {
            rejected(SendWr::faa(610 + k, local(0, 8), counter, 1), |r| {
                matches!(r, Reason::GrantExpired { .. })
            });
        }
    });
    assert_eq!(expect, 58);
    assert_eq!(f.mem.mr.load_u64(32).unwrap(), 58, "the counter");
    assert_eq!(d.send_wrs, 58 + 2, "only the good WRs reached the NIC");
    assert_eq!(d.error_completions, 0, "{d:?}");
    let s = f.qp_stats();
    assert_eq!(s.rejected, 28 + 2 + 2);
    assert_eq!((s.error_completions, s.recoveries), (0, 0));
}
