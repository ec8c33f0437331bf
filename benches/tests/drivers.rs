//! The driver binaries end to end: client processes on a /dev/shm fabric
//! (krcore-ycsb --processes 2), joins in both modes (krcore-elastic), and
//! a short soak (ignored by default: 30 s of kills; CI runs it).

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of `[SECTION], NAME, value` in the run phase's report.
fn field(report: &str, section: &str, name: &str) -> Option<f64> {
    phase_field(report, 1, section, name)
}

/// `field` of the load phase's report.
fn load_field(report: &str, section: &str, name: &str) -> Option<f64> {
    phase_field(report, 0, section, name)
}

/// `[section], name, value` in the report's phase `phase` (0: load, 1: run).
fn phase_field(report: &str, phase: usize, section: &str, name: &str) -> Option<f64> {
    let text = report.split("# run phase").nth(phase)?;
    text.lines()
        .find(|l| l.starts_with(&format!("[{section}], {name}, ")))
        .and_then(|l| l.rsplit(", ").next())
        .and_then(|v| v.parse().ok())
}

/// The run phase's operations as the workload counts them (a
/// read-modify-write is also one READ and one UPDATE).
fn operations(report: &str) -> f64 {
    let ops: f64 = ["READ", "UPDATE", "INSERT"]
        .iter()
        .filter_map(|s| field(report, s, "Operations"))
        .sum();
    ops - field(report, "READ-MODIFY-WRITE", "Operations").unwrap_or(0.0)
}

#[test]
fn ycsb_with_two_client_processes_runs_every_workload_but_e() {
    let bin = env!("CARGO_BIN_EXE_krcore-ycsb");
    for w in ["a", "b", "c", "d", "f"] {
        let (ok, out, err) = run(
            bin,
            &[
                "--processes",
                "2",
                "--workload",
                w,
                "--records",
                "300",
                "--operations",
                "600",
                "--node-mb",
                "32",
            ],
        );
        assert!(ok, "workload {w}: {err}\n{out}");
        assert!(out.contains("processes=2"), "{out}");
        assert_eq!(
            operations(&out),
            600.0,
            "workload {w}: both shares measured\n{out}"
        );
        assert!(field(&out, "OVERALL", "Throughput(ops/sec)").unwrap() > 0.0);
        assert!(!out.contains("Return=ERROR"), "{out}");
    }
}

#[test]
fn ycsb_batches_every_workload_but_e_in_one_and_two_processes() {
    let bin = env!("CARGO_BIN_EXE_krcore-ycsb");
    for (w, extra) in [
        ("a", &["--processes", "2", "--conflict", "retry"][..]),
        ("a", &["-batch", "5"][..]),
        ("b", &[][..]),
        ("c", &[][..]),
        ("d", &[][..]),
        ("f", &["--processes", "2"][..]),
    ] {
        let mut args = vec![
            "--workload",
            w,
            "--records",
            "300",
            "--operations",
            "600",
            "--node-mb",
            "32",
        ];
        if !extra.contains(&"-batch") {
            args.extend_from_slice(&["--batch", "16"]);
        }
        args.extend_from_slice(extra);
        let (ok, out, err) = run(bin, &args);
        assert!(ok, "workload {w} {extra:?}: {err}\n{out}");
        assert_eq!(
            operations(&out),
            600.0,
            "workload {w} {extra:?}: every operation\n{out}"
        );
        assert!(!out.contains("Return=ERROR"), "{out}");
        // Reads of loaded keys all find them.
        if let Some(reads) = field(&out, "READ", "Operations") {
            assert_eq!(field(&out, "READ", "Return=OK"), Some(reads), "{out}");
        }
    }
    let (ok, _, err) = run(bin, &["-p", "batch=0", "--records", "10"]);
    assert!(!ok && err.contains("batch must be at least 1"), "{err}");
}

/// Runs `bin args`, sends SIGTERM once the load phase has reported (and
/// the run phase had a moment), and returns the exit code, stdout and
/// stderr (bounded: 60 s in all).
fn terminated_in_the_run_phase(bin: &str, args: &[&str]) -> (Option<i32>, String, String) {
    use std::io::{BufRead, Read};
    use std::time::{Duration, Instant};
    let mut child = Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
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
    let bound = Duration::from_secs(60);
    let start = Instant::now();
    let mut out = String::new();
    loop {
        let line = rx
            .recv_timeout(bound.saturating_sub(start.elapsed()))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("no load phase report: {out}")
            });
        out.push_str(&line);
        out.push('\n');
        if line == "# load phase" {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            panic!("no exit within {bound:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        out.push_str(&line);
        out.push('\n');
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (code, out, err)
}

#[test]
fn ycsb_stops_its_phase_on_sigterm_in_one_and_two_processes() {
    let bin = env!("CARGO_BIN_EXE_krcore-ycsb");
    for procs in ["1", "2"] {
        let (code, out, err) = terminated_in_the_run_phase(
            bin,
            &[
                "--workload",
                "c",
                "--records",
                "500",
                "--operations",
                "1000000000",
                "--processes",
                procs,
            ],
        );
        // The run phase stopped (not killed): it reports what ran and the
        // program says so, with exit code 1.
        assert_eq!(code, Some(1), "{procs} process(es): {err}");
        assert!(
            field(&out, "READ", "Operations").is_some_and(|n| n > 0.0),
            "{procs} process(es): {out}"
        );
        assert!(
            err.contains("stopped before the end of the run phase"),
            "{procs} process(es): {err}"
        );
    }
}

#[test]
fn ycsb_refuses_fabrics_it_cannot_run() {
    let bin = env!("CARGO_BIN_EXE_krcore-ycsb");
    let (ok, _, err) = run(bin, &["--fabric", "verbs:mlx5_0", "--records", "10"]);
    assert!(!ok);
    assert!(err.contains("unsupported: verbs:mlx5_0"), "{err}");
    let (ok, _, err) = run(bin, &["--fabric", "sim:mem", "--processes", "2"]);
    assert!(!ok);
    assert!(err.contains("private to one process"), "{err}");
    let (ok, _, err) = run(bin, &["--fabric", "tcp:x"]);
    assert!(!ok);
    assert!(err.contains("bad fabric"), "{err}");
}

/// YCSB's conventions: `-P` the shipped core workload files (later files
/// and `-p` overriding), `-threads`, `-target`, `-s` status lines in
/// YCSB's format; bad properties are one-line usage errors (exit 2);
/// workload E is refused with its reason.
#[test]
fn ycsb_takes_property_files_overrides_and_ycsbs_flags() {
    let bin = env!("CARGO_BIN_EXE_krcore-ycsb");
    let file = |w: &str| format!("{}/../workloads/{w}", env!("CARGO_MANIFEST_DIR"));
    let (c, a) = (file("workloadc"), file("workloada"));
    // A then C: C's mix wins (read only); -p sets the sizes.
    let (ok, out, err) = run(
        bin,
        &[
            "-P",
            &a,
            "-P",
            &c,
            "-p",
            "recordcount=300",
            "-p",
            "operationcount=600",
            "-p",
            "status.interval=0.2",
            "-threads",
            "2",
            "-target",
            "100000",
            "-s",
            "--node-mb",
            "32",
        ],
    );
    assert!(
        ok,
        "{err}
{out}"
    );
    assert_eq!(field(&out, "READ", "Operations"), Some(600.0), "{out}");
    assert_eq!(
        field(&out, "UPDATE", "Operations"),
        None,
        "C reads only: {out}"
    );
    assert!(out.contains("threads=2"), "{out}");
    // The final status line of the run phase: YCSB's format.
    let last = err
        .lines()
        .rfind(|l| l.contains(" sec: ") && l.contains(" operations; "))
        .unwrap_or_else(|| panic!("no status line: {err}"));
    assert!(last.contains(" sec: 600 operations; "), "{last}");
    assert!(last.contains(" current ops/sec"), "{last}");
    // Without -P, the preset's properties take -p overrides too.
    let (ok, out, err) = run(
        bin,
        &[
            "--workload",
            "b",
            "-p",
            "recordcount=100",
            "-p",
            "operationcount=200",
            "-p",
            "threadcount=3",
            "--node-mb",
            "32",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("threads=3"), "{out}");
    // The store's restarted attempts per write type (race counts them).
    let retries = field(&out, "UPDATE", "Retries");
    assert!(retries.is_some(), "a Retries line for UPDATE: {out}");
    let ops: f64 = ["READ", "UPDATE"]
        .iter()
        .filter_map(|s| field(&out, s, "Operations"))
        .sum();
    assert_eq!(ops, 200.0, "{out}");
    // A loader of a share of the key space (YCSB's insertstart and
    // insertcount, for loaders that split a store's load): it loads its
    // share only and reads within it (uniform: YCSB's zipfian chooser
    // also reaches the key after the share, which another loader loads);
    // --records is recordcount.
    let of_100 = |props: &[&str]| {
        let mut args = vec!["-P", c.as_str(), "--records", "100", "--node-mb", "32"];
        for p in props {
            args.extend(["-p", p]);
        }
        run(bin, &args)
    };
    let (ok, out, err) = of_100(&[
        "insertstart=40",
        "insertcount=20",
        "requestdistribution=uniform",
        "operationcount=50",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("records=100 insertstart=40 insertcount=20 "),
        "{out}"
    );
    assert_eq!(
        load_field(&out, "INSERT", "Operations"),
        Some(20.0),
        "{out}"
    );
    assert_eq!(field(&out, "READ", "Return=OK"), Some(50.0), "{out}");
    // insertcount defaults to the rest of the key space.
    let (ok, out, err) = of_100(&["insertstart=70"]);
    assert!(ok, "{err}");
    assert_eq!(
        load_field(&out, "INSERT", "Operations"),
        Some(30.0),
        "{out}"
    );
    // Usage errors: one line, exit 2.
    for (args, says) in [
        (
            vec!["-P", c.as_str(), "-p", "recordcount=lots"],
            "recordcount",
        ),
        (vec!["-P", c.as_str(), "-p", "nonsense"], "nonsense"),
        (vec!["-P", "/no/such/workload"], "/no/such/workload"),
        (vec!["-P", c.as_str(), "-target", "-5"], "target"),
        (vec!["-P", c.as_str(), "-p", "threadcount=0"], "threads"),
        (
            vec![
                "-P",
                c.as_str(),
                "--records",
                "100",
                "-p",
                "insertstart=90",
                "-p",
                "insertcount=20",
            ],
            "exceeds recordcount (100)",
        ),
        (
            vec!["-P", c.as_str(), "-s", "--processes", "2"],
            "unsupported",
        ),
    ] {
        let out = Command::new(bin).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (ok, _, err) = run(bin, &["-P", &file("workloade")]);
    assert!(!ok);
    assert!(err.contains("scan"), "E is refused with its reason: {err}");
}

/// The deployed-store clients' `--config` files: a misspelt key is a usage
/// error (exit 2) naming it, on one line, before anything connects.
#[test]
fn deployed_clients_refuse_a_bad_config_file() {
    let dir = std::env::temp_dir().join(format!("krcore-drivers-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("client.toml");
    std::fs::write(&file, "[engine]\npool_size = 2\n[client]\nretrys = 3\n").unwrap();
    let file = file.to_str().unwrap();
    let common = [
        "--store",
        "s",
        "--fabric",
        "sim:krcore-no-such-fabric",
        "--config",
        file,
    ];
    for bin in [
        env!("CARGO_BIN_EXE_krcore-ycsb"),
        env!("CARGO_BIN_EXE_krcore-elastic"),
    ] {
        let out = Command::new(bin)
            .args(common)
            .args(["--meta", "127.0.0.1:9"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin}: {err}");
        assert!(err.contains("retrys"), "{bin}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bin}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn elastic_joins_in_both_modes_and_writes_json_and_png() {
    let bin = env!("CARGO_BIN_EXE_krcore-elastic");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("e.json");
    let png = dir.path().join("e.png");
    let (ok, out, err) = run(
        bin,
        &[
            "--memory-nodes",
            "2",
            "--compute-nodes",
            "2",
            "--duration",
            "1500ms",
            "--join-every",
            "200ms",
            "--records",
            "200",
            "--json",
            json.to_str().unwrap(),
            "--png",
            png.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}\n{out}");
    assert!(out.contains("krcore vs verbs"), "{out}");
    // The slowest join beside the median, in each mode, with its stage.
    assert_eq!(out.matches("slowest: join ").count(), 2, "{out}");
    assert!(out.contains("its longest stage "), "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, (mode, server_qps)) in runs.iter().zip([("Krcore", 0), ("Verbs", 2)]) {
        assert_eq!(r["mode"], mode);
        let joins = r["joins"].as_array().unwrap();
        assert_eq!(joins.len(), 2);
        for j in joins {
            assert_eq!(j["modeled"]["server_qps"], server_qps);
            let s = &j["stamps"];
            assert!(s["first_get"].as_u64().unwrap() >= s["spawn"].as_u64().unwrap());
            // Modeled control-path time under cx4: QPs were created.
            assert!(j["modeled"]["qps_created"].as_u64().unwrap() >= 1);
        }
        assert!(!r["timeline"].as_array().unwrap().is_empty());
    }
    // krcore mode's connect creates no QP per memory node (at most the
    // allocation RPC's UD QP); verbs mode creates one RC QP per memory node
    // on each side.
    let k = &runs[0]["joins"][0]["modeled"];
    let cx4_qp = 13_660_000u64;
    assert!(k["connect_ns"].as_u64().unwrap() < 2 * cx4_qp, "{k}");
    let vb = &runs[1]["joins"][0]["modeled"];
    assert!(vb["connect_ns"].as_u64().unwrap() >= 2 * cx4_qp, "{vb}");
    assert!(vb["server_ns"].as_u64().unwrap() >= 2 * cx4_qp, "{vb}");
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
}

/// Runs `krcore-soak` for 30 s with `args` (2,000 records, 256 MiB nodes)
/// and returns its JSON summary and its output; the run must succeed.
fn short_soak(args: &[&str]) -> (serde_json::Value, String) {
    let bin = env!("CARGO_BIN_EXE_krcore-soak");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let json_arg = json.to_str().unwrap();
    let mut all = vec!["--duration", "30s", "--records", "2000", "--node-mb", "256"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", json_arg]);
    let (ok, out, err) = run(bin, &all);
    assert!(ok, "{err}\n{out}");
    let v = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (v, out)
}

#[test]
#[ignore = "runs 30 s of client kills; `cargo test -p krcore-benches --test drivers -- --ignored`"]
fn short_soak_loses_nothing() {
    let (v, _) = short_soak(&["--kill-every", "2s"]);
    assert!(v["kills"].as_u64().unwrap() >= 8, "{v}");
    assert_eq!(v["verification"]["lost"], 0);
    assert_eq!(v["verification"]["wrong"], 0);
    assert!(v["writes_acked"].as_u64().unwrap() > 0);
    assert!(v["global_depth"].as_u64().unwrap() > 0, "the table resized");
}

#[test]
#[ignore = "runs 30 s of client kills; `cargo test -p krcore-benches --test drivers -- --ignored`"]
fn short_soak_through_the_daemon_loses_nothing() {
    // Attached clients, one killed every second: the run itself fails
    // unless the daemon released every killed process and no surviving
    // client's write failed.
    let (v, out) = short_soak(&["--host", "daemon", "--kill-every", "1s"]);
    assert!(
        out.contains("daemon              one for the whole run"),
        "{out}"
    );
    assert_eq!(v["host"], "Daemon");
    assert!(v["kills"].as_u64().unwrap() >= 15, "{v}");
    assert_eq!(v["verification"]["lost"], 0);
    assert_eq!(v["verification"]["wrong"], 0);
    assert_eq!(v["writes_failed"], 0);
    assert!(v["writes_acked"].as_u64().unwrap() > 0);
}
