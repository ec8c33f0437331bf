//! DC mode: the upgrade's handshake travels as messages to the target's
//! reserved port (`HANDSHAKE_PORT`) and its answers over messaging's reply
//! path. No UD QP on either engine; users cannot bind the reserved port;
//! bad input there is dropped and counted; nobody serving is a bounded,
//! typed failure; a serving engine is still freed when dropped.

mod common;

use std::time::Duration;

use common::{counted, wait_wcs, Cluster, MemNode};
use krcore_kmod::engine::handshake_msg::{FIRST_RESERVED_PORT, HANDSHAKE_PORT};
use krcore_kmod::handshake::{HandshakeMessage, HandshakeRepr};
use krcore_kmod::{Engine, EngineConfig, EngineError, HandshakeFailure, MsgError, VqpPath};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, MemoryRegion, Nic, SendWr, WcStatus};

/// A memory node that serves upgrades (registered with its upgrade entry),
/// with or without the engine's handshake thread.
fn target(c: &Cluster, thread: bool) -> MemNode {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true)
        .with_handshake_thread(thread);
    // Its own upgrades (two_unthreaded_engines_...) wait generously: a
    // loaded machine delays the peer's answers.
    cfg.handshake.timeout = Duration::from_millis(500);
    c.upgradable_node(cfg, 4096)
}

/// An upgrade initiator (registered nowhere: a compute node).
fn client(c: &Cluster, timeout: Duration) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true);
    cfg.handshake.timeout = timeout;
    c.engine(cfg)
}

/// One READ through `e` of `mem`'s first 8 bytes.
fn read_first(e: &Engine<SimNic>, v: &krcore_kmod::Vqp<SimNic>, mem: &MemNode) -> [u8; 8] {
    let buf = e.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(v, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    got
}

/// Runs `f` while another thread calls `serve` in a loop (a target without
/// its own thread), and returns `f`'s result.
fn while_serving<R>(serve: impl Fn() + Sync, f: impl FnOnce() -> R) -> R {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                serve();
                std::thread::yield_now();
            }
        });
        let r = f();
        done.store(true, std::sync::atomic::Ordering::Release);
        r
    })
}

#[test]
fn an_upgrade_in_dc_mode_creates_no_ud_qp_on_either_engine() {
    let c = Cluster::new();
    let mem = target(&c, true);
    mem.mr.write(0, b"over rc!").unwrap();
    let e = client(&c, Duration::from_millis(500));
    let v = e.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    e.resolve(&krcore_kmod::engine::handshake_gid(&mem.gid()))
        .unwrap();
    let (tnic, cnic) = (mem.engine.nic().clone(), e.nic().clone());
    let target_before = tnic.counters();
    let (r, d) = counted(&cnic, || v.upgrade());
    assert_eq!(r.unwrap(), VqpPath::Rc);
    let t = tnic.counters() - target_before;
    // Initiator: its DCT (the answers arrive there) and the RC QP. Target:
    // the passive end only. Nothing else: no UD QP anywhere.
    assert_eq!(d.qps_created, 2, "{d:?}");
    assert_eq!(t.qps_created, 1, "{t:?}");
    for s in [e.stats(), mem.engine.stats()] {
        assert_eq!(s.handshake_endpoints_created, 0);
    }
    assert!(e.handshake_responder().is_none());
    assert!(mem.engine.handshake_responder().is_none());
    let (cs, ts) = (e.stats().handshake, mem.engine.stats().handshake);
    assert_eq!((cs.requests_sent, cs.paired, cs.timeouts), (1, 1, 0));
    assert_eq!((ts.accepted, ts.passive_qps, ts.dropped), (1, 1, 0));
    // The handshake's messages went through the messaging layer: one
    // round trip, the Request riding in the channel's Open (one receive
    // at the target before its Accept), then the channel's Close.
    settled(&mem.engine);
    let (cm, tm) = (e.msg_stats(), mem.engine.msg_stats());
    assert_eq!((tm.granted, tm.inline_delivered), (1, 1), "{tm:?}");
    assert_eq!(
        (tm.received, tm.closed),
        (2, 1),
        "Open+Request, Close: {tm:?}"
    );
    assert_eq!(cm.inline_delivered, 1, "the Accept, a reply: {cm:?}");
    assert_eq!(&read_first(&e, &v, &mem), b"over rc!");
    assert_eq!(v.path(), VqpPath::Rc);
}

/// Waits (bounded) until `e`'s handshake port holds no channel and no
/// message: every initiator's Close (or only message) was handled.
fn settled(e: &Engine<SimNic>) {
    let start = std::time::Instant::now();
    loop {
        let _ = e.progress();
        let u = e.msg_port_usage(HANDSHAKE_PORT).expect("serving");
        if u.channels == 0 && u.queued == 0 {
            return;
        }
        assert!(start.elapsed() < common::WAIT, "port never settled: {u:?}");
        std::thread::yield_now();
    }
}

/// Waits (bounded) until `e` holds `n` passive QPs (its initiators' Closes
/// handled).
fn passives(e: &Engine<SimNic>, n: usize) {
    let start = std::time::Instant::now();
    while e.stats().handshake.passive_qps != n {
        let _ = e.progress();
        assert!(start.elapsed() < common::WAIT, "{:?}", e.stats().handshake);
        std::thread::yield_now();
    }
}

/// A pair evicted back to DC tells its target with an only message: the
/// target frees its passive end and no channel stays open at its handshake
/// port (the Close does not reopen the initiator's control channel).
#[test]
fn an_evicted_pair_is_closed_without_holding_a_channel() {
    let c = Cluster::new();
    let (a, b) = (target(&c, true), target(&c, true));
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true)
        .with_rc_cap(1);
    cfg.handshake.timeout = Duration::from_millis(500);
    let e = c.engine(cfg);
    e.upgrade(&a.gid()).unwrap();
    settled(&a.engine);
    passives(&a.engine, 1);
    // The cap is one pair: b's evicts a's.
    e.upgrade(&b.gid()).unwrap();
    assert_eq!(e.stats().rc.evicted, 1);
    passives(&a.engine, 0);
    settled(&a.engine);
    let (hs, ms) = (a.engine.stats().handshake, a.engine.msg_stats());
    assert_eq!((hs.closed, hs.stale), (1, 0), "{hs:?}");
    // The exchange's channel (closed after it), and the Close's own, ended
    // when popped: no Open round trip for the Close.
    assert_eq!((ms.granted, ms.closed, ms.orphaned), (2, 2, 0), "{ms:?}");
    assert_eq!(e.stats().handshake.closes_sent, 1);
    // Each exchange: its Grant and its Request's Credit; nothing answers
    // the Close.
    assert_eq!(e.msg_stats().control, 4);
}

/// Dropping an engine closes its idle upgrade pairs: their targets free
/// the passive ends at once (not only at their `passive_cap`).
#[test]
fn dropping_an_engine_closes_its_idle_pairs() {
    let c = Cluster::new();
    let (a, b) = (target(&c, true), target(&c, true));
    let e = client(&c, Duration::from_millis(500));
    e.upgrade(&a.gid()).unwrap();
    e.upgrade(&b.gid()).unwrap();
    // A VQP upgraded on a's pair and kept past the engine's last handle:
    // its pair is idle (nothing in flight), so it is closed too, and the
    // VQP moves back to its DCI at its next post.
    let v = e.create_vqp().unwrap();
    v.connect(a.gid()).unwrap();
    assert_eq!(v.upgrade().unwrap(), VqpPath::Rc);
    for t in [&a, &b] {
        passives(&t.engine, 1);
    }
    let buf = e.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    drop(e);
    for t in [&a, &b] {
        passives(&t.engine, 0);
        settled(&t.engine);
        assert_eq!(t.engine.stats().handshake.closed, 1);
    }
    a.mr.write(0, b"after!!!").unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), a.mr.remote(0))])
        .unwrap();
    assert_eq!(wait_wcs(&v, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"after!!!");
    assert_eq!(v.path(), VqpPath::Dc);
}

#[test]
fn users_cannot_bind_the_reserved_ports() {
    let c = Cluster::new();
    let e = c.engine(EngineConfig::default().with_upgrade_endpoint(true));
    for port in [HANDSHAKE_PORT, FIRST_RESERVED_PORT, FIRST_RESERVED_PORT + 3] {
        let r = e.bind(port);
        assert!(
            matches!(r, Err(MsgError::ReservedPort { port: p }) if p == port),
            "{r:?}"
        );
    }
    // Below the reserved range, binding works.
    assert!(e.bind(FIRST_RESERVED_PORT - 1).is_ok());
    // The engine's own service binds it, users still cannot.
    e.handshake_entry().unwrap().expect("entry");
    assert!(matches!(
        e.bind(HANDSHAKE_PORT),
        Err(MsgError::ReservedPort { .. })
    ));
}

#[test]
fn bad_messages_on_the_handshake_port_are_dropped_and_counted() {
    let c = Cluster::new();
    let mem = target(&c, false);
    let peer = c.engine(EngineConfig::default());
    c.register(peer.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    let ep = peer.endpoint().unwrap();
    let to = mem.gid();
    // The target drains its messaging while the peer's Open waits.
    let push = |bytes: &[u8]| {
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let _ = mem.engine.msg_progress();
                    std::thread::yield_now();
                }
            });
            let r = ep.push(to, HANDSHAKE_PORT, bytes);
            done.store(true, std::sync::atomic::Ordering::Release);
            r.unwrap();
        })
    };
    let forged = |message| HandshakeRepr { nonce: 9, message }.emit();
    // Not a handshake message; a truncated one; an Accept (a reply, not a
    // request); a Request naming another node than its sender; a Close
    // of a pair that does not exist.
    push(b"garbage, not a handshake message");
    push(
        &forged(HandshakeMessage::Request {
            gid: peer.gid(),
            qpn: 1,
            reply_qkey: 0,
        })[..20],
    );
    push(&forged(HandshakeMessage::Accept {
        gid: peer.gid(),
        qpn: 5,
    }));
    push(&forged(HandshakeMessage::Request {
        gid: c.nic().gid(),
        qpn: 7,
        reply_qkey: 0,
    }));
    push(&forged(HandshakeMessage::Close {
        gid: peer.gid(),
        qpn: 3,
    }));
    // A descriptor (a body past the inline limit) to the reserved port.
    let big = vec![7u8; mem.engine.config().msg.inline_max + 1];
    push(&big);
    let start = std::time::Instant::now();
    let mut handled = 0;
    while handled < 5 {
        handled += mem.engine.progress().unwrap();
        assert!(start.elapsed() < common::WAIT, "only {handled} handled");
    }
    let s = mem.engine.stats().handshake;
    assert_eq!((s.dropped, s.stale), (4, 1), "{s:?}");
    assert_eq!((s.accepted, s.rejected, s.passive_qps), (0, 0, 0));
    assert!(mem.engine.msg_stats().malformed >= 1, "the descriptor");
    // Nothing was answered.
    assert!(ep.try_pop_reply().unwrap().is_none());
    // And the port still serves a real upgrade.
    let e = client(&c, Duration::from_millis(500));
    let v = e.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    let r = while_serving(
        || {
            let _ = mem.engine.progress();
        },
        || v.upgrade(),
    );
    assert_eq!(r.unwrap(), VqpPath::Rc);
    assert_eq!(mem.engine.stats().handshake.accepted, 1);
}

#[test]
fn nobody_serving_is_a_bounded_typed_timeout() {
    let c = Cluster::new();
    // Serves upgrades, but no thread and nobody calls progress: not even
    // the messaging layer's Open is answered.
    let mem = target(&c, false);
    let e = client(&c, Duration::from_millis(20));
    let v = e.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    let r = v.upgrade();
    assert!(
        matches!(
            r,
            Err(EngineError::Handshake {
                failure: HandshakeFailure::Timeout { attempts: 5, .. },
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(v.path(), VqpPath::Dc);
    let s = e.stats();
    assert_eq!(
        (s.rc_upgrade_failures, s.rc.pairs, s.handshake.timeouts),
        (1, 0, 1)
    );
    mem.mr.write(0, b"still dc").unwrap();
    assert_eq!(&read_first(&e, &v, &mem), b"still dc");
}

#[test]
fn a_node_that_stopped_serving_refuses_typed() {
    let c = Cluster::new();
    let mem = target(&c, true);
    mem.engine.stop_serving_upgrades();
    let e = client(&c, Duration::from_millis(500));
    let v = e.create_vqp().unwrap();
    v.connect(mem.gid()).unwrap();
    // The target's messaging thread is off: its Open is answered while the
    // test drives the target's messaging.
    let r = while_serving(
        || {
            let _ = mem.engine.msg_progress();
        },
        || v.upgrade(),
    );
    assert!(
        matches!(
            r,
            Err(EngineError::Handshake {
                failure: HandshakeFailure::Refused(krcore_kmod::msg::RefuseCode::Unbound),
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(v.path(), VqpPath::Dc);
    // Serving again: the upgrade goes through.
    mem.engine.handshake_entry().unwrap();
    assert_eq!(v.upgrade().unwrap(), VqpPath::Rc);
}

/// Two engines without threads upgrade to each other at the same time:
/// each serves the other's Request while it waits for its own answer.
#[test]
fn two_unthreaded_engines_upgrade_to_each_other_at_once() {
    let c = Cluster::new();
    let a = target(&c, false);
    let b = target(&c, false);
    let (va, vb) = (
        a.engine.create_vqp().unwrap(),
        b.engine.create_vqp().unwrap(),
    );
    va.connect(b.gid()).unwrap();
    vb.connect(a.gid()).unwrap();
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| va.upgrade());
        let hb = s.spawn(|| vb.upgrade());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ra.unwrap(), VqpPath::Rc);
    assert_eq!(rb.unwrap(), VqpPath::Rc);
    b.mr.write(0, b"b's mem!").unwrap();
    a.mr.write(0, b"a's mem!").unwrap();
    assert_eq!(&read_first(&a.engine, &va, &b), b"b's mem!");
    assert_eq!(&read_first(&b.engine, &vb, &a), b"a's mem!");
}

/// The serving port and the initiator's endpoint hold the engine; its last
/// handle releases them, so a serving engine (with its thread) is freed:
/// its QPs are destroyed when it is dropped.
#[test]
fn a_serving_engine_is_freed_when_dropped() {
    let c = Cluster::new();
    let mem = target(&c, true);
    let e = client(&c, Duration::from_millis(500));
    e.upgrade(&mem.gid()).unwrap();
    let (tnic, cnic) = (mem.engine.nic().clone(), e.nic().clone());
    let (t0, c0) = (tnic.counters(), cnic.counters());
    assert!(t0.qps_created > t0.qps_destroyed);
    drop(mem);
    drop(e);
    let (t1, c1) = (tnic.counters(), cnic.counters());
    assert_eq!(t1.qps_created, t1.qps_destroyed, "target freed: {t1:?}");
    assert_eq!(c1.qps_created, c1.qps_destroyed, "initiator freed: {c1:?}");
    assert!(t1.qps_destroyed > t0.qps_destroyed && c1.qps_destroyed > c0.qps_destroyed);
}
