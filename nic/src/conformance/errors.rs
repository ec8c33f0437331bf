//! The conformance checks of what goes wrong (see the module docs of
//! `conformance`): error completions and a QP's move to ERR, RNR, send-queue
//! credits, the state machine, CQ overflow, and sub-regions' bounds.

use super::*;

/// Behaviour where a device legitimately departs from the sim (verbs allows
/// both), for [`error_completions_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// The device refuses a misaligned atomic when it is posted (rxe:
    /// `EINVAL`, nothing posted, QP still RTS) instead of completing it with
    /// `REM_INV_REQ_ERR` and entering ERR.
    pub misaligned_atomic_refused_at_post: bool,
}

/// Every remote and local protection error is a completion, not a panic; the
/// QP enters ERR and later WRs flush until reset; reset + bring-up recovers.
pub fn error_completions<N: Nic + Clone>(a: &N, b: &N) {
    error_completions_with(a, b, Quirks::default());
}

/// [`error_completions`] for a device with [`Quirks`].
pub fn error_completions_with<N: Nic + Clone>(a: &N, b: &N, quirks: Quirks) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let ro = b
        .alloc_mr(&sb.pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let cases: Vec<(&str, SendWr, WcStatus)> = vec![
        (
            "bad rkey",
            SendWr::read(
                1,
                sa.mr.sge(0, 8).unwrap(),
                RemoteAddr {
                    addr: sb.mr.addr(),
                    rkey: sb.mr.rkey() ^ 0x5a5a00,
                },
            ),
            WcStatus::RemAccessErr,
        ),
        (
            "out of bounds",
            SendWr::read(1, sa.mr.sge(0, 64).unwrap(), sb.mr.remote(4096 - 32)),
            WcStatus::RemAccessErr,
        ),
        (
            "missing REMOTE_WRITE",
            SendWr::write(1, sa.mr.sge(0, 8).unwrap(), ro.remote(0)),
            WcStatus::RemAccessErr,
        ),
        (
            "misaligned atomic",
            SendWr::cas(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(4), 0, 1),
            WcStatus::RemInvReqErr,
        ),
        (
            "bad lkey",
            SendWr::read(
                1,
                Sge {
                    addr: sa.mr.addr(),
                    length: 8,
                    lkey: sa.mr.lkey() ^ 0x7f7f00,
                },
                sb.mr.remote(0),
            ),
            WcStatus::LocProtErr,
        ),
        (
            "SGE outside its MR",
            SendWr::read(
                1,
                Sge {
                    addr: sa.mr.addr() + 4090,
                    length: 16,
                    lkey: sa.mr.lkey(),
                },
                sb.mr.remote(0),
            ),
            WcStatus::LocProtErr,
        ),
    ];
    let atomic_at_post = quirks.misaligned_atomic_refused_at_post;
    for (what, wr, status) in cases {
        if atomic_at_post && what == "misaligned atomic" {
            let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
            let good = SendWr::read(2, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0));
            let e = qa.post_send(&[wr.signaled(false), good]).unwrap_err();
            assert_eq!(e.index, 0, "{e}");
            assert!(matches!(e.kind, PostErrorKind::Malformed(_)), "{e}");
            assert_eq!(
                qa.state(),
                QpState::Rts,
                "a refused post leaves the QP alone"
            );
            assert_eq!(qa.send_credits(), qa.max_send_wr(), "nothing was posted");
            qa.post_send(&[good]).unwrap();
            ok(&poll_one(&sa.cq), 2);
            continue;
        }
        let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
        // The bad WR unsignaled, then two good ones: all three complete.
        let good = SendWr::read(2, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0));
        qa.post_send(&[wr.signaled(false), good, SendWr { wr_id: 3, ..good }])
            .unwrap();
        let wcs = poll_n(&sa.cq, 3);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (1, status),
            "{what}: {wcs:?}"
        );
        assert_eq!(qa.state(), QpState::Err, "{what}: QP must be in ERR");
        for (w, id) in wcs[1..].iter().zip([2, 3]) {
            assert_eq!(
                (w.wr_id, w.status),
                (id, WcStatus::WrFlushErr),
                "{what}: flush"
            );
        }
        // Posting in ERR is accepted and flushed.
        qa.post_send(&[SendWr { wr_id: 4, ..good }]).unwrap();
        assert_eq!(
            poll_one(&sa.cq).status,
            WcStatus::WrFlushErr,
            "{what}: post in ERR"
        );
        // Reset and bring up again: the QP works.
        qa.modify(Transition::Reset).unwrap();
        assert_eq!(qa.state(), QpState::Reset);
        assert_eq!(
            qa.send_credits(),
            qa.max_send_wr(),
            "reset frees every slot"
        );
    }

    // A deregistered MR's key goes stale.
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let tmp = b.alloc_mr(&sb.pd, 4096, Access::ALL).unwrap();
    let stale = tmp.remote(0);
    drop(tmp);
    qa.post_send(&[SendWr::read(5, sa.mr.sge(0, 8).unwrap(), stale)])
        .unwrap();
    assert_eq!(
        poll_one(&sa.cq).status,
        WcStatus::RemAccessErr,
        "stale rkey"
    );

    // Reset + bring-up after an error makes a working QP again.
    let (qa, qb) = rc_pair(&sa, &sb, QpCaps::default());
    qa.post_send(&[SendWr::read(6, sa.mr.sge(0, 8).unwrap(), stale)])
        .unwrap();
    assert_eq!(poll_one(&sa.cq).status, WcStatus::RemAccessErr);
    // A real RC responder that NAKs an access violation moves its own QP to
    // ERR too (IB spec, responder class errors; rxe does, the sim does not):
    // then both ends are reset and reconnected.
    if qb.state() == QpState::Err {
        qb.modify(Transition::Reset).unwrap();
        qa.modify(Transition::Reset).unwrap();
        connect_rc(&qa, a.gid(), &qb, b.gid());
    } else {
        qa.modify(Transition::Reset).unwrap();
        bring_up(
            &qa,
            Access::ALL,
            Some(RcPeer {
                gid: b.gid(),
                qpn: qb.qpn(),
            }),
        )
        .unwrap();
    }
    qa.post_send(&[SendWr::read(7, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
        .unwrap();
    ok(&poll_one(&sa.cq), 7);
}

/// A SEND with no receive posted: RNR retries, then `RNR_RETRY_EXC_ERR`; with
/// infinite retries it waits until a receive arrives.
pub fn rnr<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let qa = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
    let qb = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
    qa.modify(Transition::Init {
        access: Access::ALL,
        qkey: 0,
    })
    .unwrap();
    qa.modify(Transition::Rtr {
        peer: Some(RcPeer {
            gid: b.gid(),
            qpn: qb.qpn(),
        }),
    })
    .unwrap();
    qa.modify(Transition::Rts {
        rnr_retry: 1,
        retry_cnt: 1,
    })
    .unwrap();
    bring_up(
        &qb,
        Access::ALL,
        Some(RcPeer {
            gid: a.gid(),
            qpn: qa.qpn(),
        }),
    )
    .unwrap();
    qa.post_send(&[SendWr::send(1, sa.mr.sge(0, 8).unwrap(), None)])
        .unwrap();
    let wc = poll_one(&sa.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!(qa.state(), QpState::Err);

    // rnr_retry = 7: waits for the receive.
    let (qa, qb) = {
        let qa = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
        let qb = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
        bring_up(
            &qb,
            Access::ALL,
            Some(RcPeer {
                gid: a.gid(),
                qpn: qa.qpn(),
            }),
        )
        .unwrap();
        qa.modify(Transition::Init {
            access: Access::ALL,
            qkey: 0,
        })
        .unwrap();
        qa.modify(Transition::Rtr {
            peer: Some(RcPeer {
                gid: b.gid(),
                qpn: qb.qpn(),
            }),
        })
        .unwrap();
        qa.modify(Transition::Rts {
            rnr_retry: 7,
            retry_cnt: 1,
        })
        .unwrap();
        (qa, qb)
    };
    qa.post_send(&[SendWr::send(2, sa.mr.sge(0, 8).unwrap(), None)])
        .unwrap();
    expect_quiet(&sa.cq, Duration::from_millis(20));
    qb.post_recv(&[RecvWr::new(3, sb.mr.sge(0, 64).unwrap())])
        .unwrap();
    ok(&poll_one(&sa.cq), 2);
    assert_eq!(poll_one(&sb.cq).wr_id, 3);
}

/// Send-queue credits: unsignaled WRs hold their slots until a later signaled
/// completion is polled; a full queue refuses the post.
pub fn send_credits<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let caps = QpCaps {
        max_send_wr: 4,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&sa, &sb, caps);
    let depth = qa.max_send_wr();
    assert!(depth >= 4);
    let rd = |id| SendWr::read(id, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)).signaled(false);
    let batch: Vec<SendWr> = (0..depth as u64).map(rd).collect();
    qa.post_send(&batch).unwrap();
    expect_quiet(&sa.cq, Duration::from_millis(10));
    let err = qa.post_send(&[rd(99)]).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(err.kind, PostErrorKind::QueueFull { .. }), "{err}");
    assert_eq!(qa.send_credits(), 0);
    // Nothing completes, nothing is freed: the queue stays full forever
    // unless a signaled WR is posted, which needs a slot: the classic bug.
    // Recover with a fresh QP using the right pattern: last WR signaled.
    let (qa, _qb) = rc_pair(&sa, &sb, caps);
    let mut batch: Vec<SendWr> = (0..depth as u64).map(rd).collect();
    let last = batch.len() - 1;
    batch[last] = batch[last].signaled(true);
    qa.post_send(&batch).unwrap();
    assert_eq!(qa.send_credits(), 0, "credits free only when polled");
    let wc = poll_one(&sa.cq);
    ok(&wc, depth as u64 - 1);
    assert_eq!(
        qa.send_credits(),
        depth,
        "one signaled completion frees every earlier slot"
    );

    // Posting a batch larger than the queue posts what fits (bad_wr index).
    let big: Vec<SendWr> = (0..depth as u64 + 2)
        .map(|i| rd(i).signaled(true))
        .collect();
    let err = qa.post_send(&big).unwrap_err();
    assert_eq!(err.index, depth as usize);
    assert_eq!(poll_n(&sa.cq, depth as usize).len(), depth as usize);
}

/// State machine misuse is a typed error.
pub fn state_machine<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let qa = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
    let rd = SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0));
    let e = qa.post_send(&[rd]).unwrap_err();
    assert!(
        matches!(e.kind, PostErrorKind::BadState(QpState::Reset)),
        "{e}"
    );
    assert!(matches!(
        qa.modify(Transition::Rts {
            rnr_retry: 0,
            retry_cnt: 0
        }),
        Err(NicError::InvalidTransition { .. })
    ));
    qa.modify(Transition::Init {
        access: Access::ALL,
        qkey: 0,
    })
    .unwrap();
    assert!(matches!(
        qa.modify(Transition::Rtr { peer: None }),
        Err(NicError::InvalidArgument(_))
    ));
    let e = qa.post_send(&[rd]).unwrap_err();
    assert!(
        matches!(e.kind, PostErrorKind::BadState(QpState::Init)),
        "{e}"
    );
    // RTR without RTS still cannot send.
    qa.modify(Transition::Rtr {
        peer: Some(RcPeer {
            gid: b.gid(),
            qpn: 0x1,
        }),
    })
    .unwrap();
    assert!(qa.post_send(&[rd]).is_err());
    // Malformed WRs are refused at post time with their index.
    qa.modify(Transition::Rts {
        rnr_retry: 0,
        retry_cnt: 0,
    })
    .unwrap();
    let dc = rd.to(Destination::Dc(DcTarget {
        gid: b.gid(),
        dct_num: 1,
        dc_key: 1,
    }));
    let e = qa.post_send(&[dc]).unwrap_err();
    assert!(matches!(e.kind, PostErrorKind::Malformed(_)));
    let mut bad_atomic = SendWr::cas(2, sa.mr.sge(0, 4).unwrap(), sb.mr.remote(0), 0, 1);
    let e = qa.post_send(&[bad_atomic]).unwrap_err();
    assert!(matches!(e.kind, PostErrorKind::Malformed(_)));
    bad_atomic.payload = Payload::Inline(InlineData::new(&[0; 8]).unwrap());
    assert!(qa.post_send(&[bad_atomic]).is_err());
    let too_many = SendWr {
        payload: Payload::Local(SgList::from_slice(&[sa.mr.sge(0, 1).unwrap(); 2]).unwrap()),
        ..rd
    };
    assert!(
        qa.post_send(&[too_many]).is_err(),
        "more SGEs than max_send_sge"
    );
    // Bad object arguments.
    assert!(a.create_cq(0).is_err());
    assert!(a.alloc_mr(&sa.pd, 0, Access::ALL).is_err());
    assert!(matches!(
        a.alloc_mr(&sa.pd, usize::MAX / 2, Access::ALL),
        Err(NicError::MrTooLarge { .. })
    ));
}

/// A slice of WRs is one doorbell; counters count it.
pub fn doorbell_batching<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let before = a.counters();
    let batch: Vec<SendWr> = (0..16u64)
        .map(|i| {
            SendWr::read(
                i,
                sa.mr.sge(64 * i as usize, 64).unwrap(),
                sb.mr.remote(64 * i as usize),
            )
            .signaled(i == 15)
        })
        .collect();
    qa.post_send(&batch).unwrap();
    ok(&poll_one(&sa.cq), 15);
    let d = a.counters() - before;
    assert_eq!(d.doorbells, 1);
    assert_eq!(d.send_wrs, 16);
    assert_eq!(d.reads, 16);
    assert_eq!(d.bytes_read, 16 * 64);
    assert_eq!(d.qps_created, 0);
}

/// A 4-entry CQ (`depth` as granted) shared by the send and receive queue
/// of an RC QP on `sa`, connected to one on `sb`, with `2 * depth`
/// signaled READs posted on it: more completions than the CQ holds. Returns
/// the CQ, its depth and both QPs (keep them).
pub fn overflowing_cq<N: Nic + Clone>(sa: &Side<N>, sb: &Side<N>) -> (N::Cq, u32, N::Qp, N::Qp) {
    let (a, b) = (&sa.nic, &sb.nic);
    let small = a.create_cq(4).unwrap();
    let depth = small.depth();
    let caps = QpCaps {
        max_send_wr: depth * 4,
        ..QpCaps::default()
    };
    let qa = a
        .create_qp(
            &sa.pd,
            &QpInit {
                qp_type: QpType::Rc,
                caps,
                send_cq: &small,
                recv_cq: &small,
                srq: None,
                dc_key: 0,
            },
        )
        .unwrap();
    let qb = sb.qp(QpType::Rc, caps, None, 0);
    connect_rc(&qa, a.gid(), &qb, b.gid());
    let batch: Vec<SendWr> = (0..(depth * 2) as u64)
        .map(|i| SendWr::read(i, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0)))
        .collect();
    qa.post_send(&batch).unwrap();
    (small, depth, qa, qb)
}

/// A CQ that overflows reports it instead of dropping completions silently.
pub fn cq_overflow<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let (small, depth, _qa, _qb) = overflowing_cq(&sa, &sb);
    let start = Instant::now();
    let mut wc = vec![Wc::default(); depth as usize * 2];
    let mut got = 0;
    loop {
        match small.poll(&mut wc) {
            Ok(n) => got += n,
            Err(NicError::CqOverflow { .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(
            start.elapsed() < WAIT,
            "overflow never reported ({got} polled)"
        );
    }
    assert!(
        got < depth as usize * 2,
        "overflow must lose completions, and say so"
    );
}

/// One one-sided `op` from a fresh RC pair of `sa` and `sb` (a fresh pair,
/// since a failed WR moves the QP to ERR); the completion's status.
fn one_sided<N: Nic + Clone>(sa: &Side<N>, sb: &Side<N>, op: WrOp, len: u32) -> WcStatus {
    let (qa, _qb) = rc_pair(sa, sb, QpCaps::default());
    let mut wr = SendWr::read(1, sa.mr.sge(0, len).expect("sge"), RemoteAddr::default());
    wr.op = op;
    qa.post_send(&[wr]).expect("post");
    poll_one(&sa.cq).status
}

/// Sub-regions ([`Nic::register_sub_mr`]): a key of their own limited to
/// their range and access at the NIC, over the parent's bytes; the key
/// fails with `REM_ACCESS_ERR` once the sub-region is dropped, while the
/// parent's keeps working; bad arguments are typed errors.
pub fn sub_regions<N: Nic + Clone>(a: &N, b: &N) {
    let (sa, sb) = (Side::new(a, 4096), Side::new(b, 4096));
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let sub = b
        .register_sub_mr(&sb.mr, 1024, 256, rw)
        .expect("register a sub-region");
    assert_eq!(
        sub.addr(),
        sb.mr.addr() + 1024,
        "a sub-region starts at its offset"
    );
    assert_eq!(sub.len(), 256);
    assert_ne!(
        sub.rkey(),
        sb.mr.rkey(),
        "a sub-region has a key of its own"
    );
    // Its bytes are the parent's, both ways.
    sb.mr.write(1024, b"parent's bytes!!").unwrap();
    let mut got = [0u8; 16];
    sub.read(0, &mut got).unwrap();
    assert_eq!(&got, b"parent's bytes!!");
    let read = |remote: RemoteAddr| WrOp::Read { remote };
    assert_eq!(
        one_sided(&sa, &sb, read(sub.remote(0)), 16),
        WcStatus::Success
    );
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(
        &got, b"parent's bytes!!",
        "a READ through the sub-region's key"
    );
    sa.mr.write(0, b"written through!").unwrap();
    let write = WrOp::Write {
        remote: sub.remote(240),
    };
    assert_eq!(one_sided(&sa, &sb, write, 16), WcStatus::Success);
    sb.mr.read(1024 + 240, &mut got).unwrap();
    assert_eq!(
        &got, b"written through!",
        "a WRITE lands in the parent's bytes"
    );
    // Its range and access, enforced by the NIC.
    let past_end = RemoteAddr {
        addr: sub.addr() + 250,
        rkey: sub.rkey(),
    };
    assert_eq!(
        one_sided(&sa, &sb, read(past_end), 16),
        WcStatus::RemAccessErr,
        "the key covers only the sub-region's range"
    );
    let before = RemoteAddr {
        addr: sb.mr.addr(),
        rkey: sub.rkey(),
    };
    assert_eq!(
        one_sided(&sa, &sb, read(before), 16),
        WcStatus::RemAccessErr,
        "the parent's other bytes are not the sub-region's"
    );
    let cas = WrOp::CompareSwap {
        remote: sub.remote(8),
        compare: 0,
        swap: 1,
    };
    assert_eq!(
        one_sided(&sa, &sb, cas, 8),
        WcStatus::RemAccessErr,
        "no atomic access through a sub-region registered without it"
    );
    let ro = b
        .register_sub_mr(&sb.mr, 0, 64, Access::REMOTE_READ)
        .expect("a read-only sub-region");
    let write_ro = WrOp::Write {
        remote: ro.remote(0),
    };
    assert_eq!(one_sided(&sa, &sb, write_ro, 8), WcStatus::RemAccessErr);
    // Dropped: its key stops working, the parent's does not.
    let old = sub.remote(0);
    drop(sub);
    assert_eq!(
        one_sided(&sa, &sb, read(old), 16),
        WcStatus::RemAccessErr,
        "a dropped sub-region's key fails at the NIC"
    );
    assert_eq!(
        one_sided(&sa, &sb, read(sb.mr.remote(1024)), 16),
        WcStatus::Success,
        "the parent's key still works"
    );
    // Bad arguments.
    let bad = [
        (
            4000,
            200,
            Access::REMOTE_READ,
            "a range past the parent's end",
        ),
        (0, 0, Access::REMOTE_READ, "a zero length"),
        (
            0,
            64,
            Access::REMOTE_WRITE,
            "remote write without LOCAL_WRITE",
        ),
    ];
    for (off, len, access, what) in bad {
        match b.register_sub_mr(&sb.mr, off, len, access) {
            Err(NicError::InvalidArgument(_)) => {}
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    let read_only = b
        .alloc_mr(&sb.pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .expect("alloc_mr");
    match b.register_sub_mr(&read_only, 0, 64, rw) {
        Err(NicError::InvalidArgument(_)) => {}
        Err(e) => panic!("an access beyond the parent's: {e}"),
        Ok(_) => panic!("an access beyond the parent's: accepted"),
    }
}
