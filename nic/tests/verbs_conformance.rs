//! The provider conformance suite on a real verbs device (Soft-RoCE in CI).
//!
//! Every test is `#[ignore]`: it needs a device. Run them inside the
//! Soft-RoCE guest (see `ci/verbs.sh`):
//!
//! ```text
//! KRCORE_TEST_DEVICE=rxe0 KRCORE_TEST_GID_INDEX=1 \
//!   cargo test -p krcore-nic --features verbs --test verbs_conformance -- --ignored --test-threads=1
//! ```
//!
//! `KRCORE_TEST_GID_INDEX` defaults to `SOFTROCE_GID_INDEX` (set in the
//! guest), else 0. Each test opens the device twice: two contexts are two
//! nodes with the same GID.
#![cfg(feature = "verbs")]

use krcore_nic::conformance as suite;
use krcore_nic::verbs::VerbsNic;
use krcore_nic::Nic;

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
            fn $name() {
                let (a, b) = pair();
                suite::$name(&a, &b);
            }
        )*
    };
}

conformance!(
    rc_read_write,
    rc_atomics,
    rc_send_recv,
    srq_shared,
    ud_datagrams,
    rnr,
    send_credits,
    state_machine,
    doorbell_batching,
);

#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn error_completions() {
    let (a, b) = pair();
    suite::error_completions(&a, &b);
}

#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn cq_overflow() {
    let (a, b) = pair();
    suite::cq_overflow(&a, &b);
}

#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn dc_ops() {
    let (a, b) = pair();
    if !(a.caps().dc && b.caps().dc) {
        eprintln!("verbs: {} has no DC; dc_ops skipped", device().0);
        return;
    }
    suite::dc_ops(&a, &b);
}

// ---------------------------------------------------------------------------
// Device selection

/// The device and GID index from `KRCORE_TEST_DEVICE` and
/// `KRCORE_TEST_GID_INDEX` (default: `SOFTROCE_GID_INDEX`, else 0).
///
/// # Panics
/// When `KRCORE_TEST_DEVICE` is unset: these tests are `#[ignore]`d and
/// only run on request, so a missing device is a setup error to report.
pub fn device() -> (String, u8) {
    let name = std::env::var("KRCORE_TEST_DEVICE").unwrap_or_else(|_| {
        panic!(
            "KRCORE_TEST_DEVICE is not set: name an RDMA device (e.g. rxe0), \
             or run ci/verbs.sh, which runs these tests on Soft-RoCE"
        )
    });
    let idx = std::env::var("KRCORE_TEST_GID_INDEX")
        .or_else(|_| std::env::var("SOFTROCE_GID_INDEX"))
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u8>()
                .unwrap_or_else(|_| panic!("bad GID index {s:?}"))
        })
        .unwrap_or(0);
    (name, idx)
}

/// Opens the test device once.
pub fn open() -> VerbsNic {
    let (name, idx) = device();
    VerbsNic::open(&name, idx).unwrap_or_else(|e| panic!("open {name} (GID index {idx}): {e}"))
}

/// Two contexts of the test device: two nodes.
pub fn pair() -> (VerbsNic, VerbsNic) {
    (open(), open())
}
