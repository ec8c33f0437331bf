//! Deployed stores in one process (`race_store::deploy` on `sim:mem`, the
//! meta server's TCP service on loopback): what a memory node records in
//! the table.

use race_store::deploy::{DeployError, MemoryNodeOptions, Store, StoreOptions};
use race_store::rdma::MemoryNodeServer;
use std::time::Duration;

use krcore::Node;

/// A node that records itself in the table and then fails to join (here:
/// a lease the join refuses) takes its record back: a node started later
/// at the id is not taken for the successor of one that held data, and
/// clients take the store.
#[test]
fn a_memory_node_whose_join_fails_leaves_no_record_in_the_table() {
    let meta = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let tcp = meta
        .meta_server()
        .unwrap()
        .serve_tcp("127.0.0.1:0")
        .unwrap();
    let addr = tcp.local_addr().to_string();
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
