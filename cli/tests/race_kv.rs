//! `race-kv` against a deployed store: a meta server and two memory nodes
//! as separate processes on a sim directory fabric, and `race-kv` as a
//! process per command, on a node of its own and through `krcored`.

mod common;

use common::*;
use std::io::Write;
use std::process::{Command, Stdio};

const KV: &str = env!("CARGO_BIN_EXE_race-kv");
const KRCORED: &str = env!("CARGO_BIN_EXE_krcored");

/// The arguments of a race-kv command against store `store` on `fabric`
/// through the meta server at `addr`, then `extra`.
fn store_args(fabric: &str, addr: &str, store: &str, extra: &[&str]) -> Vec<String> {
    ["--fabric", fabric, "--meta", addr, "--store", store]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

/// Memory nodes 0 and 1 of store `store`.
fn two_nodes(fabric: &str, addr: &str, store: &str) -> (Proc, Proc) {
    let (n0, _) = start(MEMNODE, &as_refs(&memnode(fabric, addr, store, 0, &[])));
    let (n1, _) = start(MEMNODE, &as_refs(&memnode(fabric, addr, store, 1, &[])));
    (n0, n1)
}

#[test]
fn race_kv_runs_one_command_against_a_deployed_store() {
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let (n0, n1) = two_nodes(&fabric, &addr, "s");
    let on = |extra: &[&str]| store_args(&fabric, &addr, "s", extra);
    let ok = |args: Vec<String>| -> String {
        let out = bounded_output(KV, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(ok(on(&["put", "k1", "v1"])), "");
    // Not a terminal: the value's bytes alone.
    assert_eq!(ok(on(&["get", "k1"])), "v1");
    fails_with(KV, &on(&["insert", "k1", "x"]), "key already exists");
    assert_eq!(ok(on(&["get", "k1"])), "v1");
    ok(on(&["insert", "k3", "three"]));
    // `-`: the value from stdin, any bytes.
    let value: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let mut put = Command::new(KV)
        .args(on(&["put", "k2", "-"]))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    put.stdin.take().unwrap().write_all(&value).unwrap();
    let out = put.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bounded_output(KV, &on(&["get", "k2"]));
    assert_eq!(out.stdout, value);
    ok(on(&["delete", "k1"]));
    fails_with(KV, &on(&["get", "k1"]), "key not found");
    fails_with(KV, &on(&["delete", "k1"]), "key not found");
    let report = ok(on(&["check"]));
    assert!(
        report.contains(" 2 keys, 0 duplicates, 0 problem(s), 0 tentative slot(s)"),
        "{report}"
    );
    // A reader that goes away (`race-kv check | head -1`): race-kv ends
    // quietly with SIGPIPE's shell status, no panic.
    let mut cut = Command::new(KV)
        .args(on(&["check"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(cut.stdout.take());
    let out = cut.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // No inserter died inside an insert: the sweep finds nothing and does
    // not wait.
    let swept = ok(on(&["sweep"]));
    assert!(
        swept.contains(" 0 tentative slot(s) found: 0 removed"),
        "{swept}"
    );
    // Every client so far closed (its lease ended): a collection finds
    // both nodes ready at once, reads the table and takes back what no
    // slot links (a closed client left nothing: every block it held went
    // back with its close).
    let collected = ok(on(&["collect", "--dry-run"]));
    let lines: Vec<&str> = collected.lines().collect();
    assert_eq!(lines.len(), 3, "{collected}");
    assert!(
        lines[0].starts_with("node 0: leases ended after "),
        "{collected}"
    );
    assert!(
        lines[1].contains("would take back 0 KiB in 0 run(s)"),
        "{collected}"
    );
    assert!(
        lines[2].starts_with("2 memory node(s): would take back "),
        "{collected}"
    );
    let collected = ok(on(&["collect", "--node", "1"]));
    assert!(
        collected.starts_with("node 1: ") && collected.contains("took back"),
        "{collected}"
    );
    fails_with(KV, &on(&["collect", "--node", "7"]), "no memory node 7");
    assert_eq!(ok(on(&["get", "k3"])), "three");
    // Every node's usage, from its usage record (written every second).
    let usage = ok(on(&["usage"]));
    let lines: Vec<&str> = usage.lines().collect();
    assert_eq!(lines.len(), 3, "{usage}");
    for (i, l) in lines[..2].iter().enumerate() {
        assert!(
            l.starts_with(&format!("node {i}: in use ")) && l.contains(" of 16.0 MiB ("),
            "{usage}"
        );
        assert!(!l.contains("stale"), "{usage}");
    }
    assert!(
        lines[2].starts_with("store s: in use ")
            && lines[2].contains(" of 32.0 MiB (")
            && lines[2].ends_with("on 2 memory node(s) with a record"),
        "{usage}"
    );

    // A dump of store s loads into a new store t: the same pairs.
    let file = dir.path().join("s.dump").display().to_string();
    let out = bounded_output(KV, &on(&["dump", &file]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("dumped 2 pair(s)"), "{err}");
    let (t0, t1) = two_nodes(&fabric, &addr, "t");
    let on_t = |extra: &[&str]| store_args(&fabric, &addr, "t", extra);
    let out = bounded_output(KV, &on_t(&["load", &file]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("loaded 2 pair(s)"), "{err}");
    assert_eq!(bounded_output(KV, &on_t(&["get", "k2"])).stdout, value);
    assert_eq!(ok(on_t(&["get", "k3"])), "three");
    assert!(ok(on_t(&["check"])).contains(" 2 keys, 0 duplicates"));
    // A cut dump is refused (nothing past the cut is taken for the end).
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.path().join("cut.dump");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    fails_with(
        KV,
        &on_t(&["load", &cut.display().to_string()]),
        "without its footer (truncated)",
    );
    fails_with(
        KV,
        &on_t(&["load", "/nonexistent/x.dump"]),
        "/nonexistent/x.dump: No such file",
    );
    drop((t0, t1));

    // Through the node daemon: the same store, the same values.
    let sock = dir.path().join("krcored.sock");
    let sock_s = sock.display().to_string();
    let (daemon, _) = start(
        KRCORED,
        &[
            "--fabric", &fabric, "--meta", &addr, "--socket", &sock_s, "--pool", "4",
        ],
    );
    let attached = |extra: &[&str]| -> Vec<String> {
        ["--daemon", &sock_s, "--meta", &addr, "--store", "s"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    assert_eq!(ok(attached(&["get", "k3"])), "three");
    ok(attached(&["put", "k3", "drei"]));
    assert_eq!(ok(on(&["get", "k3"])), "drei");
    assert_eq!(daemon.terminate(), Some(0));

    // Bad input: typed one-line errors, bounded.
    let with_store = |store: &str, extra: &[&str]| -> Vec<String> {
        [
            "--fabric", &fabric, "--meta", &addr, "--wait-s", "0", "--store", store,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    fails_with(
        KV,
        &with_store("nope", &["get", "k"]),
        "no store named \"nope\"",
    );
    fails_with(KV, &on(&["get", ""]), "empty");
    for usage in [
        vec![
            "--fabric".to_string(),
            fabric.clone(),
            "get".into(),
            "k".into(),
        ],
        on(&[]),
        on(&["frobnicate"]),
        vec!["--store".into(), "s".into(), "get".into(), "k".into()],
    ] {
        let out = bounded_output(KV, &usage);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{usage:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop((n1, n0));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// How many pairs a load stopped by a signal said it put (its stderr).
fn stopped_after(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("race-kv: load stopped by a signal after "))
        .and_then(|l| l.strip_suffix(" pair(s)"))
        .unwrap_or_else(|| panic!("{stderr}"))
        .parse()
        .unwrap()
}

/// `race-kv` with `check` (the store's arguments, then `check`) finds `keys`
/// keys and no problem.
fn assert_keys(check: &[String], keys: u64) {
    let out = bounded_output(KV, check);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!(" {keys} keys, 0 duplicates, 0 problem(s)")),
        "{keys} put: {report}"
    );
}

/// `load -` whose writer stalls (the pipe open, nothing more coming) stops
/// at SIGTERM, putting the pairs it read: before, it sat in its read of
/// stdin until the next batch, which never came.
#[test]
fn a_load_from_a_stalled_pipe_stops_at_sigterm() {
    use std::io::BufRead;
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let (n0, n1) = two_nodes(&fabric, &addr, "s");
    let on = |extra: &[&str]| store_args(&fabric, &addr, "s", extra);
    let mut load = Proc(
        Command::new(KV)
            .args(on(&["load", "-"]))
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A dump's header and 10 pairs, no footer, and the pipe kept open.
    let mut pipe = load.0.stdin.take().unwrap();
    let mut bytes = Vec::new();
    {
        let mut w = race_store::dump::DumpWriter::new(&mut bytes).unwrap();
        for i in 0..10 {
            w.pair(format!("key{i}").as_bytes(), b"value").unwrap();
        }
    }
    pipe.write_all(&bytes).unwrap();
    pipe.flush().unwrap();
    let mut lines = std::io::BufReader::new(load.0.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, "race-kv: loading stdin");
    // Bounded: the load must end within the tests' bound with the pipe open.
    let code = load.terminate();
    let rest: String = lines.map_while(Result::ok).map(|l| l + "\n").collect();
    assert_eq!(code, Some(1), "{rest}");
    let put = stopped_after(&rest);
    assert!(put <= 10, "{rest}");
    assert_keys(&on(&["check"]), put);
    drop(pipe);
    drop((n1, n0));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// `load` says what it starts on; SIGTERM stops it between two batches:
/// it says how many pairs it put, every one of them is in the store, and
/// it exits 1 after its client gave back what it borrowed.
#[test]
fn a_load_stopped_by_sigterm_says_how_far_it_got() {
    use std::io::BufRead;
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let (n0, n1) = two_nodes(&fabric, &addr, "s");
    // More pairs than a load puts before the signal lands.
    let file = dir.path().join("big.dump");
    let total = 100_000u64;
    let mut w = race_store::dump::DumpWriter::new(std::io::BufWriter::new(
        std::fs::File::create(&file).unwrap(),
    ))
    .unwrap();
    for i in 0..total {
        w.pair(format!("key{i}").as_bytes(), &[b'v'; 32]).unwrap();
    }
    w.finish().unwrap();
    let on = |extra: &[&str]| store_args(&fabric, &addr, "s", extra);
    let mut load = Proc(
        Command::new(KV)
            .args(on(&["load", &file.display().to_string()]))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(load.0.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("race-kv: loading "), "{first}");
    let _ = Command::new("kill")
        .args(["-TERM", &load.0.id().to_string()])
        .status();
    let rest: String = lines.map_while(Result::ok).map(|l| l + "\n").collect();
    let code = load.0.wait().unwrap().code();
    assert_eq!(code, Some(1), "{rest}");
    let put = stopped_after(&rest);
    assert!(put < total, "{rest}");
    assert_keys(&on(&["check"]), put);
    drop((n1, n0));
    assert_eq!(meta_p.terminate(), Some(0));
}

/// `maintain`: one round (`--once`, as from cron) takes back what a killed
/// client left (`check` then finds nothing unlinked); the loop prints a
/// ready line and a round every `--every-s`, and stops at SIGTERM with 0;
/// a round every 0 s is refused.
#[test]
fn maintain_takes_back_what_a_killed_client_left_and_stops_at_sigterm() {
    use std::io::BufRead;
    let dir = fabric_dir();
    let fabric = format!("sim:{}", dir.path().join("f").display());
    let (meta_p, addr) = meta(&fabric);
    let lease = ["--grant-lease-ms", "1000"];
    let (n0, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "s", 0, &lease)));
    let (n1, _) = start(MEMNODE, &as_refs(&memnode(&fabric, &addr, "s", 1, &lease)));
    let on = |extra: &[&str]| store_args(&fabric, &addr, "s", extra);
    // A client that dies holding what it wrote over: never closed.
    let node = krcore::Node::builder()
        .fabric(&fabric)
        .meta_addr(&addr)
        .build()
        .unwrap();
    let store = race_store::deploy::Store::open(&node, &addr, "s", Default::default()).unwrap();
    let mut dying = store.client().unwrap();
    for round in 0..3u8 {
        for k in 0..300u32 {
            dying
                .put(format!("key{k}").as_bytes(), &[round; 200])
                .unwrap();
        }
    }
    std::mem::forget(dying);
    // Its lease runs out (1 s), and node 0's usage record says so.
    let mut usage = String::new();
    for _ in 0..50 {
        let out = bounded_output(KV, &on(&["usage"]));
        usage = String::from_utf8_lossy(&out.stdout).into_owned();
        if usage.contains("node 0: ")
            && usage.contains("1 lease(s) ran out since its last collection")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        usage.contains("1 lease(s) ran out since its last collection"),
        "{usage}"
    );
    // The same for monitoring.
    let out = bounded_output(KV, &on(&["usage", "--format", "prometheus"]));
    let prom = String::from_utf8_lossy(&out.stdout);
    assert!(
        prom.lines()
            .any(|l| l
                == "race_store_node_leases_ran_out_since_collection{store=\"s\",node=\"0\"} 1"),
        "{prom}"
    );
    let out = bounded_output(KV, &on(&["usage", "--format", "json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["nodes"][0]["record"]["ran_out_since_collection"], 1,
        "{json}"
    );

    // By the mark alone (far above what is unlinked), nothing is collected;
    // after a lease ran out, the node is.
    let high = ["maintain", "--once", "--collect-above-mib", "100000"];
    let out = bounded_output(KV, &on(&[&high[..], &["--mark-only"]].concat()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("node(s) collected: [],"), "{text}");
    let out = bounded_output(KV, &on(&high));
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"round 1: sweep, check, collect"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(", values not read, 0 problem(s), 0 tentative slot(s)")),
        "{text}"
    );
    // The table's one subtable, and the values, are on node 0; node 1
    // holds nothing unlinked and is left alone.
    assert!(
        lines.contains(
            &"round 1: collecting node 0: a lease ran out on it since its last collection"
        ),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("node 0: leases ended after ") && l.contains("took back")),
        "{text}"
    );
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("round 1: done in ") && last.contains("node(s) collected: [0],"),
        "{text}"
    );
    assert!(!last.ends_with(", 0 KiB taken back"), "{text}");
    // Each node rewrites its usage record within 100 ms of a change.
    let mut check = String::new();
    for _ in 0..50 {
        let out = bounded_output(KV, &on(&["check"]));
        check = String::from_utf8_lossy(&out.stdout).into_owned();
        if check.contains("store s: 0 KiB unlinked of ") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(check.contains("store s: 0 KiB unlinked of "), "{check}");
    assert!(
        check.lines().any(|l| l.starts_with("node 0: ")
            && l.ends_with("; no lease ran out since its last collection")),
        "{check}"
    );

    // The loop: a ready line, then rounds; SIGTERM between them ends it.
    let mut child = Proc(
        Command::new(KV)
            .args(on(&["maintain", "--every-s", "1"]))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let ready = out.next().unwrap().unwrap();
    assert!(
        ready.starts_with("ready: race-kv maintain: store s, a round every 1 s"),
        "{ready}"
    );
    let mut seen = Vec::new();
    for line in out.by_ref().map_while(Result::ok) {
        let done = line.starts_with("round 2: done in ");
        seen.push(line);
        if done {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.starts_with("round 2: done in ")),
        "{seen:#?}"
    );
    // Nothing unlinked reached the default mark, and no lease ran out
    // since the collection: nothing collected.
    assert!(
        seen.iter().all(|l| !l.starts_with("node 0: leases ended")),
        "{seen:#?}"
    );
    let (code, err) = child.terminate_with_stderr();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("maintain stopped by a signal after "), "{err}");

    let out = bounded_output(KV, &on(&["maintain", "--every-s", "0"]));
    assert_eq!(out.status.code(), Some(2));
    drop(node);
    drop((n1, n0));
    assert_eq!(meta_p.terminate(), Some(0));
}
