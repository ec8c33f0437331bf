//! The pre-check's fast paths (the common-WR pass, the fast gate, the MR
//! windows) against the full check, on random WRs; and the grants and
//! windows they keep.

use super::*;

/// The common-WR pass accepts exactly what the full check accepts:
/// random WRs (every opcode, SGEs around and across MR bounds and the end
/// of the address space, every destination kind, known, unknown and
/// expired grants, on every transport) get the same verdict and reason
/// both ways.
#[test]
fn the_common_path_agrees_with_the_full_check() {
    let mut f = Fixture::new();
    f.mrs.insert(
        0x30,
        LocalMr {
            addr: u64::MAX - 0xff,
            len: 0x100,
            access: Access::LOCAL_WRITE,
        },
    );
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let lkeys = [RW, RO, 0x30, 0x99];
    let addrs = [
        0x0,
        0xfff,
        0x1000,
        0x1ff8,
        0x2000,
        0x4000,
        0x40f8,
        u64::MAX - 0xff,
        u64::MAX - 7,
    ];
    let rkeys = [RKEY_ALL, RKEY_READ, RKEY_OLD, RKEY_UNKNOWN];
    let mut common = 0;
    for _ in 0..20_000 {
        let pick = |r: u64, n: usize| (r % n as u64) as usize;
        let s = sge(
            lkeys[pick(next(), lkeys.len())],
            addrs[pick(next(), addrs.len())],
            [0, 1, 8, 8, 64, 64, 0x1000, u32::MAX][pick(next(), 8)],
        );
        let r = remote(rkeys[pick(next(), rkeys.len())], next() % 0x1100);
        let mut wr = match next() % 5 {
            0 => SendWr::read(1, s, r),
            1 => SendWr::write(1, s, r),
            2 => SendWr::cas(1, s, r, 0, 1),
            3 => SendWr::send(1, s, None),
            _ => SendWr::faa(1, s, r, 1),
        };
        if next() % 6 == 0 {
            wr.payload = Payload::Local(SgList::from_slice(&[s, s]).unwrap());
        }
        if next() % 8 == 0 {
            wr.payload = Payload::Inline(InlineData::new(&[1, 2, 3]).unwrap());
        }
        wr.dest = [dc(), Destination::Connected, ud()][pick(next(), 3)];
        let transport = [QpKind::Dc, QpKind::Rc, QpKind::Ud][pick(next(), 3)];
        if next() % 2 == 0 {
            // Mostly the destination the transport takes.
            wr.dest = match transport {
                QpKind::Dc => dc(),
                QpKind::Rc => Destination::Connected,
                _ => ud(),
            };
        }
        let mut ctx = f.ctx(transport);
        if next() % 4 == 0 {
            ctx.policy.max_sge = 0;
        }
        if next() % 2 == 0 {
            ctx.ungranted = Ungranted::Refuse;
        }
        let quick = ctx.check_batch(&[wr], true);
        let full = ctx.check_batch(&[wr], false);
        assert_eq!(quick, full, "{wr:?} on {transport:?}");
        common += usize::from(ctx.common_wr_ok(&wr));
    }
    assert!(common > 30, "the common path was exercised ({common})");
}

/// The engine's fast path judges an SGE through [`MrWindow::holds`]: the
/// same verdict as [`local_ok`], for a READ and a WRITE alike, for every MR
/// it has a window of. None for an MR whose end wraps around (which
/// `local_ok` never accepts) or without `LOCAL_WRITE` (its WRs take the
/// general path).
#[test]
fn mr_window_agrees_with_local_ok() {
    let edges = [
        0u64,
        1,
        7,
        8,
        4096,
        u64::MAX / 2,
        u64::MAX - 64,
        u64::MAX - 1,
        u64::MAX,
    ];
    let lens = [0u32, 1, 8, 64, u32::MAX];
    let accesses = [Access::ALL, Access::REMOTE_READ];
    let mut checked = 0;
    for &mr_addr in &edges {
        for &mr_len in &[0u64, 8, 4096, u64::MAX / 2, u64::MAX] {
            for &access in &accesses {
                let mr = LocalMr {
                    addr: mr_addr,
                    len: mr_len,
                    access,
                };
                let window = MrWindow::of(7, &mr);
                assert_eq!(
                    window.is_some(),
                    access.contains(Access::LOCAL_WRITE) && mr_addr.checked_add(mr_len).is_some(),
                    "{mr:?}"
                );
                for &addr in &edges {
                    for &length in &lens {
                        for lkey in [7, 8] {
                            let sge = krcore_nic::Sge { addr, length, lkey };
                            for op in [OpKind::Read, OpKind::Write] {
                                let want = lkey == 7 && local_ok(&sge, &mr, op);
                                match window {
                                    Some(w) => {
                                        assert_eq!(w.holds(&sge), want, "{mr:?} {sge:?} {op}");
                                        checked += 1;
                                    }
                                    None => assert!(
                                        !want || !access.contains(Access::LOCAL_WRITE),
                                        "{mr:?} {sge:?} {op}"
                                    ),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000);
}

/// The engine's fast path's gate ([`fast_wr_ok`]) against the full check
/// ([`Precheck::check_wr`]), on atomics above all: every combination of
/// opcode (CAS, FAA, READ, WRITE, SEND), SGE (4, 8, 16 and 64 bytes; in,
/// across and outside the window's MR; an MR without `LOCAL_WRITE`; a
/// foreign lkey; two SGEs; inline data), remote address (aligned or not,
/// inside, across and outside the grant) and rkey (a grant with every
/// access, one without atomic access, an expired one, none known), with
/// no grant known to the VQP or its memo naming the WR's rkey, on DC and
/// RC. Within the fast path's domain (one SGE with the window's lkey, a
/// one-sided opcode, the memo's rkey) the two verdicts are identical;
/// outside it the gate refuses (the general path decides). A gate loosened in any check (SGE length,
/// alignment, MR bounds, local write, access, range, expiry) fails here.
#[test]
fn the_fast_gate_agrees_with_the_full_check() {
    let mut f = Fixture::new();
    // A second MR with LOCAL_WRITE (the SDK's scratch MR for atomics).
    const RW2: u32 = 0x40;
    f.mrs.insert(
        RW2,
        LocalMr {
            addr: 0x8000,
            len: 0x100,
            access: Access::LOCAL_WRITE,
        },
    );
    let w = |lkey| MrWindow::of(lkey, &f.mrs[&lkey]).expect("allows local writes");
    // One window, and two in either order.
    for (window, held) in [
        (MrWindows::one(w(RW)), &[RW][..]),
        (MrWindows::one(w(RW)).with(w(RW2)), &[RW, RW2][..]),
        (MrWindows::one(w(RW2)).with(w(RW)), &[RW, RW2][..]),
    ] {
        fast_gate_agrees(&f, &window, held);
    }
}

/// [`the_fast_gate_agrees_with_the_full_check`] with `window`, holding the
/// windows of the MRs `held`.
fn fast_gate_agrees(f: &Fixture, window: &MrWindows, held: &[u32]) {
    let lkeys = [RW, RO, 0x40, 0x99];
    let addrs = [
        0x1000u64, 0x1008, 0x1ff8, 0x1ffc, 0x2000, 0xff8, 0x4000, 0x8000, 0x80f8, 0x80fc,
    ];
    let lens = [4u32, 8, 16, 64];
    let offsets = [0u64, 4, 8, 0xff8, 0xffc, 0x1000, 1];
    let rkeys = [RKEY_ALL, RKEY_READ, RKEY_OLD, RKEY_UNKNOWN];
    let mut accepted = HashMap::<OpKind, usize>::new();
    let mut atomic_reasons = std::collections::HashSet::new();
    let mut checked = 0;
    for transport in [QpKind::Dc, QpKind::Rc] {
        let (dest, target) = match transport {
            QpKind::Dc => (dc(), Gid([3; 16])),
            _ => (Destination::Connected, peer()),
        };
        for op in 0..5 {
            for &lkey in &lkeys {
                for &addr in &addrs {
                    for &len in &lens {
                        for &off in &offsets {
                            for &rkey in &rkeys {
                                for shape in 0..3 {
                                    let s = sge(lkey, addr, len);
                                    let r = remote(rkey, off);
                                    let mut wr = match op {
                                        0 => SendWr::cas(1, s, r, 0, 1),
                                        1 => SendWr::faa(1, s, r, 1),
                                        2 => SendWr::read(1, s, r),
                                        3 => SendWr::write(1, s, r),
                                        _ => SendWr::send(1, s, None),
                                    };
                                    match shape {
                                        1 => {
                                            wr.payload =
                                                Payload::Local(SgList::from_slice(&[s, s]).unwrap())
                                        }
                                        2 if lkey == RW && addr == 0x1000 && len == 8 => {
                                            wr.payload =
                                                Payload::Inline(InlineData::new(&[0; 8]).unwrap())
                                        }
                                        2 => continue,
                                        _ => {}
                                    }
                                    wr.dest = dest;
                                    let kind = OpKind::of(&wr.op);
                                    // The fast path's domain: one SGE in
                                    // the window's MR, one-sided.
                                    let domain =
                                        held.contains(&lkey) && shape == 0 && kind != OpKind::Send;
                                    // No grant known to the VQP: the full
                                    // check with none.
                                    let none = f.ctx_without_grants(transport);
                                    let full = none.check_wr(&wr);
                                    let fast = fast_wr_ok(&wr, window, &FastGrants::None);
                                    assert_eq!(
                                        fast,
                                        domain && full.is_ok(),
                                        "no grants: {wr:?} on {transport:?}: {full:?}"
                                    );
                                    // The memo of the WR's rkey (what the
                                    // VQP knows for it), and of another.
                                    let known = f.grants.lookup(&target, rkey);
                                    let full = f.ctx(transport).check_wr(&wr);
                                    let fast = FastGrants::memo(rkey, known.as_ref(), || f.now)
                                        .is_some_and(|memo| fast_wr_ok(&wr, window, &memo));
                                    assert_eq!(
                                        fast,
                                        domain && full.is_ok(),
                                        "memo: {wr:?} on {transport:?}: {full:?}"
                                    );
                                    let other = FastGrants::Memo {
                                        rkey: rkey ^ 1,
                                        grant: known.as_ref(),
                                    };
                                    assert!(!fast_wr_ok(&wr, window, &other), "{wr:?}");
                                    if fast {
                                        *accepted.entry(kind).or_default() += 1;
                                    }
                                    if let (true, Err(reason)) = (wr.op.is_atomic(), &full) {
                                        atomic_reasons.insert(std::mem::discriminant(reason));
                                    }
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 20_000, "{checked}");
    for kind in [
        OpKind::CompareSwap,
        OpKind::FetchAdd,
        OpKind::Read,
        OpKind::Write,
    ] {
        assert!(
            accepted.get(&kind).copied().unwrap_or(0) > 10,
            "{kind}: {accepted:?}"
        );
    }
    assert!(!accepted.contains_key(&OpKind::Send), "{accepted:?}");
    // Every way an atomic can be wrong was among the cases.
    let sample = |lkey, addr, len, off, rkey| {
        let wr = SendWr::cas(1, sge(lkey, addr, len), remote(rkey, off), 0, 1).to(dc());
        f.ctx(QpKind::Dc).check_wr(&wr).unwrap_err()
    };
    for reason in [
        sample(RW, 0x1000, 4, 0, RKEY_ALL),
        sample(RW, 0x1000, 8, 4, RKEY_ALL),
        sample(0x99, 0x1000, 8, 0, RKEY_ALL),
        sample(RW, 0x1ffc, 8, 0, RKEY_ALL),
        sample(RO, 0x4000, 8, 0, RKEY_ALL),
        sample(RW, 0x1000, 8, 0, RKEY_OLD),
        sample(RW, 0x1000, 8, 0, RKEY_READ),
        sample(RW, 0x1000, 8, 0x1000, RKEY_ALL),
    ] {
        assert!(
            atomic_reasons.contains(&std::mem::discriminant(&reason)),
            "{reason:?} not covered"
        );
    }
}

/// The fast gate's memo of a grant with an expiry is made only before it
/// expires (then the general path decides, and finds it expired); the
/// clock is read only for a grant with an expiry.
#[test]
fn the_fast_gate_takes_a_grant_only_before_it_expires() {
    let f = Fixture::new();
    let window = MrWindows::one(MrWindow::of(RW, &f.mrs[&RW]).unwrap());
    let wr = SendWr::faa(1, sge(RW, 0x1008, 8), remote(RKEY_ALL, 8), 1).to(dc());
    let grant = f.grants.lookup(&Gid([3; 16]), RKEY_ALL).unwrap();
    let expires = grant.expires_at.unwrap();
    let memo = FastGrants::memo(RKEY_ALL, Some(&grant), || f.now).unwrap();
    assert!(fast_wr_ok(&wr, &window, &memo));
    assert!(FastGrants::memo(RKEY_ALL, Some(&grant), || expires).is_none());
    let late = Precheck {
        now: expires,
        ..f.ctx(QpKind::Dc)
    };
    assert_eq!(
        late.check_wr(&wr),
        Err(Reason::GrantExpired { rkey: RKEY_ALL })
    );
    let forever = RemoteGrant {
        expires_at: None,
        ..grant
    };
    let memo = FastGrants::memo(RKEY_ALL, Some(&forever), || unreachable!("no clock"));
    assert!(memo.is_some_and(|m| fast_wr_ok(&wr, &window, &m)));
}

/// [`MrWindows`] holds the windows of exactly the last two distinct MRs
/// pushed (a reference list, most recent first), through a fixed
/// pseudo-random sequence of pushes of four MRs; an SGE of any other MR
/// is never held (nor by the empty second window of [`MrWindows::one`],
/// even at the ends of the address space or with lkey 0).
#[test]
fn mr_windows_hold_the_last_two_mrs() {
    let mr = |k: u32| LocalMr {
        addr: 0x1000 * u64::from(k + 1),
        len: 0x100,
        access: Access::LOCAL_WRITE,
    };
    let window = |k: u32| MrWindow::of(k, &mr(k)).unwrap();
    let inside = |k: u32| sge(k, mr(k).addr + 8, 8);
    let mut w = MrWindows::one(window(0));
    let mut reference = vec![0u32];
    let mut x = 0x9e37_79b9_u32;
    for _ in 0..500 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let k = x % 4;
        w = w.with(window(k));
        reference.retain(|&r| r != k);
        reference.insert(0, k);
        reference.truncate(2);
        for j in 0..4 {
            assert_eq!(
                w.holds(&inside(j)),
                reference.contains(&j),
                "{j} {reference:?}"
            );
        }
    }
    let one = MrWindows::one(window(1));
    for s in [
        sge(0, u64::MAX, 0),
        sge(0, u64::MAX - 8, 8),
        sge(0, 0, 0),
        sge(1, 0, 0),
    ] {
        assert!(!one.holds(&s), "{s:?}");
    }
    assert!(one.holds(&inside(1)));
}

/// Under [`Ungranted::Refuse`] a one-sided WR must fall under a grant the
/// VQP knows: an unknown rkey is refused with its key and address, on both
/// transports, the common path and the full check alike; two-sided WRs
/// need no grant; [`Ungranted::Allow`] leaves the key to the NIC. An RC
/// check that knows no peer cannot look a grant up: refused too.
#[test]
fn an_unknown_rkey_is_refused_unless_the_vqp_opts_out() {
    let f = Fixture::new();
    let local = sge(RW, 0x1000, 8);
    for (transport, dest) in [(QpKind::Rc, Destination::Connected), (QpKind::Dc, dc())] {
        let refuse = Precheck {
            ungranted: Ungranted::Refuse,
            ..f.ctx(transport)
        };
        let unknown = remote(RKEY_UNKNOWN, 16);
        for wr in [
            SendWr::read(1, local, unknown).to(dest),
            SendWr::write(1, local, unknown).to(dest),
            SendWr::cas(1, local, unknown, 0, 1).to(dest),
            SendWr::faa(1, local, unknown, 1).to(dest),
        ] {
            let want = Reason::NotGranted {
                rkey: RKEY_UNKNOWN,
                addr: unknown.addr,
            };
            assert_eq!(refuse.check(&[wr]).unwrap_err().reason, want, "{wr:?}");
            assert_eq!(refuse.check_batch(&[wr], false).unwrap_err().reason, want);
            assert!(f.ctx(transport).check(&[wr]).is_ok(), "allowed: {wr:?}");
        }
        // A known grant passes; a SEND needs none.
        let known = SendWr::read(2, local, remote(RKEY_ALL, 16)).to(dest);
        let send = SendWr::send(3, sge(RO, 0x4000, 16), None).to(dest);
        assert!(refuse.check(&[known, send]).is_ok());
        // The refusal names the first WR without a grant.
        let batch = [known, SendWr::read(4, local, unknown).to(dest)];
        assert_eq!(refuse.check(&batch).unwrap_err().index, 1);
    }
    let no_peer = Precheck {
        ungranted: Ungranted::Refuse,
        peer: None,
        ..f.ctx(QpKind::Rc)
    };
    let wr = SendWr::read(1, local, remote(RKEY_ALL, 0)).to(Destination::Connected);
    assert!(matches!(
        no_peer.check(&[wr]).unwrap_err().reason,
        Reason::NotGranted { .. }
    ));
}
