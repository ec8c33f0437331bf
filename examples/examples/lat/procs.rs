//! `krcore_lat`'s process contenders (see the crate docs): contenders
//! that are processes of their own, stopped and continued like perftest's
//! client, their sample series matched to the turns, the children that
//! run our provider and the SDK's VQP, and the per-turn guest counters.

use super::*;

/// A contender that is a process of its own, continued for its turn
/// and stopped after it exactly like perftest's client: a second
/// perftest client (`perftest_b`, `--calibrate`: perftest against
/// itself, which shows the tool's own bias and spread) or our provider
/// in a single-threaded child process with one device context
/// (`provider_proc`, `--proc`: the process shape of perftest's client,
/// see [`child`]). Its samples come from its output (`-U` format) and
/// are cut like perftest's: the ones that span one of its stops are
/// dropped.
pub(super) struct Proc {
    pub(super) name: &'static str,
    pub(super) child: Child,
    pub(super) server: Option<Child>,
    /// The server side QP of `provider_proc` (lives in this process,
    /// as perftest's server QP lives in its server process).
    pub(super) _qp: Option<krcore_nic::verbs::VerbsQp>,
    pub(super) out_path: std::path::PathBuf,
    /// Iterations it runs (it prints `n - 1` samples).
    pub(super) n: usize,
    /// Write calls in each of its turns (`None`: unknown, it exited).
    pub(super) writes: Vec<Option<u64>>,
    /// The moment of each of its turns (see [`by_turn`]).
    pub(super) at: Vec<usize>,
    /// Whether it waits for perftest's loop before its first turn (it
    /// did its setup before the window).
    pub(super) gated: bool,
    pub(super) exited: bool,
    pub(super) diag: Diag,
}

/// A process contender's figures in one window, beside perftest's
/// over the same turns.
pub(super) struct ProcFigures {
    pub(super) name: &'static str,
    pub(super) ours: Timing,
    pub(super) perftest: Timing,
    /// Whether both sample series split into their turns (else both
    /// are taken whole, stops cut).
    pub(super) aligned: bool,
    /// Turns of each inside the common window.
    pub(super) turns: (usize, usize),
}

/// Whether a turn with `w` write calls was spent in the timed loop
/// (on rxe each post is one write; setup makes only a few per turn).
pub(super) fn busy(w: &Option<u64>) -> bool {
    w.is_none_or(|w| w >= BUSY_WRITES)
}

/// The samples of a process contender's loop by turn. `d` splits at
/// the samples that span a stop (at least a slice long) into pieces, one
/// per turn of its loop in which it posted; they are matched to its turns
/// by their sizes: a piece of a turn inside the loop holds one sample
/// fewer than the turn's write calls (`writes`; the first and the last
/// turn of the loop may also hold setup and output writes, and a turn in
/// which it posted nothing, at most one write, holds no piece: one
/// sample then spans two stops). `at` is the moment of each turn
/// (perftest's turn `t` is `2t`, the turn after it `2t + 1`). The
/// placement with the least mismatch wins; `None` when none fits (a round
/// trip longer than a slice splits a turn in two).
pub(super) fn by_turn(
    d: &[u64],
    writes: &[Option<u64>],
    at: &[usize],
    slice: u64,
) -> Option<Vec<(usize, Vec<u64>)>> {
    let pieces: Vec<Vec<u64>> = d.split(|&x| x >= slice).map(<[u64]>::to_vec).collect();
    let (m, t_n) = (pieces.len(), writes.len());
    if m > t_n || t_n != at.len() {
        return None;
    }
    // Mismatch of piece `j` in turn `t` (None: impossible).
    let cost = |j: usize, t: usize| -> Option<u64> {
        let Some(w) = writes[t] else { return Some(0) };
        let n = pieces[j].len() as u64 + 1;
        if j == 0 || j + 1 == m {
            // Setup or output writes may come on top.
            (n <= w + 2).then_some(0)
        } else {
            let e = n.abs_diff(w);
            (e <= 2 + w / 20).then_some(e)
        }
    };
    let idle = |t: usize| matches!(writes[t], Some(w) if w <= 1);
    // best[j][t]: least total mismatch with piece `j` in turn `t`, and
    // the turn of piece `j - 1`.
    let mut best: Vec<Vec<Option<(u64, usize)>>> = vec![vec![None; t_n]; m];
    for (t, b) in best[0].iter_mut().enumerate() {
        *b = cost(0, t).map(|c| (c, t));
    }
    for j in 1..m {
        for t in j..t_n {
            let Some(c) = cost(j, t) else { continue };
            // The previous piece: the turn before, or earlier across
            // turns in which nothing was posted.
            let mut p = t - 1;
            let mut found: Option<(u64, usize)> = None;
            loop {
                if let Some((b, _)) = best[j - 1][p] {
                    if found.is_none_or(|(f, _)| b < f) {
                        found = Some((b, p));
                    }
                }
                if p == 0 || !idle(p) {
                    break;
                }
                p -= 1;
            }
            best[j][t] = found.map(|(b, p)| (b + c, p));
        }
    }
    let (mut t, _) = (0..t_n)
        .filter_map(|t| Some((t, best[m - 1][t]?.0)))
        .min_by_key(|&(_, c)| c)?;
    let mut turns = vec![0; m];
    for j in (0..m).rev() {
        turns[j] = t;
        t = best[j][t]?.1;
    }
    Some(turns.into_iter().map(|t| at[t]).zip(pieces).collect())
}

/// The samples of the turns in `lo..=hi`.
pub(super) fn in_window(t: &[(usize, Vec<u64>)], lo: usize, hi: usize) -> (Vec<u64>, usize) {
    let v: Vec<&(usize, Vec<u64>)> = t.iter().filter(|(g, _)| (lo..=hi).contains(g)).collect();
    (
        v.iter().flat_map(|(_, d)| d.iter().copied()).collect(),
        v.len(),
    )
}

impl Proc {
    /// A contender process not yet in any turn (`gated`: it waits for
    /// perftest's loop before its first turn).
    pub(super) fn new(
        name: &'static str,
        child: Child,
        server: Option<Child>,
        qp: Option<krcore_nic::verbs::VerbsQp>,
        out_path: std::path::PathBuf,
        n: usize,
        gated: bool,
    ) -> Proc {
        Proc {
            name,
            child,
            server,
            _qp: qp,
            out_path,
            n,
            writes: Vec::new(),
            at: Vec::new(),
            gated,
            exited: false,
            diag: Diag::default(),
        }
    }

    pub(super) fn kill(&mut self) {
        for c in std::iter::once(&mut self.child).chain(self.server.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.out_path);
    }

    /// Its samples, once it has exited.
    pub(super) fn samples(self) -> Result<Vec<u64>, String> {
        let out = wait_output(self.child, Duration::from_secs(300));
        let srv = self.server.map(|s| wait_output(s, Duration::from_secs(30)));
        let text = std::fs::read_to_string(&self.out_path);
        let _ = std::fs::remove_file(&self.out_path);
        let out = out?;
        srv.transpose()?;
        let text = text.map_err(|e| format!("{}: {e}", self.out_path.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}): {}{}",
                self.name,
                out.status,
                tail(&text),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let d = parse_samples(&text);
        if d.len() + 1 != self.n {
            return Err(format!(
                "{} printed {} samples, expected {}",
                self.name,
                d.len(),
                self.n - 1
            ));
        }
        Ok(d)
    }

    /// Its figures beside perftest's (samples `da`, writes of its turns `wa`)
    /// over the turns where both were in their loops; when a series
    /// does not split into its turns, both whole with their stops cut.
    pub(super) fn figures(
        self,
        da: &[u64],
        wa: &[Option<u64>],
        stops_a: usize,
        slice: u64,
    ) -> Result<ProcFigures, String> {
        let (name, writes, at) = (self.name, self.writes.clone(), self.at.clone());
        let d = self.samples()?;
        let at_a: Vec<usize> = (0..wa.len()).map(|t| 2 * t).collect();
        let stats = |d: Vec<u64>| -> Result<Timing, String> { cut_stops(d, 0, slice) };
        if let (Some(x), Some(y)) = (
            by_turn(&d, &writes, &at, slice),
            by_turn(da, wa, &at_a, slice),
        ) {
            let lo = x[0].0.max(y[0].0);
            let hi = x[x.len() - 1].0.min(y[y.len() - 1].0);
            let (dx, nx) = in_window(&x, lo, hi);
            let (dy, ny) = in_window(&y, lo, hi);
            if dx.len() >= 5 && dy.len() >= 5 {
                return Ok(ProcFigures {
                    name,
                    ours: stats(dx)?,
                    perftest: stats(dy)?,
                    aligned: true,
                    turns: (nx, ny),
                });
            }
        }
        let first = writes.iter().position(busy);
        let last = writes.iter().rposition(busy);
        let stops = match (first, last) {
            (Some(f), Some(l)) => l - f,
            _ => 0,
        };
        Ok(ProcFigures {
            name,
            ours: cut_stops(d, stops, slice)?,
            perftest: cut_stops(da.to_vec(), stops_a, slice)?,
            aligned: false,
            turns: (writes.len(), wa.len()),
        })
    }
}

/// Drops the `stops` samples that span a stop (each at least a slice
/// long: no more than there are such samples) and computes the figures
/// as perftest's report does.
pub(super) fn cut_stops(mut d: Vec<u64>, stops: usize, slice: u64) -> Result<Timing, String> {
    let stops = stops.min(d.iter().filter(|&&x| x >= slice).count());
    d.sort_unstable();
    d.truncate(d.len().saturating_sub(stops));
    let (p50, p99, min) = lat_stats(d)?;
    Ok(Timing {
        p50,
        p99,
        min,
        post: None,
        spins: None,
    })
}

/// One turn of a process contender (perftest's client included):
/// continued, left alone for `slice_t`, stopped again. Returns its write calls in the turn
/// (`None` in the turn it exits in) and whether it exited.
pub(super) fn proc_turn(
    child: &mut Child,
    slice_t: Duration,
) -> Result<(Option<u64>, bool), String> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32)
        .ok_or("a process contender without a pid")?;
    let c0 = write_calls(child.id());
    signal(pid, rustix::process::Signal::CONT)?;
    // One sleep for the whole turn: this process wakes once, as it
    // does not wake at all during an in-process contender's turn (it
    // used to poll for the exit every millisecond: ten wake-ups, their
    // timer interrupts and switches landing in the contender's turn).
    std::thread::sleep(slice_t);
    let exited = child.try_wait().map_err(|e| e.to_string())?.is_some();
    if !exited {
        signal(pid, rustix::process::Signal::STOP)?;
        wait_stopped(child.id())?;
    }
    // Counted once it is stopped: every write of the turn.
    let writes = match (c0, write_calls(child.id())) {
        (Some(x), Some(y)) if !exited => Some(y.saturating_sub(x)),
        _ => None, // exited (or no /proc/PID/io)
    };
    Ok((writes, exited))
}

/// What the guest did during a contender's turns (sums; printed per
/// turn): softirqs and interrupts of all CPUs (`/proc/softirqs`,
/// `/proc/interrupts`), the contender's own context switches and, for
/// an in-process contender, those of this process's other threads
/// (the SDK's serving threads). Read between turns, never inside one.
#[derive(Default, Clone, Copy)]
pub(super) struct Diag {
    pub(super) turns: u64,
    /// TASKLET, NET_RX, TIMER, SCHED softirqs.
    pub(super) softirq: [u64; 4],
    /// LOC (local timer), RES (rescheduling), CAL (function call) and
    /// TLB (shootdown) interrupts.
    pub(super) irq: [u64; 4],
    /// Voluntary and involuntary context switches of the contender
    /// (the timing thread, or every thread of a process contender).
    pub(super) vol: u64,
    pub(super) invol: u64,
    /// Context switches of this process's other threads (for an
    /// in-process contender: how often they ran).
    pub(super) others: u64,
    /// Threads of the contender's process (the most seen).
    pub(super) threads: u64,
}

impl Diag {
    pub(super) const SOFTIRQS: [&'static str; 4] = ["TASKLET:", "NET_RX:", "TIMER:", "SCHED:"];
    pub(super) const IRQS: [&'static str; 4] = ["LOC:", "RES:", "CAL:", "TLB:"];

    /// Now: of process `pid`, or of this thread and this process's
    /// other threads (`None`).
    pub(super) fn snap(pid: Option<u32>) -> Diag {
        let mut d = Diag::default();
        let sum = |file: &str, keys: &[&str; 4], out: &mut [u64; 4]| {
            let Ok(s) = std::fs::read_to_string(file) else {
                return;
            };
            for l in s.lines() {
                let mut w = l.split_whitespace();
                let Some(k) = w.next() else { continue };
                if let Some(i) = keys.iter().position(|x| *x == k) {
                    out[i] = w.map_while(|x| x.parse::<u64>().ok()).sum();
                }
            }
        };
        sum("/proc/softirqs", &Self::SOFTIRQS, &mut d.softirq);
        sum("/proc/interrupts", &Self::IRQS, &mut d.irq);
        let switches = |status: &str| -> (u64, u64) {
            let Ok(s) = std::fs::read_to_string(status) else {
                return (0, 0);
            };
            let f = |key: &str| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            (
                f("voluntary_ctxt_switches:"),
                f("nonvoluntary_ctxt_switches:"),
            )
        };
        let all = |dir: &str| -> (u64, u64, u64) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return (0, 0, 0);
            };
            rd.flatten()
                .map(|e| switches(&format!("{}/status", e.path().display())))
                .fold((0, 0, 0), |(a, b, n), (x, y)| (a + x, b + y, n + 1))
        };
        match pid {
            Some(p) => (d.vol, d.invol, d.threads) = all(&format!("/proc/{p}/task")),
            None => {
                (d.vol, d.invol) = switches("/proc/thread-self/status");
                let (v, i, n) = all("/proc/self/task");
                d.others = (v + i).saturating_sub(d.vol + d.invol);
                d.threads = n;
            }
        }
        d
    }

    /// What happened since `before` (one turn).
    pub(super) fn minus(&self, before: &Diag) -> Diag {
        // A process that exited in between reads as 0 switches.
        let sub = |a: [u64; 4], b: [u64; 4]| std::array::from_fn(|i| a[i].saturating_sub(b[i]));
        Diag {
            turns: 1,
            softirq: sub(self.softirq, before.softirq),
            irq: sub(self.irq, before.irq),
            vol: self.vol.saturating_sub(before.vol),
            invol: self.invol.saturating_sub(before.invol),
            others: self.others.saturating_sub(before.others),
            threads: self.threads.max(before.threads),
        }
    }

    pub(super) fn add(&mut self, d: &Diag) {
        self.turns += d.turns;
        for i in 0..4 {
            self.softirq[i] += d.softirq[i];
            self.irq[i] += d.irq[i];
        }
        self.vol += d.vol;
        self.invol += d.invol;
        self.others += d.others;
        self.threads = self.threads.max(d.threads);
    }

    /// Per-turn averages, `key=value`.
    pub(super) fn line(&self) -> String {
        let t = self.turns.max(1) as f64;
        let mut s = format!("turns={}", self.turns);
        for (k, v) in ["tasklet", "net_rx", "timer", "sched"]
            .iter()
            .zip(self.softirq)
        {
            s += &format!(" {k}={:.1}", v as f64 / t);
        }
        for (k, v) in ["loc", "res", "cal", "tlb"].iter().zip(self.irq) {
            s += &format!(" {k}={:.1}", v as f64 / t);
        }
        s += &format!(
            " own_vol={:.1} own_invol={:.1} other_threads={:.1} threads={}",
            self.vol as f64 / t,
            self.invol as f64 / t,
            self.others as f64 / t,
            self.threads
        );
        s
    }
}

/// The provider in a child process of its own (`--child OP`), shaped
/// like perftest's client: single threaded, one device context, one
/// PD, CQ, MR and RC QP, connected to a server QP in the parent (as
/// perftest's client is to its server process). Protocol on its
/// stdin/stdout: it prints `qpn Q`, reads `qpn S addr A rkey R`, brings
/// its QP up, prints `ready`, reads `go` (the parent stops it first, so
/// its loop runs in its turns only), runs `--child-n` round trips timed
/// like perftest's `run_iter_lat` and writes the samples to
/// `--child-out` in perftest's `-U` format.
pub fn child(a: &Args, op: &str) -> Result<(), String> {
    use std::io::{BufRead, Write};
    if a.child_sdk {
        return sdk_child(a, op);
    }
    let out = a.child_out.as_ref().ok_or("--child needs --child-out")?;
    let n = a.child_n;
    let nic = open(a)?;
    let side = Side::new(&nic, 4096);
    let caps = QpCaps {
        max_send_wr: a.depth,
        max_recv_wr: 1,
        ..QpCaps::default()
    };
    let qp = side.qp(QpType::Rc, caps, None, 0);
    let per_us = cycles_per_us();
    let limit = (per_us * 10_000_000.0) as u64;
    let mut stdin = std::io::stdin().lock();
    let say = |s: String| -> Result<(), String> {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{s}")
            .and_then(|()| o.flush())
            .map_err(|e| e.to_string())
    };
    say(format!("qpn {}", qp.qpn()))?;
    let mut line = String::new();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .step_by(2)
        .map(|w| {
            w.parse::<u64>()
                .map_err(|e| format!("child: {line:?}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let [mut sqpn, mut addr, mut rkey] = f[..] else {
        return Err(format!(
            "child: expected `qpn S addr A rkey R`, got {line:?}"
        ));
    };
    // `--child-pair`: the in-process provider's shape instead (a
    // second device context in this process holding the server QP).
    let server = if a.child_pair {
        let nb = open(a)?;
        let sb = Side::new(&nb, 4096);
        let sq = sb.qp(QpType::Rc, caps, None, 0);
        bring_up(
            &sq,
            krcore_nic::Access::ALL,
            Some(RcPeer {
                gid: nic.gid(),
                qpn: qp.qpn(),
            }),
        )
        .map_err(|e| e.to_string())?;
        let r = sb.mr.remote(0);
        (sqpn, addr, rkey) = (u64::from(sq.qpn()), r.addr, u64::from(r.rkey));
        Some((sb, sq))
    } else {
        None
    };
    bring_up(
        &qp,
        krcore_nic::Access::ALL,
        Some(RcPeer {
            gid: nic.gid(),
            qpn: sqpn as u32,
        }),
    )
    .map_err(|e| e.to_string())?;
    say("ready".into())?;
    line.clear();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "go" {
        return Err(format!("child: expected `go`, got {line:?}"));
    }
    let remote = krcore_nic::RemoteAddr {
        addr,
        rkey: rkey as u32,
    };
    let x = Cell::new(0u64);
    let _server = server;
    let prov = Prov {
        qp: &qp,
        cq: &side.cq,
        read: SendWr::read(1, side.mr.sge(0, 64).map_err(|e| e.to_string())?, remote),
        word: side.mr.sge(64, 8).map_err(|e| e.to_string())?,
        remote: remote.offset(128),
        x: &x,
    };
    let (_, mut one) = provider_contender(op, &prov, limit);
    if a.child_touch_pages == 0 {
        return write_post_to_post(out, n, || {
            let mut at = 0;
            one(&mut || at = cycles())?;
            Ok(at)
        });
    }
    // `--child-touch-pages`: one byte of each of N pages read per round
    // trip (after its completion, before the next post's stamp); a loop of
    // its own, so that the default loop carries none of it.
    let pages = vec![1u8; a.child_touch_pages * PAGE];
    write_post_to_post(out, n, || {
        let mut at = 0;
        one(&mut || at = cycles())?;
        // Through `black_box`: the reads are neither hoisted nor folded.
        let sum = std::hint::black_box(&pages)
            .chunks(PAGE)
            .fold(0u8, |s, page| s.wrapping_add(page[0]));
        std::hint::black_box(sum);
        Ok(at)
    })
}

/// Bytes per page for `--child-touch-pages`.
const PAGE: usize = 4096;

/// Runs `one` (a round trip returning its post's stamp) `n` times and
/// writes the `n - 1` post-to-post samples to `out` in perftest's `-U`
/// format.
fn write_post_to_post(
    out: &str,
    n: usize,
    mut one: impl FnMut() -> Result<u64, String>,
) -> Result<(), String> {
    let mut d = Vec::with_capacity(n);
    let mut prev: Option<u64> = None;
    for _ in 0..n {
        let at = one()?;
        if let Some(b) = prev {
            d.push(at.wrapping_sub(b));
        }
        prev = Some(at);
    }
    let mut text = String::from("#, cycles\n");
    for (i, v) in d.iter().enumerate() {
        text += &format!("{}, {v}\n", i + 1);
    }
    std::fs::write(out, text).map_err(|e| format!("{out}: {e}"))
}

/// The SDK's VQP (verbs level `post`/`poll`, RC fallback) in a child
/// process of its own (`--child OP --child-sdk`): a client node
/// (`Node::with_nic`, the SDK's real process shape: a node that only
/// connects out starts no engine thread) reading
/// the parent's meta host, connected to the parent's memory node.
/// Reads `meta GID DCT KEY ADDR RKEY region GID ADDR LEN RKEY ACCESS
/// EXPIRES` (GIDs in hex), connects, prints `ready`, reads `go`, then
/// runs and writes its samples like [`child`].
pub(super) fn sdk_child(a: &Args, op: &str) -> Result<(), String> {
    use std::io::{BufRead, Write};
    let out = a.child_out.as_ref().ok_or("--child needs --child-out")?;
    let mut stdin = std::io::stdin().lock();
    let say = |s: &str| -> Result<(), String> {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{s}")
            .and_then(|()| o.flush())
            .map_err(|e| e.to_string())
    };
    let mut line = String::new();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let bad = || format!("sdk child: cannot read {line:?}");
    if w.len() != 13 || w[0] != "meta" || w[6] != "region" {
        return Err(bad());
    }
    let gid = |h: &str| -> Result<Gid, String> {
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(h.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Gid(g))
    };
    let num = |x: &str| x.parse::<u64>().map_err(|_| bad());
    let loc = krcore_kmod::MetaLocation {
        server: krcore_nic::DcTarget {
            gid: gid(w[1])?,
            dct_num: num(w[2])? as u32,
            dc_key: num(w[3])?,
        },
        table: krcore_nic::RemoteAddr {
            addr: num(w[4])?,
            rkey: num(w[5])? as u32,
        },
        geometry: Geometry::with_buckets(64).map_err(|e| e.to_string())?,
    };
    let token = krcore::RemoteRegion {
        gid: gid(w[7])?,
        addr: num(w[8])?,
        len: num(w[9])?,
        rkey: num(w[10])? as u32,
        access: krcore_nic::Access(num(w[11])? as u32),
        expires_unix_ms: num(w[12])?,
    };
    // (On the parent's port: see `contenders::meta_host`.)
    let mut cfg = EngineConfig::default().with_meta(loc).with_port_lock(false);
    cfg.handshake = handshake(a.idle_sleep);
    if let Some(d) = a.sdk_depth {
        cfg.dci_depth = d;
    }
    let client = Node::with_nic(open(a)?, cfg).map_err(|e| format!("client: {e}"))?;
    let vqp = client
        .connect(token.gid)
        .map_err(|e| format!("connect: {e}"))?;
    // The region's rkey posted by hand, as the parent's contender does: the
    // grant rule's opt-out (the measured path is the same).
    vqp.set_ungranted(krcore::Ungranted::Allow)
        .map_err(|e| format!("set_ungranted: {e}"))?;
    let buf = client
        .alloc(64, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let per_us = cycles_per_us();
    let limit = (per_us * 10_000_000.0) as u64;
    say("ready")?;
    line.clear();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "go" {
        return Err(format!("sdk child: expected `go`, got {line:?}"));
    }
    // Words of its own in the region (the parent's contenders use 0..384).
    let (rd, word) = (
        buf.sge(0, 64).map_err(|e| e.to_string())?,
        buf.sge(0, 8).map_err(|e| e.to_string())?,
    );
    let mut x = 0u64;
    write_post_to_post(out, a.child_n, || {
        let mut wr = if op == "read64" {
            [SendWr::read(3, rd, token.at(1024))]
        } else {
            x += 1;
            [SendWr::cas(4, word, token.at(1152), x - 1, x)]
        };
        let at = cycles();
        vqp.post(&mut wr).map_err(|e| e.to_string())?;
        spin(limit, |wc| vqp.poll(wc).map_err(|e| e.to_string()))?;
        Ok(at)
    })
}

/// This program in child mode (`--child OP`) for `n` round trips writing
/// its samples to `out`, on the parent's device and GID index, with its
/// stdio piped.
fn child_command(a: &Args, op: &str, n: usize, out: &std::path::Path) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = Command::new(exe);
    c.args(["--child", op, "--child-n", &n.to_string(), "--child-out"])
        .arg(out)
        .args([
            "--device",
            &a.device,
            "--gid-index",
            &a.gid_index.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(c)
}

/// Spawns [`sdk_child`] for `op` with `n` round trips and stops it
/// before its loop.
pub(super) fn sdk_proc(a: &Args, k: &Sdk, op: &str, n: usize) -> Result<Proc, String> {
    use std::io::{BufRead, Write};
    let meta = k.meta.ok_or("the SDK has no meta location")?;
    let hex = |g: Gid| g.0.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let t = k.token;
    let out_path =
        std::env::temp_dir().join(format!("krcore_lat-{}-sdk-{op}.out", std::process::id()));
    let mut c = child_command(a, op, n, &out_path)?
        .arg("--child-sdk")
        .args(
            a.sdk_depth
                .map(|d| ["--sdk-depth".to_string(), d.to_string()])
                .into_iter()
                .flatten(),
        )
        .args(
            a.idle_sleep
                .map(|d| ["--idle-sleep-us".to_string(), d.as_micros().to_string()])
                .into_iter()
                .flatten(),
        )
        .spawn()
        .map_err(|e| format!("spawn the SDK child: {e}"))?;
    let r = (|| {
        let mut rd = std::io::BufReader::new(c.stdout.take().ok_or("no child stdout")?);
        let mut stdin = c.stdin.take().ok_or("no child stdin")?;
        writeln!(
            stdin,
            "meta {} {} {} {} {} region {} {} {} {} {} {}",
            hex(meta.server.gid),
            meta.server.dct_num,
            meta.server.dc_key,
            meta.table.addr,
            meta.table.rkey,
            hex(t.gid),
            t.addr,
            t.len,
            t.rkey,
            t.access.0,
            t.expires_unix_ms
        )
        .map_err(|e| e.to_string())?;
        let mut line = String::new();
        rd.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("SDK child said {line:?}"));
        }
        stop_now(&c)?;
        writeln!(stdin, "go").map_err(|e| e.to_string())
    })();
    match r {
        Ok(()) => Ok(Proc::new("sdk_vqp_proc", c, None, None, out_path, n, true)),
        Err(e) => {
            let _ = c.kill();
            let out = c.wait_with_output();
            Err(match out {
                Ok(o) => format!("{e}: {}", String::from_utf8_lossy(&o.stderr)),
                Err(_) => e,
            })
        }
    }
}

/// Spawns [`child`] for `op` with `n` round trips, connects it to a
/// server QP on `sb`, and stops it before its loop.
pub(super) fn provider_proc(
    a: &Args,
    pair: bool,
    op: &str,
    n: usize,
    sb: &Side<VerbsNic>,
    gid: Gid,
) -> Result<Proc, String> {
    use std::io::{BufRead, Write};
    let out_path = std::env::temp_dir().join(format!(
        "krcore_lat-{}-child-{op}-{pair}.out",
        std::process::id()
    ));
    let mut c = child_command(a, op, n, &out_path)?
        .args(["--depth", &a.depth.to_string()])
        .args(["--child-touch-pages", &a.child_touch_pages.to_string()])
        .args(pair.then_some("--child-pair"))
        .spawn()
        .map_err(|e| format!("spawn the provider child: {e}"))?;
    let r = (|| {
        let mut rd = std::io::BufReader::new(c.stdout.take().ok_or("no child stdout")?);
        let mut stdin = c.stdin.take().ok_or("no child stdin")?;
        let mut line = String::new();
        rd.read_line(&mut line).map_err(|e| e.to_string())?;
        let qpn: u32 = line
            .strip_prefix("qpn ")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("provider child said {line:?}"))?;
        let caps = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            ..QpCaps::default()
        };
        let sq = sb.qp(QpType::Rc, caps, None, 0);
        bring_up(&sq, krcore_nic::Access::ALL, Some(RcPeer { gid, qpn }))
            .map_err(|e| e.to_string())?;
        let r = sb.mr.remote(1024);
        writeln!(stdin, "qpn {} addr {} rkey {}", sq.qpn(), r.addr, r.rkey)
            .map_err(|e| e.to_string())?;
        line.clear();
        rd.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("provider child said {line:?}"));
        }
        stop_now(&c)?;
        writeln!(stdin, "go").map_err(|e| e.to_string())?;
        Ok(sq)
    })();
    match r {
        Ok(sq) => {
            let name = if pair {
                "provider_proc_pair"
            } else {
                "provider_proc"
            };
            Ok(Proc::new(name, c, None, Some(sq), out_path, n, true))
        }
        Err(e) => {
            let _ = c.kill();
            let _ = c.wait();
            Err(e)
        }
    }
}
