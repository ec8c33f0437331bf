//! The meta server host on `sim:mem`: requests over UD, lookups by one READ,
//! leases and sweeps on a deterministic clock, failures as typed errors.

mod common;

use common::*;
use krcore_meta::client::LookupError;
use krcore_meta::engine::Lease;
use krcore_meta::table::Geometry;
use krcore_meta::wire::{ErrorCode, Message, Repr};
use krcore_meta::{MetaConfig, MetaError, MetaRpc, MetaServer, RpcConfig};
use krcore_nic::conformance::{poll_one, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{
    Access, Destination, MemoryRegion, Nic, QpCaps, QpType, QueuePair, RecvWr, SendWr, Transition,
    WcStatus, GRH_LEN,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

struct Setup {
    fabric: SimFabric,
    server: MetaServer<SimNic>,
    client: SimNic,
    rpc: MetaRpc<SimNic>,
    reader: Reader,
}

fn setup_with(cfg: MetaConfig, rpc_cfg: RpcConfig) -> Setup {
    let fabric = SimFabric::in_memory();
    let server =
        MetaServer::start(SimNic::open(&fabric, SimConfig::default()).unwrap(), cfg).unwrap();
    let client = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let rpc = MetaRpc::new(&client, &server.bootstrap(), rpc_cfg).unwrap();
    let reader = Reader::new(&client);
    Setup {
        fabric,
        server,
        client,
        rpc,
        reader,
    }
}

fn setup() -> Setup {
    setup_with(config(), RpcConfig::default())
}

#[test]
fn register_then_lookup_by_one_read() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 0x77);
    let rpc = &mut s.rpc;
    let lease = drive(&mut s.server, 1_000, || rpc.register(me, 3, 500)).unwrap();
    assert_eq!(
        lease,
        Lease {
            epoch: 1,
            lease_expiry_ms: 1_500
        }
    );

    let before = s.client.counters();
    let served_before = s.server.stats();
    let e = s.reader.once(&b, &me.gid).unwrap().expect("registered");
    let d = s.client.counters() - before;
    assert_eq!(d.reads, 1, "one READ per lookup: {d:?}");
    assert_eq!(d.network_ops(), 1, "{d:?}");
    assert_eq!(d.bytes_read, b.geometry().unwrap().bucket_len() as u64);
    assert_eq!(d.qps_created, 0);
    assert_eq!(s.server.stats(), served_before, "no server CPU for a READ");
    assert_eq!(e.dc_target(), me);
    assert_eq!((e.lid, e.epoch, e.lease_expiry_ms), (3, 1, 1_500));

    // A GID nobody registered: every slot stable, no match.
    assert_eq!(s.reader.once(&b, &fake_gid(9)).unwrap(), None);
    let st = s.server.stats();
    assert_eq!((st.requests, st.replies, st.dropped), (1, 1, 0));
    assert_eq!(s.server.table().memory().faults(), 0);
}

#[test]
fn renew_extends_the_lease() {
    // Sweeps only when the test says so (and once at the first step).
    let cfg = MetaConfig {
        lease_sweep_ms: u64::MAX,
        ..config()
    };
    let mut s = setup_with(cfg, RpcConfig::default());
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 1);
    let rpc = &mut s.rpc;
    drive(&mut s.server, 1_000, || rpc.register(me, 0, 100)).unwrap();
    let rpc = &mut s.rpc;
    let l = drive(&mut s.server, 1_050, || rpc.renew(&me.gid)).unwrap();
    assert_eq!(
        l,
        Lease {
            epoch: 1,
            lease_expiry_ms: 1_150
        }
    );
    assert_eq!(s.reader.lookup(&b, &me.gid).unwrap().lease_expiry_ms, 1_150);
    // A sweep after the first lease would have ended keeps it.
    assert_eq!(s.server.sweep(1_120), 0);
    assert!(s.reader.lookup(&b, &me.gid).is_some());
    // Too late: refused (the entry stays until a sweep removes it).
    let rpc = &mut s.rpc;
    let e = drive(&mut s.server, 1_300, || rpc.renew(&me.gid)).unwrap_err();
    assert_eq!(e.refused_code(), Some(ErrorCode::LeaseExpired), "{e}");
    assert!(s.reader.lookup(&b, &me.gid).is_some());
    assert_eq!(s.server.sweep(1_300), 1);
    assert_eq!(s.reader.lookup(&b, &me.gid), None);
    let rpc = &mut s.rpc;
    let e = drive(&mut s.server, 1_301, || rpc.renew(&me.gid)).unwrap_err();
    assert_eq!(e.refused_code(), Some(ErrorCode::NotRegistered), "{e}");
}

#[test]
fn deregister_removes() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 2);
    let rpc = &mut s.rpc;
    let lease = drive(&mut s.server, 0, || rpc.register(me, 0, 1_000)).unwrap();
    assert!(s.reader.lookup(&b, &me.gid).is_some());
    let rpc = &mut s.rpc;
    assert_eq!(
        drive(&mut s.server, 10, || rpc.deregister(&me.gid)).unwrap(),
        lease
    );
    assert_eq!(s.reader.lookup(&b, &me.gid), None);
    let rpc = &mut s.rpc;
    match drive(&mut s.server, 20, || rpc.deregister(&me.gid)) {
        Err(MetaError::Refused {
            code: ErrorCode::NotRegistered,
            attempts: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn expired_lease_is_swept_then_lookup_finds_nothing() {
    let cfg = MetaConfig {
        lease_sweep_ms: 100,
        ..config()
    };
    let mut s = setup_with(cfg, RpcConfig::default());
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 3);
    // The first step sweeps (nothing) and schedules the next sweep at 1100.
    let rpc = &mut s.rpc;
    drive(&mut s.server, 1_000, || rpc.register(me, 0, 10)).unwrap();
    // Expired at 1010, but no sweep is due yet: still in the table.
    s.server.poll_once(1_050).unwrap();
    assert!(s.reader.lookup(&b, &me.gid).is_some());
    assert_eq!(s.server.stats().swept, 0);
    s.server.poll_once(1_100).unwrap();
    assert_eq!(s.server.stats().swept, 1);
    assert_eq!(s.reader.lookup(&b, &me.gid), None);
    assert!(s.server.table().is_empty());
}

#[test]
fn reregistration_bumps_the_epoch() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let gid = s.client.gid();
    let rpc = &mut s.rpc;
    let l1 = drive(&mut s.server, 0, || rpc.register(target(gid, 10), 1, 1_000)).unwrap();
    let rpc = &mut s.rpc;
    let l2 = drive(&mut s.server, 5, || rpc.register(target(gid, 11), 2, 1_000)).unwrap();
    assert!(l2.epoch > l1.epoch, "{l1:?} -> {l2:?}");
    let e = s.reader.lookup(&b, &gid).unwrap();
    assert_eq!((e.dct_num, e.lid, e.epoch), (11, 2, l2.epoch));
    assert_eq!(s.server.table().len(), 1, "same slot, not a second entry");
}

#[test]
fn bucket_full_is_a_typed_refusal() {
    let cfg = MetaConfig {
        geometry: Geometry::new(1, 2).unwrap(),
        ..config()
    };
    let mut s = setup_with(cfg, RpcConfig::default());
    let b = s.server.bootstrap();
    for n in 0..2 {
        let rpc = &mut s.rpc;
        drive(&mut s.server, 0, || {
            rpc.register(target(fake_gid(n), 1), 0, 100)
        })
        .unwrap();
    }
    let rpc = &mut s.rpc;
    let e = drive(&mut s.server, 0, || {
        rpc.register(target(fake_gid(2), 1), 0, 100)
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::Refused {
                op: "register",
                code: ErrorCode::BucketFull,
                attempts: 1
            }
        ),
        "{e}"
    );
    assert_eq!(s.reader.lookup(&b, &fake_gid(2)), None);
    assert!(s.reader.lookup(&b, &fake_gid(1)).is_some());
}

#[test]
fn garbage_requests_are_dropped_and_counted() {
    let mut s = setup();
    let b = s.server.bootstrap();
    // A raw UD QP on the client node, with the server's qkey.
    let side = Side::with_access(&s.client, 4096, Access::LOCAL_WRITE);
    let qp = side.qp(QpType::Ud, QpCaps::default(), None, 0);
    qp.modify(Transition::Init {
        access: Access::NONE,
        qkey: b.rpc_qkey,
    })
    .unwrap();
    qp.modify(Transition::Rtr { peer: None }).unwrap();
    qp.modify(Transition::Rts {
        rnr_retry: 0,
        retry_cnt: 0,
    })
    .unwrap();
    qp.post_recv(&[RecvWr::new(100, side.mr.sge(2048, 1024).unwrap())])
        .unwrap();
    let to = Destination::Ud(b.rpc_target());
    let send = |wr_id: u64, bytes: &[u8]| {
        side.mr.write(0, bytes).unwrap();
        let len = bytes.len() as u32;
        qp.post_send(&[SendWr::send(wr_id, side.mr.sge(0, len).unwrap(), None).to(to)])
            .unwrap();
        assert_eq!(poll_one(&side.cq).status, WcStatus::Success);
    };
    send(1, b"");
    send(2, b"hi");
    send(3, &[0xa5; 200]); // no magic
    let mut bad_type = Repr {
        request_id: 42,
        message: Message::BootstrapRequest,
    }
    .to_bytes();
    bad_type[5] = 0x7e;
    send(4, &bad_type);
    let mut too_big = vec![0u8; 1000]; // longer than a receive buffer
    too_big[..bad_type.len()].copy_from_slice(&bad_type);
    send(5, &too_big);
    let start = Instant::now();
    while s.server.stats().dropped + s.server.stats().requests + s.server.stats().nic_errors < 5 {
        s.server.poll_once(0).unwrap();
        assert!(start.elapsed() < WAIT);
    }
    let st = s.server.stats();
    assert_eq!(
        (st.dropped, st.requests, st.malformed, st.nic_errors),
        (3, 1, 1, 1),
        "{st:?}"
    );
    // The malformed meta message got an Err reply with its request id.
    let wc = poll_one(&side.cq);
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success));
    let mut reply = vec![0u8; wc.byte_len as usize];
    side.mr.read(2048, &mut reply).unwrap();
    assert_eq!(
        Repr::parse_bytes(&reply[GRH_LEN..]).unwrap(),
        Repr {
            request_id: 42,
            message: Message::Err(ErrorCode::Malformed)
        }
    );
    // And the server still serves.
    let me = target(s.client.gid(), 5);
    let rpc = &mut s.rpc;
    drive(&mut s.server, 0, || rpc.register(me, 0, 100)).unwrap();
    assert!(s.reader.lookup(&b, &me.gid).is_some());
}

#[test]
fn device_without_dc_is_a_typed_error() {
    let fabric = SimFabric::in_memory();
    let nic = SimNic::open(
        &fabric,
        SimConfig {
            dc: false,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let e = MetaServer::start(nic.clone(), config()).unwrap_err();
    assert!(matches!(e, MetaError::DcUnsupported), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("RC fallback") && msg.contains("not built yet"),
        "{msg}"
    );
    let c = nic.counters();
    assert_eq!(
        (c.qps_created, c.mrs_registered),
        (0, 0),
        "nothing allocated"
    );
}

#[test]
fn bad_slot_counts_are_config_errors() {
    let fabric = SimFabric::in_memory();
    let nic = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let cfg = MetaConfig {
        recv_slots: 0,
        ..config()
    };
    let e = MetaServer::start(nic, cfg).unwrap_err();
    assert!(matches!(e, MetaError::Config(_)), "{e:?}");
}

#[test]
fn concurrent_writer_never_yields_a_mixed_entry() {
    let mut s = setup();
    let b = s.server.bootstrap();
    let gid = s.client.gid();
    // Every field of registration n is derived from n (epoch = 1 + n).
    let reg = |server: &mut MetaServer<SimNic>, n: u32| {
        let lease = server
            .table_mut()
            .register(
                target(gid, n),
                n as u16 ^ 0x5a5a,
                1_000_000 + u64::from(n),
                0,
            )
            .unwrap();
        assert_eq!(lease.epoch, 1 + n);
    };
    reg(&mut s.server, 0);
    let stop = AtomicBool::new(false);
    let server = &mut s.server;
    let (written, reads, torn) = std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                reg(server, n);
                n += 1;
            }
            n
        });
        let (mut reads, mut torn, mut last_epoch) = (0u32, 0u32, 0u32);
        let start = Instant::now();
        while reads < 5_000 && start.elapsed() < Duration::from_secs(10) {
            match s.reader.once(&b, &gid) {
                Ok(Some(e)) => {
                    let n = e.dct_num;
                    assert_eq!(e.gid, gid);
                    assert_eq!(e.dc_key, dc_key_of(n), "mixed entry {e:?}");
                    assert_eq!(e.lid, n as u16 ^ 0x5a5a, "mixed entry {e:?}");
                    assert_eq!(e.epoch, 1 + n, "mixed entry {e:?}");
                    assert_eq!(e.lease_expiry_ms, 1_000_000 + u64::from(n), "{e:?}");
                    assert!(e.epoch >= last_epoch, "epochs go back: {e:?}");
                    last_epoch = e.epoch;
                    reads += 1;
                }
                Err(e) if e.is_torn() => torn += 1,
                other => panic!("neither old, new nor torn: {other:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        (writer.join().unwrap(), reads, torn)
    });
    eprintln!("{written} writes, {reads} clean READs, {torn} torn READs retried");
    assert!(reads >= 1_000, "the reader made progress: {reads}");
    assert!(written > 10, "the writer made progress: {written}");
}

#[test]
fn server_down_times_out_in_bounded_time() {
    let rpc_cfg = RpcConfig {
        timeout: Duration::from_millis(20),
        retries: 2,
        ..RpcConfig::default()
    };
    let Setup {
        fabric: _fabric,
        server,
        client,
        mut rpc,
        reader,
    } = setup_with(config(), rpc_cfg);
    let b = server.bootstrap();
    let me = target(client.gid(), 1);
    // Alive but not serving (nobody polls): requests pile up unanswered.
    let start = Instant::now();
    let e = rpc.register(me, 0, 100).unwrap_err();
    assert!(matches!(e, MetaError::Timeout { attempts: 3, .. }), "{e:?}");
    assert!(start.elapsed() >= Duration::from_millis(60));
    assert!(start.elapsed() < Duration::from_secs(5), "{e}");
    // Gone: datagrams to a dead node vanish, READs fail.
    drop(server);
    let start = Instant::now();
    let e = rpc.renew(&me.gid).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "{e}");
    assert_eq!(rpc.stats().timeouts, 2);
    match reader.once(&b, &me.gid) {
        Err(LookupError::Completion(WcStatus::RetryExcErr)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn late_replies_are_retried_and_discarded() {
    let rpc_cfg = RpcConfig {
        timeout: Duration::from_millis(30),
        retries: 20,
        ..RpcConfig::default()
    };
    let mut s = setup_with(config(), rpc_cfg);
    let b = s.server.bootstrap();
    let me = target(s.client.gid(), 8);
    let rpc = &mut s.rpc;
    let server = &mut s.server;
    let lease = std::thread::scope(|sc| {
        let h = sc.spawn(|| rpc.register(me, 0, 10_000));
        // Do not serve until the client has retried at least twice.
        std::thread::sleep(Duration::from_millis(150));
        let start = Instant::now();
        while !h.is_finished() {
            server.poll_once(0).unwrap();
            assert!(start.elapsed() < WAIT);
        }
        h.join().unwrap().unwrap()
    });
    let st = s.rpc.stats();
    assert!(st.retries >= 2, "{st:?}");
    // Every attempt was applied (each a new epoch); the call took the first
    // reply. The renew sees the current epoch, after discarding the rest.
    let rpc = &mut s.rpc;
    let renewed = drive(&mut s.server, 1, || rpc.renew(&me.gid)).unwrap();
    let st = s.rpc.stats();
    let registers = (st.requests - 1) as u32;
    assert_eq!(
        s.server.stats().requests,
        st.requests,
        "all requests served"
    );
    assert_eq!(st.stale_replies, st.requests - 2, "{st:?}");
    assert_eq!(lease.epoch, 1, "the first attempt's reply");
    assert_eq!(renewed.epoch, registers);
    assert_eq!(s.reader.lookup(&b, &me.gid).unwrap().epoch, registers);
}

#[test]
fn bootstrap_over_rpc_and_spawned_server() {
    let Setup {
        fabric: _fabric,
        server,
        client,
        mut rpc,
        reader,
    } = setup();
    let b = server.bootstrap();
    let handle = server.spawn().unwrap();
    assert!(handle.is_running());
    assert_eq!(rpc.fetch_bootstrap().unwrap(), b);
    // On the server's real clock now.
    let me = target(client.gid(), 4);
    let lease = rpc.register(me, 0, 60_000).unwrap();
    assert!(lease.lease_expiry_ms >= 60_000);
    assert_eq!(reader.lookup(&b, &me.gid).unwrap().epoch, lease.epoch);
    let server = handle.stop().unwrap();
    assert_eq!(server.stats().requests, 2);
}
