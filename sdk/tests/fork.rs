//! Worker processes (after Swift): a forked child inherits an initialized
//! node on a `/dev/shm` fabric, with a warm DCCache, and completes a READ
//! of its parent's memory on a DCI the parent prepared for it. `sim:mem`
//! cannot be shared: typed error. The fork-to-first-READ time is printed
//! (a figure, not an assertion; `benches/benches/messaging.rs` measures
//! it too).

use std::time::{Duration, Instant};

mod common;
use common::{Dir, OK, SERIAL};

use krcore::{Access, EngineError, Error, Node};

// Exit codes of the child, one per failed step.
const CONNECT: i32 = 10;
const READ: i32 = 11;
const DATA: i32 = 12;
const ALLOC_NOT_REFUSED: i32 = 13;
const MISS_NOT_REFUSED: i32 = 14;
const MSG_NOT_REFUSED: i32 = 15;
const META_READ_IN_CHILD: i32 = 16;
const LEASE_NOT_REFUSED: i32 = 17;

#[test]
fn a_forked_worker_reads_its_parents_memory_on_inherited_state() {
    let _serial = SERIAL.lock();
    let dir = Dir::new("fork", "read");
    let server = Node::builder()
        .fabric(&dir.spec())
        .host_meta()
        .build()
        .unwrap();
    let client = Node::builder().join(&server).build().unwrap();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let payload = b"hello from the parent, through a DCI of the child's";
    region.write(0, payload).unwrap();
    let token = region.token();
    // Warm the client's DCCache (one meta READ), then prepare the child's
    // memory: the child allocates nothing.
    client.connect(server.gid()).unwrap();
    let buf = client.alloc(4096, Access::LOCAL_WRITE).unwrap();
    let result = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let stranger = Node::builder().join(&server).build().unwrap().gid();
    let start = Instant::now();
    let worker = client
        .fork(|node| {
            let entered = Instant::now();
            let meta = node.engine().unwrap().stats().meta;
            let Ok(vqp) = node.connect(token.gid) else {
                return CONNECT;
            };
            let Ok(Ok(_)) = vqp
                .read(&buf, 0, &token, 0, payload.len() as u32)
                .map(|r| r.wait())
            else {
                return READ;
            };
            let took = start.elapsed().as_nanos() as u64;
            let _ = result.store_u64(8, entered.elapsed().as_nanos() as u64);
            let mut got = vec![0u8; payload.len()];
            if buf.read(0, &mut got).is_err() || got != payload {
                return DATA;
            }
            let _ = result.store_u64(0, took);
            if !matches!(
                node.alloc(64, Access::LOCAL_WRITE),
                Err(Error::Engine(EngineError::Unsupported { .. }))
            ) {
                return ALLOC_NOT_REFUSED;
            }
            if !matches!(
                node.connect(stranger),
                Err(Error::Engine(EngineError::Unsupported { .. }))
            ) {
                return MISS_NOT_REFUSED;
            }
            if !matches!(
                node.bind(9),
                Err(Error::Msg(krcore::MsgError::Unsupported { .. }))
            ) {
                return MSG_NOT_REFUSED;
            }
            if node.engine().unwrap().stats().meta != meta {
                return META_READ_IN_CHILD;
            }
            // A lease's key would be a new MR: refused.
            if !matches!(
                buf.lease(0, 8, Access::REMOTE_READ, Duration::from_secs(1)),
                Err(Error::Lease(krcore::LeaseError::Forked))
            ) {
                return LEASE_NOT_REFUSED;
            }
            OK
        })
        .unwrap();
    common::expect_ok(worker);
    let took = Duration::from_nanos(result.load_u64(0).unwrap());
    assert!(took > Duration::ZERO);
    let in_child = Duration::from_nanos(result.load_u64(8).unwrap());
    eprintln!(
        "fork start -> first completed READ in the child: {took:?} \
         (in the child: {in_child:?}; software time, no latency model)"
    );
    // The parent keeps working on its own DCIs (the child's READ was
    // counted by the child's copy of the node).
    let vqp = client.connect(server.gid()).unwrap();
    vqp.read(&buf, 64, &token, 0, 8).unwrap().wait().unwrap();
}

#[test]
fn fork_on_a_private_fabric_is_a_typed_error() {
    let _serial = SERIAL.lock();
    let node = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    assert!(matches!(node.fork(|_| 0), Err(Error::Unsupported(_))));
}
