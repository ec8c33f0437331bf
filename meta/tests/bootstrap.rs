//! Finding a meta server: well-known names on a sim fabric, the TCP
//! bootstrap, and untrusted bootstrap bytes.

mod common;

use common::*;
use krcore_meta::bootstrap::{
    decode, encode, fetch_bootstrap_tcp, lookup_on_sim, publish_on_sim, DEFAULT_NAME,
};
use krcore_meta::wire::{Message, Repr, WireError};
use krcore_meta::{MetaClient, MetaError, MetaServer};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::Nic;
use std::io::Write;
use std::time::{Duration, Instant};

fn server(fabric: &SimFabric) -> MetaServer<SimNic> {
    MetaServer::start(
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
    assert!(matches!(e, MetaError::Io { .. }), "{e:?}");
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
    assert!(matches!(e, MetaError::Io { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(l);
}
