//! The data path through the node daemon against the same engine used
//! in-process, side by side: a synchronous 64-byte READ (post, then poll
//! until its completion) and a 16-WR doorbell (per WR), on `sim:mem` with
//! no latency model (software time alone) and under the `cx4` model
//! (groups `*_cx4_modeled`: each completion becomes visible at its
//! modeled hardware time, ~2.15 us for a READ, so the ratio is the one a
//! process sees on a NIC; KRCore's system call costs +46% on its sync
//! READ). The daemon's figure includes the hand-off to its data thread and
//! back through the shared ring (no system call while it is busy).
//!
//! Group `daemon/read64_sync_one_cpu` runs the synchronous READ with the
//! process thread and the daemon's data thread on one CPU (as on a node
//! with more waiting threads than cores): each doorbell then costs the
//! two threads' hand-over of that CPU (before the two sides told each
//! other their CPUs, a waiter spun and the data thread idled 20 us before
//! either yielded: 31 us per READ against 5.5 us after, 2026-12-07).
//!
//! Run: `cargo bench -p krcore-benches --bench daemon`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use krcore_kmod::daemon::{Attached, AttachedMr, AttachedVqp, Daemon, DaemonConfig};
use krcore_kmod::{Engine, EngineConfig, MetaLocation, OwnedMr, RemoteGrant, Vqp};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// One client engine, used in-process and served by a daemon, and a
/// memory node to READ from.
struct Setup {
    // Kept alive: the memory node, the meta server, the daemon.
    _meta: LocalMetaHost<SimNic>,
    _server: Engine<SimNic>,
    region: OwnedMr<SimNic>,
    daemon: Daemon<SimNic>,
    _dir: tempfile::TempDir,
    // In-process.
    v: Vqp<SimNic>,
    local: OwnedMr<SimNic>,
    // Through the daemon.
    av: AttachedVqp,
    abuf: AttachedMr,
    _a: Attached,
}

impl Setup {
    fn new(latency: Option<LatencyModel>) -> Setup {
        let fabric = SimFabric::in_memory();
        let node = || {
            SimNic::open(
                &fabric,
                SimConfig {
                    latency,
                    ..SimConfig::default()
                },
            )
            .unwrap()
        };
        let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
        let location = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
        let cfg = || {
            EngineConfig::default()
                .with_meta(location)
                .with_pool_size(2)
        };
        let server = Engine::start(node(), cfg()).unwrap();
        meta.table_mut()
            .register(server.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        let region = server.alloc_mr(1 << 16, Access::ALL).unwrap();
        let grant = RemoteGrant {
            addr: region.addr(),
            len: 1 << 16,
            access: Access::ALL,
            expires_at: None,
        };
        let engine = Engine::start(node(), cfg()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("krcored.sock");
        let daemon = Daemon::start(engine.clone(), &path, DaemonConfig::default()).unwrap();
        let local = engine.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        let v = engine.create_vqp().unwrap();
        v.connect(server.gid()).unwrap();
        v.add_grant(server.gid(), region.rkey(), grant);
        let a = Attached::attach(&path).unwrap();
        let abuf = a.alloc(4096, Access::LOCAL_WRITE).unwrap();
        let av = a.create_vqp().unwrap();
        av.connect(server.gid()).unwrap();
        av.add_grant(server.gid(), region.rkey(), grant).unwrap();
        Setup {
            _meta: meta,
            _server: server,
            region,
            daemon,
            _dir: dir,
            v,
            local,
            av,
            abuf,
            _a: a,
        }
    }

    fn remote(&self, off: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.region.addr() + off,
            rkey: self.region.rkey(),
        }
    }

    fn bench(&self, c: &mut Criterion, suffix: &str) {
        let mut wcs = [Wc::default(); 16];
        let mut g = c.benchmark_group(format!("daemon/read64_sync{suffix}"));
        g.bench_function("in_process", |b| {
            let mut wr = [SendWr::read(
                1,
                self.local.mr().sge(0, 64).unwrap(),
                self.remote(0),
            )];
            b.iter(|| {
                self.v.post_send(&mut wr).unwrap();
                while self.v.poll(&mut wcs).unwrap() == 0 {}
            })
        });
        g.bench_function("daemon", |b| {
            let wr = [SendWr::read(
                1,
                self.abuf.sge(0, 64).unwrap(),
                self.remote(0),
            )];
            b.iter(|| {
                self.av.post(&wr).unwrap();
                self.av.wait(1, WAIT).unwrap();
            })
        });
        g.finish();

        let batch = |sge: &dyn Fn(usize) -> Sge| -> Vec<SendWr> {
            (0..16)
                .map(|i| {
                    SendWr::read(i as u64, sge(i), self.remote(64 * i as u64)).signaled(i == 15)
                })
                .collect()
        };
        let mut g = c.benchmark_group(format!("daemon/doorbell16{suffix}"));
        g.throughput(Throughput::Elements(16));
        g.bench_function("in_process", |b| {
            let mut wrs = batch(&|i| self.local.mr().sge(64 * i, 64).unwrap());
            b.iter(|| {
                self.v.post_send(&mut wrs).unwrap();
                while self.v.poll(&mut wcs).unwrap() == 0 {}
            })
        });
        g.bench_function("daemon", |b| {
            let wrs = batch(&|i| self.abuf.sge(64 * i, 64).unwrap());
            b.iter(|| {
                self.av.post(&wrs).unwrap();
                self.av.wait(1, WAIT).unwrap();
            })
        });
        g.finish();
        eprintln!("daemon{suffix} stats: {:?}", self.daemon.stats());
    }
}

/// The sync READ with this thread and the daemon's threads (started from
/// it, so they inherit its CPU mask) on this thread's CPU alone.
fn one_cpu(c: &mut Criterion) {
    let before = rustix::thread::sched_getaffinity(None).unwrap();
    let mut one = rustix::thread::CpuSet::new();
    one.set(rustix::thread::sched_getcpu());
    rustix::thread::sched_setaffinity(None, &one).unwrap();
    {
        let s = Setup::new(None);
        let mut g = c.benchmark_group("daemon/read64_sync_one_cpu");
        let wr = [SendWr::read(1, s.abuf.sge(0, 64).unwrap(), s.remote(0))];
        g.bench_function("daemon", |b| {
            b.iter(|| {
                s.av.post(&wr).unwrap();
                s.av.wait(1, WAIT).unwrap();
            })
        });
        g.finish();
    }
    rustix::thread::sched_setaffinity(None, &before).unwrap();
}

fn bench(c: &mut Criterion) {
    one_cpu(c);
    Setup::new(None).bench(c, "");
    // Labelled "modeled" in its group name: the completions wait their
    // cx4 hardware time for real; the software time is the group above.
    Setup::new(Some(LatencyModel::cx4())).bench(c, "_cx4_modeled");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
