//! Profiling loops for the verbs provider's post/poll path, made to run
//! under callgrind inside the Soft-RoCE guest.
//!
//! Opens `KRCORE_TEST_DEVICE` (else `SOFTROCE_DEV`) twice, GID index
//! `KRCORE_TEST_GID_INDEX` (else `SOFTROCE_GID_INDEX`, else 0), connects a
//! loopback RC pair and runs, each in an `#[inline(never)]` function of its
//! own (names `prof_loop_*`, so that callgrind can collect and dump each
//! one separately):
//! - `prof_loop_cas`: N 8-byte CAS round trips (one `post_send` of one WR,
//!   then `poll` until its completion);
//! - `prof_loop_read`: N 64-byte READ round trips, the same way;
//! - `prof_loop_empty_poll`: N polls of an empty CQ.
//!
//! Every completion is checked (status, `wr_id`, opcode) and every CAS
//! must succeed (the loop swaps the word it compared), so a broken path
//! fails the run instead of profiling garbage.
//!
//! Usage (build on the host, run in the guest from a directory it can write:
//! the guest's own paths, `/tmp` included, are a throw-away overlay; one
//! callgrind run per loop, collecting only inside it):
//!
//! ```text
//! cargo build --release -p krcore-nic --features verbs --example prof_verbs
//! ../shared/softroce/softroce-run -- valgrind --tool=callgrind \
//!   --callgrind-out-file=$PWD/cg.cas --toggle-collect='prof_verbs::prof_loop_cas' \
//!   $CARGO_TARGET_DIR/release/examples/prof_verbs 2000
//! callgrind_annotate --inclusive=yes cg.cas
//! ```
//!
//! The total of such a profile divided by N is the user-space Ir of one
//! operation (the warm-up round trips run outside the loop functions).
//! What raw verbs costs is the inclusive cost of rxe's user-space provider,
//! `librxe-rdmav34.so`, reached through `ibv_post_send` / `ibv_poll_cq`
//! (it has no symbols: two entry points `???:0x…` under that object, the
//! libc calls it makes, such as the doorbell `write`, included); the rest
//! is this provider's own work and the loop's (building the `SendWr`,
//! checking the `Wc`). Kernel time inside the system calls is not counted
//! by callgrind. Without valgrind the example prints wall-clock ns per
//! operation (emulated guest: for orientation only).
use krcore_nic::conformance::{rc_pair, Side};
use krcore_nic::verbs::{VerbsCq, VerbsNic, VerbsQp};
use krcore_nic::*;
use std::time::Instant;

/// Polls of an empty CQ before a round trip counts as lost.
const SPIN_LIMIT: u64 = 50_000_000;

fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok())
}

fn open() -> Result<VerbsNic, String> {
    let name = env_first(&["KRCORE_TEST_DEVICE", "SOFTROCE_DEV"])
        .ok_or("set KRCORE_TEST_DEVICE or SOFTROCE_DEV (run inside softroce-run)")?;
    let gid = match env_first(&["KRCORE_TEST_GID_INDEX", "SOFTROCE_GID_INDEX"]) {
        Some(s) => s
            .parse::<u8>()
            .map_err(|e| format!("GID index {s:?}: {e}"))?,
        None => 0,
    };
    VerbsNic::open(&name, gid).map_err(|e| format!("open {name}: {e}"))
}

/// Polls until one completion arrives; returns it and the empty polls seen.
#[inline(always)]
fn wait_one(cq: &VerbsCq, wc: &mut [Wc; 1]) -> Result<u64, String> {
    let mut empty = 0u64;
    loop {
        match cq.poll(wc) {
            Ok(1) => return Ok(empty),
            Ok(_) => {
                empty += 1;
                if empty >= SPIN_LIMIT {
                    return Err("no completion after the spin limit".into());
                }
            }
            Err(e) => return Err(format!("poll: {e}")),
        }
    }
}

fn check(wc: &Wc, wr_id: u64, op: WcOpcode) -> Result<(), String> {
    if wc.status != WcStatus::Success || wc.wr_id != wr_id || wc.opcode != op {
        return Err(format!("unexpected completion {wc:?} for wr_id {wr_id}"));
    }
    Ok(())
}

/// N round trips of the WR `wr(i)` builds (wr_id `i`), each checked to
/// complete as `op`; returns the empty polls seen.
#[inline(always)]
fn round_trips(
    qp: &VerbsQp,
    cq: &VerbsCq,
    n: u64,
    op: WcOpcode,
    wr: impl Fn(u64) -> SendWr,
) -> Result<u64, String> {
    let mut wc = [Wc::default()];
    let mut empty = 0;
    for i in 0..n {
        let wr = wr(i);
        qp.post_send(std::slice::from_ref(&wr))
            .map_err(|e| format!("post {op:?}: {e}"))?;
        empty += wait_one(cq, &mut wc)?;
        check(&wc[0], i, op)?;
    }
    Ok(empty)
}

/// N CAS round trips (the word goes `start`, `start + 1`, ...); returns
/// the empty polls seen.
#[inline(always)]
fn cas_body(
    qp: &VerbsQp,
    cq: &VerbsCq,
    word: Sge,
    remote: RemoteAddr,
    start: u64,
    n: u64,
) -> Result<u64, String> {
    round_trips(qp, cq, n, WcOpcode::CompSwap, |i| {
        SendWr::cas(i, word, remote, start + i, start + i + 1)
    })
}

/// N 64-byte READ round trips; returns the empty polls seen.
#[inline(always)]
fn read_body(
    qp: &VerbsQp,
    cq: &VerbsCq,
    local: Sge,
    remote: RemoteAddr,
    n: u64,
) -> Result<u64, String> {
    round_trips(qp, cq, n, WcOpcode::RdmaRead, |i| {
        SendWr::read(i, local, remote)
    })
}

#[inline(never)]
fn prof_loop_cas(
    qp: &VerbsQp,
    cq: &VerbsCq,
    word: Sge,
    remote: RemoteAddr,
    start: u64,
    n: u64,
) -> Result<u64, String> {
    cas_body(qp, cq, word, remote, start, n)
}

#[inline(never)]
fn prof_loop_read(
    qp: &VerbsQp,
    cq: &VerbsCq,
    local: Sge,
    remote: RemoteAddr,
    n: u64,
) -> Result<u64, String> {
    read_body(qp, cq, local, remote, n)
}

/// N polls of an empty CQ; returns how many found a completion (0).
#[inline(never)]
fn prof_loop_empty_poll(cq: &VerbsCq, n: u64) -> Result<u64, String> {
    let mut wc = [Wc::default()];
    let mut got = 0;
    for _ in 0..n {
        got += cq.poll(&mut wc).map_err(|e| format!("poll: {e}"))? as u64;
    }
    Ok(got)
}

fn run() -> Result<(), String> {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| format!("N {s:?}: {e}"))?,
        None => 2000,
    };
    let (a, b) = (open()?, open()?);
    let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let word = sa.mr.sge(64, 8).map_err(|e| e.to_string())?;
    let local = sa.mr.sge(0, 64).map_err(|e| e.to_string())?;
    let cas_at = sb.mr.remote(128);
    let remote = sb.mr.remote(0);
    // The target word starts at 0 (fresh MR); warm up both paths (AH,
    // buffers, first-touch) outside the measured loops.
    cas_body(&qa, &sa.cq, word, cas_at, 0, 16)?;
    read_body(&qa, &sa.cq, local, remote, 16)?;
    let before = a.counters();
    let t = Instant::now();
    let e_cas = prof_loop_cas(&qa, &sa.cq, word, cas_at, 16, n)?;
    let t_cas = t.elapsed();
    let t = Instant::now();
    let e_read = prof_loop_read(&qa, &sa.cq, local, remote, n)?;
    let t_read = t.elapsed();
    let t = Instant::now();
    let got = prof_loop_empty_poll(&sa.cq, n)?;
    let t_empty = t.elapsed();
    if got != 0 {
        return Err(format!("{got} completions on a CQ that should be empty"));
    }
    let d = a.counters() - before;
    if d.atomics != n || d.reads != n || d.doorbells != 2 * n {
        return Err(format!("counters do not match the loops: {d:?}"));
    }
    let per = |t: std::time::Duration| t.as_nanos() as f64 / n as f64;
    println!(
        "prof_verbs on {} (N {n}): CAS {:.0} ns/op ({e_cas} empty polls), \
         READ 64 B {:.0} ns/op ({e_read} empty polls), empty poll {:.0} ns",
        a.name(),
        per(t_cas),
        per(t_read),
        per(t_empty),
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("prof_verbs: {e}");
        std::process::exit(1);
    }
}
