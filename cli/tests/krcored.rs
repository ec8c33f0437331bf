//! `krcored` as a process of its own on a sim directory fabric: processes
//! attach to it, it stops cleanly and its processes' calls fail typed,
//! 64 attachments hold one engine's QPs, a memory node runs attached.

mod common;

use common::*;
use race_store::deploy::{DeployError, Store, StoreOptions};
use std::process::Command;
use std::time::{Duration, Instant};

const KRCORED: &str = env!("CARGO_BIN_EXE_krcored");

/// A node as the tests run it: a meta server and `krcored --pool 4` on a
/// fresh directory fabric.
struct KrcoredNode {
    // Dropped last: the fabric's directory.
    daemon: Proc,
    meta: Proc,
    fabric: String,
    addr: String,
    sock: std::path::PathBuf,
    line: String,
    dir: tempfile::TempDir,
}

fn krcored_node() -> KrcoredNode {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta, addr) = meta(&fabric);
    let sock = dir.path().join("krcored.sock");
    let sock_s = sock.display().to_string();
    let (daemon, line) = start(
        KRCORED,
        &[
            "--fabric",
            &fabric,
            "--meta",
            &addr,
            "--socket",
            &sock_s,
            "--pool",
            "4",
            "--report-s",
            "1",
        ],
    );
    KrcoredNode {
        daemon,
        meta,
        fabric,
        addr,
        sock,
        line,
        dir,
    }
}

/// `krcored` as a process of its own: a process attaches over its socket,
/// registers memory through it and moves data through its engine (a
/// loopback WRITE then READ on the node); a second daemon on the same
/// socket is refused; SIGTERM exits 0 and the attached process's next
/// call fails, typed, at once.
#[test]
fn krcored_serves_attached_processes_and_stops_cleanly() {
    use krcore_kmod::daemon::{Attached, DaemonError};
    use krcore_nic::{Access, SendWr, WcStatus};
    let KrcoredNode {
        daemon: d,
        meta: meta_p,
        fabric,
        addr,
        sock,
        line,
        dir: _dir,
    } = krcored_node();
    let sock_s = sock.display().to_string();
    assert!(line.contains("dcis 4 qps "), "{line}");
    let a = Attached::attach(&sock).unwrap();
    let region = a.alloc(4096, Access::ALL).unwrap();
    let buf = a.alloc(4096, Access::LOCAL_WRITE).unwrap();
    let v = a.create_vqp().unwrap();
    v.connect(a.gid()).unwrap();
    v.add_grant(a.gid(), region.rkey(), region.grant()).unwrap();
    buf.write(0, b"through krcored").unwrap();
    v.post(&[SendWr::write(
        1,
        buf.sge(0, 15).unwrap(),
        region.remote(512),
    )])
    .unwrap();
    assert_eq!(v.wait(1, BOUND).unwrap()[0].status, WcStatus::Success);
    let mut got = [0u8; 15];
    region.read(512, &mut got).unwrap();
    assert_eq!(&got, b"through krcored");
    v.post(&[SendWr::read(
        2,
        buf.sge(64, 15).unwrap(),
        region.remote(512),
    )])
    .unwrap();
    v.wait(1, BOUND).unwrap();
    buf.read(64, &mut got).unwrap();
    assert_eq!(&got, b"through krcored");
    // A usage line (every second here) while the process is attached.
    std::thread::sleep(Duration::from_millis(1500));
    // The socket is taken by a live daemon.
    fails_with(
        KRCORED,
        &["--fabric", &fabric, "--meta", &addr, "--socket", &sock_s].map(String::from),
        "already listens",
    );
    let (code, err) = d.terminate_with_stderr();
    assert_eq!(code, Some(0), "{err}");
    let report = err
        .lines()
        .find(|l| l.starts_with("krcored: 1 process(es) attached"))
        .unwrap_or_else(|| panic!("no usage line: {err}"));
    assert!(
        report.contains("holding 1 VQP(s) and 8 KiB registered")
            && report.contains("QP(s) created on the node"),
        "{report}"
    );
    match v.post(&[SendWr::read(3, buf.sge(0, 8).unwrap(), region.remote(0))]) {
        Err(DaemonError::Gone { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Attached::attach(&sock),
        Err(DaemonError::NoDaemon { .. })
    ));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// A daemon that is alive but does not answer (stopped with SIGSTOP): a
/// control call fails, typed, once the attachment's bound has passed (no
/// hang), the attachment is given up (the next call fails `Gone` at once),
/// and once the daemon runs again a process attaches anew.
#[test]
fn a_stopped_krcored_fails_control_calls_within_the_bound() {
    use krcore_kmod::daemon::{Attached, DaemonError};
    let node = krcored_node();
    let pid = node.daemon.0.id().to_string();
    let bound = Duration::from_millis(300);
    let a = Attached::attach_timeout(&node.sock, bound).unwrap();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    // A stop is delivered asynchronously: wait until every thread of the
    // daemon is stopped (state T), or a call could still be answered.
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
                    .unwrap_or(false)
            })
    };
    let since = Instant::now();
    while !stopped() {
        assert!(since.elapsed() < BOUND, "the daemon never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let r = a.create_vqp();
    let waited = start.elapsed();
    signal("-CONT");
    match r {
        Err(DaemonError::Unanswered { what, after }) => {
            assert_eq!((what, after), ("create a VQP", bound));
        }
        other => panic!("{other:?}"),
    }
    assert!(waited >= bound, "{waited:?}");
    assert!(matches!(a.create_vqp(), Err(DaemonError::Gone { .. })));
    let b = Attached::attach(&node.sock).unwrap();
    b.create_vqp().unwrap();
    assert_eq!(node.daemon.terminate(), Some(0));
}

/// The resident memory of process `pid` (bytes), from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn krcored_serves_64_attachments_with_the_qps_of_one_engine() {
    use krcore_kmod::daemon::Attached;
    use krcore_nic::{Access, SendWr, WcStatus};
    const N: usize = 64;
    let KrcoredNode {
        daemon: d,
        meta: meta_p,
        sock,
        dir: _dir,
        ..
    } = krcored_node();
    let pid = d.0.id();
    let first = Attached::attach(&sock).unwrap();
    let rss0 = rss_bytes(pid);
    let before = first.node_stats().unwrap();
    // Each attachment (a socket of its own: a process to the daemon) with
    // a region, a VQP connected to the node and one READ through it.
    let mut held = Vec::new();
    for i in 0..N {
        let a = Attached::attach(&sock).unwrap();
        let buf = a.alloc(4096, Access::ALL).unwrap();
        let v = a.create_vqp().unwrap();
        v.connect(a.gid()).unwrap();
        // Its own memory: another attachment's is out of reach.
        v.add_grant(a.gid(), buf.rkey(), buf.grant()).unwrap();
        v.post(&[SendWr::read(
            i as u64,
            buf.sge(0, 64).unwrap(),
            buf.remote(2048),
        )])
        .unwrap();
        assert_eq!(v.wait(1, BOUND).unwrap()[0].status, WcStatus::Success);
        held.push((a, buf, v));
    }
    let after = first.node_stats().unwrap();
    assert_eq!(after.clients as usize, N + 1);
    // One engine's QPs, however many processes: no QP per attachment.
    assert_eq!(
        after.qps_created, before.qps_created,
        "{before:?} {after:?}"
    );
    assert_eq!(after.dcis, before.dcis);
    let per = rss_bytes(pid).saturating_sub(rss0) / N as u64;
    eprintln!(
        "krcored: {N} attachments (a 4 KiB region, a VQP and its ring each): {} QPs before and after, {per} bytes of daemon RSS per attachment",
        after.qps_created
    );
    drop(held);
    assert_eq!(d.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// `race-memnode --daemon`: a memory node attached to `krcored` (its
/// region the daemon's shared memory, its store joined through the
/// daemon's engine) serves a store that a process of its own finds from the
/// meta address; SIGKILLed, its membership is left by the daemon at once
/// (the lease is far longer than the test); a missing daemon is a typed
/// one-line error.
#[test]
fn race_memnode_runs_attached_to_krcored() {
    let KrcoredNode {
        daemon: d,
        meta: meta_p,
        fabric,
        addr,
        sock,
        line: _,
        dir,
    } = krcored_node();
    let sock_s = sock.display().to_string();
    let args = [
        "--daemon",
        &sock_s,
        "--meta",
        &addr,
        "--store",
        "att",
        "--id",
        "0",
        "--nodes",
        "1",
        "--mb",
        "16",
        "--lease-ms",
        "600000",
    ];
    let (n0, line) = start(MEMNODE, &args);
    assert!(line.contains(&format!("daemon {sock_s}")), "{line}");
    let store = Store::connect(&fabric, &addr, "att", StoreOptions::default()).unwrap();
    let mut c = store.client().unwrap();
    for i in 0..200u32 {
        c.put(format!("k{i}").as_bytes(), &i.to_le_bytes()).unwrap();
    }
    assert_eq!(
        c.get(b"k7").unwrap().as_deref(),
        Some(&7u32.to_le_bytes()[..])
    );
    drop(c);
    drop(n0); // SIGKILL, reaped
    let start = Instant::now();
    loop {
        let gone = Store::connect(
            &fabric,
            &addr,
            "att",
            StoreOptions {
                wait: Duration::ZERO,
                ..StoreOptions::default()
            },
        );
        match gone {
            Err(DeployError::NoSuchStore { .. }) => break,
            Ok(_) => assert!(
                start.elapsed() < BOUND,
                "the daemon did not leave the store of a killed memory node"
            ),
            Err(e) => panic!("{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let missing = dir.path().join("nobody.sock").display().to_string();
    let mut bad: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    bad[1] = missing;
    fails_with(MEMNODE, &bad, "cannot reach the node daemon");
    assert_eq!(d.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}
