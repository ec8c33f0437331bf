//! The data path through the node daemon against the same engine used
//! in-process, side by side on `sim:mem`: a synchronous 64-byte READ
//! (post, then poll until its completion) and a 16-WR doorbell (per WR).
//! The daemon's figure includes the hand-off to its data thread and back
//! through the shared ring (no system call while it is busy); KRCore's
//! system call costs +46% on its sync READ.
//!
//! Run: `cargo bench -p krcore-benches --bench daemon`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use krcore_kmod::daemon::{Attached, Daemon, DaemonConfig};
use krcore_kmod::{Engine, EngineConfig, MetaLocation, RemoteGrant};
use krcore_meta::{MetaConfig, MetaServer};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn bench(c: &mut Criterion) {
    let fabric = SimFabric::in_memory();
    let node = || SimNic::open(&fabric, SimConfig::default()).unwrap();
    let mut meta = MetaServer::start(node(), MetaConfig::default()).unwrap();
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
    let remote = |off: u64| RemoteAddr {
        addr: region.addr() + off,
        rkey: region.rkey(),
    };
    let engine = Engine::start(node(), cfg()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("krcored.sock");
    let daemon = Daemon::start(engine.clone(), &path, DaemonConfig::default()).unwrap();

    // In-process.
    let local = engine.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let v = engine.create_vqp().unwrap();
    v.connect(server.gid()).unwrap();
    v.add_grant(server.gid(), region.rkey(), grant);
    // Through the daemon.
    let a = Attached::attach(&path).unwrap();
    let abuf = a.alloc(4096, Access::LOCAL_WRITE).unwrap();
    let av = a.create_vqp().unwrap();
    av.connect(server.gid()).unwrap();
    av.add_grant(server.gid(), region.rkey(), grant).unwrap();

    let mut wcs = [Wc::default(); 16];
    let mut g = c.benchmark_group("daemon/read64_sync");
    g.bench_function("in_process", |b| {
        let mut wr = [SendWr::read(1, local.mr().sge(0, 64).unwrap(), remote(0))];
        b.iter(|| {
            v.post_send(&mut wr).unwrap();
            while v.poll(&mut wcs).unwrap() == 0 {}
        })
    });
    g.bench_function("daemon", |b| {
        let wr = [SendWr::read(1, abuf.sge(0, 64).unwrap(), remote(0))];
        b.iter(|| {
            av.post(&wr).unwrap();
            av.wait(1, WAIT).unwrap();
        })
    });
    g.finish();

    let batch = |sge: &dyn Fn(usize) -> Sge| -> Vec<SendWr> {
        (0..16)
            .map(|i| SendWr::read(i as u64, sge(i), remote(64 * i as u64)).signaled(i == 15))
            .collect()
    };
    let mut g = c.benchmark_group("daemon/doorbell16");
    g.throughput(Throughput::Elements(16));
    g.bench_function("in_process", |b| {
        let mut wrs = batch(&|i| local.mr().sge(64 * i, 64).unwrap());
        b.iter(|| {
            v.post_send(&mut wrs).unwrap();
            while v.poll(&mut wcs).unwrap() == 0 {}
        })
    });
    g.bench_function("daemon", |b| {
        let wrs = batch(&|i| abuf.sge(64 * i, 64).unwrap());
        b.iter(|| {
            av.post(&wrs).unwrap();
            av.wait(1, WAIT).unwrap();
        })
    });
    g.finish();
    eprintln!("daemon stats: {:?}", daemon.stats());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
