//! The provider conformance suite on `sim`, on both fabric kinds.

use krcore_nic::conformance as suite;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};

fn mem_pair() -> (SimNic, SimNic) {
    let f = SimFabric::in_memory();
    (
        SimNic::open(&f, SimConfig::default()).unwrap(),
        SimNic::open(&f, SimConfig::default()).unwrap(),
    )
}

/// Two nodes on a fresh directory fabric (the directory lives as long as the
/// returned guard).
fn dir_pair() -> (SimNic, SimNic, tempfile::TempDir) {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("krcore-test-")
            .tempdir_in("/dev/shm")
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let f = SimFabric::open_dir(base.path().join("fabric"), true).unwrap();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let b = SimNic::open(&f, SimConfig::default()).unwrap();
    (a, b, base)
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $name() { let (a, b) = super::mem_pair(); super::suite::$name(&a, &b); })*
        }
        mod dir {
            $(#[test] fn $name() { let (a, b, _g) = super::dir_pair(); super::suite::$name(&a, &b); })*
        }
    };
}

conformance!(
    rc_read_write,
    rc_atomics,
    rc_send_recv,
    srq_shared,
    ud_datagrams,
    dc_ops,
    error_completions,
    rnr,
    send_credits,
    state_machine,
    doorbell_batching,
    cq_overflow,
    sub_regions,
);

#[test]
fn loopback_same_node() {
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    suite::rc_read_write(&a, &a);
    suite::dc_ops(&a, &a);
}
