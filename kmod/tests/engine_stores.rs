//! Discovery of a deployed store without the sim fabric's name service:
//! memory nodes join a named store with messages to the meta host's
//! `META_PORT` (the member GID is the sender's), clients find the meta
//! table and every member of the store from the host's TCP address alone.
//! DC mode and RC fallback mode.

use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_kmod::{Engine, EngineConfig, EngineError, MetaLocation, MsgMetaHost};
use krcore_meta::bootstrap::{fetch_bootstrap_tcp, fetch_store_tcp, TcpBootstrap};
use krcore_meta::stores::StoreMember;
use krcore_meta::table::Geometry;
use krcore_meta::wire::ErrorCode;
use krcore_meta::{MetaConfig, MetaError};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};

const TCP_WAIT: Duration = Duration::from_secs(5);
/// Bound on every wait for something the host does by itself (a sweep).
const EVENTUALLY: Duration = Duration::from_secs(30);

struct Deployment {
    fabric: SimFabric,
    sim: SimConfig,
    host: Arc<MsgMetaHost<SimNic>>,
    _serving: krcore_kmod::MetaHostThread,
    tcp: TcpBootstrap,
}

impl Deployment {
    fn new(sim: SimConfig) -> Deployment {
        let fabric = SimFabric::in_memory();
        let nic = SimNic::open(&fabric, sim.clone()).unwrap();
        let engine = Engine::start(
            nic,
            EngineConfig::default()
                .with_pool_size(1)
                .with_handshake_thread(true),
        )
        .unwrap();
        let host = Arc::new(
            MsgMetaHost::start(
                &engine,
                MetaConfig {
                    geometry: Geometry::with_buckets(64).unwrap(),
                    lease_sweep_ms: 0,
                    ..MetaConfig::default()
                },
            )
            .unwrap(),
        );
        let serving = host.spawn(Duration::from_micros(50)).unwrap();
        let tcp = host.serve_tcp("127.0.0.1:0").unwrap();
        Deployment {
            fabric,
            sim,
            host,
            _serving: serving,
            tcp,
        }
    }

    /// A node that knows only the host's TCP address.
    fn node(&self) -> Engine<SimNic> {
        let b = fetch_bootstrap_tcp(self.tcp.local_addr(), TCP_WAIT).unwrap();
        let mut cfg = EngineConfig::default()
            .with_pool_size(1)
            .with_handshake_thread(true)
            .with_meta(MetaLocation::from_bootstrap(&b).unwrap());
        cfg.meta_timeout = Duration::from_secs(2);
        Engine::start(SimNic::open(&self.fabric, self.sim.clone()).unwrap(), cfg).unwrap()
    }

    fn list(&self, store: &str) -> Result<Vec<StoreMember>, MetaError> {
        fetch_store_tcp(self.tcp.local_addr(), store, TCP_WAIT)
    }
}

fn no_dc() -> SimConfig {
    SimConfig {
        dc: false,
        ..SimConfig::default()
    }
}

fn refused(r: Result<impl std::fmt::Debug, EngineError>) -> ErrorCode {
    match r {
        Err(EngineError::MetaRefused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn ids(members: &[StoreMember]) -> Vec<u16> {
    members.iter().map(|m| m.id).collect()
}

/// Two members join, a client lists both with their GIDs and records.
fn join_and_list(d: &Deployment) -> (Engine<SimNic>, Engine<SimNic>) {
    let m0 = d.node();
    let m1 = d.node();
    let l0 = m0.store_join("s", 0, b"rec-0", 60_000).unwrap();
    let l1 = m1.store_join("s", 1, b"rec-1", 60_000).unwrap();
    assert_ne!(l0.epoch, l1.epoch);
    let members = d.list("s").unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    assert_eq!(
        (members[0].id, members[0].gid, &members[0].record[..]),
        (0, m0.gid(), &b"rec-0"[..])
    );
    assert_eq!(
        (members[1].id, members[1].gid, &members[1].record[..]),
        (1, m1.gid(), &b"rec-1"[..])
    );
    assert_eq!(members[0].lease_expiry_ms, l0.lease_expiry_ms);
    (m0, m1)
}

#[test]
fn members_join_clients_list_them_over_tcp() {
    let d = Deployment::new(SimConfig::default());
    let (m0, m1) = join_and_list(&d);
    // A third node cannot take a live id.
    let m2 = d.node();
    assert_eq!(
        refused(m2.store_join("s", 1, b"thief", 60_000)),
        ErrorCode::MemberExists
    );
    // A re-join by the holder is a renewal: same epoch, new record.
    let before = d.list("s").unwrap()[1].clone();
    let l1 = m1.store_join("s", 1, b"rec-1b", 60_000).unwrap();
    let after = d.list("s").unwrap()[1].clone();
    assert_eq!(after.record, b"rec-1b");
    assert!(after.lease_expiry_ms >= before.lease_expiry_ms);
    assert_eq!(after.lease_expiry_ms, l1.lease_expiry_ms);
    // Only the holder can remove a member.
    assert_eq!(refused(m2.store_leave("s", 0)), ErrorCode::NotHolder);
    assert_eq!(refused(m2.store_leave("s", 7)), ErrorCode::NoSuchMember);
    m1.store_leave("s", 1).unwrap();
    assert_eq!(ids(&d.list("s").unwrap()), vec![0]);
    // The id is free again.
    m2.store_join("s", 1, b"rec-2", 60_000).unwrap();
    assert_eq!(d.list("s").unwrap()[1].gid, m2.gid());
    // Checked before anything is sent.
    assert_eq!(
        refused(m0.store_join("no such/name", 0, b"", 1)),
        ErrorCode::BadStoreName
    );
    assert_eq!(
        refused(m0.store_join("s", 0, &[0; 65], 1)),
        ErrorCode::RecordTooLong
    );
    assert_eq!(
        refused(m0.store_join("s", 0, b"", 0)),
        ErrorCode::InvalidLease
    );
    // A fresh name has no members.
    let e = d.list("fresh").unwrap_err();
    assert!(
        matches!(&e, MetaError::NoSuchStore { store } if store == "fresh"),
        "{e:?}"
    );
    let s = d.host.stats();
    assert_eq!((s.store_joins, s.store_leaves), (4, 1), "{s:?}");
    // The table is found from the TCP address too: a member registered
    // there is resolved by a client that knows only that address.
    m0.meta_register(m0.local_target().unwrap(), 0, 60_000)
        .unwrap();
    let client = d.node();
    assert_eq!(
        client.resolve(&m0.gid()).unwrap().target,
        m0.local_target().unwrap()
    );
}

#[test]
fn an_unrenewed_member_is_swept_and_a_kept_one_stays() {
    let d = Deployment::new(SimConfig::default());
    let short = d.node();
    let kept_node = d.node();
    // Kept alive over several short leases.
    let kept = kept_node
        .store_keep_joined("s", 1, b"kept", Duration::from_millis(300))
        .unwrap();
    assert_eq!(kept.first_leases().len(), 1);
    // A short lease, no renewals.
    short.store_join("s", 0, b"short", 300).unwrap();
    assert_eq!(ids(&d.list("s").unwrap()), vec![0, 1]);
    let start = Instant::now();
    loop {
        let listed = ids(&d.list("s").unwrap());
        if listed == vec![1] && d.host.stats().store_swept >= 1 && kept.stats().renewals >= 3 {
            break;
        }
        assert!(
            start.elapsed() < EVENTUALLY,
            "{listed:?} {:?}",
            d.host.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.list("s").unwrap()[0].gid, kept_node.gid());
    // leave() stops the renewals and removes the member at once.
    kept.leave().unwrap();
    assert!(matches!(d.list("s"), Err(MetaError::NoSuchStore { .. })));
    // Dropping a kept membership stops its renewals: it runs out.
    let dropped = kept_node
        .store_keep_joined("t", 3, b"", Duration::from_millis(300))
        .unwrap();
    assert_eq!(ids(&d.list("t").unwrap()), vec![3]);
    drop(dropped);
    let start = Instant::now();
    while d.list("t").is_ok() {
        assert!(start.elapsed() < EVENTUALLY);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn rc_fallback_join_and_list() {
    let d = Deployment::new(no_dc());
    assert_eq!(d.host.engine().mode(), krcore_kmod::EngineMode::RcFallback);
    let (_m0, m1) = join_and_list(&d);
    let m2 = d.node();
    assert_eq!(
        refused(m2.store_join("s", 1, b"thief", 60_000)),
        ErrorCode::MemberExists
    );
    m1.store_leave("s", 1).unwrap();
    assert_eq!(ids(&d.list("s").unwrap()), vec![0]);
    assert!(matches!(
        d.list("fresh"),
        Err(MetaError::NoSuchStore { .. })
    ));
}

#[test]
fn a_dropped_host_answers_internal_and_tcp_stops_with_its_handle() {
    let d = Deployment::new(SimConfig::default());
    let addr = d.tcp.local_addr();
    let Deployment {
        host,
        _serving,
        tcp,
        ..
    } = d;
    drop(_serving);
    drop(host);
    let e = fetch_store_tcp(addr, "s", TCP_WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::Refused {
                code: ErrorCode::Internal,
                ..
            }
        ),
        "{e:?}"
    );
    drop(tcp);
    let e = fetch_store_tcp(addr, "s", TCP_WAIT).unwrap_err();
    assert!(matches!(e, MetaError::Connect { .. }), "{e:?}");
}
