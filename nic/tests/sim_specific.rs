//! Semantics of `sim` beyond the portable suite: fabric errors, dead nodes,
//! PDs, receiver-side errors, the latency model, and concurrency.

use krcore_nic::conformance::{poll_one, rc_pair, Side};
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn pair_with(cfg: SimConfig) -> (SimNic, SimNic) {
    let f = SimFabric::in_memory();
    (
        SimNic::open(&f, cfg.clone()).unwrap(),
        SimNic::open(&f, cfg).unwrap(),
    )
}

fn pair() -> (SimNic, SimNic) {
    pair_with(SimConfig::default())
}

#[test]
fn fabric_directory_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(matches!(
        SimFabric::open_dir(&missing, false),
        Err(NicError::FabricMissing(_))
    ));
    let deep = dir.path().join("no/such/parent");
    assert!(matches!(
        SimFabric::open_dir(&deep, true),
        Err(NicError::FabricMissing(_))
    ));
    // A fabric written by another layout version.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut hdr = vec![0u8; 64];
    hdr[..8].copy_from_slice(b"KRSIMFAB");
    hdr[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(other.join("fabric"), &hdr).unwrap();
    match SimFabric::open_dir(&other, false) {
        Err(NicError::FabricVersion { found: 99, .. }) => {}
        r => panic!("expected a version error, got {r:?}"),
    }
    for bad in ["mem", "sim:", "sim:a/b", "verbs:x"] {
        assert!(
            matches!(SimFabric::from_spec(bad), Err(NicError::BadFabricSpec(_))),
            "{bad}"
        );
    }
    // Two opens of one directory are one fabric.
    let shared = dir.path().join("shared");
    let f1 = SimFabric::open_dir(&shared, true).unwrap();
    let f2 = SimFabric::open_dir(&shared, false).unwrap();
    assert_eq!(f1.id(), f2.id());
}

#[test]
fn caller_memory_registration() {
    let (a, b) = pair();
    let sa = Side::new(&a, 4096);
    let sb = Side::new(&b, 64);
    let mut buf = vec![0u8; 4096];
    buf[..5].copy_from_slice(b"mine!");
    // SAFETY: `buf` outlives `mr` (dropped at the end of the scope, after
    // the region) and is not touched through Rust references meanwhile.
    let mr = unsafe { b.register_mr(&sb.pd, buf.as_mut_ptr(), buf.len(), Access::ALL) }.unwrap();
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 5).unwrap(), mr.remote(0))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
    let mut got = [0u8; 5];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"mine!");
    drop(mr);
    drop(buf);

    let dir = tempfile::tempdir().unwrap();
    let f = SimFabric::open_dir(dir.path().join("f"), true).unwrap();
    let n = SimNic::open(&f, SimConfig::default()).unwrap();
    let pd = n.alloc_pd().unwrap();
    let mut v = vec![0u8; 64];
    // SAFETY: the call is refused before the memory is used.
    let r = unsafe { n.register_mr(&pd, v.as_mut_ptr(), v.len(), Access::ALL) };
    assert!(matches!(r, Err(NicError::Unsupported(_))));
}

#[test]
fn killed_node_gives_retry_exceeded() {
    let (a, b) = pair();
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
    b.kill();
    qa.post_send(&[SendWr::read(2, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RetryExcErr);
    assert_eq!(qa.state(), QpState::Err);
}

#[test]
fn peer_not_ready_or_not_connected_gives_retry_exceeded() {
    let (a, b) = pair();
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let qa = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
    let qb = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
    bring_up(
        &qa,
        Access::ALL,
        Some(RcPeer {
            gid: b.gid(),
            qpn: qb.qpn(),
        }),
    )
    .unwrap();
    // qb stays in RESET.
    qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RetryExcErr);
    // qc is up but connected to someone else.
    let qa2 = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
    let qc = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
    bring_up(
        &qa2,
        Access::ALL,
        Some(RcPeer {
            gid: b.gid(),
            qpn: qc.qpn(),
        }),
    )
    .unwrap();
    bring_up(
        &qc,
        Access::ALL,
        Some(RcPeer {
            gid: a.gid(),
            qpn: 0x123,
        }),
    )
    .unwrap();
    qa2.post_send(&[SendWr::read(2, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RetryExcErr);
}

#[test]
fn protection_domains_are_enforced() {
    let (a, b) = pair();
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let other_pd_mr = {
        let pd2 = b.alloc_pd().unwrap();
        b.alloc_mr(&pd2, 4096, Access::ALL).unwrap()
    };
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    qa.post_send(&[SendWr::read(
        1,
        sa.mr.sge(0, 8).unwrap(),
        other_pd_mr.remote(0),
    )])
    .unwrap();
    assert_eq!(
        poll_one(&sa.cq).status,
        WcStatus::RemAccessErr,
        "remote MR in another PD"
    );
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let local_pd2 = {
        let pd2 = a.alloc_pd().unwrap();
        a.alloc_mr(&pd2, 64, Access::ALL).unwrap()
    };
    qa.post_send(&[SendWr::read(
        2,
        local_pd2.sge(0, 8).unwrap(),
        sb.mr.remote(0),
    )])
    .unwrap();
    assert_eq!(
        poll_one(&sa.cq).status,
        WcStatus::LocProtErr,
        "local MR in another PD"
    );
}

#[test]
fn short_receive_buffer_errors_both_sides() {
    let (a, b) = pair();
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, qb) = rc_pair(&sa, &sb, QpCaps::default());
    qb.post_recv(&[
        RecvWr::new(1, sb.mr.sge(0, 8).unwrap()),
        RecvWr::new(2, sb.mr.sge(8, 8).unwrap()),
    ])
    .unwrap();
    qa.post_send(&[SendWr::send(9, sa.mr.sge(0, 64).unwrap(), None)])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RemInvReqErr);
    let wc = poll_one(&sb.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocLenErr));
    assert_eq!(
        qb.state(),
        QpState::Err,
        "an RC receiver that fails enters ERR"
    );
    let wc = poll_one(&sb.cq);
    assert_eq!(
        (wc.wr_id, wc.status),
        (2, WcStatus::WrFlushErr),
        "its other receives flush"
    );
}

#[test]
fn dc_unsupported_device_refuses_dc_qps() {
    let (a, _b) = pair_with(SimConfig {
        dc: false,
        ..SimConfig::default()
    });
    assert!(!a.caps().dc);
    let s = Side::new(&a, 64);
    let r = a.create_qp(
        &s.pd,
        &QpInit {
            qp_type: QpType::Dci,
            caps: QpCaps::default(),
            send_cq: &s.cq,
            recv_cq: &s.cq,
            srq: None,
            dc_key: 0,
        },
    );
    assert!(matches!(r, Err(NicError::Unsupported(_))));
}

#[test]
fn latency_model_delays_completions_and_charges_control_path() {
    let m = LatencyModel::cx4();
    let (a, b) = pair_with(SimConfig {
        latency: Some(m),
        ..SimConfig::default()
    });
    let before = a.counters();
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let d = a.counters() - before;
    assert_eq!(
        d.modeled_control_ns,
        m.qp_create_ns + m.rc_connect_ns + m.mr_reg_ns,
        "one QP created and connected, one MR registered (modeled)"
    );
    let posted = std::time::Instant::now();
    qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    let mut wc = [Wc::default()];
    // The completion is not visible right after posting...
    let first = sa.cq.poll(&mut wc).unwrap();
    let wc = if first == 1 { wc[0] } else { poll_one(&sa.cq) };
    assert!(
        first == 0 || posted.elapsed().as_nanos() as u64 >= m.read_ns,
        "a READ completion may not be visible before its modeled latency"
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert!(posted.elapsed().as_nanos() as u64 >= m.read_ns);
}

#[test]
fn threads_on_separate_qps_faa_one_counter_exactly() {
    let (a, b) = pair();
    let sb = Arc::new(Side::new(&b, 4096));
    let threads = 4;
    let per = 5000u64;
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let a = a.clone();
            let sb = sb.clone();
            std::thread::spawn(move || {
                let sa = Side::new(&a, 64);
                let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
                for i in 0..per {
                    qa.post_send(&[SendWr::faa(i, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0), 1)])
                        .unwrap();
                    assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(sb.mr.load_u64(0).unwrap(), threads * per);
}

#[test]
fn shared_qp_from_threads_keeps_credits_consistent() {
    // Many threads post on ONE QP (verbs allows it); every WR completes
    // exactly once and credits return to full.
    let (a, b) = pair();
    let sa = Side::new(&a, 4096);
    let sb = Side::new(&b, 4096);
    let caps = QpCaps {
        max_send_wr: 8,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&sa, &sb, caps);
    let qa = Arc::new(qa);
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sa = Arc::new(sa);
    let hs: Vec<_> = (0..3u64)
        .map(|t| {
            let (qa, sa, sb_mr, total) = (qa.clone(), sa.clone(), sb.mr.clone(), total.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                let mut wc = [Wc::default(); 8];
                while done < 2000 {
                    let wr =
                        SendWr::faa(t, sa.mr.sge(8 * t as usize, 8).unwrap(), sb_mr.remote(0), 1);
                    match qa.post_send(&[wr]) {
                        Ok(()) => done += 1,
                        Err(e) => assert!(matches!(e.kind, PostErrorKind::QueueFull { .. }), "{e}"),
                    }
                    let n = sa.cq.poll(&mut wc).unwrap();
                    for w in &wc[..n] {
                        assert_eq!(w.status, WcStatus::Success);
                    }
                    total.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut wc = [Wc::default(); 8];
    let start = std::time::Instant::now();
    while total.load(std::sync::atomic::Ordering::Relaxed) < 6000 {
        let n = sa.cq.poll(&mut wc).unwrap();
        total.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        assert!(start.elapsed().as_secs() < 10);
    }
    assert_eq!(total.load(std::sync::atomic::Ordering::Relaxed), 6000);
    assert_eq!(sb.mr.load_u64(0).unwrap(), 6000);
    assert_eq!(qa.send_credits(), 8);
}

#[test]
fn well_known_names_on_both_fabric_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let d1 = SimFabric::open_dir(dir.path().join("f"), true).unwrap();
    let d2 = SimFabric::open_dir(dir.path().join("f"), false).unwrap();
    let m = SimFabric::in_memory();
    for (publisher, reader) in [(&m, &m), (&d1, &d2)] {
        assert_eq!(reader.lookup("meta").unwrap(), None);
        publisher.publish("meta", b"where the table is").unwrap();
        assert_eq!(
            reader.lookup("meta").unwrap().as_deref(),
            Some(&b"where the table is"[..])
        );
        publisher.publish("meta", b"v2").unwrap();
        assert_eq!(reader.lookup("meta").unwrap().as_deref(), Some(&b"v2"[..]));
        publisher.unpublish("meta").unwrap();
        assert_eq!(reader.lookup("meta").unwrap(), None);
        for bad in ["", "../x", "a/b", ".hidden", &"x".repeat(65)] {
            assert!(
                matches!(
                    publisher.publish(bad, b""),
                    Err(NicError::InvalidArgument(_))
                ),
                "{bad}"
            );
        }
        assert!(publisher
            .publish("big", &vec![0u8; (64 << 10) + 1])
            .is_err());
    }
}

#[test]
fn concurrent_object_creation_never_shares_a_table_slot() {
    let (a, _b) = pair();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (a, pd, cq) = (a.clone(), pd.clone(), cq.clone());
            std::thread::spawn(move || {
                let mut keep = vec![];
                for _ in 0..50 {
                    let mr = a.alloc_mr(&pd, 64, Access::ALL).unwrap();
                    let qp = a
                        .create_qp(
                            &pd,
                            &QpInit {
                                qp_type: QpType::Rc,
                                caps: QpCaps::default(),
                                send_cq: &cq,
                                recv_cq: &cq,
                                srq: None,
                                dc_key: 0,
                            },
                        )
                        .unwrap();
                    keep.push((mr, qp));
                }
                keep
            })
        })
        .collect();
    let all: Vec<_> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let mut keys: Vec<u32> = all.iter().map(|(m, _)| m.lkey() >> 8).collect();
    let mut qpns: Vec<u32> = all.iter().map(|(_, q)| q.qpn() & 0xfff).collect();
    keys.sort();
    keys.dedup();
    qpns.sort();
    qpns.dedup();
    assert_eq!(keys.len(), 200, "MR table slots are unique");
    assert_eq!(qpns.len(), 200, "QP table slots are unique");
}

/// A sub-region's deregistration waits for the WRs moving data through its
/// key: once the drop returns, no READ through the key returns bytes
/// written after it (the owner poisons the range right after the drop), and
/// no WRITE through it lands. Reader and writer loop on their own threads.
#[test]
fn a_dropped_sub_region_moves_no_data_after_the_drop() {
    let (a, b) = pair();
    let sb = Side::new(&b, 4096);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    const POISON: u8 = 0xEE;
    for round in 0..100u64 {
        sb.mr.write(0, &[0u8; 4096]).unwrap();
        let sub = b.register_sub_mr(&sb.mr, 512, 1024, rw).unwrap();
        let (rkey, addr) = (sub.rkey(), sub.addr());
        let go = Arc::new(std::sync::Barrier::new(3));
        let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let spawn = |write: bool| {
            let (a, b, go, done) = (a.clone(), b.clone(), go.clone(), done.clone());
            let (sb_mr, sb_pd) = (sb.mr.clone(), sb.pd.clone());
            std::thread::spawn(move || {
                let sa = Side::new(&a, 8192);
                let sbb = Side {
                    nic: b.clone(),
                    pd: sb_pd,
                    cq: b.create_cq(64).unwrap(),
                    mr: sb_mr,
                };
                let (qa, _qb) = rc_pair(&sa, &sbb, QpCaps::default());
                sa.mr.write(0, &[0x11u8; 1024]).unwrap();
                go.wait();
                let mut ok = 0u64;
                loop {
                    // The whole range each time: the widest window between
                    // the key's check and the last byte moved.
                    let remote = RemoteAddr { addr, rkey };
                    let wr = if write {
                        SendWr::write(ok, sa.mr.sge(0, 1024).unwrap(), remote)
                    } else {
                        SendWr::read(ok, sa.mr.sge(4096, 1024).unwrap(), remote)
                    };
                    qa.post_send(&[wr]).unwrap();
                    let wc = poll_one(&sa.cq);
                    if wc.status != WcStatus::Success {
                        assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
                        return ok;
                    }
                    if !write {
                        let mut got = [0u8; 1024];
                        sa.mr.read(4096, &mut got).unwrap();
                        assert!(
                            !got.contains(&POISON),
                            "round {round}: a READ returned bytes written after the drop"
                        );
                    }
                    ok += 1;
                    done[usize::from(write)].store(ok, Ordering::Relaxed);
                }
            })
        };
        let (reader, writer) = (spawn(false), spawn(true));
        go.wait();
        // Both loops running (a few operations each) when the drop comes.
        let t0 = std::time::Instant::now();
        while done
            .iter()
            .any(|d| d.load(Ordering::Relaxed) < 3 + round % 7)
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::yield_now();
        }
        drop(sub);
        sb.mr.write(512, &[POISON; 1024]).unwrap();
        let reads = reader.join().unwrap();
        let writes = writer.join().unwrap();
        let mut after = [0u8; 1024];
        sb.mr.read(512, &mut after).unwrap();
        assert!(
            after.iter().all(|&x| x == POISON),
            "round {round}: a WRITE landed after the drop ({reads} reads, {writes} writes)"
        );
    }
}

/// `prefault` faults memory in ahead of use and never changes a byte: on
/// anonymous memory (in-memory fabric, huge-page hinted from 4 MiB on), on
/// a directory fabric's shared files, and on caller memory; ranges
/// outside the region are refused.
#[test]
fn prefault_keeps_the_bytes_and_checks_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let on_dir = SimFabric::open_dir(dir.path().join("f"), true).unwrap();
    let in_mem = SimFabric::in_memory();
    for (fabric, len) in [(&in_mem, 8 << 20), (&in_mem, 12_288), (&on_dir, 1 << 20)] {
        let n = SimNic::open(fabric, SimConfig::default()).unwrap();
        let pd = n.alloc_pd().unwrap();
        let mr = n.alloc_mr(&pd, len, Access::ALL).unwrap();
        // A pattern on some pages (others stay untouched zeros).
        let marks = [0usize, 4088, 4100, len / 2 + 3, len - 8];
        for (i, &at) in marks.iter().enumerate() {
            mr.write(at, &[i as u8 + 1; 8][..(len - at).min(8)])
                .unwrap();
        }
        mr.prefault(0, len).unwrap();
        mr.prefault(100, 5000).unwrap();
        mr.prefault(len, 0).unwrap();
        for (i, &at) in marks.iter().enumerate() {
            let mut got = vec![0u8; (len - at).min(8)];
            mr.read(at, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1), "{len}: {at}");
        }
        let mut zero = [1u8; 8];
        mr.read(8192, &mut zero).unwrap();
        assert_eq!(zero, [0; 8], "untouched bytes stay zero");
        for (off, l) in [(len, 1), (len - 4, 8), (usize::MAX, 2)] {
            assert!(
                matches!(mr.prefault(off, l), Err(NicError::InvalidArgument(_))),
                "{off}+{l}"
            );
        }
    }
    // Caller memory: the per-page atomic touch.
    let (_a, b) = pair();
    let pd = b.alloc_pd().unwrap();
    let mut buf = vec![7u8; 3 * 4096 + 100];
    // SAFETY: `buf` outlives `mr` (dropped first) and is not touched
    // through Rust references meanwhile.
    let mr = unsafe { b.register_mr(&pd, buf.as_mut_ptr().wrapping_add(3), 3 * 4096, Access::ALL) }
        .unwrap();
    mr.prefault(1, 3 * 4096 - 1).unwrap();
    let mut got = vec![0u8; 3 * 4096];
    mr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 7));
    drop(mr);
    drop(buf);
}

/// Pages of a fresh region are not in until touched; after `prefault` they
/// are (`mincore`), with nothing written.
#[test]
fn prefault_brings_the_pages_in() {
    let resident = |addr: u64, len: usize| -> Vec<bool> {
        let pages = len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        // SAFETY: `addr..addr+len` is a page-aligned live mapping (a
        // region's first bytes) and `v` has one byte per page of it.
        let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().map(|b| b & 1 == 1).collect()
    };
    let f = SimFabric::in_memory();
    let n = SimNic::open(&f, SimConfig::default()).unwrap();
    let pd = n.alloc_pd().unwrap();
    let len = 1 << 20;
    let mr = n.alloc_mr(&pd, len, Access::ALL).unwrap();
    assert_eq!(mr.addr() % 4096, 0);
    assert!(
        resident(mr.addr(), len).iter().any(|&r| !r),
        "lazily backed"
    );
    mr.prefault(64 << 10, 128 << 10).unwrap();
    let after = resident(mr.addr(), len);
    assert!(after[16..48].iter().all(|&r| r), "the range is in");
    mr.prefault(0, len).unwrap();
    assert!(resident(mr.addr(), len).iter().all(|&r| r));
}

/// One DCI taking turns between five target nodes (more than its cache of
/// target nodes holds): every READ reaches the node it names, also after
/// the node left the cache and came back; a node killed while the DCI was
/// at another one is found dead when the DCI comes back to it (the cached
/// entry is checked again, not trusted), and the others still answer.
#[test]
fn a_dci_taking_turns_between_nodes_reaches_each_and_sees_a_death() {
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let sa = Side::new(&a, 4096);
    let targets: Vec<_> = (0..5u8)
        .map(|i| {
            let nic = SimNic::open(&f, SimConfig::default()).unwrap();
            let side = Side::new(&nic, 4096);
            side.mr.write(0, &[i; 8]).unwrap();
            let srq = nic.create_srq(&side.pd, 4, 1).unwrap();
            let dct = side.qp(QpType::Dct, QpCaps::default(), Some(&srq), 0xdc);
            krcore_nic::bring_up(&dct, Access::ALL, None).unwrap();
            let to = Destination::Dc(DcTarget {
                gid: nic.gid(),
                dct_num: dct.qpn(),
                dc_key: 0xdc,
            });
            (nic, side, srq, dct, to)
        })
        .collect();
    let new_dci = || {
        let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
        krcore_nic::bring_up(&dci, Access::NONE, None).unwrap();
        dci
    };
    let dci = new_dci();
    let read = |dci: &_, i: usize, id: u64| -> Wc {
        let (_, side, _, _, to) = &targets[i];
        krcore_nic::QueuePair::post_send(
            dci,
            &[SendWr::read(id, sa.mr.sge(0, 8).unwrap(), side.mr.remote(0)).to(*to)],
        )
        .unwrap();
        poll_one(&sa.cq)
    };
    let mut id = 0;
    for round in 0..3 {
        for i in [0, 1, 2, 3, 4, 2, 0, 3] {
            id += 1;
            let wc = read(&dci, i, id);
            assert_eq!(
                (wc.wr_id, wc.status),
                (id, WcStatus::Success),
                "round {round}"
            );
            let mut got = [0u8; 8];
            sa.mr.read(0, &mut got).unwrap();
            assert_eq!(got, [i as u8; 8], "round {round}: target {i}");
        }
    }
    // Node 1 dies while the DCI is at node 0 (node 1 is in its cache).
    read(&dci, 1, 100);
    read(&dci, 0, 101);
    targets[1].0.kill();
    let wc = read(&dci, 1, 102);
    assert_eq!((wc.wr_id, wc.status), (102, WcStatus::RetryExcErr));
    // A DCI in error is recreated (as the engine does); the others answer.
    let dci = new_dci();
    for i in [0, 2, 3, 4] {
        let wc = read(&dci, i, 200 + i as u64);
        assert_eq!(wc.status, WcStatus::Success, "target {i}");
    }
}
