//! The lazy engine start (DC mode): `Engine::start` creates no QP; each
//! resource is created at its first need, exactly once however many
//! threads need it at the same moment, as the NIC's counters show; the meta
//! client READs through DCI 0 of the pool, and a dead meta server does not
//! disturb the VQPs sharing that DCI. The RC fallback mode keeps its eager
//! start (tests/engine_rc_fallback.rs).

mod common;

use std::sync::{Arc, Barrier};

use common::{counted, wait_wcs, Cluster};
use krcore_kmod::engine::handshake_gid;
use krcore_kmod::{Engine, EngineConfig, EngineError, MetaFailure};
use krcore_nic::{Access, DcTarget, MemoryRegion, Nic, SendWr, WcStatus};

/// A client engine with every lazy resource configured: the upgrade's
/// handshake endpoint, the meta client, a 1-DCI pool.
/// (The tests post rkeys by hand: their VQPs opt out of the grant rule.)
fn lazy_config() -> EngineConfig {
    EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true)
        .with_ungranted(krcore_kmod::Ungranted::Allow)
}

#[test]
fn a_dc_start_creates_no_qp_and_each_first_need_creates_exactly_its_own() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    mem.mr.write(0, b"lazy!!!!").unwrap();
    let nic = c.nic();
    let (e, d) = counted(&nic, || {
        Engine::start(nic.clone(), lazy_config().with_meta(c.location)).unwrap()
    });
    assert_eq!(d.qps_created, 0, "the start creates no QP: {d:?}");
    assert_eq!(d.mrs_registered, 0, "{d:?}");
    let s = e.stats();
    assert_eq!(
        (s.dcis, s.dcts_created, s.handshake_endpoints_created),
        (0, 0, 0)
    );
    assert!(e.handshake_responder().is_none());
    assert_eq!(e.progress().unwrap(), 0, "no endpoint to progress yet");

    // Local memory creates no QP.
    let (buf, d) = counted(&nic, || e.alloc_mr(64, Access::LOCAL_WRITE).unwrap());
    assert_eq!((d.qps_created, d.mrs_registered), (0, 1), "{d:?}");

    // The first VQP creates DCI 0; the first connect (a miss) creates no
    // QP: the meta READ goes through DCI 0, into a buffer made now.
    let (v, d) = counted(&nic, || e.create_vqp().unwrap());
    assert_eq!(d.qps_created, 1, "DCI 0: {d:?}");
    let (r, d) = counted(&nic, || v.connect(mem.gid()));
    r.unwrap();
    assert_eq!(
        (d.qps_created, d.reads, d.mrs_registered),
        (0, 1, 1),
        "{d:?}"
    );
    let s = e.stats();
    assert_eq!((s.dcis, s.meta.reads), (1, 1));
    assert_eq!(
        (s.dci.doorbells, s.dci.wrs, s.dci.completions),
        (0, 0, 0),
        "the meta READ is not counted as the VQPs' traffic: {:?}",
        s.dci
    );

    // One-sided ops need nothing more: the first get of a compute node.
    let (_, d) = counted(&nic, || {
        v.post_send(&mut [SendWr::read(7, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
            .unwrap();
        let wc = wait_wcs(&v, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    });
    assert_eq!(d.qps_created, 0, "{d:?}");
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"lazy!!!!");
    let s = e.stats();
    assert_eq!((s.dci.doorbells, s.dci.wrs), (1, 1), "{:?}", s.dci);
    assert_eq!((s.dcts_created, s.handshake_endpoints_created), (0, 0));

    // Becoming reachable creates the DCT (one QP), once.
    let (t, d) = counted(&nic, || e.local_target().unwrap());
    assert_eq!(d.qps_created, 1, "the DCT: {d:?}");
    let (t2, d) = counted(&nic, || e.local_target().unwrap());
    assert_eq!((t2, d.qps_created), (t, 0));
    assert_eq!(t.gid, e.gid());
    // Memory with remote access needs the DCT, which exists now.
    let (_, d) = counted(&nic, || e.alloc_mr(64, Access::ALL).unwrap());
    assert_eq!((d.qps_created, d.mrs_registered), (0, 1), "{d:?}");

    // Serving as an upgrade target creates no QP: the handshake is served
    // on the DCT's reserved messaging port (its receive buffers and the
    // port's staging ring are made now, once).
    let (hs, d) = counted(&nic, || e.handshake_entry().unwrap().unwrap());
    assert_eq!((d.qps_created, d.mrs_registered), (0, 2), "{d:?}");
    assert_eq!(hs.gid, handshake_gid(&e.gid()));
    assert_eq!((hs.dct_num, hs.dc_key), (t.dct_num, t.dc_key), "the DCT");
    assert!(e.handshake_responder().is_none(), "no UD endpoint");
    let (hs2, d) = counted(&nic, || e.handshake_entry().unwrap().unwrap());
    assert_eq!((hs2, d.qps_created, d.mrs_registered), (hs, 0, 0));
    let s = e.stats();
    assert_eq!(
        (s.dcis, s.dcts_created, s.handshake_endpoints_created),
        (1, 1, 0)
    );
}

/// A node that only initiates upgrades creates what its handshake needs at
/// its first one, never before: its DCT (the answers come back as
/// messages) and the pair's RC QP; no UD QP.
#[test]
fn an_upgrade_initiator_creates_its_receiver_at_its_first_upgrade() {
    let c = Cluster::new();
    let target = c.engine(lazy_config().with_handshake_thread(true));
    let mr = target.alloc_mr(64, Access::ALL).unwrap();
    c.register(target.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    c.register(target.handshake_entry().unwrap().unwrap(), 1 << 40, 0)
        .unwrap();
    let nic = c.nic();
    let e = Engine::start(
        nic.clone(),
        lazy_config()
            .with_handshake_thread(true)
            .with_meta(c.location),
    )
    .unwrap();
    let v = e.create_vqp().unwrap();
    v.connect(target.gid()).unwrap();
    e.resolve(&handshake_gid(&target.gid())).unwrap();
    assert_eq!(e.stats().dcts_created, 0);
    let (r, d) = counted(&nic, || v.upgrade());
    assert_eq!(r.unwrap(), krcore_kmod::VqpPath::Rc);
    assert_eq!(d.qps_created, 2, "its DCT and the RC QP: {d:?}");
    let s = e.stats();
    assert_eq!((s.handshake_endpoints_created, s.rc_upgrades), (0, 1));
    assert_eq!(s.dcts_created, 1, "the answers' receiver");
    let buf = e.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
}

#[test]
fn memory_with_remote_access_makes_the_node_reachable() {
    let c = Cluster::new();
    let nic = c.nic();
    let e = Engine::start(
        nic.clone(),
        EngineConfig::default().with_ungranted(krcore_kmod::Ungranted::Allow),
    )
    .unwrap();
    let (mr, d) = counted(&nic, || e.alloc_mr(64, Access::REMOTE_READ).unwrap());
    assert_eq!(d.qps_created, 1, "the DCT peers reach it through: {d:?}");
    assert_eq!(e.stats().dcts_created, 1);
    // Reachable indeed: registered, a peer READs it.
    mr.write(0, b"reached!").unwrap();
    c.register(e.local_target().unwrap(), 1 << 40, 0).unwrap();
    let peer = c.engine(EngineConfig::default());
    let v = peer.create_vqp().unwrap();
    v.connect(e.gid()).unwrap();
    let buf = peer.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"reached!");
}

#[test]
fn eager_start_creates_the_dct_and_serves_upgrades_at_start() {
    let c = Cluster::new();
    let nic = c.nic();
    let (e, d) = counted(&nic, || {
        Engine::start(nic.clone(), lazy_config().with_eager_start(true)).unwrap()
    });
    // The DCT, and the DCI the reserved port's VQP is bound to; no UD QP.
    assert_eq!(d.qps_created, 2, "DCT + DCI 0: {d:?}");
    let s = e.stats();
    assert_eq!((s.dcts_created, s.handshake_endpoints_created), (1, 0));
    let (_, d) = counted(&nic, || {
        e.local_target().unwrap();
        e.handshake_entry().unwrap().unwrap();
    });
    assert_eq!(d.qps_created, 0, "{d:?}");
}

/// Threads hitting every first need at once: each resource is created
/// exactly once (NIC counters and the engine's), and every thread sees the
/// same one.
#[test]
fn concurrent_first_needs_create_each_resource_once() {
    const THREADS: usize = 8;
    let c = Arc::new(Cluster::new());
    let mem = c.memory_node(64);
    for round in 0..20 {
        let nic = c.nic();
        let e = Engine::start(nic.clone(), lazy_config().with_meta(c.location)).unwrap();
        let before = nic.counters();
        let barrier = Arc::new(Barrier::new(THREADS));
        let seen: Vec<(DcTarget, DcTarget)> = (0..THREADS)
            .map(|i| {
                let (e, barrier, gid) = (e.clone(), barrier.clone(), mem.gid());
                std::thread::spawn(move || {
                    barrier.wait();
                    // Each thread takes the first needs in another order.
                    let mut t = None;
                    let mut hs = None;
                    for step in 0..4 {
                        match (step + i) % 4 {
                            0 => t = Some(e.local_target().unwrap()),
                            1 => hs = e.handshake_entry().unwrap(),
                            2 => {
                                e.resolve(&gid).unwrap();
                                e.invalidate(&gid);
                            }
                            _ => {
                                e.alloc_mr(64, Access::ALL).unwrap();
                                e.create_vqp().unwrap();
                            }
                        }
                    }
                    (t.unwrap(), hs.unwrap())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let d = nic.counters() - before;
        assert_eq!(
            d.qps_created, 2,
            "round {round}: one DCT, one DCI (no UD endpoint): {d:?}"
        );
        assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
        let s = e.stats();
        assert_eq!(
            (s.dcis, s.dcts_created, s.handshake_endpoints_created),
            (1, 1, 0),
            "round {round}"
        );
        assert!(s.meta.reads >= 1);
        // THREADS MRs with remote access, one meta READ buffer, the
        // messaging receive buffers and the reserved port's staging ring.
        assert_eq!(d.mrs_registered, THREADS as u64 + 3, "{d:?}");
    }
}

/// The meta client shares DCI 0 with the VQPs: a READ to a dead meta
/// server moves it to ERR, and the pool's recovery re-posts the other VQPs'
/// flushed WRs, so they see only their own successes.
#[test]
fn a_dead_meta_server_does_not_disturb_the_vqps_sharing_dci_0() {
    const WRS: usize = 64;
    let c = Cluster::new();
    let mem = c.memory_node(WRS * 8);
    let other = c.memory_node(64);
    let client = c.engine(EngineConfig::default().with_pool_size(1));
    let v = client.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    for i in 0..WRS {
        mem.mr.write(i * 8, &(i as u64).to_le_bytes()).unwrap();
    }
    let buf = client.alloc_mr(WRS * 8, Access::LOCAL_WRITE).unwrap();
    c.meta_nic().kill();
    for round in 0..4 {
        // A window in flight on DCI 0 while the meta READ fails on it.
        let mut wrs: Vec<SendWr> = (0..WRS)
            .map(|i| SendWr::read(i as u64, buf.sge(i * 8, 8).unwrap(), mem.mr.remote(i * 8)))
            .collect();
        v.post_send(&mut wrs).unwrap();
        let err = client.resolve(&other.gid()).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::MetaUnavailable {
                    failure: MetaFailure::Completion(WcStatus::RetryExcErr),
                    ..
                }
            ),
            "round {round}: {err}"
        );
        let wcs = wait_wcs(&v, WRS);
        for (i, wc) in wcs.iter().enumerate() {
            assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        }
        let mut got = [0u8; 8];
        buf.read((WRS - 1) * 8, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), WRS as u64 - 1);
    }
    let s = client.stats();
    assert_eq!(s.meta.unavailable, 4);
    assert!(s.dci.recoveries >= 4, "{:?}", s.dci);
    assert_eq!(s.dci.flushed_by_reset, 0, "{:?}", s.dci);
    // The VQP is still connected and the pool works.
    assert_eq!(v.target().unwrap().target.gid, mem.gid());
}
