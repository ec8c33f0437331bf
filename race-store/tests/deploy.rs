//! Deployed stores in one process (`race_store::deploy` on `sim:mem`, the
//! meta server's TCP service on loopback): what a memory node records in
//! the table.

use race_store::deploy::{DeployError, MemoryNodeOptions, Store, StoreOptions};
use race_store::rdma::MemoryNodeServer;
use std::time::Duration;

use krcore::Node;

/// A meta server on `sim:mem`, its TCP service on loopback (kept while the
/// handle lives) and that service's address.
fn meta_on_tcp() -> (Node, krcore_meta::bootstrap::TcpBootstrap, String) {
    meta_on_tcp_of(Node::builder().fabric("sim:mem"))
}

/// [`meta_on_tcp`] on the node `builder` makes.
fn meta_on_tcp_of(
    builder: krcore::NodeBuilder,
) -> (Node, krcore_meta::bootstrap::TcpBootstrap, String) {
    let meta = builder.host_meta().build().unwrap();
    let tcp = meta
        .meta_server()
        .unwrap()
        .serve_tcp("127.0.0.1:0")
        .unwrap();
    let addr = tcp.local_addr().to_string();
    (meta, tcp, addr)
}

/// A node that records itself in the table and then fails to join (here:
/// a lease the join refuses) takes its record back: a node started later
/// at the id is not taken for the successor of one that held data, and
/// clients take the store.
#[test]
fn a_memory_node_whose_join_fails_leaves_no_record_in_the_table() {
    let (meta, _tcp, addr) = meta_on_tcp();
    let node = || Node::builder().join(&meta).build().unwrap();
    let (n0, n1) = (node(), node());
    let opts = |id: u8| MemoryNodeOptions::new("rec", id, 2, 16 << 20, &addr);
    let zero = MemoryNodeServer::deploy(&n0, &opts(0)).unwrap();
    assert_eq!(zero.predecessor(), None);
    // The join refuses a lease of 0 ms: after node 1 recorded itself.
    let mut bad = opts(1);
    bad.lease = Duration::ZERO;
    match MemoryNodeServer::deploy(&n1, &bad) {
        Err(DeployError::Join { .. }) => {}
        r => panic!("expected the join to fail, got {r:?}"),
    }
    let one = MemoryNodeServer::deploy(&node(), &opts(1)).unwrap();
    assert_eq!(one.predecessor(), None, "the failed node left no record");
    let store = Store::open(&node(), &addr, "rec", StoreOptions::default()).unwrap();
    let mut c = store.client().unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap(), Some(b"v".to_vec()));
    // Both standing: node 0 is the one they joined beside.
    zero.check_standing().unwrap();
    one.check_standing().unwrap();
}

/// A member the meta table does not know yet (after a meta server
/// restart each memory node joins the store again and registers again on
/// its own schedule, so a client may see the membership first): a client
/// waits for the registration, up to the store's wait, and without a wait
/// gets the engine's typed `UnknownNode`. Once CI saw a client fail here
/// right after a meta server restart.
#[test]
fn a_client_waits_for_a_member_that_joined_before_it_registered() {
    let (meta, _tcp, addr) = meta_on_tcp();
    let node = || Node::builder().join(&meta).build().unwrap();
    let (n0, n1) = (node(), node());
    let opts = |id: u8| MemoryNodeOptions::new("unreg", id, 2, 16 << 20, &addr);
    let _zero = MemoryNodeServer::deploy(&n0, &opts(0)).unwrap();
    let _one = MemoryNodeServer::deploy(&n1, &opts(1)).unwrap();
    // Node 1 is a member, but its registration is gone.
    n1.deregister().unwrap();
    let no_wait = StoreOptions {
        wait: Duration::ZERO,
        ..StoreOptions::default()
    };
    let store = Store::open(&node(), &addr, "unreg", no_wait).unwrap();
    match store.client() {
        Err(race_store::Error::Transport(race_store::remote::TransportError::Setup {
            source,
            ..
        })) => assert!(
            matches!(
                source.get().downcast_ref::<krcore::Error>(),
                Some(krcore::Error::Engine(krcore::EngineError::UnknownNode { gid }))
                    if *gid == n1.gid()
            ),
            "{source}"
        ),
        r => panic!("expected UnknownNode for node 1, got {:?}", r.err()),
    }
    // It registers again 300 ms later: a client with the default wait
    // (5 s) gets the store.
    let store = Store::open(&node(), &addr, "unreg", StoreOptions::default()).unwrap();
    let again = std::thread::spawn({
        let n1 = n1.clone();
        move || {
            std::thread::sleep(Duration::from_millis(300));
            let target = n1.local_target().unwrap();
            n1.engine()
                .unwrap()
                .meta_keep_registered(&[target], 0, Duration::from_secs(30))
                .unwrap()
        }
    });
    let mut c = store.client().unwrap();
    let _lease = again.join().unwrap();
    c.put(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap(), Some(b"v".to_vec()));
}

/// A memory node stopped after its meta server went cannot leave the
/// store: its shutdown stops serving and says so as a failed leave (it
/// said "joining store" before), and returns.
#[test]
fn a_memory_node_whose_meta_server_is_gone_fails_its_leave_and_stops() {
    let nic = krcore_nic::sim::SimNic::from_spec("sim:mem").unwrap();
    let (meta, tcp, addr) = meta_on_tcp_of(Node::builder().nic(nic.clone()));
    let node = Node::builder().join(&meta).build().unwrap();
    let served = MemoryNodeServer::deploy(
        &node,
        &MemoryNodeOptions::new("gone", 0, 1, 16 << 20, &addr),
    )
    .unwrap();
    // The meta server's machine dies.
    nic.kill();
    drop(tcp);
    match served.shutdown() {
        Err(e @ DeployError::Leave { .. }) => {
            let line = e.to_string();
            assert!(line.starts_with("leaving store \"gone\""), "{line}");
        }
        other => panic!("a leave without a meta server: {other:?}"),
    }
}
