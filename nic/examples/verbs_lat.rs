//! Latency through the verbs provider on one device (loopback RC pair):
//! 64 B READ and 8 B CAS round trips (p50/p99, one signaled WR at a time,
//! busy polling, like perftest's `ib_read_lat` / `ib_atomic_lat`), and the
//! connect cost of an RC pair (create two QPs, bring both to RTS).
//!
//! ```text
//! cargo build --release -p krcore-nic --features verbs --example verbs_lat
//! ../shared/softroce/softroce-run -- target/release/examples/verbs_lat --iters 1000
//! ```
//!
//! Options: `--device NAME` (default `$KRCORE_TEST_DEVICE`, `$SOFTROCE_DEV`,
//! else `rxe0`), `--gid-index N` (default `$KRCORE_TEST_GID_INDEX`,
//! `$SOFTROCE_GID_INDEX`, else 1), `--iters N` (1000), `--pairs N` (20),
//! `--depth N` (send queue depth of the measured QP, 16).
//! Output: one `key=value` line per measurement, in microseconds.

use krcore_nic::conformance::Side;
use krcore_nic::verbs::VerbsNic;
use krcore_nic::{
    bring_up, Access, CompletionQueue, MemoryRegion, Nic, QpCaps, QpType, QueuePair, RcPeer,
    SendWr, Wc, WcStatus,
};
use std::time::{Duration, Instant};

struct Args {
    device: String,
    gid_index: u8,
    iters: usize,
    pairs: usize,
    depth: u32,
}

fn env_or(keys: &[&str], default: &str) -> String {
    keys.iter()
        .find_map(|k| std::env::var(k).ok())
        .unwrap_or_else(|| default.to_string())
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        device: env_or(&["KRCORE_TEST_DEVICE", "SOFTROCE_DEV"], "rxe0"),
        gid_index: env_or(&["KRCORE_TEST_GID_INDEX", "SOFTROCE_GID_INDEX"], "1")
            .parse()
            .map_err(|e| format!("GID index: {e}"))?,
        iters: 1000,
        pairs: 20,
        depth: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--device" => a.device = v()?,
            "--gid-index" => a.gid_index = v()?.parse().map_err(|e| format!("{k}: {e}"))?,
            "--iters" => a.iters = v()?.parse().map_err(|e| format!("{k}: {e}"))?,
            "--pairs" => a.pairs = v()?.parse().map_err(|e| format!("{k}: {e}"))?,
            "--depth" => a.depth = v()?.parse().map_err(|e| format!("{k}: {e}"))?,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.iters == 0 {
        return Err("--iters must be > 0".into());
    }
    Ok(a)
}

/// A cycle counter, as perftest uses (`get_cycles`): in an emulated guest
/// `clock_gettime` may leave the vDSO and cost more than the operation
/// being timed.
#[cfg(target_arch = "x86_64")]
fn cycles() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 CPU and has no side effects.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn cycles() -> u64 {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Cycles per microsecond, measured against the monotonic clock.
fn cycles_per_us() -> f64 {
    let (t0, c0) = (Instant::now(), cycles());
    std::thread::sleep(Duration::from_millis(200));
    let (dt, dc) = (t0.elapsed(), cycles() - c0);
    dc as f64 / (dt.as_secs_f64() * 1e6)
}

/// The "cpu MHz" of /proc/cpuinfo: what perftest divides cycles by.
fn cpuinfo_mhz() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// Posts `wr` and spins until its completion; returns the round trip in
/// cycles.
fn round_trip<Q: QueuePair, C: CompletionQueue>(qp: &Q, cq: &C, wr: SendWr) -> Result<u64, String> {
    let mut wc = [Wc::default()];
    let start = Instant::now();
    let c0 = cycles();
    qp.post_send(&[wr]).map_err(|e| e.to_string())?;
    let mut spins = 0u32;
    loop {
        match cq.poll(&mut wc) {
            Ok(1) => break,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.elapsed() > Duration::from_secs(10) {
            return Err("no completion within 10 s".into());
        }
    }
    let dt = cycles() - c0;
    if wc[0].status != WcStatus::Success {
        return Err(format!("completion {:?}", wc[0]));
    }
    Ok(dt)
}

/// p50 and p99 in microseconds.
fn percentiles(mut v: Vec<u64>, per_us: f64) -> (f64, f64) {
    v.sort_unstable();
    let at = |p: f64| {
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / per_us
    };
    (at(0.50), at(0.99))
}

fn measure(
    name: &str,
    iters: usize,
    per_us: f64,
    mut f: impl FnMut() -> Result<u64, String>,
) -> Result<(), String> {
    for _ in 0..iters.min(100) {
        f()?; // warm-up
    }
    let v = (0..iters).map(|_| f()).collect::<Result<Vec<_>, _>>()?;
    let (p50, p99) = percentiles(v, per_us);
    println!("{name}_p50_us={p50:.2} {name}_p99_us={p99:.2} iters={iters}");
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let nic = VerbsNic::open(&a.device, a.gid_index).map_err(|e| e.to_string())?;
    println!(
        "device={} gid_index={} path_mtu={} dc={}",
        nic.name(),
        a.gid_index,
        nic.path_mtu(),
        nic.caps().dc
    );
    // The target side on its own context (a second "node"), as perftest's
    // server is another process.
    let nic_b = VerbsNic::open(&a.device, a.gid_index).map_err(|e| e.to_string())?;
    let (sa, sb) = (Side::new(&nic, 4096), Side::new(&nic_b, 4096));
    let caps = QpCaps {
        max_send_wr: a.depth,
        max_recv_wr: 1,
        ..QpCaps::default()
    };
    let (qa, _qb) = krcore_nic::conformance::rc_pair(&sa, &sb, caps);
    let local = sa.mr.sge(0, 64).map_err(|e| e.to_string())?;
    let per_us = cycles_per_us();
    println!(
        "tsc_per_us_measured={per_us:.1} cpuinfo_mhz={}",
        cpuinfo_mhz().map_or("?".into(), |m| format!("{m:.1}"))
    );
    measure("read64", a.iters, per_us, || {
        round_trip(&qa, &sa.cq, SendWr::read(1, local, sb.mr.remote(0)))
    })?;
    let word = sa.mr.sge(64, 8).map_err(|e| e.to_string())?;
    let mut x = 0u64;
    measure("cas8", a.iters, per_us, || {
        let wr = SendWr::cas(2, word, sb.mr.remote(128), x, x + 1);
        x += 1;
        round_trip(&qa, &sa.cq, wr)
    })?;

    // Connect cost: create two RC QPs and bring both to RTS.
    let (mut total, mut create) = (Duration::ZERO, Duration::ZERO);
    let before = nic.counters().qps_created + nic_b.counters().qps_created;
    for _ in 0..a.pairs {
        let t0 = Instant::now();
        let q1 = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
        let q2 = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
        create += t0.elapsed();
        let peer = |q: &krcore_nic::verbs::VerbsQp| {
            Some(RcPeer {
                gid: nic.gid(),
                qpn: q.qpn(),
            })
        };
        // Both contexts are on the same device: the same GID.
        bring_up(&q1, Access::ALL, peer(&q2)).map_err(|e| e.to_string())?;
        bring_up(&q2, Access::ALL, peer(&q1)).map_err(|e| e.to_string())?;
        total += t0.elapsed();
    }
    let created = nic.counters().qps_created + nic_b.counters().qps_created - before;
    if a.pairs > 0 {
        let avg = |d: Duration| d.as_secs_f64() * 1e6 / a.pairs as f64;
        println!(
            "rc_pair_connect_avg_us={:.1} (create_qp x2 {:.1}, modify to RTS x2 {:.1}) pairs={} qps_created={}",
            avg(total),
            avg(create),
            avg(total - create),
            a.pairs,
            created
        );
    }
    Ok(())
}

fn main() {
    let code = match parse().and_then(|a| run(&a)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("verbs_lat: {e}");
            1
        }
    };
    std::process::exit(code);
}
