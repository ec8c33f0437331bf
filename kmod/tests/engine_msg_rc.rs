//! Messaging in RC fallback mode (a device without DC, like Soft-RoCE):
//! messages travel over the per-target RC pairs, whose passive ends share
//! the receiving node's SRQ; bind/push/pop/reply, descriptors (zero copy)
//! and credits work as on DC.

mod common;

use std::time::Duration;

use common::fallback::Fabric;
use krcore_kmod::{Engine, EngineConfig, EngineMode, MsgError};
use krcore_nic::sim::SimNic;

const PORT: u16 = 40;

fn cfg() -> EngineConfig {
    let mut cfg = EngineConfig::default().with_handshake_thread(true);
    cfg.msg.progress_thread = true;
    cfg.msg.timeout = Duration::from_secs(10);
    cfg
}

/// An engine with [`cfg`], registered in the meta table (a receiver).
fn registered(f: &Fabric) -> Engine<SimNic> {
    let e = f.engine(cfg());
    f.meta
        .table()
        .register(e.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    e
}

#[test]
fn push_pop_reply_over_rc_pairs() {
    let f = Fabric::new();
    // The receiver registers; the sender registers nowhere (its Open
    // names its handshake endpoint: the receiver answers there).
    let rx = registered(&f);
    let tx = f.engine(cfg());
    assert_eq!(rx.mode(), EngineMode::RcFallback);
    assert!(rx.msg_supported());
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    let inline_max = rx.config().msg.inline_max;
    let sizes = [0usize, 1, 64, 4096, inline_max, inline_max + 1, 256 << 10];
    for (i, &len) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
        ep.push(rx.gid(), PORT, &body).unwrap();
        let m = port.pop().unwrap();
        assert_eq!((m.seq, m.to_vec()), (i as u64, body.clone()), "len {len}");
        assert_eq!(m.is_zero_copy(), len > inline_max);
        port.reply(&m, &body[..len.min(100)]).unwrap();
        let r = ep.pop_reply().unwrap();
        assert_eq!(r.to_vec(), &body[..len.min(100)]);
    }
    // Over RC pairs: one each way, made by UD handshakes; no DCT.
    let (rs, ts) = (rx.stats(), tx.stats());
    assert_eq!((rs.dcts_created, ts.dcts_created), (0, 0));
    assert_eq!((rs.rc.created, ts.rc.created), (1, 1), "{rs:?} {ts:?}");
    let ms = rx.msg_stats();
    assert_eq!(
        (ms.out_of_order, ms.malformed, ms.granted),
        (0, 0, 1),
        "{ms:?}"
    );
    assert_eq!(ms.pulled, 2, "the two descriptors, one READ each");
}

#[test]
fn a_slow_receiver_stalls_the_sender_without_loss_over_rc() {
    let f = Fabric::new();
    let rx = registered(&f);
    let tx = f.engine(cfg());
    let port = rx.bind(PORT).unwrap();
    let ep = tx.endpoint().unwrap();
    let window = tx.config().msg.window as u64;
    for i in 0..window {
        ep.push(rx.gid(), PORT, &i.to_le_bytes()).unwrap();
    }
    // The window is used up: no credit until the receiver pops.
    assert!(matches!(
        ep.try_push(rx.gid(), PORT, b"x"),
        Err(MsgError::WouldBlock)
    ));
    for i in 0..window {
        assert_eq!(port.pop().unwrap().to_vec(), i.to_le_bytes());
    }
    port.return_credits().unwrap();
    ep.push(rx.gid(), PORT, b"again").unwrap();
    assert_eq!(port.pop().unwrap().to_vec(), b"again");
    assert_eq!(rx.msg_stats().out_of_order, 0);
}

/// A sender talking to two receivers alternately moves its VQP between two
/// RC pairs (its sends are signaled in RC mode, so each move finds none in
/// flight).
#[test]
fn one_endpoint_to_two_receivers_over_rc() {
    let f = Fabric::new();
    let (a, b) = (registered(&f), registered(&f));
    let tx = f.engine(cfg());
    let (pa, pb) = (a.bind(PORT).unwrap(), b.bind(PORT).unwrap());
    let ep = tx.endpoint().unwrap();
    for i in 0u64..50 {
        let (to, port) = if i % 2 == 0 { (&a, &pa) } else { (&b, &pb) };
        ep.push(to.gid(), PORT, &i.to_le_bytes()).unwrap();
        assert_eq!(port.pop().unwrap().to_vec(), i.to_le_bytes());
    }
    assert_eq!(tx.stats().rc.created, 2);
}
