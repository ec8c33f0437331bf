use super::gid;
use crate::registry::{Lease, MetaTable};
use crate::table::{find_in_bucket, Geometry};
use crate::wire::*;
use krcore_nic::{DcTarget, RemoteAddr, UdTarget};
use rand::{Rng, RngCore, SeedableRng};

fn target(n: u64) -> DcTarget {
    DcTarget {
        gid: gid(n),
        dct_num: n as u32,
        dc_key: n,
    }
}

pub(super) fn setup() -> (MetaTable, BootstrapRepr) {
    let g = Geometry::new(4, 1).unwrap();
    let b = BootstrapRepr::new(
        g,
        RemoteAddr {
            addr: 0x1000,
            rkey: 9,
        },
        1,
        target(0),
        UdTarget {
            gid: gid(0),
            qpn: 5,
            qkey: 6,
        },
    );
    (MetaTable::with_vec(g), b)
}

fn call(t: &mut MetaTable, b: &BootstrapRepr, id: u64, m: Message, now: u64) -> Message {
    let req = Repr {
        request_id: id,
        message: m,
    }
    .to_bytes();
    let reply = t.handle(&req, now, b).expect("a reply");
    assert_eq!(reply.request_id, id);
    // The reply survives the wire.
    assert_eq!(Repr::parse_bytes(&reply.to_bytes()), Ok(reply.clone()));
    reply.message
}

/// A Renew of `target(n)`'s registration.
fn renew(n: u64) -> Message {
    Message::Renew {
        gid: gid(n),
        dct_num: target(n).dct_num,
    }
}

/// A Deregister of `target(n)`'s registration.
fn deregister(n: u64) -> Message {
    Message::Deregister {
        gid: gid(n),
        dct_num: target(n).dct_num,
    }
}

fn ok(epoch: u32, lease_expiry_ms: u64, replaced_dct: u32) -> Message {
    Message::Ok(Lease {
        epoch,
        lease_expiry_ms,
        replaced_dct,
    })
}

fn register(n: u64, lease_ms: u64) -> Message {
    Message::Register(RegisterRepr {
        target: target(n),
        lid: 1,
        lease_ms,
    })
}

#[test]
fn request_reply_flow() {
    let (mut t, b) = setup();
    assert_eq!(
        call(&mut t, &b, 1, Message::BootstrapRequest, 0),
        Message::Bootstrap(b)
    );
    assert_eq!(
        call(&mut t, &b, 2, register(1, 100), 1_000),
        ok(1, 1_100, 0)
    );
    // The client reads the table described by the bootstrap reply.
    let g = b.geometry().unwrap();
    let bucket = &t.memory()[g.bucket_range(g.bucket_of(&gid(1)))];
    assert_eq!(find_in_bucket(bucket, &gid(1)).unwrap().unwrap().epoch, 1);
    assert_eq!(call(&mut t, &b, 3, renew(1), 1_050), ok(1, 1_150, 0));
    assert_eq!(call(&mut t, &b, 4, deregister(1), 1_060), ok(1, 1_150, 0));
}

#[test]
fn table_errors_become_codes() {
    let (mut t, b) = setup();
    let e = |c| Message::Err(c);
    assert_eq!(
        call(&mut t, &b, 1, renew(1), 0),
        e(ErrorCode::NotRegistered)
    );
    assert_eq!(
        call(&mut t, &b, 2, deregister(1), 0),
        e(ErrorCode::NotRegistered)
    );
    assert_eq!(
        call(&mut t, &b, 3, register(1, 0), 0),
        e(ErrorCode::InvalidLease)
    );
    call(&mut t, &b, 4, register(1, 10), 0);
    assert_eq!(
        call(&mut t, &b, 5, renew(1), 10),
        e(ErrorCode::LeaseExpired)
    );
    // Another DCT registered at the GID: the first may not renew or remove it.
    let second = Message::Register(RegisterRepr {
        target: DcTarget {
            dct_num: 9,
            ..target(1)
        },
        lid: 1,
        lease_ms: 100,
    });
    assert_eq!(
        call(&mut t, &b, 7, second, 20),
        ok(2, 120, 0),
        "the first's lease had run out"
    );
    for (id, m) in [(8, renew(1)), (9, deregister(1))] {
        assert_eq!(call(&mut t, &b, id, m, 30), e(ErrorCode::Replaced));
    }
    assert_eq!(
        call(&mut t, &b, 10, register(1, 100), 40),
        ok(3, 140, 9),
        "the second's lease ran: replaced"
    );
    // One slot per bucket: a second GID in gid(1)'s bucket is refused.
    let g = t.geometry();
    let other = (2..)
        .find(|&n| g.bucket_of(&gid(n)) == g.bucket_of(&gid(1)))
        .unwrap();
    assert_eq!(
        call(&mut t, &b, 6, register(other, 10), 0),
        e(ErrorCode::BucketFull)
    );
}

#[test]
fn replies_sent_as_requests_are_refused() {
    let (mut t, b) = setup();
    for m in [
        ok(1, 0, 0),
        Message::Err(ErrorCode::Internal),
        Message::Bootstrap(b),
    ] {
        assert_eq!(
            call(&mut t, &b, 1, m, 0),
            Message::Err(ErrorCode::UnexpectedMessage)
        );
    }
    assert!(t.is_empty());
}

#[test]
fn unparsable_requests() {
    let (mut t, b) = setup();
    let good = Repr {
        request_id: 77,
        message: renew(1),
    }
    .to_bytes();
    // Not a meta message: no reply.
    assert_eq!(t.handle(&good[..HEADER_LEN - 1], 0, &b), None);
    let mut bad = good.clone();
    bad[1] ^= 0xff;
    assert_eq!(t.handle(&bad, 0, &b), None);
    // A meta header with a bad body: answered with the request id.
    let expect = |code| {
        Some(Repr {
            request_id: 77,
            message: Message::Err(code),
        })
    };
    assert_eq!(t.handle(&good[..20], 0, &b), expect(ErrorCode::Malformed));
    let mut v2 = good.clone();
    v2[4] = 9;
    assert_eq!(t.handle(&v2, 0, &b), expect(ErrorCode::UnsupportedVersion));
    let mut ty = good;
    ty[5] = 0x55;
    assert_eq!(t.handle(&ty, 0, &b), expect(ErrorCode::Malformed));
}

#[test]
fn random_requests_never_panic() {
    let (mut t, b) = setup();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5e7);
    let mut buf = [0u8; MAX_MESSAGE_LEN];
    for now in 0..20_000u64 {
        let len = rng.gen_range(0..=buf.len());
        rng.fill_bytes(&mut buf[..len]);
        if len >= HEADER_LEN && rng.gen_bool(0.9) {
            buf[0..4].copy_from_slice(b"KRMT");
            buf[4] = WIRE_VERSION;
            buf[5] = rng.gen_range(1..=4);
            let pl = MessageType::from_u8(buf[5]).unwrap().payload_len() as u16;
            buf[6..8].copy_from_slice(&pl.to_le_bytes());
            if buf[5] == 1 && len >= HEADER_LEN + 24 {
                buf[HEADER_LEN + 22..HEADER_LEN + 24].fill(0);
            }
        }
        if let Some(r) = t.handle(&buf[..len], now, &b) {
            assert!(!r.message.msg_type().is_request());
        }
        if now % 100 == 0 {
            t.sweep(now);
        }
    }
}
