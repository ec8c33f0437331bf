//! `krcore_lat`'s perftest side (see the crate docs): its server and
//! client processes, stopping and continuing the client for its turns, its
//! sample series and report, and the statistics both sides share.

use super::*;

/// The write system calls of a process (`syscw` of `/proc/PID/io`):
/// on rxe every `ibv_post_send` is one (the doorbell is a `write` to
/// the uverbs file), so they tell whether perftest's client was in its
/// timed loop during its turn (its setup makes only a few). Exact at
/// any moment, unlike the device's counters (cached by the kernel for
/// 10 ms).
pub(super) fn write_calls(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("syscw:"))?
        .trim()
        .parse()
        .ok()
}

/// Write calls in one of perftest's turns that mean "in its loop" (a
/// turn of 10 ms holds 25 to 100 round trips here).
pub(super) const BUSY_WRITES: u64 = 16;

/// Sends `sig` to the perftest client.
pub(super) fn signal(
    pid: rustix::process::Pid,
    sig: rustix::process::Signal,
) -> Result<(), String> {
    rustix::process::kill_process(pid, sig).map_err(|e| format!("kill: {e}"))
}

/// Waits (bounded) until `pid` is stopped (or gone): a SIGSTOP takes
/// effect when the process next leaves the kernel.
pub(super) fn wait_stopped(pid: u32) -> Result<(), String> {
    let path = format!("/proc/{pid}/stat");
    for _ in 0..20_000 {
        let Ok(st) = std::fs::read_to_string(&path) else {
            return Ok(()); // reaped
        };
        let state = st
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if matches!(state, Some("T" | "t" | "Z" | "X")) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Err(format!("perftest client {pid} did not stop"))
}

/// What one window of turns with perftest gave.
pub(super) struct Window {
    pub(super) perftest: Timing,
    /// perftest's own report line (p50, p99, min): with the samples
    /// that span a stop in it.
    pub(super) report: (f64, f64, f64),
    /// `None`: no turn of that contender fell inside perftest's loop.
    pub(super) ours: Vec<Option<Timing>>,
    /// The process contenders (name, figures).
    pub(super) procs: Vec<ProcFigures>,
    /// What the guest did during the turns, per contender (perftest
    /// first, then `ours`, then the processes).
    pub(super) diag: Vec<(&'static str, Diag)>,
    pub(super) turns: usize,
    pub(super) accepted: usize,
    pub(super) stops_in_loop: usize,
}

/// Spawns a perftest server on `port` and waits until it listens.
pub(super) fn perftest_server(tool: &str, common: &[String], port: u16) -> Result<Child, String> {
    let mut server = Command::new(tool)
        .args(common)
        .args(["-p", &port.to_string()])
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
    Ok(server)
}

/// Spawns a perftest client printing its samples (`-U`) to a file.
pub(super) fn perftest_client(
    a: &Args,
    tool: &str,
    common: &[String],
    port: u16,
    out_path: &std::path::Path,
) -> Result<Child, String> {
    let out_file =
        std::fs::File::create(out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
    Command::new(tool)
        .args(common)
        .args(["-p", &port.to_string(), "-U", &a.ip])
        .stdout(out_file)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {tool}: {e}"))
}

/// Stops a freshly spawned process contender before the window opens
/// (it runs only in its turns, its setup included).
pub(super) fn stop_now(c: &Child) -> Result<(), String> {
    let pid = rustix::process::Pid::from_raw(c.id() as i32).ok_or("no pid")?;
    signal(pid, rustix::process::Signal::STOP)?;
    wait_stopped(c.id())
}

/// perftest's client and our contenders take turns on the guest: the
/// client runs for `slice`, is stopped (SIGSTOP), one of our
/// contenders runs for `slice` (in rotation; a process contender is
/// continued and stopped like the client), the client is continued,
/// and so on until it exits. Both thus see the same moments of an
/// emulator whose speed drifts by 2x and more within seconds.
///
/// - Our in-process turn counts only when perftest's turns before and
///   after it were in its timed loop (the device sent packets during
///   them).
/// - perftest prints every sample (`-U`); the samples that span a stop
///   are its largest ones (a stop lasts a whole slice): the `stops`
///   largest are dropped, where `stops` counts the stops from its first
///   busy turn on; then its figures are computed as its own report does.
///   A process contender's samples are cut the same way.
pub(super) fn with_perftest(
    a: &Args,
    tool: &str,
    extra: &[&str],
    ours: &mut [Contender<'_>],
    mut procs: Vec<Proc>,
    slice: u64,
    calibrate: bool,
) -> Result<Window, String> {
    let port = 20000 + (std::process::id() as u16 ^ (cycles() as u16)) % 10000;
    let nslots = ours.len() + procs.len();
    // perftest's timed loop spans about as many round trips as all of
    // our turns together; twice that, since only our turns between two
    // of its busy ones count.
    let n = 2 * a.iters * nslots.max(1);
    let mut common: Vec<String> = vec![
        "-d".into(),
        a.device.clone(),
        "-x".into(),
        a.gid_index.to_string(),
        "-C".into(),
    ];
    common.extend(extra.iter().map(|s| s.to_string()));
    let cn = |n: usize| {
        let mut c = common.clone();
        c.extend(["-n".to_string(), n.to_string()]);
        c
    };
    let mut server = perftest_server(tool, &cn(n), port)?;
    let tmp =
        |p: u16| std::env::temp_dir().join(format!("krcore_lat-{}-{p}.out", std::process::id()));
    if calibrate {
        // perftest against itself: a second server and client, the
        // client in one of our slots (called with no other contender:
        // both clients then run the same number of round trips and
        // take turns one to one from their start, setup included); it
        // is compared over the turns where both were in their loops.
        let nb = (n / nslots.max(1)).max(5);
        let spawned = (|| {
            let s = perftest_server(tool, &cn(nb), port + 1)?;
            let out_path = tmp(port + 1);
            let c = perftest_client(a, tool, &cn(nb), port + 1, &out_path)?;
            Ok::<_, String>((s, c, out_path))
        })();
        match spawned {
            Ok((s, c, out_path)) => {
                let mut p = Proc::new("perftest_b", c, Some(s), None, out_path, nb, false);
                if let Err(e) = stop_now(&p.child) {
                    p.kill();
                    return Err(e);
                }
                procs.push(p);
            }
            Err(e) => {
                let _ = server.kill();
                let _ = server.wait();
                for p in &mut procs {
                    p.kill();
                }
                return Err(e);
            }
        }
    }
    let nslots = ours.len() + procs.len();
    // Its samples (`-U`) go to a file: tens of KB, more than a pipe
    // holds while the client runs.
    let out_path = tmp(port);
    let mut client = perftest_client(a, tool, &cn(n), port, &out_path)?;
    let slice_t = Duration::from_secs_f64(a.slice_ms as f64 / 1000.0);
    let mut pools: Vec<Pool> = ours.iter().map(|_| Pool::default()).collect();
    let started = Instant::now();
    // Our turns (the slot, its samples, what the guest did) and, for
    // each of perftest's turns, whether it was busy; our turn `t` sits
    // between its turns `t` and `t + 1`.
    let mut ours_by_turn: Vec<(usize, Vec<Pool>, Diag)> = Vec::new();
    let mut busy_turns: Vec<Option<u64>> = Vec::new();
    let mut diag_a: Vec<Diag> = Vec::new();
    let mut k = 0usize;
    let run = (|| -> Result<(), String> {
        loop {
            // perftest's turn.
            let d0 = Diag::snap(Some(client.id()));
            let (w, exited) = proc_turn(&mut client, slice_t)?;
            busy_turns.push(w);
            diag_a.push(Diag::snap(Some(client.id())).minus(&d0));
            if exited {
                break;
            }
            if started.elapsed() > Duration::from_secs(300) {
                return Err(format!("{tool} did not finish within 300 s"));
            }
            // Our turn: the next slot whose process has not exited.
            // A process contender waits for perftest's loop (its own
            // setup is done before the window).
            let in_loop = busy_turns.iter().any(busy);
            let ready = |slot: usize| {
                slot < ours.len() || {
                    let p = &procs[slot - ours.len()];
                    !(p.exited || (p.gated && !in_loop))
                }
            };
            // None ready (only process contenders, all done or
            // waiting): perftest's next turn follows at once.
            let Some(slot) = (0..nslots).map(|i| (k + i) % nslots).find(|&s| ready(s)) else {
                ours_by_turn.push((usize::MAX, Vec::new(), Diag::default()));
                continue;
            };
            k = slot + 1;
            if slot < ours.len() {
                let d0 = Diag::snap(None);
                let r = turn(ours, slot, slice)?;
                ours_by_turn.push((slot, r, Diag::snap(None).minus(&d0)));
            } else {
                let p = &mut procs[slot - ours.len()];
                let d0 = Diag::snap(Some(p.child.id()));
                let (w, exited) = proc_turn(&mut p.child, slice_t)?;
                let d = Diag::snap(Some(p.child.id())).minus(&d0);
                p.writes.push(w);
                p.at.push(2 * busy_turns.len() - 1);
                p.exited = exited;
                if busy(&w) {
                    p.diag.add(&d);
                }
                ours_by_turn.push((slot, Vec::new(), Diag::default()));
            }
        }
        // A process contender still in its loop finishes alone.
        let mut t = 2 * busy_turns.len();
        for p in procs.iter_mut().filter(|p| !p.exited) {
            while !p.exited {
                t += 1;
                p.at.push(t);
                if started.elapsed() > Duration::from_secs(300) {
                    return Err(format!("{} did not finish within 300 s", p.name));
                }
                let (w, exited) = proc_turn(&mut p.child, slice_t)?;
                p.writes.push(w);
                p.exited = exited;
            }
        }
        Ok(())
    })();
    // perftest's timed loop runs from its first busy turn to its last:
    // our turns in between count (and each of them stops perftest once
    // inside its loop).
    let first = busy_turns.iter().position(busy);
    let last = busy_turns.iter().rposition(busy);
    let turns = ours_by_turn.len();
    let mut accepted = 0;
    let mut diag_ours: Vec<Diag> = ours.iter().map(|_| Diag::default()).collect();
    let mut diag_pt = Diag::default();
    if let (Some(first), Some(last)) = (first, last) {
        for (t, (slot, p, d)) in ours_by_turn.into_iter().enumerate() {
            if first <= t && t < last {
                for (pool, x) in pools.iter_mut().zip(p) {
                    pool.extend(x);
                }
                if slot < ours.len() {
                    diag_ours[slot].add(&d);
                }
                accepted += 1;
            }
        }
        for d in &diag_a[first..=last] {
            diag_pt.add(d);
        }
    }
    if let Err(e) = run {
        let _ = client.kill();
        let _ = client.wait();
        let _ = server.kill();
        let _ = server.wait();
        let _ = std::fs::remove_file(&out_path);
        for p in &mut procs {
            p.kill();
        }
        return Err(e);
    }
    let out = wait_output(client, Duration::from_secs(300));
    let srv = wait_output(server, Duration::from_secs(30));
    let text = std::fs::read_to_string(&out_path);
    let _ = std::fs::remove_file(&out_path);
    let out = out?;
    srv?;
    let text = text.map_err(|e| format!("{}: {e}", out_path.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{tool} client failed ({}): {}{}",
            out.status,
            tail(&text),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report = parse_report(&text)
        .ok_or_else(|| format!("no report line in {tool}'s output: {}", tail(&text)))?;
    let d = parse_samples(&text);
    if d.len() + 1 != n {
        return Err(format!(
            "{tool} printed {} samples, expected {}",
            d.len(),
            n - 1
        ));
    }
    // The samples that span a stop: one per accepted turn, each at
    // least a slice long (no more than there are such samples).
    let stops_in_loop = accepted.min(d.iter().filter(|&&x| x >= slice).count());
    let perftest = cut_stops(d.clone(), accepted, slice)?;
    let mut diag = vec![("perftest", diag_pt)];
    diag.extend(ours.iter().map(|c| c.0).zip(diag_ours));
    let mut proc_t = Vec::new();
    let mut failed = None;
    for p in procs {
        diag.push((p.name, p.diag));
        match p.figures(&d, &busy_turns, accepted, slice) {
            Ok(f) => proc_t.push(f),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(Window {
        perftest,
        report,
        ours: pools.into_iter().map(|p| p.timing().ok()).collect(),
        procs: proc_t,
        diag,
        turns,
        accepted,
        stops_in_loop,
    })
}

/// The samples perftest prints with `-U` (`#, cycles` then `i, value`
/// lines, in the order measured).
pub(super) fn parse_samples(text: &str) -> Vec<u64> {
    text.lines()
        .skip_while(|l| !l.starts_with("#, "))
        .skip(1)
        .map_while(|l| {
            let (_, v) = l.split_once(", ")?;
            v.trim().parse::<f64>().ok().map(|v| v.round() as u64)
        })
        .collect()
}

/// What [`spin`] saw: when the post had returned, and how many polls
/// found nothing.
pub(super) struct Spun {
    pub(super) posted_at: u64,
    pub(super) spins: u32,
}

/// One contender's figures for one round (cycles).
#[derive(Clone, Copy)]
pub(super) struct Timing {
    pub(super) p50: f64,
    pub(super) p99: f64,
    /// `t_min`: the machine at its best (the host is shared; a loaded
    /// spell shifts p50 of one contender but rarely everyone's minimum).
    pub(super) min: f64,
    pub(super) post: Option<f64>,
    pub(super) spins: Option<f64>,
}

/// Spins until `poll` returns one completion; bounded by `limit` cycles
/// (checked every 4096 empty polls, no clock read in between: in an
/// emulated guest `clock_gettime` may be a system call).
pub(super) fn spin(
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

pub(super) fn wait_output(mut c: Child, limit: Duration) -> Result<std::process::Output, String> {
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
pub(super) fn is_listening(port: u16) -> bool {
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

/// The report line after perftest's (last) `t_typical` header: `bytes
/// iters t_min t_max t_typical t_avg t_stdev 99% 99.9%` (with `-U` the
/// header comes twice: before the samples and before the report).
pub(super) fn parse_report(text: &str) -> Option<(f64, f64, f64)> {
    let lines: Vec<&str> = text.lines().collect();
    let h = lines.iter().rposition(|l| l.contains("t_typical"))?;
    let f: Vec<f64> = lines
        .get(h + 1)?
        .split_whitespace()
        .map(|w| w.parse::<f64>().unwrap_or(f64::NAN))
        .collect();
    (f.len() >= 8).then(|| (f[4], f[7], f[2]))
}

/// The last lines of a tool's output (for an error message).
pub(super) fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
