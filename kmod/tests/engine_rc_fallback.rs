//! RC fallback mode on `sim` devices without DC (`SimConfig { dc: false }`,
//! like Soft-RoCE): the meta table is hosted by an `RcMetaHost`, every node
//! registers its handshake endpoint, and a connect is a lookup plus, on a
//! miss of the engine's pair cache, one RC QP and one handshake.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fallback::Fabric;
use common::{config, counted, wait_wcs, MemNode};
use krcore_kmod::{
    Engine, EngineConfig, EngineError, EngineMode, HandshakeFailure, OwnedMr, Vqp, VqpError,
};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, MemoryRegion, SendWr, WcStatus};

/// READ 8 bytes at `off` of `mem` through `v` (wr_id 1), waited for.
fn read8(v: &Vqp<SimNic>, buf: &OwnedMr<SimNic>, mem: &MemNode, off: usize) -> [u8; 8] {
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mem.mr.remote(off))])
        .unwrap();
    let wc = wait_wcs(v, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    got
}

#[test]
fn a_device_without_dc_runs_in_rc_fallback_and_says_so() {
    let f = Fabric::new();
    let nic = f.nic();
    let (e, d) = counted(&nic, || {
        Engine::start(
            nic.clone(),
            EngineConfig::default()
                .with_meta(f.location)
                .with_ungranted(krcore_kmod::Ungranted::Allow),
        )
        .unwrap()
    });
    assert_eq!(e.mode(), EngineMode::RcFallback);
    let s = e.stats();
    assert_eq!(s.mode, EngineMode::RcFallback);
    assert_eq!(s.dcis, 0, "no DCI pool");
    assert_eq!(s.rc.pairs, 0);
    // The handshake UD QP and the meta client's RC QP; no DCT, no DCI.
    assert_eq!(d.qps_created, 2, "{d:?}");
    // The meta entry names the handshake endpoint.
    let hs = e.handshake_responder().unwrap().target();
    let t = e.local_target().unwrap();
    assert_eq!(
        (t.gid, t.dct_num, t.dc_key),
        (hs.gid, hs.qpn, u64::from(hs.qkey))
    );
    assert!(format!("{e:?}").contains("RcFallback"));
}

#[test]
fn connect_then_read_write_cas_over_the_rc_pair() {
    let f = Fabric::new();
    let mem = f.memory_node(4096);
    let client = f.client();
    let v = client.create_vqp().unwrap();
    assert_eq!(v.physical_qpn(), None, "unbound before connect");

    let (r, d) = counted(client.nic(), || v.connect(mem.engine.gid()));
    r.unwrap();
    // One READ of the meta table (over the meta pair, made on this first
    // lookup: that pairing creates no QP), then one RC QP for the target.
    assert_eq!(d.reads, 1, "{d:?}");
    assert_eq!(d.qps_created, 1, "ONE RC QP for the pair: {d:?}");
    let s = client.stats();
    assert_eq!((s.connect_misses, s.rc.created, s.rc.pairs), (1, 1, 1));
    assert_eq!(s.meta.handshakes, 1);
    assert_eq!(s.handshake.paired, 2, "the meta pair and the data pair");
    assert_eq!(
        mem.engine.stats().handshake.passive_qps,
        1,
        "the target's passive end"
    );

    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mem.mr.write(0, b"rc-fallb").unwrap();
    assert_eq!(&read8(&v, &buf, &mem, 0), b"rc-fallb");

    buf.write(8, b"written!").unwrap();
    v.post_send(&mut [SendWr::write(2, buf.sge(8, 8).unwrap(), mem.mr.remote(64))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    mem.mr.read(64, &mut got).unwrap();
    assert_eq!(&got, b"written!");

    mem.mr.store_u64(128, 41).unwrap();
    let mut cas = [SendWr::cas(
        3,
        buf.sge(16, 8).unwrap(),
        mem.mr.remote(128),
        41,
        42,
    )];
    v.post_send(&mut cas).unwrap();
    assert_eq!(cas[0].wr_id, 3, "the caller's wr_id is given back");
    let wc = wait_wcs(&v, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::Success));
    assert_eq!(buf.load_u64(16).unwrap(), 41, "old value");
    assert_eq!(mem.mr.load_u64(128).unwrap(), 42);
    assert_eq!(client.stats().rc.qp.wrs, 3);
}

#[test]
fn a_second_vqp_to_the_same_target_reuses_the_rc_qp() {
    let f = Fabric::new();
    let mem = f.memory_node(4096);
    let client = f.client();
    let a = client.create_vqp().unwrap();
    a.connect(mem.engine.gid()).unwrap();
    let b = client.create_vqp().unwrap();
    let (r, d) = counted(client.nic(), || b.connect(mem.engine.gid()));
    r.unwrap();
    assert_eq!(d.qps_created, 0, "{d:?}");
    assert_eq!(
        d.network_ops(),
        0,
        "a cache hit and an existing pair: {d:?}"
    );
    assert_eq!(d.state_changes, 0, "{d:?}");
    assert_eq!(a.physical_qpn(), b.physical_qpn(), "one RC QP for both");
    let s = client.stats();
    assert_eq!((s.connect_hits, s.rc.created, s.rc.reused), (1, 1, 1));
    // Both work, each sees only its own completions.
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mem.mr.write(0, b"shared!!").unwrap();
    a.post_send(&mut [SendWr::read(10, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    b.post_send(&mut [SendWr::read(20, buf.sge(8, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&b, 1)[0].wr_id, 20);
    assert_eq!(wait_wcs(&a, 1)[0].wr_id, 10);
    assert_eq!(mem.engine.stats().handshake.passive_qps, 1);
}

#[test]
fn a_node_that_only_connects_runs_no_handshake_thread_until_its_address_is_handed_out() {
    let f = Fabric::new();
    let mem = f.memory_node(4096);
    assert!(
        mem.engine.stats().handshake_thread_running,
        "a registered node answers from its thread"
    );
    // A compute node (`handshake_thread` on, as the SDK sets it) that only
    // connects out: its connect drives its own endpoint, no thread starts.
    let client = f.client();
    let v = client.create_vqp().unwrap();
    v.connect(mem.engine.gid()).unwrap();
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mem.mr.write(0, b"no-threa").unwrap();
    assert_eq!(&read8(&v, &buf, &mem, 0), b"no-threa");
    assert!(!client.stats().handshake_thread_running);

    // Handing its address out starts the thread: a peer then pairs with it
    // while the node itself never calls in.
    let target = client.local_target().unwrap();
    assert!(client.stats().handshake_thread_running);
    f.meta.table().register(target, 0, 1 << 40, 0).unwrap();
    let reader = f.client();
    reader
        .create_vqp()
        .unwrap()
        .connect(client.gid())
        .expect("the client's thread answers");
    assert_eq!(client.stats().handshake.passive_qps, 1, "the peer's pair");
    assert!(!reader.stats().handshake_thread_running);
}

#[test]
fn pairs_are_evicted_least_recently_used_and_rebuilt_on_use() {
    let f = Fabric::new();
    let mems: Vec<MemNode> = (0..3).map(|_| f.memory_node(64)).collect();
    let client = f.engine(config(|c| {
        c.rc_cap = 2;
        c.handshake_thread = true;
    }));
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let vqps: Vec<_> = mems
        .iter()
        .map(|m| {
            m.mr.write(0, &m.engine.gid().0[..8]).unwrap();
            client.create_vqp().unwrap()
        })
        .collect();
    vqps[0].connect(mems[0].engine.gid()).unwrap();
    vqps[1].connect(mems[1].engine.gid()).unwrap();
    // Pair 0 is used after pair 1 was made: pair 1 is the LRU one.
    read8(&vqps[0], &buf, &mems[0], 0);
    let (r, d) = counted(client.nic(), || vqps[2].connect(mems[2].engine.gid()));
    r.unwrap();
    assert_eq!((d.qps_created, d.qps_destroyed), (1, 1), "{d:?}");
    let s = client.stats();
    assert_eq!((s.rc.pairs, s.rc.created, s.rc.evicted), (2, 3, 1));
    // The evicted target was told (a Close, applied by its thread).
    let start = Instant::now();
    while mems[1].engine.stats().handshake.closed == 0 {
        assert!(start.elapsed() < common::WAIT, "no Close at the target");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(mems[1].engine.stats().handshake.passive_qps, 0);
    // Pair 0 still works without a new QP.
    let (got, d) = counted(client.nic(), || read8(&vqps[0], &buf, &mems[0], 0));
    assert_eq!(&got, &mems[0].engine.gid().0[..8]);
    assert_eq!(d.qps_created, 0);
    // VQP 1 lost its pair: its next post builds a new one transparently
    // (evicting pair 2, now the least recently used).
    let (got, d) = counted(client.nic(), || read8(&vqps[1], &buf, &mems[1], 0));
    assert_eq!(&got, &mems[1].engine.gid().0[..8]);
    assert_eq!((d.qps_created, d.qps_destroyed), (1, 1), "{d:?}");
    let s = client.stats();
    assert_eq!((s.rc.pairs, s.rc.created, s.rc.evicted), (2, 4, 2));
    assert_eq!(
        read8(&vqps[0], &buf, &mems[0], 0),
        read8(&vqps[0], &buf, &mems[0], 0)
    );
}

#[test]
fn a_pair_with_wrs_in_flight_is_not_evicted() {
    let f = Fabric::new();
    let (m0, m1) = (f.memory_node(64), f.memory_node(64));
    let client = f.engine(config(|c| {
        c.rc_cap = 1;
        c.handshake_thread = true;
    }));
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let (a, b) = (client.create_vqp().unwrap(), client.create_vqp().unwrap());
    a.connect(m0.engine.gid()).unwrap();
    // An unsignaled WRITE stays in flight until a signaled WR covers it.
    a.post_send(&mut [SendWr::write(1, buf.sge(0, 8).unwrap(), m0.mr.remote(0)).signaled(false)])
        .unwrap();
    assert_eq!(a.outstanding(), 1);
    let err = b.connect(m1.engine.gid()).unwrap_err();
    assert!(matches!(err, EngineError::RcPairsBusy { cap: 1 }), "{err}");
    assert!(b.target().is_none(), "the VQP stays unconnected");
    // A VQP with WRs in flight cannot move to another target either.
    let err = a.connect(m1.engine.gid()).unwrap_err();
    assert!(
        matches!(err, EngineError::VqpBusy { outstanding: 1, .. }),
        "{err}"
    );
    // Once covered by a signaled WR and polled, the pair can go.
    read8(&a, &buf, &m0, 0);
    assert_eq!(a.outstanding(), 0);
    b.connect(m1.engine.gid()).unwrap();
    let s = client.stats();
    assert_eq!((s.rc.busy, s.rc.evicted, s.rc.pairs), (1, 1, 1));
}

#[test]
fn a_dead_target_is_a_typed_error_in_bounded_time_with_nothing_left() {
    let f = Fabric::new();
    let mem = f.memory_node(64);
    let client = f.client();
    // Warm the meta pair and the cache, then kill the target.
    client.resolve(&mem.engine.gid()).unwrap();
    mem.engine.nic().kill();
    let v = client.create_vqp().unwrap();
    let start = Instant::now();
    let (r, d) = counted(client.nic(), || v.connect(mem.engine.gid()));
    let took = start.elapsed();
    match r {
        Err(EngineError::Handshake {
            gid,
            failure: HandshakeFailure::Timeout { attempts, .. },
        }) => {
            assert_eq!(gid, mem.engine.gid());
            assert_eq!(attempts, 5, "the first Request and 4 retries");
        }
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(v.target().is_none() && v.physical_qpn().is_none());
    assert_eq!(d.qps_created, d.qps_destroyed, "no QP leaked: {d:?}");
    let s = client.stats();
    assert_eq!((s.rc.pairs, s.rc.failed, s.handshake.timeouts), (0, 1, 1));
}

#[test]
fn a_target_answers_only_when_progressed() {
    let f = Fabric::new();
    // No handshake thread: the host must call progress().
    let engine = f.engine(config(|c| {
        c.handshake.timeout = Duration::from_millis(5);
        c.handshake.retries = 1;
    }));
    let mr = engine.alloc_mr(64, Access::ALL).unwrap();
    f.meta
        .table()
        .register(engine.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let client = f.client();
    let v = client.create_vqp().unwrap();
    let err = v.connect(engine.gid()).unwrap_err();
    assert!(matches!(err, EngineError::Handshake { .. }), "{err}");
    let stop = Arc::new(AtomicBool::new(false));
    let pump = {
        let (e, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if e.progress().unwrap() == 0 {
                    std::thread::yield_now();
                }
            }
        })
    };
    v.connect(engine.gid()).unwrap();
    stop.store(true, Ordering::Relaxed);
    pump.join().unwrap();
    // The data path needs no CPU at the target.
    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    mr.write(0, b"no cpu!!").unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    // The late Requests of the failed attempt made an end for a QP that is
    // gone; its Close (sent at the timeout) removed it again.
    let hs = engine.stats().handshake;
    assert_eq!((hs.passive_qps, hs.closed), (1, 1), "{hs:?}");
}

#[test]
fn a_dc_registration_is_refused_typed() {
    let f = Fabric::new();
    let ghost = krcore_nic::DcTarget {
        gid: krcore_nic::Gid([9; 16]),
        dct_num: 77,
        dc_key: krcore_kmod::DEFAULT_DC_KEY,
    };
    f.meta.table().register(ghost, 0, 1 << 40, 0).unwrap();
    let client = f.client();
    let err = client.create_vqp().unwrap().connect(ghost.gid).unwrap_err();
    assert!(matches!(err, EngineError::NotAFallbackNode { .. }), "{err}");
}

/// A target whose end of the pair vanished (its responder reclaimed the
/// passive QP for another initiator): the WR in flight fails with
/// `RETRY_EXC_ERR`, the pair is re-handshaken, and the user reconnects.
#[test]
fn a_lost_passive_end_is_rebuilt_by_a_re_handshake() {
    let f = Fabric::new();
    let engine = f.engine(config(|c| {
        c.handshake_thread = true;
        c.handshake.passive_cap = 1;
    }));
    let mr = engine.alloc_mr(64, Access::ALL).unwrap();
    f.meta
        .table()
        .register(engine.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let mem = MemNode { engine, mr };
    let (c1, c2) = (f.client(), f.client());
    let (b1, b2) = (
        c1.alloc_mr(8, Access::LOCAL_WRITE).unwrap(),
        c2.alloc_mr(8, Access::LOCAL_WRITE).unwrap(),
    );
    let v1 = c1.create_vqp().unwrap();
    v1.connect(mem.engine.gid()).unwrap();
    read8(&v1, &b1, &mem, 0);
    // Client 2 takes the target's only passive QP.
    let v2 = c2.create_vqp().unwrap();
    v2.connect(mem.engine.gid()).unwrap();
    read8(&v2, &b2, &mem, 0);
    v1.post_send(&mut [SendWr::read(5, b1.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    let wc = wait_wcs(&v1, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::RetryExcErr));
    assert!(v1.target().is_none(), "a gone target disconnects the VQP");
    let s = c1.stats();
    assert_eq!(s.rc.qp.recoveries, 1, "re-handshaken: {s:?}");
    assert_eq!(s.rc.pairs, 1);
    let err = v1
        .post_send(&mut [SendWr::read(6, b1.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap_err();
    assert!(matches!(err, VqpError::NotConnected { .. }), "{err}");
    v1.connect(mem.engine.gid()).unwrap();
    read8(&v1, &b1, &mem, 0);
}

/// Many threads connecting to one target at once make ONE pair.
#[test]
fn concurrent_connects_to_one_target_make_one_pair() {
    let f = Fabric::new();
    let mem = f.memory_node(64);
    let client = f.client();
    let vqps: Vec<_> = (0..8).map(|_| client.create_vqp().unwrap()).collect();
    std::thread::scope(|s| {
        for v in &vqps {
            s.spawn(|| v.connect(mem.engine.gid()).unwrap());
        }
    });
    let qpn = vqps[0].physical_qpn();
    assert!(qpn.is_some() && vqps.iter().all(|v| v.physical_qpn() == qpn));
    let s = client.stats();
    assert_eq!((s.rc.created, s.rc.reused, s.rc.pairs), (1, 7, 1));
    assert_eq!(mem.engine.stats().handshake.passive_qps, 1);
}

/// Two engines without handshake threads connect to each other at the same
/// time: each answers the other while it waits for its own answer (a
/// blocking connect drives its own endpoint), and afterwards from its host's
/// loop (`progress()`), so neither blocking connect starves the other.
#[test]
fn engines_without_threads_answer_each_other_while_they_wait() {
    let f = Fabric::new();
    let node = || {
        let e = f.engine(EngineConfig::default());
        let mr = e.alloc_mr(64, Access::ALL).unwrap();
        f.meta
            .table()
            .register(e.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        MemNode { engine: e, mr }
    };
    let (a, b) = (node(), node());
    a.mr.write(0, b"node a!!").unwrap();
    b.mr.write(0, b"node b!!").unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let side = |me: &MemNode, peer: &MemNode| {
        let v = me.engine.create_vqp().unwrap();
        v.connect(peer.engine.gid()).unwrap();
        let buf = me.engine.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        let got = read8(&v, &buf, peer, 0);
        done.fetch_add(1, Ordering::SeqCst);
        // The host's loop: keep answering until the peer is connected too.
        let start = Instant::now();
        while done.load(Ordering::SeqCst) < 2 {
            me.engine.progress().unwrap();
            assert!(start.elapsed() < common::WAIT);
        }
        got
    };
    let (got_a, got_b) = std::thread::scope(|s| {
        let ta = s.spawn(|| side(&a, &b));
        let tb = s.spawn(|| side(&b, &a));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_eq!((&got_a, &got_b), (b"node b!!", b"node a!!"));
}

/// Dropping an engine closes its pairs: the target and the meta host free
/// their ends (Close messages, applied by their threads).
#[test]
fn a_dropped_engine_closes_its_pairs() {
    let f = Fabric::new();
    let mem = f.memory_node(64);
    let client = f.client();
    let v = client.create_vqp().unwrap();
    v.connect(mem.engine.gid()).unwrap();
    let meta_ends = f.meta.responder().stats().passive_qps;
    assert_eq!(meta_ends, 1, "the client's meta pair");
    assert_eq!(mem.engine.stats().handshake.passive_qps, 1);
    drop(v);
    drop(client);
    let start = Instant::now();
    while mem.engine.stats().handshake.passive_qps > 0 || f.meta.responder().stats().passive_qps > 0
    {
        assert!(start.elapsed() < common::WAIT, "ends still alive");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(mem.engine.stats().handshake.closed, 1);
}

/// A meta host that dies is a typed, bounded failure; cached targets and
/// existing pairs keep working.
#[test]
fn a_dead_meta_host_is_typed_and_bounded() {
    let f = Fabric::new();
    let (mem, other) = (f.memory_node(64), f.memory_node(64));
    let client = f.client();
    let v = client.create_vqp().unwrap();
    v.connect(mem.engine.gid()).unwrap();
    f.meta_nic.kill();
    let start = Instant::now();
    let err = client
        .create_vqp()
        .unwrap()
        .connect(other.engine.gid())
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    match err {
        EngineError::MetaUnavailable { gid, failure } => {
            assert_eq!(gid, other.engine.gid());
            assert!(
                matches!(
                    failure,
                    krcore_kmod::MetaFailure::Completion(WcStatus::RetryExcErr)
                ),
                "{failure}"
            );
        }
        e => panic!("expected MetaUnavailable, got {e:?}"),
    }
    // The next lookup re-pairs with the meta node first: a handshake timeout.
    let err = client
        .create_vqp()
        .unwrap()
        .connect(other.engine.gid())
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::MetaUnavailable {
                failure: krcore_kmod::MetaFailure::Handshake(HandshakeFailure::Timeout { .. }),
                ..
            }
        ),
        "{err}"
    );
    // The cached target and its pair are untouched.
    let w = client.create_vqp().unwrap();
    let (r, d) = counted(client.nic(), || w.connect(mem.engine.gid()));
    r.unwrap();
    assert_eq!(d.network_ops(), 0);
    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    read8(&w, &buf, &mem, 0);
}

/// RC fallback with the meta table hosted by an engine ([`MsgMetaHost`]):
/// the first handshake to the meta node stays on UD (it builds the pair),
/// then Register/Renew/Deregister travel as messages on `META_PORT` over
/// that pair, and lookups are READs of the table through an RC pair.
#[test]
fn registration_travels_as_messages_over_the_rc_pair() {
    use krcore_kmod::{MsgMetaHost, META_PORT};
    use krcore_meta::table::Geometry;
    use krcore_meta::MetaConfig;
    let f = Fabric::new();
    let host_engine =
        Engine::start(f.nic(), EngineConfig::default().with_handshake_thread(true)).unwrap();
    assert_eq!(host_engine.mode(), EngineMode::RcFallback);
    let host = Arc::new(
        MsgMetaHost::start(
            &host_engine,
            MetaConfig {
                geometry: Geometry::with_buckets(64).unwrap(),
                lease_sweep_ms: 0,
                ..MetaConfig::default()
            },
        )
        .unwrap(),
    );
    let _serving = host.spawn(Duration::from_micros(50)).unwrap();
    let on_host = |cfg: EngineConfig| {
        Engine::start(
            f.nic(),
            cfg.with_handshake_thread(true)
                .with_meta(host.location().unwrap())
                .with_ungranted(krcore_kmod::Ungranted::Allow),
        )
        .unwrap()
    };
    let mem = on_host(EngineConfig::default());
    let mr = mem.alloc_mr(64, Access::ALL).unwrap();
    mr.store_u64(0, 41).unwrap();
    let t = mem.local_target().unwrap();
    let lease = mem.meta_register(t, 0, 60_000).unwrap();
    assert_eq!(host.stats().requests, 1);
    let ms = host_engine.msg_stats();
    assert!(ms.granted >= 1 && ms.inline_delivered >= 1, "{ms:?}");
    assert_eq!(u32::from(META_PORT), host.bootstrap().rpc_qpn);
    // A reader finds it by one READ over its RC pair to the meta node.
    let client = on_host(EngineConfig::default());
    let entry = client.resolve(&mem.gid()).unwrap();
    assert_eq!((entry.target, entry.epoch), (t, lease.epoch));
    assert_eq!(client.stats().meta.reads, 1);
    let v = client.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::faa(1, buf.sge(0, 8).unwrap(), mr.remote(0), 1)])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    assert_eq!(mr.load_u64(0).unwrap(), 42);
    // Renew and deregister, as messages too.
    assert_eq!(mem.meta_renew(&t).unwrap().epoch, lease.epoch);
    mem.meta_deregister(&t).unwrap();
    assert_eq!(host.stats().requests, 3);
    client.invalidate(&mem.gid());
    assert!(matches!(
        client.resolve(&mem.gid()),
        Err(EngineError::UnknownNode { .. })
    ));
    // The host's engine reads its own table through a pair with itself.
    let kept = mem
        .meta_keep_registered(&[t], 0, Duration::from_secs(30))
        .unwrap();
    host_engine.invalidate(&mem.gid());
    assert_eq!(host_engine.resolve(&mem.gid()).unwrap().target, t);
    kept.deregister().unwrap();
}

/// A peer that restarts on its GID (a new process at the same address:
/// new QPs, a new handshake endpoint) makes this node's pair to it stale:
/// what is sent over it goes to a QP that no longer exists, dropped until
/// the retries run out. The peer's first handshake (from its new endpoint)
/// tells: the node closes the stale pair and drops the cached address, and
/// its VQP's next post runs over a new pair. A handshake from the endpoint
/// the pair was made with closes nothing.
#[test]
fn a_peer_that_restarted_on_its_gid_gets_its_stale_pair_closed() {
    use krcore_kmod::handshake::{HandshakeMessage, HandshakeRepr};
    use krcore_nic::{Nic, UdTarget};
    let f = Fabric::new();
    let a = f.memory_node(64);
    let b = f.memory_node(64);
    b.mr.write(0, b"peer b!!").unwrap();
    let buf = a.engine.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    // A's pair to B, made with B's handshake endpoint.
    let v = a.engine.create_vqp().unwrap();
    v.connect(b.engine.gid()).unwrap();
    assert_eq!(&read8(&v, &buf, &b, 0), b"peer b!!");
    // B connects to A (its own endpoint): A's pair to B stays.
    let vb = b.engine.create_vqp().unwrap();
    vb.connect(a.engine.gid()).unwrap();
    let bbuf = b.engine.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    read8(&vb, &bbuf, &a, 0);
    a.engine.progress().unwrap();
    let s = a.engine.stats().rc;
    assert_eq!((s.pairs, s.created, s.restarted), (1, 1, 0), "{s:?}");
    // "B restarted": a Request naming B's GID from another UD endpoint.
    let other = f.nic();
    let pd = other.alloc_pd().unwrap();
    // (Its second UD QP: a NIC gives a new process's QPs other numbers
    // than the old one's, and a fresh sim node would start where B did.)
    let _first = krcore_meta::ud::UdEndpoint::new(&other, &pd, 0x1234, 4, 4).unwrap();
    let mut ud = krcore_meta::ud::UdEndpoint::new(&other, &pd, 0x1234, 4, 4).unwrap();
    let t = a.engine.local_target().unwrap();
    let request = HandshakeRepr {
        nonce: 77,
        message: HandshakeMessage::Request {
            gid: b.engine.gid(),
            qpn: 0x4242,
            reply_qkey: 0x1234,
        },
    }
    .emit();
    let to = UdTarget {
        gid: t.gid,
        qpn: t.dct_num,
        qkey: u32::try_from(t.dc_key).unwrap(),
    };
    assert!(ud.send_bytes(to, &request).unwrap());
    let t0 = Instant::now();
    while a.engine.stats().rc.restarted == 0 && t0.elapsed() < Duration::from_secs(10) {
        a.engine.progress().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = a.engine.stats().rc;
    assert_eq!(
        (s.pairs, s.restarted),
        (0, 1),
        "the stale pair is closed: {s:?}"
    );
    // The VQP's next post: a new pair (B's real endpoint, read again from
    // the meta table: the cached address was dropped).
    let misses = a.engine.stats().connect_misses;
    assert_eq!(&read8(&v, &buf, &b, 0), b"peer b!!");
    let st = a.engine.stats();
    assert_eq!((st.rc.pairs, st.rc.created), (1, 2), "{:?}", st.rc);
    assert_eq!(
        st.connect_misses,
        misses + 1,
        "the address was looked up again"
    );
}
