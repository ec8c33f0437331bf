//! `krcore-soak`: YCSB A with resizing on the RACE store, client processes
//! SIGKILLed at random and respawned, then the whole table verified against
//! the log of acknowledged writes (issue 8, item 4).
//!
//! ```text
//! krcore-soak [--duration 10m] [--processes 3] [--threads 1] [--records 5000]
//!             [--kill-every 3s] [--memory-nodes 2] [--groups 4] [--value-size 64]
//!             [--read-proportion 0.5] [--insert-proportion 0.05] [--grant-lease 2s]
//!             [--json PATH]
//! ```
//!
//! The driver hosts a meta server and memory nodes on a fresh `/dev/shm`
//! fabric, formats a tiny table (one subtable of `--groups` bucket groups,
//! so it keeps splitting), loads `--records` keys, then runs `--processes`
//! client processes. Each client thread reads (zipfian over the loaded
//! keys), updates (same keys, racing with every other process) and inserts
//! new keys (its own), and logs every write it issues and every
//! acknowledgement (see `krcore_benches::soak`). Every `--kill-every`
//! (randomized 0.5x..1.5x) the driver SIGKILLs one client process and starts
//! a new one. At the end it kills the rest, finishes any split a dead client
//! left, checks the table's invariants, and checks every key ever written
//! against the logs. Exit status 0 only if nothing was lost or wrong.
//!
//! `--host daemon`: the driver also runs the node daemon (`krcored`'s
//! engine, in its own process) and every client thread attaches to it
//! instead of opening an engine: the kills are then of attached processes,
//! which the daemon must release without any effect on the others (the run
//! also fails if a surviving client's write fails, or if the daemon did
//! not release every killed process).

use clap::Parser;
use krcore_benches::cluster::{fresh_fabric_dir, ClusterHost, ClusterOptions, Remote};
use krcore_benches::proc::{epoch_us, ChildProc};
use krcore_benches::soak::{
    self, decode_value, encode_value, key_name, log_path, parse_log, Verification, WriteRec,
    WriterLog,
};
use krcore_benches::ycsb::ScrambledZipfianGenerator;
use krcore_nic::sim::{SimConfig, SimFabric};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::{NodeStats, TableConfig};
use race_store::ClientConfig;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// Soak test: YCSB A with resizing and random client kills, verified.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// How long clients run (e.g. 20s, 10m).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Client processes alive at any time.
    #[arg(long, default_value_t = 3)]
    processes: usize,
    /// Client threads per process (each a compute node).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Keys loaded before the clients start.
    #[arg(long, default_value_t = 5000)]
    records: u64,
    /// Mean time between kills (each wait is 0.5x..1.5x of it).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    kill_every: Duration,
    /// Memory nodes.
    #[arg(long, default_value_t = 2)]
    memory_nodes: u8,
    /// Megabytes of each memory node's region (allocated lazily).
    #[arg(long, default_value_t = 1024)]
    node_mb: u64,
    /// Bucket groups per subtable (tiny: the table keeps splitting).
    #[arg(long, default_value_t = 4)]
    groups: u32,
    /// Value bytes (at least 32).
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Share of reads; updates get the rest but the inserts.
    #[arg(long, default_value_t = 0.5)]
    read_proportion: f64,
    /// Share of inserts of new keys (what keeps the table resizing).
    #[arg(long, default_value_t = 0.05)]
    insert_proportion: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 0x50a4)]
    seed: u64,
    /// Where the clients' engine is: one per client thread (`process`), or
    /// the node daemon's, every client attached to it (`daemon`).
    #[arg(long, value_enum, default_value_t = SoakHost::Process)]
    host: SoakHost,
    /// A client's lease on the memory nodes' grants: the nodes take back
    /// what a killed client never wrote this long after its last request
    /// (the report waits for it after the last kill, unless it is over a
    /// minute: a long lease is a baseline that takes nothing back).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    grant_lease: Duration,
    /// Write the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run as a client process.
    #[arg(long, hide = true)]
    child_spec: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The soak's client configuration: leases and grace periods with margins
/// wide enough for a loaded 2-core machine (stalls of a second or more).
fn client_config() -> ClientConfig {
    ClientConfig {
        lease_ticks: 3_000_000,
        max_op_ticks: 100_000,
        grace_ticks: 3_000_000,
        ..ClientConfig::default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
enum SoakHost {
    /// An engine per client thread.
    Process,
    /// The node daemon's engine, clients attached.
    Daemon,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildSpec {
    /// The daemon's socket (`--host daemon`).
    #[serde(default)]
    daemon: Option<PathBuf>,
    fabric: PathBuf,
    memory_nodes: u8,
    log_dir: PathBuf,
    incarnation: u64,
    threads: usize,
    records: u64,
    value_size: usize,
    read_proportion: f64,
    insert_proportion: f64,
    seed: u64,
}

/// Writer ids: `incarnation * WIDS + thread`; incarnation 0 is the loader.
const WIDS: u64 = 64;

/// Inserted key numbers: `(wid + 1) << 32 | n`, disjoint from the loaded
/// keys and from every other writer's.
fn insert_keynum(wid: u64, n: u64) -> u64 {
    ((wid + 1) << 32) | n
}

fn child_thread(spec: &ChildSpec, remote: &Remote, thread: usize) -> Result<(), String> {
    let wid = spec.incarnation * WIDS + thread as u64;
    let mut log = WriterLog::open(&spec.log_dir, wid).map_err(|e| e.to_string())?;
    let mut client = match &spec.daemon {
        Some(socket) => {
            let node = krcore::Node::attach(socket).map_err(|e| e.to_string())?;
            remote.race_client_on(&node, client_config())
        }
        None => remote.race_client(&SimConfig::default(), client_config()),
    }
    .map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(spec.seed ^ wid.wrapping_mul(0x9e37_79b9));
    let mut zipf =
        ScrambledZipfianGenerator::new(0, spec.records.max(1) - 1).map_err(|e| e.to_string())?;
    let (mut seq, mut inserted, mut reads_ok, mut reads_bad) = (0u64, 0u64, 0u64, 0u64);
    let io = |e: std::io::Error| e.to_string();
    loop {
        let p: f64 = rng.gen();
        if p < spec.read_proportion {
            let k = zipf.next_value(&mut rng);
            match client.get(key_name(k).as_bytes()) {
                Ok(Some(v)) => match decode_value(k, &v) {
                    Ok(_) => reads_ok += 1,
                    Err(e) => {
                        reads_bad += 1;
                        log.bad_read(k, &e.to_string()).map_err(io)?;
                    }
                },
                Ok(None) => {
                    reads_bad += 1;
                    log.bad_read(k, "loaded key absent").map_err(io)?;
                }
                // A transport failure is not a wrong value; counted apart.
                Err(_) => {}
            }
            if (reads_ok + reads_bad) % 256 == 0 {
                log.reads(reads_ok, reads_bad).map_err(io)?;
            }
            continue;
        }
        let insert = p >= 1.0 - spec.insert_proportion;
        let k = if insert {
            inserted += 1;
            insert_keynum(wid, inserted)
        } else {
            zipf.next_value(&mut rng)
        };
        seq += 1;
        let value = encode_value(k, wid, seq, spec.value_size);
        log.intent(seq, k, epoch_us()).map_err(io)?;
        let r = if insert {
            client.put(key_name(k).as_bytes(), &value)
        } else {
            client.update(key_name(k).as_bytes(), &value)
        };
        match r {
            Ok(()) => log.ack(seq, epoch_us()).map_err(io)?,
            Err(_) => log.error(seq).map_err(io)?,
        }
    }
}

fn child_main(spec: &ChildSpec) -> Result<(), String> {
    // The driver holds our stdin; when it goes away, so do we.
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        std::process::exit(3);
    });
    let remote = Remote::discover(&spec.fabric, spec.memory_nodes).map_err(|e| e.to_string())?;
    let handles: Vec<_> = (0..spec.threads.max(1))
        .map(|t| {
            let (spec, remote) = (spec.clone(), remote.clone());
            std::thread::spawn(move || child_thread(&spec, &remote, t))
        })
        .collect();
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => return Err("a client thread panicked".into()),
        }
    }
    Ok(())
}

struct Running {
    proc: ChildProc,
    incarnation: u64,
}

fn spawn(exe: &Path, spec: &ChildSpec) -> Result<ChildProc, String> {
    let mut cmd = Command::new(exe);
    cmd.arg("--child-spec")
        .arg(serde_json::to_string(spec).map_err(|e| e.to_string())?);
    ChildProc::spawn(cmd).map_err(|e| e.to_string())
}

#[derive(Debug, Serialize)]
struct Summary {
    host: SoakHost,
    duration_s: f64,
    processes: usize,
    threads: usize,
    records: u64,
    kills: u64,
    unexpected_exits: u64,
    incarnations: u64,
    writes_issued: u64,
    writes_acked: u64,
    writes_failed: u64,
    reads_ok: u64,
    reads_bad: u64,
    torn_log_lines: u64,
    global_depth: u8,
    subtables: usize,
    table_keys: usize,
    table_problems: Vec<String>,
    phantom_keys: u64,
    duplicates: usize,
    verification: Verification,
    memory: SoakMemory,
}

/// The memory nodes' heap at the end, once the killed clients' leases
/// ended (bytes, summed over the nodes).
#[derive(Debug, Default, Serialize)]
struct SoakMemory {
    /// Heap handed out since the start (table and blocks).
    heap_used: u64,
    /// Of it, blocks back in the nodes' pools.
    pooled: u64,
    /// Blocks taken back from clients whose grant lease ended.
    reclaimed: u64,
    /// Clients whose lease ended.
    ended: u64,
    /// Clients with a live lease (the checker).
    holders: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(spec) = &args.child_spec {
        let r = serde_json::from_str::<ChildSpec>(spec)
            .map_err(|e| e.to_string())
            .and_then(|s| child_main(&s));
        if let Err(e) = r {
            eprintln!("krcore-soak client: {e}");
        }
        return ExitCode::FAILURE;
    }
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("krcore-soak: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<bool, String> {
    if args.processes == 0 || args.threads == 0 || args.threads as u64 >= WIDS {
        return Err(format!("--processes >= 1 and 1 <= --threads < {WIDS}"));
    }
    if args.records == 0 {
        return Err("--records must be at least 1".into());
    }
    let geometry = SubtableGeometry::new(args.groups).map_err(|e| e.to_string())?;
    let tmp = fresh_fabric_dir("krcore-soak-").map_err(|e| e.to_string())?;
    let fabric_dir = tmp.path().join("fabric");
    let log_dir = tmp.path().join("logs");
    std::fs::create_dir(&log_dir).map_err(|e| e.to_string())?;
    let fabric = SimFabric::open_dir(&fabric_dir, true).map_err(|e| e.to_string())?;
    let opts = ClusterOptions {
        memory_nodes: args.memory_nodes.max(1),
        node_bytes: args.node_mb << 20,
        table: TableConfig {
            geometry,
            initial_global_depth: 0,
            max_global_depth: 16,
        },
        sim: SimConfig::default(),
    };
    let host = ClusterHost::start(fabric.clone(), &opts, None).map_err(|e| e.to_string())?;
    host.set_grant_lease(args.grant_lease);
    let remote = host.remote().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!(
        "krcore-soak: fabric {} ({} memory nodes, subtables of {} groups), loading {} keys",
        fabric_dir.display(),
        opts.memory_nodes,
        args.groups,
        args.records
    );

    // Load: writer 0, sequence 0, acknowledged at the end of the load.
    let mut loader = remote
        .race_client(&SimConfig::default(), client_config())
        .map_err(|e| e.to_string())?;
    for k in 0..args.records {
        loader
            .put(
                key_name(k).as_bytes(),
                &encode_value(k, 0, 0, args.value_size),
            )
            .map_err(|e| format!("load key {k}: {e}"))?;
    }
    let load_end = epoch_us();
    let mut writes: Vec<WriteRec> = (0..args.records)
        .map(|k| WriteRec {
            wid: 0,
            seq: 0,
            keynum: k,
            invoke_us: 0,
            ack_us: Some(load_end),
            failed: false,
        })
        .collect();

    let daemon = match args.host {
        SoakHost::Process => None,
        SoakHost::Daemon => Some(start_daemon(&fabric, &remote, tmp.path())?),
    };
    let spec_of = |incarnation: u64| ChildSpec {
        daemon: daemon.as_ref().map(|d| d.socket.clone()),
        fabric: fabric_dir.clone(),
        memory_nodes: opts.memory_nodes,
        log_dir: log_dir.clone(),
        incarnation,
        threads: args.threads,
        records: args.records,
        value_size: args.value_size,
        read_proportion: args.read_proportion,
        insert_proportion: args.insert_proportion,
        seed: args.seed,
    };
    let mut deaths: HashMap<u64, u64> = HashMap::new();
    let mut next_inc = 1u64;
    let mut running = Vec::new();
    for _ in 0..args.processes {
        running.push(Running {
            proc: spawn(&exe, &spec_of(next_inc))?,
            incarnation: next_inc,
        });
        next_inc += 1;
    }
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let (mut kills, mut unexpected) = (0u64, 0u64);
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut next_kill = start + args.kill_every.mul_f64(rng.gen_range(0.5..1.5));
    while start.elapsed() < args.duration {
        std::thread::sleep(Duration::from_millis(50));
        // Children that died on their own are respawned (and counted).
        for r in &mut running {
            if r.proc.has_exited() {
                unexpected += 1;
                deaths.insert(r.incarnation, r.proc.kill());
                eprintln!(
                    "krcore-soak: client incarnation {} exited by itself",
                    r.incarnation
                );
                *r = Running {
                    proc: spawn(&exe, &spec_of(next_inc))?,
                    incarnation: next_inc,
                };
                next_inc += 1;
            }
        }
        if Instant::now() >= next_kill {
            let i = rng.gen_range(0..running.len());
            let r = &mut running[i];
            deaths.insert(r.incarnation, r.proc.kill());
            kills += 1;
            *r = Running {
                proc: spawn(&exe, &spec_of(next_inc))?,
                incarnation: next_inc,
            };
            next_inc += 1;
            fabric.reap_dead();
            next_kill = Instant::now() + args.kill_every.mul_f64(rng.gen_range(0.5..1.5));
        }
        if last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            eprintln!(
                "krcore-soak: {:.0}s, {kills} kills, {} incarnations",
                start.elapsed().as_secs_f64(),
                next_inc - 1
            );
        }
    }
    for r in &mut running {
        deaths.insert(r.incarnation, r.proc.kill());
    }
    let elapsed = start.elapsed();
    let stopped_at = Instant::now();
    eprintln!("krcore-soak: clients stopped after {elapsed:?}; {kills} kills; verifying");

    // Logs.
    let (mut reads_ok, mut reads_bad, mut torn) = (0, 0, 0);
    let mut bad_read_lines = Vec::new();
    for inc in 1..next_inc {
        for t in 0..args.threads as u64 {
            let wid = inc * WIDS + t;
            let Ok(text) = std::fs::read_to_string(log_path(&log_dir, wid)) else {
                continue; // killed before it opened its log
            };
            let p = parse_log(wid, &text);
            writes.extend(p.writes);
            reads_ok += p.reads_ok;
            reads_bad += p.reads_bad;
            torn += p.torn_lines;
            bad_read_lines.extend(p.bad_reads);
        }
    }

    // Finish any split a dead client left (its lease must expire first).
    let mut checker = remote
        .race_client(&SimConfig::default(), client_config())
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match checker.recover_resize() {
            Ok(true) => break,
            Ok(false) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Ok(false) => {
                return Err("the resize lock is still held 30 s after the last kill".into())
            }
            Err(e) => return Err(format!("recover_resize: {e}")),
        }
    }
    let check = checker
        .check_table()
        .map_err(|e| format!("check_table: {e}"))?;
    let table: HashMap<Vec<u8>, Vec<u8>> = check.pairs.iter().cloned().collect();
    // The last processes' leases end a lease after their last request
    // (not waited for past a minute: such a lease is a baseline without
    // taking back).
    if args.grant_lease <= Duration::from_secs(60) {
        let lease_end = stopped_at + args.grant_lease + args.grant_lease / 2;
        std::thread::sleep(lease_end.saturating_duration_since(Instant::now()));
    }
    let memory =
        host.node_stats()
            .iter()
            .fold(SoakMemory::default(), |m: SoakMemory, s: &NodeStats| {
                // Reclaim runs on the nodes' upkeep threads; what the stats
                // say now is at most an eighth of a lease behind.
                SoakMemory {
                    heap_used: m.heap_used + s.heap_used,
                    pooled: m.pooled + s.pool.pooled,
                    reclaimed: m.reclaimed + s.holders.reclaimed,
                    ended: m.ended + s.holders.ended,
                    holders: m.holders + s.holders.holders,
                }
            });
    let written: std::collections::HashSet<Vec<u8>> = writes
        .iter()
        .map(|w| key_name(w.keynum).into_bytes())
        .collect();
    let phantom = table.keys().filter(|k| !written.contains(*k)).count() as u64;
    let end_of = |wid: u64| deaths.get(&(wid / WIDS)).copied().unwrap_or(u64::MAX);
    let mut get_mismatch = 0u64;
    let verification = soak::verify(&writes, end_of, |k| {
        let name = key_name(k).into_bytes();
        let got = checker.get(&name).map_err(|e| e.to_string())?;
        if got.as_ref() != table.get(&name) {
            get_mismatch += 1;
        }
        Ok(got)
    });
    let summary = Summary {
        host: args.host,
        duration_s: elapsed.as_secs_f64(),
        processes: args.processes,
        threads: args.threads,
        records: args.records,
        kills,
        unexpected_exits: unexpected,
        incarnations: next_inc - 1,
        writes_issued: verification.writes - args.records,
        writes_acked: verification.acked - args.records,
        writes_failed: verification.failed,
        reads_ok,
        reads_bad,
        torn_log_lines: torn,
        global_depth: check.global_depth,
        subtables: check.subtables,
        table_keys: table.len(),
        table_problems: check.problems.clone(),
        phantom_keys: phantom,
        duplicates: check.duplicates,
        verification,
        memory,
    };
    let v = &summary.verification;
    krcore_cli::outln!("# krcore-soak: YCSB A ({:.0}% reads, {:.0}% inserts), {} processes x {} threads, kills every ~{:?}",
        args.read_proportion * 100.0, args.insert_proportion * 100.0, args.processes, args.threads, args.kill_every);
    krcore_cli::outln!("duration            {:.1} s", summary.duration_s);
    krcore_cli::outln!(
        "kills               {} (SIGKILL), unexpected exits {}, incarnations {}",
        kills,
        unexpected,
        summary.incarnations
    );
    krcore_cli::outln!("operations          {} writes issued ({} acknowledged, {} failed), {} reads verified ({} bad)",
        summary.writes_issued, summary.writes_acked, summary.writes_failed, reads_ok, reads_bad);
    krcore_cli::outln!("table               global depth {}, {} subtables, {} keys, {} duplicates, {} phantom keys, {} problems",
        check.global_depth, check.subtables, table.len(), check.duplicates, phantom, check.problems.len());
    krcore_cli::outln!("verification        {} keys, {} writes ({} acked, {} unacked), final value unacked on {} keys",
        v.keys, v.writes, v.acked, v.unacked, v.final_unacked);
    let mut daemon_ok = true;
    if let Some(d) = &daemon {
        // The last processes' sockets close as they die: their release
        // follows within moments.
        let until = Instant::now() + Duration::from_secs(10);
        while d.daemon.stats().clients > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let st = d.daemon.stats();
        // Every incarnation attached once per thread; each killed one (and
        // the ones stopped at the end) was released.
        let attached_want = (next_inc - 1) * args.threads as u64;
        daemon_ok = st.clients == 0 && st.detached == st.attached && summary.writes_failed == 0;
        krcore_cli::outln!(
            "daemon              one for the whole run: {} attachments ({} expected at most), {} released, {} attached now, {} VQPs and {} bytes held now",
            st.attached, attached_want, st.detached, st.clients, st.vqps, st.mr_bytes
        );
        krcore_cli::outln!(
            "                    {} doorbells, {} WRs, {} refused doorbells, {} refused requests",
            st.doorbells,
            st.wrs,
            st.refused_doorbells,
            st.refused_requests
        );
    }
    let m = &summary.memory;
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    krcore_cli::outln!(
        "memory              heap handed out {:.1} MiB, {:.1} MiB of it pooled; {:.1} MiB taken back from {} clients whose grant lease ({:?}) ended, {} leases live",
        mib(m.heap_used), mib(m.pooled), mib(m.reclaimed), m.ended, args.grant_lease, m.holders
    );
    krcore_cli::outln!("lost acked writes   {}", v.lost);
    krcore_cli::outln!("wrong values        {}", v.wrong);
    krcore_cli::outln!("get vs table scan   {get_mismatch} mismatches");
    for e in v
        .examples
        .iter()
        .chain(&check.problems)
        .chain(bad_read_lines.iter().take(10))
    {
        krcore_cli::outln!("  ! {e}");
    }
    if let Some(p) = &args.json {
        let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        std::fs::write(p, json).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    drop(daemon);
    drop(host);
    Ok(v.ok()
        && reads_bad == 0
        && phantom == 0
        && get_mismatch == 0
        && check.problems.is_empty()
        && daemon_ok)
}

/// The node daemon of `--host daemon`: a node of its own on the fabric
/// (registered, its pool made at start, as `krcored`) serving a socket in
/// `dir`.
struct SoakDaemon {
    daemon: krcore_kmod::daemon::Daemon<krcore_nic::AnyNic>,
    _node: krcore::Node,
    socket: PathBuf,
}

fn start_daemon(fabric: &SimFabric, remote: &Remote, dir: &Path) -> Result<SoakDaemon, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut cfg = krcore::EngineConfig::default().with_eager_start(true);
    cfg.prestart = cfg.pool_size;
    let node = krcore::Node::builder()
        .sim_fabric(fabric)
        .config(cfg)
        .meta(remote.meta)
        .register(true)
        .build()
        .map_err(|x| e(&x))?;
    let socket = dir.join("krcored.sock");
    let engine = node.engine().map_err(|x| e(&x))?.clone();
    let daemon = krcore_kmod::daemon::Daemon::start(
        engine,
        &socket,
        krcore_kmod::daemon::DaemonConfig::default(),
    )
    .map_err(|x| e(&x))?;
    Ok(SoakDaemon {
        daemon,
        _node: node,
        socket,
    })
}
