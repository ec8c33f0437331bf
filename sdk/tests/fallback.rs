//! The SDK on devices without DC (`SimConfig { dc: false }`, like
//! Soft-RoCE): nodes run in RC fallback mode, the embedded meta table is
//! hosted by the node's engine as in DC mode (registration as messages over
//! the RC pair a first UD handshake builds), and the user API is unchanged.

use krcore::sim::{SimConfig, SimFabric, SimNic};
use krcore::{Access, EngineConfig, EngineMode, Node};

fn no_dc() -> SimConfig {
    SimConfig {
        dc: false,
        ..SimConfig::default()
    }
}

#[test]
fn the_user_api_is_unchanged_in_rc_fallback_mode() {
    let server = Node::builder()
        .fabric("sim:mem")
        .sim_config(no_dc())
        .host_meta()
        .build()
        .unwrap();
    assert_eq!(server.mode(), EngineMode::RcFallback);
    let host = server.meta_server().unwrap().host();
    // A joining node takes the joined node's device: all RC fallback.
    let client = Node::builder().join(&server).build().unwrap();
    assert_eq!(client.mode(), EngineMode::RcFallback);
    assert_eq!(
        client.engine().unwrap().stats().mode,
        EngineMode::RcFallback
    );
    // It registered by a message over its RC pair with the meta node.
    assert_eq!(host.stats().requests, 1);
    assert_eq!(client.lease_stats().unwrap().registrations, 1);
    assert!(host.engine().msg_stats().inline_delivered >= 1);

    let region = server.alloc(4096, Access::ALL).unwrap();
    region.write(0, b"hello, rc").unwrap();
    let token = region.token();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &token, 0, 9).unwrap().wait().unwrap();
    let mut got = [0u8; 9];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, rc");
    let old = vqp
        .compare_and_swap(&token, 64, 0, 42)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((old.old_value, region.load_u64(64).unwrap()), (Some(0), 42));

    // A second VQP to the same node shares the RC QP: no QP, no network.
    let again = client.vqp().unwrap();
    let before = client.counters();
    again.connect(server.gid()).unwrap();
    let d = client.counters() - before;
    assert_eq!((d.network_ops(), d.qps_created), (0, 0));
    assert_eq!(
        again
            .fetch_add(&token, 64, 1)
            .unwrap()
            .wait()
            .unwrap()
            .old_value,
        Some(42)
    );
    assert_eq!(client.engine().unwrap().stats().rc.pairs, 1);
}

#[test]
fn with_nic_runs_the_handshake_thread() {
    let server = Node::builder()
        .sim_config(no_dc())
        .host_meta()
        .build()
        .unwrap();
    let fabric: SimFabric = server.fabric().unwrap().clone();
    // EngineConfig's own default has no thread; the SDK turns it on.
    let cfg = EngineConfig::default().with_meta(server.meta_location().unwrap());
    assert!(!cfg.handshake_thread);
    let other = Node::with_nic(SimNic::open(&fabric, no_dc()).unwrap(), cfg).unwrap();
    assert!(other.engine().unwrap().config().handshake_thread);
    // Registered by a message to the meta node (over an RC pair).
    other
        .engine()
        .unwrap()
        .meta_register(other.local_target().unwrap(), 0, 60_000)
        .unwrap();
    let region = other.alloc(64, Access::ALL).unwrap();
    region.store_u64(0, 5).unwrap();
    // The server connects to it: `other` answers from its thread.
    let vqp = server.connect(other.gid()).unwrap();
    let r = vqp
        .fetch_add(&region.token(), 0, 1)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(r.old_value, Some(5));
    assert_eq!(region.load_u64(0).unwrap(), 6);
}
