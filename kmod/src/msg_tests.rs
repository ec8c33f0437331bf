//! Tests of `msg.rs`.

use super::*;

fn all_kinds() -> Vec<MsgKind> {
    vec![
        MsgKind::Open {
            window: 8,
            reply_window: 4,
            dct_num: 0x1234,
            dc_key: 0xdc,
            carries: None,
        },
        MsgKind::Open {
            window: 1,
            reply_window: 1,
            dct_num: 7,
            dc_key: 9,
            carries: Some(Carried {
                len: 0,
                only: false,
            }),
        },
        MsgKind::Open {
            window: 1,
            reply_window: 0,
            dct_num: 7,
            dc_key: 9,
            carries: Some(Carried { len: 0, only: true }),
        },
        MsgKind::Grant { window: 8 },
        MsgKind::Refuse(RefuseCode::Unbound),
        MsgKind::Refuse(RefuseCode::Busy),
        MsgKind::Refuse(RefuseCode::NoBuffers),
        MsgKind::Refuse(RefuseCode::Reclaimed),
        MsgKind::Data { seq: 7, len: 0 },
        MsgKind::Desc {
            seq: u64::MAX,
            len: 1 << 20,
            desc: Descriptor {
                addr: 0xdead_beef_0000,
                rkey: 0x1234,
                token: 99,
            },
        },
        MsgKind::Credit { total: 3 },
        MsgKind::Release { token: 5 },
        MsgKind::Close,
    ]
}

#[test]
fn every_kind_round_trips() {
    let src = Gid([7; 16]);
    for kind in all_kinds() {
        let dst = match kind {
            MsgKind::Open { .. } | MsgKind::Close | MsgKind::Data { .. } | MsgKind::Desc { .. } => {
                MsgDst::Port(65535)
            }
            _ => MsgDst::Vqp { vqp: 42, from: 9 },
        };
        let r = MsgRepr { src, dst, kind };
        assert_eq!(MsgRepr::parse_bytes(&r.emit()), Ok(r), "{kind:?}");
    }
}

#[test]
fn data_body_must_match_its_length() {
    let r = MsgRepr {
        src: Gid([1; 16]),
        dst: MsgDst::Port(3),
        kind: MsgKind::Data { seq: 0, len: 5 },
    };
    let mut bytes = r.emit().to_vec();
    bytes.extend_from_slice(b"hell");
    assert_eq!(
        MsgRepr::parse_bytes(&bytes),
        Err(MsgWireError::BadLength {
            declared: 5,
            present: 4
        })
    );
    bytes.push(b'o');
    let p = MsgPacket::new_checked(&bytes[..]).unwrap();
    assert_eq!(MsgRepr::parse(&p), Ok(r));
    assert_eq!(p.body(), b"hello");
}

#[test]
fn a_carried_body_must_match_its_length_and_only_needs_carries() {
    let open = |carries| MsgRepr {
        src: Gid([1; 16]),
        dst: MsgDst::Port(3),
        kind: MsgKind::Open {
            window: 1,
            reply_window: 1,
            dct_num: 2,
            dc_key: 3,
            carries,
        },
    };
    let r = open(Some(Carried {
        len: 3,
        only: false,
    }));
    let mut bytes = r.emit().to_vec();
    bytes.extend_from_slice(b"hi");
    assert_eq!(
        MsgRepr::parse_bytes(&bytes),
        Err(MsgWireError::BadLength {
            declared: 3,
            present: 2
        })
    );
    bytes.push(b'!');
    assert_eq!(MsgRepr::parse_bytes(&bytes), Ok(r));
    // An Open without a carried message ignores what follows it.
    let plain = open(None);
    let mut bytes = plain.emit().to_vec();
    bytes.extend_from_slice(b"junk");
    assert_eq!(MsgRepr::parse_bytes(&bytes), Ok(plain));
    // "Only" without "carries" is no message this build sends.
    bytes[field::FLAGS] |= FLAG_ONLY;
    assert_eq!(
        MsgRepr::parse_bytes(&bytes),
        Err(MsgWireError::Malformed("open"))
    );
}

#[test]
fn bad_bytes_are_typed_errors() {
    assert_eq!(
        MsgRepr::parse_bytes(&[0; 10]),
        Err(MsgWireError::Truncated { len: 10 })
    );
    assert_eq!(
        MsgRepr::parse_bytes(&[0; HEADER_LEN]),
        Err(MsgWireError::BadMagic(0))
    );
    let good = MsgRepr {
        src: Gid([1; 16]),
        dst: MsgDst::Port(3),
        kind: MsgKind::Credit { total: 1 },
    }
    .emit();
    let mut b = good;
    b[field::VERSION] = 9;
    assert_eq!(
        MsgRepr::parse_bytes(&b),
        Err(MsgWireError::UnsupportedVersion(9))
    );
    let mut b = good;
    b[field::KIND] = 0;
    assert_eq!(MsgRepr::parse_bytes(&b), Err(MsgWireError::UnknownKind(0)));
    let mut b = good;
    b[field::DST].copy_from_slice(&70_000u32.to_le_bytes());
    assert_eq!(
        MsgRepr::parse_bytes(&b),
        Err(MsgWireError::Malformed("port"))
    );
    // A Grant toward a port, an Open toward a VQP: wrong direction.
    let mut b = good;
    b[field::KIND] = 2;
    assert_eq!(
        MsgRepr::parse_bytes(&b),
        Err(MsgWireError::Malformed("direction"))
    );
    let mut b = good;
    b[field::KIND] = 3;
    b[field::FLAGS] = FLAG_TO_VQP;
    assert_eq!(
        MsgRepr::parse_bytes(&b),
        Err(MsgWireError::Malformed("refuse"))
    );
}

#[test]
fn window_never_exceeds_its_size_and_refuses_over_returns() {
    let mut w = SendWindow::new(3);
    assert_eq!(
        (w.take(), w.take(), w.take(), w.take()),
        (Some(0), Some(1), Some(2), None)
    );
    assert_eq!(
        w.credit(4),
        Err(WindowError::OverReturn {
            returned: 4,
            in_use: 3
        })
    );
    w.credit(2).unwrap();
    assert_eq!(w.available(), 2);
    assert_eq!(w.take(), Some(3));
    w.untake();
    assert_eq!(w.take(), Some(3));
}

/// A random schedule of takes, deliveries and pops against a reference:
/// the receiver never holds more than the window, and a sender with an
/// empty window is always unblocked by the receiver's pops.
#[test]
fn credits_model() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for window in [1u32, 2, 3, 8, 17] {
        let mut w = SendWindow::new(window);
        let mut r = ReturnBatch::new(window);
        let (mut wire, mut ring, mut credits_wire) = (0u32, 0u32, Vec::<CreditReturn>::new());
        let mut seq = SeqCheck::default();
        let (mut sent, mut delivered) = (0u64, 0u64);
        for _ in 0..20_000 {
            match next() % 4 {
                0 => {
                    if let Some(s) = w.take() {
                        assert_eq!(s, sent);
                        sent += 1;
                        wire += 1;
                    } else {
                        // Blocked: everything is out, so pops will
                        // return at least a batch.
                        assert_eq!(wire + ring + r.pending() + on_wire(&credits_wire), window);
                    }
                }
                1 if wire > 0 => {
                    wire -= 1;
                    ring += 1;
                    assert!(seq.accept(delivered).is_ok());
                    delivered += 1;
                }
                2 if ring > 0 => {
                    ring -= 1;
                    if let Some(c) = r.popped() {
                        credits_wire.push(c);
                    }
                }
                3 if !credits_wire.is_empty() => {
                    let c = credits_wire.remove(0);
                    assert_eq!(w.credit_total(c.total), Ok(c.count));
                }
                _ => {}
            }
            assert!(ring + wire <= window);
            assert_eq!(
                w.in_use(),
                wire + ring + r.pending() + on_wire(&credits_wire)
            );
        }
        assert!(sent > 100, "window {window}: only {sent} sent");
    }
}

fn on_wire(credits: &[CreditReturn]) -> u32 {
    credits.iter().map(|c| c.count).sum()
}

#[test]
fn a_lost_credit_is_made_up_by_the_next_and_a_repeated_one_is_harmless() {
    let mut w = SendWindow::new(4);
    let mut r = ReturnBatch::new(4);
    for _ in 0..4 {
        w.take().unwrap();
    }
    // Two pops return two credits: that Credit is lost on the way.
    assert!(r.popped().is_none());
    let lost = r.popped().unwrap();
    assert_eq!((lost.count, lost.total), (2, 2));
    // The next two pops' Credit carries all four.
    assert!(r.popped().is_none());
    let next = r.popped().unwrap();
    assert_eq!((next.count, next.total), (2, 4));
    assert_eq!(w.credit_total(next.total), Ok(4));
    assert_eq!(w.available(), 4);
    // The lost one arriving late, or the last one again: nothing.
    assert_eq!(w.credit_total(lost.total), Ok(0));
    assert_eq!(w.credit_total(next.total), Ok(0));
    assert_eq!(w.available(), 4);
    // A total past what is in use is refused, the account unchanged.
    w.take().unwrap();
    assert_eq!(
        w.credit_total(6),
        Err(WindowError::OverReturn {
            returned: 2,
            in_use: 1
        })
    );
    assert_eq!(w.available(), 3);
    // A Credit that could not be posted is flushed again, same total.
    r.popped();
    let c = r.popped().unwrap();
    r.unflush(c.count);
    assert_eq!(r.flush(), Some(c));
}

#[test]
fn sequence_gaps_are_reported() {
    let mut s = SeqCheck::default();
    assert_eq!(s.accept(0), Ok(()));
    assert_eq!(s.accept(2), Err(1));
    assert_eq!(s.accept(3), Ok(()));
}
