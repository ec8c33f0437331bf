//! Two-sided messaging (DC mode): ports, endpoints, replies, credits and
//! zero-copy descriptors, on a `sim:mem` cluster whose nodes are all
//! registered in the meta table (a port answers its senders by GID).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::fallback::Fabric;
use common::{config, Cluster, WAIT};
use krcore_kmod::msg::RefuseCode;
use krcore_kmod::{Engine, EngineConfig, MsgError, OwnedMr};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, Gid, MemoryRegion, Nic};

const PORT: u16 = 7;

/// A registered engine with messaging set by `f`.
fn node(c: &Cluster, f: impl FnOnce(&mut EngineConfig)) -> Engine<SimNic> {
    let e = c.engine(config(|cfg| {
        cfg.msg.timeout = WAIT;
        cfg.msg.progress_thread = true;
        f(cfg)
    }));
    c.register(e.local_target().unwrap(), 1 << 40, 0)
        .expect("register");
    e
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The body of message `seq` of sender `s`: its length from the seeded
/// sizes, bytes that name both.
fn body(s: u32, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = Rng(u64::from(s) << 32 ^ seq ^ 0x9e37_79b9_7f4a_7c15);
    while v.len() < len {
        v.extend_from_slice(&x.next().to_le_bytes());
    }
    v.truncate(len);
    if len >= 12 {
        v[..4].copy_from_slice(&s.to_le_bytes());
        v[4..12].copy_from_slice(&seq.to_le_bytes());
    }
    v
}

/// 10,000 messages from 4 senders (on 4 nodes), random sizes on both sides
/// of the zero-copy threshold, a small window: every message arrives once,
/// intact, in order per sender.
#[test]
fn ten_thousand_messages_arrive_intact_and_in_order_per_sender() {
    const SENDERS: u32 = 4;
    const PER: u64 = 2_500;
    const INLINE: usize = 1024;
    let c = Arc::new(Cluster::new());
    let tune = |cfg: &mut EngineConfig| {
        cfg.msg.inline_max = INLINE;
        cfg.msg.window = 4;
    };
    let rx = node(&c, tune);
    let port = rx.bind(PORT).expect("bind");
    let sizes = |s: u32| {
        let mut r = Rng(0xabcd ^ (u64::from(s + 1) * 0x1000_0001));
        (0..PER)
            .map(|_| (r.next() % (4 * INLINE as u64)) as usize)
            .collect::<Vec<_>>()
    };
    let rx_gid = rx.gid();
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let e = node(&c, tune);
            std::thread::spawn(move || {
                let ep = e.endpoint().expect("endpoint");
                for (seq, len) in sizes(s).into_iter().enumerate() {
                    ep.push(rx_gid, PORT, &body(s, seq as u64, len))
                        .unwrap_or_else(|err| panic!("sender {s} message {seq}: {err}"));
                }
                (e.gid(), ep.id(), e.msg_stats(), ep)
            })
        })
        .collect();
    let mut next: HashMap<(Gid, u32), u64> = HashMap::new();
    let mut large = 0;
    for _ in 0..u64::from(SENDERS) * PER {
        let m = port.pop_timeout(WAIT).expect("pop");
        let seq = next.entry((m.from.gid, m.from.vqp)).or_default();
        assert_eq!(m.seq, *seq, "per-sender order");
        let data = m.to_vec();
        assert!(data.len() >= 12 || data.len() == m.len());
        let s = if data.len() >= 12 {
            u32::from_le_bytes(data[..4].try_into().unwrap())
        } else {
            u32::MAX
        };
        if s != u32::MAX {
            assert_eq!(data, body(s, *seq, data.len()), "intact");
        }
        assert_eq!(m.is_zero_copy(), data.len() > INLINE);
        large += usize::from(m.is_zero_copy());
        *seq += 1;
    }
    let mut expected_large = 0;
    for (s, t) in senders.into_iter().enumerate() {
        let (gid, vqp, _, ep) = t.join().expect("sender");
        assert_eq!(next[&(gid, vqp)], PER);
        expected_large += sizes(s as u32).iter().filter(|&&l| l > INLINE).count();
        // Every descriptor buffer came back.
        let start = std::time::Instant::now();
        while ep.in_flight_regions() > 0 {
            assert!(start.elapsed() < WAIT, "descriptor buffers not released");
            port.try_pop().expect("progress");
        }
    }
    assert_eq!(large, expected_large);
    assert!(
        large > 1000 && large < 9000,
        "both paths exercised: {large}"
    );
    let st = rx.msg_stats();
    assert_eq!(st.out_of_order, 0);
    assert_eq!(
        st.malformed + st.orphaned + st.recv_errors + st.progress_errors,
        0
    );
    assert_eq!(st.pulled as usize, large);
    assert!(port.try_pop().unwrap().is_none(), "nothing extra");
}

/// A receiver that stops popping stalls its sender at exactly the window;
/// nothing is lost, and everything arrives once popping resumes.
#[test]
fn a_stalled_receiver_stalls_the_sender_without_loss() {
    let c = Cluster::new();
    let rx = node(&c, |cfg| cfg.msg.window = 8);
    let tx = node(&c, |cfg| cfg.msg.window = 8);
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    let mut sent = 0u64;
    loop {
        match ep.try_push(rx.gid(), PORT, &sent.to_le_bytes()) {
            Ok(()) => sent += 1,
            Err(MsgError::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent <= 8, "the window holds");
    }
    assert_eq!(sent, 8);
    assert_eq!(ep.credits(rx.gid(), PORT), Some(0));
    let e = ep.push_timeout(rx.gid(), PORT, b"late", Duration::from_millis(20));
    assert!(matches!(e, Err(MsgError::Timeout(_))), "{e:?}");
    rx.msg_progress().unwrap();
    assert_eq!(port.queued(), 8, "held at the receiver, not dropped");
    // The sender keeps pushing from a thread; the receiver resumes.
    let (g, total) = (rx.gid(), 200u64);
    let t = std::thread::spawn(move || {
        for i in 8..total {
            ep.push(g, PORT, &i.to_le_bytes()).expect("push");
        }
        ep
    });
    for i in 0..total {
        let m = port.pop_timeout(WAIT).expect("pop");
        assert_eq!(m.to_vec(), i.to_le_bytes(), "message {i}");
    }
    let ep = t.join().unwrap();
    assert_eq!(rx.msg_stats().out_of_order, 0);
    // 200 pops returned 200 credits in batches of 4: none pending.
    assert_eq!(port.return_credits().unwrap(), 0);
    // Three more: pending below the batch until returned explicitly.
    for i in 0..3u64 {
        ep.push(rx.gid(), PORT, &i.to_le_bytes()).unwrap();
        port.pop().unwrap();
    }
    assert_eq!(ep.credits(rx.gid(), PORT), Some(5));
    assert_eq!(port.return_credits().unwrap(), 3);
    let start = std::time::Instant::now();
    while ep.credits(rx.gid(), PORT) != Some(8) {
        assert!(start.elapsed() < WAIT, "credits never came back");
    }
}

#[test]
fn bind_twice_unbound_port_oversized_and_busy_are_typed_errors() {
    let c = Cluster::new();
    let rx = node(&c, |cfg| {
        cfg.msg.port_slots = 8;
        cfg.msg.window = 8;
        cfg.msg.max_message = 1 << 16;
    });
    let tx = node(&c, |cfg| cfg.msg.max_message = 1 << 16);
    let port = rx.bind(PORT).unwrap();
    assert!(matches!(
        rx.bind(PORT),
        Err(MsgError::PortInUse { port: PORT })
    ));
    let ep = tx.endpoint().unwrap();
    match ep.push(rx.gid(), PORT + 1, b"x") {
        Err(MsgError::Refused {
            port,
            code: RefuseCode::Unbound,
            ..
        }) => assert_eq!(port, PORT + 1),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ep.push(rx.gid(), PORT, &vec![0; (1 << 16) + 1]),
        Err(MsgError::TooLarge {
            len: 65537,
            max: 65536
        })
    ));
    // The first channel takes all 8 slots of the port: a second sender is
    // refused, typed, instead of overrunning the receiver.
    ep.push(rx.gid(), PORT, b"first").unwrap();
    let other = tx.endpoint().unwrap();
    assert!(matches!(
        other.push(rx.gid(), PORT, b"second"),
        Err(MsgError::Refused {
            code: RefuseCode::Busy,
            ..
        })
    ));
    assert_eq!(port.pop().unwrap().to_vec(), b"first");
    // A node nobody registered.
    let stranger = c.engine(EngineConfig::default());
    assert!(matches!(
        ep.push(stranger.gid(), PORT, b"?"),
        Err(MsgError::Engine(
            krcore_kmod::EngineError::UnknownNode { .. }
        ))
    ));
    // Unbinding frees the port for a new bind; the receive slots come back.
    let free = rx.msg_unreserved().unwrap();
    drop(port);
    assert_eq!(rx.msg_unreserved().unwrap(), free + 8);
    let _again = rx.bind(PORT).unwrap();
    // A sender whose channel outlived the port: the message that reached
    // no port is reported to it, typed, at its next push.
    let ep2 = tx.endpoint().unwrap();
    ep2.push(rx.gid(), PORT + 2, b"x").expect_err("unbound");
    let late = rx.bind(PORT + 2).unwrap();
    ep2.push(rx.gid(), PORT + 2, b"kept").unwrap();
    assert_eq!(late.pop().unwrap().to_vec(), b"kept");
    drop(late);
    let orphaned = rx.msg_stats().orphaned;
    let start = std::time::Instant::now();
    let mut accepted = 0;
    loop {
        match ep2.push(rx.gid(), PORT + 2, b"after unbind") {
            Ok(()) => accepted += 1,
            Err(MsgError::Refused {
                code: RefuseCode::Unbound,
                ..
            }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(start.elapsed() < WAIT, "never told");
    }
    assert!(accepted >= 1);
    // Every accepted one is accounted for at the receiver, none delivered.
    while rx.msg_stats().orphaned - orphaned < accepted {
        assert!(start.elapsed() < WAIT, "orphans not all counted");
        rx.msg_progress().unwrap();
    }
    assert_eq!(rx.msg_stats().orphaned - orphaned, accepted);
    assert_eq!(
        rx.msg_stats().orphaned - orphaned,
        accepted,
        "each one reported"
    );
    // RC fallback mode binds too (messages over its RC pairs: see
    // tests/engine_msg_rc.rs); a forked child is what refuses messaging.
    let rc = Fabric::new();
    assert!(rc.engine(EngineConfig::default()).bind(1).is_ok());
}

/// A port bound with a slot count of its own (`bind_reclaiming_with`):
/// it grants that many channels, not `msg.port_slots`; its slots come out
/// of the node's budget and go back when it is unbound; more than the
/// budget, or none, is a typed error.
#[test]
fn a_port_sized_for_many_clients_grants_them_all() {
    let c = Cluster::new();
    let rx = node(&c, |cfg| {
        cfg.msg.port_slots = 4;
        cfg.msg.window = 1;
        cfg.recv_depth = 256;
    });
    let tx = node(&c, |cfg| {
        cfg.msg.window = 1;
        cfg.recv_depth = 512;
    });
    // Messaging starts with the first bind.
    drop(rx.bind(PORT + 1).unwrap());
    let free = rx.msg_unreserved().unwrap();
    assert!(matches!(
        rx.bind_reclaiming_with(PORT, 0),
        Err(MsgError::Config(_))
    ));
    match rx.bind_reclaiming_with(PORT, free + 1) {
        Err(MsgError::NoBuffers { wanted, free: f }) => {
            assert_eq!((wanted, f), (free + 1, free));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        rx.bind_reclaiming_with(krcore_kmod::engine::handshake_msg::HANDSHAKE_PORT, 8),
        Err(MsgError::ReservedPort { .. })
    ));
    let port = rx.bind_reclaiming_with(PORT, 40).unwrap();
    assert_eq!(rx.msg_unreserved().unwrap(), free - 40);
    // 40 senders of one credit each, ten times the engine's port_slots:
    // every one is granted, none refused or reclaimed.
    let eps: Vec<_> = (0..40).map(|_| tx.endpoint().unwrap()).collect();
    for (i, ep) in eps.iter().enumerate() {
        ep.push(rx.gid(), PORT, &[i as u8]).unwrap();
    }
    let usage = rx.msg_port_usage(PORT).unwrap();
    assert_eq!((usage.channels, usage.ungranted), (40, 0));
    let mut got: Vec<u8> = (0..40).map(|_| port.pop().unwrap().to_vec()[0]).collect();
    got.sort_unstable();
    assert_eq!(got, (0..40).collect::<Vec<u8>>());
    let stats = rx.msg_stats();
    assert_eq!((stats.refused, stats.reclaimed), (0, 0));
    // A 41st is refused, typed: the port is full.
    assert!(matches!(
        tx.endpoint().unwrap().push(rx.gid(), PORT, b"x"),
        Err(MsgError::Refused {
            code: RefuseCode::Busy,
            ..
        })
    ));
    drop(port);
    assert_eq!(rx.msg_unreserved().unwrap(), free);
}

/// A port unbound while a sender's channel is open: the message pushed
/// meanwhile reaches no port, and its sender is told. The next push fails
/// with `Refused(Unbound)`, even when the port is bound again by then (the
/// notice is not swallowed by the reopen); the push after that opens a new
/// channel.
#[test]
fn a_loss_notice_is_reported_even_after_the_port_is_bound_again() {
    let c = Cluster::new();
    let rx = node(&c, |_| {});
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    ep.push(rx.gid(), PORT, b"one").unwrap();
    assert_eq!(port.pop().unwrap().to_vec(), b"one");
    drop(port);
    // Accepted (the channel is open here), orphaned there.
    ep.push(rx.gid(), PORT, b"lost").unwrap();
    let start = std::time::Instant::now();
    // The notice arrived: the channel is no longer open here.
    while ep.credits(rx.gid(), PORT).is_some() {
        assert!(start.elapsed() < WAIT, "never told");
        std::thread::yield_now();
    }
    assert_eq!(rx.msg_stats().orphaned, 1);
    let port = rx.bind(PORT).unwrap();
    match ep.push(rx.gid(), PORT, b"not sent") {
        Err(MsgError::Refused {
            code: RefuseCode::Unbound,
            port: p,
            ..
        }) => assert_eq!(p, PORT),
        other => panic!("the loss was not reported: {other:?}"),
    }
    ep.push(rx.gid(), PORT, b"two").unwrap();
    let m = port.pop().unwrap();
    assert_eq!((m.seq, m.to_vec()), (0, b"two".to_vec()), "a new channel");
    assert!(port.try_pop().unwrap().is_none(), "'not sent' was not sent");
}

/// Replies go back to the VQP that sent: two endpoints of one node each get
/// exactly their own replies, small and large (zero copy), in order.
#[test]
fn replies_go_back_to_the_sending_endpoint() {
    let c = Cluster::new();
    let tune = |cfg: &mut EngineConfig| cfg.msg.inline_max = 256;
    let rx = node(&c, tune);
    let tx = node(&c, tune);
    let port = rx.bind(PORT).unwrap();
    let a = tx.endpoint().unwrap();
    let b = tx.endpoint().unwrap();
    for i in 0..20u64 {
        a.push(rx.gid(), PORT, &i.to_le_bytes()).unwrap();
        b.push(rx.gid(), PORT, &(1000 + i).to_le_bytes()).unwrap();
        for _ in 0..2 {
            let m = port.pop().unwrap();
            let n = u64::from_le_bytes(m.to_vec().try_into().unwrap());
            let mut reply = vec![0u8; if n % 2 == 0 { 8 } else { 4000 }];
            reply[..8].copy_from_slice(&(n * 10).to_le_bytes());
            port.reply(&m, &reply).unwrap();
        }
        for (ep, base) in [(&a, 0), (&b, 1000)] {
            let r = ep.pop_reply().unwrap();
            assert_eq!(r.port, PORT);
            assert_eq!(r.from.gid, rx.gid());
            let d = r.to_vec();
            assert_eq!(
                u64::from_le_bytes(d[..8].try_into().unwrap()),
                (base + i) * 10
            );
            assert_eq!(r.is_zero_copy(), d.len() > 256);
        }
    }
    assert!(a.try_pop_reply().unwrap().is_none());
    assert!(b.try_pop_reply().unwrap().is_none());
}

/// A request/response client with one request out wants a window of one
/// credit: the port returns it as it pops the request, so the channel is
/// idle once the answer is in and its Close gives the slots back; with the
/// default window the credit waits for a batch and the channel stays.
#[test]
fn an_endpoint_of_window_one_closes_after_each_answer() {
    let c = Cluster::new();
    let rx = node(&c, |_| {});
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).unwrap();
    for bad in [0, 9] {
        assert!(
            matches!(tx.endpoint_with_window(bad), Err(MsgError::Config(_))),
            "window {bad}"
        );
    }
    let exchange = |ep: &krcore_kmod::Endpoint<SimNic>| {
        ep.push(rx.gid(), PORT, b"request").unwrap();
        let m = port.pop().unwrap();
        port.reply(&m, b"answer").unwrap();
        assert_eq!(ep.pop_reply().unwrap().to_vec(), b"answer");
    };
    let one = tx.endpoint_with_window(1).unwrap();
    for _ in 0..3 {
        exchange(&one);
        assert!(one.close_channel(rx.gid(), PORT).unwrap());
        // The Close is handled when the port's node next drains its CQ.
        let t0 = std::time::Instant::now();
        let mut u = rx.msg_port_usage(PORT).unwrap();
        while u.channels != 0 && t0.elapsed() < WAIT {
            let _ = rx.msg_progress();
            std::thread::yield_now();
            u = rx.msg_port_usage(PORT).unwrap();
        }
        assert_eq!((u.channels, u.ungranted), (0, 64), "{u:?}");
    }
    let wide = tx.endpoint().unwrap();
    exchange(&wide);
    assert!(!wide.close_channel(rx.gid(), PORT).unwrap(), "credit owed");
    assert_eq!(rx.msg_port_usage(PORT).unwrap().channels, 1);
}

/// push_region: the receiver READs the caller's own MR (no staging copy);
/// the region is released once pulled.
#[test]
fn push_region_is_pulled_from_the_callers_mr() {
    let c = Cluster::new();
    let rx = node(&c, |_| {});
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    let mr: OwnedMr<SimNic> = tx
        .alloc_mr(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
    mr.write(0, &data).unwrap();
    ep.push_region(rx.gid(), PORT, &mr, 4096, 100_000).unwrap();
    assert_eq!(ep.in_flight_regions(), 1);
    let m = port.pop().unwrap();
    assert!(m.is_zero_copy());
    assert_eq!(m.to_vec(), &data[4096..4096 + 100_000]);
    let start = std::time::Instant::now();
    while ep.in_flight_regions() > 0 {
        assert!(start.elapsed() < WAIT);
    }
}

/// Messaging keeps no reference cycle: dropping the last handles of an
/// engine that used messaging (and runs the progress thread) destroys its
/// QPs.
#[test]
fn an_engine_that_used_messaging_is_dropped() {
    let c = Cluster::new();
    let rx = node(&c, |_| {});
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    ep.push(rx.gid(), PORT, b"hello").unwrap();
    let m = port.pop().unwrap();
    port.reply(&m, b"bye").unwrap();
    assert_eq!(ep.pop_reply().unwrap().to_vec(), b"bye");
    let nic = rx.nic().clone();
    let before = nic.counters();
    drop((m, port, rx));
    // The progress thread holds the engine during each of its calls: if
    // it did at the drop, the engine goes when that call returns.
    let start = std::time::Instant::now();
    loop {
        let d = nic.counters() - before;
        if d.qps_destroyed >= 2 {
            break;
        }
        assert!(start.elapsed() < WAIT, "DCT and DCIs destroyed: {d:?}");
        std::thread::yield_now();
    }
}

/// The 10,000-message test as a stress run with knobs from the environment
/// (`P_SENDERS`, `P_PER`, `P_INLINE`, `P_WINDOW`, `P_POOL`, `P_DEPTH`),
/// printing every node's messaging and DCI stats; collects up to 20 order
/// or header/body mismatches before failing. Long: `--ignored`.
#[test]
#[ignore]
fn order_stress_with_knobs() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let senders = env("P_SENDERS", 4) as u32;
    let per = env("P_PER", 2500);
    let inline = env("P_INLINE", 1024) as usize;
    let window = env("P_WINDOW", 4) as u32;
    let pool = env("P_POOL", 0) as usize;
    let depth = env("P_DEPTH", 0) as u32;
    let c = Arc::new(Cluster::new());
    let tune = move |cfg: &mut EngineConfig| {
        cfg.msg.inline_max = inline;
        cfg.msg.window = window;
        if pool > 0 {
            cfg.pool_size = pool;
        }
        if depth > 0 {
            cfg.vqp_depth = depth;
        }
    };
    let rx = node(&c, tune);
    let port = rx.bind(PORT).expect("bind");
    let rx_gid = rx.gid();
    let sizes = move |s: u32| {
        let mut r = Rng(0xabcd ^ (u64::from(s + 1) * 0x1000_0001));
        (0..per)
            .map(|_| (r.next() % (4 * inline as u64)) as usize)
            .collect::<Vec<_>>()
    };
    let nodes: Vec<_> = (0..senders).map(|_| node(&c, tune)).collect();
    let threads: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(s, e)| {
            let ep = e.endpoint().expect("endpoint");
            std::thread::spawn(move || {
                for (seq, len) in sizes(s as u32).into_iter().enumerate() {
                    ep.push(rx_gid, PORT, &body(s as u32, seq as u64, len))
                        .unwrap_or_else(|err| panic!("sender {s} message {seq}: {err}"));
                }
                ep
            })
        })
        .collect();
    let mut next: HashMap<(Gid, u32), u64> = HashMap::new();
    let mut bad = Vec::new();
    for _ in 0..u64::from(senders) * per {
        let m = port.pop_timeout(WAIT).expect("pop");
        let seq = next.entry((m.from.gid, m.from.vqp)).or_default();
        if m.seq != *seq && bad.len() < 20 {
            bad.push((m.from, *seq, m.seq, m.len(), m.is_zero_copy()));
        }
        let data = m.to_vec();
        if data.len() >= 12 {
            let s = u32::from_le_bytes(data[..4].try_into().unwrap());
            let bseq = u64::from_le_bytes(data[4..12].try_into().unwrap());
            if bseq != m.seq && bad.len() < 20 {
                bad.push((m.from, 1 << 60 | bseq, m.seq, s as usize, m.is_zero_copy()));
            }
        }
        *seq = m.seq + 1;
    }
    let eps: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    eprintln!("rx msg {:?}", rx.msg_stats());
    eprintln!("rx dci {:?}", rx.stats().dci);
    for (e, ep) in nodes.iter().zip(&eps) {
        eprintln!("tx {} msg {:?}", ep.id(), e.msg_stats());
        eprintln!("tx dci {:?}", e.stats().dci);
    }
    assert!(bad.is_empty(), "order violations: {bad:?}");
    let st = rx.msg_stats();
    assert_eq!(st.out_of_order + st.progress_errors + st.malformed, 0);
}
