use super::gid;
use crate::registry::Lease;
use crate::stores::*;
use crate::wire::{ErrorCode, Message, Repr, StoreJoinRepr};

fn name(s: &str) -> StoreName {
    StoreName::new(s).unwrap()
}

#[test]
fn store_names() {
    for ok in ["s", "a.b_c-D9", &"x".repeat(32)] {
        assert_eq!(StoreName::new(ok).unwrap().as_str(), ok);
    }
    for bad in ["", "a b", "a/b", "é", &"x".repeat(33), "a\0"] {
        assert!(
            matches!(StoreName::new(bad), Err(StoreError::BadStoreName { .. })),
            "{bad:?}"
        );
    }
    let mut r = StoreRegistry::default();
    assert!(matches!(
        r.join("no way", 0, gid(1), b"", 10, 0),
        Err(StoreError::BadStoreName { .. })
    ));
    assert!(matches!(
        r.list("", 0),
        Err(StoreError::BadStoreName { .. })
    ));
    assert!(matches!(
        r.leave("?", 0, gid(1)),
        Err(StoreError::BadStoreName { .. })
    ));
    assert_eq!(name("s").padded()[1..], [0u8; 31]);
}

#[test]
fn join_list_and_renew() {
    let mut r = StoreRegistry::default();
    let a = r.join("s", 0, gid(1), b"rec-a", 100, 0).unwrap();
    let b = r.join("s", 1, gid(2), b"rec-b", 50, 10).unwrap();
    assert_eq!(a.lease_expiry_ms, 100);
    assert_eq!(b.lease_expiry_ms, 60);
    assert!(b.epoch > a.epoch && a.epoch != 0);
    let l = r.list("s", 20).unwrap();
    assert_eq!(
        l,
        vec![
            StoreMember {
                id: 0,
                gid: gid(1),
                record: b"rec-a".to_vec(),
                lease_expiry_ms: 100
            },
            StoreMember {
                id: 1,
                gid: gid(2),
                record: b"rec-b".to_vec(),
                lease_expiry_ms: 60
            },
        ]
    );
    // Same id, same GID: a renewal, new record, same epoch, later expiry.
    let a2 = r.join("s", 0, gid(1), b"new", 100, 50).unwrap();
    assert_eq!(a2.epoch, a.epoch);
    assert_eq!(a2.lease_expiry_ms, 150);
    assert_eq!(r.list("s", 50).unwrap()[0].record, b"new");
    // A shorter renewal does not move the lease backwards.
    let a3 = r.join("s", 0, gid(1), b"new", 1, 60).unwrap();
    assert_eq!(a3.lease_expiry_ms, 150);
    // Another store is another namespace.
    r.join("t", 0, gid(9), b"", 10, 0).unwrap();
    assert_eq!(r.n_stores(), 2);
    assert_eq!(r.n_members(), 3);
}

#[test]
fn a_live_id_held_by_another_gid_is_refused() {
    let mut r = StoreRegistry::default();
    r.join("s", 1, gid(1), b"x", 100, 0).unwrap();
    assert_eq!(
        r.join("s", 1, gid(2), b"y", 100, 99),
        Err(StoreError::MemberExists {
            store: name("s"),
            id: 1,
            holder: gid(1)
        })
    );
    assert_eq!(r.list("s", 99).unwrap()[0].record, b"x");
    // Expired: anyone may take it (a new epoch).
    let first = r.list("s", 0).unwrap()[0].clone();
    let l = r.join("s", 1, gid(2), b"y", 100, 100).unwrap();
    assert_eq!(l.lease_expiry_ms, 200);
    let m = &r.list("s", 100).unwrap()[0];
    assert_eq!((m.gid, &m.record[..]), (gid(2), &b"y"[..]));
    assert_ne!(m.gid, first.gid);
}

#[test]
fn leave_only_by_the_holder() {
    let mut r = StoreRegistry::default();
    r.join("s", 0, gid(1), b"a", 100, 0).unwrap();
    r.join("s", 1, gid(2), b"b", 100, 0).unwrap();
    assert_eq!(
        r.leave("s", 0, gid(2)),
        Err(StoreError::NotHolder {
            store: name("s"),
            id: 0,
            holder: gid(1)
        })
    );
    assert_eq!(
        r.leave("s", 5, gid(1)),
        Err(StoreError::NoSuchMember {
            store: name("s"),
            id: 5
        })
    );
    assert_eq!(
        r.leave("u", 0, gid(1)),
        Err(StoreError::NoSuchStore { store: name("u") })
    );
    let gone = r.leave("s", 0, gid(1)).unwrap();
    assert_eq!((gone.id, gone.gid, gone.record), (0, gid(1), b"a".to_vec()));
    assert_eq!(r.list("s", 1).unwrap().len(), 1);
    r.leave("s", 1, gid(2)).unwrap();
    // The last member gone, the store is gone.
    assert_eq!(
        r.list("s", 1),
        Err(StoreError::NoSuchStore { store: name("s") })
    );
    assert_eq!(r.n_stores(), 0);
}

#[test]
fn list_shows_live_members_only_and_sweep_removes_expired() {
    let mut r = StoreRegistry::default();
    assert_eq!(
        r.list("s", 0),
        Err(StoreError::NoSuchStore { store: name("s") })
    );
    r.join("s", 0, gid(1), b"", 10, 0).unwrap();
    r.join("s", 1, gid(2), b"", 20, 0).unwrap();
    r.join("t", 0, gid(3), b"", 5, 0).unwrap();
    assert_eq!(r.list("s", 9).unwrap().len(), 2);
    // Expired at its expiry, before any sweep.
    assert_eq!(r.list("s", 10).unwrap().len(), 1);
    assert_eq!(
        r.list("t", 5),
        Err(StoreError::NoSuchStore { store: name("t") })
    );
    let mut gone = r.sweep(10);
    gone.sort();
    assert_eq!(gone, vec![(name("s"), 0, gid(1)), (name("t"), 0, gid(3))]);
    assert_eq!((r.n_stores(), r.n_members()), (1, 1));
    assert_eq!(r.sweep(10), vec![]);
    assert_eq!(r.sweep(20), vec![(name("s"), 1, gid(2))]);
    assert_eq!(r.n_stores(), 0);
    // An expired member can still be removed by its holder before a sweep.
    r.join("s", 0, gid(1), b"", 1, 0).unwrap();
    assert!(r.leave("s", 0, gid(1)).is_ok());
}

#[test]
fn records_and_leases_are_checked() {
    let mut r = StoreRegistry::default();
    assert!(r.join("s", 0, gid(1), &[7; RECORD_MAX], 1, 0).is_ok());
    assert_eq!(
        r.join("s", 1, gid(1), &[7; RECORD_MAX + 1], 1, 0),
        Err(StoreError::RecordTooLong {
            len: RECORD_MAX + 1
        })
    );
    assert_eq!(
        r.join("s", 1, gid(1), b"", 0, 0),
        Err(StoreError::InvalidLease)
    );
    // A lease to the end of time saturates.
    let l = r.join("s", 2, gid(1), b"", u64::MAX, 5).unwrap();
    assert_eq!(l.lease_expiry_ms, u64::MAX);
}

#[test]
fn bounded_stores_and_members() {
    let mut r = StoreRegistry::new(2);
    r.join("a", 0, gid(1), b"", 10, 0).unwrap();
    r.join("b", 0, gid(1), b"", 100, 0).unwrap();
    assert_eq!(
        r.join("c", 0, gid(1), b"", 10, 0),
        Err(StoreError::StoreFull { store: name("c") })
    );
    // Joining an existing store is fine.
    r.join("a", 1, gid(1), b"", 10, 0).unwrap();
    // Once "a" has expired, "c" takes its place.
    r.join("c", 0, gid(1), b"", 10, 10).unwrap();
    assert_eq!(r.n_stores(), 2);

    let mut r = StoreRegistry::default();
    for id in 0..MAX_MEMBERS as u16 {
        r.join("s", id, gid(u64::from(id)), b"", 10, 0).unwrap();
    }
    assert_eq!(
        r.join("s", 999, gid(1), b"", 10, 0),
        Err(StoreError::StoreFull { store: name("s") })
    );
    // A renewal of a member of a full store is fine.
    r.join("s", 3, gid(3), b"", 10, 0).unwrap();
    // Expired members make room.
    r.join("s", 999, gid(1), b"", 10, 10).unwrap();
    assert_eq!(r.list("s", 10).unwrap().len(), 1);
}

#[test]
fn handle_applies_store_requests_with_the_sender_gid() {
    let mut r = StoreRegistry::default();
    let join = Message::StoreJoin(StoreJoinRepr {
        store: name("s"),
        id: 4,
        record: b"r".to_vec(),
        lease_ms: 10,
    });
    let Some(Message::Ok(Lease {
        lease_expiry_ms, ..
    })) = r.handle(&join, gid(1), 5)
    else {
        panic!("join refused")
    };
    assert_eq!(lease_expiry_ms, 15);
    assert_eq!(r.list("s", 5).unwrap()[0].gid, gid(1));
    assert_eq!(
        r.handle(&join, gid(2), 6),
        Some(Message::Err(ErrorCode::MemberExists))
    );
    let list = Message::StoreList { store: name("s") };
    assert!(matches!(r.handle(&list, gid(9), 6), Some(Message::StoreMembers(m)) if m.len() == 1));
    let leave = Message::StoreLeave {
        store: name("s"),
        id: 4,
    };
    assert_eq!(
        r.handle(&leave, gid(2), 6),
        Some(Message::Err(ErrorCode::NotHolder))
    );
    assert!(matches!(r.handle(&leave, gid(1), 6), Some(Message::Ok(_))));
    assert_eq!(
        r.handle(&list, gid(9), 6),
        Some(Message::Err(ErrorCode::NoSuchStore))
    );
    assert_eq!(r.handle(&Message::BootstrapRequest, gid(1), 0), None);
}

#[test]
fn meta_table_handles_store_requests_only_with_stores() {
    let (mut t, b) = super::requests::setup();
    let mut r = StoreRegistry::default();
    let req = |m| {
        Repr {
            request_id: 9,
            message: m,
        }
        .to_bytes()
    };
    let join = req(Message::StoreJoin(StoreJoinRepr {
        store: name("s"),
        id: 0,
        record: vec![],
        lease_ms: 10,
    }));
    let reply = t.handle(&join, 0, &b).unwrap();
    assert_eq!(reply.message, Message::Err(ErrorCode::UnexpectedMessage));
    let reply = t.handle_with_stores(&mut r, gid(1), &join, 0, &b).unwrap();
    assert!(matches!(reply.message, Message::Ok(_)));
    assert_eq!(reply.request_id, 9);
    assert_eq!(r.list("s", 0).unwrap()[0].gid, gid(1));
    // Lists travel over TCP, not messaging.
    let list = req(Message::StoreList { store: name("s") });
    let reply = t.handle_with_stores(&mut r, gid(1), &list, 0, &b).unwrap();
    assert_eq!(reply.message, Message::Err(ErrorCode::UnexpectedMessage));
    // A bad name in the bytes is answered BadStoreName.
    let mut bad = join.clone();
    bad[crate::wire::HEADER_LEN] = b' ';
    let reply = t.handle_with_stores(&mut r, gid(1), &bad, 0, &b).unwrap();
    assert_eq!(reply.message, Message::Err(ErrorCode::BadStoreName));
}
