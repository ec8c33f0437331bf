//! The provider conformance suite: the semantics of DESIGN 3, written once,
//! generic over [`Nic`], so that every provider (the `sim` on both fabric
//! kinds, the `verbs` provider on Soft-RoCE or hardware) runs the same checks.
//!
//! Every check takes two nodes `a` (initiator) and `b` (target). They may be
//! two contexts of the same device. Checks panic with a message on failure,
//! like test assertions; they never hang (every wait is bounded).
//!
//! The DC checks need [`crate::DeviceCaps::dc`]; [`run_all`] skips them on
//! devices without DC and says so.

use crate::provider::{
    bring_up, CompletionQueue, MemoryRegion, Nic, QpInit, QueuePair, SharedReceiveQueue,
};
use crate::types::*;
use crate::{NicError, PostErrorKind};
use std::time::{Duration, Instant};

mod errors;

pub use errors::{
    cq_overflow, doorbell_batching, error_completions, error_completions_with, overflowing_cq, rnr,
    send_credits, state_machine, sub_regions, Quirks,
};

/// How long a check waits for a completion before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// One node's objects for a check: PD, one CQ, one registered buffer.
pub struct Side<N: Nic> {
    pub nic: N,
    pub pd: N::Pd,
    pub cq: N::Cq,
    pub mr: N::Mr,
}

impl<N: Nic> std::fmt::Debug for Side<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("gid", &self.nic.gid())
            .finish()
    }
}

impl<N: Nic + Clone> Side<N> {
    /// A PD, a CQ of 256 entries and a `len`-byte MR with every access flag.
    pub fn new(nic: &N, len: usize) -> Side<N> {
        Self::with_access(nic, len, Access::ALL)
    }

    /// Like [`Side::new`] with chosen MR access flags.
    pub fn with_access(nic: &N, len: usize, access: Access) -> Side<N> {
        let pd = nic.alloc_pd().expect("alloc_pd");
        let cq = nic.create_cq(256).expect("create_cq");
        let mr = nic.alloc_mr(&pd, len, access).expect("alloc_mr");
        Side {
            nic: nic.clone(),
            pd,
            cq,
            mr,
        }
    }

    /// Creates a QP of `t` on this side in RESET.
    pub fn qp(&self, t: QpType, caps: QpCaps, srq: Option<&N::Srq>, dc_key: u64) -> N::Qp {
        self.nic
            .create_qp(
                &self.pd,
                &QpInit {
                    qp_type: t,
                    caps,
                    send_cq: &self.cq,
                    recv_cq: &self.cq,
                    srq,
                    dc_key,
                },
            )
            .expect("create_qp")
    }
}

/// Brings two RC QPs in RESET up to RTS, each connected to the other.
pub fn connect_rc<Q: QueuePair>(qa: &Q, gid_a: Gid, qb: &Q, gid_b: Gid) {
    bring_up(
        qa,
        Access::ALL,
        Some(RcPeer {
            gid: gid_b,
            qpn: qb.qpn(),
        }),
    )
    .expect("bring up a");
    bring_up(
        qb,
        Access::ALL,
        Some(RcPeer {
            gid: gid_a,
            qpn: qa.qpn(),
        }),
    )
    .expect("bring up b");
}

/// Connects an RC pair between `a` and `b` (both brought to RTS).
pub fn rc_pair<N: Nic + Clone>(a: &Side<N>, b: &Side<N>, caps: QpCaps) -> (N::Qp, N::Qp) {
    let qa = a.qp(QpType::Rc, caps, None, 0);
    let qb = b.qp(QpType::Rc, caps, None, 0);
    connect_rc(&qa, a.nic.gid(), &qb, b.nic.gid());
    (qa, qb)
}

/// Polls one completion, waiting at most [`WAIT`].
pub fn poll_one<C: CompletionQueue>(cq: &C) -> Wc {
    let start = Instant::now();
    let mut wc = [Wc::default()];
    loop {
        match cq.poll(&mut wc) {
            Ok(1) => return wc[0],
            Ok(_) => {}
            Err(e) => panic!("poll failed: {e}"),
        }
        assert!(start.elapsed() < WAIT, "no completion within {WAIT:?}");
        std::hint::spin_loop();
    }
}

/// Polls `n` completions.
pub fn poll_n<C: CompletionQueue>(cq: &C, n: usize) -> Vec<Wc> {
    (0..n).map(|_| poll_one(cq)).collect()
}

/// Asserts that no completion arrives within `d`.
pub fn expect_quiet<C: CompletionQueue>(cq: &C, d: Duration) {
    let start = Instant::now();
    let mut wc = [Wc::default()];
    while start.elapsed() < d {
        let n = cq.poll(&mut wc).expect("poll");
        assert_eq!(n, 0, "unexpected completion {:?}", wc[0]);
    }
}

fn ok(wc: &Wc, wr_id: u64) {
    assert_eq!(wc.status, WcStatus::Success, "wr {wr_id}: {wc:?}");
    assert_eq!(wc.wr_id, wr_id);
}

/// READ, WRITE, inline WRITE and multi-SGE scatter/gather on RC.
pub fn rc_read_write<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let caps = QpCaps {
        max_send_sge: 2,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&sa, &sb, caps);
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
    sb.mr.write(128, &pattern).unwrap();
    qa.post_send(&[SendWr::read(
        1,
        sa.mr.sge(0, 64).unwrap(),
        sb.mr.remote(128),
    )])
    .unwrap();
    let wc = poll_one(&sa.cq);
    ok(&wc, 1);
    assert_eq!(wc.opcode, WcOpcode::RdmaRead);
    let mut got = [0u8; 64];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(&got[..], &pattern[..], "READ returns the target's bytes");

    sa.mr.write(256, b"hello, remote memory").unwrap();
    qa.post_send(&[SendWr::write(
        2,
        sa.mr.sge(256, 20).unwrap(),
        sb.mr.remote(1000),
    )])
    .unwrap();
    ok(&poll_one(&sa.cq), 2);
    let mut got = [0u8; 20];
    sb.mr.read(1000, &mut got).unwrap();
    assert_eq!(&got, b"hello, remote memory");

    let inline = SendWr {
        wr_id: 3,
        op: WrOp::Write {
            remote: sb.mr.remote(2000),
        },
        payload: Payload::Inline(InlineData::new(b"inline!").unwrap()),
        flags: SendFlags::SIGNALED,
        dest: Destination::Connected,
    };
    sa.mr.write(0, &[0u8; 8]).unwrap();
    qa.post_send(&[inline]).unwrap();
    ok(&poll_one(&sa.cq), 3);
    let mut got = [0u8; 7];
    sb.mr.read(2000, &mut got).unwrap();
    assert_eq!(&got, b"inline!");

    // Scatter a 16-byte READ into two 8-byte pieces far apart.
    sb.mr.write(3000, b"0123456789abcdef").unwrap();
    let sg =
        SgList::from_slice(&[sa.mr.sge(3000, 8).unwrap(), sa.mr.sge(3500, 8).unwrap()]).unwrap();
    let mut rd = SendWr::read(4, sa.mr.sge(0, 1).unwrap(), sb.mr.remote(3000));
    rd.payload = Payload::Local(sg);
    qa.post_send(&[rd]).unwrap();
    ok(&poll_one(&sa.cq), 4);
    let (mut x, mut y) = ([0u8; 8], [0u8; 8]);
    sa.mr.read(3000, &mut x).unwrap();
    sa.mr.read(3500, &mut y).unwrap();
    assert_eq!((&x, &y), (b"01234567", b"89abcdef"));
}

/// CAS and FAA return the old value and act atomically.
pub fn rc_atomics<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    sb.mr.store_u64(64, 5).unwrap();
    qa.post_send(&[SendWr::cas(
        1,
        sa.mr.sge(0, 8).unwrap(),
        sb.mr.remote(64),
        5,
        9,
    )])
    .unwrap();
    let wc = poll_one(&sa.cq);
    ok(&wc, 1);
    assert_eq!(wc.opcode, WcOpcode::CompSwap);
    assert_eq!(sa.mr.load_u64(0).unwrap(), 5, "CAS returns the old value");
    assert_eq!(sb.mr.load_u64(64).unwrap(), 9, "CAS swapped");
    qa.post_send(&[SendWr::cas(
        2,
        sa.mr.sge(0, 8).unwrap(),
        sb.mr.remote(64),
        5,
        11,
    )])
    .unwrap();
    ok(&poll_one(&sa.cq), 2);
    assert_eq!(
        sa.mr.load_u64(0).unwrap(),
        9,
        "failed CAS returns the current value"
    );
    assert_eq!(
        sb.mr.load_u64(64).unwrap(),
        9,
        "failed CAS leaves memory alone"
    );
    for i in 0..10 {
        qa.post_send(&[SendWr::faa(
            10 + i,
            sa.mr.sge(8, 8).unwrap(),
            sb.mr.remote(64),
            3,
        )])
        .unwrap();
        ok(&poll_one(&sa.cq), 10 + i);
        assert_eq!(sa.mr.load_u64(8).unwrap(), 9 + 3 * i);
    }
    assert_eq!(sb.mr.load_u64(64).unwrap(), 39);
}

/// SEND, SEND with immediate and WRITE with immediate into posted receives.
pub fn rc_send_recv<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let (qa, qb) = rc_pair(&sa, &sb, QpCaps::default());
    qb.post_recv(&[
        RecvWr::new(100, sb.mr.sge(0, 256).unwrap()),
        RecvWr::new(101, sb.mr.sge(256, 256).unwrap()),
        RecvWr::new(102, sb.mr.sge(512, 256).unwrap()),
    ])
    .unwrap();
    sa.mr.write(0, b"first message").unwrap();
    qa.post_send(&[SendWr::send(1, sa.mr.sge(0, 13).unwrap(), None)])
        .unwrap();
    let mut seen = vec![];
    for wc in poll_n(&sa.cq, 1).into_iter().chain(poll_n(&sb.cq, 1)) {
        seen.push(wc);
    }
    let recv = seen
        .iter()
        .find(|w| w.wr_id == 100)
        .expect("receive completion");
    assert_eq!(recv.status, WcStatus::Success);
    assert_eq!(recv.opcode, WcOpcode::Recv);
    assert_eq!(recv.byte_len, 13);
    assert_eq!(recv.imm, None);
    assert_eq!(recv.qp_num, qb.qpn());
    let mut got = [0u8; 13];
    sb.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"first message");

    qa.post_send(&[SendWr::send(2, sa.mr.sge(0, 5).unwrap(), Some(0xfeed))])
        .unwrap();
    ok(&poll_one(&sa.cq), 2);
    let wc = poll_one(&sb.cq);
    assert_eq!((wc.wr_id, wc.imm, wc.byte_len), (101, Some(0xfeed), 5));

    sa.mr.write(64, b"written+imm").unwrap();
    let wimm = SendWr {
        wr_id: 3,
        op: WrOp::WriteImm {
            remote: sb.mr.remote(2048),
            imm: 77,
        },
        payload: Payload::Local(SgList::one(sa.mr.sge(64, 11).unwrap())),
        flags: SendFlags::SIGNALED,
        dest: Destination::Connected,
    };
    qa.post_send(&[wimm]).unwrap();
    ok(&poll_one(&sa.cq), 3);
    let wc = poll_one(&sb.cq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm),
        (102, WcOpcode::RecvRdmaWithImm, Some(77))
    );
    let mut got = [0u8; 11];
    sb.mr.read(2048, &mut got).unwrap();
    assert_eq!(&got, b"written+imm");
}

/// Two RC QPs receiving through one SRQ.
pub fn srq_shared<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let srq = b.create_srq(&sb.pd, 16, 1).expect("create_srq");
    let caps = QpCaps {
        max_recv_wr: 0,
        ..QpCaps::default()
    };
    let mut pairs = vec![];
    for _ in 0..2 {
        let qa = sa.qp(QpType::Rc, caps, None, 0);
        let qb = sb.qp(QpType::Rc, caps, Some(&srq), 0);
        connect_rc(&qa, a.gid(), &qb, b.gid());
        pairs.push((qa, qb));
    }
    srq.post_recv(&[
        RecvWr::new(7, sb.mr.sge(0, 64).unwrap()),
        RecvWr::new(8, sb.mr.sge(64, 64).unwrap()),
    ])
    .unwrap();
    for (i, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(&[SendWr::send(
            i as u64,
            sa.mr.sge(0, 16).unwrap(),
            Some(i as u32),
        )])
        .unwrap();
        ok(&poll_one(&sa.cq), i as u64);
    }
    let mut got: Vec<(u64, u32, Option<u32>)> = poll_n(&sb.cq, 2)
        .iter()
        .map(|w| {
            assert_eq!(w.status, WcStatus::Success);
            (w.wr_id, w.qp_num, w.imm)
        })
        .collect();
    got.sort();
    let mut want: Vec<(u64, u32, Option<u32>)> = vec![
        (7, pairs[0].1.qpn(), Some(0)),
        (8, pairs[1].1.qpn(), Some(1)),
    ];
    want.sort();
    assert_eq!(got, want, "SRQ buffers consumed in order by both QPs");
}

/// UD: datagrams with a GRH in front, and a wrong qkey dropped silently.
pub fn ud_datagrams<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let qa = sa.qp(QpType::Ud, QpCaps::default(), None, 0);
    let qb = sb.qp(QpType::Ud, QpCaps::default(), None, 0);
    for q in [&qa, &qb] {
        q.modify(Transition::Init {
            access: Access::NONE,
            qkey: 0x1111,
        })
        .unwrap();
        q.modify(Transition::Rtr { peer: None }).unwrap();
        q.modify(Transition::Rts {
            rnr_retry: 0,
            retry_cnt: 0,
        })
        .unwrap();
    }
    qb.post_recv(&[RecvWr::new(9, sb.mr.sge(0, 512).unwrap())])
        .unwrap();
    sa.mr.write(0, b"datagram").unwrap();
    let to = |qkey| {
        Destination::Ud(UdTarget {
            gid: b.gid(),
            qpn: qb.qpn(),
            qkey,
        })
    };
    qa.post_send(&[SendWr::send(1, sa.mr.sge(0, 8).unwrap(), None).to(to(0x2222))])
        .unwrap();
    ok(&poll_one(&sa.cq), 1);
    expect_quiet(&sb.cq, Duration::from_millis(20));
    qa.post_send(&[SendWr::send(2, sa.mr.sge(0, 8).unwrap(), None).to(to(0x1111))])
        .unwrap();
    ok(&poll_one(&sa.cq), 2);
    let wc = poll_one(&sb.cq);
    assert_eq!(
        (wc.wr_id, wc.byte_len),
        (9, (GRH_LEN + 8) as u32),
        "GRH counts in byte_len"
    );
    assert_eq!(wc.src_qp, qa.qpn());
    let mut got = [0u8; 8];
    sb.mr.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    // A READ on UD is refused at post time.
    let err = qa
        .post_send(&[SendWr::read(3, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)).to(to(0x1111))])
        .unwrap_err();
    assert!(matches!(err.kind, PostErrorKind::Malformed(_)), "{err}");
}

/// DC: a DCI reaches a DCT named per WR; target switches are counted; a wrong
/// dc_key is refused.
pub fn dc_ops<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let srq = b.create_srq(&sb.pd, 16, 1).unwrap();
    let dct = sb.qp(QpType::Dct, QpCaps::default(), Some(&srq), 0xdc0de);
    bring_up(&dct, Access::ALL, None).unwrap();
    let dct2 = sb.qp(QpType::Dct, QpCaps::default(), Some(&srq), 0xbeef);
    bring_up(&dct2, Access::ALL, None).unwrap();
    let dci = sa.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    let t1 = Destination::Dc(DcTarget {
        gid: b.gid(),
        dct_num: dct.qpn(),
        dc_key: 0xdc0de,
    });
    let t2 = Destination::Dc(DcTarget {
        gid: b.gid(),
        dct_num: dct2.qpn(),
        dc_key: 0xbeef,
    });
    let before = a.counters();
    sb.mr.write(0, b"dc-read!").unwrap();
    dci.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)).to(t1)])
        .unwrap();
    ok(&poll_one(&sa.cq), 1);
    let mut got = [0u8; 8];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"dc-read!");
    dci.post_send(&[SendWr::cas(2, sa.mr.sge(8, 8).unwrap(), sb.mr.remote(64), 0, 42).to(t2)])
        .unwrap();
    ok(&poll_one(&sa.cq), 2);
    assert_eq!(sb.mr.load_u64(64).unwrap(), 42);
    srq.post_recv(&[RecvWr::new(50, sb.mr.sge(1024, 64).unwrap())])
        .unwrap();
    dci.post_send(&[SendWr::send(3, sa.mr.sge(0, 8).unwrap(), Some(5)).to(t1)])
        .unwrap();
    ok(&poll_one(&sa.cq), 3);
    let wc = poll_one(&sb.cq);
    assert_eq!((wc.wr_id, wc.imm, wc.qp_num), (50, Some(5), dct.qpn()));
    let d = a.counters() - before;
    assert!(
        d.dc_target_switches >= 3,
        "t1 -> t2 -> t1 is 3 switches: {d:?}"
    );
    assert_eq!(d.qps_created, 0);

    let wrong = Destination::Dc(DcTarget {
        gid: b.gid(),
        dct_num: dct.qpn(),
        dc_key: 0xbad,
    });
    dci.post_send(&[SendWr::read(4, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)).to(wrong)])
        .unwrap();
    let wc = poll_one(&sa.cq);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RemAccessErr));
    assert_eq!(dci.state(), QpState::Err);
}

/// Runs every check. DC checks are skipped (with a note on stderr) on devices
/// without DC.
pub fn run_all<N: Nic + Clone>(a: &N, b: &N) {
    rc_read_write(a, b);
    rc_atomics(a, b);
    rc_send_recv(a, b);
    srq_shared(a, b);
    ud_datagrams(a, b);
    error_completions(a, b);
    rnr(a, b);
    send_credits(a, b);
    state_machine(a, b);
    doorbell_batching(a, b);
    cq_overflow(a, b);
    sub_regions(a, b);
    if a.caps().dc && b.caps().dc {
        dc_ops(a, b);
    } else {
        eprintln!("conformance: device has no DC; DC checks skipped");
    }
}
