//! Messaging: no message is silently lost when the control or data sends
//! around it fail. A port whose credit return (or a descriptor's Release)
//! cannot be sent still delivers the popped message and owes the credits;
//! an endpoint whose unsignaled message SEND fails reports each message it
//! lost (the failing one, and the later ones the NIC flushed) as a typed
//! error to its sender.

mod common;

use std::time::{Duration, Instant};

use common::{config, Cluster, WAIT};
use krcore_kmod::{Engine, EngineConfig, EngineError, MsgError};
use krcore_nic::fault::{FaultConfig, FaultNic};
use krcore_nic::sim::SimNic;
use krcore_nic::WcStatus;

const PORT: u16 = 9;

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

/// A messaging node (as [`node`]) whose NIC is wrapped in a [`FaultNic`]
/// seeded with `seed`, and the handle that injects its faults.
fn fault_node(c: &Cluster, seed: u64) -> (Engine<FaultNic<SimNic>>, FaultNic<SimNic>) {
    fault_node_with(c, seed, |_| {})
}

/// [`fault_node`] with more configuration.
fn fault_node_with(
    c: &Cluster,
    seed: u64,
    f: impl FnOnce(&mut EngineConfig),
) -> (Engine<FaultNic<SimNic>>, FaultNic<SimNic>) {
    let nic = FaultNic::new(c.nic(), FaultConfig::none(seed));
    let faults = nic.clone();
    let e = Engine::start(
        nic,
        config(|cfg| {
            cfg.msg.timeout = WAIT;
            cfg.msg.progress_thread = true;
            f(cfg)
        })
        .with_meta(c.location),
    )
    .expect("engine");
    c.register(e.local_target().unwrap(), 1 << 40, 0)
        .expect("register");
    (e, faults)
}

/// Waits (bounded by `WAIT`) until `done`; fails naming `what`.
fn wait_until(what: impl Fn() -> String, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "{}", what());
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn body(i: u64, len: usize) -> Vec<u8> {
    let mut v = i.to_le_bytes().repeat(len.div_ceil(8));
    v.truncate(len);
    v
}

/// The receiver cannot reach the sender for a while (its meta entry is
/// gone and the receiver's cache entry dropped): the credit returns (and a
/// descriptor's Release) fail, yet every popped message is delivered, and
/// the owed credits flow once the sender is reachable again.
#[test]
fn a_failed_credit_return_still_delivers_the_message_and_owes_the_credits() {
    let c = Cluster::new();
    let rx = node(&c, |cfg| cfg.msg.inline_max = 256);
    let tx = node(&c, |cfg| cfg.msg.inline_max = 256);
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    let window = tx.config().msg.window as u64;
    // A full window, the last message a descriptor (pulled by READ from
    // the sender's buffer, then released).
    let len = |i: u64| if i == window - 1 { 1000 } else { 100 };
    for i in 0..window {
        ep.push(rx.gid(), PORT, &body(i, len(i))).expect("push");
    }
    assert_eq!(ep.credits(rx.gid(), PORT), Some(0));
    assert_eq!(ep.in_flight_regions(), 1);
    // The sender becomes unreachable for the receiver.
    c.deregister(&tx.gid()).expect("deregister");
    rx.invalidate(&tx.gid());
    let start = Instant::now();
    while port.queued() < window as usize {
        assert!(start.elapsed() < WAIT, "the window never arrived");
        std::thread::yield_now();
    }
    for i in 0..window - 1 {
        let m = port.pop().expect("a popped message is delivered");
        assert_eq!(
            (m.seq, m.to_vec()),
            (i, body(i, len(i))),
            "intact, in order"
        );
    }
    let s = rx.msg_stats();
    assert!(s.credits_deferred >= 1, "{s:?}");
    assert_eq!(ep.credits(rx.gid(), PORT), Some(0), "no credit reached it");
    // The descriptor cannot be pulled now: a typed error, and it stays
    // queued.
    let r = port.try_pop();
    assert!(
        matches!(r, Err(MsgError::Engine(EngineError::UnknownNode { .. }))),
        "{r:?}"
    );
    assert_eq!(port.queued(), 1, "not lost");
    // Reachable again: the next pop delivers it and pays what is owed; the
    // sender gets its whole window and its buffer back.
    c.register(tx.local_target().unwrap(), 1 << 40, 0)
        .expect("register");
    let i = window - 1;
    let m = port.pop().expect("pop");
    assert_eq!((m.seq, m.to_vec()), (i, body(i, len(i))));
    assert!(m.is_zero_copy());
    assert!(port.try_pop().expect("try_pop").is_none());
    // The last pop's credit waits for its batch (half a window) as usual:
    // return it now.
    port.return_credits().expect("return credits");
    let start = Instant::now();
    while ep.credits(rx.gid(), PORT) != Some(window as u32) {
        assert!(start.elapsed() < WAIT, "the owed credits never arrived");
        std::thread::sleep(Duration::from_micros(200));
    }
    let start = Instant::now();
    while ep.in_flight_regions() > 0 {
        assert!(start.elapsed() < WAIT, "the Release never arrived");
        std::thread::sleep(Duration::from_micros(200));
    }
    // And the channel carries on, in order.
    for i in window..3 * window {
        ep.push(rx.gid(), PORT, &body(i, 100)).expect("push");
        let m = port.pop().expect("pop");
        assert_eq!((m.seq, m.to_vec()), (i, body(i, 100)));
    }
    assert_eq!(rx.msg_stats().out_of_order, 0);
}

/// The sender's NIC fails every WR to the receiver for a moment (FaultNic
/// `drop_node`): message SENDs the endpoint accepted (their pushes
/// returned `Ok`) complete with `RETRY_EXC_ERR` (a WR posted behind a failed
/// one would be flushed, `WR_FLUSH_ERR`). The endpoint's next pushes report
/// each lost message as `Lost` (its seq and status), once, in order, sending
/// nothing; the receiver gets exactly the others, intact and in order, and
/// the channel has its whole window back.
#[test]
fn an_endpoints_failed_send_reports_every_lost_message() {
    use krcore_nic::WcStatus;
    let c = Cluster::new();
    let rx = node(&c, |_| {});
    let (tx, faults) = fault_node(&c, 7);
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    // Message `i` carries body(i); the k-th accepted push has seq k.
    let mut accepted: Vec<u64> = Vec::new();
    let mut lost: Vec<(u64, WcStatus)> = Vec::new();
    let mut next = 0u64;
    let mut push = |accepted: &mut Vec<u64>, lost: &mut Vec<(u64, WcStatus)>| match ep.push(
        rx.gid(),
        PORT,
        &body(next, 100),
    ) {
        Ok(()) => {
            accepted.push(next);
            next += 1;
        }
        Err(MsgError::Lost {
            gid,
            port: p,
            seq,
            status,
        }) => {
            assert_eq!((gid, p), (rx.gid(), PORT));
            lost.push((seq, status));
        }
        Err(e) => panic!("push: {e}"),
    };
    for _ in 0..3 {
        push(&mut accepted, &mut lost);
    }
    assert_eq!((accepted.len(), lost.len()), (3, 0));
    faults.drop_node(rx.gid());
    while accepted.len() < 6 {
        push(&mut accepted, &mut lost);
        assert!(lost.len() <= 3, "{lost:?}");
    }
    faults.restore_node(rx.gid());
    while accepted.len() < 9 {
        push(&mut accepted, &mut lost);
        assert!(lost.len() <= 3, "{lost:?}");
    }
    // The three accepted while the receiver was unreachable, each once,
    // in order; nothing accepted after.
    assert_eq!(
        lost.iter().map(|l| l.0).collect::<Vec<_>>(),
        vec![3, 4, 5],
        "{lost:?}"
    );
    assert!(lost
        .iter()
        .all(|l| matches!(l.1, WcStatus::RetryExcErr | WcStatus::WrFlushErr)));
    assert_eq!(lost[0].1, WcStatus::RetryExcErr, "the first one failed");
    let failed = lost.iter().filter(|l| l.1 == WcStatus::RetryExcErr).count();
    assert_eq!(faults.stats().dropped_wrs, failed as u64);
    assert_eq!(tx.msg_stats().send_errors, 3);
    // The receiver gets exactly the others, intact, in order.
    for (seq, &i) in accepted.iter().enumerate() {
        if (3..6).contains(&seq) {
            continue;
        }
        let m = port.pop().expect("pop");
        assert_eq!((m.seq, m.to_vec()), (seq as u64, body(i, 100)));
    }
    assert!(port.try_pop().expect("try_pop").is_none());
    let s = rx.msg_stats();
    assert_eq!(s.out_of_order, 1, "the gap of the lost ones: {s:?}");
    // Their credits are back: a full window once the others are popped.
    port.return_credits().expect("return");
    let start = Instant::now();
    while ep.credits(rx.gid(), PORT) != Some(tx.config().msg.window) {
        assert!(
            start.elapsed() < WAIT,
            "credits: {:?}",
            ep.credits(rx.gid(), PORT)
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The same for a port's replies: the port's node cannot reach the
/// endpoint's for a moment; each reply accepted then is reported by the
/// port's next replies as `ReplyLost`, and the endpoint gets the others.
#[test]
fn a_ports_failed_reply_is_reported_by_its_next_replies() {
    use krcore_kmod::Sender;
    use krcore_nic::WcStatus;
    let c = Cluster::new();
    let (rx, faults) = fault_node(&c, 11);
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    ep.push(rx.gid(), PORT, &body(0, 16)).expect("push");
    let m = port.pop().expect("pop");
    let to = m.from;
    assert_eq!(
        to,
        Sender {
            gid: tx.gid(),
            vqp: ep.id()
        }
    );
    let window = tx.config().msg.reply_window as usize;
    let mut accepted: Vec<u64> = Vec::new();
    let mut lost: Vec<(u64, WcStatus)> = Vec::new();
    let mut next = 0u64;
    let mut reply = |accepted: &mut Vec<u64>, lost: &mut Vec<(u64, WcStatus)>| match port
        .reply_to(to, &body(next, 40))
    {
        Ok(()) => {
            accepted.push(next);
            next += 1;
        }
        Err(MsgError::ReplyLost { to: t, seq, status }) => {
            assert_eq!(t, to);
            lost.push((seq, status));
        }
        Err(e) => panic!("reply: {e}"),
    };
    reply(&mut accepted, &mut lost);
    faults.drop_node(tx.gid());
    while accepted.len() < 3 {
        reply(&mut accepted, &mut lost);
        assert!(lost.len() <= 2, "{lost:?}");
    }
    faults.restore_node(tx.gid());
    while lost.len() < 2 {
        reply(&mut accepted, &mut lost);
        assert!(accepted.len() <= 3, "{accepted:?} {lost:?}");
    }
    assert_eq!(lost.iter().map(|l| l.0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(lost[0].1, WcStatus::RetryExcErr);
    // The endpoint gets reply 0 and, after the gap, the next ones.
    let r = ep.pop_reply().expect("reply 0");
    assert_eq!((r.seq, r.to_vec()), (0, body(0, 40)));
    for _ in 0..window - 1 {
        reply(&mut accepted, &mut lost);
    }
    assert_eq!(lost.len(), 2, "nothing lost once reachable");
    for (seq, &i) in accepted.iter().enumerate().skip(3) {
        let r = ep.pop_reply().expect("reply");
        assert_eq!((r.seq, r.to_vec()), (seq as u64, body(i, 40)));
    }
}

/// The port's answer to an Open is lost (the port's NIC fails every WR to
/// the sender for a moment, `drop_node`): the endpoint sends its Open again
/// while the push waits, the port answers the repeat with the same grant,
/// and the message the Open carried is delivered once.
#[test]
fn a_lost_answer_to_an_open_is_answered_again() {
    let c = Cluster::new();
    let (rx, faults) = fault_node(&c, 7);
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    faults.drop_node(tx.gid());
    let restore = {
        let faults = faults.clone();
        let gid = tx.gid();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            faults.restore_node(gid);
        })
    };
    ep.push(rx.gid(), PORT, b"once")
        .expect("push after a lost Grant");
    restore.join().unwrap();
    assert!(faults.stats().dropped_wrs >= 1, "a Grant was lost");
    assert!(tx.msg_stats().open_resent >= 1, "{:?}", tx.msg_stats());
    assert_eq!(port.pop().expect("pop").to_vec(), b"once");
    ep.push(rx.gid(), PORT, b"next").expect("push");
    assert_eq!(port.pop().expect("pop").to_vec(), b"next");
    assert!(port.try_pop().expect("try_pop").is_none(), "delivered once");
    assert_eq!(rx.msg_stats().out_of_order, 0);
}

/// A Credit the NIC fails after it was posted (the sender unreachable for a
/// moment) is made up by the next one, which carries the cumulative total:
/// the sender's window comes back whole, not one batch short for good.
#[test]
fn a_credit_lost_after_its_post_is_made_up_by_the_next() {
    let c = Cluster::new();
    let (rx, faults) = fault_node(&c, 11);
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).expect("bind");
    // Window 2: every pop sends a Credit back (half the window).
    let ep = tx.endpoint_with_window(2).expect("endpoint");
    ep.push(rx.gid(), PORT, b"a").expect("push a");
    ep.push(rx.gid(), PORT, b"b").expect("push b");
    assert_eq!(ep.credits(rx.gid(), PORT), Some(0));
    faults.drop_node(tx.gid());
    assert_eq!(port.pop().expect("pop a").to_vec(), b"a");
    wait_until(
        || {
            format!(
                "the Credit was never dropped: {:?} {:?}",
                faults.stats(),
                rx.msg_stats()
            )
        },
        || faults.stats().dropped_wrs > 0,
    );
    faults.restore_node(tx.gid());
    assert_eq!(ep.credits(rx.gid(), PORT), Some(0), "that Credit was lost");
    assert_eq!(port.pop().expect("pop b").to_vec(), b"b");
    wait_until(
        || {
            format!(
                "the window stayed short: {:?} credits",
                ep.credits(rx.gid(), PORT)
            )
        },
        || ep.credits(rx.gid(), PORT) == Some(2),
    );
    // The whole window is usable again.
    ep.push(rx.gid(), PORT, b"c").expect("push c");
    ep.push(rx.gid(), PORT, b"d").expect("push d");
    assert_eq!(port.pop().expect("pop c").to_vec(), b"c");
    assert_eq!(port.pop().expect("pop d").to_vec(), b"d");
    assert_eq!(rx.msg_stats().out_of_order, 0);
}

/// The last Credit of a burst is lost (nothing comes after it to make it
/// up): a push that waits for a credit asks the port again (a repeated
/// Open), and the port answers with the credits returned so far.
#[test]
fn a_push_left_waiting_by_a_lost_credit_asks_for_it() {
    let c = Cluster::new();
    let (rx, faults) = fault_node(&c, 13);
    let tx = node(&c, |_| {});
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint_with_window(2).expect("endpoint");
    ep.push(rx.gid(), PORT, b"a").expect("push a");
    ep.push(rx.gid(), PORT, b"b").expect("push b");
    assert_eq!(port.pop().expect("pop a").to_vec(), b"a");
    wait_until(
        || "a's credit never came".into(),
        || ep.credits(rx.gid(), PORT) == Some(1),
    );
    // b's Credit is the last one, and it is lost.
    faults.drop_node(tx.gid());
    assert_eq!(port.pop().expect("pop b").to_vec(), b"b");
    wait_until(
        || "b's Credit was never dropped".into(),
        || faults.stats().dropped_wrs > 0,
    );
    faults.restore_node(tx.gid());
    assert_eq!(ep.credits(rx.gid(), PORT), Some(1), "b's Credit was lost");
    // c takes the one credit left; d waits for the lost one and asks.
    ep.push(rx.gid(), PORT, b"c").expect("push c");
    ep.push(rx.gid(), PORT, b"d")
        .expect("push d after a lost Credit");
    assert!(tx.msg_stats().credits_asked >= 1, "{:?}", tx.msg_stats());
    assert_eq!(port.pop().expect("pop c").to_vec(), b"c");
    assert_eq!(port.pop().expect("pop d").to_vec(), b"d");
    assert!(port.try_pop().expect("try_pop").is_none(), "delivered once");
    assert_eq!(rx.msg_stats().out_of_order, 0);
}

/// Both reply Credits of an endpoint are lost (two pops, two drops): the
/// port has no reply credit and the endpoint has nothing left to pop, so
/// no later Credit would make them up. The port's waiting reply asks the
/// endpoint again (the channel's Grant repeated); the endpoint, waiting
/// for that reply, sends its total again.
#[test]
fn a_reply_left_waiting_by_lost_credits_asks_for_them() {
    let c = Cluster::new();
    let (tx, faults) = fault_node_with(&c, 17, |cfg| cfg.msg.reply_window = 2);
    let rx = node(&c, |_| {});
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    ep.push(rx.gid(), PORT, b"q").expect("push");
    let q = port.pop().expect("pop q");
    port.reply(&q, b"r1").expect("reply r1");
    port.reply(&q, b"r2").expect("reply r2");
    // Both of the endpoint's Credits (one per pop: half of 2) are lost.
    faults.drop_node(rx.gid());
    for (i, r) in [&b"r1"[..], b"r2"].into_iter().enumerate() {
        assert_eq!(ep.pop_reply().expect("pop reply").to_vec(), r);
        wait_until(
            || format!("Credit {} was never dropped", i + 1),
            || faults.stats().dropped_wrs > i as u64,
        );
    }
    faults.restore_node(rx.gid());
    let replier = std::thread::spawn(move || {
        let r = port.reply(&q, b"r3");
        (r, port)
    });
    assert_eq!(
        ep.pop_reply().expect("r3 after lost Credits").to_vec(),
        b"r3"
    );
    let (r, _port) = replier.join().unwrap();
    r.expect("reply r3");
    assert!(rx.msg_stats().credits_asked >= 1, "{:?}", rx.msg_stats());
}

/// A descriptor READ given up on (its sender stalled past the messaging
/// timeout) completes later: that late completion must not be taken for
/// a later READ's, which would deliver a body that has not landed, or
/// fail a pop whose own READ succeeds.
#[test]
fn a_late_pull_completion_does_not_complete_the_next_pull() {
    let c = Cluster::new();
    let tx = node(&c, |cfg| cfg.msg.inline_max = 256);
    let (rx, faults) = fault_node_with(&c, 11, |cfg| {
        cfg.msg.inline_max = 256;
        cfg.msg.timeout = Duration::from_millis(100);
    });
    let port = rx.bind(PORT).expect("bind");
    let ep = tx.endpoint().expect("endpoint");
    let queued = |n: usize| {
        wait_until(
            || format!("{n} message(s) never arrived"),
            || port.queued() >= n,
        );
    };
    // A descriptor whose body is READ from the sender at pop time, while
    // the receiver's NIC cannot reach the sender: the pop gives up.
    ep.push(rx.gid(), PORT, &body(1, 1000)).expect("push");
    queued(1);
    faults.stall_node(tx.gid());
    let first = port.try_pop();
    assert!(first.is_err(), "{first:?}");
    // The stall ends: the held READ runs and completes now.
    faults.resume_node(tx.gid());
    faults.release_held();
    // The next descriptor's READ is held again: its pop must not return
    // on the first READ's completion.
    ep.push(rx.gid(), PORT, &body(2, 1000)).expect("push");
    wait_until(
        || "the second message never arrived".into(),
        || port.queued() >= 1,
    );
    faults.stall_node(tx.gid());
    match port.try_pop() {
        Ok(Some(m)) => assert_eq!(m.to_vec(), body(2, 1000), "a body that never landed"),
        Ok(None) => panic!("the second message vanished"),
        // Given up on, or flushed (the late first READ found its landing
        // buffer deregistered and failed the queue): typed either way, and
        // the second READ's own fate, never the first's `LOC_PROT_ERR`.
        Err(e) => assert!(
            matches!(e, MsgError::Timeout(_))
                || matches!(e, MsgError::Failed { status, .. } if status != WcStatus::LocProtErr),
            "{e:?}"
        ),
    }
    // Reachable again: the next message is delivered whole, whatever
    // completions of the READs given up on are still to come.
    faults.resume_node(tx.gid());
    faults.release_held();
    ep.push(rx.gid(), PORT, &body(3, 1000)).expect("push");
    wait_until(
        || "the third message never arrived".into(),
        || port.queued() >= 1,
    );
    let m = port.try_pop().expect("delivered").expect("a message");
    assert_eq!(m.to_vec(), body(3, 1000));
}
