//! Recovery of a shared physical QP that reached ERR (DC mode, pre-check
//! disabled so that bad WRs reach the NIC): the failure goes to the failing
//! VQP only; the WRs of the other VQPs that the NIC flushed are posted
//! again, so that every innocent VQP sees only successes, each exactly once
//! and in its own order; a dead target is a typed error for the VQPs that
//! reach it, and its DCCache entry is dropped.

mod common;

use common::{config, wait_wcs, Cluster, WAIT};
use krcore_kmod::{Engine, OwnedMr, Vqp};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, MemoryRegion, SendWr, Wc, WcStatus};

const VQPS: usize = 6;
const ROUNDS: u64 = 40;
const PER_ROUND: u64 = 4;

fn client(c: &Cluster) -> Engine<SimNic> {
    // One DCI: every VQP shares it.
    c.engine(config(|c| c.precheck = false).with_pool_size(1))
}

/// Polls every VQP until each has `n` completions, returns them per VQP.
fn collect(vqps: &[Vqp<SimNic>], n: usize) -> Vec<Vec<Wc>> {
    vqps.iter().map(|v| wait_wcs(v, n)).collect()
}

/// Sustained fetch-and-add traffic of `VQPS` VQPs on their own counters
/// (each round: 4 FAAs per VQP in one doorbell, the first three
/// unsignaled), with a bad-rkey READ of another VQP posted in the middle of
/// every fifth round. Each innocent VQP must see exactly its signaled
/// FAAs, successful, once each, in order, with old values counting up by 4
/// (so each FAA ran exactly once, in posting order); its counter ends at
/// ROUNDS * PER_ROUND.
#[test]
fn innocent_vqps_see_only_successes_exactly_once_in_order() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let e = client(&c);
    let local: OwnedMr<SimNic> = e.alloc_mr(4096, Access::ALL).unwrap();
    let vqps: Vec<Vqp<SimNic>> = (0..VQPS).map(|_| e.create_vqp().unwrap()).collect();
    let bad = e.create_vqp().unwrap();
    for v in vqps.iter().chain([&bad]) {
        v.connect(mem.gid()).unwrap();
        assert_eq!(v.dci_index(), 0, "all on one DCI");
    }
    let mut failures = 0;
    for round in 0..ROUNDS {
        for (i, v) in vqps.iter().enumerate() {
            if round % 5 == 2 && i == VQPS / 2 {
                // A READ with a wrong rkey: REM_ACCESS_ERR at the NIC, the
                // shared DCI goes to ERR and flushes what follows.
                let mut remote = mem.mr.remote(0);
                remote.rkey ^= 0x5a5a;
                let wr = SendWr::read(7000 + round, local.sge(3000, 8).unwrap(), remote);
                bad.post_send(&mut [wr]).unwrap();
            }
            let mut batch: Vec<SendWr> = (0..PER_ROUND)
                .map(|k| {
                    SendWr::faa(
                        round * PER_ROUND + k,
                        local.sge(i * 256 + 8 * k as usize, 8).unwrap(),
                        mem.mr.remote(i * 64),
                        1,
                    )
                    .signaled(k + 1 == PER_ROUND)
                })
                .collect();
            v.post_send(&mut batch).unwrap();
        }
        let got = collect(&vqps, 1);
        for (i, wcs) in got.iter().enumerate() {
            let ids: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
            let last = round * PER_ROUND + PER_ROUND - 1;
            assert_eq!(ids, [(last, WcStatus::Success)], "VQP {i} round {round}");
            // The signaled FAA's old value: every earlier FAA of this VQP
            // ran exactly once before it.
            let old = local
                .load_u64(i * 256 + 8 * (PER_ROUND as usize - 1))
                .unwrap();
            assert_eq!(old, last, "VQP {i} round {round}: FAA old value");
        }
        if round % 5 == 2 {
            let wcs = wait_wcs(&bad, 1);
            assert_eq!(wcs.len(), 1, "one completion for the failing WR");
            assert_eq!(wcs[0].wr_id, 7000 + round);
            assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
            failures += 1;
            // REM_ACCESS_ERR disconnected it; it connects again.
            assert!(bad.target().is_none());
            bad.connect(mem.gid()).unwrap();
        }
    }
    for (i, v) in vqps.iter().enumerate() {
        let mut buf = [Wc::default(); 4];
        assert_eq!(v.poll(&mut buf).unwrap(), 0, "VQP {i}: no duplicate");
        assert_eq!(
            mem.mr.load_u64(i * 64).unwrap(),
            ROUNDS * PER_ROUND,
            "VQP {i}: every FAA ran exactly once"
        );
    }
    let s = e.stats().dci;
    assert_eq!(s.recoveries, failures);
    assert!(
        s.reposted > 0,
        "the NIC flushed innocent WRs and the engine re-posted them: {s:?}"
    );
    assert_eq!(s.flushed_by_reset, 0, "the failing VQP had nothing behind");
    eprintln!("{failures} failures, {} innocent WRs re-posted", s.reposted);
}

/// A target that died: the VQP that reaches it gets a typed RETRY_EXC_ERR,
/// loses its target and the DCCache entry is dropped; VQPs sharing the DCI
/// but using a live target see only successes (their flushed WRs are
/// re-posted), and the failing VQP's later WRs are reported flushed to it.
#[test]
fn a_dead_target_is_typed_for_its_vqps_only() {
    let c = Cluster::new();
    let alive = c.memory_node(4096);
    let doomed_nic = c.nic();
    let doomed = Engine::start(
        doomed_nic.clone(),
        krcore_kmod::EngineConfig::default()
            .with_meta(c.location)
            .with_pool_size(1),
    )
    .unwrap();
    let doomed_mr = doomed.alloc_mr(4096, Access::ALL).unwrap();
    c.register(doomed.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    let e = client(&c);
    let local = e.alloc_mr(4096, Access::ALL).unwrap();
    let good: Vec<Vqp<SimNic>> = (0..3).map(|_| e.create_vqp().unwrap()).collect();
    let victim = e.create_vqp().unwrap();
    for v in &good {
        v.connect(alive.gid()).unwrap();
    }
    victim.connect(doomed.gid()).unwrap();
    assert!(e.cache().get(&doomed.gid()).is_some());
    doomed_nic.kill();

    for (i, v) in good.iter().enumerate() {
        if i == 1 {
            let wrs = [
                SendWr::read(1, local.sge(2048, 8).unwrap(), doomed_mr.remote(0)),
                SendWr::read(2, local.sge(2056, 8).unwrap(), doomed_mr.remote(8)),
            ];
            victim.post_send(&mut wrs.clone()).unwrap();
        }
        let wr = SendWr::write(
            10 + i as u64,
            local.sge(i * 8, 8).unwrap(),
            alive.mr.remote(i * 8),
        );
        local.store_u64(i * 8, 100 + i as u64).unwrap();
        v.post_send(&mut [wr]).unwrap();
    }
    for (i, v) in good.iter().enumerate() {
        let wcs = wait_wcs(v, 1);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(10 + i as u64, WcStatus::Success)],
            "VQP {i}"
        );
        assert_eq!(alive.mr.load_u64(i * 8).unwrap(), 100 + i as u64);
    }
    let wcs = wait_wcs(&victim, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
        "the failing VQP: the typed error, then its own later WR flushed"
    );
    assert!(victim.target().is_none(), "the VQP must connect again");
    assert!(
        e.cache().get(&doomed.gid()).is_none(),
        "the dead target's DCCache entry is dropped"
    );
    let start = std::time::Instant::now();
    for v in good.iter().chain([&victim]) {
        let mut buf = [Wc::default(); 4];
        assert_eq!(v.poll(&mut buf).unwrap(), 0);
    }
    assert!(start.elapsed() < WAIT);
    let s = e.stats().dci;
    assert_eq!(s.recoveries, 1);
    assert_eq!(s.flushed_by_reset, 1, "the victim's second READ");
}

/// A batch posted by copy (another VQP's WR outstanding) whose records
/// wrap around the end of the QP's ring, flushed by the NIC after that
/// other WR failed, is re-posted intact by recovery: the copies staged past
/// the ring's end were moved to their records' indices. One DCI 32 deep
/// (records ring of 32); each round posts 1 bad WR, 4 FAAs by copy and 4
/// re-posted: 9 sequences, so over 32 rounds the batch starts at every
/// offset of the ring, wrapping in 3 of them (and its re-post in 3 more).
#[test]
fn a_wrapped_copied_batch_is_reposted_intact() {
    const ROUNDS: u64 = 32;
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let e = c.engine(
        config(|c| {
            c.precheck = false;
            c.dci_depth = 32;
        })
        .with_pool_size(1),
    );
    let local = e.alloc_mr(4096, Access::ALL).unwrap();
    let (good, bad) = (e.create_vqp().unwrap(), e.create_vqp().unwrap());
    good.connect(mem.gid()).unwrap();
    bad.connect(mem.gid()).unwrap();
    assert_eq!(good.dci_qpn(), bad.dci_qpn(), "one shared DCI");
    for round in 0..ROUNDS {
        let mut remote = mem.mr.remote(0);
        remote.rkey ^= 0x5a5a;
        bad.post_send(&mut [SendWr::read(
            9000 + round,
            local.sge(3000, 8).unwrap(),
            remote,
        )])
        .unwrap();
        let mut batch: Vec<SendWr> = (0..PER_ROUND)
            .map(|k| {
                SendWr::faa(
                    round * PER_ROUND + k,
                    local.sge(8 * k as usize, 8).unwrap(),
                    mem.mr.remote(512),
                    1,
                )
                .signaled(k + 1 == PER_ROUND)
            })
            .collect();
        good.post_send(&mut batch).unwrap();
        let last = round * PER_ROUND + PER_ROUND - 1;
        let wcs = wait_wcs(&good, 1);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(last, WcStatus::Success)],
            "round {round}"
        );
        // Every FAA of this batch and the earlier ones ran exactly once,
        // in order (the signaled one read the count before it).
        assert_eq!(
            local.load_u64(8 * (PER_ROUND as usize - 1)).unwrap(),
            last,
            "round {round}: FAA old value"
        );
        let wcs = wait_wcs(&bad, 1);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (9000 + round, WcStatus::RemAccessErr)
        );
        bad.connect(mem.gid()).unwrap();
    }
    let mut buf = [Wc::default(); 4];
    assert_eq!(good.poll(&mut buf).unwrap(), 0, "no duplicate");
    assert_eq!(mem.mr.load_u64(512).unwrap(), ROUNDS * PER_ROUND);
    let s = e.stats().dci;
    assert_eq!(
        (s.recoveries, s.reposted),
        (ROUNDS, ROUNDS * PER_ROUND),
        "{s:?}"
    );
}

/// A VQP dropped right after its post (fire and forget: messaging answers
/// an Open so) polls no more. When its WR fails, the shared DCI is in ERR
/// with nobody to see it; the next post of another VQP, dropped as well,
/// must not be flushed with it: the post finds the orphan's failure first,
/// recovers the QP, then rings its doorbell, so its WRITE lands.
#[test]
fn a_post_behind_a_dropped_vqps_failure_is_not_flushed() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let e = client(&c);
    let local = e.alloc_mr(4096, Access::ALL).unwrap();
    for round in 0..3u64 {
        let bad = e.create_vqp().unwrap();
        bad.connect(mem.gid()).unwrap();
        let mut remote = mem.mr.remote(0);
        remote.rkey ^= 0x5a5a;
        let wr = SendWr::read(1, local.sge(3000, 8).unwrap(), remote).signaled(false);
        bad.post_send(&mut [wr]).unwrap();
        drop(bad);

        let ctl = e.create_vqp().unwrap();
        ctl.connect(mem.gid()).unwrap();
        local.store_u64(0, 500 + round).unwrap();
        let wr = SendWr::write(2, local.sge(0, 8).unwrap(), mem.mr.remote(64)).signaled(false);
        ctl.post_send(&mut [wr]).unwrap();
        drop(ctl);

        // Any later VQP's synchronous READ: by then the WRITE ran.
        let probe = e.create_vqp().unwrap();
        probe.connect(mem.gid()).unwrap();
        let wr = SendWr::read(3, local.sge(8, 8).unwrap(), mem.mr.remote(64));
        probe.post_send(&mut [wr]).unwrap();
        let wcs = wait_wcs(&probe, 1);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(3, WcStatus::Success)],
            "round {round}"
        );
        assert_eq!(
            mem.mr.load_u64(64).unwrap(),
            500 + round,
            "round {round}: the dropped VQP's WRITE was flushed"
        );
    }
    assert_eq!(e.stats().dci.recoveries, 3);
}
