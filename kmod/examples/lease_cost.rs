//! What a lease costs now that the NIC enforces it (a key of its own per
//! lease, `Nic::register_sub_mr`), and how promptly it ends.
//!
//! ```text
//! lease_cost [FABRIC] [LEASES] [ROUNDS]     # default: sim:mem 2000 3
//! lease_cost verbs:rxe0                     # Soft-RoCE, in the guest (ci/verbs.sh)
//! ```
//!
//! Per round, on an owner engine and a raw peer (an RC QP of the provider
//! on a second node or device context, no pre-check):
//!
//! - `lease`: the time of `OwnedMr::lease` (registering the lease's key),
//!   one 64-byte lease at a time, `LEASES` of them; `leases/s` from their
//!   total;
//! - `revoke`: the time of `OwnedMr::revoke` (the key is dead at the NIC
//!   when it returns: the revocation latency);
//! - `expiry lag`: 200 leases expiring 1..200 ms apart, ended by the
//!   engine's lease reaper alone: how long after its expiry each key was
//!   deregistered (the mean per round, the max over all rounds,
//!   `LeaseStats`);
//! - a check at the NIC: the peer READs through a lease's key (success),
//!   then after its revocation and after its expiry (`REM_ACCESS_ERR` both
//!   times); the tool exits 1 if the NIC answers otherwise.
//!
//! Figures are measured software time (the sim's latency model is off), the
//! median over the rounds with their range. Exit 1 on any failure.

use std::time::{Duration, Instant};

use krcore_kmod::{Engine, EngineConfig, Leased};
use krcore_nic::conformance::{poll_one, rc_pair, Side};
use krcore_nic::{Access, AnyNic, FabricSpec, MemoryRegion, Nic, QpCaps, RemoteAddr, SendWr};
use krcore_nic::{QueuePair, WcStatus};

fn main() {
    if let Err(e) = run() {
        eprintln!("lease_cost: {e}");
        std::process::exit(1);
    }
}

/// Two NICs that reach each other: two nodes of one sim fabric, or two
/// contexts of one verbs device.
fn open(spec: &str) -> Result<(AnyNic, AnyNic), String> {
    let spec = FabricSpec::parse(spec).map_err(|e| format!("{spec}: {e}"))?;
    let first = spec.open().map_err(|e| format!("open: {e}"))?;
    let second = match (&spec, &first.fabric) {
        (FabricSpec::Sim(s), Some(fabric)) => s
            .open_node(fabric)
            .map(AnyNic::Sim)
            .map_err(|e| format!("a second sim node: {e}"))?,
        _ => {
            spec.open()
                .map_err(|e| format!("a second context: {e}"))?
                .nic
        }
    };
    Ok((first.nic, second))
}

/// The peer's READ of 8 bytes at `at` on a fresh RC pair (a failed READ
/// moves its QP to ERR): the completion's status.
fn peer_read(peer: &Side<AnyNic>, owner: &Side<AnyNic>, at: RemoteAddr) -> WcStatus {
    let (qp, _target) = rc_pair(peer, owner, QpCaps::default());
    let wr = SendWr::read(1, peer.mr.sge(0, 8).expect("sge"), at);
    if qp.post_send(&[wr]).is_err() {
        return WcStatus::GeneralErr;
    }
    poll_one(&peer.cq).status
}

fn at(l: &Leased) -> RemoteAddr {
    RemoteAddr {
        addr: l.grant.addr,
        rkey: l.rkey,
    }
}

#[derive(Default)]
struct Round {
    lease_p50: f64,
    lease_p99: f64,
    per_sec: f64,
    revoke_p50: f64,
    revoke_p99: f64,
    lag_mean: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn round(
    engine: &Engine<AnyNic>,
    peer: &Side<AnyNic>,
    owner: &Side<AnyNic>,
    leases: usize,
) -> Result<Round, String> {
    let mr = engine
        .alloc_mr(1 << 20, Access::ALL)
        .map_err(|e| format!("alloc: {e}"))?;
    let hour = Instant::now() + Duration::from_secs(3600);
    let mut took = Vec::with_capacity(leases);
    let mut made = Vec::with_capacity(leases);
    let t0 = Instant::now();
    for i in 0..leases {
        let off = (i % 16_384) as u64 * 64;
        let t = Instant::now();
        let l = mr
            .lease(off, 64, Access::REMOTE_READ, hour)
            .map_err(|e| format!("lease {i}: {e}"))?;
        took.push(us(t.elapsed()));
        made.push(l);
    }
    let total = t0.elapsed();
    // The NIC's view of one of them: live, then revoked.
    let probe = made[0];
    mr.store_u64(0, 0x1ea5e).map_err(|e| e.to_string())?;
    let live = peer_read(peer, owner, at(&probe));
    let mut revoke = Vec::with_capacity(leases);
    for l in &made {
        let t = Instant::now();
        if !mr.revoke(l.id) {
            return Err(format!("lease {:?} was not live at its revocation", l.id));
        }
        revoke.push(us(t.elapsed()));
    }
    let revoked = peer_read(peer, owner, at(&probe));
    if (live, revoked) != (WcStatus::Success, WcStatus::RemAccessErr) {
        return Err(format!(
            "the NIC answered {live:?} for a live lease and {revoked:?} after its revocation"
        ));
    }
    // Expiry by the reaper alone.
    let before = engine.lease_stats();
    let start = Instant::now();
    let n = 200u32;
    let mut expiring = Vec::new();
    for k in 0..n {
        let end = start + Duration::from_millis(u64::from(k) + 1);
        let l = mr
            .lease(u64::from(k) * 64, 64, Access::REMOTE_READ, end)
            .map_err(|e| format!("lease: {e}"))?;
        expiring.push(l);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while engine.lease_stats().expired < before.expired + u64::from(n) {
        if Instant::now() > deadline {
            return Err("the lease reaper did not end the expired leases within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let after = engine.lease_stats();
    let expired = peer_read(peer, owner, at(&expiring[n as usize - 1]));
    if expired != WcStatus::RemAccessErr {
        return Err(format!(
            "the NIC answered {expired:?} after a lease expired"
        ));
    }
    let lags = after.expired - before.expired;
    let lag_total = after.expiry_lag_total - before.expiry_lag_total;
    Ok(Round {
        lease_p50: pct(&mut took, 0.5),
        lease_p99: pct(&mut took, 0.99),
        per_sec: leases as f64 / total.as_secs_f64(),
        revoke_p50: pct(&mut revoke, 0.5),
        revoke_p99: pct(&mut revoke, 0.99),
        lag_mean: us(lag_total) / lags as f64,
    })
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let spec = args.next().unwrap_or_else(|| "sim:mem".into());
    if spec == "--help" || spec == "-h" {
        println!("usage: lease_cost [FABRIC] [LEASES] [ROUNDS]   (default: sim:mem 2000 3)");
        return Ok(());
    }
    let leases: usize = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|_| format!("LEASES: not a number: {a}"))?,
        None => 2000,
    };
    let rounds: usize = match args.next() {
        Some(a) => a
            .parse()
            .map_err(|_| format!("ROUNDS: not a number: {a}"))?,
        None => 3,
    };
    if leases == 0 || rounds == 0 {
        return Err("LEASES and ROUNDS must be at least 1".into());
    }
    let (owner_nic, peer_nic) = open(&spec)?;
    let engine = Engine::start(owner_nic.clone(), EngineConfig::default().with_pool_size(1))
        .map_err(|e| format!("engine: {e}"))?;
    let peer = Side::new(&peer_nic, 4096);
    let owner = Side {
        nic: owner_nic.clone(),
        pd: engine.pd().clone(),
        cq: owner_nic.create_cq(64).map_err(|e| e.to_string())?,
        mr: owner_nic
            .alloc_mr(engine.pd(), 64, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?,
    };
    println!(
        "lease_cost on {spec} ({}): {leases} leases of 64 B per round, {rounds} rounds; measured software time",
        if spec.starts_with("sim") { "no latency model" } else { "the device" }
    );
    let mut all = Vec::new();
    for r in 0..rounds {
        let x = round(&engine, &peer, &owner, leases)?;
        println!(
            "round {r}: lease p50 {:.2} us p99 {:.2} us ({:.0} leases/s); revoke p50 {:.2} us p99 {:.2} us; expiry lag mean {:.0} us",
            x.lease_p50, x.lease_p99, x.per_sec, x.revoke_p50, x.revoke_p99, x.lag_mean
        );
        all.push(x);
    }
    let summary = |name: &str, unit: &str, f: fn(&Round) -> f64| {
        let mut v: Vec<f64> = all.iter().map(f).collect();
        let (lo, hi) = (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "{name}: {:.2} {unit} (median of {rounds}; {lo:.2}-{hi:.2})",
            pct(&mut v, 0.5)
        );
    };
    summary("lease (register its key) p50", "us", |x| x.lease_p50);
    summary("lease throughput", "leases/s", |x| x.per_sec);
    summary("revoke (key dead at the NIC on return) p50", "us", |x| {
        x.revoke_p50
    });
    summary("revoke p99", "us", |x| x.revoke_p99);
    summary("expiry lag mean", "us", |x| x.lag_mean);
    let s = engine.lease_stats();
    println!(
        "expiry lag max: {:.0} us (over all {} expired leases of the {rounds} rounds)",
        us(s.expiry_lag_max),
        s.expired
    );
    println!(
        "NIC check: lease key READ ok while live, REM_ACCESS_ERR after revoke and after expiry"
    );
    Ok(())
}
