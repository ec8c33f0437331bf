//! A batch the transport gave up on may still land: on hardware a READ
//! executes whenever its link lets it, long after the poster stopped
//! waiting, and writes the buffer it names. `FaultNic::stall_node` holds
//! WRs to a node until it is resumed, then runs them late; these tests
//! check that such late bytes never reach a later batch's results (the
//! transport quarantines the abandoned buffer, see `race_store::rdma`'s
//! transport docs), on the synchronous path and on the doorbells kept in
//! flight, and that the quarantine stays bounded.

mod common;

use std::time::Duration;

use common::rdma::{cluster, Cluster};

use krcore::Node;
use krcore_kmod::EngineConfig;
use krcore_nic::fault::{FaultConfig, FaultNic};
use krcore_nic::sim::{SimConfig, SimNic};
use race_store::layout::slot::RemotePtr;
use race_store::rdma::VqpTransport;
use race_store::remote::{Completions, RemoteOp, Transport, TransportError};

type Fnic = FaultNic<SimNic>;

/// A compute node on a fault-injecting NIC (no random faults: only the
/// stalls the tests make), with its transport to the two memory nodes.
fn client(c: &Cluster) -> (Node<Fnic>, VqpTransport<Fnic>) {
    let sim = SimNic::open(c.meta.fabric().unwrap(), SimConfig::default()).unwrap();
    let cfg = EngineConfig::default().with_meta(c.meta.meta_location().unwrap());
    let node = Node::with_nic(FaultNic::new(sim, FaultConfig::none(1)), cfg).unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    t.set_batch_timeout(Duration::from_millis(50));
    (node, t)
}

/// 64 bytes near the end of node `node`'s region (outside the table).
fn spot(c: &Cluster, node: u8) -> RemotePtr {
    RemotePtr::new(node, c.infos[usize::from(node)].len - 4096).unwrap()
}

const A: [u8; 64] = [0xaa; 64];
const B: [u8; 64] = [0xbb; 64];

fn setup() -> (Cluster, Node<Fnic>, VqpTransport<Fnic>) {
    let c = cluster(2, 4 << 20, 4);
    let (node, mut t) = client(&c);
    let (p0, p1) = (spot(&c, 0), spot(&c, 1));
    t.execute(&[
        RemoteOp::Write { ptr: p0, bytes: &A },
        RemoteOp::Write { ptr: p1, bytes: &B },
    ])
    .unwrap();
    (c, node, t)
}

fn nic(node: &Node<Fnic>) -> &Fnic {
    node.engine().unwrap().nic()
}

#[test]
fn a_timed_out_batch_landing_late_does_not_corrupt_the_next_batch() {
    let (c, node, mut t) = setup();
    let (p0, p1, gid1) = (spot(&c, 0), spot(&c, 1), c.infos[1].gid);
    nic(&node).stall_node(gid1);
    // Node 1's READ (at offset 0 of the batch's buffer) is held: the
    // batch times out.
    let e = t
        .execute(&[RemoteOp::Read { ptr: p1, len: 64 }])
        .unwrap_err();
    assert!(
        matches!(e, TransportError::Timeout { node: 1, .. }),
        "{e:?}"
    );
    assert_eq!(t.quarantined(), 1);
    nic(&node).resume_node(gid1);
    // Node 0's READ lands at offset 0 first; then node 1's doorbell runs
    // the held READ (B, at offset 0 of the abandoned buffer) before its
    // own.
    let r = t
        .execute(&[
            RemoteOp::Read { ptr: p0, len: 64 },
            RemoteOp::Read { ptr: p1, len: 64 },
        ])
        .unwrap();
    assert_eq!(
        r[0].read_bytes(),
        Some(&A[..]),
        "node 0's READ got late bytes"
    );
    assert_eq!(r[1].read_bytes(), Some(&B[..]));
    assert!(nic(&node).stats().stalled_wrs >= 1);
    // The late READ's completion came in that batch: its buffer is freed.
    assert_eq!(t.quarantined(), 0);
}

#[test]
fn a_timed_out_doorbell_in_flight_landing_late_does_not_corrupt_the_next() {
    let (c, node, mut t) = setup();
    let (p0, p1, gid1) = (spot(&c, 0), spot(&c, 1), c.infos[1].gid);
    nic(&node).stall_node(gid1);
    let mut res = Completions::new();
    let late = [RemoteOp::Read { ptr: p1, len: 64 }];
    let ticket = t.post_into(&late, &mut res).unwrap();
    let e = t.complete_into(ticket, &late, &mut res).unwrap_err();
    assert!(
        matches!(e, TransportError::Timeout { node: 1, .. }),
        "{e:?}"
    );
    assert_eq!(t.quarantined(), 1);
    nic(&node).resume_node(gid1);
    // The next doorbell lands at offset 0 of a slot's buffer; waiting for
    // it polls the CQ, which runs the held READ (B) first.
    let next = [RemoteOp::Read { ptr: p0, len: 64 }];
    let ticket = t.post_into(&next, &mut res).unwrap();
    t.complete_into(ticket, &next, &mut res).unwrap();
    assert_eq!(res.read(0), Some(&A[..]), "the doorbell got late bytes");
    // The late READ's completion is on node 1's queue: the next batch
    // there takes it, and the buffer is freed.
    assert_eq!(t.quarantined(), 1);
    let r = t.execute(&[RemoteOp::Read { ptr: p1, len: 64 }]).unwrap();
    assert_eq!(r[0].read_bytes(), Some(&B[..]));
    assert_eq!(t.quarantined(), 0);
}

#[test]
fn the_quarantine_is_bounded_and_a_deregistered_buffer_takes_nothing() {
    let (c, node, mut t) = setup();
    let (p0, p1, gid1) = (spot(&c, 0), spot(&c, 1), c.infos[1].gid);
    nic(&node).stall_node(gid1);
    let max = race_store::rdma::MAX_QUARANTINE;
    for _ in 0..max + 3 {
        let e = t
            .execute(&[RemoteOp::Read { ptr: p1, len: 64 }])
            .unwrap_err();
        assert!(matches!(e, TransportError::Timeout { .. }), "{e:?}");
        assert!(t.quarantined() <= max);
    }
    assert_eq!(t.quarantined(), max);
    nic(&node).resume_node(gid1);
    // The oldest held READs name buffers deregistered since: they fail at
    // the NIC (their queue recovers); nothing lands anywhere in use. Every
    // later batch reads what is there.
    let mut ok = 0;
    for _ in 0..20 {
        match t.execute(&[
            RemoteOp::Read { ptr: p0, len: 64 },
            RemoteOp::Read { ptr: p1, len: 64 },
        ]) {
            Ok(r) => {
                assert_eq!(r[0].read_bytes(), Some(&A[..]));
                assert_eq!(r[1].read_bytes(), Some(&B[..]));
                ok += 1;
            }
            Err(e) => assert!(!matches!(e, TransportError::BadResponse { .. }), "{e:?}"),
        }
    }
    assert!(ok > 0, "node 1 never became usable again");
}
