//! A restarted meta server: an engine with a `MetaSource` follows it (its
//! lease thread and its lookups fetch the bootstrap again, read the new
//! table and register there); without a source, or with a source that
//! fails or names a table of another shape, it keeps its location and says
//! so, typed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_kmod::{
    Engine, EngineConfig, EngineError, MetaRefresh, MetaSource, MsgMetaHost, REFRESH_EVERY,
};
use krcore_meta::table::Geometry;
use krcore_meta::wire::BootstrapRepr;
use krcore_meta::{MetaConfig, MetaError};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use parking_lot::Mutex;

/// DC mode, or RC fallback mode (a sim device without DC).
#[derive(Clone, Copy, Debug)]
enum Mode {
    Dc,
    Rc,
}

fn engine(f: &SimFabric, mode: Mode, cfg: EngineConfig) -> Engine<SimNic> {
    let (sim, cfg) = match mode {
        Mode::Dc => (SimConfig::default(), cfg),
        Mode::Rc => (
            SimConfig {
                dc: false,
                ..SimConfig::default()
            },
            cfg.with_handshake_thread(true),
        ),
    };
    let nic = SimNic::open(f, sim).unwrap();
    Engine::start(nic, cfg).unwrap()
}

/// A meta server on an engine of its own, served by a thread (both go
/// when it is dropped: the restart of a `krcore-meta` process).
struct Server {
    host: Arc<MsgMetaHost<SimNic>>,
    _thread: krcore_kmod::MetaHostThread,
}

fn server(f: &SimFabric, mode: Mode, buckets: u32) -> Server {
    let e = engine(f, mode, EngineConfig::default().with_pool_size(1));
    let cfg = MetaConfig {
        geometry: Geometry::with_buckets(buckets).unwrap(),
        lease_sweep_ms: 0,
        ..MetaConfig::default()
    };
    let host = Arc::new(MsgMetaHost::start(&e, cfg).unwrap());
    let thread = host.spawn(Duration::from_micros(50)).unwrap();
    Server {
        host,
        _thread: thread,
    }
}

fn node(f: &SimFabric, mode: Mode, s: &Server) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_meta(s.host.location().unwrap());
    cfg.meta_timeout = Duration::from_millis(200);
    engine(f, mode, cfg)
}

/// A source that returns whatever bootstrap `current` holds (what a TCP
/// bootstrap at a fixed address does across a restart).
fn source(current: &Current) -> MetaSource {
    let c = current.clone();
    Arc::new(move || c.lock().clone().map_err(MetaError::Config))
}

/// What a source returns: the current server's bootstrap, or an error.
type Current = Arc<Mutex<Result<BootstrapRepr, String>>>;

/// A meta server, a node of it that follows it (its source returns what
/// the `Current` holds), and that `Current`.
fn followed(f: &SimFabric, mode: Mode) -> (Server, Engine<SimNic>, Current) {
    let a = server(f, mode, 64);
    let current = Arc::new(Mutex::new(Ok(a.host.bootstrap())));
    let mem = node(f, mode, &a);
    mem.set_meta_source(source(&current));
    (a, mem, current)
}

/// Restarts `old`: another server (engine, table, DCT), whose bootstrap
/// the source finds from now on.
fn restart(f: &SimFabric, mode: Mode, old: Server, current: &Current) -> Server {
    drop(old);
    let new = server(f, mode, 64);
    *current.lock() = Ok(new.host.bootstrap());
    new
}

/// Waits (10 s at most) until `client`, its cache entry dropped, resolves
/// `gid` through its meta server.
fn eventually_resolves(client: &Engine<SimNic>, gid: &krcore_nic::Gid) {
    let start = Instant::now();
    loop {
        client.invalidate(gid);
        match client.resolve(gid) {
            Ok(_) => return,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(10),
                "{gid} still unresolved: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_node_follows_a_restarted_meta_server() {
    for mode in [Mode::Dc, Mode::Rc] {
        follows_a_restarted_meta_server(mode);
    }
}

fn follows_a_restarted_meta_server(mode: Mode) {
    let f = SimFabric::in_memory();
    let (a, mem, current) = followed(&f, mode);
    assert_eq!(
        mem.mode() == krcore_kmod::EngineMode::RcFallback,
        matches!(mode, Mode::Rc)
    );
    let lease = mem
        .meta_keep_registered(
            &[mem.local_target().unwrap()],
            0,
            Duration::from_millis(300),
        )
        .unwrap();
    let old = mem.meta_location().unwrap();

    let b = restart(&f, mode, a, &current);
    let new = b.host.location().unwrap();
    assert_ne!(old, new);

    // The node's lease thread finds its renewal unanswered, follows the
    // server and registers in the new table: a client of the new server
    // reaches it.
    let client = node(&f, mode, &b);
    eventually_resolves(&client, &mem.gid());
    assert_eq!(mem.meta_location(), Some(new));
    assert!(lease.stats().lapsed >= 1, "{mode:?}: {:?}", lease.stats());

    // And the node reads the new table: a node registered only there is
    // found by a lookup.
    let other = node(&f, mode, &b);
    other
        .meta_register(other.local_target().unwrap(), 0, 60_000)
        .unwrap();
    eventually_resolves(&mem, &other.gid());
}

#[test]
fn a_lookup_follows_a_restarted_server_without_a_lease_thread() {
    for mode in [Mode::Dc, Mode::Rc] {
        lookup_follows(mode);
    }
}

fn lookup_follows(mode: Mode) {
    let f = SimFabric::in_memory();
    let (a, reader, current) = followed(&f, mode);
    let b = restart(&f, mode, a, &current);
    let mem = node(&f, mode, &b);
    mem.meta_register(mem.local_target().unwrap(), 0, 60_000)
        .unwrap();
    // The first lookup's READ fails at the dead server, the refresh moves
    // the reader, the second READ finds the entry.
    reader.resolve(&mem.gid()).unwrap();
    assert_eq!(reader.meta_location(), Some(b.host.location().unwrap()));
}

#[test]
fn a_request_follows_a_restarted_server() {
    for mode in [Mode::Dc, Mode::Rc] {
        let f = SimFabric::in_memory();
        let (a, mem, current) = followed(&f, mode);
        let t = mem.local_target().unwrap();
        mem.meta_register(t, 0, 60_000).unwrap();
        let b = restart(&f, mode, a, &current);
        // The first call after the restart reaches the new server (what a
        // node daemon's renewals for its processes rely on).
        mem.meta_register(t, 0, 60_000).unwrap();
        let client = node(&f, mode, &b);
        assert_eq!(client.resolve(&mem.gid()).unwrap().target, t, "{mode:?}");
    }
}

#[test]
fn refreshes_say_what_they_found_and_keep_the_location_on_failure() {
    let f = SimFabric::in_memory();
    let a = server(&f, Mode::Dc, 64);
    let mem = node(&f, Mode::Dc, &a);
    let here = mem.meta_location().unwrap();
    // No source: nothing to follow.
    assert_eq!(mem.refresh_meta().unwrap(), MetaRefresh::NoSource);

    let current = Arc::new(Mutex::new(Ok(a.host.bootstrap())));
    mem.set_meta_source(source(&current));
    assert_eq!(mem.refresh_meta().unwrap(), MetaRefresh::Same);
    // Within REFRESH_EVERY of the last fetch: not fetched again.
    assert_eq!(mem.refresh_meta().unwrap(), MetaRefresh::Recent);

    // The source fails (the server is still down): typed, location kept.
    *current.lock() = Err("connection refused".into());
    std::thread::sleep(REFRESH_EVERY);
    let r = mem.refresh_meta();
    assert!(
        matches!(r, Err(EngineError::MetaSource(MetaError::Config(_)))),
        "{r:?}"
    );
    assert_eq!(mem.meta_location(), Some(here));

    // A restarted server with a table of another shape: refused, typed.
    let other = server(&f, Mode::Dc, 128);
    *current.lock() = Ok(other.host.bootstrap());
    std::thread::sleep(REFRESH_EVERY);
    let r = mem.refresh_meta();
    assert!(matches!(r, Err(EngineError::MetaReshaped { .. })), "{r:?}");
    assert!(r.unwrap_err().to_string().contains("restart this process"));
    assert_eq!(mem.meta_location(), Some(here));

    // One of the same shape: moved.
    let b = server(&f, Mode::Dc, 64);
    *current.lock() = Ok(b.host.bootstrap());
    std::thread::sleep(REFRESH_EVERY);
    let to = b.host.location().unwrap();
    assert_eq!(
        mem.refresh_meta().unwrap(),
        MetaRefresh::Moved { from: here, to }
    );
}
