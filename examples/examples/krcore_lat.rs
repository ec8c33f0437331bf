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
//! Taking turns. In an emulated guest the speed of the same code drifts
//! between levels 2x and 4x apart, switching every few tens of
//! milliseconds to seconds (seen in perftest's own sample series, with
//! its client and server pinned to one vCPU or not, with one vCPU or two,
//! with hpet or acpi_pm as clocksource, and with qemu at a high priority
//! on the host). Runs measured one after the other (perftest's 0.2 s
//! loop, then ours) therefore drew their speed level independently, and
//! their ratio swung 0.5x to 2.3x per round. Now perftest's client and
//! our contenders take turns of `--slice-ms` (10 ms) within ONE window:
//! the client runs for a slice, is stopped (SIGSTOP), one of our
//! contenders runs alone for a slice (in rotation), the client is
//! continued, and so on until it exits; so both sides see the same
//! moments of the drifting guest. perftest prints every sample (`-U`):
//! the ones that span a stop (one per stop inside its loop, each at least
//! a slice long) are dropped and its figures are computed from the rest
//! exactly as its report does (its own report line is printed beside).
//! Our turns count when they fall inside perftest's timed loop: from its
//! first busy turn to its last, where busy means it made at least 16
//! `write` calls in its turn (`/proc/PID/io`; on rxe each post is one).
//! Our samples never span a gap between turns. During a process's turn
//! this process sleeps the whole slice in one sleep (it used to wake every
//! millisecond to poll for the exit: ten timer wake-ups and switches
//! inside perftest's turns, none inside ours).
//!
//! In-process vs. process contenders (a bias of the turn scheme, found
//! with the per-turn guest counters, `guest_per_turn` lines): on rxe a
//! READ's response runs in a tasklet; raised from the system call it wakes
//! `ksoftirqd`. A contender running in this process is preempted by it on
//! about every READ (`own_invol` equals `tasklet` per turn), while a
//! process that was stopped and is continued (perftest's client) is
//! preempted on only 40-70 % of them, and makes more round trips per
//! turn. The same provider code therefore measures about 1.0x perftest
//! as a stopped/continued child process and 1.2-1.4x in process. The fair
//! figures are the process contenders', treated exactly like perftest's
//! client (same SIGSTOP/SIGCONT turns, same cut of the samples):
//!
//! - `--proc`: `provider_proc`, the provider in a single-threaded child
//!   with one device context (perftest's client shape; server QP here);
//!   `--proc-pair`: `provider_proc_pair`, a child with the in-process
//!   shape (two contexts, the server QP inside) to tell the two apart;
//! - `--proc-sdk`: `sdk_vqp_proc`, the SDK's VQP (verbs level) in a child
//!   node (`Node::with_nic`, the SDK's real shape of a compute node: it
//!   only connects out, so it runs no engine thread), reading this
//!   process's meta host;
//! - `--calibrate`: per round and operation one more window in which a
//!   second perftest client (`perftest_b`) takes turns with perftest (both
//!   from their start, one to one): perftest against itself, the tool's
//!   own spread. (In the main window a second client would still be in its
//!   setup when perftest's loop ends.)
//!
//! What the CAS ratio measures. On rxe the kernel runs a CAS's whole round
//! trip inside the post's system call (a READ's response runs in a tasklet
//! while the post returns), so nothing overlaps the user-space work around
//! it. In the emulated guest what that work costs is mostly its
//! out-of-line calls, not its instructions: a scratch variant of the
//! provider's CAS contender, taking turns alone beside it (8 rounds of
//! 3,000), was 2 % slower with 500 more instructions in registers, 3 %
//! with 64 more cache lines over 32 pages, and 21 % with 64 more calls of
//! distinct tiny functions (probably because a return is an indirect
//! jump the emulator must look up, with the kernel's long CAS path
//! keeping its lookup cache cold; not confirmed).
//! The hot path is therefore inlined from the SDK's `post`/`poll` down to
//! `ibv_post_send`/`ibv_poll_cq` (callgrind shows no out-of-line call of
//! ours left in either contender's round trip). The other large cost is
//! a second thread in the process, even a sleeping one: glibc then wraps
//! librxe's doorbell `write` in its cancellation calls and the kernel
//! takes its shared-file-table path. The same binary with the provider's
//! former async-event thread not started measured 1.033-1.060x perftest on
//! CAS instead of 1.107-1.131x (two runs each, 4 rounds); the provider now
//! starts no thread, and a node that only connects out runs no engine
//! thread, so both children are single-threaded like perftest's client
//! (`threads=` in the per-turn diagnostics). What then still separated
//! the SDK's child from the provider's (1.11-1.16x against 1.04-1.07x
//! perftest on CAS) was the SDK's own per-operation code, not its
//! process: a scratch SDK child that connected as usual and then posted
//! and polled the engine's RC pair through the provider directly (same
//! process, pair, QP and buffers) had a CAS ratio of minima 0.6 % over
//! the provider's child (the real SDK child: 7 %); giving the SDK's QP the
//! provider's shape (`--sdk-depth 16`, `--depth 128`) moved neither past
//! its spread. In this guest user-space work right after the kernel's
//! long CAS path is far dearer than in a hot loop: perftest's client
//! (about 500 instructions per CAS), the provider (about 630 single-
//! threaded) and the SDK (about 1,000) line up at roughly 0.03 % of the
//! round trip per instruction, where 500 more instructions in a register
//! loop cost 2 %; and reading one byte of each of 16 (48) more pages per
//! round trip (`--child-touch-pages`, two runs each) made the provider's
//! child 5 % (8 %) slower. Per CAS round trip the SDK's VQP touched 9 more
//! data pages and 5 more code pages than the provider (medians 45 and 26
//! against 36 and 21; `--prof 300` under valgrind's lackey in the guest,
//! split at the marker byte). The engine's hot path was then reshaped for
//! footprint: a post reads the MR generation and the RC pairs' clock from
//! one small shared allocation (not the engine's state and the MR
//! registry's, three pages), a shared QP is aligned so that it never
//! straddles a page and keeps a sole VQP's state inline, and the VQP's
//! post and poll inline ONE copy of the shared QP's code for both
//! transports (the binding only names the QP): the SDK loop's hot code
//! spans 3 pages instead of 5 (callgrind with `--dump-instr=yes` in the
//! guest) at the same instruction count. Six alternating runs of 4 rounds
//! each, before and after: the SDK's CAS p50 ratio 1.105 -> 1.071 (mean),
//! its excess over the provider's child +0.056 -> -0.002. Both clients make
//! exactly one system call per operation (a 32 B `write` on the uverbs fd,
//! strace) and post the same WR (one 8 B SGE, signaled, `max_rd_atomic` the
//! device maximum as perftest's `out_reads`). User-space instructions per
//! CAS, counted with callgrind inside the guest (load-independent, `--prof`
//! below): perftest's client about 500 in its loop (librxe's post and poll
//! about 270 of them); the provider 670 (librxe 312); the SDK's VQP
//! 1,035 (the engine and the SDK together about 365 over the
//! provider's), both counted in this tool's multi-threaded process, where
//! the doorbell's `write` and its cancellation calls cost about 40
//! more than in a single-threaded child.
//!
//! A process contender waits for perftest's loop before its first turn,
//! runs `2 * iters` round trips, and is compared with perftest over the
//! turns where both were in their loops: each sample series is split at
//! its stop-spanning samples and the pieces are matched to the turns by
//! their write calls (`aligned=true`); when that fails both are taken
//! whole with their stops cut (`aligned=false`).
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
//! `--no-perftest`, `--no-sdk`, `--slice-ms N` (length of a turn, 10),
//! `--depth N` (send queue depth of the provider's QP, 16; perftest's
//! latency tests use 1), `--sdk-depth N` (the SDK nodes' `dci_depth`: their
//! shared QPs' send queue and CQ depth; the engine's default, 128),
//! `--child-touch-pages N` (the provider's child also reads one byte of
//! each of N pages of its own per round trip: the price of a page of
//! per-operation footprint), `--proc`, `--proc-pair`, `--proc-sdk`,
//! `--calibrate` (above; off by default), `--prof N` (only N round trips
//! per contender and operation in named loops, for callgrind; no timing),
//! `--idle-sleep-us N` (idle sleep of the
//! background threads of the latency phase's SDK nodes: meta host and
//! handshake responders; default 20,000 us, where the engine's is 100 us).
//! They serve connects only; on a small emulated guest their wake-ups every
//! 100 us load every contender, perftest included: with the engine's
//! default, perftest's own 64 B READ p50 rose from about 145 us to about
//! 580 us in a 2-vCPU Soft-RoCE guest. Pass `--idle-sleep-us 100` to measure
//! with the engine's default. The connect phase always uses the engine's
//! default).
//!
//! Output: `key=value` lines; per round and operation one line on the
//! turns (how many, how many inside perftest's loop) and one per contender;
//! the `summary` lines give, per operation, each contender's median over
//! rounds of its p50 and p99, and the median over rounds of the ratio
//! contender/perftest of the same round (same window). The `interleaved`
//! lines compare the SDK with the provider op by op (one round trip of each
//! in turn), the post (stamp to the post's return) and the completion (the
//! post's return to the completion) apart. The tool fails (exit 1) when an
//! operation fails; it never judges the figures.

#[cfg(feature = "verbs")]
fn main() {
    let code = match lat::parse().and_then(|a| match a.child.clone() {
        Some(op) => lat::child(&a, &op),
        None => lat::run(&a),
    }) {
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
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    // The process contenders; in `examples/lat/` (no `main.rs`: not an
    // example of its own).
    mod contenders;
    mod perftest;
    mod procs;
    use contenders::*;
    use perftest::*;
    pub use procs::child;
    use procs::{busy, cut_stops, proc_turn, provider_proc, sdk_proc, Diag, Proc, ProcFigures};

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
        slice_ms: u64,
        depth: u32,
        /// `--sdk-depth N`: the SDK nodes' `dci_depth` (the send queue and
        /// CQ depth of their shared QPs) instead of the engine's default.
        sdk_depth: Option<u32>,
        /// `--child-touch-pages N`: the provider's child reads one byte
        /// from each of N pages of its own per round trip (prices a page
        /// of per-operation memory footprint, see the module docs).
        child_touch_pages: usize,
        /// A second perftest client in the rotation (perftest vs itself).
        calibrate: bool,
        /// The provider in a child process of its own in the rotation.
        proc_provider: bool,
        /// Also a child with the in-process provider's shape.
        proc_pair: bool,
        child_pair: bool,
        /// Also the SDK's VQP in a child process.
        proc_sdk: bool,
        child_sdk: bool,
        /// Child mode (`--child OP`, internal): see [`child`].
        pub child: Option<String>,
        child_n: usize,
        child_out: Option<String>,
        /// `--prof N`: only N round trips per contender and operation in
        /// named loops (for callgrind), no timing.
        prof: usize,
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
            slice_ms: 10,
            depth: 16,
            sdk_depth: None,
            child_touch_pages: 0,
            calibrate: false,
            proc_provider: false,
            proc_pair: false,
            child_pair: false,
            proc_sdk: false,
            child_sdk: false,
            child: None,
            child_n: 0,
            child_out: None,
            prof: 0,
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
                "--calibrate" => a.calibrate = true,
                "--proc" => a.proc_provider = true,
                "--proc-pair" => a.proc_pair = true,
                "--child-pair" => a.child_pair = true,
                "--proc-sdk" => a.proc_sdk = true,
                "--child-sdk" => a.child_sdk = true,
                "--child" => a.child = Some(v()?),
                "--child-n" => a.child_n = num(&k, v()?)?,
                "--child-out" => a.child_out = Some(v()?),
                "--prof" => a.prof = num(&k, v()?)?,
                "--depth" => a.depth = num(&k, v()?)?.max(1) as u32,
                "--child-touch-pages" => a.child_touch_pages = num(&k, v()?)?,
                "--sdk-depth" => {
                    a.sdk_depth =
                        Some(u32::try_from(num(&k, v()?)?).map_err(|e| format!("{k}: {e}"))?)
                }
                "--slice-ms" => a.slice_ms = num(&k, v()?)?.max(1) as u64,
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

    /// p50 (`t_typical`), p99 and min of post-to-post samples (cycles),
    /// computed as perftest's `print_report_lat` does: sorted, the
    /// `LAT_MEASURE_TAIL` (2) largest dropped, `get_median`, and the sample
    /// at `ceil(0.99 m)`.
    fn lat_stats(mut d: Vec<u64>) -> Result<(f64, f64, f64), String> {
        if d.len() < 5 {
            return Err(format!("only {} samples", d.len()));
        }
        d.sort_unstable();
        let m = d.len() - 2; // LAT_MEASURE_TAIL
        let median = if (m - 1) % 2 == 1 {
            (d[m / 2] + d[m / 2 - 1]) as f64 / 2.0
        } else {
            d[m / 2] as f64
        };
        let i99 = ((m as f64) * 0.99).ceil() as usize;
        Ok((median, d[i99.min(d.len() - 1)] as f64, d[0] as f64))
    }

    /// One contender: posts one signaled WR, stamping (the closure it is
    /// given) right before the post, and spins on its completion.
    type Contender<'a> = (&'static str, Box<ContenderFn<'a>>);

    /// A contender's round trip (see [`Contender`]).
    type ContenderFn<'a> = dyn FnMut(&mut dyn FnMut()) -> Result<Option<Spun>, String> + 'a;

    /// Samples of one contender: post-to-post cycles, and what [`spin`]
    /// saw (post cost, empty polls).
    #[derive(Default)]
    struct Pool {
        d: Vec<u64>,
        post: Vec<f64>,
        spins: Vec<f64>,
    }

    impl Pool {
        fn extend(&mut self, o: Pool) {
            self.d.extend(o.d);
            self.post.extend(o.post);
            self.spins.extend(o.spins);
        }

        fn timing(self) -> Result<Timing, String> {
            let (p50, p99, min) = lat_stats(self.d)?;
            let m = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
            Ok(Timing {
                p50,
                p99,
                min,
                post: m(self.post),
                spins: m(self.spins),
            })
        }
    }

    /// One turn: contender `k % n` alone (as perftest runs alone), round
    /// trips back to back for `slice` cycles. The samples are the
    /// differences of consecutive post stamps (perftest's post to post);
    /// none spans the gap between two turns.
    fn turn(ours: &mut [Contender<'_>], k: usize, slice: u64) -> Result<Vec<Pool>, String> {
        let mut pools: Vec<Pool> = ours.iter().map(|_| Pool::default()).collect();
        let j = k % ours.len();
        let p = &mut pools[j];
        let one = &mut ours[j].1;
        let start = cycles();
        let mut prev: Option<u64> = None;
        loop {
            let mut at = 0;
            let r = one(&mut || at = cycles())?;
            if let Some(b) = prev {
                p.d.push(at.wrapping_sub(b));
            }
            prev = Some(at);
            if let Some(r) = r {
                p.post.push(r.posted_at.wrapping_sub(at) as f64);
                p.spins.push(f64::from(r.spins));
            }
            if cycles().wrapping_sub(start) >= slice {
                return Ok(pools);
            }
        }
    }

    /// Our contenders without perftest: turns until each has `iters`
    /// samples.
    fn alone(ours: &mut [Contender<'_>], iters: usize, slice: u64) -> Result<Vec<Timing>, String> {
        let mut pools: Vec<Pool> = ours.iter().map(|_| Pool::default()).collect();
        let mut k = 0;
        while pools.iter().any(|p| p.d.len() < iters) {
            for (p, t) in pools.iter_mut().zip(turn(ours, k, slice)?) {
                p.extend(t);
            }
            k += 1;
        }
        pools.into_iter().map(Pool::timing).collect()
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

    /// Figures by (operation, contender), then by round.
    type Samples = BTreeMap<(&'static str, &'static str), BTreeMap<usize, Timing>>;

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
            max_send_wr: a.depth,
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
        // The process contenders' perftest figures over their own windows.
        let mut own_base: Samples = BTreeMap::new();
        // CAS values, one sequence per word: every CAS succeeds.
        let (xp, xv, xr) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
        let prov = Prov {
            qp: &qa,
            cq: &sa.cq,
            read: SendWr::read(1, local, sb.mr.remote(0)),
            word,
            remote: sb.mr.remote(128),
            x: &xp,
        };
        if a.prof > 0 {
            return prof(a, &prov, sdk.as_ref(), (&xv, &xr), limit);
        }
        let slice = (a.slice_ms as f64 * 1000.0 * per_us) as u64;
        if has_perftest {
            println!("turns slice_ms={}", a.slice_ms);
        }
        for round in 0..a.rounds {
            let mut ops = ["read64", "cas8"];
            if round % 2 == 1 {
                ops.reverse(); // no operation always runs first
            }
            for op in ops {
                let mut ours: Vec<Contender<'_>> = vec![provider_contender(op, &prov, limit)];
                if let Some(k) = &sdk {
                    sdk_contenders(k, op, (&xv, &xr), limit, &mut ours)?;
                }
                if round % 2 == 1 {
                    ours.reverse(); // the rotation starts with another one
                }
                // Warm-up, not recorded.
                for (_, one) in ours.iter_mut() {
                    for _ in 0..100 {
                        one(&mut || {})?;
                    }
                }
                let mut got: Vec<(&'static str, Option<Timing>)> = Vec::new();
                if has_perftest {
                    let (tool, extra): (&str, &[&str]) = if op == "read64" {
                        ("ib_read_lat", &["-s", "64"])
                    } else {
                        ("ib_atomic_lat", &["-A", "CMP_AND_SWAP"])
                    };
                    // The window with our contenders, then (--calibrate)
                    // one of perftest against itself.
                    for calib in [false, true] {
                        if calib && !a.calibrate {
                            continue;
                        }
                        let mut procs = Vec::new();
                        if a.proc_provider && !calib {
                            // Sized like perftest_b (see `with_perftest`).
                            let n = (2 * a.iters).max(5);
                            procs.push(provider_proc(a, false, op, n, &sb, nic_b.gid())?);
                        }
                        if let (true, false, Some(k)) = (a.proc_sdk, calib, &sdk) {
                            let n = (2 * a.iters).max(5);
                            procs.push(sdk_proc(a, k, op, n)?);
                        }
                        if a.proc_pair && !calib {
                            let n = (2 * a.iters).max(5);
                            procs.push(provider_proc(a, true, op, n, &sb, nic_b.gid())?);
                        }
                        let mut none: Vec<Contender<'_>> = Vec::new();
                        let contenders = if calib { &mut none } else { &mut ours };
                        let w = with_perftest(a, tool, extra, contenders, procs, slice, calib)?;
                        let (win, a_name) = if calib {
                            (" window=calibration", "perftest_a")
                        } else {
                            ("", "perftest")
                        };
                        println!(
                            "round={round} op={op}{win} turns={} accepted={} perftest_stops_in_loop={} perftest_report_p50_cycles={:.0} perftest_report_p99_cycles={:.0}",
                            w.turns, w.accepted, w.stops_in_loop, w.report.0, w.report.1
                        );
                        for (who, d) in &w.diag {
                            let who = if *who == "perftest" { a_name } else { who };
                            println!(
                                "round={round} op={op} who={who} guest_per_turn {}",
                                d.line()
                            );
                        }
                        if !calib {
                            got.push(("perftest", Some(w.perftest)));
                            got.extend(ours.iter().map(|c| c.0).zip(w.ours));
                        }
                        for f in w.procs {
                            println!(
                                "round={round} op={op} who={} aligned={} window_turns={}/{} perftest_in_window_p50_cycles={:.0} perftest_in_window_p99_cycles={:.0}",
                                f.name, f.aligned, f.turns.0, f.turns.1, f.perftest.p50, f.perftest.p99
                            );
                            got.push((f.name, Some(f.ours)));
                            own_base
                                .entry((op, f.name))
                                .or_default()
                                .insert(round, f.perftest);
                        }
                    }
                } else {
                    let t = alone(&mut ours, a.iters, slice)?;
                    got.extend(ours.iter().map(|c| c.0).zip(t.into_iter().map(Some)));
                }
                let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
                for (who, r) in got {
                    let Some(r) = r else {
                        println!("round={round} op={op} who={who} no_turn_inside_perftest_loop");
                        continue;
                    };
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
                    s.entry((op, who)).or_default().insert(round, r);
                }
            }
        }
        for op in ["read64", "cas8"] {
            for who in [
                "perftest",
                "perftest_b",
                "provider",
                "provider_proc",
                "provider_proc_pair",
                "sdk_vqp",
                "sdk_vqp_proc",
                "sdk_request",
            ] {
                let Some(v) = s.get(&(op, who)) else { continue };
                let p50 = median(v.values().map(|r| r.p50).collect());
                let p99 = median(v.values().map(|r| r.p99).collect());
                let mut line = format!(
                    "summary op={op} who={who} rounds={} p50_us={:.2} p99_us={:.2}",
                    v.len(),
                    p50 / mhz,
                    p99 / mhz
                );
                if let Some(post) = v.values().map(|r| r.post).collect::<Option<Vec<_>>>() {
                    line += &format!(" post_cycles={:.0}", median(post));
                }
                if let Some(sp) = v.values().map(|r| r.spins).collect::<Option<Vec<_>>>() {
                    line += &format!(" empty_polls={:.0}", median(sp));
                }
                // Ratios of the same round (the same window of turns).
                let base = own_base
                    .get(&(op, who))
                    .or_else(|| s.get(&(op, "perftest")))
                    .cloned();
                let pairs: Vec<(&Timing, &Timing)> = base
                    .iter()
                    .flat_map(|b| v.iter().filter_map(|(i, r)| Some((r, b.get(i)?))))
                    .collect();
                if !pairs.is_empty() {
                    let ratio = |f: fn(&Timing) -> f64| -> Vec<f64> {
                        pairs.iter().map(|(r, b)| f(r) / f(b)).collect()
                    };
                    let r50 = ratio(|t| t.p50);
                    let (lo, hi) = r50.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                        (lo.min(x), hi.max(x))
                    });
                    line += &format!(
                        " ratio_p50_vs_perftest={:.3} (rounds {lo:.2}..{hi:.2}) ratio_p99_vs_perftest={:.3} ratio_min_vs_perftest={:.3}",
                        median(r50),
                        median(ratio(|t| t.p99)),
                        median(ratio(|t| t.min))
                    );
                }
                println!("{line}");
            }
        }
        if let Some(k) = &sdk {
            // The SDK's own cost, op by op against the provider: one round
            // trip of each in turn, so both see the same moment of a
            // drifting machine. The post (stamp to the post's return) and
            // the completion (the post's return to the completion) apart:
            // on rxe the post is a system call that runs the whole round
            // trip in the kernel, so what the completion part costs is
            // user space only.
            for op in ["read64", "cas8"] {
                let mut ours = vec![provider_contender(op, &prov, limit)];
                sdk_contenders(k, op, (&xv, &xr), limit, &mut ours)?;
                let r = interleaved(a.iters, &mut ours)?;
                let base = r[0].total;
                for (who, f) in ours.iter().map(|c| c.0).zip(&r) {
                    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
                    println!(
                        "interleaved op={op} who={who} p50_us={:.2} ratio_vs_provider={:.3} total_cycles={:.0} post_cycles={} completion_cycles={} empty_polls={}",
                        f.total / mhz,
                        f.total / base,
                        f.total,
                        opt(f.post),
                        opt(f.completion),
                        opt(f.spins)
                    );
                }
            }
        }
        drop(sdk);
        connect_cost(a, &sa, &sb, &nic_a, per_us)
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
            let qpn = |v: &krcore::Vqp<_>| v.raw().and_then(|r| r.physical_qpn());
            if qpn(&v1) != qpn(&v2) {
                return Err("the second connect did not share the first's RC pair".into());
            }
            let st = c.engine().map_err(|e| format!("engine: {e}"))?.stats();
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
