//! Finding a meta server: well-known names on a sim fabric, the TCP
//! bootstrap, and untrusted bootstrap bytes.

mod common;

use common::*;
use krcore_meta::bootstrap::{
    decode, encode, fetch_bootstrap_tcp, fetch_store_tcp, lookup_on_sim, publish_on_sim,
    request_tcp, serve_bootstrap_tcp, serve_tcp, DEFAULT_NAME,
};
use krcore_meta::stores::{StoreError, StoreMember};
use krcore_meta::wire::{ErrorCode, Message, Repr, WireError};
use krcore_meta::{LocalMetaHost, MetaClient, MetaError};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::Nic;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn server(fabric: &SimFabric) -> LocalMetaHost<SimNic> {
    LocalMetaHost::start(
        SimNic::open(fabric, SimConfig::default()).unwrap(),
        config(),
    )
    .unwrap()
}

#[test]
fn publish_and_find_on_a_sim_fabric() {
    let fabric = SimFabric::in_memory();
    let mut s = server(&fabric);
    assert!(matches!(
        MetaClient::from_sim(&fabric, DEFAULT_NAME),
        Err(MetaError::NotPublished { .. })
    ));
    s.publish_on_sim(&fabric, DEFAULT_NAME).unwrap();
    let c = MetaClient::from_sim(&fabric, DEFAULT_NAME).unwrap();
    assert_eq!(*c.bootstrap(), s.bootstrap());
    assert_eq!(c.geometry(), s.geometry());
    let (remote, len) = c.bucket_of(&fake_gid(1));
    let g = s.geometry();
    assert_eq!(
        remote.addr,
        s.bootstrap().table.addr + g.bucket_offset(g.bucket_of(&fake_gid(1)))
    );
    assert_eq!(len, g.bucket_len());
    // The bootstrap names this server's node and DCT (no request endpoint).
    assert_eq!(c.bootstrap().server.gid, s.nic().gid());
    assert_eq!(c.bootstrap().rpc_target().gid, s.nic().gid());
    // Dropping the server removes its name.
    drop(s);
    assert!(matches!(
        lookup_on_sim(&fabric, DEFAULT_NAME),
        Err(MetaError::NotPublished { .. })
    ));
}

#[test]
fn a_successor_keeps_its_name() {
    let fabric = SimFabric::in_memory();
    let mut old = server(&fabric);
    old.publish_on_sim(&fabric, "meta-a").unwrap();
    let mut new = server(&fabric);
    new.publish_on_sim(&fabric, "meta-a").unwrap();
    drop(old);
    assert_eq!(
        lookup_on_sim(&fabric, "meta-a").unwrap(),
        new.bootstrap(),
        "the old server must not unpublish its successor"
    );
}

#[test]
fn bad_names_and_bad_bytes_are_typed_errors() {
    let fabric = SimFabric::in_memory();
    let s = server(&fabric);
    assert!(matches!(
        publish_on_sim(&fabric, "no/slashes", &s.bootstrap()),
        Err(MetaError::Nic { .. })
    ));
    fabric.publish("junk", b"not a bootstrap").unwrap();
    assert!(matches!(
        MetaClient::from_sim(&fabric, "junk"),
        Err(MetaError::BootstrapBytes(WireError::Truncated { .. }))
    ));
    let mut bad_magic = encode(&s.bootstrap());
    bad_magic[0] ^= 0xff;
    assert!(matches!(
        decode(&bad_magic),
        Err(MetaError::BootstrapBytes(WireError::BadMagic(_)))
    ));
    // A valid message of another type.
    let other = Repr {
        request_id: 0,
        message: Message::BootstrapRequest,
    }
    .to_bytes();
    assert!(matches!(
        decode(&other),
        Err(MetaError::UnexpectedReply { .. })
    ));
    // A table this build cannot read.
    let mut b = s.bootstrap();
    b.table_len += 64;
    assert!(matches!(decode(&encode(&b)), Err(MetaError::Bootstrap(_))));
    // Truncated bytes.
    let good = encode(&s.bootstrap());
    for len in 0..good.len() {
        assert!(decode(&good[..len]).is_err());
    }
    assert_eq!(decode(&good).unwrap(), s.bootstrap());
}

#[test]
fn tcp_bootstrap_round_trip_and_stop() {
    let fabric = SimFabric::in_memory();
    let s = server(&fabric);
    let tcp = s.serve_bootstrap_tcp("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr();
    for _ in 0..3 {
        let b = fetch_bootstrap_tcp(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(b, s.bootstrap());
    }
    let c = MetaClient::from_tcp(addr, Duration::from_secs(5)).unwrap();
    assert_eq!(*c.bootstrap(), s.bootstrap());
    drop(tcp);
    let start = Instant::now();
    let e = fetch_bootstrap_tcp(addr, Duration::from_millis(500)).unwrap_err();
    assert!(matches!(e, MetaError::Connect { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn tcp_bootstrap_from_a_stranger_is_rejected() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nhello");
    });
    let e = fetch_bootstrap_tcp(addr, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, MetaError::BootstrapBytes(_)), "{e:?}");
    t.join().unwrap();
}

#[test]
fn tcp_bootstrap_that_never_answers_times_out() {
    // Accepts (the kernel does) but never writes.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let start = Instant::now();
    let e = fetch_bootstrap_tcp(addr, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, MetaError::Timeout { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(l);
}

/// A v2 server: answers every connection, on connect, with v2 bootstrap
/// bytes (the v3 format but the version byte), and keeps the connection
/// until the client closes it.
#[test]
fn tcp_server_of_another_wire_version_is_a_typed_error() {
    let fabric = SimFabric::in_memory();
    let s = server(&fabric);
    let mut v2 = encode(&s.bootstrap());
    v2[4] = 2;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut c, _) = l.accept().unwrap();
            let _ = c.write_all(&v2);
            let mut sink = Vec::new();
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = c.read_to_end(&mut sink);
        }
    });
    let e = fetch_bootstrap_tcp(addr, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::WireVersion {
                ours: krcore_meta::wire::WIRE_VERSION,
                theirs: 2
            }
        ),
        "{e:?}"
    );
    let e = fetch_store_tcp(addr, "s", Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::WireVersion {
                ours: krcore_meta::wire::WIRE_VERSION,
                theirs: 2
            }
        ),
        "{e:?}"
    );
    t.join().unwrap();
}

#[test]
fn tcp_unreachable_address_is_a_typed_error_within_the_timeout() {
    // A port that was just free: nothing listens on it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let start = Instant::now();
    let e = fetch_store_tcp(addr, "s", Duration::from_millis(500)).unwrap_err();
    match &e {
        MetaError::Connect { addr: a, source } => {
            assert_eq!(a, &addr.to_string());
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
            assert!(e.to_string().contains(&addr.to_string()), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn tcp_store_list_that_never_answers_times_out() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let start = Instant::now();
    let e = fetch_store_tcp(addr, "s", Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, MetaError::Timeout { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(l);
}

#[test]
fn tcp_requests_and_handlers() {
    let fabric = SimFabric::in_memory();
    let s = server(&fabric);
    let b = s.bootstrap();
    // The simple server keeps no stores.
    let tcp = serve_bootstrap_tcp("127.0.0.1:0", &b).unwrap();
    let e = fetch_store_tcp(tcp.local_addr(), "s", Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&e, MetaError::NoSuchStore { store } if store == "s"),
        "{e:?}"
    );
    // A bad name is refused before anything is sent.
    let e = fetch_store_tcp(tcp.local_addr(), "a b", Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(e, MetaError::Store(StoreError::BadStoreName { .. })),
        "{e:?}"
    );
    // A reply type as a request.
    let r = request_tcp(
        tcp.local_addr(),
        Message::Bootstrap(b),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(r.message, Message::Err(ErrorCode::UnexpectedMessage));
    drop(tcp);

    // A handler with members; one slow client does not stall others.
    let members = vec![StoreMember {
        id: 1,
        gid: krcore_nic::Gid([1; 16]),
        record: b"hello".to_vec(),
        lease_expiry_ms: 77,
    }];
    let listed = members.clone();
    let tcp = serve_tcp(
        "127.0.0.1:0",
        Arc::new(move |r: &Repr| match &r.message {
            Message::StoreList { store } if store.as_str() == "s" => {
                Message::StoreMembers(listed.clone())
            }
            Message::StoreList { .. } => Message::Err(ErrorCode::NoSuchStore),
            Message::BootstrapRequest => Message::Bootstrap(b),
            _ => Message::Err(ErrorCode::UnexpectedMessage),
        }),
    )
    .unwrap();
    let addr = tcp.local_addr();
    let _stuck = std::net::TcpStream::connect(addr).unwrap();
    let mut half = std::net::TcpStream::connect(addr).unwrap();
    half.write_all(b"KRM").unwrap();
    assert_eq!(
        fetch_store_tcp(addr, "s", Duration::from_secs(5)).unwrap(),
        members
    );
    assert_eq!(
        fetch_bootstrap_tcp(addr, Duration::from_secs(5)).unwrap(),
        b
    );
    let e = fetch_store_tcp(addr, "t", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, MetaError::NoSuchStore { .. }), "{e:?}");
    // A v2 request gets Err(UnsupportedVersion) in our format.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let mut req = Repr {
        request_id: 5,
        message: Message::BootstrapRequest,
    }
    .to_bytes();
    req[4] = 2;
    c.write_all(&req).unwrap();
    let mut reply = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.read_to_end(&mut reply).unwrap();
    let r = Repr::parse_bytes(&reply).unwrap();
    assert_eq!(
        (r.request_id, r.message),
        (5, Message::Err(ErrorCode::UnsupportedVersion))
    );
    // A stranger's bytes: closed without a reply.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = c.read_to_end(&mut reply);
    assert!(reply.is_empty());
}
