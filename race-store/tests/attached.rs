//! The race-store client on a node attached to the node daemon
//! (`krcore::Node::attach`): its READs, WRITEs and CASes go through the
//! daemon's VQPs, its block allocations through the daemon's messaging,
//! with no change to the client; a model check against a `HashMap` with
//! splits under load, and no QP created for the attached client.

use krcore::{EngineConfig, Node};
use krcore_kmod::daemon::{Daemon, DaemonConfig};
use race_store::clock::{Clock, SystemClock};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeServer, VqpTransport};
use race_store::{Client, ClientConfig, Error};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A directory fabric with a meta node, and a tiny table: splits and
/// directory doublings, hence allocations.
fn fabric_and_table() -> (tempfile::TempDir, Node, TableConfig) {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sim:{}", dir.path().join("fabric").display());
    let meta = Node::builder().fabric(&spec).host_meta().build().unwrap();
    let table = TableConfig {
        geometry: SubtableGeometry::new(1).unwrap(),
        initial_global_depth: 0,
        max_global_depth: 12,
    };
    (dir, meta, table)
}

#[test]
fn an_attached_client_inserts_updates_and_deletes_with_splits() {
    let (dir, meta, table) = fabric_and_table();
    let mut servers = Vec::new();
    let mut infos = Vec::new();
    for id in 0..2 {
        let node = Node::builder().join(&meta).build().unwrap();
        let s = MemoryNodeServer::start(&node, id, 32 << 20, &table, 2).unwrap();
        infos.push(s.info());
        servers.push(s.spawn(Duration::from_micros(50)));
    }
    let mut cfg = EngineConfig::default();
    cfg.prestart = cfg.pool_size;
    cfg.eager_start = true;
    let daemon_node = Node::builder().join(&meta).config(cfg).build().unwrap();
    let socket = dir.path().join("krcored.sock");
    let daemon = Daemon::start(
        daemon_node.engine().unwrap().clone(),
        &socket,
        DaemonConfig::default(),
    )
    .unwrap();

    let node = Node::attach(&socket).unwrap();
    let before = node.daemon_stats().unwrap().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let t = VqpTransport::connect(&node, &infos).unwrap();
    let mut cl = Client::open(t, clock, ClientConfig::default()).unwrap();
    let mut reference: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..1500u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("k{}", x % 400).into_bytes();
        let val = format!("v{i}-{}", "y".repeat((x % 70) as usize)).into_bytes();
        match x % 5 {
            0 | 1 => {
                cl.put(&key, &val).unwrap();
                reference.insert(key, val);
            }
            2 => match cl.delete(&key) {
                Ok(()) => assert!(reference.remove(&key).is_some(), "delete {i}"),
                Err(Error::NotFound) => assert!(!reference.contains_key(&key), "delete {i}"),
                Err(e) => panic!("delete {i}: {e}"),
            },
            _ => assert_eq!(
                cl.get(&key).unwrap(),
                reference.get(&key).cloned(),
                "get {i}"
            ),
        }
    }
    for (k, v) in &reference {
        assert_eq!(cl.get(k).unwrap().as_ref(), Some(v));
    }
    assert!(
        cl.transport().has_msg_endpoint(),
        "blocks were allocated, through the daemon's messaging"
    );
    let check = cl.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert_eq!(check.pairs.len(), reference.len());
    let after = node.daemon_stats().unwrap().unwrap();
    assert_eq!(
        after.qps_created, before.qps_created,
        "the attached client created no QP: {before:?} {after:?}"
    );
    drop(cl);
    drop(node);
    drop(daemon);
    drop(servers);
}

/// A daemon serving `node`'s engine as `krcored` does (pool made at start)
/// on a socket in `dir`.
fn daemon_on(meta: &Node, dir: &std::path::Path, name: &str) -> (Daemon<krcore_nic::AnyNic>, Node) {
    let mut cfg = EngineConfig::default();
    cfg.prestart = cfg.pool_size;
    cfg.eager_start = true;
    let node = Node::builder().join(meta).config(cfg).build().unwrap();
    let socket = dir.join(name);
    let daemon = Daemon::start(
        node.engine().unwrap().clone(),
        &socket,
        DaemonConfig::default(),
    )
    .unwrap();
    (daemon, node)
}

/// The whole store on attached processes: a memory node whose region is
/// the daemon's shared memory and whose allocation port is bound through
/// the daemon, and a client attached to another node's daemon; the
/// client's allocations (splits) are answered by the attached memory node.
#[test]
fn a_memory_node_serves_from_an_attached_process() {
    let (dir, meta, table) = fabric_and_table();
    let (mem_daemon, _mem_engine) = daemon_on(&meta, dir.path(), "mem.sock");
    let (cl_daemon, _cl_engine) = daemon_on(&meta, dir.path(), "client.sock");
    let mem_node = Node::attach(mem_daemon.path()).unwrap();
    let mut server = MemoryNodeServer::start(&mem_node, 0, 32 << 20, &table, 1).unwrap();
    let infos = [server.info()];
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let serving = sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if server.poll_once().unwrap() == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        run_client(&cl_daemon, &infos);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        serving.join().unwrap();
    });
    assert!(
        server.served() > 0,
        "the attached memory node answered the client's allocations"
    );
    drop(server);
    drop(mem_node);
    drop(cl_daemon);
    drop(mem_daemon);
}

fn run_client(cl_daemon: &Daemon<krcore_nic::AnyNic>, infos: &[race_store::rdma::NodeInfo]) {
    let node = Node::attach(cl_daemon.path()).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let t = VqpTransport::connect(&node, infos).unwrap();
    let mut cl = Client::open(t, clock, ClientConfig::default()).unwrap();
    let mut reference: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for i in 0..600u64 {
        let key = format!("key-{}", i * 7 % 300).into_bytes();
        let val = format!("value-{i}").into_bytes();
        cl.put(&key, &val).unwrap();
        reference.insert(key, val);
    }
    for (k, v) in &reference {
        assert_eq!(cl.get(k).unwrap().as_ref(), Some(v));
    }
    let check = cl.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.pairs.len(), reference.len());
}
