//! The deployment programs as separate processes on a sim directory
//! fabric: a store served by `race-memnode` processes and found from the
//! meta server's TCP address alone, clean shutdown on SIGTERM, and every
//! bad input a typed one-line error with a non-zero exit in bounded time.

use race_store::deploy::{DeployError, Store, StoreOptions};
use race_store::remote::TransportError;
use std::io::{BufRead, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MEMNODE: &str = env!("CARGO_BIN_EXE_race-memnode");
const META: &str = env!("CARGO_BIN_EXE_krcore-meta");
/// Every process of these tests ends (or is killed) within this bound.
const BOUND: Duration = Duration::from_secs(60);

/// A child killed (and reaped) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// [`Proc::terminate`], and what the process wrote on stderr.
    fn terminate_with_stderr(mut self) -> (Option<i32>, String) {
        let mut stderr = self.0.stderr.take().unwrap();
        let code = self.terminate();
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        (code, err)
    }

    /// Sends SIGTERM and waits (bounded) for the exit code.
    fn terminate(mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.0.try_wait() {
                return s.code();
            }
            assert!(start.elapsed() < BOUND, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn fabric_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("krcore-deploy-test-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// Starts a server and waits (bounded) for its `ready:` line; returns it.
fn start(bin: &str, args: &[&str]) -> (Proc, String) {
    let mut child = Proc(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    loop {
        match rx.recv_timeout(BOUND.saturating_sub(start.elapsed())) {
            Ok(l) if l.starts_with("ready: ") => return (child, l),
            Ok(_) => {}
            Err(_) => {
                let mut err = String::new();
                if let Some(mut e) = child.0.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("{bin} {args:?} never became ready: {err}");
            }
        }
    }
}

/// A meta server on `fabric`; its TCP address.
fn meta(fabric: &str) -> (Proc, String) {
    let (p, line) = start(META, &["--fabric", fabric, "--listen", "127.0.0.1:0"]);
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "listen")
        .nth(1)
        .unwrap()
        .to_string();
    (p, addr)
}

fn memnode(fabric: &str, meta: &str, store: &str, id: u8, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--fabric", fabric, "--meta", meta, "--store", store, "--nodes", "2", "--mb", "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(["--id".to_string(), id.to_string()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Runs a command to its end, as `Command::output`, but bounded: one still
/// running after [`BOUND`] is killed and the test fails (a memory node that
/// should have been refused and serves instead never ends by itself).
fn bounded_output(bin: &str, args: &[String]) -> Output {
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(BOUND) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{bin} {args:?} still running after {BOUND:?}: it should have been refused");
        }
    }
}

/// Runs a command that must fail: bounded, exit code 1, one line on stderr
/// containing `needle`.
fn fails_with(bin: &str, args: &[String], needle: &str) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            panic!("{bin} {args:?} did not exit within {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let out = Output {
        status,
        stdout: vec![],
        stderr: err.clone().into_bytes(),
    };
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one error line: {err}");
    assert!(errors[0].contains(needle), "{needle:?} not in: {err}");
}

#[test]
fn a_deployed_store_is_found_from_the_meta_address_alone() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let (n0, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "s", 0, &[])));
    // Node 1 takes its settings from a file (flags give the rest).
    let conf = dir.path().join("n1.toml");
    std::fs::write(
        &conf,
        "store = \"s\"\nid = 1\nnodes = 2\nmb = 16\n[engine]\npool_size = 2\nmeta_timeout_ms = 2000\n",
    )
    .unwrap();
    let conf = conf.display().to_string();
    let (n1, _) = start(
        MEMNODE,
        &["--fabric", &fabric, "--meta", &addr, "--config", &conf],
    );
    // This process knows only the fabric string and the TCP address.
    let store = Store::connect(&fabric, &addr, "s", StoreOptions::default()).unwrap();
    assert_eq!(store.infos().len(), 2);
    let mut c = store.client().unwrap();
    for i in 0..500u32 {
        c.put(format!("k{i}").as_bytes(), &i.to_le_bytes()).unwrap();
    }
    let mut other = store.client().unwrap();
    for i in 0..500u32 {
        assert_eq!(
            other.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&i.to_le_bytes()[..])
        );
    }
    assert!(other.check_table().unwrap().problems.is_empty());
    // `--status` lists the members from the TCP address alone.
    let status = |store: &str| {
        bounded_output(
            MEMNODE,
            &["--status", "--store", store, "--meta", &addr].map(String::from),
        )
    };
    let out = status("s");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("2 live member(s), 2 memory node(s)"),
        "{text}"
    );
    assert!(
        text.contains("  node 0: gid ") && text.contains("  node 1: gid "),
        "{text}"
    );
    assert!(
        text.contains("region 16 MiB") && text.contains("store s: complete"),
        "{text}"
    );
    let out = status("nope");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no store named \"nope\""), "{err}");
    // A closing client gives its memory back to the memory nodes.
    let closed = c.close();
    assert!(closed.error.is_none(), "{:?}", closed.error);
    assert!(closed.returned_bytes > 0 && closed.kept_bytes == 0);
    // SIGTERM: each memory node leaves the store and exits 0, saying how
    // much the clients gave back.
    let mut given_kib = 0;
    for n in [n1, n0] {
        let (code, err) = n.terminate_with_stderr();
        assert_eq!(code, Some(0), "{err}");
        let kib = err
            .split("clients gave back ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|k| k.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no figure on the exit line: {err}"));
        given_kib += kib;
    }
    // Each node's figure is rounded down to a KiB.
    let total = closed.returned_bytes >> 10;
    assert!(
        given_kib + 1 >= total && given_kib <= total,
        "nodes say {given_kib} KiB, the client gave back {total} KiB"
    );
    let gone = Store::connect(
        &fabric,
        &addr,
        "s",
        StoreOptions {
            wait: Duration::ZERO,
            ..StoreOptions::default()
        },
    );
    assert!(
        matches!(gone, Err(DeployError::NoSuchStore { .. })),
        "{gone:?}"
    );
    assert_eq!(meta_p.terminate(), Some(0));
}

#[test]
fn memory_nodes_and_clients_follow_a_restarted_meta_server() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    // Short leases: renewals every 300 ms (every 100 ms after a failure).
    let lease = ["--lease-ms", "900"];
    let (n0, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "s", 0, &lease)));
    let (n1, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "s", 1, &lease)));
    let store = Store::connect(&fabric, &addr, "s", StoreOptions::default()).unwrap();
    let mut before = store.client().unwrap();
    for i in 0..200u32 {
        before
            .put(format!("k{i}").as_bytes(), &i.to_le_bytes())
            .unwrap();
    }
    // The meta server restarts at the same address: a new table, DCT and
    // incarnation.
    assert_eq!(meta_p.terminate(), Some(0));
    let (meta_p, again) = start(META, &["--fabric", &fabric, "--listen", &addr]);
    assert!(again.contains(&addr), "{again}");
    // A client connected before keeps working (its connections are made).
    for i in 0..200u32 {
        assert_eq!(
            before.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&i.to_le_bytes()[..])
        );
    }
    // The memory nodes follow the server: registered and joined in its new
    // table, so a new client finds the store (within the bound) and reads
    // what was written before the restart.
    let start_wait = Instant::now();
    let after = loop {
        let opts = StoreOptions {
            wait: Duration::from_secs(1),
            ..StoreOptions::default()
        };
        match Store::connect(&fabric, &addr, "s", opts) {
            Ok(s) => break s,
            Err(e) => assert!(
                start_wait.elapsed() < BOUND,
                "no store {BOUND:?} after the restart: {e}"
            ),
        }
    };
    let mut c = after.client().unwrap();
    for i in 0..200u32 {
        assert_eq!(
            c.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&i.to_le_bytes()[..])
        );
    }
    c.put(b"after", b"restart").unwrap();
    assert_eq!(
        before.get(b"after").unwrap().as_deref(),
        Some(&b"restart"[..])
    );
    assert_eq!(n1.terminate(), Some(0));
    assert_eq!(n0.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// Memory nodes restarted on their hosts (the sim's `host=`: a restarted
/// process has its predecessor's GID, as on hardware) hold none of their
/// predecessors' data, and nothing takes them for their predecessors:
/// - while the dead process's membership lease runs, its id is taken,
///   even at the same GID (the join would have renewed it);
/// - a node 0 beside live members of the old table refuses to format;
/// - a node 1 that joins after its predecessor's lease ran out is caught
///   by the next client (the table recorded another process at id 1), a
///   typed error instead of keys gone missing.
#[test]
fn memory_nodes_restarted_empty_are_not_taken_for_their_predecessors() {
    let dir = fabric_dir();
    let base = format!("sim:{}", dir.path().join("f").display());
    let on = |host: &str| format!("{base},host={host}");
    let (meta_p, addr) = meta(&on("meta"));
    // Leases long enough that a live node's renewals do not lapse on a
    // loaded machine (a lapse lets node 0 format beside it: see the
    // restart below), short enough to wait out.
    let lease = ["--lease-ms", "2500"];
    // Presized: half the table's subtables (and the keys they index) on
    // node 1.
    let n0_args = memnode(
        &on("mem0"),
        &addr,
        "s",
        0,
        &["--lease-ms", "2500", "--expected-keys", "1000"],
    );
    let n1_args = memnode(&on("mem1"), &addr, "s", 1, &lease);
    let (n0, _) = start(MEMNODE, &as_refs(&n0_args));
    let (mut n1, _) = start(MEMNODE, &as_refs(&n1_args));
    let store = Store::connect(&on("client"), &addr, "s", StoreOptions::default()).unwrap();
    let mut c = store.client().unwrap();
    for i in 0..300u32 {
        c.put(format!("k{i}").as_bytes(), &[7u8; 200]).unwrap();
    }
    // (The loading client ends: the later one runs on its host, whose port
    // takes one engine at a time.)
    drop(c);
    drop(store);
    // A client that stays connected across the restart (on a host of its
    // own).
    let across = Store::connect(&on("across"), &addr, "s", StoreOptions::default()).unwrap();
    let mut kept = across.client().unwrap();
    assert_eq!(kept.get(b"k0").unwrap(), Some(vec![7u8; 200]));

    // Node 1 dies (SIGKILL) and is started again at once on its host.
    let _ = n1.0.kill();
    let _ = n1.0.wait();
    fails_with(MEMNODE, &n1_args, "memory node id 1 is taken");
    // Node 0 cannot be started beside the live one either.
    fails_with(MEMNODE, &n0_args, "memory node id 0 is taken");
    // Once the dead node's lease ran out, a new node 1 joins (its region
    // is empty) and a new client is told so.
    let t0 = Instant::now();
    let n1_again = loop {
        std::thread::sleep(Duration::from_millis(300));
        // Its stderr is not read: a pipe nobody drains would stall its
        // logging threads, its renewals with them, once full.
        let mut child = Command::new(MEMNODE)
            .args(&n1_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.starts_with("ready: ") {
            // Drained, so that a later line never blocks (nor kills) it.
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            break Proc(child);
        }
        let _ = child.wait();
        assert!(t0.elapsed() < BOUND, "node 1 never joined again");
    };
    let later = Store::connect(&on("client"), &addr, "s", StoreOptions::default()).unwrap();
    match later.client() {
        Err(race_store::Error::MemberReplaced { id: 1, .. }) => {}
        Err(e) => panic!("expected MemberReplaced for node 1, got {e:?}"),
        Ok(_) => panic!("a client took the empty node 1 for the table's"),
    }
    // The client connected before is told too, by its first operations on
    // node 1 (the store's membership names another process at id 1): not
    // "down", and never another value.
    let t0 = Instant::now();
    'told: loop {
        for i in 0..300u32 {
            match kept.get(format!("k{i}").as_bytes()) {
                Ok(v) => assert_eq!(v, Some(vec![7u8; 200]), "k{i}"),
                Err(race_store::Error::Transport(TransportError::NodeReplaced {
                    node: 1, ..
                })) => break 'told,
                Err(_) => {}
            }
        }
        assert!(t0.elapsed() < BOUND, "the connected client was never told");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(kept);
    drop(across);
    // Node 0 (which formatted the table) restarts: refused while node 1 is
    // a live member of the old table, even after its own lease ran out.
    let _ = { n0 }.0.kill();
    let t0 = Instant::now();
    loop {
        let out = bounded_output(MEMNODE, &n0_args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        if err.contains("live members of an earlier table") {
            break;
        }
        assert!(err.contains("is taken"), "{err}");
        assert!(
            t0.elapsed() < BOUND,
            "never refused as an earlier table: {err}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(n1_again);
    assert_eq!(meta_p.terminate(), Some(0));
}

#[test]
fn a_memory_node_whose_membership_lapsed_does_not_serve_a_new_table() {
    let dir = fabric_dir();
    let base = format!("sim:{}", dir.path().join("f").display());
    let on = |host: &str| format!("{base},host={host}");
    let (meta_p, addr) = meta(&on("meta"));
    // Presized: half the table's initial subtables on node 1, where a new
    // node 0's directory points too.
    let n0_args = memnode(
        &on("mem0"),
        &addr,
        "l",
        0,
        &["--lease-ms", "2500", "--expected-keys", "1000"],
    );
    let n1_args = memnode(&on("mem1"), &addr, "l", 1, &["--lease-ms", "2500"]);
    let (n0, _) = start(MEMNODE, &as_refs(&n0_args));
    let (mut n1, _) = start(MEMNODE, &as_refs(&n1_args));
    {
        let store = Store::connect(&on("client"), &addr, "l", StoreOptions::default()).unwrap();
        let mut c = store.client().unwrap();
        for i in 0..300u32 {
            c.put(format!("k{i}").as_bytes(), &[7u8; 200]).unwrap();
        }
    }
    // Node 1 stops (as a process starved past its lease) and node 0 dies;
    // once both leases ran out the store has no live member, and a new
    // node 0 formats a new table.
    let signal = |sig: &str, pid: u32| {
        assert!(Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP", n1.0.id());
    let _ = { n0 }.0.kill();
    let opts = race_store::deploy::MemoryNodeOptions::new("l", 0, 2, 16 << 20, &addr);
    let t0 = Instant::now();
    while race_store::deploy::check_membership(&opts).is_err() {
        assert!(t0.elapsed() < BOUND, "the leases never ran out");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (n0_new, _) = start(MEMNODE, &as_refs(&n0_args));
    // The new node 0 alone: `--status` says the store is incomplete.
    let out = bounded_output(
        MEMNODE,
        &["--status", "--store", "l", "--meta", &addr].map(String::from),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("memory nodes [1] of 2 are not registered"),
        "{err}"
    );
    // Node 1 goes on: its renewals join the store again, beside the new
    // node 0. No client takes it for the new table's (its region holds the
    // old table's subtables where the new directory points), and it leaves
    // by itself.
    signal("-CONT", n1.0.id());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = n1.0.try_wait().unwrap() {
            break s;
        }
        match Store::connect(
            &on("client"),
            &addr,
            "l",
            StoreOptions {
                wait: Duration::ZERO,
                ..StoreOptions::default()
            },
        ) {
            Err(DeployError::Incomplete { .. }) => {}
            Err(e) => panic!("connect: {e}"),
            Ok(store) => match store.client() {
                Err(race_store::Error::MemberNotInTable { id: 1, .. }) => {}
                Err(e) => panic!("expected MemberNotInTable for node 1, got {e:?}"),
                Ok(_) => panic!("a client took the lapsed node 1 for the new table's"),
            },
        }
        assert!(t0.elapsed() < BOUND, "the lapsed node 1 never left");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    n1.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("has a new table"), "{err}");
    // A node 1 started anew joins the new table: the store works, and none
    // of the old table's keys is back.
    let (n1_new, _) = start(MEMNODE, &as_refs(&n1_args));
    let store = Store::connect(&on("client"), &addr, "l", StoreOptions::default()).unwrap();
    let mut c = store.client().unwrap();
    for i in 0..300u32 {
        assert_eq!(c.get(format!("k{i}").as_bytes()).unwrap(), None, "k{i}");
    }
    c.put(b"fresh", b"v").unwrap();
    assert_eq!(c.get(b"fresh").unwrap(), Some(b"v".to_vec()));
    drop(c);
    drop(store);
    assert_eq!(n1_new.terminate(), Some(0));
    assert_eq!(n0_new.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}

#[test]
fn a_memory_node_started_before_its_meta_server_waits_for_it() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let addr = {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    // Nobody answers within the wait: the usual one-line error, after it.
    let t = Instant::now();
    fails_with(
        MEMNODE,
        &memnode(&fabric, &addr, "w", 0, &["--meta-wait-s", "1"]),
        "cannot connect to the meta server",
    );
    assert!(t.elapsed() >= Duration::from_secs(1));
    // The meta server comes a second after the memory node: it is waited
    // for, and the node joins.
    let (f2, a2) = (fabric.clone(), addr.clone());
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        start(META, &["--fabric", &f2, "--listen", &a2])
    });
    let (n0, ready) = start(
        MEMNODE,
        &as_refs(&memnode(&fabric, &addr, "w", 0, &["--meta-wait-s", "30"])),
    );
    assert!(ready.contains("store w id 0"), "{ready}");
    let (meta_p, _) = late.join().unwrap();
    assert_eq!(n0.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn bad_inputs_are_typed_one_line_errors_in_bounded_time() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (_meta, addr) = meta(&fabric);

    // A wrong device name (without the verbs feature: no verbs provider;
    // with it: no such device, listing those there are).
    fails_with(
        MEMNODE,
        &memnode("verbs:nosuch0", &addr, "s", 0, &[]),
        "verbs",
    );
    // An unreachable meta server.
    fails_with(
        MEMNODE,
        &memnode(&fabric, "127.0.0.1:1", "s", 0, &[]),
        "cannot connect to the meta server at 127.0.0.1:1",
    );
    // A meta server of another wire version (a v2 server answers every
    // connection with its bootstrap at once).
    let old = TcpListener::bind("127.0.0.1:0").unwrap();
    let old_addr = old.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in old.incoming().take(4) {
            let Ok(mut s) = s else { continue };
            let mut v2 = b"KRMT".to_vec();
            v2.extend_from_slice(&[2, 0x83, 80, 0]);
            v2.extend_from_slice(&[0; 8 + 80]);
            let _ = s.write_all(&v2);
        }
    });
    fails_with(
        MEMNODE,
        &memnode(&fabric, &old_addr, "s", 0, &[]),
        "wire version",
    );
    // A memory node whose node 0 never formatted the table.
    fails_with(
        MEMNODE,
        &memnode(&fabric, &addr, "lonely", 1, &["--wait-s", "1"]),
        "memory node 0 did not register",
    );
    // Two memory nodes with the same id.
    let (_n0, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "dup", 0, &[])));
    fails_with(
        MEMNODE,
        &memnode(&fabric, &addr, "dup", 0, &[]),
        "memory node id 0 is taken",
    );
    // A store name nobody registered.
    let r = Store::connect(
        &fabric,
        &addr,
        "nobody",
        StoreOptions {
            wait: Duration::from_millis(200),
            ..StoreOptions::default()
        },
    );
    assert!(
        matches!(r, Err(DeployError::NoSuchStore { ref store, .. }) if store == "nobody"),
        "{r:?}"
    );
    // A config file with a misspelt key: a usage error naming it.
    let conf = dir.path().join("bad.toml");
    std::fs::write(&conf, "[engine]\npool_sise = 2\n").unwrap();
    let out = Command::new(MEMNODE)
        .args(["--config", &conf.display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("pool_sise"), "{err}");
    // A store name that is not one.
    fails_with(
        MEMNODE,
        &memnode(&fabric, &addr, "bad name!", 0, &[]),
        "store",
    );
}

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
            "--fabric", &fabric, "--meta", &addr, "--socket", &sock_s, "--pool", "4",
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
    // The socket is taken by a live daemon.
    fails_with(
        KRCORED,
        &["--fabric", &fabric, "--meta", &addr, "--socket", &sock_s].map(String::from),
        "already listens",
    );
    assert_eq!(d.terminate(), Some(0));
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

/// Processes on one port share its GID (the sim's `host=`): a second
/// engine on the port is refused at start, a one-line error naming the
/// holder, instead of taking over the first one's meta entry, cached
/// address and messages; once the first process is gone, even killed, the
/// port is free again.
#[test]
fn a_second_engine_on_a_port_is_refused_until_the_first_is_gone() {
    let dir = fabric_dir();
    let base = format!("sim:{}", dir.path().join("f").display());
    let on = |host: &str| format!("{base},host={host}");
    let (first, addr) = meta(&on("m"));
    let pid = first.0.id();
    let needle = format!("another process (pid {pid}) runs a KRCore engine on this port");
    fails_with(MEMNODE, &memnode(&on("m"), &addr, "s", 0, &[]), &needle);
    let again: Vec<String> = ["--fabric", &on("m"), "--listen", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    fails_with(META, &again, &needle);
    // Another host of the fabric is another port.
    let (n0, _) = start(MEMNODE, &as_refs(&memnode(&on("n"), &addr, "s", 0, &[])));
    assert_eq!(n0.terminate(), Some(0));
    let mut first = first;
    let _ = first.0.kill();
    let _ = first.0.wait();
    let (second, _) = start(META, &as_refs(&again));
    assert_eq!(second.terminate(), Some(0));
}

/// `--expected-keys` on node 0: the new table starts with the subtables
/// that hold that many keys at half fill (100,000 keys: 3 subtables of
/// 86,016 slots), at least 4 per node (8), four on each node; a node too
/// small for its share is refused with what it needs.
#[test]
fn node_0_presizes_the_table_for_the_expected_keys() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let (n0, _) = start(
        MEMNODE,
        &as_refs(&memnode(
            &fabric,
            &addr,
            "p",
            0,
            &["--expected-keys", "100000"],
        )),
    );
    let (n1, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "p", 1, &[])));
    let store = Store::connect(&fabric, &addr, "p", StoreOptions::default()).unwrap();
    let mut c = store.client().unwrap();
    c.put(b"k", b"v").unwrap();
    let check = c.check_table().unwrap();
    assert_eq!((check.global_depth, check.subtables), (3, 8), "{check:?}");
    // Spread over the two nodes, as splits would place them: node 1 laid
    // out its share of node 0's table.
    assert_eq!(check.subtables_per_node, [4, 4], "{check:?}");
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    drop(c);
    drop(store);
    assert_eq!(n1.terminate(), Some(0));
    assert_eq!(n0.terminate(), Some(0));
    // 2,000,000 keys: 64 subtables of 768 KiB, 32 on each node: node 0
    // has room for its share (64 MiB), node 1 (16 MiB) does not.
    let mut big = memnode(&fabric, &addr, "q", 0, &["--expected-keys", "2000000"]);
    let mb = big.iter().position(|a| a == "--mb").unwrap() + 1;
    big[mb] = "64".to_string();
    let (n0, _) = start(MEMNODE, &as_refs(&big));
    fails_with(
        MEMNODE,
        &memnode(&fabric, &addr, "q", 1, &[]),
        "memory node 1 holds 32 of the table's initial subtables and needs a region of at least",
    );
    assert_eq!(n0.terminate(), Some(0));
    assert_eq!(meta_p.terminate(), Some(0));
}
