//! race-store on a real verbs device, end to end: a meta host, one RDMA
//! memory node and two clients, each on its own device context, over the
//! `verbs` provider in RC fallback mode (Soft-RoCE has no DC). A few hundred
//! keys are inserted (the one-subtable table splits), read, updated and
//! deleted against a reference map; a second client sees the same table;
//! the table checker finds no broken invariant.
//!
//! One guest is one port: every context has the same GID, so there is one
//! memory node (the meta table holds one entry per GID).
//!
//! `#[ignore]`: it needs a device. Build on the host, run in the Soft-RoCE
//! guest (`ci/verbs.sh` does this):
//!
//! ```text
//! cargo test -p race-store --features verbs --test verbs_smoke --no-run
//! ../shared/softroce/softroce-run -- sh -c \
//!   'KRCORE_TEST_DEVICE=$SOFTROCE_DEV KRCORE_TEST_GID_INDEX=$SOFTROCE_GID_INDEX \
//!    exec target/debug/deps/verbs_smoke-HASH --ignored --test-threads=1'
//! ```
#![cfg(feature = "verbs")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use krcore::{EngineConfig, Node};
use krcore_kmod::{EngineMode, HandshakeConfig, RcMetaHost};
use krcore_meta::table::Geometry;
use krcore_meta::MetaConfig;
use krcore_nic::verbs::VerbsNic;
use race_store::clock::{Clock, SystemClock};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeServer, VqpTransport};
use race_store::{Client, ClientConfig, Error};

fn open() -> VerbsNic {
    let name = std::env::var("KRCORE_TEST_DEVICE").unwrap_or_else(|_| {
        panic!("KRCORE_TEST_DEVICE is not set: name an RDMA device (e.g. rxe0)")
    });
    let idx = std::env::var("KRCORE_TEST_GID_INDEX")
        .or_else(|_| std::env::var("SOFTROCE_GID_INDEX"))
        .ok()
        .map(|s| s.trim().parse::<u8>().expect("a GID index"))
        .unwrap_or(0);
    VerbsNic::open(&name, idx).unwrap_or_else(|e| panic!("open {name} (GID index {idx}): {e}"))
}

/// The guest is emulated: handshakes wait longer than on the sim, and the
/// five background threads (meta host, three handshake responders, the
/// memory node's allocation RPC) idle at 2 ms instead of 100 us: every
/// wake-up costs an emulated timer interrupt and system calls, and at the
/// default they starve the test's own thread on the guest's two vCPUs.
/// Connections are made a few times per test, so only those wait longer.
fn handshake() -> HandshakeConfig {
    let mut h = HandshakeConfig::default();
    h.timeout = Duration::from_millis(500);
    h.retries = 3;
    h.idle_sleep = IDLE;
    h
}

const IDLE: Duration = Duration::from_millis(2);

fn key(i: u32) -> Vec<u8> {
    format!("smoke-key-{i:05}").into_bytes()
}

fn value(i: u32, generation: u32) -> Vec<u8> {
    // Values of varied length (several KV block sizes).
    format!("v{generation}-{i}-{}", "x".repeat((i % 97) as usize)).into_bytes()
}

#[test]
#[ignore = "needs an RDMA device without DC (Soft-RoCE): set KRCORE_TEST_DEVICE"]
fn insert_get_update_delete_with_a_split_over_rc_fallback() {
    let meta = RcMetaHost::start(
        open(),
        MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            ..MetaConfig::default()
        },
        handshake(),
    )
    .expect("meta host");
    let _meta_thread = meta.spawn_progress().unwrap();
    // Memory node and client on one port (loopback): the port's lock would
    // refuse the second engine.
    let mut cfg = EngineConfig::default()
        .with_meta(meta.location().unwrap())
        .with_port_lock(false);
    cfg.handshake = handshake();

    // The memory node: one subtable at depth 0, so a few hundred keys split.
    let mem_node = Node::with_nic(open(), cfg.clone()).expect("memory node");
    assert_eq!(mem_node.mode(), EngineMode::RcFallback, "rxe has no DC");
    meta.table()
        .register(mem_node.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let table = TableConfig {
        geometry: SubtableGeometry::new(1).unwrap(),
        initial_global_depth: 0,
        max_global_depth: 10,
    };
    let server = MemoryNodeServer::start(&mem_node, 0, 4 << 20, &table, 1).expect("memory server");
    let infos = vec![server.info()];
    let _server = server.spawn(IDLE);

    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let client_node = Node::with_nic(open(), cfg.clone()).expect("client node");
    let t = VqpTransport::connect(&client_node, &infos).expect("connect the transport");
    let mut cl = Client::open(t, clock.clone(), ClientConfig::default()).expect("client");

    const KEYS: u32 = 300;
    let mut reference: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in 0..KEYS {
        cl.insert(&key(i), &value(i, 0))
            .unwrap_or_else(|e| panic!("insert {i}: {e}"));
        reference.insert(key(i), value(i, 0));
    }
    assert!(matches!(
        cl.insert(&key(7), b"again"),
        Err(Error::KeyExists)
    ));
    for i in (0..KEYS).step_by(3) {
        cl.update(&key(i), &value(i, 1))
            .unwrap_or_else(|e| panic!("update {i}: {e}"));
        reference.insert(key(i), value(i, 1));
    }
    for i in (0..KEYS).step_by(4) {
        cl.delete(&key(i))
            .unwrap_or_else(|e| panic!("delete {i}: {e}"));
        reference.remove(&key(i));
    }
    assert!(matches!(cl.delete(&key(0)), Err(Error::NotFound)));
    assert!(matches!(cl.update(&key(4), b"gone"), Err(Error::NotFound)));
    for i in 0..KEYS {
        assert_eq!(
            cl.get(&key(i)).unwrap(),
            reference.get(&key(i)).cloned(),
            "get {i}"
        );
    }
    let stats = cl.stats();
    assert!(stats.splits > 0, "the one-subtable table split: {stats:?}");

    // A second client on its own node sees the same table.
    let other_node = Node::with_nic(open(), cfg).expect("second client node");
    let t2 = VqpTransport::connect(&other_node, &infos).expect("connect the second transport");
    let mut other = Client::open(t2, clock, ClientConfig::default()).expect("second client");
    for (k, v) in reference.iter().step_by(7) {
        assert_eq!(other.get(k).unwrap().as_ref(), Some(v));
    }
    // Its writes go through the first client here: the nodes of this test
    // are contexts of one device, so they share one GID, and two-sided
    // messaging (the block allocation a new client's first write needs)
    // tells nodes apart by GID (a node is a GID; see the README's deploy
    // guide). One-sided reads need no such identity.
    cl.put(&key(1), b"from the other client").unwrap();
    assert_eq!(
        other.get(&key(1)).unwrap().as_deref(),
        Some(&b"from the other client"[..])
    );
    reference.insert(key(1), b"from the other client".to_vec());

    let report = cl.check_table().expect("check the table");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.global_depth > 0, "the directory grew: {report:?}");
    assert_eq!(report.duplicates, 0);
    let found: BTreeMap<Vec<u8>, Vec<u8>> = report.pairs.into_iter().collect();
    assert_eq!(found, reference, "the table holds exactly the reference");
    let s = client_node.engine().unwrap().stats();
    assert_eq!(s.mode, EngineMode::RcFallback);
    assert_eq!(s.rc.pairs, 1, "one RC pair to the memory node: {:?}", s.rc);
    eprintln!(
        "verbs smoke: {} keys, depth {}, {} subtables, client {:?}",
        found.len(),
        report.global_depth,
        report.subtables,
        stats
    );
}
