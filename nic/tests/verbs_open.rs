//! Opening a verbs device by options and by fabric string (`open_with`
//! defaults, typed errors, `AnyNic::Verbs`).
//!
//! Every test is `#[ignore]`: it needs a device (`KRCORE_TEST_DEVICE`, e.g.
//! `rxe0` in the Soft-RoCE guest, where `SOFTROCE_GID_INDEX` names the
//! RoCE v2 entry the defaults must find).
#![cfg(feature = "verbs")]

use krcore_nic::conformance as suite;
use krcore_nic::verbs::{VerbsError, VerbsNic, VerbsOptions};
use krcore_nic::*;

fn device() -> String {
    std::env::var("KRCORE_TEST_DEVICE").expect("KRCORE_TEST_DEVICE names the device")
}

#[test]
#[ignore = "needs an RDMA device"]
fn open_with_defaults() {
    let name = device();
    let nic = VerbsNic::open_with(&VerbsOptions::new(&name)).unwrap();
    eprintln!(
        "{name}: port {} GID index {} GID {}",
        nic.port(),
        nic.gid_index(),
        nic.gid()
    );
    assert!(nic.port() >= 1);
    if let Ok(idx) = std::env::var("SOFTROCE_GID_INDEX") {
        assert_eq!(
            nic.gid_index().to_string(),
            idx.trim(),
            "the guest's RoCE v2 entry"
        );
        let b = nic.gid().0;
        assert!(
            b[..10].iter().all(|&x| x == 0) && b[10..12] == [0xff, 0xff],
            "IPv4-mapped"
        );
    }
    // The explicit form picks the same, and `open` agrees.
    let same = VerbsNic::open_with(&VerbsOptions {
        device: name.clone(),
        port: Some(nic.port()),
        gid_index: Some(nic.gid_index()),
    })
    .unwrap();
    assert_eq!(
        (same.port(), same.gid_index(), same.gid()),
        (nic.port(), nic.gid_index(), nic.gid())
    );
    let old = VerbsNic::open(&name, nic.gid_index()).unwrap();
    assert_eq!(old.port(), nic.port());
    // Objects work on the chosen port and GID.
    suite::rc_read_write(&nic, &same);
    suite::ud_datagrams(&nic, &same);
}

#[test]
#[ignore = "needs an RDMA device"]
fn open_with_errors_are_typed() {
    let name = device();
    match VerbsNic::open_with(&VerbsOptions {
        port: Some(200),
        ..VerbsOptions::new(&name)
    }) {
        Err(e @ VerbsError::NoSuchPort { port: 200, .. }) => eprintln!("{e}"),
        other => panic!("expected NoSuchPort, got {other:?}"),
    }
    match VerbsNic::open_with(&VerbsOptions {
        gid_index: Some(250),
        ..VerbsOptions::new(&name)
    }) {
        Err(VerbsError::BadGidIndex { index: 250, .. }) => {}
        other => panic!("expected BadGidIndex, got {other:?}"),
    }
    match VerbsNic::open_with(&VerbsOptions::new("no-such-rdma-dev")) {
        Err(e @ VerbsError::UnknownDevice { .. }) => assert!(e.to_string().contains(&name), "{e}"),
        other => panic!("expected UnknownDevice, got {other:?}"),
    }
}

/// Two `AnyNic::Verbs` nodes from one fabric string conform, and a sim
/// handle given to a verbs NIC is refused, not a panic.
#[test]
#[ignore = "needs an RDMA device"]
fn any_nic_from_a_fabric_string() {
    let name = device();
    let spec: FabricSpec = format!("verbs:{name}").parse().unwrap();
    let a = spec.open().unwrap();
    assert!(a.fabric.is_none());
    let a = a.nic;
    let b = spec.open().unwrap().nic;
    assert_eq!(a.provider(), "verbs");
    assert!(a.as_verbs().is_some() && a.as_sim().is_none());
    suite::rc_read_write(&a, &b);
    suite::rc_send_recv(&a, &b);
    suite::send_credits(&a, &b);

    let explicit: FabricSpec = format!(
        "verbs:{name},port={},gid={}",
        a.as_verbs().unwrap().port(),
        a.as_verbs().unwrap().gid_index()
    )
    .parse()
    .unwrap();
    assert_eq!(explicit.open().unwrap().nic.gid(), a.gid());

    let sim = FabricSpec::sim_mem().open().unwrap().nic;
    let sim_cq = sim.create_cq(16).unwrap();
    let sim_pd = sim.alloc_pd().unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let init = |send_cq| QpInit {
        qp_type: QpType::Rc,
        caps: QpCaps::default(),
        send_cq,
        recv_cq: &cq,
        srq: None,
        dc_key: 0,
    };
    let e = a.create_qp(&pd, &init(&sim_cq)).unwrap_err();
    assert!(matches!(e, NicError::InvalidArgument(_)), "{e:?}");
    let e = a.create_qp(&sim_pd, &init(&cq)).unwrap_err();
    assert!(matches!(e, NicError::InvalidArgument(_)), "{e:?}");
    let e = a.alloc_mr(&sim_pd, 64, Access::ALL).unwrap_err();
    assert!(matches!(e, NicError::InvalidArgument(_)), "{e:?}");
    let e = sim
        .create_qp(
            &sim_pd,
            &QpInit {
                send_cq: &cq,
                recv_cq: &sim_cq,
                ..init(&cq)
            },
        )
        .unwrap_err();
    assert!(matches!(e, NicError::InvalidArgument(_)), "{e:?}");
}

/// Registering more than RLIMIT_MEMLOCK is `MemlockLimit`, whose message
/// says how to raise it. Meaningful only for a non-root user with a
/// finite limit (root is not bound by it): run it as
/// `sh -c 'ulimit -l 64; exec setpriv --reuid=65534 --regid=65534 --clear-groups -- BIN --ignored memlock'`.
#[test]
#[ignore = "needs an RDMA device, a non-root user and a small `ulimit -l`"]
fn memlock_limit_is_typed() {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap();
    let soft = line.split_whitespace().nth(3).unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap();
    if soft == "unlimited" || euid == "0" {
        eprintln!("memlock_limit_is_typed skipped: limit {soft}, euid {euid}");
        return;
    }
    let limit: u64 = soft.parse().unwrap();
    let nic = VerbsNic::open_with(&VerbsOptions::new(&device())).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let len = (limit as usize).max(1 << 20) * 4;
    let e = nic.alloc_mr(&pd, len, Access::ALL).unwrap_err();
    let NicError::Os { source, .. } = &e else {
        panic!("{e:?}")
    };
    let v = source
        .get_ref()
        .and_then(|e| e.downcast_ref::<VerbsError>())
        .unwrap_or_else(|| panic!("{e:?}"));
    assert!(matches!(v, VerbsError::MemlockLimit { .. }), "{v:?}");
    assert!(e.to_string().contains("ulimit -l"), "{e}");
    eprintln!("{e}");
}
