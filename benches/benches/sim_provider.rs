//! The sim provider's data path, single thread: one-sided operations posted
//! and polled one at a time, and 16 READs in one doorbell (only the last
//! signaled, as applications do) against 16 signaled single posts.
//!
//! Run: `cargo bench -p krcore-benches --bench sim_provider`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use krcore_nic::conformance::{rc_pair, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;

fn poll_one<C: CompletionQueue>(cq: &C) -> Wc {
    let mut wc = [Wc::default()];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
    }
}

fn bench_fabric(c: &mut Criterion, label: &str, fabric: &SimFabric) {
    let a = SimNic::open(fabric, SimConfig::default()).unwrap();
    let b = SimNic::open(fabric, SimConfig::default()).unwrap();
    let (sa, sb) = (Side::new(&a, 1 << 16), Side::new(&b, 1 << 16));
    let caps = QpCaps {
        max_send_wr: 64,
        ..QpCaps::default()
    };
    let (qa, _qb) = rc_pair(&sa, &sb, caps);
    let local = sa.mr.sge(0, 64).unwrap();
    let word = sa.mr.sge(64, 8).unwrap();
    let remote = sb.mr.remote(0);

    let mut g = c.benchmark_group(format!("sim/{label}"));
    g.throughput(Throughput::Elements(1));
    g.bench_function("read_64B", |bch| {
        let wr = SendWr::read(1, local, remote);
        bch.iter(|| {
            qa.post_send(std::slice::from_ref(&wr)).unwrap();
            poll_one(&sa.cq)
        })
    });
    g.bench_function("write_64B", |bch| {
        let wr = SendWr::write(2, local, remote);
        bch.iter(|| {
            qa.post_send(std::slice::from_ref(&wr)).unwrap();
            poll_one(&sa.cq)
        })
    });
    g.bench_function("cas_8B", |bch| {
        let wr = SendWr::cas(3, word, remote.offset(4096), 0, 0);
        bch.iter(|| {
            qa.post_send(std::slice::from_ref(&wr)).unwrap();
            poll_one(&sa.cq)
        })
    });
    g.throughput(Throughput::Elements(16));
    let batch: Vec<SendWr> = (0..16u64)
        .map(|i| {
            SendWr::read(
                i,
                sa.mr.sge(64 * i as usize, 64).unwrap(),
                remote.offset(64 * i),
            )
            .signaled(i == 15)
        })
        .collect();
    g.bench_function("read_64B_x16_one_doorbell", |bch| {
        bch.iter(|| {
            qa.post_send(&batch).unwrap();
            poll_one(&sa.cq)
        })
    });
    let singles: Vec<SendWr> = batch.iter().map(|w| w.signaled(true)).collect();
    g.bench_function("read_64B_x16_single_posts", |bch| {
        bch.iter(|| {
            for w in &singles {
                qa.post_send(std::slice::from_ref(w)).unwrap();
                poll_one(&sa.cq);
            }
        })
    });
    g.finish();
}

fn sim(c: &mut Criterion) {
    bench_fabric(c, "mem", &SimFabric::in_memory());
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("krcore-bench-")
            .tempdir_in("/dev/shm")
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let fabric = SimFabric::open_dir(dir.path().join("fabric"), true).unwrap();
    bench_fabric(c, "shm", &fabric);
}

criterion_group!(benches, sim);
criterion_main!(benches);
