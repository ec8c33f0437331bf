//! The DC -> RC upgrade through the SDK: nodes built with the engine's
//! upgrade endpoint register its name beside their DCT, a VQP's hint moves
//! it to an RC pair, and the node's counters show it.

use krcore::{Access, EngineConfig, EngineError, Error, Node, VqpPath};

fn cfg() -> EngineConfig {
    EngineConfig::default().with_upgrade_endpoint(true)
}

#[test]
fn a_hint_upgrades_a_vqp_and_the_counters_show_it() {
    let server = Node::builder()
        .fabric("sim:mem")
        .config(cfg())
        .host_meta()
        .build()
        .unwrap();
    let client = Node::builder().join(&server).config(cfg()).build().unwrap();
    let region = server.alloc(4096, Access::ALL).unwrap();
    region.write(0, b"upgraded").unwrap();
    let token = region.remote_region(0, 64, Access::ALL).unwrap();
    let vqp = client.connect(server.gid()).unwrap();
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
    assert_eq!(vqp.path(), VqpPath::Dc);
    assert_eq!(vqp.upgrade().unwrap(), VqpPath::Rc);
    assert_eq!(vqp.path(), VqpPath::Rc);
    buf.write(0, &[0; 8]).unwrap();
    vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
    let mut got = [0u8; 8];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"upgraded");
    assert_eq!(client.upgrade_counters(), (1, 0, 0, 1));
}

#[test]
fn without_the_endpoint_the_hint_is_a_typed_error_and_the_vqp_works() {
    let server = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let client = Node::builder().join(&server).config(cfg()).build().unwrap();
    let region = server.alloc(4096, Access::ALL).unwrap();
    let token = region.remote_region(0, 64, Access::ALL).unwrap();
    let vqp = client.connect(server.gid()).unwrap();
    assert!(matches!(
        vqp.upgrade(),
        Err(Error::Engine(EngineError::UnknownNode { .. }))
    ));
    let buf = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    vqp.read(&buf, 0, &token, 0, 8).unwrap().wait().unwrap();
    assert_eq!(vqp.path(), VqpPath::Dc);
    assert_eq!(client.upgrade_counters(), (0, 0, 1, 0));
}
