//! DC mode: the hybrid DC -> RC upgrade. A VQP under sustained traffic (FAA
//! on a remote counter, WRITE then READ of a remote log) moves to an RC pair
//! mid-stream, by threshold or by hint, and its results are checked against
//! the sequential log: every FAA old value exactly once and in order, every
//! READ sees the WRITE before it, every completion once, in posting order.

mod common;

use common::{Cluster, MemNode};
use krcore_kmod::{Engine, EngineConfig, EngineError, EngineStats, OwnedMr, Vqp, VqpPath};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, DcTarget, MemoryRegion, SendWr, Wc, WcStatus};

/// Rounds one workload can run (local buffer size).
const MAX_ROUNDS: usize = 1024;
/// Log slots on the target.
const LOG: usize = 64;

/// A memory node whose engine answers upgrade handshakes, registered under
/// its GID and its handshake name.
fn upgradable_node(c: &Cluster, len: usize) -> MemNode {
    c.upgradable_node(
        EngineConfig::default()
            .with_pool_size(1)
            .with_upgrade_endpoint(true)
            .with_handshake_thread(true),
        len,
    )
}

/// A client engine. Its handshakes wait generously for answers (a loaded
/// machine can delay the target's handshake thread past the default 20 ms
/// times 5): tests that expect a timeout set their own.
fn client(c: &Cluster, f: impl FnOnce(EngineConfig) -> EngineConfig) -> Engine<SimNic> {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true);
    cfg.handshake.timeout = std::time::Duration::from_millis(500);
    c.engine(f(cfg))
}

/// Waits (bounded) until no background build of `e`'s is in flight: an
/// upgrade by threshold asks the builder thread for the pair and keeps
/// posting on DC; the VQP takes the pair (or the failure) at its next look.
fn wait_builds(e: &Engine<SimNic>) {
    let start = std::time::Instant::now();
    loop {
        let s = e.stats().rc;
        if s.builds == s.builds_done {
            return;
        }
        assert!(start.elapsed() < common::WAIT, "a build never ended: {s:?}");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// One VQP's sequential workload on one target region: round `i` posts
/// FAA(counter, +1), WRITE(log[i % LOG] = i), READ(log[i % LOG]) as one
/// batch; `window` rounds are posted before their completions are polled.
struct Workload<'a> {
    v: Vqp<SimNic>,
    buf: OwnedMr<SimNic>,
    mem: &'a MemNode,
    /// Offset of this workload's counter (and log after it) on the target.
    base: usize,
    next: usize,
    next_wc: u64,
    /// Transports seen at each post, in order.
    seen: Vec<VqpPath>,
}

impl<'a> Workload<'a> {
    fn new(e: &Engine<SimNic>, mem: &'a MemNode, base: usize) -> Workload<'a> {
        let v = e.create_vqp().unwrap();
        v.connect(mem.gid()).unwrap();
        // Warm the DCCache with the target's handshake entry, so that the
        // upgrade reads no meta entry: a meta READ shares the VQP's DCI and
        // its wait polls that DCI, which would retire this VQP's WRs in
        // flight and move the switch point the tests pin down. (A target
        // without an endpoint has no such entry.)
        let _ = e.resolve(&krcore_kmod::engine::handshake_gid(&mem.gid()));
        let buf = e.alloc_mr(MAX_ROUNDS * 24, Access::ALL).unwrap();
        Workload {
            v,
            buf,
            mem,
            base,
            next: 0,
            next_wc: 0,
            seen: Vec::new(),
        }
    }

    fn post_round(&mut self) {
        let i = self.next;
        assert!(i < MAX_ROUNDS);
        self.next += 1;
        let src = 2 * MAX_ROUNDS * 8 + i * 8;
        self.buf.write(src, &(i as u64).to_le_bytes()).unwrap();
        let log = self.mem.mr.remote(self.base + 8 + (i % LOG) * 8);
        let id = 3 * i as u64;
        let mut wrs = [
            SendWr::faa(
                id,
                self.buf.sge(i * 8, 8).unwrap(),
                self.mem.mr.remote(self.base),
                1,
            ),
            SendWr::write(id + 1, self.buf.sge(src, 8).unwrap(), log),
            SendWr::read(
                id + 2,
                self.buf.sge(MAX_ROUNDS * 8 + i * 8, 8).unwrap(),
                log,
            ),
        ];
        self.v.post_send(&mut wrs).unwrap();
        self.seen.push(self.v.path());
    }

    /// Polls until every posted WR completed, checking order and status.
    fn drain(&mut self) {
        let want = 3 * self.next as u64;
        let start = std::time::Instant::now();
        let mut out = [Wc::default(); 16];
        while self.next_wc < want {
            let n = self.v.poll(&mut out).unwrap();
            for wc in &out[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                assert_eq!(wc.wr_id, self.next_wc, "completions in posting order");
                self.next_wc += 1;
            }
            assert!(start.elapsed() < common::WAIT, "stuck at {}", self.next_wc);
        }
        assert_eq!(self.v.outstanding(), 0);
    }

    fn window(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.post_round();
        }
        self.drain();
    }

    /// The sequential log: FAA old values 0, 1, 2, ... once each, in
    /// order; each READ saw its round's WRITE; the counter is the count.
    fn check(&self) {
        for i in 0..self.next {
            let mut b = [0u8; 8];
            self.buf.read(i * 8, &mut b).unwrap();
            assert_eq!(
                u64::from_le_bytes(b),
                i as u64,
                "FAA old value of round {i}"
            );
            self.buf.read(MAX_ROUNDS * 8 + i * 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), i as u64, "READ of round {i}");
        }
        let mut b = [0u8; 8];
        self.mem.mr.read(self.base, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), self.next as u64, "the counter");
    }

    /// Index of the first round posted on RC.
    fn switched_at(&self) -> Option<usize> {
        self.seen.iter().position(|t| *t == VqpPath::Rc)
    }
}

#[test]
fn a_threshold_upgrades_mid_stream_and_keeps_the_sequential_log() {
    let c = Cluster::new();
    let mem = upgradable_node(&c, 4096);
    let e = client(&c, |cfg| cfg.with_upgrade_after(Some(100)));
    let mut w = Workload::new(&e, &mem, 0);
    assert_eq!(w.v.path(), VqpPath::Dc);
    // Windows of 4 rounds (12 WRs): the threshold is crossed with WRs in
    // flight, so the switch waits for them to drain.
    for _ in 0..60 {
        w.window(4);
        wait_builds(&e);
    }
    w.check();
    assert_eq!(w.v.path(), VqpPath::Rc);
    let at = w.switched_at().expect("switched");
    // Round 33's post reaches 102 WRs: it asks for the pair and the VQP
    // keeps posting on DC. The next look, at 118 WRs (round 39, the pair
    // built by then), finds it with rounds 36..39 in flight; the first post
    // after they drained (round 40) switches.
    assert_eq!(at, 40, "switched at round {at}");
    assert!(w.seen[at..].iter().all(|t| *t == VqpPath::Rc));
    let s = e.stats();
    assert_eq!(
        (s.rc_upgrades, s.rc_downgrades, s.rc_upgrade_failures),
        (1, 0, 0)
    );
    assert_eq!((s.rc.created, s.rc.pairs), (1, 1));
    // The DC rounds on the DCI, and the handshake's two messages (the
    // Open carrying the Request: one round trip; then the channel's
    // Close), from the same DCI.
    assert_eq!(s.dci.wrs, 3 * at as u64 + 2, "the DC rounds on the DCI");
    assert_eq!(s.rc.qp.wrs, 3 * (240 - at) as u64, "the rest on the pair");
    assert_eq!(mem.engine.stats().handshake.passive_qps, 1);
}

#[test]
fn a_hint_with_wrs_in_flight_switches_once_they_drained() {
    let c = Cluster::new();
    let mem = upgradable_node(&c, 4096);
    // Two DCIs: the handshake's messages go from the second, so that their
    // polls do not retire the workload's WRs on the first.
    let e = client(&c, |cfg| cfg.with_pool_size(2));
    let mut w = Workload::new(&e, &mem, 0);
    for _ in 0..10 {
        w.window(3);
    }
    // Hint with a window in flight: the pair is made, the VQP stays on DC.
    for _ in 0..3 {
        w.post_round();
    }
    assert!(w.v.outstanding() > 0);
    assert_eq!(w.v.upgrade().unwrap(), VqpPath::Dc);
    assert_eq!(e.stats().rc.created, 1);
    w.post_round(); // still in flight: on DC
    assert_eq!(w.v.path(), VqpPath::Dc);
    w.drain();
    for _ in 0..10 {
        w.window(3);
    }
    w.check();
    assert_eq!(w.switched_at(), Some(34), "the first post after the drain");
    let s = e.stats();
    assert_eq!((s.rc_upgrades, s.rc_upgrade_failures), (1, 0));
    // A hint on an upgraded VQP is a no-op.
    assert_eq!(w.v.upgrade().unwrap(), VqpPath::Rc);
    assert_eq!(e.stats().rc.created, 1);
}

#[test]
fn a_prebuilt_pair_is_shared_and_a_drained_hint_switches_at_once() {
    let c = Cluster::new();
    let mem = upgradable_node(&c, 4096);
    let e = client(&c, |cfg| cfg);
    e.upgrade(&mem.gid()).unwrap();
    let mut a = Workload::new(&e, &mem, 0);
    let mut b = Workload::new(&e, &mem, 1024);
    a.window(2);
    b.window(2);
    assert_eq!(a.v.upgrade().unwrap(), VqpPath::Rc);
    assert_eq!(b.v.upgrade().unwrap(), VqpPath::Rc);
    for _ in 0..20 {
        a.window(2);
        b.window(3);
    }
    a.check();
    b.check();
    let s = e.stats();
    assert_eq!((s.rc.created, s.rc_upgrades), (1, 2), "one pair, two VQPs");
    assert_eq!(mem.engine.stats().handshake.passive_qps, 1);
    // Connecting to another target moves an upgraded VQP back to its DCI.
    let other = upgradable_node(&c, 64);
    a.v.connect(other.gid()).unwrap();
    assert_eq!(a.v.path(), VqpPath::Dc);
    assert_eq!(e.stats().rc_downgrades, 1);
}

#[test]
fn a_target_without_an_endpoint_leaves_the_vqp_on_dc_with_backoff() {
    let c = Cluster::new();
    // A plain DC node: no handshake entry in the meta table.
    let mem = c.memory_node(4096);
    let e = client(&c, |cfg| cfg.with_upgrade_after(Some(10)));
    let mut w = Workload::new(&e, &mem, 0);
    for _ in 0..100 {
        w.window(2);
        wait_builds(&e);
    }
    w.check();
    assert!(w.seen.iter().all(|t| *t == VqpPath::Dc));
    let s = e.stats();
    assert_eq!(s.rc_upgrades, 0);
    // Builds asked at the posts reaching 12, 51, 111, 210, 390 WRs, each
    // failure seen 16 WRs later (30, 69, 129, 228, 408), the next attempt
    // 10 << failures after that: 5 in 600 WRs.
    assert_eq!(s.rc_upgrade_failures, 5, "{s:?}");
    assert_eq!((s.rc.builds, s.rc.build_failures), (5, 5), "{s:?}");
    assert!(matches!(
        w.v.upgrade(),
        Err(EngineError::UnknownNode { .. })
    ));
    w.window(1);
    w.check();
}

#[test]
fn an_endpoint_that_is_gone_times_out_and_the_vqp_keeps_working() {
    let c = Cluster::new();
    let mem = c.memory_node(4096);
    // Register a handshake name for `mem` naming an endpoint that is gone.
    let ghost = c.engine(EngineConfig::default().with_upgrade_endpoint(true));
    let dead = ghost.handshake_entry().unwrap().unwrap();
    drop(ghost);
    c.register(
        DcTarget {
            gid: krcore_kmod::engine::handshake_gid(&mem.gid()),
            ..dead
        },
        1 << 40,
        0,
    )
    .unwrap();
    let e = client(&c, |mut cfg| {
        cfg.handshake.timeout = std::time::Duration::from_millis(20);
        cfg
    });
    let mut w = Workload::new(&e, &mem, 0);
    w.window(3);
    let r = w.v.upgrade();
    assert!(matches!(r, Err(EngineError::Handshake { .. })), "{r:?}");
    assert_eq!(w.v.path(), VqpPath::Dc);
    for _ in 0..10 {
        w.window(3);
    }
    w.check();
    let s = e.stats();
    assert_eq!(
        (s.rc_upgrades, s.rc_upgrade_failures, s.rc.pairs),
        (0, 1, 0)
    );
    assert!(s.handshake.timeouts >= 1);
}

#[test]
fn rc_cap_one_with_two_hot_targets_evicts_back_to_dc() {
    let c = Cluster::new();
    let m1 = upgradable_node(&c, 4096);
    let m2 = upgradable_node(&c, 4096);
    let e = client(&c, |cfg| cfg.with_upgrade_after(Some(30)).with_rc_cap(1));
    let mut a = Workload::new(&e, &m1, 0);
    let mut b = Workload::new(&e, &m2, 0);
    for _ in 0..60 {
        a.window(2);
        wait_builds(&e);
        b.window(2);
        wait_builds(&e);
        let s = e.stats();
        assert!(s.rc.pairs <= 1, "the cap holds: {s:?}");
    }
    a.check();
    b.check();
    let s = e.stats();
    // Each VQP upgrades after 30 WRs (5 windows), evicting the other's pair;
    // the other falls back at its next post and counts again.
    assert!(s.rc_upgrades >= 4, "{s:?}");
    assert!(s.rc_downgrades >= 3, "{s:?}");
    assert!(s.rc.evicted >= 3, "{s:?}");
    // Idle pairs are evictable, except one built in the background for the
    // other VQP and not yet taken by it (reserved): a build then finds the
    // cap busy, and that is the only way an upgrade fails here.
    assert_eq!(s.rc_upgrade_failures, s.rc.busy, "{s:?}");
    assert_eq!(s.rc.build_failures, s.rc.busy, "{s:?}");
    assert!(s.rc_upgrades - s.rc_downgrades <= 1);
    for w in [&a, &b] {
        assert!(w.seen.contains(&VqpPath::Rc) && w.seen.contains(&VqpPath::Dc));
    }
}

/// Stress: three threads, each with its own VQP (two to one target, one to
/// another), upgrading by threshold under `rc_cap` = 1, so pairs are
/// evicted while other threads post and VQPs fall back and re-upgrade
/// concurrently; every VQP's log is still exactly sequential.
#[test]
fn concurrent_upgrades_and_evictions_keep_every_log_sequential() {
    let c = Cluster::new();
    let m1 = upgradable_node(&c, 8192);
    let m2 = upgradable_node(&c, 8192);
    let e = client(&c, |cfg| cfg.with_upgrade_after(Some(24)).with_rc_cap(1));
    let mut ws = vec![
        Workload::new(&e, &m1, 0),
        Workload::new(&e, &m2, 0),
        Workload::new(&e, &m1, 4096),
    ];
    // Lockstep windows (a barrier between them) so that the three really
    // overlap whatever the scheduler does.
    let barrier = std::sync::Barrier::new(ws.len());
    std::thread::scope(|s| {
        for (k, w) in ws.iter_mut().enumerate() {
            let (barrier, e) = (&barrier, &e);
            s.spawn(move || {
                for i in 0..150 {
                    w.window(1 + (i + k) % 4);
                    wait_builds(e);
                    barrier.wait();
                }
            });
        }
    });
    for w in &ws {
        w.check();
    }
    let s = e.stats();
    assert!(s.rc_upgrades >= 2, "{s:?}");
    assert!(s.rc_downgrades >= 1, "{s:?}");
    assert!(s.rc.pairs <= 1, "{s:?}");
    assert_eq!(s.dci.error_completions + s.rc.qp.error_completions, 0);
}

/// After one failed upgrade attempt: the VQP is on its DCI, ten more
/// windows keep the sequential log, and the engine counts exactly one
/// failure, no upgrade and no pair. Returns the stats for further checks.
fn stayed_on_dc_after_one_failure(e: &Engine<SimNic>, w: &mut Workload<'_>) -> EngineStats {
    assert_eq!(w.v.path(), VqpPath::Dc);
    for _ in 0..10 {
        w.window(3);
    }
    w.check();
    let s = e.stats();
    assert_eq!(
        (
            s.rc_upgrades,
            s.rc_upgrade_failures,
            s.rc.pairs,
            s.rc.failed
        ),
        (0, 1, 0, 1)
    );
    s
}

/// A memory node whose handshake endpoint holds at most one passive QP and
/// refuses new pairs past it (no eviction).
fn refusing_node(c: &Cluster, len: usize) -> MemNode {
    let mut cfg = EngineConfig::default()
        .with_pool_size(1)
        .with_upgrade_endpoint(true)
        .with_handshake_thread(true);
    cfg.handshake.passive_cap = 1;
    cfg.handshake.refuse_when_full = true;
    c.upgradable_node(cfg, len)
}

#[test]
fn a_target_that_refuses_leaves_the_vqp_on_dc_working() {
    use krcore_kmod::handshake::RejectCode;
    use krcore_kmod::HandshakeFailure;
    let c = Cluster::new();
    let mem = refusing_node(&c, 8192);
    // Another node takes the target's only passive QP.
    let first = client(&c, |cfg| cfg);
    first.upgrade(&mem.gid()).expect("the first pair fits");
    // Hinted: the refusal is typed, the VQP stays on its DCI.
    let e = client(&c, |cfg| cfg);
    let mut w = Workload::new(&e, &mem, 0);
    w.window(3);
    let r = w.v.upgrade();
    assert!(
        matches!(
            r,
            Err(EngineError::Handshake {
                failure: HandshakeFailure::Rejected(RejectCode::Full),
                ..
            })
        ),
        "{r:?}"
    );
    let s = stayed_on_dc_after_one_failure(&e, &mut w);
    assert_eq!(s.handshake.refused, 1);
    // By threshold: every attempt is refused, counted, backed off; every
    // op on the way succeeds in order.
    let e2 = client(&c, |cfg| cfg.with_upgrade_after(Some(10)));
    let mut w2 = Workload::new(&e2, &mem, 4096);
    for _ in 0..100 {
        w2.window(2);
        wait_builds(&e2);
    }
    w2.check();
    assert!(w2.seen.iter().all(|t| *t == VqpPath::Dc));
    let s2 = e2.stats();
    assert_eq!((s2.rc_upgrades, s2.rc.pairs), (0, 0));
    assert_eq!(s2.rc_upgrade_failures, 5, "as without an endpoint: {s2:?}");
    assert_eq!(s2.handshake.refused, s2.rc_upgrade_failures, "{s2:?}");
    let ms = mem.engine.stats().handshake;
    assert_eq!(ms.passive_qps, 1, "the first pair is kept, not evicted");
    assert_eq!(ms.passive_evicted, 0);
    assert_eq!(ms.rejected, 1 + s2.rc_upgrade_failures);
    // The first node's pair still works.
    let mut w3 = Workload::new(&first, &mem, 2048);
    assert_eq!(w3.v.upgrade().unwrap(), VqpPath::Rc);
    w3.window(3);
    w3.check();
}

/// A memory node that serves upgrades with no thread: Requests wait in its
/// reserved messaging port until someone calls `progress()`.
fn unthreaded_target(c: &Cluster, len: usize) -> MemNode {
    let engine = c.engine(
        EngineConfig::default()
            .with_pool_size(1)
            .with_upgrade_endpoint(true),
    );
    let mr = engine.alloc_mr(len, Access::ALL).expect("MR");
    c.register(engine.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    c.register(
        engine.handshake_entry().unwrap().expect("entry"),
        1 << 40,
        0,
    )
    .unwrap();
    MemNode { engine, mr }
}

/// Drives `target`'s messaging (Opens answered, messages into their ports,
/// no handshake served) until the Request sits in its reserved port, then
/// its handshake service dies (the port goes, the Request unanswered).
fn die_after_the_request(target: &Engine<SimNic>) {
    let start = std::time::Instant::now();
    while target.msg_stats().inline_delivered == 0 {
        target.msg_progress().unwrap();
        assert!(start.elapsed() < common::WAIT, "no Request arrived");
        std::thread::yield_now();
    }
    target.stop_serving_upgrades();
    let s = target.stats().handshake;
    assert_eq!((s.accepted, s.rejected), (0, 0), "nothing answered");
}

/// The target's handshake service receives the Request (a message on its
/// reserved port) and dies before it answers.
#[test]
fn a_target_that_dies_mid_handshake_leaves_the_vqp_on_dc_working() {
    use krcore_kmod::HandshakeFailure;
    let c = Cluster::new();
    let mem = unthreaded_target(&c, 4096);
    // Generous waits: the service dies while the initiator still waits.
    let e = client(&c, |mut cfg| {
        cfg.handshake.timeout = std::time::Duration::from_millis(200);
        cfg.handshake.retries = 1;
        cfg
    });
    let mut w = Workload::new(&e, &mem, 0);
    w.window(3);
    let r = std::thread::scope(|s| {
        let dying = s.spawn(|| die_after_the_request(&mem.engine));
        let r = w.v.upgrade();
        dying.join().unwrap();
        r
    });
    assert!(
        matches!(
            r,
            Err(EngineError::Handshake {
                failure: HandshakeFailure::Timeout { .. },
                ..
            })
        ),
        "{r:?}"
    );
    let s = stayed_on_dc_after_one_failure(&e, &mut w);
    assert_eq!(s.handshake.timeouts, 1);
    assert_eq!(s.dci.error_completions, 0);
    assert_eq!(mem.engine.stats().handshake.passive_qps, 0);
}

/// The pair is built in the background: the target answers handshakes only
/// when the test progresses it, and until then the VQP that crossed its
/// threshold keeps posting on DC (no post waits for the handshake).
#[test]
fn a_threshold_upgrade_builds_in_the_background_while_posts_stay_on_dc() {
    let c = Cluster::new();
    let engine = c.engine(
        EngineConfig::default()
            .with_pool_size(1)
            .with_upgrade_endpoint(true),
    );
    let mr = engine.alloc_mr(4096, Access::ALL).expect("MR");
    c.register(engine.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    c.register(
        engine.handshake_entry().unwrap().expect("entry"),
        1 << 40,
        0,
    )
    .unwrap();
    let mem = MemNode { engine, mr };
    // The builder waits for the answer (generously: a loaded machine).
    let e = client(&c, |mut cfg| {
        cfg.handshake.timeout = std::time::Duration::from_secs(2);
        cfg.with_upgrade_after(Some(30))
    });
    let mut w = Workload::new(&e, &mem, 0);
    for _ in 0..20 {
        w.window(2);
    }
    // 120 WRs, the threshold at 30: the build is asked for and in flight,
    // unanswered; every post returned, on DC.
    let s = e.stats();
    assert_eq!((s.rc.builds, s.rc.builds_done), (1, 0), "{s:?}");
    assert!(w.seen.iter().all(|t| *t == VqpPath::Dc));
    assert_eq!(s.rc_upgrade_failures, 0);
    // The target answers: the build ends, the VQP takes the pair at a
    // later post, once its DC WRs drained.
    let start = std::time::Instant::now();
    while e.stats().rc.builds_done == 0 {
        mem.engine.progress().unwrap();
        assert!(start.elapsed() < common::WAIT, "the build never ended");
        std::thread::yield_now();
    }
    for _ in 0..10 {
        w.window(2);
    }
    w.check();
    let at = w.switched_at().expect("switched");
    assert!(at >= 40, "after the 20 windows on DC: {at}");
    assert!(w.seen[at..].iter().all(|t| *t == VqpPath::Rc));
    let s = e.stats();
    assert_eq!(
        (
            s.rc_upgrades,
            s.rc_upgrade_failures,
            s.rc.builds,
            s.rc.created
        ),
        (1, 0, 1, 1)
    );
    // Plus the handshake's messages (the Open carrying the Request, the
    // channel's Close) on the same DCI.
    assert_eq!(s.dci.wrs, 3 * at as u64 + 2);
}

/// Dropping an engine whose builder is in the middle of a handshake (the
/// target does not answer) neither hangs nor waits for the handshake: the
/// builder holds the engine until its handshake ends, then stops.
#[test]
fn an_engine_dropped_during_a_background_build_does_not_hang() {
    let c = Cluster::new();
    let target = c.engine(EngineConfig::default().with_upgrade_endpoint(true));
    let mr = target.alloc_mr(4096, Access::ALL).expect("MR");
    c.register(target.local_target().unwrap(), 1 << 40, 0)
        .unwrap();
    c.register(
        target.handshake_entry().unwrap().expect("entry"),
        1 << 40,
        0,
    )
    .unwrap();
    let mem = MemNode { engine: target, mr };
    let e = client(&c, |mut cfg| {
        cfg.handshake.timeout = std::time::Duration::from_millis(300);
        cfg.handshake.retries = 0;
        cfg.with_upgrade_after(Some(3))
    });
    let mut w = Workload::new(&e, &mem, 0);
    w.window(2);
    w.check();
    assert_eq!(e.stats().rc.builds, 1);
    drop(w);
    drop(e);
    // The target is still there, and works for a new client.
    let e2 = client(&c, |cfg| cfg);
    let mut w2 = Workload::new(&e2, &mem, 1024);
    w2.window(2);
    w2.check();
}

/// As above, by threshold: the builder thread sends the Request, the
/// target's service dies without answering, and the VQP, which kept posting
/// on DC all along, sees the failure at a later look and stays there.
#[test]
fn a_target_that_dies_mid_background_build_leaves_the_vqp_on_dc_working() {
    let c = Cluster::new();
    let mem = unthreaded_target(&c, 4096);
    let e = client(&c, |mut cfg| {
        cfg.handshake.timeout = std::time::Duration::from_millis(200);
        cfg.handshake.retries = 1;
        cfg.with_upgrade_after(Some(10))
    });
    let mut w = Workload::new(&e, &mem, 0);
    std::thread::scope(|s| {
        let dying = s.spawn(|| die_after_the_request(&mem.engine));
        // Past the threshold: the build is asked for; posts go on (on DC)
        // while the target receives the Request and its service dies.
        for _ in 0..10 {
            w.window(2);
        }
        dying.join().unwrap()
    });
    wait_builds(&e);
    // The next post sees the failure and backs off (20 WRs): two windows
    // (12 WRs) stay below the next attempt.
    w.window(2);
    w.window(2);
    w.check();
    assert!(w.seen.iter().all(|t| *t == VqpPath::Dc));
    let s = e.stats();
    assert_eq!(
        (s.rc_upgrades, s.rc.pairs, s.rc.builds, s.rc.build_failures),
        (0, 0, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.rc_upgrade_failures, 1, "{s:?}");
    assert_eq!(s.handshake.timeouts, 1);
    assert_eq!(s.dci.error_completions, 0);
}
