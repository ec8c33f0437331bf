//! The provider conformance suite on `AnyNic::Sim`, opened from fabric
//! strings: the run-time-chosen wrapper keeps every provider semantic.

use krcore_nic::conformance as suite;
use krcore_nic::{AnyNic, FabricSpec};

/// Two nodes on one fabric opened from `spec` (the second joins the fabric
/// the first opened).
fn pair_on(spec: &str) -> (AnyNic, AnyNic) {
    let spec: FabricSpec = spec.parse().unwrap();
    let opened = spec.open().unwrap();
    let b = spec.open_on(opened.fabric.as_ref().unwrap()).unwrap();
    (opened.nic, b)
}

fn mem_pair() -> (AnyNic, AnyNic) {
    pair_on("sim:mem")
}

/// Two nodes on a fresh directory fabric (the directory lives as long as the
/// returned guard).
fn dir_pair() -> (AnyNic, AnyNic, tempfile::TempDir) {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("krcore-test-")
            .tempdir_in("/dev/shm")
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let (a, b) = pair_on(&format!("sim:{}", base.path().join("fabric").display()));
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
    let (a, _) = mem_pair();
    suite::rc_read_write(&a, &a);
    suite::dc_ops(&a, &a);
}

/// `dc=off` gives a device without DC (RC fallback mode); everything else
/// still conforms.
#[test]
fn dc_off_is_rc_only() {
    use krcore_nic::{Nic, QpType};
    let (a, b) = pair_on("sim:mem,dc=off");
    assert!(!a.caps().dc && !b.caps().dc);
    let s = suite::Side::new(&a, 4096);
    let r = a.create_qp(
        &s.pd,
        &krcore_nic::QpInit {
            qp_type: QpType::Dci,
            caps: Default::default(),
            send_cq: &s.cq,
            recv_cq: &s.cq,
            srq: None,
            dc_key: 0,
        },
    );
    assert!(r.is_err(), "a DCI on a dc=off node");
    suite::rc_read_write(&a, &b);
    suite::rc_send_recv(&a, &b);
}
