//! The deployment programs as separate processes on a sim directory
//! fabric: a store served by `race-memnode` processes and found from the
//! meta server's TCP address alone, clean shutdown on SIGTERM, and every
//! bad input a typed one-line error with a non-zero exit in bounded time.

mod common;

use common::*;
use race_store::deploy::{DeployError, Store, StoreOptions};
use race_store::remote::TransportError;
use std::io::{BufRead, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_deployed_store_is_found_from_the_meta_address_alone() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    // Node 0 reports its usage every second.
    let (n0, _) = start(
        MEMNODE,
        &as_refs(&memnode(&fabric, &addr, "s", 0, &["--report-s", "1"])),
    );
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
    // A usage line after the close.
    std::thread::sleep(Duration::from_millis(2500));
    // SIGTERM: each memory node leaves the store and exits 0, saying how
    // much the clients gave back.
    let mut given_kib = 0;
    for (i, n) in [(1, n1), (0, n0)] {
        let (code, err) = n.terminate_with_stderr();
        assert_eq!(code, Some(0), "{err}");
        let reports: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("race-memnode: in use "))
            .collect();
        if i == 0 {
            let last = reports
                .last()
                .unwrap_or_else(|| panic!("no usage line: {err}"));
            assert!(
                last.contains("of 16.0 MiB (") && last.contains("live grant lease(s)"),
                "{last}"
            );
            // The client's close gave memory back within the lines' periods.
            assert!(
                reports
                    .iter()
                    .any(|l| !l.contains("clients gave back 0 KiB")),
                "{reports:?}"
            );
        } else {
            assert!(reports.is_empty(), "node 1 reports every 60 s: {err}");
        }
        let kib = err
            .split("left store s")
            .nth(1)
            .and_then(|r| r.split("clients gave back ").nth(1))
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
                // Node 1's meta entry lapsed with its membership and is
                // renewed apart from it: for a moment a member nobody can
                // reach (UnknownNode), or one that left since.
                Err(race_store::Error::Transport(TransportError::Setup { .. })) => {}
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
