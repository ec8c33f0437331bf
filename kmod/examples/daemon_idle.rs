//! What the node daemon's idle policy costs, in latency and in CPU.
//!
//! ```text
//! daemon_idle [ITERS]        # default 2000 (fewer for the longest pauses)
//! ```
//!
//! The daemon's data thread spins over the rings while there is work, and
//! for `DaemonConfig::idle_spin` after the last (krcored `--idle-us`,
//! default 200 us); then it raises an idle flag in each process's page and
//! sleeps on an eventfd, which the next process to post writes (one system
//! call, then the thread's wake-up). An attached process that waits for
//! the daemon spins for 50 us, then sleeps on its ring's futex.
//!
//! For each idle policy (the daemon sleeps at once: `idle_spin` 0; the
//! default 200 us; never: 10 s) and each pause between requests (none,
//! 100 us, 1 ms, 10 ms), one attached process posts synchronous 64-byte
//! READs (post, then wait for the completion) to a memory node, pausing
//! between them, on `sim:mem` without a latency model (measured software
//! time). Printed: the READ's latency (p50, p99) and the CPU the daemon's
//! data thread used over the run, in percent of one core (from
//! `/proc/self/task/*/schedstat`), and the requesting thread's own CPU
//! beside it. Both run in this process, on the machine's cores.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use krcore_kmod::daemon::{Attached, Daemon, DaemonConfig};
use krcore_kmod::{Engine, EngineConfig, MetaLocation, OwnedMr, RemoteGrant};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, MemoryRegion, RemoteAddr, SendWr};

fn main() {
    if let Err(e) = run() {
        eprintln!("daemon_idle: {e}");
        std::process::exit(1);
    }
}

/// Nanoseconds on a CPU of the thread of this process named `name` (the
/// newest such thread), from `/proc/self/task/*/schedstat`.
fn thread_cpu_ns(name: &str) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir: PathBuf = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let tid: u64 = t.file_name().to_string_lossy().parse().unwrap_or(0);
        let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
        let ns = stat.split_whitespace().next()?.parse().ok()?;
        if best.is_none_or(|(b, _)| tid > b) {
            best = Some((tid, ns));
        }
    }
    best.map(|(_, ns)| ns)
}

/// This thread's nanoseconds on a CPU.
fn own_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Cluster {
    _meta: LocalMetaHost<SimNic>,
    server: Engine<SimNic>,
    region: OwnedMr<SimNic>,
    fabric: SimFabric,
    location: MetaLocation,
}

fn cluster() -> Result<Cluster, String> {
    let fabric = SimFabric::in_memory();
    let node = SimNic::open(&fabric, SimConfig::default()).map_err(|e| e.to_string())?;
    let mut meta = LocalMetaHost::start(node, MetaConfig::default()).map_err(|e| e.to_string())?;
    let location = MetaLocation::from_bootstrap(&meta.bootstrap()).map_err(|e| e.to_string())?;
    let nic = SimNic::open(&fabric, SimConfig::default()).map_err(|e| e.to_string())?;
    let server = Engine::start(nic, EngineConfig::default().with_meta(location))
        .map_err(|e| e.to_string())?;
    let target = server.local_target().map_err(|e| e.to_string())?;
    meta.table_mut()
        .register(target, 0, 1 << 40, 0)
        .map_err(|e| e.to_string())?;
    let region = server
        .alloc_mr(1 << 16, Access::ALL)
        .map_err(|e| e.to_string())?;
    Ok(Cluster {
        _meta: meta,
        server,
        region,
        fabric,
        location,
    })
}

struct Row {
    p50_us: f64,
    p99_us: f64,
    daemon_cpu: f64,
    own_cpu: f64,
    sleeps: u64,
}

fn measure(c: &Cluster, idle_spin: Duration, pause: Duration, iters: usize) -> Result<Row, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("krcored.sock");
    let nic = SimNic::open(&c.fabric, SimConfig::default()).map_err(|e| e.to_string())?;
    let cfg = EngineConfig::default().with_meta(c.location);
    let engine = Engine::start(nic, cfg).map_err(|e| e.to_string())?;
    let daemon = Daemon::start(
        engine,
        &path,
        DaemonConfig {
            idle_spin,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let a = Attached::attach(&path).map_err(|e| e.to_string())?;
    let buf = a
        .alloc(4096, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let v = a.create_vqp().map_err(|e| e.to_string())?;
    v.connect(c.server.gid()).map_err(|e| e.to_string())?;
    let grant = RemoteGrant {
        addr: c.region.addr(),
        len: 1 << 16,
        access: Access::ALL,
        expires_at: None,
    };
    v.add_grant(c.server.gid(), c.region.rkey(), grant)
        .map_err(|e| e.to_string())?;
    let wr = [SendWr::read(
        1,
        buf.sge(0, 64).map_err(|e| e.to_string())?,
        RemoteAddr {
            addr: c.region.addr(),
            rkey: c.region.rkey(),
        },
    )];
    let read = || -> Result<Duration, String> {
        let t0 = Instant::now();
        v.post(&wr).map_err(|e| e.to_string())?;
        v.wait(1, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        Ok(t0.elapsed())
    };
    for _ in 0..100 {
        read()?;
    }
    let sleeps0 = daemon.stats().sleeps;
    let d0 = thread_cpu_ns("krcored-data").unwrap_or(0);
    let o0 = own_cpu_ns();
    let w0 = Instant::now();
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        lat.push(read()?);
    }
    let wall = w0.elapsed().as_nanos() as f64;
    let d1 = thread_cpu_ns("krcored-data").unwrap_or(0);
    let o1 = own_cpu_ns();
    lat.sort();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_nanos() as f64 / 1e3;
    let row = Row {
        p50_us: at(0.5),
        p99_us: at(0.99),
        daemon_cpu: 100.0 * d1.saturating_sub(d0) as f64 / wall,
        own_cpu: 100.0 * o1.saturating_sub(o0) as f64 / wall,
        sleeps: daemon.stats().sleeps - sleeps0,
    };
    drop(v);
    drop(buf);
    drop(a);
    daemon.shutdown();
    Ok(row)
}

fn run() -> Result<(), String> {
    let iters: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|_| format!("ITERS: not a number: {s}"))?,
        None => 2000,
    };
    let c = cluster()?;
    let policies = [
        ("sleeps at once (0)", Duration::ZERO),
        ("default (200 us)", Duration::from_micros(200)),
        ("never sleeps (10 s)", Duration::from_secs(10)),
    ];
    let pauses = [
        Duration::ZERO,
        Duration::from_micros(100),
        Duration::from_millis(1),
        Duration::from_millis(10),
    ];
    println!("# sync 64 B READ through the node daemon, sim:mem, measured software time");
    println!(
        "{:<22} {:>8} {:>9} {:>9} {:>11} {:>10} {:>8}",
        "idle policy", "pause", "p50_us", "p99_us", "daemon_cpu%", "own_cpu%", "sleeps"
    );
    for (name, spin) in policies {
        for pause in pauses {
            // Long pauses: fewer requests (the run's length is the pause's).
            let n = if pause >= Duration::from_millis(10) {
                (iters / 10).max(50)
            } else {
                iters
            };
            let r = measure(&c, spin, pause, n)?;
            println!(
                "{:<22} {:>8} {:>9.2} {:>9.2} {:>11.1} {:>10.1} {:>8}",
                name,
                format!("{pause:?}"),
                r.p50_us,
                r.p99_us,
                r.daemon_cpu,
                r.own_cpu,
                r.sleeps
            );
        }
    }
    Ok(())
}
