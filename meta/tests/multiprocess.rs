//! The meta server on a directory fabric under /dev/shm: in one process with
//! two fabric handles, and as the `krcore-meta` binary in another process.

mod common;

use common::*;
use krcore_meta::client::LookupError;
use krcore_meta::{MetaClient, MetaServer, RpcConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Nic, WcStatus};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("krcore-meta-test.")
        .tempdir_in("/dev/shm")
        .expect("a directory under /dev/shm")
}

#[test]
fn directory_fabric_in_one_process() {
    let dir = shm_dir();
    // Two handles on the directory, as two processes would have.
    let server_fabric = SimFabric::open_dir(dir.path(), true).unwrap();
    let client_fabric = SimFabric::open_dir(dir.path(), false).unwrap();
    let nic = SimNic::open(&server_fabric, SimConfig::default()).unwrap();
    let mut server = MetaServer::start(nic, config()).unwrap();
    server.publish_on_sim(&server_fabric, "meta-dir").unwrap();
    let handle = server.spawn().unwrap();

    let meta = MetaClient::from_sim(&client_fabric, "meta-dir").unwrap();
    let b = *meta.bootstrap();
    let client = SimNic::open(&client_fabric, SimConfig::default()).unwrap();
    let mut rpc = meta.rpc(&client, RpcConfig::default()).unwrap();
    let reader = Reader::new(&client);
    let me = target(client.gid(), 0x42);
    let lease = rpc.register(me, 9, 60_000).unwrap();
    let before = client.counters();
    let e = reader.once(&b, &me.gid).unwrap().expect("registered");
    assert_eq!((client.counters() - before).reads, 1);
    assert_eq!((e.dc_target(), e.lid, e.epoch), (me, 9, lease.epoch));
    rpc.deregister(&me.gid).unwrap();
    assert_eq!(reader.lookup(&b, &me.gid), None);
    let server = handle.stop().unwrap();
    assert_eq!(server.stats().requests, 2);
    drop(server);
    assert!(client_fabric.lookup("meta-dir").unwrap().is_none());
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
            Ok(line) if line == "ready" => return (child, lines),
            Ok(line) => lines.push(line),
            Err(e) => panic!("krcore-meta never said ready ({e}); it said {lines:?}"),
        }
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
    let meta = MetaClient::from_sim(&fabric, "meta-mp").unwrap();
    assert_eq!(meta.geometry().n_buckets(), 64);
    let b = *meta.bootstrap();
    let client = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let mut rpc = meta
        .rpc(
            &client,
            RpcConfig {
                timeout: Duration::from_millis(200),
                retries: 4,
                ..RpcConfig::default()
            },
        )
        .unwrap();
    let reader = Reader::new(&client);
    let me = target(client.gid(), 0x1234);
    let lease = rpc.register(me, 2, 60_000).unwrap();

    let before = client.counters();
    let e = reader.once(&b, &me.gid).unwrap().expect("registered");
    let d = client.counters() - before;
    assert_eq!((d.reads, d.network_ops()), (1, 1), "{d:?}");
    assert_eq!((e.dc_target(), e.lid, e.epoch), (me, 2, lease.epoch));
    assert_eq!(rpc.fetch_bootstrap().unwrap(), b);

    // Kill the server: RPCs time out, READs fail, nothing hangs.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let start = Instant::now();
    let e = rpc.renew(&me.gid).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(start.elapsed() < WAIT);
    match reader.once(&b, &me.gid) {
        Err(LookupError::Completion(WcStatus::RetryExcErr)) => {}
        other => panic!("READ of a dead server's table: {other:?}"),
    }
}

#[test]
fn binary_rejects_a_bad_fabric_with_exit_code_2() {
    for spec in [
        "nonsense",
        "sim:mem",
        "sim:relative/path",
        "sim:/no/such/dir/x",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
            .args(["--fabric", spec])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains("--fabric"), "{spec}: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_krcore-meta"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "missing --fabric");
}
