//! The node daemon: processes attached over its socket post through their
//! rings on the daemon's engine (no QP of their own), reach only their own
//! memory, and fail typed (never hang) when the daemon or their own ring
//! goes bad; a process that goes has everything it held released.

mod common;

use common::{config, Cluster, MemNode};
use krcore_kmod::daemon::wire::{frame_len, RefuseCode, Reply, Request};
use krcore_kmod::daemon::{
    Attached, AttachedMr, AttachedVqp, CqWait, Daemon, DaemonConfig, DaemonError, PostCode,
};
use krcore_kmod::Engine;
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, Nic, SendWr, WcStatus};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

struct Node {
    // (Dropped in this order: the daemon before its socket's directory.)
    daemon: Option<Daemon<SimNic>>,
    mem: MemNode,
    c: Cluster,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    fn new(cfg: DaemonConfig) -> Node {
        Node::with(cfg, None)
    }

    /// A node whose memory node answers DC -> RC upgrades and whose
    /// daemon's engine upgrades a VQP after `upgrade_after` WRs to one
    /// target (`None`: a plain DC memory node, no upgrades).
    fn with(cfg: DaemonConfig, upgrade_after: Option<u64>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("krcored.sock");
        let c = Cluster::new();
        let mem = match upgrade_after {
            None => c.memory_node(1 << 16),
            Some(_) => c.upgradable_node(
                krcore_kmod::EngineConfig::default()
                    .with_pool_size(1)
                    .with_upgrade_endpoint(true)
                    .with_handshake_thread(true),
                1 << 16,
            ),
        };
        // As krcored starts it: the whole DCI pool made at start, the
        // node registered (reachable by its own processes too).
        let engine = c.engine_granted(config(|cfg| {
            cfg.prestart = cfg.pool_size;
            cfg.eager_start = true;
            if upgrade_after.is_some() {
                cfg.upgrade_after = upgrade_after;
                cfg.upgrade_endpoint = true;
                // A loaded machine can delay the target's handshake
                // thread past the default 20 ms times 5.
                cfg.handshake.timeout = Duration::from_millis(500);
            }
        }));
        c.register(engine.local_target().unwrap(), 1 << 40, 0)
            .unwrap();
        let daemon = Daemon::start(engine, &path, cfg).unwrap();
        Node {
            _dir: dir,
            path,
            c,
            mem,
            daemon: Some(daemon),
        }
    }

    fn daemon(&self) -> &Daemon<SimNic> {
        self.daemon.as_ref().unwrap()
    }

    fn engine(&self) -> &Engine<SimNic> {
        self.daemon().engine()
    }

    fn attach(&self) -> Attached {
        Attached::attach(&self.path).unwrap()
    }

    /// A VQP of `a` connected to the memory node, knowing a grant over
    /// its whole region.
    fn vqp(&self, a: &Attached) -> AttachedVqp {
        let v = a.create_vqp().unwrap();
        v.connect(self.mem.gid()).unwrap();
        let len = self.mem.mr.len() as u64;
        v.add_grant(
            self.mem.gid(),
            self.mem.mr.rkey(),
            self.mem.grant(0, len, Access::ALL),
        )
        .unwrap();
        v
    }

    fn remote(&self, off: u64) -> krcore_nic::RemoteAddr {
        krcore_nic::RemoteAddr {
            addr: self.mem.mr.addr() + off,
            rkey: self.mem.mr.rkey(),
        }
    }
}

use krcore_nic::MemoryRegion as _;

fn local(a: &Attached) -> AttachedMr {
    a.alloc(4096, Access::LOCAL_WRITE).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn an_attached_process_reads_writes_and_swaps_remote_memory_with_no_qp_of_its_own() {
    let n = Node::new(DaemonConfig::default());
    let a = n.attach();
    assert_eq!(a.gid(), n.engine().gid());
    let buf = local(&a);
    let v = n.vqp(&a);
    // WRITE from this process's mapping, READ back into it: the NIC's
    // bytes land in the process's memory, no copy through the daemon.
    buf.write(0, b"hello, daemon").unwrap();
    v.post(&[SendWr::write(1, buf.sge(0, 13).unwrap(), n.remote(64))])
        .unwrap();
    assert_eq!(v.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    let mut remote = [0u8; 13];
    n.mem.mr.mr().read(64, &mut remote).unwrap();
    assert_eq!(&remote, b"hello, daemon");
    v.post(&[SendWr::read(2, buf.sge(100, 13).unwrap(), n.remote(64))])
        .unwrap();
    let wc = v.wait(1, WAIT).unwrap()[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.qp_num),
        (2, WcStatus::Success, 13, v.id())
    );
    let mut got = [0u8; 13];
    buf.read(100, &mut got).unwrap();
    assert_eq!(&got, b"hello, daemon");
    // Atomics: the old value lands in the process's memory.
    n.mem.mr.mr().store_u64(256, 41).unwrap();
    v.post(&[SendWr::cas(
        3,
        buf.sge(200, 8).unwrap(),
        n.remote(256),
        41,
        42,
    )])
    .unwrap();
    v.wait(1, WAIT).unwrap();
    assert_eq!(
        (
            buf.load_u64(200).unwrap(),
            n.mem.mr.mr().load_u64(256).unwrap()
        ),
        (41, 42)
    );
    v.post(&[SendWr::faa(4, buf.sge(208, 8).unwrap(), n.remote(256), 8)])
        .unwrap();
    v.wait(1, WAIT).unwrap();
    assert_eq!(
        (
            buf.load_u64(208).unwrap(),
            n.mem.mr.mr().load_u64(256).unwrap()
        ),
        (42, 50)
    );

    // A second process joins: its VQP, connect and READ create no QP on
    // the node (the daemon's pool is warm, its DCCache knows the target),
    // and the process itself has no NIC to create one with.
    let before = n.engine().nic().counters();
    let b = n.attach();
    let bbuf = local(&b);
    let bv = n.vqp(&b);
    bv.post(&[SendWr::read(9, bbuf.sge(0, 13).unwrap(), n.remote(64))])
        .unwrap();
    bv.wait(1, WAIT).unwrap();
    let mut got = [0u8; 13];
    bbuf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, daemon");
    let d = n.engine().nic().counters() - before;
    assert_eq!(d.qps_created, 0, "{d:?}");
    let st = n.daemon().stats();
    assert_eq!((st.clients, st.vqps, st.attached), (2, 2, 2));
}

/// Process `id` WRITEs its mark at its own offset and READs it back, one
/// synchronous WR at a time, `rounds` times; every READ must see the mark.
fn write_read_rounds(n: &Node, v: &AttachedVqp, buf: &AttachedMr, id: u8, rounds: usize) {
    let off = 256 * u64::from(id);
    for i in 0..rounds {
        let mark = [id, (i % 251) as u8, 0x5a, id];
        buf.write(0, &mark).unwrap();
        v.post(&[SendWr::write(1, buf.sge(0, 4).unwrap(), n.remote(off))])
            .unwrap();
        assert_eq!(v.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        v.post(&[SendWr::read(2, buf.sge(64, 4).unwrap(), n.remote(off))])
            .unwrap();
        assert_eq!(v.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        let mut got = [0u8; 4];
        buf.read(64, &mut got).unwrap();
        assert_eq!(got, mark, "process {id}, round {i}");
    }
}

/// A process thread and the daemon's data thread on one CPU (a node with
/// more waiting threads than cores): each doorbell says the CPU it was
/// posted from (the ring's `sq_cpu` word, at 8), so the data thread gives
/// the CPU back as soon as it is idle, and the waiter, seeing the data
/// thread's CPU is its own, yields instead of spinning; every round is
/// served.
/// (Speed is the bench's: `daemon/read64_sync_one_cpu`.)
#[test]
fn a_process_thread_on_the_data_threads_cpu_is_served() {
    let before = rustix::thread::sched_getaffinity(None).unwrap();
    let cpu = rustix::thread::sched_getcpu();
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    rustix::thread::sched_setaffinity(None, &one).unwrap();
    // The daemon's threads start from this one: they inherit its CPU.
    let n = Node::new(DaemonConfig::default());
    let a = n.attach();
    let buf = local(&a);
    let v = n.vqp(&a);
    write_read_rounds(&n, &v, &buf, 3, 300);
    let said = v.ring_for_tests().word(8).unwrap().load(Ordering::Relaxed);
    rustix::thread::sched_setaffinity(None, &before).unwrap();
    assert_eq!(said, cpu as u64 + 1, "sq_cpu: the poster's CPU plus one");
}

/// A process with more VQPs than the page has doorbell bits (256: VQPs
/// share them): each VQP's doorbells are served, the data thread looking
/// at the rings the page marks (and those with WRs in flight) rather than
/// at every ring each round; and the daemon sleeps between rounds of
/// doorbells and is woken by the next.
#[test]
fn doorbells_of_many_vqps_are_each_served() {
    let n = Node::new(DaemonConfig {
        idle_spin: Duration::from_micros(200),
        ..DaemonConfig::default()
    });
    let a = n.attach();
    let buf = local(&a);
    let vqps: Vec<AttachedVqp> = (0..300).map(|_| n.vqp(&a)).collect();
    for round in 0..3u8 {
        // In an order that is not the VQPs' own, so a doorbell is often
        // the only one of its bit.
        for i in (0..vqps.len()).map(|i| (i * 7 + usize::from(round)) % vqps.len()) {
            let v = vqps.get(i).unwrap();
            let id = (i % 250) as u8;
            write_read_rounds(&n, v, &buf, id, 1);
        }
        let sleeps = n.daemon().stats().sleeps;
        wait_until("the data thread to sleep", || {
            n.daemon().stats().sleeps > sleeps
        });
    }
}

/// Stress for the doorbell bits and the waits: 8 threads of one process
/// post at once on 32 VQPs each (bits shared by several VQPs, marked and
/// taken concurrently), pausing now and then so the data thread falls
/// asleep and is woken by the next doorbell; half the threads wait for
/// completions with `idle` between polls (the sleep on the ring's futex),
/// half with `wait`. Every READ sees the thread's own last WRITE, no
/// doorbell is refused, and every one was counted (none left unserved: a
/// missed bit would time the wait out, failing the test).
#[test]
fn concurrent_doorbells_on_shared_bits_are_all_served() {
    let n = Node::new(DaemonConfig {
        idle_spin: Duration::from_micros(20),
        ..DaemonConfig::default()
    });
    let a = n.attach();
    let threads = 8u8;
    let rounds = 60usize;
    let sets: Vec<(Vec<AttachedVqp>, AttachedMr)> = (0..threads)
        .map(|_| ((0..32).map(|_| n.vqp(&a)).collect(), local(&a)))
        .collect();
    let before = n.daemon().stats().doorbells;
    let halfway = std::sync::Barrier::new(threads.into());
    std::thread::scope(|s| {
        for (id, (vqps, buf)) in sets.iter().enumerate() {
            let (n, halfway) = (&n, &halfway);
            s.spawn(move || {
                let mut seed = 0x5DEE_CE66_D1CE_u64 + id as u64;
                let off = 256 * id as u64;
                for i in 0..rounds {
                    if i == rounds / 2 {
                        // Everyone quiet until the data thread sleeps: the
                        // next doorbells wake it.
                        halfway.wait();
                        if id == 0 {
                            let slept = n.daemon().stats().sleeps;
                            wait_until("the data thread to sleep", || {
                                n.daemon().stats().sleeps > slept
                            });
                        }
                        halfway.wait();
                    }
                    let v = vqps.get(rng(&mut seed) as usize % vqps.len()).unwrap();
                    let mark = [id as u8, (i % 251) as u8, 0xa5, 1];
                    buf.write(0, &mark).unwrap();
                    v.post(&[SendWr::write(1, buf.sge(0, 4).unwrap(), n.remote(off))])
                        .unwrap();
                    settle(v, id);
                    v.post(&[SendWr::read(2, buf.sge(64, 4).unwrap(), n.remote(off))])
                        .unwrap();
                    settle(v, id);
                    let mut got = [0u8; 4];
                    buf.read(64, &mut got).unwrap();
                    assert_eq!(got, mark, "thread {id}, round {i}");
                    if rng(&mut seed) % 8 == 0 {
                        std::thread::sleep(Duration::from_micros(100 + rng(&mut seed) % 200));
                    }
                }
            });
        }
    });
    let st = n.daemon().stats();
    assert_eq!(
        st.doorbells - before,
        2 * rounds as u64 * u64::from(threads),
        "{st:?}"
    );
    assert_eq!(st.refused_doorbells, 0, "{st:?}");
}

/// One completion of `v`: `wait` on even threads, polls with `idle`
/// between them on odd ones.
fn settle(v: &AttachedVqp, thread: usize) {
    if thread % 2 == 0 {
        assert_eq!(v.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        return;
    }
    let mut wc = [krcore_nic::Wc::default(); 1];
    let mut idle = CqWait::default();
    let start = Instant::now();
    while v.poll(&mut wc).unwrap() == 0 {
        assert!(start.elapsed() < WAIT, "no completion");
        v.idle(&mut idle).unwrap();
    }
    assert_eq!(wc[0].status, WcStatus::Success);
}

/// Two data threads: processes are placed on the one with the fewest at
/// attach, and processes on both threads post, complete and sleep-wake
/// concurrently, each seeing only its own data; a thread that lost its
/// processes takes the next one.
#[test]
fn two_data_threads_serve_the_processes_placed_on_them() {
    let n = Node::new(DaemonConfig {
        data_threads: 2,
        // Short: the threads also sleep and are woken between rounds.
        idle_spin: Duration::from_micros(50),
        ..DaemonConfig::default()
    });
    let procs: Vec<(Attached, AttachedVqp, AttachedMr)> = (0..3)
        .map(|_| {
            let a = n.attach();
            let v = n.vqp(&a);
            let buf = local(&a);
            (a, v, buf)
        })
        .collect();
    let mut placed = n.daemon().clients_per_thread();
    placed.sort_unstable();
    assert_eq!(placed, [1, 2], "three processes on two threads");
    std::thread::scope(|s| {
        for (id, (_, v, buf)) in procs.iter().enumerate() {
            let n = &n;
            s.spawn(move || {
                for round in 0..4 {
                    write_read_rounds(n, v, buf, id as u8, 50);
                    // Idle long enough for the thread to fall asleep.
                    if round % 2 == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            });
        }
    });
    let st = n.daemon().stats();
    assert!(st.doorbells >= 3 * 400, "{st:?}");
    assert_eq!(st.refused_doorbells, 0, "{st:?}");
    // Two processes go; the next process goes to the thread left with
    // none (if both were one thread's) or to either (one each).
    let mut procs = procs;
    procs.truncate(1);
    wait_until("the processes detached", || {
        n.daemon().clients_per_thread().iter().sum::<usize>() == 1
    });
    let left = n.daemon().clients_per_thread();
    let a = n.attach();
    let after = n.daemon().clients_per_thread();
    let empty = left.iter().position(|&c| c == 0).unwrap();
    assert_eq!(
        after[empty], 1,
        "placed on the empty thread: {left:?} -> {after:?}"
    );
    let v = n.vqp(&a);
    let buf = local(&a);
    write_read_rounds(&n, &v, &buf, 7, 20);
    assert_eq!(n.daemon().clients_per_thread(), [1, 1]);
    drop(procs);
}

#[test]
fn an_rc_pair_upgraded_for_one_process_serves_the_next() {
    // The DC -> RC upgrade is node-wide: the daemon's engine builds one
    // pair with the memory node, for the first process's hot VQP, and the
    // next process's VQP to that node moves onto the same pair.
    let n = Node::with(DaemonConfig::default(), Some(20));
    let rc = |n: &Node| {
        let s = n.engine().stats();
        (s.rc.created, s.rc_upgrades)
    };
    // Process `id` runs rounds until the daemon has upgraded `want` VQPs.
    let hot_until = |v: &AttachedVqp, buf: &AttachedMr, id: u8, want: u64| {
        let mut rounds = 0;
        while rc(&n).1 < want {
            write_read_rounds(&n, v, buf, id, 10);
            rounds += 10;
            assert!(
                rounds < 20_000,
                "process {id}'s VQP never upgraded: {:?}",
                rc(&n)
            );
        }
    };
    let a = n.attach();
    let (abuf, av) = (local(&a), n.vqp(&a));
    hot_until(&av, &abuf, 1, 1);
    assert_eq!(rc(&n), (1, 1), "one pair, built for process 1");
    let b = n.attach();
    let (bbuf, bv) = (local(&b), n.vqp(&b));
    hot_until(&bv, &bbuf, 2, 2);
    assert_eq!(rc(&n), (1, 2), "process 2's VQP on process 1's pair");
    assert_eq!(n.mem.engine.stats().handshake.passive_qps, 1);
    // Both keep working on the pair, side by side.
    write_read_rounds(&n, &av, &abuf, 1, 50);
    write_read_rounds(&n, &bv, &bbuf, 2, 50);
    assert_eq!(rc(&n), (1, 2));
    assert_eq!(n.engine().stats().rc_upgrade_failures, 0);
}

/// `open_vqp`: create, connect and grant in one control call; a refused
/// part leaves nothing behind (the grant of another process's key).
#[test]
fn a_vqp_opens_connected_and_granted_in_one_call() {
    let n = Node::new(DaemonConfig::default());
    let a = n.attach();
    let buf = local(&a);
    let grant = krcore_kmod::RemoteGrant {
        addr: 0,
        len: u64::MAX,
        access: Access::ALL,
        expires_at: None,
    };
    let before = n.daemon().stats().vqps;
    let v = a.open_vqp(n.mem.gid(), n.remote(0).rkey, grant).unwrap();
    assert_eq!(n.daemon().stats().vqps, before + 1);
    v.post(&[SendWr::read(1, buf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    assert_eq!(v.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    // Refused whole: another process's key on the daemon's node.
    let b = n.attach();
    let theirs = local(&b);
    match a.open_vqp(a.gid(), theirs.rkey(), grant) {
        Err(DaemonError::Refused {
            code: RefuseCode::BadRequest,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(n.daemon().stats().vqps, before + 1, "nothing left behind");
}

#[test]
fn the_upgrade_hint_moves_an_attached_vqp_to_the_node_wide_pair() {
    use krcore_kmod::VqpPath;
    // No threshold (never by itself): only the hint upgrades.
    let n = Node::with(DaemonConfig::default(), Some(u64::MAX));
    let a = n.attach();
    let (abuf, av) = (local(&a), n.vqp(&a));
    write_read_rounds(&n, &av, &abuf, 1, 5);
    assert_eq!(av.path().unwrap(), VqpPath::Dc);
    assert_eq!(av.upgrade().unwrap(), VqpPath::Rc);
    assert_eq!(av.path().unwrap(), VqpPath::Rc);
    write_read_rounds(&n, &av, &abuf, 1, 20);
    // Another process's hint finds the pair: no second handshake.
    let b = n.attach();
    let (bbuf, bv) = (local(&b), n.vqp(&b));
    assert_eq!(bv.upgrade().unwrap(), VqpPath::Rc);
    write_read_rounds(&n, &bv, &bbuf, 2, 20);
    let s = n.engine().stats();
    assert_eq!((s.rc.created, s.rc_upgrades), (1, 2));
    assert_eq!(n.mem.engine.stats().handshake.passive_qps, 1);
    // A VQP with no target: the engine's refusal, typed.
    let idle = a.create_vqp().unwrap();
    assert!(matches!(idle.upgrade(), Err(DaemonError::Refused { .. })));
}

#[test]
fn a_doorbell_of_sixteen_wrs_is_one_post_with_one_completion() {
    let n = Node::new(DaemonConfig::default());
    let a = n.attach();
    let buf = local(&a);
    let v = n.vqp(&a);
    let wrs: Vec<SendWr> = (0..16u64)
        .map(|i| {
            SendWr::read(i, buf.sge(8 * i as usize, 8).unwrap(), n.remote(8 * i)).signaled(i == 15)
        })
        .collect();
    let before = n.daemon().stats();
    let nic_before = n.engine().nic().counters();
    v.post(&wrs).unwrap();
    let wcs = v.wait(1, WAIT).unwrap();
    assert_eq!(wcs[0].wr_id, 15);
    let st = n.daemon().stats();
    assert_eq!(
        (st.doorbells - before.doorbells, st.wrs - before.wrs),
        (1, 16)
    );
    let d = n.engine().nic().counters() - nic_before;
    assert_eq!(d.send_wrs, 16, "{d:?}");
    // Nothing else comes.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(v.poll(&mut [Default::default(); 4]).unwrap(), 0);
    // Too many for one doorbell: refused before anything is published.
    let many: Vec<SendWr> = (0..65u64)
        .map(|i| SendWr::read(i, buf.sge(0, 8).unwrap(), n.remote(0)))
        .collect();
    assert!(matches!(
        v.post(&many),
        Err(DaemonError::BatchSize { len: 65, max: 64 })
    ));
    assert!(matches!(
        v.post(&[]),
        Err(DaemonError::BatchSize { len: 0, .. })
    ));
}

#[test]
fn another_processes_memory_is_out_of_reach() {
    let n = Node::new(DaemonConfig::default());
    let (a, b) = (n.attach(), n.attach());
    let (abuf, bbuf) = (local(&a), local(&b));
    bbuf.write(0, b"secret").unwrap();
    let av = n.vqp(&a);
    // A's WR naming B's region as its local memory.
    let foreign = bbuf.sge(0, 8).unwrap();
    match av.post(&[SendWr::write(1, foreign, n.remote(0))]) {
        Err(DaemonError::Post {
            code: PostCode::ForeignMemory,
            index: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Its own region, but past its end.
    let mut past = abuf.sge(4088, 8).unwrap();
    past.length = 16;
    match av.post(&[
        SendWr::read(1, abuf.sge(0, 8).unwrap(), n.remote(0)),
        SendWr::read(2, past, n.remote(0)),
    ]) {
        Err(DaemonError::Post {
            code: PostCode::ForeignMemory,
            index: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // B's region as remote memory: a grant over its key is refused, and
    // without one the pre-check refuses the WR.
    let bv_target = a.gid();
    av.connect(bv_target).unwrap();
    match av.add_grant(bv_target, bbuf.rkey(), bbuf.grant()) {
        Err(DaemonError::Refused {
            code: RefuseCode::BadRequest,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match av.post(&[SendWr::read(3, abuf.sge(0, 8).unwrap(), bbuf.remote(0))]) {
        Err(DaemonError::Post {
            code: PostCode::Rejected,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Nor B's lease, nor the daemon engine's own remote-accessible memory
    // (its messaging buffers are such): on its own node a process may
    // grant only its own regions; its own region is granted.
    let shared = b.alloc(4096, Access::ALL).unwrap();
    let lease = shared
        .lease(0, 8, Access::REMOTE_READ, Duration::from_secs(60))
        .unwrap();
    let internal = n
        .daemon()
        .engine()
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let grant = |rkey| {
        av.add_grant(
            bv_target,
            rkey,
            krcore_kmod::RemoteGrant {
                addr: 0,
                len: u64::MAX,
                access: Access::REMOTE_READ,
                expires_at: None,
            },
        )
    };
    for rkey in [lease.rkey, internal.rkey()] {
        match grant(rkey) {
            Err(DaemonError::Refused {
                code: RefuseCode::BadRequest,
                ..
            }) => {}
            other => panic!("rkey {rkey:#x}: {other:?}"),
        }
    }
    grant(abuf.rkey()).unwrap();
    let mut got = [0u8; 6];
    abuf.read(0, &mut got).unwrap();
    assert_ne!(&got, b"secret");
    // Nothing was posted, and both processes go on.
    assert_eq!(n.daemon().stats().wrs, 0);
    av.connect(n.mem.gid()).unwrap();
    av.post(&[SendWr::read(4, abuf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    av.wait(1, WAIT).unwrap();
    let bv = n.vqp(&b);
    bv.post(&[SendWr::read(5, bbuf.sge(8, 8).unwrap(), n.remote(0))])
        .unwrap();
    bv.wait(1, WAIT).unwrap();
}

/// xorshift64*: the test's random words.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[test]
fn garbage_in_a_ring_fails_only_that_vqp() {
    let n = Node::new(DaemonConfig::default());
    let (a, b) = (n.attach(), n.attach());
    let (abuf, bbuf) = (local(&a), local(&b));
    let bad = n.vqp(&a);
    let good = n.vqp(&a);
    let other = n.vqp(&b);
    // Random bytes over the whole ring, then indices the daemon acts on
    // (each marked on the page, as a post marks its doorbell: a tail
    // moved without is not looked at):
    // first a plausible tail (random entries: each doorbell refused or
    // posted as the pre-check sees fit, never a crash), then one far
    // ahead (the ring is broken for good).
    let ring = bad.ring_for_tests();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..20 {
        for off in (512..ring.len()).step_by(8) {
            ring.word(off)
                .unwrap()
                .store(rng(&mut seed), Ordering::Relaxed);
        }
        let tail = ring.word(0).unwrap().load(Ordering::Relaxed);
        ring.word(0)
            .unwrap()
            .store(tail + 1 + round % 5, Ordering::SeqCst);
        bad.mark_doorbell_for_tests();
        let want = tail + 1 + round % 5;
        wait_until("the daemon to take the garbage", || {
            ring.word(64).unwrap().load(Ordering::Acquire) == want
        });
    }
    ring.word(0).unwrap().store(u64::MAX / 3, Ordering::SeqCst);
    bad.mark_doorbell_for_tests();
    wait_until("the daemon to refuse the broken ring", || {
        ring.word(64).unwrap().load(Ordering::Acquire) == u64::MAX / 3
    });
    // The broken VQP refuses every later doorbell, typed.
    match bad.post(&[SendWr::read(1, abuf.sge(0, 8).unwrap(), n.remote(0))]) {
        Err(DaemonError::Post {
            code: PostCode::Broken,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // A completion head that runs ahead stalls only that VQP.
    good.post(&[SendWr::read(2, abuf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    good.wait(1, WAIT).unwrap();
    other
        .post(&[SendWr::read(3, bbuf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    assert_eq!(other.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    assert!(n.daemon().stats().refused_doorbells >= 1);
}

#[test]
fn a_process_that_goes_has_its_vqps_and_memory_released() {
    let n = Node::new(DaemonConfig::default());
    {
        let a = n.attach();
        let _buf = local(&a);
        let _v1 = n.vqp(&a);
        let _v2 = n.vqp(&a);
        let st = n.daemon().stats();
        assert_eq!((st.clients, st.vqps, st.mr_bytes), (1, 2, 4096));
        // An Attached kept only by its regions and VQPs stays attached;
        // dropping all of them closes the socket.
    }
    wait_until("the daemon to release the process", || {
        let st = n.daemon().stats();
        (st.clients, st.vqps, st.mr_bytes, st.detached) == (0, 0, 0, 1)
    });
}

#[test]
fn a_killed_process_has_everything_released_and_others_go_on() {
    let n = Node::new(DaemonConfig::default());
    let daemon = n.daemon();
    let survivor = n.attach();
    let sbuf = survivor.alloc(64, Access::LOCAL_WRITE).unwrap();
    let sv = n.vqp(&survivor);
    let path = n.path.clone();
    let p2 = path.clone();
    let child = krcore_nic::sim::fork_process(move || {
        let Ok(a) = Attached::attach(&p2) else {
            return 2;
        };
        let Ok(buf) = a.alloc(1 << 20, Access::LOCAL_WRITE) else {
            return 3;
        };
        let Ok(v) = a.create_vqp() else { return 4 };
        let _ = buf.write(0, b"child");
        std::mem::forget((buf, v));
        loop {
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .unwrap();
    wait_until("the child to attach", || {
        daemon.stats().mr_bytes >= 64 + (1 << 20)
    });
    let kill = std::process::Command::new("kill")
        .args(["-9", &child.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let _ = child.wait();
    wait_until("the daemon to release the killed process", || {
        let st = daemon.stats();
        (st.clients, st.vqps, st.mr_bytes) == (1, 1, 64)
    });
    sv.post(&[SendWr::read(1, sbuf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    assert_eq!(sv.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
}

#[test]
fn attach_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    match Attached::attach(dir.path().join("none.sock")) {
        Err(DaemonError::NoDaemon { .. }) => {}
        other => panic!("{other:?}"),
    }
    // Something listens there and never answers: typed, in bounded time.
    let silent = dir.path().join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let bound = Duration::from_millis(100);
    match Attached::attach_timeout(&silent, bound) {
        Err(DaemonError::Unanswered { what, after }) => {
            assert_eq!((what, after), ("attach", bound));
        }
        other => panic!("{other:?}"),
    }
    let n = Node::new(DaemonConfig {
        max_vqps: 2,
        max_mr_bytes: 8192,
        ..Default::default()
    });
    // A process of another protocol version.
    let mut s = std::os::unix::net::UnixStream::connect(&n.path).unwrap();
    s.write_all(
        &Request::Hello {
            version: 99,
            pid: 1,
        }
        .encode(),
    )
    .unwrap();
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).unwrap();
    let mut body = vec![0u8; frame_len(prefix).unwrap()];
    s.read_exact(&mut body).unwrap();
    match Reply::decode(&body).unwrap() {
        Reply::Refused {
            code: RefuseCode::Version,
            message,
        } => assert!(message.contains("99"), "{message}"),
        other => panic!("{other:?}"),
    }
    // A first message that is not Hello; then garbage frames.
    let mut s = std::os::unix::net::UnixStream::connect(&n.path).unwrap();
    s.write_all(&Request::CreateVqp.encode()).unwrap();
    s.read_exact(&mut prefix).unwrap();
    let mut body = vec![0u8; frame_len(prefix).unwrap()];
    s.read_exact(&mut body).unwrap();
    assert!(matches!(
        Reply::decode(&body).unwrap(),
        Reply::Refused {
            code: RefuseCode::BadRequest,
            ..
        }
    ));
    // Quotas.
    let a = n.attach();
    let _v1 = a.create_vqp().unwrap();
    let _v2 = a.create_vqp().unwrap();
    match a.create_vqp() {
        Err(DaemonError::Refused {
            code: RefuseCode::Quota,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let _m = a.alloc(8192, Access::LOCAL_WRITE).unwrap();
    match a.alloc(1, Access::LOCAL_WRITE) {
        Err(DaemonError::Refused {
            code: RefuseCode::Quota,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Another process is not charged for the first one's use.
    let b = n.attach();
    let _bv = b.create_vqp().unwrap();
    let _bm = b.alloc(4096, Access::LOCAL_WRITE).unwrap();
}

#[test]
fn a_daemon_that_stops_fails_its_processes_typed_and_they_attach_again() {
    let mut n = Node::new(DaemonConfig::default());
    let a = n.attach();
    let buf = local(&a);
    let v = n.vqp(&a);
    // Idle long enough for the data thread to sleep: a post wakes it.
    wait_until("the data thread to sleep", || n.daemon().stats().sleeps > 0);
    v.post(&[SendWr::read(1, buf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    v.wait(1, WAIT).unwrap();
    let engine = n.engine().clone();
    n.daemon.take().unwrap().shutdown();
    let start = Instant::now();
    match v.post(&[SendWr::read(2, buf.sge(0, 8).unwrap(), n.remote(0))]) {
        Err(DaemonError::Gone { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(a.create_vqp(), Err(DaemonError::Gone { .. })));
    drop((v, buf, a));
    // A new daemon on the same socket: processes attach again.
    n.daemon = Some(Daemon::start(engine, &n.path, DaemonConfig::default()).unwrap());
    let a = n.attach();
    let buf = local(&a);
    let v = n.vqp(&a);
    v.post(&[SendWr::read(3, buf.sge(0, 8).unwrap(), n.remote(0))])
        .unwrap();
    v.wait(1, WAIT).unwrap();
    // A second daemon on a live socket is refused.
    assert!(Daemon::start(n.engine().clone(), &n.path, DaemonConfig::default()).is_err());
    let _ = &n.c;
}
