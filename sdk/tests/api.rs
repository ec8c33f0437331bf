//! The SDK's user-facing behaviour on `sim:mem`.

use std::time::Duration;

use krcore::sim::SimNic;
use krcore::{
    Access, EngineConfig, EngineError, Error, Node, Reason, RemoteRegion, SendWr, VqpError, Wc,
    WcStatus,
};

fn pair() -> (Node, Node) {
    let server = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let client = Node::builder().join(&server).build().unwrap();
    (server, client)
}

#[test]
fn tokens_round_trip_through_serde() {
    let (server, _) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.remote_region(64, 128, Access::REMOTE_READ).unwrap();
    let json = serde_json::to_string(&token).unwrap();
    let back: RemoteRegion = serde_json::from_str(&json).unwrap();
    assert_eq!(back, token);
    assert_eq!(back.gid, server.gid());
    assert_eq!(back.at(8).addr, region.remote_addr(72).addr);
    assert!(matches!(
        region.remote_region(4000, 128, Access::REMOTE_READ),
        Err(Error::OutOfRange { .. })
    ));
}

#[test]
fn a_token_bounds_every_operation_through_the_precheck() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    // A read-only token over 64..128.
    let token = region.remote_region(64, 64, Access::REMOTE_READ).unwrap();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &token, 0, 64).unwrap().wait().unwrap();
    // The high-level layer checks ranges itself...
    assert!(matches!(
        vqp.read(&buf, 0, &token, 60, 8),
        Err(Error::OutOfRange { .. })
    ));
    // ...and the engine's pre-check enforces the grant's access flags.
    match vqp.write(&buf, 0, &token, 0, 8) {
        Err(Error::Vqp(VqpError::Rejected(r))) => {
            assert!(
                matches!(r.reason, Reason::RemoteAccessMissing { .. }),
                "{r}"
            )
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // Hand-built WRs outside the known grant are rejected too.
    let mut wr = [SendWr::read(1, buf.sge(0, 8).unwrap(), token.at(64))];
    match vqp.post(&mut wr) {
        Err(Error::Vqp(VqpError::Rejected(r))) => {
            assert!(matches!(r.reason, Reason::RemoteOutOfGrant { .. }), "{r}")
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(client.counters().error_completions, 0);
}

/// `poll_wait`: the completion once it came; `Ok(0)` after the timeout
/// when nothing is in flight, and at once for an empty slice.
#[test]
fn poll_wait_returns_completions_or_nothing_after_its_timeout() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    region.write(8, b"abcdefgh").unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let mut wc = [Wc::default(); 4];
    assert_eq!(
        vqp.poll_wait(&mut wc, Duration::from_millis(20)).unwrap(),
        0
    );
    vqp.grant(&token).unwrap();
    let mut wrs = [SendWr::read(9, buf.sge(0, 8).unwrap(), token.at(8))];
    vqp.post(&mut wrs).unwrap();
    assert_eq!(vqp.poll_wait(&mut [], Duration::from_secs(10)).unwrap(), 0);
    let n = vqp.poll_wait(&mut wc, Duration::from_secs(10)).unwrap();
    assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 9, WcStatus::Success));
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"abcdefgh");
    assert_eq!(
        vqp.poll_wait(&mut wc, Duration::from_millis(20)).unwrap(),
        0
    );
}

#[test]
fn requests_and_user_completions_do_not_mix() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(256, Access::LOCAL_WRITE).unwrap();
    let mut req = vqp.fetch_add(&token, 0, 5).unwrap();
    let mut wrs = [SendWr::read(77, buf.sge(0, 8).unwrap(), token.at(8))];
    vqp.post(&mut wrs).unwrap();
    let mut wc = [Wc::default(); 8];
    let mut got = Vec::new();
    while got.is_empty() {
        let n = vqp.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
    }
    assert_eq!(got.len(), 1, "only the user's completion: {got:?}");
    assert_eq!(got[0].wr_id, 77);
    let done = req.wait_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(done.old_value, Some(0));
    assert_eq!(region.load_u64(0).unwrap(), 5);
    assert!(req.try_wait().unwrap().is_some(), "stays finished");
    // Dropped requests do not leak into later polls.
    drop(vqp.fetch_add(&token, 0, 1).unwrap());
    assert_eq!(vqp.poll(&mut wc).unwrap(), 0);
    // The reserved bit is refused at the verbs layer.
    let mut wrs = [SendWr::read(
        krcore::REQUEST_WR_ID_BIT | 1,
        buf.sge(0, 8).unwrap(),
        token.at(8),
    )];
    assert!(matches!(vqp.post(&mut wrs), Err(Error::ReservedWrId(_))));
}

#[test]
fn many_requests_in_flight_keep_their_old_values() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let mut olds = Vec::new();
    // 3 x 300 in flight: more than the VQP's depth (128) at once.
    for _ in 0..3 {
        let reqs: Vec<_> = (0..300)
            .map(|_| vqp.fetch_add(&token, 8, 1).unwrap())
            .collect();
        for r in reqs {
            olds.push(r.wait().unwrap().old_value.unwrap());
        }
    }
    olds.sort_unstable();
    assert_eq!(
        olds,
        (0..900).collect::<Vec<u64>>(),
        "each FAA saw a distinct value"
    );
}

#[test]
fn a_failed_request_is_a_typed_error() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    server
        .engine()
        .unwrap()
        .nic()
        .as_sim()
        .expect("a sim node")
        .kill();
    match vqp.read(&buf, 0, &token, 0, 8).unwrap().wait() {
        Err(Error::Failed { status, .. }) => assert_eq!(status, WcStatus::RetryExcErr),
        other => panic!("expected a failed request, got {other:?}"),
    }
    // The target was invalidated; the dead node's meta table is gone too.
    assert!(vqp.target().is_none());
    assert!(matches!(
        vqp.connect(server.gid()),
        Err(Error::Engine(EngineError::MetaUnavailable { .. }))
    ));
}

#[test]
fn builder_settings_are_checked() {
    let (server, _) = pair();
    let err = Node::builder()
        .join(&server)
        .host_meta()
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Builder(_)), "{err}");
    let err = Node::builder().fabric("tcp:nope").build().unwrap_err();
    assert!(matches!(err, Error::Nic(_)), "{err}");
    // Without a meta server, connects can only hit the cache.
    let lonely = Node::builder().build().unwrap();
    let err = lonely.connect(server.gid()).unwrap_err();
    assert!(
        matches!(err, Error::Engine(EngineError::NoMetaServer { .. })),
        "{err}"
    );
}

#[test]
fn any_nic_through_with_nic() {
    let (server, _) = pair();
    let nic = SimNic::open(server.fabric().unwrap(), Default::default()).unwrap();
    let cfg = EngineConfig::default().with_meta(server.meta_location().unwrap());
    let node: Node<SimNic> = Node::with_nic(nic, cfg).unwrap();
    let region = server.alloc(64, Access::ALL).unwrap();
    region.write(0, b"generic!").unwrap();
    let vqp = node.connect(server.gid()).unwrap();
    let buf = node.alloc(8, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &region.token(), 0, 8)
        .unwrap()
        .wait()
        .unwrap();
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"generic!");
}

#[test]
fn joined_nodes_register_by_messages_to_the_embedded_host() {
    let server = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let host = server.meta_server().unwrap().host();
    // The host is in its own table by a local call, not a message.
    assert_eq!(host.stats().requests, 0);
    assert!(server.lease_stats().is_none());
    let member = Node::builder()
        .join(&server)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(host.stats().requests, 1, "one Register message");
    assert_eq!(member.lease_stats().unwrap().registrations, 1);
    // A compute node that opts out is in no table (and sends nothing).
    let compute = Node::builder()
        .join(&server)
        .register(false)
        .build()
        .unwrap();
    assert!(compute.lease_stats().is_none());
    assert_eq!(host.stats().requests, 1);
    // Both reach the member by one READ of the table, and the host by its.
    compute.connect(member.gid()).unwrap();
    compute.connect(server.gid()).unwrap();
    assert_eq!(compute.engine().unwrap().stats().meta.reads, 2);
    // The host's own engine resolves nodes through its table too.
    server.connect(member.gid()).unwrap();
    assert!(matches!(
        server.connect(compute.gid()),
        Err(Error::Engine(EngineError::UnknownNode { .. }))
    ));
    // A lease under 1 ms is refused, typed (nothing registered).
    let r = Node::builder().join(&server).lease(Duration::ZERO).build();
    assert!(
        matches!(r, Err(Error::Engine(EngineError::Config(_)))),
        "{r:?}"
    );
    assert_eq!(host.stats().requests, 1);
    // No UD QP on the host: its engine's DCT and DCIs only.
    let s = server.engine().unwrap().stats();
    assert_eq!(s.handshake_endpoints_created, 0);
    assert_eq!(
        server.counters().qps_created,
        u64::from(s.dcts_created) + s.dcis as u64
    );
}

/// User completions a request's waiter moved aside come back from
/// `poll` first and in post order, through an `out` smaller than what
/// is stashed; request completions never show up in `poll`.
#[test]
fn stashed_user_completions_keep_their_order() {
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    vqp.grant(&token).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let post = |ids: std::ops::Range<u64>| {
        for id in ids {
            let mut wr = [SendWr::read(id, buf.sge(0, 8).unwrap(), token.at(8))];
            vqp.post(&mut wr).unwrap();
        }
    };
    post(1..11);
    // Waiting polls the engine: the ten user completions go aside.
    let old = vqp.fetch_add(&token, 0, 1).unwrap().wait().unwrap();
    assert_eq!(old.old_value, Some(0));
    post(11..21);
    let pending = vqp.fetch_add(&token, 0, 1).unwrap();
    post(21..24);
    let mut got = Vec::new();
    let mut out = [Wc::default(); 3];
    for _ in 0..1_000_000 {
        let n = vqp.poll(&mut out).unwrap();
        got.extend(out[..n].iter().map(|wc| wc.wr_id));
        if got.len() >= 23 {
            break;
        }
    }
    assert_eq!(got, (1..24).collect::<Vec<u64>>());
    // The request's completion was kept for its waiter.
    let done = pending.wait().unwrap();
    assert_eq!(done.old_value, Some(1));
    assert_eq!(vqp.poll(&mut out).unwrap(), 0);
}

/// Two threads share one VQP, each running its own fetch-and-add counter
/// one request at a time: every old value must be its own counter's next
/// value. A small VQP reuses slots quickly, so an atomic's scratch word
/// written by one thread's later request while another thread had polled,
/// but not yet read, its own would show as a foreign or repeated value.
#[test]
fn atomics_on_one_vqp_from_two_threads_keep_their_own_old_values() {
    let server = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let mut cfg = EngineConfig::default();
    cfg.policy.max_unsignaled = 2;
    cfg.vqp_depth = 4;
    let client = Node::builder().join(&server).config(cfg).build().unwrap();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    const OPS: u64 = 20_000;
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (vqp, token) = (vqp.clone(), token);
            std::thread::spawn(move || {
                for i in 0..OPS {
                    let c = vqp.fetch_add(&token, 64 * t, 1).unwrap().wait().unwrap();
                    assert_eq!(c.old_value, Some(i), "thread {t}, op {i}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(region.load_u64(0).unwrap(), OPS);
    assert_eq!(region.load_u64(64).unwrap(), OPS);
}

/// The next completion of `vqp`'s verbs-level posts (bounded wait).
fn first_completion(vqp: &krcore::Vqp) -> krcore::Wc {
    let mut wc = [krcore::Wc::default()];
    let t0 = std::time::Instant::now();
    while vqp.poll(&mut wc).unwrap() == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "no completion"
        );
    }
    wc[0]
}

/// A raw post to a key the VQP knows no grant for is refused before the
/// NIC (`Error::NotGranted`), until the VQP is granted the token or opts
/// out; a lease's key dies at the NIC when the lease is revoked, even for
/// a VQP that opted out of the pre-check's grant rule.
#[test]
fn raw_posts_need_a_grant_and_a_revoked_lease_key_fails_at_the_nic() {
    use krcore::{Error, Ungranted, WcStatus};
    let (server, client) = pair();
    let region = server.alloc(4096, Access::ALL).unwrap();
    region.store_u64(8, 5).unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let read = |at| [SendWr::read(1, buf.sge(0, 8).unwrap(), at)];
    match vqp.post(&mut read(token.at(8))) {
        Err(Error::NotGranted {
            index: 0,
            rkey,
            addr,
        }) => {
            assert_eq!((rkey, addr), (token.rkey, token.addr + 8))
        }
        other => panic!("{other:?}"),
    }
    vqp.grant(&token).unwrap();
    vqp.post(&mut read(token.at(8))).unwrap();
    assert_eq!(first_completion(&vqp).status, WcStatus::Success);
    assert_eq!(buf.load_u64(0).unwrap(), 5);
    // A lease, posted by a VQP that opted out: the NIC alone judges it.
    let (id, lease) = region
        .lease_with_id(
            8,
            8,
            Access::REMOTE_READ,
            std::time::Duration::from_secs(60),
        )
        .unwrap();
    assert_ne!(lease.rkey, token.rkey);
    let raw = client.connect(server.gid()).unwrap();
    raw.set_ungranted(Ungranted::Allow).unwrap();
    raw.post(&mut read(lease.at(0))).unwrap();
    assert_eq!(first_completion(&raw).status, WcStatus::Success);
    assert!(region.revoke(id));
    raw.post(&mut read(lease.at(0))).unwrap();
    assert_eq!(first_completion(&raw).status, WcStatus::RemAccessErr);
    // Through the request API (which makes the token's grant known): a
    // live lease reads, a revoked one fails at the NIC, typed.
    let (id, lease) = region
        .lease_with_id(
            8,
            8,
            Access::REMOTE_READ,
            std::time::Duration::from_secs(60),
        )
        .unwrap();
    vqp.read(&buf, 0, &lease, 0, 8).unwrap().wait().unwrap();
    assert_eq!(buf.load_u64(0).unwrap(), 5);
    assert!(region.revoke(id));
    match vqp.read(&buf, 0, &lease, 0, 8).unwrap().wait() {
        Err(Error::Failed { status, .. }) => assert_eq!(status, WcStatus::RemAccessErr),
        other => panic!("{other:?}"),
    }
}
