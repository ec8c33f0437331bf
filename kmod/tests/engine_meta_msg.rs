//! DC mode: meta registration over messaging. The meta server is an
//! engine ([`MsgMetaHost`]): Register/Renew/Deregister arrive as messages
//! on its reserved port, lookups stay one-sided READs of its table (no
//! server CPU), bad input is dropped or refused and counted, leases are
//! swept, and nobody serving is a bounded typed error.

use std::sync::Arc;
use std::time::Duration;

use krcore_kmod::{Engine, EngineConfig, EngineError, MetaFailure, MsgMetaHost, META_PORT};
use krcore_meta::table::Geometry;
use krcore_meta::wire::ErrorCode;
use krcore_meta::MetaConfig;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, MemoryRegion, SendWr, Wc, WcStatus};

struct Fabric {
    fabric: SimFabric,
}

impl Fabric {
    fn new() -> Fabric {
        Fabric {
            fabric: SimFabric::in_memory(),
        }
    }

    fn engine(&self, cfg: EngineConfig) -> Engine<SimNic> {
        let nic = SimNic::open(&self.fabric, SimConfig::default()).unwrap();
        // (The tests post rkeys by hand: the grant rule's opt-out.)
        Engine::start(nic, cfg.with_ungranted(krcore_kmod::Ungranted::Allow)).unwrap()
    }

    /// The meta node: an engine hosting the table.
    fn meta(&self) -> MsgMetaHost<SimNic> {
        let e = self.engine(EngineConfig::default().with_pool_size(1));
        let cfg = MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            lease_sweep_ms: 0,
            ..MetaConfig::default()
        };
        MsgMetaHost::start(&e, cfg).unwrap()
    }
}

fn node(f: &Fabric, host: &MsgMetaHost<SimNic>, timeout: Duration) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_meta(host.location().unwrap());
    cfg.meta_timeout = timeout;
    f.engine(cfg)
}

/// Whether `client`, its cache entry for `gid` dropped, finds `gid`
/// unknown to the meta table.
fn unknown_after_invalidate(client: &Engine<SimNic>, gid: &krcore_nic::Gid) -> bool {
    client.invalidate(gid);
    matches!(client.resolve(gid), Err(EngineError::UnknownNode { .. }))
}

/// A meta host served by its own thread, and a node of it with its target.
fn hosted(
    f: &Fabric,
) -> (
    Arc<MsgMetaHost<SimNic>>,
    krcore_kmod::MetaHostThread,
    Engine<SimNic>,
    krcore_nic::DcTarget,
) {
    let host = Arc::new(f.meta());
    let thread = host.spawn(Duration::from_micros(50)).unwrap();
    let mem = node(f, &host, Duration::from_secs(2));
    let t = mem.local_target().unwrap();
    (host, thread, mem, t)
}

/// Runs `f` while a thread serves `host` at its own clock (stopped however
/// `f` ends).
fn served<R>(host: &MsgMetaHost<SimNic>, f: impl FnOnce() -> R) -> R {
    struct Done<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Release);
        }
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                host.progress().unwrap();
                std::thread::yield_now();
            }
        });
        let _done = Done(&done);
        f()
    })
}

fn read8(
    e: &Engine<SimNic>,
    target: &Engine<SimNic>,
    mr: &krcore_kmod::OwnedMr<SimNic>,
) -> Result<[u8; 8], EngineError> {
    let v = e.create_vqp().unwrap();
    v.connect(target.gid())?;
    let buf = e.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    v.post_send(&mut [SendWr::read(1, buf.sge(0, 8).unwrap(), mr.remote(0))])
        .unwrap();
    let mut wc = [Wc::default()];
    let start = std::time::Instant::now();
    while v.poll(&mut wc).unwrap() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    Ok(got)
}

#[test]
fn registration_arrives_as_a_message_and_lookups_stay_reads() {
    let f = Fabric::new();
    let host = f.meta();
    let mem = node(&f, &host, Duration::from_secs(2));
    let mr = mem.alloc_mr(64, Access::ALL).unwrap();
    mr.write(0, b"via msg!").unwrap();
    let t = mem.local_target().unwrap();
    let lease = served(&host, || mem.meta_register(t, 0, 60_000)).unwrap();
    // It arrived as a message on the reserved port of the host's DCT/SRQ.
    let ms = host.engine().msg_stats();
    assert_eq!(
        (ms.granted, ms.inline_delivered, ms.malformed),
        (1, 1, 0),
        "{ms:?}"
    );
    assert_eq!(host.stats().requests, 1);
    assert_eq!(mem.msg_stats().inline_delivered, 1, "the Ok reply");
    // Lookups are one READ of the table: the host's CPU is not involved
    // (nobody serves from here on).
    let client = node(&f, &host, Duration::from_secs(2));
    assert_eq!(&read8(&client, &mem, &mr).unwrap(), b"via msg!");
    let entry = client.resolve(&mem.gid()).unwrap();
    assert_eq!((entry.target, entry.epoch), (t, lease.epoch));
    assert_eq!(client.stats().meta.reads, 1);
    assert_eq!(host.stats().requests, 1, "no request for the lookup");
    // Renew keeps the epoch; deregister removes the entry.
    let renewed = served(&host, || mem.meta_renew(&t)).unwrap();
    assert_eq!(renewed.epoch, lease.epoch);
    served(&host, || mem.meta_deregister(&t)).unwrap();
    assert!(unknown_after_invalidate(&client, &mem.gid()));
    // A second deregister is refused, typed.
    let r = served(&host, || mem.meta_deregister(&t));
    assert!(
        matches!(
            r,
            Err(EngineError::MetaRefused {
                code: ErrorCode::NotRegistered,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(host.stats().requests, 4);
    // No UD QP anywhere: the host's engine made a DCT and a DCI only.
    assert_eq!(host.engine().stats().handshake_endpoints_created, 0);
}

#[test]
fn bad_messages_on_the_meta_port_never_stop_the_host() {
    let f = Fabric::new();
    let host = f.meta();
    let peer = node(&f, &host, Duration::from_secs(2));
    let ep = peer.endpoint().unwrap();
    let to = host.engine().gid();
    // The meta node is in no table: its address is the bootstrap's.
    peer.cache().insert(host.bootstrap().server, 0);
    served(&host, || {
        ep.push(to, META_PORT, b"not a meta request").unwrap();
        ep.push(to, META_PORT, &[0u8; 3]).unwrap();
        // A descriptor (past the inline limit) to the reserved port.
        let big = vec![1u8; peer.config().msg.inline_max + 1];
        ep.push(to, META_PORT, &big).unwrap();
    });
    let start = std::time::Instant::now();
    while host.engine().msg_stats().malformed == 0 || host.stats().dropped < 2 {
        host.progress().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            host.stats()
        );
    }
    let s = host.stats();
    assert_eq!((s.dropped, s.requests), (2, 0), "{s:?}");
    // The host still serves.
    let t = peer.local_target().unwrap();
    served(&host, || peer.meta_register(t, 0, 60_000)).unwrap();
    assert_eq!(host.stats().requests, 1);
}

#[test]
fn expired_leases_are_swept() {
    let f = Fabric::new();
    let host = f.meta();
    let mem = node(&f, &host, Duration::from_secs(2));
    let t = mem.local_target().unwrap();
    let lease = served(&host, || mem.meta_register(t, 0, 50)).unwrap();
    host.progress_at(lease.lease_expiry_ms + 1).unwrap();
    assert_eq!(host.stats().swept, 1);
    let client = node(&f, &host, Duration::from_secs(2));
    assert!(matches!(
        client.resolve(&mem.gid()),
        Err(EngineError::UnknownNode { .. })
    ));
}

#[test]
fn nobody_serving_is_a_bounded_typed_error() {
    let f = Fabric::new();
    let host = f.meta();
    let mem = node(&f, &host, Duration::from_millis(20));
    let t = mem.local_target().unwrap();
    let r = mem.meta_register(t, 0, 60_000);
    // Nobody grants the request channel: no try could even send.
    assert!(
        matches!(
            r,
            Err(EngineError::MetaUnavailable {
                failure: MetaFailure::NoAnswer {
                    attempts: 3,
                    unsent: 3,
                    ..
                },
                ..
            })
        ),
        "{r:?}"
    );
    let shown = r.unwrap_err().to_string();
    assert!(
        shown.contains("3 tries") && shown.contains("3 of them not sent"),
        "{shown}"
    );
}

#[test]
fn a_host_thread_serves_and_stops() {
    let f = Fabric::new();
    let host = Arc::new(f.meta());
    let thread = host.spawn(Duration::from_micros(50)).unwrap();
    let mem = node(&f, &host, Duration::from_secs(2));
    let t = mem.local_target().unwrap();
    mem.meta_register(t, 0, 60_000).unwrap();
    drop(thread);
    assert_eq!(host.stats().requests, 1);
}

#[test]
fn a_kept_registration_outlives_its_short_lease() {
    let f = Fabric::new();
    let (host, _thread, mem, t) = hosted(&f);
    // A 60 ms lease renewed every 20 ms, kept past several lease lengths
    // while the host sweeps every step (lease_sweep_ms 0).
    let kept = mem
        .meta_keep_registered(&[t], 0, Duration::from_millis(60))
        .unwrap();
    assert_eq!(kept.period(), Duration::from_millis(20));
    let epoch = kept.first_leases()[0].epoch;
    let start = std::time::Instant::now();
    while kept.stats().renewals < 10 {
        assert!(start.elapsed() < Duration::from_secs(20), "{kept:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Still registered after more than three lease lengths. (A machine
    // stalled past a lease gets the entry swept and registered again, a
    // newer epoch: counted as lapsed.)
    let client = node(&f, &host, Duration::from_secs(2));
    let entry = client.resolve(&mem.gid()).unwrap();
    assert_eq!(entry.target, t);
    let lapsed = kept.stats().lapsed;
    if lapsed == 0 {
        assert_eq!(entry.epoch, epoch, "{kept:?}");
    }
    // The entry removed behind its back: the next renewal is refused and
    // the thread registers it again (a new epoch).
    host.table().deregister(&t.gid, t.dct_num).unwrap();
    while kept.stats().lapsed == lapsed {
        assert!(start.elapsed() < Duration::from_secs(20), "{kept:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    client.invalidate(&mem.gid());
    let again = client.resolve(&mem.gid()).unwrap();
    assert!(again.epoch > epoch, "{again:?}");
    // Deregistering stops the renewals and removes the entry.
    kept.deregister().unwrap();
    assert!(unknown_after_invalidate(&client, &mem.gid()));
    // The host's own engine reads its table (it adopted the location;
    // its cache knows `mem` as a sender of requests until invalidated).
    host.engine().invalidate(&mem.gid());
    assert_eq!(
        host.engine().meta_location().unwrap().server,
        host.bootstrap().server
    );
    assert!(matches!(
        host.engine().resolve(&mem.gid()),
        Err(EngineError::UnknownNode { .. })
    ));
}

#[test]
fn an_unrenewed_lease_is_swept_and_renewal_then_refused() {
    let f = Fabric::new();
    let (host, _thread, mem, t) = hosted(&f);
    {
        // Dropped at once: nothing renews the 30 ms lease.
        let kept = mem
            .meta_keep_registered(&[t], 0, Duration::from_millis(30))
            .unwrap();
        assert_eq!(kept.stats().registrations, 1);
    }
    let client = node(&f, &host, Duration::from_secs(2));
    let start = std::time::Instant::now();
    loop {
        if unknown_after_invalidate(&client, &mem.gid()) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(host.stats().swept >= 1);
    let r = mem.meta_renew(&t);
    assert!(
        matches!(
            r,
            Err(EngineError::MetaRefused {
                code: ErrorCode::NotRegistered | ErrorCode::LeaseExpired,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn a_kept_registration_refuses_bad_input_and_a_dead_host() {
    let f = Fabric::new();
    let host = f.meta();
    let mem = node(&f, &host, Duration::from_millis(20));
    let t = mem.local_target().unwrap();
    for (targets, lease) in [
        (&[][..], Duration::from_secs(1)),
        (&[t][..], Duration::from_micros(500)),
    ] {
        assert!(matches!(
            mem.meta_keep_registered(targets, 0, lease),
            Err(EngineError::Config(_))
        ));
    }
    // Nobody serves: the first registration fails, bounded and typed.
    let r = mem.meta_keep_registered(&[t], 0, Duration::from_secs(1));
    assert!(
        matches!(
            r,
            Err(EngineError::MetaUnavailable {
                failure: MetaFailure::NoAnswer { .. },
                ..
            })
        ),
        "{r:?}"
    );
}

/// Another engine registers at a kept registration's GID (the sim's host
/// mode: one port, one GID; its registration is made in the table
/// directly, since messaging replies to a GID reach one engine of it): the
/// server refuses the older engine's renewals (counted, never a
/// re-registration that would take the GID back), the older engine's
/// deregistration leaves the other's entry, and the older engine registers
/// again once the GID is free.
#[test]
fn a_kept_registration_replaced_by_another_engine_is_left_to_it() {
    let f = Fabric::new();
    let host = Arc::new(f.meta());
    let _thread = host.spawn(Duration::from_micros(50)).unwrap();
    let on_host = || {
        let nic = SimNic::open(
            &f.fabric,
            SimConfig {
                host: Some("shared-port".into()),
                ..SimConfig::default()
            },
        )
        .unwrap();
        let mut cfg = EngineConfig::default()
            .with_pool_size(1)
            .with_meta(host.location().unwrap());
        cfg.meta_timeout = Duration::from_secs(2);
        Engine::start(nic, cfg).unwrap()
    };
    let (a, b) = (on_host(), on_host());
    assert_eq!(a.gid(), b.gid());
    let (ta, tb) = (a.local_target().unwrap(), b.local_target().unwrap());
    assert_ne!(ta.dct_num, tb.dct_num);
    let holder = || host.table().get(&ta.gid).map(|e| e.dct_num);
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let register_b = || {
        let now = host.now_ms();
        host.table().register(tb, 0, 60_000, now).unwrap()
    };

    let kept_a = a
        .meta_keep_registered(&[ta], 0, Duration::from_millis(60))
        .unwrap();
    assert_eq!(kept_a.first_leases()[0].replaced_dct, 0);
    assert_eq!(register_b().replaced_dct, ta.dct_num, "a's lease ran");
    wait("a's renewals refused", &|| kept_a.stats().replaced >= 3);
    assert_eq!(holder(), Some(tb.dct_num), "{kept_a:?}");
    assert_eq!(kept_a.stats().lapsed, 0, "a never took the GID back");
    let r = a.meta_renew(&ta);
    assert!(
        matches!(
            r,
            Err(EngineError::MetaRefused {
                code: ErrorCode::Replaced,
                ..
            })
        ),
        "{r:?}"
    );
    // b's registration goes: a's next renewal finds the GID free and
    // registers again.
    host.table().deregister(&tb.gid, tb.dct_num).unwrap();
    wait("a registered again", &|| kept_a.stats().lapsed >= 1);
    assert_eq!(holder(), Some(ta.dct_num));
    // b registers again, and a leaves: a's deregistration leaves b's entry.
    assert_eq!(register_b().replaced_dct, ta.dct_num);
    kept_a.deregister().unwrap();
    assert_eq!(holder(), Some(tb.dct_num));
}
