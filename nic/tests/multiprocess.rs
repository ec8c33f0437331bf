//! Multi-process tests of the directory fabric: child processes (this test
//! binary re-executed with a role in the environment) reach a parent's memory
//! through the fabric directory, and a child killed with SIGKILL becomes a
//! dead node.

use krcore_nic::conformance::{poll_one, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const ROLE: &str = "KRCORE_MP_ROLE";

fn fabric_dir() -> tempfile::TempDir {
    if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("krcore-mp-")
            .tempdir_in("/dev/shm")
            .unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn gid_hex(g: &Gid) -> String {
    g.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn gid_from_hex(s: &str) -> Gid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    Gid(g)
}

fn spawn_child(role: &str, envs: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("child needs {k}"))
}

fn env_u64(k: &str) -> u64 {
    let v = env(k);
    u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
}

/// The parent's exported target: a DCT and an MR, described in env vars.
struct Export {
    side: Side<SimNic>,
    _srq: sim::SimSrq,
    dct: sim::SimQp,
}

fn export(nic: &SimNic) -> Export {
    let side = Side::new(nic, 1 << 16);
    let srq = nic.create_srq(&side.pd, 16, 1).unwrap();
    let dct = side.qp(QpType::Dct, QpCaps::default(), Some(&srq), 0x5eed);
    bring_up(&dct, Access::ALL, None).unwrap();
    Export {
        side,
        _srq: srq,
        dct,
    }
}

fn export_env(fabric: &std::path::Path, e: &Export) -> Vec<(&'static str, String)> {
    vec![
        ("MP_FABRIC", fabric.display().to_string()),
        ("MP_GID", gid_hex(&e.side.nic.gid())),
        ("MP_DCT", format!("{:x}", e.dct.qpn())),
        ("MP_KEY", format!("{:x}", 0x5eedu64)),
        ("MP_RKEY", format!("{:x}", e.side.mr.rkey())),
        ("MP_ADDR", format!("{:x}", e.side.mr.addr())),
    ]
}

/// Child side: opens the fabric and a DCI aimed at the parent's DCT.
fn child_dci() -> (SimNic, Side<SimNic>, sim::SimQp, Destination, RemoteAddr) {
    let fabric = SimFabric::open_dir(env("MP_FABRIC"), false).unwrap();
    let nic = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let side = Side::new(&nic, 4096);
    let dci = side.qp(
        QpType::Dci,
        QpCaps {
            max_send_wr: 64,
            ..QpCaps::default()
        },
        None,
        0,
    );
    bring_up(&dci, Access::NONE, None).unwrap();
    let dest = Destination::Dc(DcTarget {
        gid: gid_from_hex(&env("MP_GID")),
        dct_num: env_u64("MP_DCT") as u32,
        dc_key: env_u64("MP_KEY"),
    });
    let remote = RemoteAddr {
        addr: env_u64("MP_ADDR"),
        rkey: env_u64("MP_RKEY") as u32,
    };
    (nic, side, dci, dest, remote)
}

fn child_rw_cas() {
    let (_nic, s, dci, dest, remote) = child_dci();
    dci.post_send(&[SendWr::read(1, s.mr.sge(0, 16).unwrap(), remote).to(dest)])
        .unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = [0u8; 16];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"parent's 16 byte", "child READ sees parent memory");
    s.mr.write(100, b"child was here").unwrap();
    dci.post_send(&[SendWr::write(2, s.mr.sge(100, 14).unwrap(), remote.offset(1024)).to(dest)])
        .unwrap();
    assert_eq!(poll_one(&s.cq).status, WcStatus::Success);
    dci.post_send(&[
        SendWr::cas(3, s.mr.sge(200, 8).unwrap(), remote.offset(2048), 0, 77).to(dest),
    ])
    .unwrap();
    assert_eq!(poll_one(&s.cq).status, WcStatus::Success);
    assert_eq!(s.mr.load_u64(200).unwrap(), 0, "CAS returned the old value");
}

fn child_faa() {
    let (_nic, s, dci, dest, remote) = child_dci();
    let n = env_u64("MP_N");
    let mut last = None;
    for i in 0..n {
        dci.post_send(&[SendWr::faa(i, s.mr.sge(0, 8).unwrap(), remote.offset(4096), 1).to(dest)])
            .unwrap();
        assert_eq!(poll_one(&s.cq).status, WcStatus::Success);
        let old = s.mr.load_u64(0).unwrap();
        if let Some(l) = last {
            assert!(old > l, "FAA results of one process strictly increase");
        }
        last = Some(old);
    }
}

fn child_sleeper() {
    let fabric = SimFabric::open_dir(env("MP_FABRIC"), false).unwrap();
    let cfg = SimConfig {
        host: std::env::var("MP_HOST").ok(),
        ..SimConfig::default()
    };
    let nic = SimNic::open(&fabric, cfg).unwrap();
    let e = export(&nic);
    e.side.mr.write(0, b"alive child data").unwrap();
    let info = format!(
        "{} {:x} {:x} {:x}",
        gid_hex(&nic.gid()),
        e.dct.qpn(),
        e.side.mr.rkey(),
        e.side.mr.addr()
    );
    let path = env("MP_INFO");
    std::fs::write(format!("{path}.tmp"), info).unwrap();
    std::fs::rename(format!("{path}.tmp"), &path).unwrap();
    // Bounded: the parent kills us long before this ends.
    std::thread::sleep(Duration::from_secs(60));
}

/// Entry point of the child processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "rw" => child_rw_cas(),
        "faa" => child_faa(),
        "sleeper" => child_sleeper(),
        other => panic!("unknown role {other}"),
    }
}

/// The parent's side of a test with a sleeper child: the fabric (its
/// directory kept while this lives), a node on it that checks liveness at
/// every WR, and the child.
struct Parent {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    fabric: SimFabric,
    cfg: SimConfig,
    nic: SimNic,
    child: (Child, Gid, Destination, RemoteAddr),
}

impl Parent {
    /// A fabric, this process's node, and a sleeper child (on `host` if
    /// given) that published its target.
    fn with_sleeper(host: Option<&str>) -> Parent {
        let dir = fabric_dir();
        let path = dir.path().join("fab");
        let fabric = SimFabric::open_dir(&path, true).unwrap();
        let cfg = SimConfig {
            liveness_interval: Duration::ZERO,
            ..SimConfig::default()
        };
        let nic = SimNic::open(&fabric, cfg.clone()).unwrap();
        let child = sleeper(&path, &dir.path().join("info"), host);
        Parent {
            _dir: dir,
            path,
            fabric,
            cfg,
            nic,
            child,
        }
    }
}

/// A DCI on `nic` (with its side) that has read the sleeper child's 16
/// bytes at `dest`, checked.
fn read_child(nic: &SimNic, dest: Destination, remote: RemoteAddr) -> (Side<SimNic>, sim::SimQp) {
    let s = Side::new(nic, 4096);
    let dci = s.qp(QpType::Dci, QpCaps::default(), None, 0);
    bring_up(&dci, Access::NONE, None).unwrap();
    dci.post_send(&[SendWr::read(1, s.mr.sge(0, 16).unwrap(), remote).to(dest)])
        .unwrap();
    assert_eq!(poll_one(&s.cq).status, WcStatus::Success);
    let mut got = [0u8; 16];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"alive child data");
    (s, dci)
}

/// A sleeper child (on `host` if given), once it published its target:
/// the child, its GID, its DCT as a destination and its MR.
fn sleeper(
    path: &std::path::Path,
    info: &std::path::Path,
    host: Option<&str>,
) -> (Child, Gid, Destination, RemoteAddr) {
    let mut envs = vec![
        ("MP_FABRIC", path.display().to_string()),
        ("MP_INFO", info.display().to_string()),
    ];
    envs.extend(host.map(|h| ("MP_HOST", h.to_string())));
    let child = spawn_child("sleeper", &envs);
    let start = Instant::now();
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(info) {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "child never published"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let f: Vec<&str> = text.split_whitespace().collect();
    let gid = gid_from_hex(f[0]);
    let dest = Destination::Dc(DcTarget {
        gid,
        dct_num: u32::from_str_radix(f[1], 16).unwrap(),
        dc_key: 0x5eed,
    });
    let remote = RemoteAddr {
        rkey: u32::from_str_radix(f[2], 16).unwrap(),
        addr: u64::from_str_radix(f[3], 16).unwrap(),
    };
    (child, gid, dest, remote)
}

fn wait_ok(mut c: Child) {
    let st = c.wait().unwrap();
    assert!(st.success(), "child failed: {st:?}");
}

#[test]
fn child_reads_writes_and_cases_parent_memory() {
    let dir = fabric_dir();
    let path = dir.path().join("fab");
    let fabric = SimFabric::open_dir(&path, true).unwrap();
    let nic = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let e = export(&nic);
    e.side.mr.write(0, b"parent's 16 byte").unwrap();
    wait_ok(spawn_child("rw", &export_env(&path, &e)));
    let mut got = [0u8; 14];
    e.side.mr.read(1024, &mut got).unwrap();
    assert_eq!(&got, b"child was here");
    assert_eq!(e.side.mr.load_u64(2048).unwrap(), 77);
}

#[test]
fn concurrent_faa_from_processes_sums_exactly() {
    let dir = fabric_dir();
    let path = dir.path().join("fab");
    let fabric = SimFabric::open_dir(&path, true).unwrap();
    let nic = SimNic::open(&fabric, SimConfig::default()).unwrap();
    let e = export(&nic);
    let per = 2000u64;
    let mut envs = export_env(&path, &e);
    envs.push(("MP_N", format!("{per:x}")));
    let kids: Vec<Child> = (0..3).map(|_| spawn_child("faa", &envs)).collect();
    for k in kids {
        wait_ok(k);
    }
    assert_eq!(e.side.mr.load_u64(4096).unwrap(), 3 * per);
}

#[test]
fn killed_child_is_a_dead_node_and_its_entries_are_reclaimed() {
    let Parent {
        _dir,
        path,
        fabric,
        cfg: _,
        nic,
        child: (mut child, child_gid, dest, remote),
    } = Parent::with_sleeper(None);
    let (s, dci) = read_child(&nic, dest, remote);
    assert_eq!(fabric.live_nodes().len(), 2);

    child.kill().unwrap();
    child.wait().unwrap();

    dci.post_send(&[SendWr::read(2, s.mr.sge(0, 16).unwrap(), remote).to(dest)])
        .unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!(
        (wc.wr_id, wc.status),
        (2, WcStatus::RetryExcErr),
        "dead node"
    );
    assert_eq!(fabric.live_nodes(), vec![nic.gid()]);

    let prefix = |g: &Gid| {
        let b = g.as_bytes();
        let slot = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let gen = u32::from_le_bytes(b[12..].try_into().unwrap());
        format!("n{slot}g{gen}-")
    };
    let child_prefix = prefix(&child_gid);
    let leftovers = |p: &str| {
        std::fs::read_dir(&path)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(p))
            .count()
    };
    assert!(leftovers(&child_prefix) > 0, "the crash left files behind");
    assert_eq!(fabric.reap_dead(), 1);
    assert_eq!(
        leftovers(&child_prefix),
        0,
        "reaping removes the dead node's files"
    );
    // The slot is reusable, under a new generation.
    let again = SimNic::open(&fabric, SimConfig::default()).unwrap();
    assert_ne!(again.gid(), child_gid);
}

#[test]
fn a_killed_process_leaves_its_host_to_the_next() {
    let Parent {
        _dir,
        fabric,
        cfg,
        nic,
        child: (mut child, gid, dest, remote),
        ..
    } = Parent::with_sleeper(Some("box-1"));
    let on_host = || {
        SimNic::open(
            &fabric,
            SimConfig {
                host: Some("box-1".into()),
                ..cfg.clone()
            },
        )
    };
    // A second process on the host meanwhile (this one): one GID for both.
    let beside = on_host().unwrap();
    assert_eq!(beside.gid(), gid);
    let _beside_qps = export(&beside);
    // (The child's bytes, not its neighbour's.)
    let (s, dci) = read_child(&nic, dest, remote);

    // SIGKILL: no close. The next process on the host takes the GID, and
    // the dead one's DCT number and key reach nothing there.
    child.kill().unwrap();
    child.wait().unwrap();
    let next = on_host().unwrap();
    assert_eq!(next.gid(), gid);
    assert!(fabric.live_nodes().contains(&gid));
    let _next_side = export(&next);
    dci.post_send(&[SendWr::read(2, s.mr.sge(0, 16).unwrap(), remote).to(dest)])
        .unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
}
