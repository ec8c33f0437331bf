//! The wrapper over `sim`: transparent without faults (the conformance
//! suite), RDMA ordering under delays, and hardware-like failures.

use super::*;
use crate::conformance::{self as suite, poll_one, rc_pair, Side};
use crate::provider::{CompletionQueue, MemoryRegion, QueuePair};
use crate::sim::{SimConfig, SimFabric, SimNic};
use crate::types::{DcTarget, Destination, QpCaps, QpState, QpType, SendWr, Wc, WcStatus};

fn pair(cfg: &FaultConfig) -> (FaultNic<SimNic>, FaultNic<SimNic>) {
    let f = SimFabric::in_memory();
    let open = || SimNic::open(&f, SimConfig::default()).unwrap();
    (
        FaultNic::new(open(), cfg.clone()),
        FaultNic::new(open(), cfg.clone()),
    )
}

#[test]
fn without_faults_the_wrapper_passes_the_conformance_suite() {
    let (a, b) = pair(&FaultConfig::none(1));
    suite::run_all(&a, &b);
}

#[test]
fn with_delays_the_wrapper_still_passes_the_conformance_suite() {
    for seed in 0..3 {
        let (a, b) = pair(&FaultConfig::delays(seed));
        suite::run_all(&a, &b);
        assert!(a.stats().delayed > 0, "seed {seed}: {:?}", a.stats());
    }
}

/// Posts `n` signaled WRITEs on each of `qps` and polls them all back from
/// the shared CQ.
fn interleaved(seed: u64) -> (Vec<Wc>, FaultStats) {
    let (a, b) = pair(&FaultConfig::delays(seed));
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let caps = QpCaps {
        max_send_wr: 64,
        ..QpCaps::default()
    };
    let pairs: Vec<_> = (0..3).map(|_| rc_pair(&sa, &sb, caps)).collect();
    let qps: Vec<_> = pairs.iter().map(|p| p.0.clone()).collect();
    for round in 0..20u64 {
        for (i, qp) in qps.iter().enumerate() {
            let id = (i as u64) << 32 | round;
            qp.post_send(&[SendWr::write(
                id,
                sa.mr.sge(0, 8).unwrap(),
                sb.mr.remote(8 * i),
            )])
            .unwrap();
        }
    }
    let wcs: Vec<Wc> = (0..60).map(|_| poll_one(&sa.cq)).collect();
    let mut extra = [Wc::default(); 4];
    for _ in 0..8 {
        assert_eq!(sa.cq.poll(&mut extra).unwrap(), 0, "a completion too many");
    }
    (wcs, a.stats())
}

#[test]
fn delays_reorder_queues_but_never_one_send_queue() {
    let mut reordered = 0;
    for seed in 0..10 {
        let (wcs, stats) = interleaved(seed);
        reordered += stats.reordered;
        let mut next = [0u64; 3];
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success);
            let (q, round) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xffff_ffff);
            assert_eq!(round, next[q], "seed {seed}: QP {q} out of order: {wcs:?}");
            next[q] += 1;
        }
        assert_eq!(next, [20; 3]);
    }
    assert!(reordered > 0, "no reordering across QPs in 10 seeds");
}

#[test]
fn the_same_seed_makes_the_same_choices() {
    let ids = |seed| {
        interleaved(seed)
            .0
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(7), ids(7));
    assert_ne!(ids(7), ids(8));
}

#[test]
fn a_failed_wr_errs_the_qp_flushes_the_rest_and_has_no_effect() {
    for status in [WcStatus::RetryExcErr, WcStatus::RemAccessErr] {
        let cfg = FaultConfig {
            fail_ppm: 1_000_000,
            fail_statuses: vec![status],
            max_faults: 1,
            ..FaultConfig::none(3)
        };
        let (a, b) = pair(&cfg);
        let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
        let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
        sa.mr.store_u64(0, 0x1111).unwrap();
        let wrs: Vec<SendWr> = (0..3)
            .map(|i| SendWr::write(i, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(64)))
            .collect();
        qa.post_send(&wrs).unwrap();
        let got: Vec<(u64, WcStatus)> = (0..3)
            .map(|_| poll_one(&sa.cq))
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(
            got,
            [
                (0, status),
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(qa.state(), QpState::Err);
        assert_eq!(
            sb.mr.load_u64(64).unwrap(),
            0,
            "a failed WR wrote remote memory"
        );
        assert_eq!(a.stats().failed_wrs, 1);
        // Reset + bring-up recovers; the budget is spent, so WRs succeed.
        qa.modify(crate::Transition::Reset).unwrap();
        let peer = crate::RcPeer {
            gid: b.gid(),
            qpn: _qb.qpn(),
        };
        crate::bring_up(&qa, crate::Access::ALL, Some(peer)).unwrap();
        qa.post_send(&wrs[..1]).unwrap();
        assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
        assert_eq!(sb.mr.load_u64(64).unwrap(), 0x1111);
    }
}

#[test]
fn a_dropped_node_fails_every_wr_to_it_with_retry_exceeded() {
    let (a, b) = pair(&FaultConfig::none(4));
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let srq = b.create_srq(&sb.pd, 16, 1).unwrap();
    let dct = sb.qp(QpType::Dct, QpCaps::default(), Some(&srq), 77);
    crate::bring_up(&dct, crate::Access::ALL, None).unwrap();
    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    crate::bring_up(&dci, crate::Access::NONE, None).unwrap();
    let to = Destination::Dc(DcTarget {
        gid: b.gid(),
        dct_num: dct.qpn(),
        dc_key: 77,
    });
    let (rc, _) = rc_pair(&sa, &sb, QpCaps::default());
    a.drop_node(b.gid());
    dci.post_send(&[SendWr::faa(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0), 1).to(to)])
        .unwrap();
    rc.post_send(&[SendWr::faa(2, sa.mr.sge(8, 8).unwrap(), sb.mr.remote(0), 1)])
        .unwrap();
    let mut got = [poll_one(&sa.cq), poll_one(&sa.cq)];
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.map(|w| (w.wr_id, w.status)),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::RetryExcErr)]
    );
    assert_eq!((dci.state(), rc.state()), (QpState::Err, QpState::Err));
    assert_eq!(sb.mr.load_u64(0).unwrap(), 0);
    assert_eq!(a.stats().dropped_wrs, 2);
}

#[test]
fn a_held_completion_keeps_its_send_slot_busy() {
    let cfg = FaultConfig {
        delay_ppm: 1_000_000,
        max_delay_polls: 3,
        ..FaultConfig::none(5)
    };
    let (a, b) = pair(&cfg);
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let caps = QpCaps {
        max_send_wr: 2,
        ..QpCaps::default()
    };
    let (qa, _) = rc_pair(&sa, &sb, caps);
    let w = |i| SendWr::write(i, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0));
    qa.post_send(&[w(0), w(1)]).unwrap();
    let mut wc = [Wc::default(); 2];
    // The first poll pulls both and holds them (delay >= 1 poll).
    assert_eq!(sa.cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(qa.send_credits(), 0);
    let e = qa.post_send(&[w(2)]).unwrap_err();
    assert!(
        matches!(e.kind, crate::PostErrorKind::QueueFull { .. }),
        "{e:?}"
    );
    let got = crate::conformance::poll_n(&sa.cq, 2);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(qa.send_credits(), 2);
}

#[test]
fn a_forced_err_flushes_and_counts() {
    let (a, b) = pair(&FaultConfig::none(6));
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _) = rc_pair(&sa, &sb, QpCaps::default());
    qa.force_err().unwrap();
    qa.post_send(&[SendWr::read(9, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    let wc = poll_one(&sa.cq);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushErr));
    assert_eq!(a.stats().forced_errs, 1);
}

#[test]
fn a_stalled_node_holds_wrs_in_order_and_they_land_late() {
    let (a, b) = pair(&FaultConfig::none(7));
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    sb.mr.store_u64(0, 0x1111).unwrap();
    a.stall_node(b.gid());
    // A READ of b's word into a's buffer, then a WRITE of a's word 8 to
    // b's word 8: neither executes nor completes while b is stalled.
    qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    sa.mr.store_u64(8, 0x2222).unwrap();
    qa.post_send(&[SendWr::write(2, sa.mr.sge(8, 8).unwrap(), sb.mr.remote(8))])
        .unwrap();
    crate::conformance::expect_quiet(&sa.cq, std::time::Duration::from_millis(20));
    assert_eq!(sa.mr.load_u64(0).unwrap(), 0);
    assert_eq!(sb.mr.load_u64(8).unwrap(), 0);
    assert_eq!(a.stats().stalled_wrs, 2);
    // Meanwhile b's word changes and a reuses its buffer: the READ, run
    // late, overwrites what a put there since.
    sb.mr.store_u64(0, 0x3333).unwrap();
    sa.mr.store_u64(0, 0x4444).unwrap();
    a.resume_node(b.gid());
    let got = crate::conformance::poll_n(&sa.cq, 2);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(sa.mr.load_u64(0).unwrap(), 0x3333);
    assert_eq!(sb.mr.load_u64(8).unwrap(), 0x2222);
}

#[test]
fn held_wrs_of_a_qp_moved_to_err_flush() {
    let (a, b) = pair(&FaultConfig::none(8));
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    a.stall_node(b.gid());
    qa.post_send(&[SendWr::read(3, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    crate::conformance::expect_quiet(&sa.cq, std::time::Duration::from_millis(10));
    qa.force_err().unwrap();
    let wc = poll_one(&sa.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::WrFlushErr));
    assert_eq!(qa.send_credits(), qa.max_send_wr());
}
