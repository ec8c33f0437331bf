//! Forking a node whose engine started lazily (DC mode): the child uses
//! what the parent made before the fork and is refused, typed, what the
//! parent had not created (a child creates no NIC object): the DCT and the
//! upgrade's handshake endpoint. The parent creates them afterwards as
//! usual.

mod common;
use common::{Dir, OK, SERIAL};

use krcore::{Access, EngineConfig, EngineError, Error, Node};

// Exit codes of the child, one per failed step.
const READ: i32 = 10;
const DCT_NOT_REFUSED: i32 = 11;
const ENDPOINT_NOT_REFUSED: i32 = 12;
const CREATED_IN_CHILD: i32 = 13;

fn unsupported<T>(r: krcore::Result<T>) -> bool {
    matches!(r, Err(Error::Engine(EngineError::Unsupported { .. })))
}

#[test]
fn a_child_is_refused_the_lazy_resources_its_parent_had_not_created() {
    let _serial = SERIAL.lock();
    let dir = Dir::new("forklazy", "child");
    let server = Node::builder()
        .fabric(&dir.spec())
        .host_meta()
        .build()
        .unwrap();
    // Not joined (a joined node registers, which creates its DCT): a
    // compute node reading the meta table, with the upgrade configured.
    let client = Node::builder()
        .fabric(&dir.spec())
        .meta(server.meta_location().unwrap())
        .config(EngineConfig::default().with_upgrade_endpoint(true))
        .build()
        .unwrap();
    let region = server.alloc(64, Access::ALL).unwrap();
    region.write(0, b"parent!!").unwrap();
    let token = region.token();
    client.connect(server.gid()).unwrap(); // warms the DCCache
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let s = client.engine().unwrap().stats();
    assert_eq!((s.dcts_created, s.handshake_endpoints_created), (0, 0));
    let worker = client
        .fork(|node| {
            let read = node
                .connect(token.gid)
                .and_then(|v| v.read(&buf, 0, &token, 0, 8)?.wait());
            let mut got = [0u8; 8];
            if read.is_err() || buf.read(0, &mut got).is_err() || &got != b"parent!!" {
                return READ;
            }
            if !unsupported(node.local_target()) {
                return DCT_NOT_REFUSED;
            }
            if !matches!(
                node.engine().unwrap().handshake_entry(),
                Err(EngineError::Unsupported { .. })
            ) {
                return ENDPOINT_NOT_REFUSED;
            }
            let s = node.engine().unwrap().stats();
            if (s.dcts_created, s.handshake_endpoints_created) != (0, 0) {
                return CREATED_IN_CHILD;
            }
            OK
        })
        .unwrap();
    common::expect_ok(worker);
    // The parent creates them as usual afterwards.
    let before = client.counters();
    client.local_target().unwrap();
    client.engine().unwrap().handshake_entry().unwrap().unwrap();
    assert_eq!((client.counters() - before).qps_created, 2);
}

const UPGRADE_NOT_REFUSED: i32 = 20;
const NOT_ON_DC: i32 = 21;
const READ_AFTER: i32 = 22;

/// The parent's RC pairs are its own QPs (their locks live in the
/// parent's memory): a child VQP asking for the upgrade is refused, typed,
/// instead of posting on the parent's pair, and keeps working on its DCI.
#[test]
fn a_child_never_upgrades_onto_its_parents_rc_pair() {
    let _serial = SERIAL.lock();
    let dir = Dir::new("forklazy", "upgrade");
    let cfg = || EngineConfig::default().with_upgrade_endpoint(true);
    let server = Node::builder()
        .fabric(&dir.spec())
        .config(cfg())
        .host_meta()
        .build()
        .unwrap();
    let client = Node::builder()
        .fabric(&dir.spec())
        .meta(server.meta_location().unwrap())
        .config(cfg())
        .build()
        .unwrap();
    let region = server.alloc(64, Access::ALL).unwrap();
    region.write(0, b"parent!!").unwrap();
    let token = region.token();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    // The parent upgrades first: its pool now holds an RC pair to the server.
    let vqp = client.connect(server.gid()).unwrap();
    vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
    assert_eq!(vqp.upgrade().unwrap(), krcore::VqpPath::Rc);
    let server_gid = server.gid();
    let worker = client
        .fork(|node| {
            let read = |v: &krcore::Vqp| {
                buf.write(0, &[0; 8])?;
                v.read(&buf, 0, &token, 0, 8)?.wait()?;
                let mut got = [0u8; 8];
                buf.read(0, &mut got)?;
                Ok::<bool, Error>(&got == b"parent!!")
            };
            let Ok(v) = node.connect(server_gid) else {
                return READ;
            };
            if !matches!(read(&v), Ok(true)) {
                return READ;
            }
            if !unsupported(v.upgrade()) {
                return UPGRADE_NOT_REFUSED;
            }
            if v.path() != krcore::VqpPath::Dc {
                return NOT_ON_DC;
            }
            if !matches!(read(&v), Ok(true)) {
                return READ_AFTER;
            }
            OK
        })
        .unwrap();
    common::expect_ok(worker);
    // The parent's pair is untouched and still serves its VQP.
    buf.write(0, &[0; 8]).unwrap();
    vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"parent!!");
    assert_eq!(vqp.path(), krcore::VqpPath::Rc);
}
