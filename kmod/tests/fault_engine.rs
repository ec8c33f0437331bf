//! The control plane over a faulty NIC: a client engine on
//! `FaultNic<SimNic>` (delayed and reordered completions, WRs failing with
//! `RETRY_EXC_ERR`/`REM_ACCESS_ERR`, QPs forced to ERR, the memory node
//! dropped for a while) runs a random script of FAA / WRITE / READ on
//! several VQPs sharing ONE physical QP, against a reference model.
//!
//! The contract checked (it holds whether the engine reports innocent
//! flushed WRs as `WR_FLUSH_ERR` or re-posts them):
//! - every signaled WR completes exactly once, success or a typed error
//!   status; an unsignaled WR completes at most once, and only with an
//!   error; no completion names a WR that was not posted (on that VQP);
//! - successes are never wrong: a VQP's successful FAAs on its own counter
//!   return strictly increasing old values, all below the final counter,
//!   and the counter is between the successes and the successes plus the
//!   FAAs that failed (an error completion may or may not have executed);
//!   a READ returns 0 or a value this VQP wrote before it, never older
//!   than the last WRITE that completed successfully before it was posted;
//! - nothing hangs: every wait is bounded.
//!
//! `KRCORE_FAULT_SEEDS` (default 20) and `KRCORE_FAULT_OPS` (WRs per VQP,
//! default 40) scale the run.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::fallback::Fabric;
use common::{Cluster, MemNode};
use krcore_kmod::{Engine, EngineConfig, EngineError, OwnedMr, Vqp, VqpError};
use krcore_nic::fault::{FaultConfig, FaultNic, FaultStats};
use krcore_nic::sim::SimNic;
use krcore_nic::{
    Access, InlineData, MemoryRegion, Payload, RemoteAddr, SendFlags, SendWr, Wc, WcStatus, WrOp,
};

type Fnic = FaultNic<SimNic>;

const VQPS: usize = 4;
/// Local 8-byte result slots per VQP (more than it ever has in flight).
const RING: u64 = 16;
/// Bytes of a VQP's region at the memory node: counter at 0, word at 8.
const REGION: u64 = 64;
const WAIT: Duration = Duration::from_secs(10);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Faa,
    Write(u64),
    Read,
}

#[derive(Clone, Copy, Debug)]
struct Posted {
    seq: u64,
    kind: Kind,
    signaled: bool,
    slot: u64,
    done: Option<WcStatus>,
    /// FAA: old value; READ: the value read.
    value: Option<u64>,
}

struct Model {
    vqp: Vqp<Fnic>,
    idx: usize,
    next: u64,
    wrs: HashMap<u64, Posted>,
    /// Signaled WRs without a completion yet.
    pending: usize,
}

struct Run {
    client: Engine<Fnic>,
    local: OwnedMr<Fnic>,
    mem_gid: krcore_nic::Gid,
    remote: RemoteAddr,
    models: Vec<Model>,
    rng: u64,
}

fn rand(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

impl Run {
    fn new(client: Engine<Fnic>, mem: &MemNode, seed: u64) -> Run {
        let local = client
            .alloc_mr((VQPS as u64 * RING * 8) as usize, Access::LOCAL_WRITE)
            .unwrap();
        let models = (0..VQPS)
            .map(|idx| {
                let vqp = client.create_vqp().unwrap();
                Model {
                    vqp,
                    idx,
                    next: 0,
                    wrs: HashMap::new(),
                    pending: 0,
                }
            })
            .collect();
        let mut run = Run {
            client,
            local,
            mem_gid: mem.gid(),
            remote: mem.mr.remote(0),
            models,
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        };
        for i in 0..VQPS {
            run.connect(i);
        }
        run
    }

    /// Connects VQP `i`, retrying typed failures a bounded number of times.
    fn connect(&mut self, i: usize) -> bool {
        for _ in 0..20 {
            match self.models[i].vqp.connect(self.mem_gid) {
                Ok(()) => return true,
                Err(
                    EngineError::MetaUnavailable { .. }
                    | EngineError::MetaInconsistent { .. }
                    | EngineError::Handshake { .. }
                    | EngineError::UnknownNode { .. },
                ) => self.poll(i),
                Err(e) => panic!("connect failed untyped: {e:?}"),
            }
        }
        false
    }

    /// One random batch (1..=2 WRs) on VQP `i`.
    fn step(&mut self, i: usize) {
        let m = &self.models[i];
        if m.wrs.values().filter(|p| p.done.is_none()).count() as u64 + 2 > RING / 2 {
            self.poll(i);
            return;
        }
        let n = 1 + rand(&mut self.rng) % 2;
        let mut batch = Vec::new();
        let mut posted = Vec::new();
        for _ in 0..n {
            let m = &mut self.models[i];
            let seq = m.next;
            m.next += 1;
            let slot = seq % RING;
            let wr_id = (i as u64) << 32 | seq;
            let local = self
                .local
                .sge(((i as u64 * RING + slot) * 8) as usize, 8)
                .unwrap();
            let base = self.remote.offset(i as u64 * REGION);
            let r = rand(&mut self.rng);
            let (kind, wr) = match r % 3 {
                0 => (Kind::Faa, SendWr::faa(wr_id, local, base, 1)),
                1 => {
                    let v = (i as u64 + 1) << 48 | (seq + 1);
                    let wr = SendWr {
                        wr_id,
                        op: WrOp::Write {
                            remote: base.offset(8),
                        },
                        payload: Payload::Inline(InlineData::new(&v.to_le_bytes()).unwrap()),
                        flags: SendFlags::SIGNALED,
                        dest: krcore_nic::Destination::Connected,
                    };
                    (Kind::Write(v), wr)
                }
                _ => (Kind::Read, SendWr::read(wr_id, local, base.offset(8))),
            };
            // Inline WRITEs may go unsignaled (no local buffer to reuse).
            let signaled = !matches!(kind, Kind::Write(_)) || r % 7 != 0;
            batch.push(wr.signaled(signaled));
            posted.push((
                wr_id,
                Posted {
                    seq,
                    kind,
                    signaled,
                    slot,
                    done: None,
                    value: None,
                },
            ));
        }
        let accepted = match self.models[i].vqp.post_send(&mut batch) {
            Ok(()) => posted.len(),
            Err(VqpError::Post(e)) => e.index,
            Err(VqpError::NotConnected { .. }) => {
                self.connect(i);
                0
            }
            Err(
                VqpError::QueueBusy { .. }
                | VqpError::VqpFull { .. }
                | VqpError::Nic { .. }
                | VqpError::Rebind { .. },
            ) => {
                self.poll(i);
                0
            }
            Err(e) => panic!("post failed untyped: {e:?}"),
        };
        let m = &mut self.models[i];
        for (wr_id, p) in posted.into_iter().take(accepted) {
            if p.signaled {
                m.pending += 1;
            }
            m.wrs.insert(wr_id, p);
        }
    }

    /// Polls VQP `i` once and checks every completion against the model.
    fn poll(&mut self, i: usize) {
        let mut buf = [Wc::default(); 8];
        let k = match self.models[i].vqp.poll(&mut buf) {
            Ok(k) => k,
            Err(VqpError::Nic { .. }) => 0,
            Err(e) => panic!("poll failed untyped: {e:?}"),
        };
        for wc in &buf[..k] {
            let m = &mut self.models[i];
            let Some(p) = m.wrs.get_mut(&wc.wr_id) else {
                panic!("VQP {}: completion of a WR never posted: {wc:?}", m.idx);
            };
            assert!(p.done.is_none(), "VQP {}: second completion {wc:?}", m.idx);
            assert!(
                matches!(
                    wc.status,
                    WcStatus::Success
                        | WcStatus::RetryExcErr
                        | WcStatus::RemAccessErr
                        | WcStatus::WrFlushErr
                ),
                "VQP {}: unexpected status {wc:?}",
                m.idx
            );
            assert!(
                p.signaled || !wc.status.is_ok(),
                "VQP {}: a success completion of an unsignaled WR {wc:?}",
                m.idx
            );
            p.done = Some(wc.status);
            if p.signaled {
                m.pending -= 1;
            }
            if wc.status.is_ok() && matches!(p.kind, Kind::Faa | Kind::Read) {
                let at = ((i as u64 * RING + p.slot) * 8) as usize;
                p.value = Some(self.local.load_u64(at).unwrap());
            }
        }
    }

    /// Polls every VQP until no signaled WR is pending (bounded).
    fn drain(&mut self) {
        let start = Instant::now();
        while self.models.iter().any(|m| m.pending > 0) {
            for i in 0..VQPS {
                self.poll(i);
            }
            let left: Vec<usize> = self.models.iter().map(|m| m.pending).collect();
            assert!(
                start.elapsed() < WAIT,
                "signaled WRs never completed (lost completions): {left:?}"
            );
            std::thread::yield_now();
        }
    }

    /// The model checks of the module docs, against the memory node.
    fn check(&self, mem: &MemNode) -> (u64, u64) {
        let (mut ok, mut failed) = (0, 0);
        for m in &self.models {
            let mut wrs: Vec<&Posted> = m.wrs.values().collect();
            wrs.sort_by_key(|p| p.seq);
            let base = (m.idx as u64 * REGION) as usize;
            let counter = mem.mr.load_u64(base).unwrap();
            let (mut faa_ok, mut faa_err, mut last_old) = (0u64, 0u64, None);
            let mut last_ok_write = 0u64;
            let mut written = std::collections::HashSet::from([0u64]);
            for p in &wrs {
                match p.done {
                    Some(s) if s.is_ok() => ok += 1,
                    Some(_) => failed += 1,
                    None => assert!(!p.signaled, "VQP {}: lost completion {p:?}", m.idx),
                }
                match (p.kind, p.done) {
                    (Kind::Faa, Some(WcStatus::Success)) => {
                        let old = p.value.unwrap();
                        assert!(
                            last_old.is_none_or(|l| old > l),
                            "VQP {}: FAA old values not increasing: {old} after {last_old:?}",
                            m.idx
                        );
                        assert!(old < counter, "VQP {}: FAA old {old} >= {counter}", m.idx);
                        last_old = Some(old);
                        faa_ok += 1;
                    }
                    (Kind::Faa, _) => faa_err += 1,
                    (Kind::Write(v), done) => {
                        written.insert(v);
                        if done == Some(WcStatus::Success) {
                            last_ok_write = v;
                        }
                    }
                    (Kind::Read, Some(WcStatus::Success)) => {
                        let r = p.value.unwrap();
                        assert!(
                            written.contains(&r),
                            "VQP {}: READ seq {} returned {r:#x}, never written before it",
                            m.idx,
                            p.seq
                        );
                        assert!(
                            r >= last_ok_write,
                            "VQP {}: stale READ seq {}: {r:#x} < {last_ok_write:#x}",
                            m.idx,
                            p.seq
                        );
                    }
                    _ => {}
                }
            }
            assert!(
                (faa_ok..=faa_ok + faa_err).contains(&counter),
                "VQP {}: counter {counter} outside {faa_ok}..={}",
                m.idx,
                faa_ok + faa_err
            );
        }
        (ok, failed)
    }
}

fn script(client: Engine<Fnic>, mem: &MemNode, seed: u64) -> (u64, u64, FaultStats) {
    let ops = env("KRCORE_FAULT_OPS", 40);
    let mut run = Run::new(client, mem, seed);
    let steps = ops * VQPS as u64;
    let drop_at = (seed % 2 == 0).then_some((steps * 2 / 5, steps * 3 / 5));
    for s in 0..steps {
        if let Some((from, to)) = drop_at {
            if s == from {
                run.client.nic().drop_node(run.mem_gid);
            }
            if s == to {
                run.client.nic().restore_node(run.mem_gid);
            }
        }
        let i = (rand(&mut run.rng) % VQPS as u64) as usize;
        run.step(i);
        if rand(&mut run.rng) % 3 == 0 {
            run.poll(i);
        }
    }
    run.client.nic().restore_node(run.mem_gid);
    run.drain();
    let (ok, failed) = run.check(mem);
    (ok, failed, run.client.nic().stats())
}

fn engine_cfg() -> EngineConfig {
    // (Raw rkeys: the grant rule's opt-out.)
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_ungranted(krcore_kmod::Ungranted::Allow);
    cfg.prestart = 1;
    cfg.handshake_thread = true;
    cfg
}

fn fault_cfg(seed: u64) -> FaultConfig {
    FaultConfig {
        fail_ppm: 30_000,
        force_err_ppm: 10_000,
        ..FaultConfig::chaos(seed, 8)
    }
}

fn summarize(mode: &str, results: &[(u64, u64, FaultStats)]) {
    let ok: u64 = results.iter().map(|r| r.0).sum();
    let failed: u64 = results.iter().map(|r| r.1).sum();
    let injected: u64 = results
        .iter()
        .map(|r| r.2.failed_wrs + r.2.forced_errs + r.2.dropped_wrs)
        .sum();
    let delayed: u64 = results.iter().map(|r| r.2.delayed).sum();
    eprintln!(
        "{mode}: {} seeds, {ok} WRs ok, {failed} failed typed, {injected} faults injected, \
         {delayed} completions delayed",
        results.len()
    );
    assert!(ok > 0 && failed > 0 && injected > 0 && delayed > 0);
}

#[test]
fn dc_engine_survives_injected_faults() {
    let seeds = env("KRCORE_FAULT_SEEDS", 20);
    let mut results = Vec::new();
    for seed in 0..seeds {
        let c = Cluster::new();
        let mem = c.memory_node(VQPS * REGION as usize);
        let nic = FaultNic::new(c.nic(), fault_cfg(seed));
        let client = Engine::start(nic, engine_cfg().with_meta(c.location)).unwrap();
        results.push(script(client, &mem, seed));
    }
    summarize("DC", &results);
}

#[test]
fn rc_fallback_engine_survives_injected_faults() {
    let seeds = env("KRCORE_FAULT_SEEDS", 20);
    let mut results = Vec::new();
    for seed in 0..seeds {
        let f = Fabric::new();
        let mem = f.memory_node(VQPS * REGION as usize);
        let nic = FaultNic::new(f.nic(), fault_cfg(seed));
        let client = Engine::start(nic, engine_cfg().with_meta(f.location)).unwrap();
        results.push(script(client, &mem, seed));
    }
    summarize("RC fallback", &results);
}
