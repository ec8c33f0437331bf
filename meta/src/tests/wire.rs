use super::gid;
use crate::registry::Lease;
use crate::stores::{StoreMember, StoreName, MAX_MEMBERS};
use crate::table::{Geometry, GeometryError};
use crate::wire::*;
use crate::LAYOUT_VERSION;
use krcore_nic::{DcTarget, RemoteAddr, UdTarget};
use rand::{Rng, RngCore, SeedableRng};

fn server() -> DcTarget {
    DcTarget {
        gid: gid(0x5e),
        dct_num: 0x0102_0304,
        dc_key: 0x0a0b_0c0d_0e0f_1011,
    }
}

fn bootstrap() -> BootstrapRepr {
    BootstrapRepr::new(
        Geometry::new(1024, 8).unwrap(),
        RemoteAddr {
            addr: 0x7f00_0000_1000,
            rkey: 0x1234,
        },
        99,
        server(),
        UdTarget {
            gid: server().gid,
            qpn: 0x00a0_0b0c,
            qkey: 0x1111_2222,
        },
    )
}

fn all_messages() -> Vec<Message> {
    vec![
        Message::Register(RegisterRepr {
            target: server(),
            lid: 0xbeef,
            lease_ms: 30_000,
        }),
        Message::Renew {
            gid: gid(1),
            dct_num: 0x71,
        },
        Message::Deregister {
            gid: gid(2),
            dct_num: 0x72,
        },
        Message::BootstrapRequest,
        Message::Ok(Lease {
            epoch: 7,
            lease_expiry_ms: 123_456,
            replaced_dct: 0x55,
        }),
        Message::Err(ErrorCode::BucketFull),
        Message::Err(ErrorCode::Unknown(999)),
        Message::Bootstrap(bootstrap()),
        store_join(),
        Message::StoreJoin(StoreJoinRepr {
            store: StoreName::new("x").unwrap(),
            id: 0,
            record: vec![],
            lease_ms: 1,
        }),
        store_leave(),
        Message::StoreList {
            store: StoreName::new("a.b_c-D9").unwrap(),
        },
        Message::StoreMembers(vec![]),
        members(),
        Message::StoreMembers(
            (0..MAX_MEMBERS as u16)
                .map(|id| StoreMember {
                    id,
                    gid: gid(id as u64),
                    record: vec![id as u8; (id as usize) % 65],
                    lease_expiry_ms: u64::MAX - id as u64,
                })
                .collect(),
        ),
        Message::Err(ErrorCode::MemberExists),
    ]
}

fn store_join() -> Message {
    Message::StoreJoin(StoreJoinRepr {
        store: StoreName::new("store-0").unwrap(),
        id: 0x0102,
        record: b"addr=10.0.0.1".to_vec(),
        lease_ms: 0x1122_3344_5566,
    })
}

fn store_leave() -> Message {
    Message::StoreLeave {
        store: StoreName::new(&"z".repeat(32)).unwrap(),
        id: 0xffff,
    }
}

fn members() -> Message {
    Message::StoreMembers(vec![
        StoreMember {
            id: 3,
            gid: gid(3),
            record: vec![],
            lease_expiry_ms: 10,
        },
        StoreMember {
            id: 7,
            gid: gid(7),
            record: vec![0xab; 2],
            lease_expiry_ms: 20,
        },
    ])
}

#[test]
fn round_trip_every_message() {
    for (i, m) in all_messages().into_iter().enumerate() {
        let r = Repr {
            request_id: 0xfeed_0000 + i as u64,
            message: m.clone(),
        };
        let bytes = r.to_bytes();
        assert_eq!(bytes.len(), r.buffer_len());
        if m.msg_type() == MessageType::StoreMembers {
            assert!(bytes.len() <= MAX_STORE_MEMBERS_LEN);
        } else {
            assert!(bytes.len() <= MAX_MESSAGE_LEN);
        }
        assert_eq!(Repr::parse_bytes(&bytes), Ok(r.clone()), "{m:?}");
        // A longer receive buffer parses the same.
        let mut big = vec![0xeeu8; bytes.len() + 10];
        assert_eq!(r.emit(&mut big), Ok(bytes.len()));
        assert_eq!(Repr::parse_bytes(&big), Ok(r.clone()));
        assert!(big[bytes.len()..].iter().all(|&b| b == 0xee));
    }
}

#[test]
fn every_error_code_round_trips() {
    let codes = [
        ErrorCode::Malformed,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnexpectedMessage,
        ErrorCode::BucketFull,
        ErrorCode::NotRegistered,
        ErrorCode::Replaced,
        ErrorCode::LeaseExpired,
        ErrorCode::InvalidLease,
        ErrorCode::EpochExhausted,
        ErrorCode::MemberExists,
        ErrorCode::NoSuchStore,
        ErrorCode::BadStoreName,
        ErrorCode::StoreFull,
        ErrorCode::RecordTooLong,
        ErrorCode::NoSuchMember,
        ErrorCode::NotHolder,
        ErrorCode::Internal,
        ErrorCode::Unknown(4242),
    ];
    for c in codes {
        assert_eq!(ErrorCode::from_u16(c.to_u16()), Some(c));
    }
    assert_eq!(ErrorCode::from_u16(0), None);
}

#[test]
fn header_layout() {
    let r = Repr {
        request_id: 0x1122_3344_5566_7788,
        message: Message::Renew {
            gid: gid(3),
            dct_num: 0x73,
        },
    };
    let b = r.to_bytes();
    assert_eq!(&b[0..4], b"KRMT");
    assert_eq!(b[4], WIRE_VERSION);
    assert_eq!(b[5], 2);
    assert_eq!(&b[6..8], &24u16.to_le_bytes());
    assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(&b[16..32], gid(3).as_bytes());
    assert_eq!(&b[32..36], &0x73u32.to_le_bytes());
    assert_eq!(&b[36..40], &[0; 4]);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(&p.payload()[..16], gid(3).as_bytes());
}

#[test]
fn register_payload_layout() {
    let b = Repr {
        request_id: 1,
        message: all_messages()[0].clone(),
    }
    .to_bytes();
    let p = &b[HEADER_LEN..];
    assert_eq!(&p[16..20], &0x0102_0304u32.to_le_bytes());
    assert_eq!(&p[20..22], &0xbeefu16.to_le_bytes());
    assert_eq!(&p[22..24], &[0, 0]);
    assert_eq!(&p[24..32], &0x0a0b_0c0d_0e0f_1011u64.to_le_bytes());
    assert_eq!(&p[32..40], &30_000u64.to_le_bytes());
}

fn bytes_of(m: Message) -> Vec<u8> {
    Repr {
        request_id: 5,
        message: m,
    }
    .to_bytes()
}

#[test]
fn truncated() {
    let b = bytes_of(Message::Deregister {
        gid: gid(1),
        dct_num: 0x71,
    });
    for len in 0..HEADER_LEN {
        assert_eq!(
            Repr::parse_bytes(&b[..len]),
            Err(WireError::Truncated {
                len,
                need: HEADER_LEN
            })
        );
    }
    for len in HEADER_LEN..b.len() {
        assert_eq!(
            Repr::parse_bytes(&b[..len]),
            Err(WireError::Truncated { len, need: b.len() })
        );
    }
}

#[test]
fn bad_magic_version_type() {
    let good = bytes_of(Message::BootstrapRequest);
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(Repr::parse_bytes(&b), Err(WireError::BadMagic(_))));
    let mut b = good.clone();
    b[4] = WIRE_VERSION + 1;
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::UnsupportedVersion(WIRE_VERSION + 1))
    );
    // Version 1 (the 72-byte bootstrap without the RPC address) is refused.
    let mut b = bytes_of(Message::BootstrapRequest);
    b[4] = 1;
    assert_eq!(Repr::parse_bytes(&b), Err(WireError::UnsupportedVersion(1)));
    let mut b = good;
    b[5] = 0x7f;
    assert_eq!(Repr::parse_bytes(&b), Err(WireError::UnknownType(0x7f)));
}

#[test]
fn wrong_payload_length() {
    // A Renew header announcing 25 bytes.
    let mut b = bytes_of(Message::Renew {
        gid: gid(1),
        dct_num: 0x71,
    });
    b[6] = 25;
    b.push(0);
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::PayloadLength {
            msg_type: MessageType::Renew,
            expected: 24,
            got: 25
        })
    );
    // A Register header announcing a Renew-sized payload.
    let mut b = bytes_of(Message::Renew {
        gid: gid(1),
        dct_num: 0x71,
    });
    b[5] = MessageType::Register as u8;
    assert!(matches!(
        Repr::parse_bytes(&b),
        Err(WireError::PayloadLength {
            msg_type: MessageType::Register,
            ..
        })
    ));
}

#[test]
fn reserved_bytes_must_be_zero() {
    for (m, off) in [
        (all_messages()[0].clone(), 22),
        (all_messages()[1].clone(), 21),
        (all_messages()[2].clone(), 23),
        (all_messages()[5].clone(), 3),
        (all_messages()[7].clone(), 77),
        (store_join(), 37),
        (store_join(), 48 + 20), // record padding past record_len
        (store_leave(), 35),
        (members(), 5),
        (members(), 8 + 5),           // first entry's reserved
        (members(), 8 + 96 + 32 + 4), // second entry's record padding
    ] {
        let mut b = bytes_of(m.clone());
        b[HEADER_LEN + off] = 1;
        assert_eq!(
            Repr::parse_bytes(&b),
            Err(WireError::ReservedNotZero(m.msg_type())),
            "{m:?}"
        );
    }
}

#[test]
fn value_rules() {
    let b = bytes_of(Message::Ok(Lease {
        epoch: 0,
        lease_expiry_ms: 1,
        replaced_dct: 0,
    }));
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::Malformed {
            msg_type: MessageType::Ok,
            what: "epoch 0"
        })
    );
    let b = bytes_of(Message::Err(ErrorCode::Unknown(0)));
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::Malformed {
            msg_type: MessageType::Err,
            what: "code 0"
        })
    );
    let mut no_rpc = bootstrap();
    no_rpc.rpc_qpn = 0;
    assert_eq!(
        Repr::parse_bytes(&bytes_of(Message::Bootstrap(no_rpc))),
        Err(WireError::Malformed {
            msg_type: MessageType::Bootstrap,
            what: "rpc qpn 0"
        })
    );
}

#[test]
fn bootstrap_payload_layout() {
    let b = bytes_of(Message::Bootstrap(bootstrap()));
    assert_eq!(b.len(), HEADER_LEN + 80);
    assert_eq!(MAX_MESSAGE_LEN, HEADER_LEN + 112);
    let p = &b[HEADER_LEN..];
    assert_eq!(&p[0..2], &LAYOUT_VERSION.to_le_bytes());
    assert_eq!(&p[4..8], &8u32.to_le_bytes());
    assert_eq!(&p[8..12], &1024u32.to_le_bytes());
    assert_eq!(&p[12..16], &0x1234u32.to_le_bytes());
    assert_eq!(&p[16..24], &0x7f00_0000_1000u64.to_le_bytes());
    assert_eq!(&p[40..56], server().gid.as_bytes());
    assert_eq!(&p[56..60], &0x0102_0304u32.to_le_bytes());
    assert_eq!(&p[60..64], &0x00a0_0b0cu32.to_le_bytes());
    assert_eq!(&p[64..72], &0x0a0b_0c0d_0e0f_1011u64.to_le_bytes());
    assert_eq!(&p[72..76], &0x1111_2222u32.to_le_bytes());
    assert_eq!(&p[76..80], &[0; 4]);
    let rpc = bootstrap().rpc_target();
    assert_eq!(
        (rpc.gid, rpc.qpn, rpc.qkey),
        (server().gid, 0x00a0_0b0c, 0x1111_2222)
    );
}

#[test]
fn emit_into_small_buffer() {
    let r = Repr {
        request_id: 0,
        message: Message::Bootstrap(bootstrap()),
    };
    let mut buf = [0u8; HEADER_LEN + 79];
    assert_eq!(
        r.emit(&mut buf),
        Err(WireError::BufferTooSmall {
            need: HEADER_LEN + 80,
            have: HEADER_LEN + 79
        })
    );
}

#[test]
fn message_types() {
    for t in 0..=255u8 {
        if let Some(mt) = MessageType::from_u8(t) {
            assert_eq!(mt as u8, t);
            assert_eq!(mt.is_request(), t < 0x80);
        }
    }
}

#[test]
fn bootstrap_geometry_checks() {
    let b = bootstrap();
    assert_eq!(b.layout_version, LAYOUT_VERSION);
    assert_eq!(b.geometry(), Ok(Geometry::new(1024, 8).unwrap()));
    assert_eq!(b.table_len, 1024 * 8 * 64);
    let mut x = b;
    x.layout_version = 2;
    assert_eq!(
        x.geometry(),
        Err(BootstrapError::LayoutVersion { found: 2 })
    );
    let mut x = b;
    x.entry_len = 128;
    assert_eq!(x.geometry(), Err(BootstrapError::EntryLen { found: 128 }));
    let mut x = b;
    x.n_buckets = 0;
    assert_eq!(
        x.geometry(),
        Err(BootstrapError::Geometry(GeometryError::ZeroBuckets))
    );
    let mut x = b;
    x.table_len += 64;
    assert_eq!(
        x.geometry(),
        Err(BootstrapError::TableLen {
            found: b.table_len + 64,
            expected: b.table_len
        })
    );
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0xb17e5);
    let mut buf = [0u8; HEADER_LEN + 8 + 2 * 96 + 16];
    let mut parsed = 0;
    for _ in 0..50_000 {
        let len = rng.gen_range(0..=buf.len());
        rng.fill_bytes(&mut buf[..len]);
        // Most of the time give it a valid magic, version, type and length,
        // so that the payload checks are reached.
        if len >= HEADER_LEN && rng.gen_bool(0.8) {
            buf[0..4].copy_from_slice(b"KRMT");
            buf[4] = WIRE_VERSION;
            let types = [1u8, 2, 3, 4, 5, 6, 7, 0x81, 0x82, 0x83, 0x84];
            let t = types[rng.gen_range(0..types.len())];
            buf[5] = t;
            let mut pl = MessageType::from_u8(t).unwrap().payload_len() as u16;
            if t == 0x84 && len >= HEADER_LEN + 8 {
                // A count that fits the buffer, the right entry length.
                let n = rng.gen_range(0..=((len - HEADER_LEN - 8) / 96).min(2));
                buf[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&(n as u16).to_le_bytes());
                buf[HEADER_LEN + 2..HEADER_LEN + 4].copy_from_slice(&96u16.to_le_bytes());
                pl = 8 + 96 * n as u16;
            }
            if (t == 5 || t == 6 || t == 7) && len >= HEADER_LEN + 32 && rng.gen_bool(0.7) {
                // A valid store name now and then.
                let name = &mut buf[HEADER_LEN..HEADER_LEN + 32];
                name.fill(0);
                name[..3].copy_from_slice(b"s-1");
            }
            buf[6..8].copy_from_slice(&pl.to_le_bytes());
            if rng.gen_bool(0.5) {
                // Zero the reserved bytes now and then.
                let end = len.min(HEADER_LEN + pl as usize);
                for b in &mut buf[HEADER_LEN..end] {
                    if rng.gen_bool(0.3) {
                        *b = 0;
                    }
                }
            }
        }
        if let Ok(r) = Repr::parse_bytes(&buf[..len]) {
            parsed += 1;
            // Whatever parses re-emits to the same bytes.
            assert_eq!(&r.to_bytes()[..], &buf[..r.buffer_len()]);
        }
        let _ = Packet::new_checked(&buf[..len]).map(|p| p.payload().len());
    }
    assert!(
        parsed > 1_000,
        "the fuzzer reached the payload parsers: {parsed}"
    );
}

#[test]
fn store_payload_layouts() {
    let b = bytes_of(store_join());
    assert_eq!(b.len(), HEADER_LEN + 112);
    let p = &b[HEADER_LEN..];
    assert_eq!(&p[0..7], b"store-0");
    assert!(p[7..32].iter().all(|&x| x == 0));
    assert_eq!(&p[32..34], &0x0102u16.to_le_bytes());
    assert_eq!(&p[34..36], &13u16.to_le_bytes());
    assert_eq!(&p[36..40], &[0; 4]);
    assert_eq!(&p[40..48], &0x1122_3344_5566u64.to_le_bytes());
    assert_eq!(&p[48..61], b"addr=10.0.0.1");
    assert!(p[61..112].iter().all(|&x| x == 0));

    let b = bytes_of(store_leave());
    assert_eq!(b.len(), HEADER_LEN + 40);
    assert_eq!(&b[HEADER_LEN..HEADER_LEN + 32], "z".repeat(32).as_bytes());
    assert_eq!(&b[HEADER_LEN + 32..HEADER_LEN + 34], &[0xff, 0xff]);

    let b = bytes_of(Message::StoreList {
        store: StoreName::new("s").unwrap(),
    });
    assert_eq!(b.len(), HEADER_LEN + 32);

    let b = bytes_of(members());
    assert_eq!(b.len(), HEADER_LEN + 8 + 2 * STORE_ENTRY_LEN);
    assert_eq!(&b[6..8], &((8 + 2 * 96) as u16).to_le_bytes());
    let p = &b[HEADER_LEN..];
    assert_eq!(&p[0..2], &2u16.to_le_bytes());
    assert_eq!(&p[2..4], &96u16.to_le_bytes());
    let e = &p[8 + 96..8 + 192];
    assert_eq!(&e[0..2], &7u16.to_le_bytes());
    assert_eq!(&e[2..4], &2u16.to_le_bytes());
    assert_eq!(&e[8..24], gid(7).as_bytes());
    assert_eq!(&e[24..32], &20u64.to_le_bytes());
    assert_eq!(&e[32..34], &[0xab, 0xab]);
    // The longest reply fits the header's u16 length.
    assert!(MAX_STORE_MEMBERS_LEN - HEADER_LEN <= u16::MAX as usize);
}

#[test]
fn store_names_are_checked() {
    let good = bytes_of(store_join());
    // A byte outside the alphabet, an empty name, a byte after the padding.
    for (off, v) in [(1, b'/'), (0, 0), (20, b'a'), (31, 1)] {
        let mut b = good.clone();
        b[HEADER_LEN + off] = v;
        assert_eq!(
            Repr::parse_bytes(&b),
            Err(WireError::BadStoreName(MessageType::StoreJoin)),
            "offset {off}"
        );
    }
    // A full 32-byte name has no NUL at all.
    let mut b = bytes_of(Message::StoreList {
        store: StoreName::new("s").unwrap(),
    });
    b[HEADER_LEN..HEADER_LEN + 32].fill(b'q');
    assert!(Repr::parse_bytes(&b).is_ok());
    b[HEADER_LEN + 31] = b' ';
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::BadStoreName(MessageType::StoreList))
    );
}

#[test]
fn store_value_rules() {
    // A record length over 64.
    let mut b = bytes_of(store_join());
    b[HEADER_LEN + 34..HEADER_LEN + 36].copy_from_slice(&65u16.to_le_bytes());
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::RecordTooLong(MessageType::StoreJoin))
    );
    // Emitting a record over 64 bytes gives bytes that parse rejects.
    let long = Message::StoreJoin(StoreJoinRepr {
        store: StoreName::new("s").unwrap(),
        id: 1,
        record: vec![1; 65],
        lease_ms: 1,
    });
    assert_eq!(
        Repr::parse_bytes(&bytes_of(long)),
        Err(WireError::RecordTooLong(MessageType::StoreJoin))
    );
    // Members: the entry length must be 96.
    let mut b = bytes_of(members());
    b[HEADER_LEN + 2] = 95;
    assert!(matches!(
        Repr::parse_bytes(&b),
        Err(WireError::Malformed {
            msg_type: MessageType::StoreMembers,
            ..
        })
    ));
    // A count that disagrees with the payload length.
    let mut b = bytes_of(members());
    b[HEADER_LEN] = 3;
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::PayloadLength {
            msg_type: MessageType::StoreMembers,
            expected: 8 + 3 * 96,
            got: 8 + 2 * 96
        })
    );
    // A payload under the 8-byte head.
    let mut b = bytes_of(Message::StoreMembers(vec![]));
    b[6] = 7;
    assert!(matches!(
        Repr::parse_bytes(&b),
        Err(WireError::PayloadLength { .. })
    ));
    // More than 255 members: emitted, refused.
    let many = |n: usize| {
        Message::StoreMembers(
            (0..n)
                .map(|i| StoreMember {
                    id: i as u16,
                    gid: gid(1),
                    record: vec![],
                    lease_expiry_ms: 1,
                })
                .collect(),
        )
    };
    assert!(matches!(
        Repr::parse_bytes(&bytes_of(many(256))),
        Err(WireError::Malformed {
            msg_type: MessageType::StoreMembers,
            what: "more than 255 members"
        })
    ));
    // More than the u16 length holds: truncated under the true count,
    // refused, no panic.
    let b = bytes_of(many(1000));
    assert!(b.len() <= HEADER_LEN + u16::MAX as usize);
    assert!(Repr::parse_bytes(&b).is_err());
    // A record over 64 bytes in an entry.
    let mut b = bytes_of(members());
    b[HEADER_LEN + 8 + 2..HEADER_LEN + 8 + 4].copy_from_slice(&65u16.to_le_bytes());
    assert_eq!(
        Repr::parse_bytes(&b),
        Err(WireError::RecordTooLong(MessageType::StoreMembers))
    );
}

#[test]
fn truncated_store_messages() {
    for m in [store_join(), store_leave(), members()] {
        let b = bytes_of(m.clone());
        for len in 0..b.len() {
            assert!(Repr::parse_bytes(&b[..len]).is_err(), "{m:?} at {len}");
        }
        assert!(Repr::parse_bytes(&b).is_ok());
    }
}
