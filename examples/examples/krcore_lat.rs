//! `krcore_lat`: one-process, side-by-side latency and connect cost on a
//! verbs device, against perftest.
//!
//! Measures, in interleaved rounds (so that load drifts hit every contender
//! alike):
//!
//! - 64 B RDMA READ and 8 B CAS round trips through
//!   - perftest (`ib_read_lat -s 64 -C`, `ib_atomic_lat -A CMP_AND_SWAP -C`,
//!     server and client spawned by this tool, when they are on `PATH`),
//!   - the `verbs` provider (`krcore_nic::verbs`, a loopback RC pair),
//!   - the SDK's VQP (`krcore::Vqp`, verbs level `post`/`poll`, and the
//!     request level `read(..).wait()`), in RC fallback mode on a device
//!     without DC;
//! - the connect cost: a plain RC pair (create two QPs, exchange QPNs in
//!   process, modify both to RTS) vs. the SDK's first connect to a target
//!   (meta READ + handshake over UD + both QPs) vs. a second connect to the
//!   same target (DCCache and RC pair cached).
//!
//! Every latency contender is timed exactly like perftest's `run_iter_lat`:
//! a cycle stamp before each post, one signaled WR at a time, busy polling
//! one completion; the samples are the differences of consecutive stamps
//! (post to post), sorted, the 2 largest dropped, `t_typical` the median
//! (perftest's `get_median`) and `99%` the sample at `ceil(0.99 n)`.
//! perftest runs with `-C` (cycles), so both sides are in the same unit;
//! microseconds divide by /proc/cpuinfo's "cpu MHz", as perftest does.
//!
//! ```text
//! cargo build --release -p krcore-examples --features verbs --example krcore_lat
//! ../shared/softroce/softroce-run -- target/release/examples/krcore_lat
//! ```
//!
//! Options: `--device NAME` (default `$KRCORE_TEST_DEVICE`, `$SOFTROCE_DEV`,
//! else `rxe0`), `--gid-index N` (`$KRCORE_TEST_GID_INDEX`,
//! `$SOFTROCE_GID_INDEX`, else 1), `--ip ADDR` (where perftest's client
//! connects: `$SOFTROCE_IP`, else 127.0.0.1), `--iters N` (1000 per round
//! and contender), `--rounds N` (6), `--pairs N` (connect samples, 8),
//! `--no-perftest`, `--no-sdk`, `--idle-sleep-us N` (idle sleep of the
//! background threads of the latency phase's SDK nodes: meta host and
//! handshake responders; default 20,000 us, where the engine's is 100 us).
//! They serve connects only; on a small emulated guest their wake-ups every
//! 100 us load every contender, perftest included: with the engine's
//! default, perftest's own 64 B READ p50 rose from about 145 us to about
//! 580 us in a 2-vCPU Soft-RoCE guest. Pass `--idle-sleep-us 100` to measure
//! with the engine's default. The connect phase always uses the engine's
//! default).
//!
//! Output: `key=value` lines; the `summary` lines give, per operation, each
//! contender's median over rounds of its p50 and p99, and the median over
//! rounds of the paired ratio contender/perftest. The tool fails (exit 1)
//! when an operation fails; it never judges the figures.

#[cfg(feature = "verbs")]
fn main() {
    let code = match lat::parse().and_then(|a| lat::run(&a)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("krcore_lat: {e}");
            1
        }
    };
    std::process::exit(code);
}

#[cfg(not(feature = "verbs"))]
fn main() {
    eprintln!("krcore_lat needs the `verbs` feature (--features verbs)");
    std::process::exit(2);
}

#[cfg(feature = "verbs")]
mod lat {
    use krcore::{Access, Node};
    use krcore_kmod::{EngineConfig, EngineMode, HandshakeConfig, RcMetaHost};
    use krcore_meta::table::Geometry;
    use krcore_meta::MetaConfig;
    use krcore_nic::conformance::Side;
    use krcore_nic::verbs::VerbsNic;
    use krcore_nic::{
        bring_up, CompletionQueue, Gid, MemoryRegion, Nic, QpCaps, QpType, QueuePair, RcPeer,
        SendWr, Wc, WcStatus,
    };
    use std::collections::BTreeMap;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    pub struct Args {
        device: String,
        gid_index: u8,
        ip: String,
        iters: usize,
        rounds: usize,
        pairs: usize,
        perftest: bool,
        sdk: bool,
        idle_sleep: Option<Duration>,
    }

    fn env_or(keys: &[&str], default: &str) -> String {
        keys.iter()
            .find_map(|k| std::env::var(k).ok())
            .unwrap_or_else(|| default.to_string())
    }

    pub fn parse() -> Result<Args, String> {
        let num = |k: &str, v: String| v.parse::<usize>().map_err(|e| format!("{k}: {e}"));
        let mut a = Args {
            device: env_or(&["KRCORE_TEST_DEVICE", "SOFTROCE_DEV"], "rxe0"),
            gid_index: env_or(&["KRCORE_TEST_GID_INDEX", "SOFTROCE_GID_INDEX"], "1")
                .trim()
                .parse()
                .map_err(|e| format!("GID index: {e}"))?,
            ip: env_or(&["SOFTROCE_IP"], "127.0.0.1"),
            iters: 1000,
            rounds: 6,
            pairs: 8,
            perftest: true,
            sdk: true,
            idle_sleep: Some(Duration::from_micros(20_000)),
        };
        let mut it = std::env::args().skip(1);
        while let Some(k) = it.next() {
            let mut v = || it.next().ok_or(format!("{k} needs a value"));
            match k.as_str() {
                "--device" => a.device = v()?,
                "--gid-index" => a.gid_index = v()?.parse().map_err(|e| format!("{k}: {e}"))?,
                "--ip" => a.ip = v()?,
                "--iters" => a.iters = num(&k, v()?)?,
                "--rounds" => a.rounds = num(&k, v()?)?,
                "--pairs" => a.pairs = num(&k, v()?)?,
                "--no-perftest" => a.perftest = false,
                "--no-sdk" => a.sdk = false,
                "--idle-sleep-us" => {
                    a.idle_sleep = Some(Duration::from_micros(num(&k, v()?)? as u64))
                }
                _ => return Err(format!("unknown argument {k}")),
            }
        }
        // perftest refuses fewer than 5 iterations; we drop 2 + 1 samples.
        if a.iters < 5 || a.rounds == 0 {
            return Err("--iters must be >= 5 and --rounds > 0".into());
        }
        Ok(a)
    }

    /// perftest's `get_cycles`: the TSC.
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

    /// p50 (`t_typical`) and p99 in cycles, computed as perftest's
    /// `print_report_lat` does from the post stamps.
    fn perftest_stats(stamps: &[u64]) -> (f64, f64, f64) {
        let mut d: Vec<u64> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
        d.sort_unstable();
        let m = d.len() - 2; // LAT_MEASURE_TAIL
        let median = if (m - 1) % 2 == 1 {
            (d[m / 2] + d[m / 2 - 1]) as f64 / 2.0
        } else {
            d[m / 2] as f64
        };
        let i99 = ((m as f64) * 0.99).ceil() as usize;
        (median, d[i99.min(d.len() - 1)] as f64, d[0] as f64)
    }

    /// Runs `iters` round trips of `one` (post one WR, spin on its
    /// completion), stamping each post like perftest.
    ///
    /// Also returns, when `one` reports them ([`Spun`]), the medians of the
    /// post's own cost (stamp to return) and of the empty polls per round
    /// trip: where a slow contender loses its time.
    fn timed(
        iters: usize,
        mut one: impl FnMut(usize, &mut dyn FnMut()) -> Result<Option<Spun>, String>,
    ) -> Result<Timing, String> {
        let mut stamps = vec![0u64; iters];
        for i in 0..iters.min(100) {
            one(i, &mut || {})?; // warm-up, not recorded
        }
        let mut spun = Vec::with_capacity(iters);
        for (i, stamp) in stamps.iter_mut().enumerate() {
            let mut at = 0;
            let r = one(i, &mut || at = cycles())?;
            *stamp = at;
            if let Some(r) = r {
                spun.push((r.posted_at.wrapping_sub(at) as f64, f64::from(r.spins)));
            }
        }
        let (p50, p99, min) = perftest_stats(&stamps);
        let (post, spins) = if spun.is_empty() {
            (None, None)
        } else {
            (
                Some(median(spun.iter().map(|s| s.0).collect())),
                Some(median(spun.iter().map(|s| s.1).collect())),
            )
        };
        Ok(Timing {
            p50,
            p99,
            min,
            post,
            spins,
        })
    }

    /// What [`spin`] saw: when the post had returned, and how many polls
    /// found nothing.
    struct Spun {
        posted_at: u64,
        spins: u32,
    }

    /// One contender's figures for one round (cycles).
    #[derive(Clone, Copy)]
    struct Timing {
        p50: f64,
        p99: f64,
        /// `t_min`: the machine at its best (the host is shared; a loaded
        /// spell shifts p50 of one contender but rarely everyone's minimum).
        min: f64,
        post: Option<f64>,
        spins: Option<f64>,
    }

    /// Spins until `poll` returns one completion; bounded by `limit` cycles
    /// (checked every 4096 empty polls, no clock read in between: in an
    /// emulated guest `clock_gettime` may be a system call).
    fn spin(
        limit: u64,
        mut poll: impl FnMut(&mut [Wc]) -> Result<usize, String>,
    ) -> Result<Option<Spun>, String> {
        let mut wc = [Wc::default()];
        let start = cycles();
        let mut spins = 0u32;
        loop {
            if poll(&mut wc)? == 1 {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 && cycles().wrapping_sub(start) > limit {
                return Err("no completion within 10 s".into());
            }
        }
        if wc[0].status != WcStatus::Success {
            return Err(format!("completion {:?}", wc[0]));
        }
        Ok(Some(Spun {
            posted_at: start,
            spins,
        }))
    }

    /// One perftest server + client run; (p50, p99) in cycles from the
    /// client's report (`-C`).
    fn perftest(a: &Args, tool: &str, extra: &[&str]) -> Result<Timing, String> {
        let port = 20000 + (std::process::id() as u16 ^ (cycles() as u16)) % 10000;
        let mut common: Vec<String> = vec![
            "-d".into(),
            a.device.clone(),
            "-x".into(),
            a.gid_index.to_string(),
            "-p".into(),
            port.to_string(),
            "-n".into(),
            a.iters.to_string(),
            "-C".into(),
        ];
        common.extend(extra.iter().map(|s| s.to_string()));
        let mut server = Command::new(tool)
            .args(&common)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {tool}: {e}"))?;
        let listening = (0..400).any(|_| {
            std::thread::sleep(Duration::from_millis(25));
            is_listening(port)
        });
        if !listening {
            let _ = server.kill();
            let _ = server.wait();
            return Err(format!("{tool} server never listened on port {port}"));
        }
        let client = Command::new(tool)
            .args(&common)
            .arg(&a.ip)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {tool}: {e}"))?;
        let out = wait_output(client, Duration::from_secs(300));
        let srv = wait_output(server, Duration::from_secs(30));
        let out = out?;
        srv?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "{tool} client failed ({}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (p50, p99, min) = parse_report(&text)
            .ok_or_else(|| format!("no report line in {tool}'s output: {text}"))?;
        Ok(Timing {
            p50,
            p99,
            min,
            post: None,
            spins: None,
        })
    }

    fn wait_output(mut c: Child, limit: Duration) -> Result<std::process::Output, String> {
        let start = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(_)) => return c.wait_with_output().map_err(|e| e.to_string()),
                Ok(None) if start.elapsed() > limit => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return Err(format!("perftest did not finish within {limit:?}"));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Whether a TCP socket listens on `port` (from /proc/net/tcp{,6}).
    fn is_listening(port: u16) -> bool {
        let hex = format!(":{port:04X}");
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|s| {
                s.lines().skip(1).any(|l| {
                    let mut w = l.split_whitespace();
                    let local = w.nth(1).unwrap_or("");
                    let state = w.nth(1).unwrap_or("");
                    local.ends_with(&hex) && state == "0A"
                })
            })
        })
    }

    /// The report line after perftest's `t_typical` header: `bytes iters
    /// t_min t_max t_typical t_avg t_stdev 99% 99.9%`.
    fn parse_report(text: &str) -> Option<(f64, f64, f64)> {
        let mut lines = text.lines().skip_while(|l| !l.contains("t_typical"));
        lines.next()?;
        let f: Vec<f64> = lines
            .next()?
            .split_whitespace()
            .map(|w| w.parse::<f64>().unwrap_or(f64::NAN))
            .collect();
        (f.len() >= 8).then(|| (f[4], f[7], f[2]))
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    fn handshake(idle_sleep: Option<Duration>) -> HandshakeConfig {
        let mut h = HandshakeConfig::default();
        // The guest is emulated: QP creation and threads are slow.
        h.timeout = Duration::from_millis(500);
        h.retries = 3;
        if let Some(s) = idle_sleep {
            h.idle_sleep = s;
        }
        h
    }

    fn open(a: &Args) -> Result<VerbsNic, String> {
        VerbsNic::open(&a.device, a.gid_index).map_err(|e| format!("open {}: {e}", a.device))
    }

    /// A GID no node has (for a meta lookup that misses).
    fn absent(g: Gid) -> Gid {
        let mut b = g.0;
        b[0] ^= 0xff;
        Gid(b)
    }

    type Samples = BTreeMap<(&'static str, &'static str), Vec<Timing>>;

    pub fn run(a: &Args) -> Result<(), String> {
        let limit_us = 10_000_000.0;
        let per_us = cycles_per_us();
        let mhz = cpuinfo_mhz().unwrap_or(per_us);
        println!(
            "device={} gid_index={} iters={} rounds={} tsc_per_us_measured={per_us:.1} cpuinfo_mhz={mhz:.1}",
            a.device, a.gid_index, a.iters, a.rounds
        );
        let limit = (per_us * limit_us) as u64;
        let has_perftest = a.perftest
            && Command::new("ib_read_lat")
                .arg("--version")
                .output()
                .is_ok();
        if a.perftest && !has_perftest {
            println!("perftest=absent (ib_read_lat not on PATH): our figures only");
        }

        // --- the provider: a loopback RC pair between two device contexts
        // (perftest's server is another process).
        let nic_a = open(a)?;
        let nic_b = open(a)?;
        let (sa, sb) = (Side::new(&nic_a, 4096), Side::new(&nic_b, 4096));
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            ..QpCaps::default()
        };
        let (qa, _qb) = krcore_nic::conformance::rc_pair(&sa, &sb, caps);
        let local = sa.mr.sge(0, 64).map_err(|e| e.to_string())?;
        let word = sa.mr.sge(64, 8).map_err(|e| e.to_string())?;

        // --- the SDK: meta host, memory node, client; RC fallback.
        let sdk = if a.sdk { Some(Sdk::start(a)?) } else { None };
        if let Some(k) = &sdk {
            println!(
                "sdk_mode={:?} (RC fallback expected on a device without DC) sdk_idle_sleep_us={}",
                k.client.mode(),
                a.idle_sleep
                    .map_or("default".into(), |d| d.as_micros().to_string())
            );
        }
        let per_poll = empty_poll_cycles(|wc| sa.cq.poll(wc).map_err(|e| e.to_string()))?;
        print!("empty_poll_cycles provider={per_poll:.0}");
        if let Some(k) = &sdk {
            let v = empty_poll_cycles(|wc| k.vqp.poll(wc).map_err(|e| e.to_string()))?;
            print!(" sdk_vqp={v:.0}");
        }
        println!();

        let mut s: Samples = BTreeMap::new();
        // CAS values, one sequence per word: every CAS succeeds.
        let (mut xp, mut xv, mut xr) = (0u64, 0u64, 0u64);
        for round in 0..a.rounds {
            let mut steps: Vec<(&'static str, &'static str)> = vec![
                ("read64", "perftest"),
                ("read64", "provider"),
                ("read64", "sdk_vqp"),
                ("read64", "sdk_request"),
                ("cas8", "perftest"),
                ("cas8", "provider"),
                ("cas8", "sdk_vqp"),
                ("cas8", "sdk_request"),
            ];
            if round % 2 == 1 {
                steps.reverse(); // no contender always runs first
            }
            for (op, who) in steps {
                let r = match (op, who) {
                    ("read64", "perftest") if has_perftest => {
                        perftest(a, "ib_read_lat", &["-s", "64"])?
                    }
                    ("cas8", "perftest") if has_perftest => {
                        perftest(a, "ib_atomic_lat", &["-A", "CMP_AND_SWAP"])?
                    }
                    (_, "perftest") => continue,
                    (_, "sdk_vqp" | "sdk_request") if sdk.is_none() => continue,
                    ("read64", "provider") => {
                        let wr = SendWr::read(1, local, sb.mr.remote(0));
                        timed(a.iters, |_, stamp| {
                            stamp();
                            qa.post_send(std::slice::from_ref(&wr))
                                .map_err(|e| e.to_string())?;
                            spin(limit, |wc| sa.cq.poll(wc).map_err(|e| e.to_string()))
                        })?
                    }
                    ("cas8", "provider") => timed(a.iters, |_, stamp| {
                        let wr = SendWr::cas(2, word, sb.mr.remote(128), xp, xp + 1);
                        xp += 1;
                        stamp();
                        qa.post_send(&[wr]).map_err(|e| e.to_string())?;
                        spin(limit, |wc| sa.cq.poll(wc).map_err(|e| e.to_string()))
                    })?,
                    ("read64", "sdk_vqp") => {
                        let k = sdk.as_ref().expect("checked above");
                        let (vqp, vbuf, token) = (
                            &k.vqp,
                            k.buf.sge(0, 64).map_err(|e| e.to_string())?,
                            &k.token,
                        );
                        timed(a.iters, |_, stamp| {
                            let mut wr = [SendWr::read(3, vbuf, token.at(0))];
                            stamp();
                            vqp.post(&mut wr).map_err(|e| e.to_string())?;
                            spin(limit, |wc| vqp.poll(wc).map_err(|e| e.to_string()))
                        })?
                    }
                    ("cas8", "sdk_vqp") => {
                        let k = sdk.as_ref().expect("checked above");
                        let (vqp, vword, token) = (
                            &k.vqp,
                            k.buf.sge(0, 8).map_err(|e| e.to_string())?,
                            &k.token,
                        );
                        timed(a.iters, |_, stamp| {
                            let mut wr = [SendWr::cas(4, vword, token.at(128), xv, xv + 1)];
                            xv += 1;
                            stamp();
                            vqp.post(&mut wr).map_err(|e| e.to_string())?;
                            spin(limit, |wc| vqp.poll(wc).map_err(|e| e.to_string()))
                        })?
                    }
                    ("read64", "sdk_request") => {
                        let k = sdk.as_ref().expect("checked above");
                        // A VQP of its own: the request level makes the
                        // token's grant known to its VQP.
                        let (vqp, buf, token) = (&k.rvqp, &k.rbuf, &k.token);
                        timed(a.iters, |_, stamp| {
                            stamp();
                            vqp.read(buf, 0, token, 0, 64)
                                .and_then(|r| r.wait())
                                .map(|_| None)
                                .map_err(|e| e.to_string())
                        })?
                    }
                    ("cas8", "sdk_request") => {
                        let k = sdk.as_ref().expect("checked above");
                        let (vqp, token) = (&k.rvqp, &k.token);
                        timed(a.iters, |_, stamp| {
                            stamp();
                            let c = vqp
                                .compare_and_swap(token, 256, xr, xr + 1)
                                .and_then(|r| r.wait())
                                .map_err(|e| e.to_string())?;
                            if c.old_value != Some(xr) {
                                return Err(format!("CAS saw {:?}, expected {xr}", c.old_value));
                            }
                            xr += 1;
                            Ok(None)
                        })?
                    }
                    _ => unreachable!("every step is matched above"),
                };
                let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
                println!(
                    "round={round} op={op} who={who} p50_cycles={:.0} p99_cycles={:.0} min_cycles={:.0} p50_us={:.2} p99_us={:.2} post_cycles={} empty_polls={}",
                    r.p50,
                    r.p99,
                    r.min,
                    r.p50 / mhz,
                    r.p99 / mhz,
                    opt(r.post),
                    opt(r.spins),
                );
                s.entry((op, who)).or_default().push(r);
            }
        }
        for op in ["read64", "cas8"] {
            let base = s.get(&(op, "perftest")).cloned();
            for who in ["perftest", "provider", "sdk_vqp", "sdk_request"] {
                let Some(v) = s.get(&(op, who)) else { continue };
                let p50 = median(v.iter().map(|r| r.p50).collect());
                let p99 = median(v.iter().map(|r| r.p99).collect());
                let mut line = format!(
                    "summary op={op} who={who} p50_us={:.2} p99_us={:.2}",
                    p50 / mhz,
                    p99 / mhz
                );
                if let Some(post) = v.iter().map(|r| r.post).collect::<Option<Vec<_>>>() {
                    line += &format!(" post_cycles={:.0}", median(post));
                }
                if let Some(sp) = v.iter().map(|r| r.spins).collect::<Option<Vec<_>>>() {
                    line += &format!(" empty_polls={:.0}", median(sp));
                }
                if let Some(b) = &base {
                    let r50 = median(v.iter().zip(b).map(|(r, b)| r.p50 / b.p50).collect());
                    let r99 = median(v.iter().zip(b).map(|(r, b)| r.p99 / b.p99).collect());
                    let rmin = median(v.iter().zip(b).map(|(r, b)| r.min / b.min).collect());
                    let (lo, hi) = v
                        .iter()
                        .zip(b)
                        .map(|(r, b)| r.p50 / b.p50)
                        .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
                            (lo.min(x), hi.max(x))
                        });
                    line +=
                        &format!(" ratio_p50_vs_perftest={r50:.3} (rounds {lo:.2}..{hi:.2}) ratio_p99_vs_perftest={r99:.3} ratio_min_vs_perftest={rmin:.3}");
                }
                println!("{line}");
            }
        }
        if let Some(k) = &sdk {
            // The VQP's own cost, op by op against the provider.
            let (vbuf, vword) = (
                k.buf.sge(0, 64).map_err(|e| e.to_string())?,
                k.buf.sge(0, 8).map_err(|e| e.to_string())?,
            );
            for op in ["read64", "cas8"] {
                let r = if op == "read64" {
                    let wr = SendWr::read(1, local, sb.mr.remote(0));
                    interleaved(
                        a.iters,
                        || {
                            qa.post_send(std::slice::from_ref(&wr))
                                .map_err(|e| e.to_string())?;
                            spin(limit, |wc| sa.cq.poll(wc).map_err(|e| e.to_string()))
                        },
                        || {
                            k.vqp
                                .post(&mut [SendWr::read(3, vbuf, k.token.at(0))])
                                .map_err(|e| e.to_string())?;
                            spin(limit, |wc| k.vqp.poll(wc).map_err(|e| e.to_string()))
                        },
                    )?
                } else {
                    interleaved(
                        a.iters,
                        || {
                            let wr = SendWr::cas(2, word, sb.mr.remote(128), xp, xp + 1);
                            xp += 1;
                            qa.post_send(&[wr]).map_err(|e| e.to_string())?;
                            spin(limit, |wc| sa.cq.poll(wc).map_err(|e| e.to_string()))
                        },
                        || {
                            let wr = SendWr::cas(4, vword, k.token.at(128), xv, xv + 1);
                            xv += 1;
                            k.vqp.post(&mut [wr]).map_err(|e| e.to_string())?;
                            spin(limit, |wc| k.vqp.poll(wc).map_err(|e| e.to_string()))
                        },
                    )?
                };
                println!(
                    "interleaved op={op} provider_p50_us={:.2} sdk_vqp_p50_us={:.2} ratio_vqp_vs_provider={:.3} post_cycles provider={:.0} sdk_vqp={:.0}",
                    r[0] / mhz,
                    r[1] / mhz,
                    r[1] / r[0],
                    r[2],
                    r[3]
                );
            }
        }
        drop(sdk);
        connect_cost(a, &sa, &sb, &nic_a, per_us)
    }

    /// The SDK side of the latency runs.
    struct Sdk {
        _meta_thread: krcore_kmod::ProgressThread,
        _meta: RcMetaHost<VerbsNic>,
        _server: Node<VerbsNic>,
        _region: krcore::MemoryRegion<VerbsNic>,
        token: krcore::RemoteRegion,
        client: Node<VerbsNic>,
        /// Verbs level (`post`/`poll`); knows no grant.
        vqp: krcore::Vqp<VerbsNic>,
        buf: krcore::MemoryRegion<VerbsNic>,
        /// Request level (`read(..).wait()`).
        rvqp: krcore::Vqp<VerbsNic>,
        rbuf: krcore::MemoryRegion<VerbsNic>,
    }

    impl Sdk {
        fn start(a: &Args) -> Result<Sdk, String> {
            let (meta, thread, cfg) = meta_host(a, a.idle_sleep)?;
            let server =
                Node::with_nic(open(a)?, cfg.clone()).map_err(|e| format!("server: {e}"))?;
            meta.table()
                .register(server.local_target().unwrap(), 0, 1 << 40, 0)
                .map_err(|e| format!("register: {e}"))?;
            let region = server.alloc(4096, Access::ALL).map_err(|e| e.to_string())?;
            let client = Node::with_nic(open(a)?, cfg).map_err(|e| format!("client: {e}"))?;
            let vqp = client
                .connect(server.gid())
                .map_err(|e| format!("connect: {e}"))?;
            let rvqp = client
                .connect(server.gid())
                .map_err(|e| format!("connect: {e}"))?;
            let alloc = |n| {
                client
                    .alloc(n, Access::LOCAL_WRITE)
                    .map_err(|e| e.to_string())
            };
            Ok(Sdk {
                _meta_thread: thread,
                _meta: meta,
                token: region.token(),
                _region: region,
                _server: server,
                buf: alloc(64)?,
                rbuf: alloc(64)?,
                client,
                vqp,
                rvqp,
            })
        }
    }

    /// A meta host with its progress thread, and an engine configuration
    /// that reads it.
    fn meta_host(
        a: &Args,
        idle_sleep: Option<Duration>,
    ) -> Result<
        (
            RcMetaHost<VerbsNic>,
            krcore_kmod::ProgressThread,
            EngineConfig,
        ),
        String,
    > {
        let h = handshake(idle_sleep);
        let meta = RcMetaHost::start(
            open(a)?,
            MetaConfig {
                geometry: Geometry::with_buckets(64).map_err(|e| e.to_string())?,
                ..MetaConfig::default()
            },
            h.clone(),
        )
        .map_err(|e| format!("meta host: {e}"))?;
        let thread = meta.spawn_progress().map_err(|e| e.to_string())?;
        let mut cfg =
            EngineConfig::default().with_meta(meta.location().map_err(|e| e.to_string())?);
        cfg.handshake = h;
        Ok((meta, thread, cfg))
    }

    /// Cycles of one poll of an empty queue (what one spin costs).
    fn empty_poll_cycles(
        mut poll: impl FnMut(&mut [Wc]) -> Result<usize, String>,
    ) -> Result<f64, String> {
        let mut wc = [Wc::default()];
        let mut v = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let c0 = cycles();
            if poll(&mut wc)? != 0 {
                return Err("a completion on an idle queue".into());
            }
            v.push((cycles() - c0) as f64);
        }
        // The median: a preempted poll (the host is shared) says nothing.
        Ok(median(v))
    }

    /// The SDK's VQP against the bare provider, one op of each in turn
    /// (both see the same moment of a drifting machine): medians of
    /// post-to-completion cycles, and of the post call alone.
    fn interleaved(
        iters: usize,
        mut provider: impl FnMut() -> Result<Option<Spun>, String>,
        mut vqp: impl FnMut() -> Result<Option<Spun>, String>,
    ) -> Result<[f64; 4], String> {
        let (mut p, mut v, mut pp, mut vp) = (vec![], vec![], vec![], vec![]);
        for i in 0..iters + 100 {
            let c0 = cycles();
            let a = provider()?.ok_or("no spin figures")?;
            let c1 = cycles();
            let b = vqp()?.ok_or("no spin figures")?;
            let c2 = cycles();
            if i >= 100 {
                p.push((c1 - c0) as f64);
                pp.push(a.posted_at.wrapping_sub(c0) as f64);
                v.push((c2 - c1) as f64);
                vp.push(b.posted_at.wrapping_sub(c1) as f64);
            }
        }
        Ok([median(p), median(v), median(pp), median(vp)])
    }

    /// Plain RC pairs vs. the SDK's connects (see the crate docs).
    fn connect_cost(
        a: &Args,
        sa: &Side<VerbsNic>,
        sb: &Side<VerbsNic>,
        nic: &VerbsNic,
        per_us: f64,
    ) -> Result<(), String> {
        if a.pairs == 0 || !a.sdk {
            return Ok(());
        }
        // A meta host and a target of their own, with the engine's default
        // idle sleep (it bounds how fast a target answers a handshake).
        let (meta, _thread, cfg) = meta_host(a, None)?;
        let cfg = &cfg;
        let server = Node::with_nic(open(a)?, cfg.clone()).map_err(|e| format!("server: {e}"))?;
        meta.table()
            .register(server.local_target().unwrap(), 0, 1 << 40, 0)
            .map_err(|e| format!("register: {e}"))?;
        // Cycle stamps, not the clock: in an emulated guest a clock read
        // can cost more than a cached connect.
        let us = |c0: u64| cycles().wrapping_sub(c0) as f64 / per_us;
        let (mut meta_pair, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        let mut plain = Vec::new();
        let mut first_d = None;
        let mut second_d = None;
        // Plain and SDK samples alternate: a drifting machine hits both.
        for i in 0..a.pairs {
            // A plain pair: both QPs made and connected in process.
            let t0 = cycles();
            let q1 = sa.qp(QpType::Rc, QpCaps::default(), None, 0);
            let q2 = sb.qp(QpType::Rc, QpCaps::default(), None, 0);
            // Both contexts are on the same port: the same GID.
            let peer = |q: &krcore_nic::verbs::VerbsQp| {
                Some(RcPeer {
                    gid: nic.gid(),
                    qpn: q.qpn(),
                })
            };
            bring_up(&q1, krcore_nic::Access::ALL, peer(&q2)).map_err(|e| e.to_string())?;
            bring_up(&q2, krcore_nic::Access::ALL, peer(&q1)).map_err(|e| e.to_string())?;
            plain.push(us(t0));
            drop((q1, q2));
            // A fresh client engine each time: nothing cached.
            let c = Node::with_nic(open(a)?, cfg.clone()).map_err(|e| format!("client: {e}"))?;
            if c.mode() != EngineMode::RcFallback {
                return Err(format!(
                    "connect cost is for RC fallback, not {:?}",
                    c.mode()
                ));
            }
            // 1. The engine's meta pair (a handshake with the meta host) and
            //    a lookup that misses.
            let t0 = cycles();
            let miss = c.connect(absent(server.gid()));
            meta_pair.push(us(t0));
            if miss.is_ok() {
                return Err("a connect to an absent GID succeeded".into());
            }
            // 2. First connect to the target: one meta READ, one handshake.
            let before = c.counters();
            let t0 = cycles();
            let v1 = c
                .connect(server.gid())
                .map_err(|e| format!("first connect: {e}"))?;
            first.push(us(t0));
            first_d = Some(c.counters() - before);
            // 3. Second connect to the same target, on a new VQP: both
            //    caches hit (the VQP's creation is not timed).
            let v2 = c.vqp().map_err(|e| format!("a second VQP: {e}"))?;
            let before = c.counters();
            let t0 = cycles();
            v2.connect(server.gid())
                .map_err(|e| format!("second connect: {e}"))?;
            second.push(us(t0));
            second_d = Some(c.counters() - before);
            if v1.raw().physical_qpn() != v2.raw().physical_qpn() {
                return Err("the second connect did not share the first's RC pair".into());
            }
            let st = c.engine().stats();
            if (st.rc.created, st.rc.reused) != (1, 1) {
                return Err(format!("unexpected RC pair statistics {:?}", st.rc));
            }
            println!(
                "connect sample={i} plain_us={:.1} sdk_meta_pair_us={:.1} sdk_first_us={:.1} sdk_second_us={:.1}",
                plain[i], meta_pair[i], first[i], second[i]
            );
        }
        let p = |v: &Vec<f64>| median(v.clone());
        println!(
            "connect plain_rc_pair_us={:.1} (create 2 QPs + in-process QPN exchange + 2x INIT/RTR/RTS) samples={}",
            p(&plain),
            a.pairs
        );
        println!(
            "connect sdk_meta_pair_us={:.1} (fresh engine: handshake with the meta host + a READ that misses)",
            p(&meta_pair)
        );
        println!(
            "connect sdk_first_us={:.1} (one meta READ + a handshake over UD + both QPs) ratio_vs_plain={:.2} counters={:?}",
            p(&first),
            median(first.iter().zip(&plain).map(|(f, p)| f / p).collect()),
            first_d
        );
        println!(
            "connect sdk_second_us={:.1} (a new VQP to the same target: DCCache and RC pair hits) counters={:?}",
            p(&second),
            second_d
        );
        Ok(())
    }
}
