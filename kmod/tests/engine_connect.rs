//! connect: DCCache hits cost nothing, a miss costs exactly one READ of the
//! meta table, and every failure is typed and bounded.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, counted, wait_wcs, Cluster};
use krcore_kmod::{Engine, EngineConfig, EngineError, EngineMode, MetaFailure, VqpError};
use krcore_nic::sim::{SimConfig, SimNic};
use krcore_nic::{Access, DcTarget, Gid, MemoryRegion, Nic, SendWr, WcStatus};

/// A device without DC no longer refuses the engine: it runs in RC
/// fallback mode (tests/engine_rc_fallback.rs covers that mode), and a DC
/// device still runs KRCore proper.
#[test]
fn the_mode_follows_the_device() {
    let c = Cluster::new();
    let nic = SimNic::open(
        &c.fabric,
        SimConfig {
            dc: false,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let e = Engine::start(nic, EngineConfig::default()).unwrap();
    assert_eq!(e.mode(), EngineMode::RcFallback);
    assert_eq!(e.stats().mode, EngineMode::RcFallback);
    let dc = c.engine(EngineConfig::default());
    assert_eq!(dc.mode(), EngineMode::Dc);
    assert_eq!(dc.stats().mode, EngineMode::Dc);
    assert_eq!(dc.progress().unwrap(), 0, "nothing to progress in DC mode");
    assert!(dc.handshake_responder().is_none());
}

#[test]
fn a_miss_reads_once_and_a_hit_costs_nothing() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let client = c.engine(EngineConfig::default());
    let (a, b) = (client.create_vqp().unwrap(), client.create_vqp().unwrap());

    let (r, d) = counted(client.nic(), || a.connect(mem.gid()));
    r.unwrap();
    assert_eq!(d.reads, 1, "a miss is ONE READ of the table: {d:?}");
    assert_eq!(d.network_ops(), 1, "{d:?}");
    assert_eq!(d.qps_created, 0, "a miss creates no QP: {d:?}");
    assert_eq!(
        a.target().unwrap().target,
        mem.engine.local_target().unwrap()
    );

    let (r, d) = counted(client.nic(), || b.connect(mem.gid()));
    r.unwrap();
    assert_eq!(d.qps_created, 0, "{d:?}");
    assert_eq!(d.network_ops(), 0, "a hit does no network op: {d:?}");
    assert_eq!(d.doorbells, 0, "{d:?}");
    assert_eq!(d.state_changes, 0, "{d:?}");

    let s = client.stats();
    assert_eq!((s.connect_misses, s.connect_hits), (1, 1));
    assert_eq!(s.meta.reads, 1);

    // The connection works: a READ through the shared DCI.
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mem.mr.write(0, b"krcore!!").unwrap();
    b.post_send(&mut [SendWr::read(7, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    let wc = wait_wcs(&b, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"krcore!!");
}

#[test]
fn an_unknown_gid_is_typed() {
    let c = Cluster::new();
    let client = c.engine(EngineConfig::default());
    let v = client.create_vqp().unwrap();
    let ghost = Gid([0x5a; 16]);
    let (r, d) = counted(client.nic(), || v.connect(ghost));
    match r {
        Err(EngineError::UnknownNode { gid }) => assert_eq!(gid, ghost),
        other => panic!("expected UnknownNode, got {other:?}"),
    }
    assert_eq!(d.reads, 1, "{d:?}");
    assert!(v.target().is_none());
    let err = v
        .post_send(&mut [SendWr::read(1, Default::default(), Default::default())])
        .unwrap_err();
    assert!(matches!(err, VqpError::NotConnected { .. }), "{err}");
}

#[test]
fn no_meta_server_and_no_cache_entry_is_typed() {
    let c = Cluster::new();
    let e = Engine::start(c.nic(), EngineConfig::default()).unwrap();
    let err = e.resolve(&Gid([1; 16])).unwrap_err();
    assert!(matches!(err, EngineError::NoMetaServer { .. }), "{err}");
}

#[test]
fn a_dead_meta_server_is_typed_and_bounded() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let client = c.engine(EngineConfig::default());
    let v = client.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    let other = c.memory_node(64);

    c.meta_nic().kill();
    let start = Instant::now();
    let err = client
        .create_vqp()
        .unwrap()
        .connect(other.gid())
        .unwrap_err();
    let took = start.elapsed();
    match err {
        EngineError::MetaUnavailable { gid, failure } => {
            assert_eq!(gid, other.gid());
            assert_eq!(failure, MetaFailure::Completion(WcStatus::RetryExcErr));
        }
        e => panic!("expected MetaUnavailable, got {e:?}"),
    }
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(client.stats().meta.unavailable, 1);

    // The meta DCI was re-armed and the data path never noticed: cached
    // targets still connect and work.
    let w = client.create_vqp().unwrap();
    let (r, d) = counted(client.nic(), || w.connect(mem.gid()));
    r.unwrap();
    assert_eq!(d.network_ops(), 0);
    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    w.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&w, 1)[0].status, WcStatus::Success);
    // And a second lookup fails the same way (the meta DCI is usable).
    let err = w.connect(other.gid()).unwrap_err();
    assert!(matches!(err, EngineError::MetaUnavailable { .. }), "{err}");
}

/// Opens the entry's seqlock (both version copies odd), as a writer in the
/// middle of a rewrite leaves it.
fn open_entry(c: &Cluster, gid: &Gid) -> (usize, u64) {
    let (mr, off) = c.entry(gid);
    let v = mr.load_u64(off).unwrap();
    mr.store_u64(off, v + 1).unwrap();
    mr.store_u64(off + 56, v + 1).unwrap();
    (off, v)
}

fn close_entry(c: &Cluster, (off, v): (usize, u64)) {
    let mr = c.meta.lock().table_mr().clone();
    mr.store_u64(off + 56, v).unwrap();
    mr.store_u64(off, v).unwrap();
}

#[test]
fn a_torn_entry_is_retried_until_the_writer_is_done() {
    let c = Arc::new(Cluster::new());
    let mem = c.memory_node(64);
    let gid = mem.gid();
    let client = c.engine(config(|c| c.meta_retries = 10_000));
    let v = client.create_vqp().unwrap();
    let opened = open_entry(&c, &gid);
    let writer = {
        let c = c.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            close_entry(&c, opened);
        })
    };
    let (r, d) = counted(client.nic(), || v.connect(gid));
    writer.join().unwrap();
    r.unwrap();
    let s = client.stats().meta;
    assert!(s.torn_retries >= 1, "{s:?}");
    assert_eq!(d.reads, s.reads, "one READ per attempt");
    assert_eq!(s.reads, s.torn_retries + 1);
    assert_eq!(
        v.target().unwrap().target,
        mem.engine.local_target().unwrap()
    );
}

#[test]
fn an_entry_torn_for_good_is_typed_after_the_retry_budget() {
    let c = Cluster::new();
    let mem = c.memory_node(64);
    let client = c.engine(config(|c| c.meta_retries = 3));
    open_entry(&c, &mem.gid());
    let (r, d) = counted(client.nic(), || client.resolve(&mem.gid()));
    match r {
        Err(EngineError::MetaInconsistent { attempts, last, .. }) => {
            assert_eq!(attempts, 4);
            assert!(last.is_retryable(), "{last}");
        }
        other => panic!("expected MetaInconsistent, got {other:?}"),
    }
    assert_eq!(d.reads, 4);
    assert!(client.cache().get(&mem.gid()).is_none());
}

/// A writer re-registers the node in a loop with alternating metadata;
/// every lookup must return one registration whole, never a mix.
#[test]
fn concurrent_rewrites_never_yield_a_mixed_entry() {
    let c = Arc::new(Cluster::new());
    let gid = c.nic().gid();
    let target = move |i: u32| DcTarget {
        gid,
        dct_num: 1000 + i,
        dc_key: 0xabc0_0000 + u64::from(i),
    };
    c.register(target(0), 1 << 40, 0).unwrap();
    let client = c.engine(config(|c| {
        c.meta_retries = 100_000;
        c.meta_backoff = Duration::ZERO;
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                c.register(target(i % 2), 1 << 40, 0).unwrap();
            }
            i
        })
    };
    let mut last_epoch = 0;
    for _ in 0..500 {
        client.invalidate(&gid);
        let t = client.resolve(&gid).unwrap();
        let i = t.target.dct_num - 1000;
        assert!(i < 2, "{t:?}");
        assert_eq!(t.target, target(i), "a mixed entry");
        assert!(t.epoch >= last_epoch, "epochs go backwards: {t:?}");
        last_epoch = t.epoch;
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    let s = client.stats().meta;
    eprintln!(
        "{writes} rewrites, {} READs, {} torn retries",
        s.reads, s.torn_retries
    );
}

#[test]
fn an_expired_lease_is_unknown_once_the_cache_entry_is_invalidated() {
    let c = Cluster::new();
    let mem = c.memory_node(64);
    let client = c.engine(EngineConfig::default());
    let v = client.create_vqp().unwrap();
    // A node with a short lease.
    let short = c.engine(EngineConfig::default().with_pool_size(1));
    c.register(short.local_target().unwrap(), 100, 0).unwrap();
    v.connect(short.gid()).unwrap();
    assert_eq!(c.sweep(1_000), vec![short.gid()]);
    // Cached: still resolves without the network (KRCore caches until told).
    let (r, d) = counted(client.nic(), || v.connect(short.gid()));
    r.unwrap();
    assert_eq!(d.network_ops(), 0);
    // After invalidation the lookup sees the entry is gone.
    assert!(client.invalidate(&short.gid()));
    let err = v.connect(short.gid()).unwrap_err();
    assert!(matches!(err, EngineError::UnknownNode { .. }), "{err}");
    assert!(
        v.target().is_some(),
        "a failed connect keeps the old target"
    );

    // The same through the data path: the node dies, its lease is swept; a
    // WR to it fails with RETRY_EXC_ERR, which invalidates the entry and
    // disconnects the VQP; connecting again reports the node unknown.
    v.connect(mem.gid()).unwrap();
    c.deregister(&mem.gid()).unwrap();
    mem.engine.nic().kill();
    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(5, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    let wc = wait_wcs(&v, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::RetryExcErr));
    assert!(v.target().is_none());
    assert!(client.cache().get(&mem.gid()).is_none());
    let err = v
        .post_send(&mut [SendWr::read(6, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap_err();
    assert!(matches!(err, VqpError::NotConnected { .. }), "{err}");
    let err = v.connect(mem.gid()).unwrap_err();
    assert!(matches!(err, EngineError::UnknownNode { .. }), "{err}");
    // The DCI was recovered: the pool keeps working.
    assert_eq!(client.stats().dci.recoveries, 1);
    let w = client.create_vqp().unwrap();
    let alive = c.memory_node(64);
    w.connect(alive.gid()).unwrap();
    w.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), alive.mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&w, 1)[0].status, WcStatus::Success);
}

/// A target that restarts gets a new DCT and a new epoch: the first WR to
/// the stale metadata fails, invalidates it, and the next connect picks the
/// new registration up.
#[test]
fn a_restarted_target_is_found_again_with_a_newer_epoch() {
    let c = Cluster::new();
    let nic = c.nic();
    let first = Engine::start(nic.clone(), EngineConfig::default().with_pool_size(1)).unwrap();
    let mr = first.alloc_mr(64, Access::ALL).unwrap();
    let lease1 = c
        .register(first.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    let client = c.engine(EngineConfig::default());
    let v = client.create_vqp().unwrap();
    v.connect(nic.gid()).unwrap();
    assert_eq!(v.target().unwrap().epoch, lease1.epoch);

    // Restart: a new engine (new DCT number) on the same node, re-registered.
    let second = Engine::start(nic.clone(), EngineConfig::default().with_pool_size(1)).unwrap();
    drop(first);
    assert_ne!(second.local_target().unwrap(), v.target().unwrap().target);
    let lease2 = c
        .register(second.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    assert!(lease2.epoch > lease1.epoch);

    let buf = client.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    let wc = wait_wcs(&v, 1);
    assert!(
        matches!(wc[0].status, WcStatus::RetryExcErr | WcStatus::RemAccessErr),
        "{wc:?}"
    );
    assert!(v.target().is_none());
    let (r, d) = counted(client.nic(), || v.connect(nic.gid()));
    r.unwrap();
    assert_eq!(d.reads, 1);
    let t = v.target().unwrap();
    assert_eq!(
        (t.target, t.epoch),
        (second.local_target().unwrap(), lease2.epoch)
    );
    // (The restarted node's memory is registered anew, in its new PD.)
    let mr2 = second.alloc_mr(64, Access::ALL).unwrap();
    v.post_send(&mut [SendWr::read(2, buf.sge(0, 8).unwrap(), mr2.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
}
