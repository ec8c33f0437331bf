//! A node attached to the node daemon (`Node::attach`): the same `Vqp`,
//! `MemoryRegion` and messaging API as an in-process node, with no NIC
//! and no QP of the process's own; what the daemon does not carry is
//! refused, typed.

#[allow(dead_code)] // the fork helpers belong to the fork tests
mod common;

use common::Dir;
use krcore::{
    Access, DaemonError, EngineConfig, EngineMode, Error, Node, SendWr, Ungranted, Wc, WcStatus,
};
use krcore_kmod::daemon::{Daemon, DaemonConfig, PostCode};
use krcore_nic::AnyNic;
use std::time::Duration;

struct Setup {
    // Dropped in this order: the daemon, the nodes, the fabric.
    daemon: Daemon<AnyNic>,
    server: Node,
    _daemon_node: Node,
    socket: std::path::PathBuf,
    _sock_dir: tempfile::TempDir,
    _dir: Dir,
}

/// A memory node hosting the meta table on a directory fabric, and a
/// daemon node on it (registered, its pool made at start, as `krcored`).
fn setup(tag: &str) -> Setup {
    Setup::with(tag, DaemonConfig::default())
}

impl Setup {
    fn with(tag: &str, daemon_cfg: DaemonConfig) -> Setup {
        setup_with(tag, daemon_cfg)
    }
}

fn setup_with(tag: &str, daemon_cfg: DaemonConfig) -> Setup {
    let dir = Dir::new("attached", tag);
    let server = Node::builder()
        .fabric(&dir.spec())
        .host_meta()
        .build()
        .unwrap();
    let mut cfg = EngineConfig::default();
    cfg.prestart = cfg.pool_size;
    cfg.eager_start = true;
    let daemon_node = Node::builder().join(&server).config(cfg).build().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = sock_dir.path().join("krcored.sock");
    let daemon = Daemon::start(daemon_node.engine().unwrap().clone(), &socket, daemon_cfg).unwrap();
    Setup {
        daemon,
        server,
        _daemon_node: daemon_node,
        socket,
        _sock_dir: sock_dir,
        _dir: dir,
    }
}

/// Polls `vqp` until completions come (`Vqp::poll_wait`: through the
/// daemon, the waiting thread sleeps until the daemon completes a WR): how
/// many.
fn first_completions(vqp: &krcore::Vqp, wc: &mut [Wc]) -> usize {
    let n = vqp.poll_wait(wc, Duration::from_secs(10)).unwrap();
    assert!(n > 0, "no completion within 10 s");
    n
}

#[test]
fn an_attached_node_moves_data_with_the_sdk_api_and_creates_no_qp() {
    let s = setup("api");
    let region = s.server.alloc(4096, Access::ALL).unwrap();
    region.write(0, b"hello, daemon").unwrap();
    let token = region.token();

    let client = Node::attach(&s.socket).unwrap();
    assert!(client.is_attached());
    assert_eq!(client.gid(), s.daemon.engine().gid());
    assert_eq!(client.mode(), EngineMode::Dc);
    let before = client.daemon_stats().unwrap().unwrap();

    // Requests: READ, WRITE, CAS, FAA.
    let vqp = client.connect(token.gid).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &token, 0, 13).unwrap().wait().unwrap();
    let mut got = [0u8; 13];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, daemon");
    buf.write(16, b"back").unwrap();
    vqp.write(&buf, 16, &token, 100, 4).unwrap().wait().unwrap();
    let mut back = [0u8; 4];
    region.read(100, &mut back).unwrap();
    assert_eq!(&back, b"back");
    let old = vqp.compare_and_swap(&token, 64, 0, 42).unwrap().wait();
    assert_eq!(old.unwrap().old_value, Some(0));
    assert_eq!(region.load_u64(64).unwrap(), 42);
    let old = vqp.fetch_add(&token, 64, 1).unwrap().wait().unwrap();
    assert_eq!(
        (old.old_value, region.load_u64(64).unwrap()),
        (Some(42), 43)
    );

    // Verbs level: one doorbell, the caller's wr_ids, one signaled.
    vqp.grant(&token).unwrap();
    let mut wrs = [
        SendWr::write(1, buf.sge(0, 5).unwrap(), token.at(200)).signaled(false),
        SendWr::read(2, buf.sge(32, 5).unwrap(), token.at(200)),
    ];
    vqp.post(&mut wrs).unwrap();
    let mut wc = [Wc::default(); 4];
    let n = first_completions(&vqp, &mut wc);
    assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 2, WcStatus::Success));
    // Nothing in flight: the wait (asleep on the ring between looks) ends
    // at its timeout with nothing.
    assert_eq!(
        vqp.poll_wait(&mut wc, Duration::from_millis(30)).unwrap(),
        0
    );
    let mut echo = [0u8; 5];
    buf.read(32, &mut echo).unwrap();
    assert_eq!(&echo, b"hello");

    // Several SGEs (a gathered WRITE, a scattered READ) and inline data
    // travel in a continuation slot; a doorbell of such WRs takes two
    // slots each.
    buf.write(40, b"gath").unwrap();
    buf.write(48, b"ered").unwrap();
    let gather =
        krcore::SgList::from_slice(&[buf.sge(40, 4).unwrap(), buf.sge(48, 4).unwrap()]).unwrap();
    let scatter = krcore::SgList::from_slice(&[
        buf.sge(56, 2).unwrap(),
        buf.sge(60, 3).unwrap(),
        buf.sge(8, 3).unwrap(),
    ])
    .unwrap();
    let mut wrs = [
        SendWr {
            payload: krcore::Payload::Local(gather),
            ..SendWr::write(3, buf.sge(40, 4).unwrap(), token.at(300)).signaled(false)
        },
        SendWr {
            payload: krcore::Payload::Inline(krcore::InlineData::new(b"inline!").unwrap()),
            ..SendWr::write(4, buf.sge(0, 1).unwrap(), token.at(308)).signaled(false)
        },
        SendWr {
            payload: krcore::Payload::Local(scatter),
            ..SendWr::read(5, buf.sge(56, 2).unwrap(), token.at(300))
        },
    ];
    vqp.post(&mut wrs).unwrap();
    let n = first_completions(&vqp, &mut wc);
    assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 5, WcStatus::Success));
    let mut remote = [0u8; 15];
    region.read(300, &mut remote).unwrap();
    assert_eq!(&remote, b"gatheredinline!");
    let mut got = [0u8; 8];
    buf.read(56, &mut got[..2]).unwrap();
    buf.read(60, &mut got[2..5]).unwrap();
    buf.read(8, &mut got[5..]).unwrap();
    assert_eq!(&got, b"gathered");
    // A second SGE naming memory that is not this process's is refused by
    // the daemon like a first one.
    let foreign = krcore::SgList::from_slice(&[
        buf.sge(0, 4).unwrap(),
        krcore::Sge {
            addr: 0x10,
            length: 4,
            lkey: buf.sge(0, 4).unwrap().lkey ^ 1,
        },
    ])
    .unwrap();
    let mut wrs = [SendWr {
        payload: krcore::Payload::Local(foreign),
        ..SendWr::read(6, buf.sge(0, 4).unwrap(), token.at(300))
    }];
    match vqp.post(&mut wrs) {
        Err(Error::Daemon(DaemonError::Post {
            code: PostCode::ForeignMemory,
            index: 0,
            ..
        })) => {}
        other => panic!("expected the daemon's refusal, got {other:?}"),
    }

    // Range checks are local and typed.
    assert!(matches!(
        vqp.read(&buf, 0, &token, 4090, 8),
        Err(Error::OutOfRange { .. })
    ));

    // No NIC here, and the daemon's NIC made no QP for this process: its
    // pool was made at start, the connect was a lookup.
    assert_eq!(client.counters().qps_created, 0);
    let after = client.daemon_stats().unwrap().unwrap();
    assert_eq!(
        after.qps_created, before.qps_created,
        "{before:?} {after:?}"
    );
    assert_eq!(after.clients, 1);
    assert!(after.network_ops > before.network_ops);

    // A second VQP to the same node: a hit in the node-wide DCCache.
    let again = client.connect(token.gid).unwrap();
    let hits = client.daemon_stats().unwrap().unwrap();
    assert_eq!(hits.meta_reads, after.meta_reads);
    assert_eq!(hits.connect_hits, after.connect_hits + 1);
    again.read(&buf, 0, &token, 0, 5).unwrap().wait().unwrap();
}

#[test]
fn what_the_daemon_does_not_carry_is_refused_typed() {
    let s = setup("refused");
    let region = s.server.alloc(4096, Access::ALL).unwrap();
    let client = Node::builder().daemon(&s.socket).build().unwrap();
    let unsupported = |r: Result<(), Error>| matches!(r, Err(Error::Unsupported(_)));
    assert!(unsupported(client.engine().map(drop)));
    assert!(unsupported(client.local_target().map(drop)));
    assert!(unsupported(client.fork(|_| 0).map(drop)));
    let buf = client.alloc(4096, Access::ALL).unwrap();
    assert!(buf.raw().is_none());
    // A GID the meta table does not know: the engine's UnknownNode, as in
    // process (a caller may wait for the node to register), by both
    // connects.
    let nobody = krcore_nic::Gid([7; 16]);
    let unknown = |r: Result<(), Error>| matches!(r, Err(Error::Engine(krcore::EngineError::UnknownNode { gid })) if gid == nobody);
    assert!(unknown(client.connect(nobody).map(drop)));
    let grant = krcore_kmod::RemoteGrant {
        addr: 0,
        len: 8,
        access: Access::REMOTE_READ,
        expires_at: None,
    };
    assert!(unknown(client.connect_granted(nobody, 1, grant).map(drop)));
    let vqp = client.connect(region.token().gid).unwrap();
    assert!(vqp.raw().is_none());
    assert!(unsupported(vqp.set_ungranted(Ungranted::Allow)));
    vqp.set_ungranted(Ungranted::Refuse).unwrap();
    // The upgrade hint reaches the daemon's engine: this target has no
    // upgrade endpoint, so the engine refuses, typed, and the VQP stays on
    // DC, working.
    assert!(matches!(vqp.upgrade(), Err(Error::Daemon(_))));
    assert_eq!(vqp.path(), krcore::VqpPath::Dc);

    // A remote key no grant covers: the daemon's pre-check refuses it,
    // nothing reaches the NIC.
    let mut wrs = [SendWr::read(
        1,
        buf.sge(0, 8).unwrap(),
        region.remote_addr(0),
    )];
    match vqp.post(&mut wrs) {
        Err(Error::Daemon(DaemonError::Post {
            code: PostCode::Rejected,
            ..
        })) => {}
        other => panic!("expected the pre-check's refusal, got {other:?}"),
    }
    // A region of this process is deregistered when its last handle
    // goes; a clone keeps it.
    let keep = buf.clone();
    let buf = match buf.deregister() {
        Err(e) => e.region,
        Ok(()) => panic!("a clone is alive"),
    };
    drop(keep);
    buf.deregister().unwrap();
}

#[test]
fn builder_and_attach_errors_are_typed() {
    let s = setup("errors");
    let missing = s.socket.with_file_name("nobody.sock");
    assert!(matches!(
        Node::attach(&missing),
        Err(Error::Daemon(DaemonError::NoDaemon { .. }))
    ));
    for b in [
        Node::builder().daemon(&s.socket).fabric("sim:mem"),
        Node::builder().daemon(&s.socket).host_meta(),
        Node::builder().daemon(&s.socket).register(true),
    ] {
        assert!(matches!(b.build(), Err(Error::Builder(_))));
    }
    // The daemon stops: the attached node's calls fail typed, no hang,
    // and it can attach again to a new daemon.
    let client = Node::attach(&s.socket).unwrap();
    let region = s.server.alloc(64, Access::ALL).unwrap();
    let vqp = client.connect(region.token().gid).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &region.token(), 0, 8)
        .unwrap()
        .wait()
        .unwrap();
    s.daemon.shutdown();
    let r = vqp
        .read(&buf, 0, &region.token(), 0, 8)
        .and_then(|r| r.wait());
    assert!(matches!(r, Err(Error::Daemon(_))), "{r:?}");
}

/// Messaging from an attached node: a VQP's pushes and replies, and an
/// endpoint's (request/response with window 1, the channel closed after),
/// go through the daemon's engine to a port of an in-process node; the
/// port's refusals and the size limit come back as the same typed errors.
#[test]
fn an_attached_node_pushes_and_gets_replies_through_the_daemon() {
    use krcore::messaging::RefuseCode;
    use krcore::MsgError;
    let s = setup("msg");
    let port = s.server.bind(9).unwrap();
    let client = Node::builder().daemon(&s.socket).build().unwrap();
    let gid = s.server.gid();
    let serve = |n: usize| {
        for _ in 0..n {
            let m = port.pop().unwrap();
            let mut answer = b"re:".to_vec();
            answer.extend(m.to_vec());
            port.reply(&m, &answer).unwrap();
        }
    };
    let vqp = client.connect(gid).unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| serve(2));
        vqp.push(9, b"ping").unwrap();
        assert_eq!(vqp.pop_reply().unwrap().to_vec(), b"re:ping");
        let ep = client.endpoint_with_window(1).unwrap();
        ep.push(gid, 9, b"req").unwrap();
        let m = ep.pop_reply_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((m.to_vec(), m.port), (b"re:req".to_vec(), 9));
        assert_eq!(m.from.gid, gid);
        let start = std::time::Instant::now();
        while !ep.close_channel(gid, 9).unwrap() {
            assert!(start.elapsed() < Duration::from_secs(10), "never idle");
            std::thread::yield_now();
        }
        assert_eq!(ep.credits(gid, 9), None, "closed");
        assert!(ep.try_pop_reply().unwrap().is_none());
        match ep.push(gid, 10, b"nobody") {
            Err(MsgError::Refused {
                code: RefuseCode::Unbound,
                port: 10,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let big = vec![0u8; krcore_kmod::daemon::wire::MAX_MSG_BYTES + 1];
        assert!(matches!(
            ep.push(gid, 9, &big),
            Err(MsgError::TooLarge { .. })
        ));
    });
    assert_eq!(s.daemon.stats().clients, 1);
}

/// An attached endpoint opens a channel ahead of need through the
/// daemon: the first call sends the Open and says "not open yet" without
/// waiting for the port's node; a later one says open once the port
/// answered, and a push then goes with the channel's credit. An unbound
/// port's refusal comes back typed.
#[test]
fn an_attached_endpoint_opens_a_channel_ahead() {
    use krcore::messaging::RefuseCode;
    use krcore::MsgError;
    use std::time::Instant;
    let s = setup("ahead");
    let port = s.server.bind(9).unwrap();
    let client = Node::builder().daemon(&s.socket).build().unwrap();
    let gid = s.server.gid();
    let ep = client.endpoint_with_window(1).unwrap();
    std::thread::scope(|sc| {
        // The port's node: drains its receives (answers the Opens) until
        // the message comes.
        let served = sc.spawn(|| {
            let start = Instant::now();
            loop {
                if let Some(m) = port.try_pop().unwrap() {
                    return m.to_vec();
                }
                assert!(start.elapsed() < Duration::from_secs(20), "no message");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(
            !ep.open_ahead(gid, 9).unwrap(),
            "the Open went out; its answer cannot be in yet"
        );
        let start = Instant::now();
        while !ep.open_ahead(gid, 9).unwrap() {
            assert!(start.elapsed() < Duration::from_secs(10), "never opened");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ep.credits(gid, 9), Some(1), "open, with its window");
        ep.push(gid, 9, b"ahead").unwrap();
        assert_eq!(served.join().unwrap(), b"ahead");
        let start = Instant::now();
        loop {
            match ep.open_ahead(gid, 10) {
                Ok(false) => {
                    assert!(start.elapsed() < Duration::from_secs(10), "never refused");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(MsgError::Refused {
                    code: RefuseCode::Unbound,
                    port: 10,
                    ..
                }) => break,
                other => panic!("{other:?}"),
            }
        }
    });
}

/// Receiving on an attached node: a port bound through the daemon gets an
/// in-process node's pushes (in order, up to the engine's 16 MiB limit,
/// past the 64 KiB a request may carry) and its replies reach the sender;
/// the port is the node's: another attached process's bind of it is
/// `PortInUse` until the holder unbinds it or goes.
#[test]
fn an_attached_node_binds_a_port_and_replies_through_the_daemon() {
    use krcore::MsgError;
    let s = setup("port");
    let server = Node::builder().daemon(&s.socket).build().unwrap();
    let other = Node::builder().daemon(&s.socket).build().unwrap();
    let port = server.bind(21).unwrap();
    assert_eq!(port.port(), 21);
    assert!(matches!(
        other.bind(21),
        Err(Error::Msg(MsgError::PortInUse { port: 21 }))
    ));
    assert!(matches!(
        other.bind(u16::MAX),
        Err(Error::Msg(MsgError::ReservedPort { .. }))
    ));

    // An in-process sender (the meta node) pushes three messages, one of
    // them larger than a request frame may be.
    let ep = s.server.endpoint().unwrap();
    let to = server.gid();
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            ep.push(to, 21, b"one").unwrap();
            ep.push(to, 21, b"two").unwrap();
            ep.push(to, 21, &big).unwrap();
            for want in [&b"re:one"[..], b"re:two", b"re:big"] {
                let r = ep.pop_reply_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(r.to_vec(), want);
                assert_eq!(r.port, 21);
            }
        });
        for (want, answer) in [
            (&b"one"[..], &b"re:one"[..]),
            (b"two", b"re:two"),
            (&big[..], b"re:big"),
        ] {
            let m = port.pop_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(m.to_vec(), want);
            assert_eq!(m.from.gid, s.server.gid());
            port.reply(&m, answer).unwrap();
        }
    });
    assert!(port.try_pop().unwrap().is_none());
    assert_eq!(port.queued(), 0);
    assert!(matches!(
        port.pop_timeout(Duration::from_millis(50)),
        Err(MsgError::Timeout(_))
    ));
    let too_big = vec![0u8; krcore_kmod::daemon::wire::MAX_MSG_BYTES + 1];
    ep.push(to, 21, b"x").unwrap();
    let m = port.pop_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(
        port.reply(&m, &too_big),
        Err(MsgError::TooLarge { .. })
    ));

    // Unbound by its drop: the other process takes it; and a process that
    // goes releases its ports.
    drop(port);
    let taken = other.bind(21).unwrap();
    drop(other);
    drop(taken);
    let start = std::time::Instant::now();
    let again = loop {
        match server.bind(21) {
            Ok(p) => break p,
            Err(Error::Msg(MsgError::PortInUse { .. })) => {
                assert!(start.elapsed() < Duration::from_secs(10), "never released");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(again.port(), 21);
}

/// A process that binds a port and goes without unbinding it (its socket
/// closes, as a killed process's does): the daemon unbinds it.
#[test]
fn a_port_of_a_process_that_went_is_released() {
    use krcore::MsgError;
    use krcore_kmod::daemon::wire::{frame_len_within, Reply, Request, MAX_REPLY_FRAME};
    use std::io::{Read, Write};
    let s = setup("port-gone");
    let mut raw = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
    let mut call = |req: Request| {
        raw.write_all(&req.encode()).unwrap();
        let mut prefix = [0u8; 4];
        raw.read_exact(&mut prefix).unwrap();
        let mut body = vec![0u8; frame_len_within(prefix, MAX_REPLY_FRAME).unwrap()];
        raw.read_exact(&mut body).unwrap();
        Reply::decode(&body).unwrap()
    };
    let hello = Request::Hello {
        version: krcore_kmod::daemon::PROTOCOL_VERSION,
        pid: 1,
    };
    assert!(matches!(call(hello), Reply::Welcome { .. }));
    let bound = call(Request::BindPort {
        port: 22,
        reclaiming: 0,
    });
    assert!(matches!(bound, Reply::Port { .. }), "{bound:?}");
    let next = Node::builder().daemon(&s.socket).build().unwrap();
    assert!(matches!(
        next.bind(22),
        Err(Error::Msg(MsgError::PortInUse { port: 22 }))
    ));
    drop(raw);
    let start = std::time::Instant::now();
    loop {
        match next.bind(22) {
            Ok(_) => break,
            Err(Error::Msg(MsgError::PortInUse { .. })) => {
                assert!(start.elapsed() < Duration::from_secs(10), "never released");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Leases on an attached node's memory: made by the daemon's engine (a key
/// of its NIC's own over the range), honoured by the NIC for a peer until
/// revoked (then `REM_ACCESS_ERR`), refused typed as in-process (access,
/// range), keeping the region from `deregister` while live, limited per
/// process, and revoked when the process goes.
#[test]
fn an_attached_region_is_leased_and_revoked_at_the_nic() {
    use krcore::LeaseError;
    let s = Setup::with(
        "lease",
        DaemonConfig {
            max_leases: 3,
            ..Default::default()
        },
    );
    let owner = Node::attach(&s.socket).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    region.store_u64(64, 77).unwrap();
    let peer = &s.server;
    let vqp = peer.connect(owner.gid()).unwrap();
    let buf = peer.alloc(64, Access::LOCAL_WRITE).unwrap();

    let (id, lease) = region
        .lease_with_id(64, 8, Access::REMOTE_READ, Duration::from_secs(60))
        .unwrap();
    assert_eq!((lease.gid, lease.len), (owner.gid(), 8));
    assert_ne!(lease.rkey, region.token().rkey);
    assert_eq!(region.live_leases(), 1);
    vqp.read(&buf, 0, &lease, 0, 8).unwrap().wait().unwrap();
    assert_eq!(buf.load_u64(0).unwrap(), 77);
    // Outside its access: the holder's own pre-check refuses a WRITE.
    assert!(vqp.write(&buf, 0, &lease, 0, 8).is_err());

    // Typed refusals before the daemon, as in-process.
    let ro = owner.alloc(64, Access::REMOTE_READ).unwrap();
    assert!(matches!(
        ro.lease(0, 8, Access::REMOTE_WRITE, Duration::from_secs(1)),
        Err(Error::Lease(LeaseError::AccessMissing(_)))
    ));
    assert!(matches!(
        region.lease(4090, 8, Access::REMOTE_READ, Duration::from_secs(1)),
        Err(Error::OutOfRange { .. })
    ));

    // Live leases keep the region registered.
    let region = match region.deregister() {
        Err(e) => {
            assert!(
                matches!(e.reason, LeaseError::Live { live: 1, .. }),
                "{:?}",
                e.reason
            );
            e.region
        }
        Ok(()) => panic!("deregistered with a live lease"),
    };
    // Revoked: the key is dead at the NIC when revoke returns.
    assert!(region.revoke(id));
    assert!(!region.revoke(id));
    assert_eq!(region.live_leases(), 0);
    match vqp.read(&buf, 0, &lease, 0, 8).unwrap().wait() {
        Err(Error::Failed { status, .. }) => assert_eq!(status, WcStatus::RemAccessErr),
        other => panic!("{other:?}"),
    }

    // The quota: 3 live leases per process.
    let leases: Vec<_> = (0..3)
        .map(|i| {
            region
                .lease(i * 8, 8, Access::REMOTE_READ, Duration::from_secs(60))
                .unwrap()
        })
        .collect();
    match region.lease(0, 8, Access::REMOTE_READ, Duration::from_secs(60)) {
        Err(Error::Daemon(DaemonError::Refused { code, .. })) => {
            assert_eq!(code, krcore_kmod::daemon::wire::RefuseCode::Quota)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(region.revoke_leases(), 3);

    // A process that goes has its leases revoked.
    let live = region
        .lease(64, 8, Access::REMOTE_READ, Duration::from_secs(60))
        .unwrap();
    vqp.read(&buf, 0, &live, 0, 8).unwrap().wait().unwrap();
    drop(leases);
    drop(ro);
    drop(region);
    drop(owner);
    let start = std::time::Instant::now();
    loop {
        match vqp.read(&buf, 0, &live, 0, 8).unwrap().wait() {
            Ok(_) => {
                assert!(start.elapsed() < Duration::from_secs(10), "never revoked");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(Error::Failed { status, .. }) => {
                assert_eq!(status, WcStatus::RemAccessErr);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
}
