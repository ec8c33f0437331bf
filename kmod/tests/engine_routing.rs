//! Completion routing under threads: 4 threads, each with its own VQPs, on 2
//! shared DCIs (DC mode) or on ONE shared RC QP (RC fallback mode: every VQP
//! talks to the same target). Every user wr_id a thread signals comes back
//! exactly once, to the VQP that posted it, and nothing else does
//! (reference check against per-VQP sets of expected wr_ids).

mod common;

use std::any::Any;
use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::fallback::Fabric;
use common::{config, Cluster, WAIT};
use krcore_kmod::{EngineMode, Vqp, VqpError};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, MemoryRegion, SendWr, Wc, WcStatus};

const THREADS: usize = 4;
const VQPS_PER_THREAD: usize = 6;
const ROUNDS: usize = 150;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Polls `v` once, checking every completion against `expected`.
fn poll_check(v: &Vqp<SimNic>, expected: &mut HashSet<u64>, seen: &mut u64) {
    let mut buf = [Wc::default(); 16];
    let k = v.poll(&mut buf).unwrap();
    for wc in &buf[..k] {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.qp_num, v.id().get(), "another VQP's completion: {wc:?}");
        assert!(
            expected.remove(&wc.wr_id),
            "wr_id {:#x} not expected on {v:?} (foreign or duplicate)",
            wc.wr_id
        );
        *seen += 1;
    }
}

/// Posts `wrs` on `v`, polling (and checking) while the VQP is full;
/// fails the test when no room came back within [`WAIT`].
fn post_polling(v: &Vqp<SimNic>, wrs: &mut [SendWr], expected: &mut HashSet<u64>, seen: &mut u64) {
    let start = Instant::now();
    loop {
        match v.post_send(wrs) {
            Ok(()) => return,
            Err(VqpError::VqpFull { .. }) => poll_check(v, expected, seen),
            Err(e) => panic!("post: {e}"),
        }
        assert!(
            start.elapsed() < WAIT,
            "{v:?} stayed full for {WAIT:?} (completions lost?): {expected:?}"
        );
    }
}

#[test]
fn every_wr_id_comes_back_once_to_its_own_vqp() {
    run(EngineMode::Dc);
}

#[test]
fn every_wr_id_comes_back_once_to_its_own_vqp_on_an_rc_qp() {
    run(EngineMode::RcFallback);
}

fn run(mode: EngineMode) {
    let cfg = config(|cfg| {
        cfg.pool_size = 2;
        cfg.dci_depth = 64;
        cfg.vqp_depth = 32;
        cfg.handshake_thread = true;
    });
    let (_c, mem, client): (Box<dyn Any>, _, _) = match mode {
        EngineMode::Dc => {
            let c = Cluster::new();
            let (mem, client) = (c.memory_node(THREADS * 4096), c.engine(cfg));
            (Box::new(c), mem, client)
        }
        _ => {
            let f = Fabric::new();
            let (mem, client) = (f.memory_node(THREADS * 4096), f.engine(cfg));
            (Box::new(f), mem, client)
        }
    };
    let barrier = Barrier::new(THREADS);
    let mem = Arc::new(mem);
    let totals: Vec<(u64, u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (client, mem, barrier) = (&client, mem.clone(), &barrier);
                s.spawn(move || {
                    let local = client.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
                    let vqps: Vec<_> = (0..VQPS_PER_THREAD)
                        .map(|_| {
                            let v = client.create_vqp().unwrap();
                            v.connect(mem.gid()).unwrap();
                            v
                        })
                        .collect();
                    let mut expected: Vec<HashSet<u64>> = vec![HashSet::new(); VQPS_PER_THREAD];
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678));
                    let (mut posted, mut seen, mut faas) = (0u64, 0u64, 0u64);
                    let counter = t * 4096;
                    barrier.wait();
                    for round in 0..ROUNDS {
                        for (j, v) in vqps.iter().enumerate() {
                            let n = 1 + (rng.next() % 4) as usize;
                            let mut batch = Vec::with_capacity(n);
                            for k in 0..n {
                                let wr_id = ((t as u64) << 48)
                                    | ((j as u64) << 40)
                                    | ((round as u64) << 8)
                                    | k as u64;
                                let off = 8 * (1 + j * 8 + k);
                                let wr = match rng.next() % 3 {
                                    0 => SendWr::read(
                                        wr_id,
                                        local.sge(off, 8).unwrap(),
                                        mem.mr.remote(counter + off),
                                    ),
                                    1 => SendWr::write(
                                        wr_id,
                                        local.sge(off, 8).unwrap(),
                                        mem.mr.remote(counter + off),
                                    ),
                                    _ => {
                                        faas += 1;
                                        SendWr::faa(
                                            wr_id,
                                            local.sge(2048 + off, 8).unwrap(),
                                            mem.mr.remote(counter),
                                            1,
                                        )
                                    }
                                };
                                // Mostly unsignaled: the engine must force signals (pre-check (c)).
                                batch.push(wr.signaled(rng.next() % 4 == 0));
                            }
                            post_polling(v, &mut batch, &mut expected[j], &mut seen);
                            posted += n as u64;
                            for wr in &batch {
                                assert_eq!(wr.wr_id >> 48, t as u64, "wr_ids given back");
                                if wr.is_signaled() {
                                    assert!(expected[j].insert(wr.wr_id));
                                }
                            }
                            if rng.next() % 2 == 0 {
                                poll_check(v, &mut expected[j], &mut seen);
                            }
                        }
                    }
                    // Drain: every signaled wr_id must come back. Unsignaled
                    // tails are covered by a signaled WR of some VQP; post a
                    // last signaled READ on each VQP so nothing waits.
                    for (j, v) in vqps.iter().enumerate() {
                        let wr_id = ((t as u64) << 48) | ((j as u64) << 40) | 0xff_ffff;
                        let mut last = [SendWr::read(
                            wr_id,
                            local.sge(0, 8).unwrap(),
                            mem.mr.remote(counter),
                        )];
                        post_polling(v, &mut last, &mut expected[j], &mut seen);
                        posted += 1;
                        expected[j].insert(wr_id);
                    }
                    let start = Instant::now();
                    while expected.iter().any(|e| !e.is_empty()) {
                        for (j, v) in vqps.iter().enumerate() {
                            poll_check(v, &mut expected[j], &mut seen);
                        }
                        assert!(
                            start.elapsed() < WAIT,
                            "thread {t} still waits: {expected:?}"
                        );
                    }
                    for v in &vqps {
                        assert_eq!(v.outstanding(), 0, "{v:?}");
                    }
                    (posted, seen, faas)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, &(posted, seen, faas)) in totals.iter().enumerate() {
        assert!(posted > 1000, "thread {t} posted {posted}");
        assert!(seen > 0);
        assert_eq!(
            mem.mr.load_u64(t * 4096).unwrap(),
            faas,
            "thread {t}: every FAA executed exactly once"
        );
    }
    let all = client.stats();
    let s = match mode {
        EngineMode::Dc => {
            assert_eq!(all.dcis, 2);
            all.dci
        }
        _ => {
            assert_eq!((all.dcis, all.rc.pairs, all.rc.created), (0, 1, 1));
            all.rc.qp
        }
    };
    assert_eq!(s.error_completions, 0);
    assert_eq!(s.stale_completions, 0);
    assert_eq!(s.orphaned, 0);
    assert!(s.forced_signals > 0, "{s:?}");
    assert_eq!(
        s.wrs,
        totals.iter().map(|t| t.0).sum::<u64>(),
        "every posted WR went out once"
    );
    eprintln!("{mode}: {totals:?} {s:?}");
}

/// Posts `rounds` of 1-2 READs (mostly unsignaled; the last round's
/// signaled, so nothing waits) on each of `vqps`, in turn, and notes the
/// signaled wr_ids in `expected`.
fn post_rounds(
    vqps: &[Vqp<SimNic>],
    mem: &common::MemNode,
    local: &krcore_kmod::OwnedMr<SimNic>,
    rng: &mut Rng,
    rounds: std::ops::Range<u64>,
    expected: &mut [Vec<u64>],
) {
    let last = rounds.end - 1;
    for round in rounds {
        for (j, v) in vqps.iter().enumerate() {
            let n = 1 + (rng.next() % 2) as usize;
            let mut batch: Vec<SendWr> = (0..n)
                .map(|k| {
                    let wr_id = ((j as u64) << 32) | (round << 8) | k as u64;
                    let signaled = round == last || rng.next() % 3 == 0;
                    SendWr::read(wr_id, local.sge(8 * k, 8).unwrap(), mem.mr.remote(8 * k))
                        .signaled(signaled)
                })
                .collect();
            v.post_send(&mut batch).unwrap();
            expected[j].extend(batch.iter().filter(|w| w.is_signaled()).map(|w| w.wr_id));
        }
    }
}

/// Polls `v` with a 16-entry array until it has `expected`'s wr_ids, and
/// checks it got exactly those, in order, and nothing more. Returns the
/// largest count one poll returned.
fn poll_array(v: &Vqp<SimNic>, expected: &[u64]) -> usize {
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 16];
    let mut most = 0;
    let start = Instant::now();
    while got.len() < expected.len() {
        let k = v.poll(&mut buf).unwrap();
        most = most.max(k);
        for wc in &buf[..k] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert_eq!(wc.qp_num, v.id().get(), "another VQP's completion: {wc:?}");
            got.push(wc.wr_id);
        }
        assert!(start.elapsed() < WAIT, "{v:?} still waits: {got:x?}");
    }
    assert_eq!(got, expected, "{v:?}: its own completions, in order");
    assert_eq!(v.poll(&mut buf).unwrap(), 0, "nothing more for {v:?}");
    assert_eq!(v.outstanding(), 0, "{v:?}");
    most
}

/// Two VQPs on ONE DCI (mostly unsignaled WRs, so the engine forces
/// signals among them, completions the user did not ask for). First one
/// VQP alone: its array poll takes runs of its own completions, forced ones
/// among them. Then their WRs interleaved on the DCI: one VQP polls with a
/// 16-entry array while the other's completions sit between its own in the
/// CQ. Each gets exactly its own signaled wr_ids, in post order, and the
/// other's wait for it in order too.
#[test]
fn array_polls_get_exactly_their_own_completions_in_order() {
    let cfg = config(|cfg| {
        cfg.pool_size = 1;
        cfg.dci_depth = 64;
        cfg.vqp_depth = 32;
        cfg.policy.max_unsignaled = 2;
    });
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    let client = c.engine(cfg);
    let local = client.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let vqps: [Vqp<SimNic>; 2] = std::array::from_fn(|_| {
        let v = client.create_vqp().unwrap();
        v.connect(mem.gid()).unwrap();
        v
    });
    let mut rng = Rng(0x5eed);
    let mut expected: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    post_rounds(&vqps[..1], &mem, &local, &mut rng, 0..12, &mut expected);
    assert!(expected[0].len() > 2, "{expected:?}");
    let most = poll_array(&vqps[0], &expected[0]);
    assert!(most > 1, "one poll returned {most}");
    let solo = client.stats().dci;
    assert!(solo.forced_signals > 0, "{solo:?}");
    expected[0].clear();
    post_rounds(&vqps, &mem, &local, &mut rng, 12..24, &mut expected);
    assert!(
        expected[0].len() > 2 && expected[1].len() > 2,
        "{expected:?}"
    );
    for (v, expected) in vqps.iter().zip(&expected) {
        poll_array(v, expected);
    }
    let s = client.stats();
    assert_eq!(s.dcis, 1);
    let s = s.dci;
    assert_eq!(
        (s.error_completions, s.stale_completions, s.orphaned),
        (0, 0, 0)
    );
    assert!(s.forced_signals > solo.forced_signals, "{s:?}");
}
