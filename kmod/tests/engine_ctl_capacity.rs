//! DC mode: the engine's control ports (the upgrade handshake's
//! `HANDSHAKE_PORT`, meta registration's `META_PORT`) admit any number of
//! initiators over time. Their channels ask for one credit
//! (`msg.control_window`) and are closed (a Close message) when the
//! exchange is over, so the target's port slots come back to their
//! baseline; a port with every slot granted answers `Busy` and the
//! initiator asks again within its retries; a closed sender reopens
//! cleanly.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, MemNode, WAIT};
use krcore_kmod::engine::handshake_msg::HANDSHAKE_PORT;
use krcore_kmod::engine::PortUsage;
use krcore_kmod::msg::RefuseCode;
use krcore_kmod::{
    Engine, EngineConfig, EngineError, HandshakeFailure, MsgMetaHost, VqpPath, META_PORT,
};
use krcore_meta::table::Geometry;
use krcore_meta::MetaConfig;
use krcore_nic::sim::{SimConfig, SimNic};
use krcore_nic::{Access, MemoryRegion, SendWr, WcStatus};

/// Initiators in the scale tests: more than the 8 that the old per-sender
/// window (8 of the port's 64 slots) admitted.
const NODES: usize = 20;

/// A memory node serving upgrades with its handshake thread; its ports
/// have `port_slots` slots and reclaim channels idle for `idle`.
fn target(c: &Cluster, port_slots: u32, idle: Duration) -> MemNode {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true)
        .with_handshake_thread(true);
    cfg.msg.port_slots = port_slots;
    cfg.msg.control_idle = idle;
    c.upgradable_node(cfg, 4096)
}

/// A compute node (registered nowhere) that upgrades VQPs.
fn initiator(c: &Cluster) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true);
    // Generous: 20 initiators share two loaded cores.
    cfg.handshake.timeout = Duration::from_secs(2);
    c.engine(cfg)
}

/// Connects a VQP of `e` to `mem`, upgrades it to RC and READs through it.
fn upgrade_and_read(e: &Engine<SimNic>, mem: &MemNode) -> Result<[u8; 8], EngineError> {
    let v = e.create_vqp().unwrap();
    v.connect(mem.gid())?;
    e.resolve(&krcore_kmod::engine::handshake_gid(&mem.gid()))?;
    assert_eq!(v.upgrade()?, VqpPath::Rc);
    let buf = e.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mem.mr.remote(0))])
        .unwrap();
    assert_eq!(common::wait_wcs(&v, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    Ok(got)
}

/// Opens the `senders` sent again for a channel already granted (an answer
/// that was slow under load, or a push that waited for credits): the port
/// answers each with the same grant, and counts it in `granted`.
fn repeated_opens(senders: &[Engine<SimNic>]) -> u64 {
    senders
        .iter()
        .map(|e| {
            let s = e.msg_stats();
            s.open_resent + s.credits_asked
        })
        .sum()
}

/// Waits (bounded) until `port` of `e` has no channel left, draining its
/// messaging; returns the usage then.
fn settled(e: &Engine<SimNic>, port: u16) -> PortUsage {
    let start = Instant::now();
    loop {
        let _ = e.msg_progress();
        let u = e.msg_port_usage(port).expect("bound");
        if u.channels == 0 || start.elapsed() > WAIT {
            return u;
        }
        std::thread::yield_now();
    }
}

#[test]
fn twenty_initiators_upgrade_to_one_target_and_its_slots_come_back() {
    let c = Cluster::new();
    let mem = target(&c, 64, Duration::from_secs(1));
    mem.mr.write(0, b"scale rc").unwrap();
    let baseline = mem.engine.msg_port_usage(HANDSHAKE_PORT).expect("bound");
    assert_eq!((baseline.channels, baseline.ungranted), (0, 64));
    let nodes: Vec<_> = (0..NODES).map(|_| initiator(&c)).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|e| s.spawn(|| upgrade_and_read(e, &mem)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r.as_ref().unwrap(), b"scale rc");
    }
    for e in &nodes {
        let hs = e.stats().handshake;
        assert_eq!((hs.paired, hs.refused, hs.timeouts), (1, 0, 0), "{hs:?}");
        // Each initiator took one credit, not a window of 8.
        assert!(e.msg_stats().inline_delivered >= 1);
    }
    // Every initiator closed its channel: the port is back to baseline.
    assert_eq!(settled(&mem.engine, HANDSHAKE_PORT), baseline);
    let ts = mem.engine.stats().handshake;
    assert_eq!(ts.passive_qps, NODES, "{ts:?}");
    let ms = mem.engine.msg_stats();
    assert_eq!(ms.refused, 0, "{ms:?}");
    // One channel per initiator, each closed; every other grant answered
    // a repeated Open of one of them.
    assert_eq!(ms.closed, NODES as u64, "{ms:?}");
    assert_eq!(
        ms.granted,
        ms.closed + repeated_opens(&nodes),
        "every granted channel closed: {ms:?}"
    );
}

#[test]
fn a_port_of_two_slots_serves_twenty_initiators_one_after_another() {
    // Without the Close, the third initiator would be refused `Busy`
    // forever: the first two would hold the port's slots.
    let c = Cluster::new();
    let mem = target(&c, 2, Duration::from_secs(1));
    mem.mr.write(0, b"two slot").unwrap();
    let baseline = mem.engine.msg_port_usage(HANDSHAKE_PORT).expect("bound");
    assert_eq!((baseline.channels, baseline.ungranted), (0, 2));
    let nodes: Vec<_> = (0..NODES).map(|_| initiator(&c)).collect();
    for e in &nodes {
        assert_eq!(&upgrade_and_read(e, &mem).unwrap(), b"two slot");
        assert_eq!(settled(&mem.engine, HANDSHAKE_PORT), baseline);
    }
    let ms = mem.engine.msg_stats();
    assert_eq!((ms.closed, ms.refused), (20, 0), "{ms:?}");
    assert_eq!(ms.granted, 20 + repeated_opens(&nodes), "{ms:?}");
    assert_eq!(mem.engine.stats().handshake.passive_qps, NODES);
}

#[test]
fn a_full_control_port_answers_busy_and_the_initiator_retries_then_gets_in() {
    let c = Cluster::new();
    // Never reclaimed here: the hog's channel stays.
    let mem = target(&c, 1, Duration::from_secs(3600));
    mem.mr.write(0, b"got in!!").unwrap();
    // A user endpoint holds the port's only slot (it never closes).
    let hog = c.engine(EngineConfig::default());
    c.register(hog.local_target().unwrap(), 1 << 40, 0).unwrap();
    let ep = hog.endpoint().unwrap();
    let r = ep.push(mem.gid(), HANDSHAKE_PORT, b"not a handshake message");
    r.unwrap();
    let u = mem.engine.msg_port_usage(HANDSHAKE_PORT).unwrap();
    assert_eq!((u.channels, u.ungranted), (1, 0));
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true);
    cfg.handshake.timeout = Duration::from_secs(2);
    cfg.handshake.retries = 3;
    let e = c.engine(cfg);
    let r = upgrade_and_read(&e, &mem);
    assert!(
        matches!(
            r,
            Err(EngineError::Handshake {
                failure: HandshakeFailure::Refused(RefuseCode::Busy),
                ..
            })
        ),
        "{r:?}"
    );
    let hs = e.stats().handshake;
    assert_eq!((hs.busy, hs.refused, hs.paired), (3, 1, 0), "{hs:?}");
    // The hog's message was popped (and dropped: not a handshake
    // message), its credit came back: it may close, and the slot is free.
    let start = Instant::now();
    while !ep.close_channel(mem.gid(), HANDSHAKE_PORT).unwrap() {
        assert!(start.elapsed() < WAIT, "the hog's channel never idle");
        std::thread::yield_now();
    }
    assert_eq!(settled(&mem.engine, HANDSHAKE_PORT).ungranted, 1);
    assert_eq!(&upgrade_and_read(&e, &mem).unwrap(), b"got in!!");
    assert_eq!(settled(&mem.engine, HANDSHAKE_PORT).ungranted, 1);
}

#[test]
fn an_idle_channel_never_closed_is_reclaimed_and_its_sender_reopens() {
    // A port of one slot, reclaiming at once: a sender that never closes
    // (crashed, or its Close lost) gives way to the next initiator.
    let c = Cluster::new();
    let mem = target(&c, 1, Duration::ZERO);
    mem.mr.write(0, b"reclaim!").unwrap();
    let hog = c.engine(EngineConfig::default());
    c.register(hog.local_target().unwrap(), 1 << 40, 0).unwrap();
    let ep = hog.endpoint().unwrap();
    ep.push(mem.gid(), HANDSHAKE_PORT, b"not a handshake message")
        .unwrap();
    // Idle: the target popped (dropped) it and returned its credit.
    let start = Instant::now();
    while ep.credits(mem.gid(), HANDSHAKE_PORT) != Some(1) {
        assert!(start.elapsed() < WAIT, "the hog's credit never came back");
        std::thread::yield_now();
    }
    let e = initiator(&c);
    assert_eq!(&upgrade_and_read(&e, &mem).unwrap(), b"reclaim!");
    let u = settled(&mem.engine, HANDSHAKE_PORT);
    assert_eq!((u.channels, u.ungranted), (0, 1));
    let ms = mem.engine.msg_stats();
    assert_eq!((ms.reclaimed, ms.closed, ms.orphaned), (1, 1, 0), "{ms:?}");
    assert_eq!(e.stats().handshake.busy, 0);
    // The hog is told (its channel is gone: no credits)...
    let start = Instant::now();
    while ep.credits(mem.gid(), HANDSHAKE_PORT).is_some() {
        assert!(start.elapsed() < WAIT, "the hog was never told");
        std::thread::yield_now();
    }
    // ... and its next push opens a new channel and is delivered (popped
    // and dropped by the server, counted).
    let dropped = mem.engine.stats().handshake.dropped;
    ep.push(mem.gid(), HANDSHAKE_PORT, b"still not one")
        .unwrap();
    let start = Instant::now();
    while mem.engine.stats().handshake.dropped == dropped {
        assert!(
            start.elapsed() < WAIT,
            "the hog's second message never arrived"
        );
        std::thread::yield_now();
    }
    let ms = mem.engine.msg_stats();
    assert_eq!((ms.granted, ms.orphaned), (3, 0), "{ms:?}");
}

#[test]
fn a_closed_user_channel_gives_its_window_back_and_reopens() {
    let c = Cluster::new();
    let rx = c.engine(EngineConfig::default());
    c.register(rx.local_target().unwrap(), 1 << 40, 0).unwrap();
    let tx = c.engine(EngineConfig::default());
    c.register(tx.local_target().unwrap(), 1 << 40, 0).unwrap();
    let port = rx.bind(7).unwrap();
    let ep = tx.endpoint().unwrap();
    let budget = tx.msg_unreserved().unwrap();
    let drain = |n: usize| {
        let start = Instant::now();
        let mut got = Vec::new();
        while got.len() < n {
            if let Some(m) = port.try_pop().unwrap() {
                got.push(m.to_vec());
            }
            let _ = tx.msg_progress();
            assert!(start.elapsed() < WAIT);
        }
        got
    };
    let serve = |f: &dyn Fn()| {
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let _ = rx.msg_progress();
                    std::thread::yield_now();
                }
            });
            f();
            done.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    serve(&|| ep.push(rx.gid(), 7, b"one").unwrap());
    let u = rx.msg_port_usage(7).unwrap();
    assert_eq!((u.channels, u.ungranted), (1, 64 - 8));
    // Not idle: its message is not popped, its credit not back.
    assert!(!ep.close_channel(rx.gid(), 7).unwrap());
    assert_eq!(drain(1), vec![b"one".to_vec()]);
    // Credits go back in batches of half the window: still not idle.
    assert!(!ep.close_channel(rx.gid(), 7).unwrap());
    assert_eq!(port.return_credits().unwrap(), 1);
    let start = Instant::now();
    while !ep.close_channel(rx.gid(), 7).unwrap() {
        assert!(start.elapsed() < WAIT, "credit never came back");
        let _ = rx.msg_progress();
    }
    assert_eq!(ep.credits(rx.gid(), 7), None, "forgotten at the sender");
    assert_eq!(tx.msg_unreserved().unwrap(), budget, "reply window back");
    let u = settled(&rx, 7);
    assert_eq!((u.channels, u.ungranted), (0, 64));
    // A reply to the closed channel is a typed error at the port, not a
    // message dropped silently.
    let sender = krcore_kmod::Sender {
        gid: tx.gid(),
        vqp: ep.id(),
    };
    let r = port.reply_to(sender, b"late");
    assert!(
        matches!(
            r,
            Err(krcore_kmod::MsgError::Refused {
                code: RefuseCode::Unbound,
                ..
            })
        ),
        "{r:?}"
    );
    // The sender comes back: a fresh Open, sequence from 0 again.
    serve(&|| ep.push(rx.gid(), 7, b"two").unwrap());
    assert_eq!(drain(1), vec![b"two".to_vec()]);
    let ms = rx.msg_stats();
    assert_eq!(
        (ms.granted, ms.closed, ms.out_of_order, ms.orphaned),
        (2, 1, 0, 0),
        "{ms:?}"
    );
}

/// A meta node whose engine's ports have `port_slots` slots.
fn meta_host(c: &Cluster, port_slots: u32) -> MsgMetaHost<SimNic> {
    let mut cfg = EngineConfig::default().with_pool_size(1);
    cfg.msg.port_slots = port_slots;
    let nic = SimNic::open(&c.fabric, SimConfig::default()).unwrap();
    let e = Engine::start(nic, cfg).unwrap();
    let meta = MetaConfig {
        geometry: Geometry::with_buckets(64).unwrap(),
        lease_sweep_ms: 0,
        ..MetaConfig::default()
    };
    MsgMetaHost::start(&e, meta).unwrap()
}

fn meta_node(c: &Cluster, host: &MsgMetaHost<SimNic>) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_meta(host.location().unwrap());
    cfg.meta_timeout = Duration::from_secs(2);
    let nic = SimNic::open(&c.fabric, SimConfig::default()).unwrap();
    Engine::start(nic, cfg).unwrap()
}

#[test]
fn twenty_nodes_register_with_one_meta_host_and_its_slots_come_back() {
    let c = Cluster::new();
    for (slots, concurrent) in [(64, true), (2, false)] {
        let host = std::sync::Arc::new(meta_host(&c, slots));
        let baseline = host.engine().msg_port_usage(META_PORT).expect("bound");
        assert_eq!((baseline.channels, baseline.ungranted), (0, slots));
        let thread = host.spawn(Duration::from_micros(50)).unwrap();
        let nodes: Vec<_> = (0..NODES).map(|_| meta_node(&c, &host)).collect();
        let register = |e: &Engine<SimNic>| e.meta_register(e.local_target().unwrap(), 0, 60_000);
        if concurrent {
            std::thread::scope(|s| {
                let hs: Vec<_> = nodes.iter().map(|e| s.spawn(|| register(e))).collect();
                for h in hs {
                    h.join().unwrap().unwrap();
                }
            });
        } else {
            for e in &nodes {
                register(e).unwrap();
                assert_eq!(settled(host.engine(), META_PORT), baseline);
            }
        }
        assert_eq!(settled(host.engine(), META_PORT), baseline, "slots {slots}");
        assert_eq!(host.stats().requests, NODES as u64);
        // The slots come back before the last Close is counted (seen once
        // on a loaded machine, 2026-12-08: 19 of 20): the count is waited
        // for a little.
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while host.engine().msg_stats().closed < NODES as u64 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let ms = host.engine().msg_stats();
        assert_eq!(ms.refused, 0, "{ms:?}");
        assert_eq!(ms.closed, NODES as u64, "slots {slots}: {ms:?}");
        assert_eq!(
            ms.granted,
            ms.closed + repeated_opens(&nodes),
            "slots {slots}: {ms:?}"
        );
        // Every node is findable (one READ each, no host CPU).
        let probe = meta_node(&c, &host);
        for e in &nodes {
            assert_eq!(probe.resolve(&e.gid()).unwrap().target.gid, e.gid());
        }
        drop(thread);
    }
}
