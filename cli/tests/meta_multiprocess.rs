//! The meta server deployments run (an engine-hosted table, registration
//! by two-sided messages) on a directory fabric under /dev/shm: in one
//! process with two fabric handles, and as the `krcore-meta` binary in
//! another process. Nodes register, renew and deregister by messages;
//! lookups are one READ; a dead server is a bounded, typed error.

use krcore::{Error, Node};
use krcore_kmod::{EngineConfig, EngineError, MetaFailure, MetaLocation};
use krcore_meta::bootstrap::lookup_on_sim;
use krcore_meta::table::Geometry;
use krcore_meta::wire::ErrorCode;
use krcore_meta::MetaConfig;
use krcore_nic::sim::SimFabric;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Upper bound of every wait in these tests.
const WAIT: Duration = Duration::from_secs(20);

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("krcore-meta-test.")
        .tempdir_in("/dev/shm")
        .expect("a directory under /dev/shm")
}

/// A node of `fabric` reading the table published as `name`, with calls
/// to the meta server bounded by `timeout` each.
fn reader(fabric: &SimFabric, name: &str, timeout: Duration) -> Node {
    let b = lookup_on_sim(fabric, name).unwrap();
    let mut cfg = EngineConfig::default().with_pool_size(1);
    cfg.meta_timeout = timeout;
    Node::builder()
        .sim_fabric(fabric)
        .meta(MetaLocation::from_bootstrap(&b).unwrap())
        .config(cfg)
        .build()
        .unwrap()
}

/// A node that registers (by messages) with a `lease` kept by its thread.
fn member(fabric: &SimFabric, name: &str, lease: Duration) -> Node {
    let b = lookup_on_sim(fabric, name).unwrap();
    Node::builder()
        .sim_fabric(fabric)
        .meta(MetaLocation::from_bootstrap(&b).unwrap())
        .config(EngineConfig::default().with_pool_size(1))
        .register(true)
        .lease(lease)
        .build()
        .unwrap()
}

#[test]
fn directory_fabric_in_one_process() {
    let dir = shm_dir();
    // Two handles on the directory, as two processes would have.
    let server_fabric = SimFabric::open_dir(dir.path(), true).unwrap();
    let client_fabric = SimFabric::open_dir(dir.path(), false).unwrap();
    let host = Node::builder()
        .sim_fabric(&server_fabric)
        .host_meta_with(MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            lease_sweep_ms: 10,
            ..MetaConfig::default()
        })
        .build()
        .unwrap();
    let server = host.meta_server().unwrap();
    server.publish_on_sim(&server_fabric, "meta-dir").unwrap();
    let host_qps = host.counters().qps_created;

    let mem = member(&client_fabric, "meta-dir", Duration::from_secs(30));
    // The registration arrived as a message on the host's meta port.
    let s = server.host().stats();
    assert_eq!((s.requests, s.malformed, s.dropped), (1, 0, 0), "{s:?}");
    assert!(server.host().engine().msg_stats().inline_delivered >= 1);
    // The lookup is one READ; the host's CPU answers nothing for it.
    let client = reader(&client_fabric, "meta-dir", Duration::from_secs(2));
    let before = client.counters();
    let _vqp = client.connect(mem.gid()).unwrap();
    let d = client.counters() - before;
    assert_eq!(d.reads, 1, "{d:?}");
    assert_eq!(client.engine().unwrap().stats().meta.reads, 1);
    let entry = client.engine().unwrap().resolve(&mem.gid()).unwrap();
    assert_eq!(entry.target, mem.local_target().unwrap());
    assert_eq!(server.host().stats().requests, 1);
    // No UD QP on the host: the meta host made only its engine's DCT and
    // DCIs (for replies), no handshake endpoint.
    let hs = server.host().engine().stats();
    assert_eq!(hs.handshake_endpoints_created, 0);
    assert_eq!(
        host.counters().qps_created,
        u64::from(hs.dcts_created) + hs.dcis as u64,
        "{hs:?}"
    );
    assert!(host.counters().qps_created >= host_qps);
    // Deregister by message: the entry is gone for a fresh reader.
    mem.engine()
        .unwrap()
        .meta_deregister(&mem.local_target().unwrap())
        .unwrap();
    let fresh = reader(&client_fabric, "meta-dir", Duration::from_secs(2));
    assert!(matches!(
        fresh.connect(mem.gid()),
        Err(Error::Engine(EngineError::UnknownNode { .. }))
    ));
}

/// The server process; killed (and reaped) when dropped.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(fabric_dir: &std::path::Path, name: &str) -> (ServerProcess, Vec<String>) {
    let mut child = ServerProcess(
        Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
            .arg("--fabric")
            .arg(format!("sim:{}", fabric_dir.display()))
            .args(["--name", name, "--buckets", "64", "--lease-sweep-ms", "10"])
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn krcore-meta"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = vec![];
    let start = Instant::now();
    loop {
        let left = WAIT.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("ready: krcore-meta") => return (child, lines),
            Ok(line) => lines.push(line),
            Err(e) => panic!("krcore-meta never said ready ({e}); it said {lines:?}"),
        }
    }
}

/// Waits (bounded) until `f` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn binary_server_in_another_process() {
    let dir = shm_dir();
    let (mut child, lines) = spawn_server(dir.path(), "meta-mp");
    assert!(
        lines.iter().any(|l| l.starts_with("bootstrap: gid")),
        "{lines:?}"
    );
    let fabric = SimFabric::open_dir(dir.path(), false).unwrap();
    let b = lookup_on_sim(&fabric, "meta-mp").unwrap();
    assert_eq!(b.geometry().unwrap().n_buckets(), 64);
    assert_eq!(b.rpc_qpn, u32::from(krcore_kmod::META_PORT), "no UD QP");

    // A short lease, kept by the node's thread (every third of it) past
    // several lease lengths: the entry never lapses.
    let lease = Duration::from_millis(150);
    let mem = member(&fabric, "meta-mp", lease);
    let first = mem.engine().unwrap().stats();
    assert_eq!(first.handshake_endpoints_created, 0, "no UD QP");
    wait_until("six renewals", || mem.lease_stats().unwrap().renewals >= 6);
    let ls = mem.lease_stats().unwrap();
    // Every renewal was accepted (a stall past the lease would have been
    // re-registered: counted as lapsed, one more registration).
    assert_eq!(ls.registrations, 1 + ls.lapsed, "{ls:?}");
    let client = reader(&fabric, "meta-mp", Duration::from_millis(200));
    let before = client.counters();
    let entry = client.engine().unwrap().resolve(&mem.gid()).unwrap();
    let d = client.counters() - before;
    assert_eq!((d.reads, d.network_ops()), (1, 1), "{d:?}");
    assert_eq!(entry.target, mem.local_target().unwrap());

    // A node whose lease is not renewed is swept by the server.
    let gone = reader(&fabric, "meta-mp", Duration::from_secs(2));
    let t = gone.local_target().unwrap();
    gone.engine().unwrap().meta_register(t, 0, 30).unwrap();
    let probe = reader(&fabric, "meta-mp", Duration::from_secs(2));
    wait_until("the sweep", || {
        probe.engine().unwrap().invalidate(&gone.gid());
        matches!(
            probe.engine().unwrap().resolve(&gone.gid()),
            Err(EngineError::UnknownNode { .. })
        )
    });
    // Renewing a swept lease is refused, typed.
    let r = gone.engine().unwrap().meta_renew(&t);
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

    // Kill the server: registration calls end with a bounded, typed error
    // (the request's error completion, or no answer in time),
    // READs fail typed, nothing hangs; the lease thread counts failures.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let start = Instant::now();
    let r = client
        .engine()
        .unwrap()
        .meta_renew(&mem.local_target().unwrap());
    assert!(
        matches!(
            r,
            Err(EngineError::MetaUnavailable {
                failure: MetaFailure::NoAnswer { .. } | MetaFailure::Completion(_),
                ..
            })
        ),
        "{r:?}"
    );
    assert!(start.elapsed() < WAIT);
    client.engine().unwrap().invalidate(&mem.gid());
    assert!(client.engine().unwrap().resolve(&mem.gid()).is_err());
    wait_until("a failed renewal", || {
        mem.lease_stats().unwrap().failures >= 1
    });
    // Dropping the node stops its lease thread (joined, bounded).
    drop(mem);
}

#[test]
fn binary_rejects_a_bad_fabric_with_exit_code_2() {
    for spec in [
        "nonsense",
        "sim:mem",
        "sim:relative/path",
        "verbs:",
        "sim:x,dc=maybe",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
            .args(["--fabric", spec])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains("--fabric"), "{spec}: {err}");
    }
    for args in [&["--fabric"][..], &[][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let dir = shm_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
        .arg("--fabric")
        .arg(format!("sim:{}", dir.path().display()))
        .args(["--buckets", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "zero buckets");
    // A fabric that cannot be opened is a runtime failure: 1, one line.
    let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
        .args(["--fabric", "sim:/no/such/dir/x", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
