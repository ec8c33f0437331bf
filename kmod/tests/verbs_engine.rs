//! The engine on a real verbs device: RC fallback mode on Soft-RoCE (rxe
//! has no DC), end to end: a fallback meta host, a memory node and a client,
//! each its own device context (one guest is one port: every context has
//! the same GID, and the handshake endpoints tell them apart by QPN).
//!
//! Every test is `#[ignore]`: it needs a device. Build on the host, run in
//! the Soft-RoCE guest:
//!
//! ```text
//! cargo test -p krcore-kmod --features verbs --test verbs_engine --no-run
//! ../shared/softroce/softroce-run -- sh -c \
//!   'KRCORE_TEST_DEVICE=$SOFTROCE_DEV KRCORE_TEST_GID_INDEX=$SOFTROCE_GID_INDEX \
//!    exec target/debug/deps/verbs_engine-HASH --ignored --test-threads=1'
//! ```
//!
//! `KRCORE_TEST_GID_INDEX` defaults to `SOFTROCE_GID_INDEX`, else 0.
#![cfg(feature = "verbs")]

use std::time::{Duration, Instant};

use krcore_kmod::{Engine, EngineConfig, EngineMode, HandshakeConfig, RcMetaHost, Vqp};
use krcore_meta::table::Geometry;
use krcore_meta::MetaConfig;
use krcore_nic::verbs::VerbsNic;
use krcore_nic::{Access, MemoryRegion, Nic, SendWr, Wc, WcStatus};

const WAIT: Duration = Duration::from_secs(30);

fn open() -> VerbsNic {
    let name = std::env::var("KRCORE_TEST_DEVICE").unwrap_or_else(|_| {
        panic!("KRCORE_TEST_DEVICE is not set: name an RDMA device (e.g. rxe0)")
    });
    let idx = std::env::var("KRCORE_TEST_GID_INDEX")
        .or_else(|_| std::env::var("SOFTROCE_GID_INDEX"))
        .ok()
        .map(|s| s.trim().parse::<u8>().expect("a GID index"))
        .unwrap_or(0);
    VerbsNic::open(&name, idx).unwrap_or_else(|e| panic!("open {name} (GID index {idx}): {e}"))
}

/// Handshakes wait longer than on the sim: the guest is emulated (creating
/// and connecting an RC QP takes ~0.6 ms there, and threads are slow).
fn handshake() -> HandshakeConfig {
    let mut h = HandshakeConfig::default();
    h.timeout = Duration::from_millis(500);
    h.retries = 3;
    h
}

fn wait(v: &Vqp<VerbsNic>, n: usize) -> Vec<Wc> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 8];
    while got.len() < n {
        let k = v.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        assert!(
            start.elapsed() < WAIT,
            "{} of {n} completions: {got:?}",
            got.len()
        );
    }
    got
}

#[test]
#[ignore = "needs an RDMA device without DC (Soft-RoCE): set KRCORE_TEST_DEVICE"]
fn connect_read_cas_through_the_engine_in_rc_fallback() {
    let meta = RcMetaHost::start(
        open(),
        MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            ..MetaConfig::default()
        },
        handshake(),
    )
    .expect("meta host");
    let _meta_thread = meta.spawn_progress().unwrap();
    // (Raw rkeys: the grant rule's opt-out; the NIC judges them.)
    let mut cfg = EngineConfig::default()
        .with_meta(meta.location().unwrap())
        .with_handshake_thread(true)
        .with_ungranted(krcore_kmod::Ungranted::Allow)
        // Server and client on one port (loopback): the port's lock would
        // refuse the second engine.
        .with_port_lock(false);
    cfg.handshake = handshake();

    let server = Engine::start(open(), cfg.clone()).expect("server engine");
    assert_eq!(server.mode(), EngineMode::RcFallback, "rxe has no DC");
    let region = server.alloc_mr(4096, Access::ALL).unwrap();
    meta.table()
        .register(server.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();

    let client = Engine::start(open(), cfg).expect("client engine");
    assert_eq!(client.stats().mode, EngineMode::RcFallback);
    let v = client.create_vqp().unwrap();
    let before = client.nic().counters();
    v.connect(server.gid()).expect("connect");
    let d = client.nic().counters() - before;
    assert_eq!(d.reads, 1, "one READ of the meta table: {d:?}");
    assert_eq!(d.qps_created, 1, "one RC QP for the pair: {d:?}");

    // READ.
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    region.write(0, b"soft-roce rc").unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 12).unwrap(), region.remote(0))])
        .unwrap();
    let wc = wait(&v, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (1, WcStatus::Success),
        "{wc:?}"
    );
    let mut got = [0u8; 12];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"soft-roce rc");

    // CAS.
    region.store_u64(64, 7).unwrap();
    v.post_send(&mut [SendWr::cas(
        2,
        buf.sge(16, 8).unwrap(),
        region.remote(64),
        7,
        8,
    )])
    .unwrap();
    let wc = wait(&v, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (2, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(buf.load_u64(16).unwrap(), 7);
    assert_eq!(region.load_u64(64).unwrap(), 8);

    // A second VQP shares the pair: no QP, no network.
    let w = client.create_vqp().unwrap();
    let before = client.nic().counters();
    w.connect(server.gid()).unwrap();
    let d = client.nic().counters() - before;
    assert_eq!((d.qps_created, d.network_ops()), (0, 0), "{d:?}");
    assert_eq!(w.physical_qpn(), v.physical_qpn());
    w.post_send(&mut [SendWr::faa(
        3,
        buf.sge(24, 8).unwrap(),
        region.remote(64),
        1,
    )])
    .unwrap();
    let wc = wait(&w, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (3, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(region.load_u64(64).unwrap(), 9);
    let s = client.stats();
    assert_eq!((s.rc.pairs, s.rc.created, s.rc.reused), (1, 1, 1), "{s:?}");
    eprintln!("verbs engine: {s:?}");
}

/// On rxe a remote access error moves the target's end of the pair to ERR
/// too: the engine's recovery re-handshakes the pair (the target re-arms
/// its end), so innocent VQPs keep working on the same QP.
#[test]
#[ignore = "needs an RDMA device without DC (Soft-RoCE): set KRCORE_TEST_DEVICE"]
fn a_remote_error_is_recovered_by_a_re_handshake() {
    let meta = RcMetaHost::start(
        open(),
        MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            ..MetaConfig::default()
        },
        handshake(),
    )
    .expect("meta host");
    let _meta_thread = meta.spawn_progress().unwrap();
    // (Raw rkeys: the grant rule's opt-out; the NIC judges them.)
    let mut cfg = EngineConfig::default()
        .with_meta(meta.location().unwrap())
        .with_handshake_thread(true)
        .with_ungranted(krcore_kmod::Ungranted::Allow)
        // Server and client on one port (loopback): the port's lock would
        // refuse the second engine.
        .with_port_lock(false);
    cfg.handshake = handshake();
    let server = Engine::start(open(), cfg.clone()).unwrap();
    let region = server.alloc_mr(4096, Access::ALL).unwrap();
    meta.table()
        .register(server.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let client = Engine::start(open(), cfg).unwrap();
    let (bad, good) = (client.create_vqp().unwrap(), client.create_vqp().unwrap());
    bad.connect(server.gid()).unwrap();
    good.connect(server.gid()).unwrap();
    let buf = client.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    // A stale rkey: no grant is known, so only the target can refuse it.
    let mut wrong = region.remote(0);
    wrong.rkey ^= 0x005a_5a00;
    bad.post_send(&mut [SendWr::read(9, buf.sge(0, 8).unwrap(), wrong)])
        .unwrap();
    let wc = wait(&bad, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (9, WcStatus::RemAccessErr),
        "{wc:?}"
    );
    assert!(
        bad.target().is_none(),
        "a refusing target disconnects the VQP"
    );
    // The innocent VQP's next READ goes through the re-armed pair.
    region.write(0, b"re-armed").unwrap();
    good.post_send(&mut [SendWr::read(1, buf.sge(8, 8).unwrap(), region.remote(0))])
        .unwrap();
    let wc = wait(&good, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (1, WcStatus::Success),
        "{wc:?}"
    );
    let mut got = [0u8; 8];
    buf.read(8, &mut got).unwrap();
    assert_eq!(&got, b"re-armed");
    let s = client.stats();
    assert_eq!((s.rc.created, s.rc.qp.recoveries), (1, 1), "{s:?}");
    assert_eq!(server.stats().handshake.rearmed, 1);
    eprintln!("verbs engine recovery: {:?}", s.rc);
}
