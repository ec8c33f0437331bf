//! The control plane on `sim:mem`: connect (warm: DCCache hit; cold: one READ
//! of the meta table) against the RC baseline a plain verbs application pays
//! (create an RC QP on both sides, swap QPNs over loopback TCP, bring both to
//! RTS); connects per second on 1 and 2 threads; the same paths under the
//! `cx4` latency model (modeled, beside measured software time); the VQP data
//! path against the raw provider; and the DCCache memory figure.
//!
//! Run: `cargo bench -p krcore-benches --bench control_plane`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use krcore_benches::baseline::{rc_connect_over_tcp, RcEndpoint};
use krcore_kmod::{DcCache, Engine, EngineConfig, MetaLocation, Vqp};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::conformance::Side;
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric, SimNic};
use krcore_nic::*;
use std::time::{Duration, Instant};

/// A meta server, a memory node and a client engine on one fabric.
struct Cluster {
    fabric: SimFabric,
    cfg: SimConfig,
    _meta: LocalMetaHost<SimNic>,
    location: MetaLocation,
    server: Engine<SimNic>,
    client: Engine<SimNic>,
}

impl Cluster {
    fn new(cfg: SimConfig) -> Cluster {
        let fabric = SimFabric::in_memory();
        let node = || SimNic::open(&fabric, cfg.clone()).unwrap();
        let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
        let location = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
        let ecfg = || {
            EngineConfig::default()
                .with_meta(location)
                .with_pool_size(2)
                // (Raw rkeys posted by hand: the grant rule's opt-out.)
                .with_ungranted(krcore_kmod::Ungranted::Allow)
        };
        let server = Engine::start(node(), ecfg()).unwrap();
        meta.table_mut()
            .register(server.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        let client = Engine::start(node(), ecfg()).unwrap();
        Cluster {
            fabric,
            cfg,
            _meta: meta,
            location,
            server,
            client,
        }
    }

    fn engine(&self) -> Engine<SimNic> {
        let nic = SimNic::open(&self.fabric, self.cfg.clone()).unwrap();
        Engine::start(
            nic,
            EngineConfig::default()
                .with_meta(self.location)
                .with_pool_size(2)
                .with_ungranted(krcore_kmod::Ungranted::Allow),
        )
        .unwrap()
    }
}

fn cold_connect(vqp: &Vqp<SimNic>, engine: &Engine<SimNic>, gid: Gid) {
    engine.invalidate(&gid);
    vqp.connect(gid).unwrap();
}

fn rc_endpoints(c: &Cluster) -> (RcEndpoint<SimNic>, RcEndpoint<SimNic>) {
    (
        RcEndpoint::new(c.client.nic().clone(), 64).unwrap(),
        RcEndpoint::new(c.server.nic().clone(), 64).unwrap(),
    )
}

fn connect(cr: &mut Criterion) {
    let c = Cluster::new(SimConfig::default());
    let gid = c.server.gid();
    let vqp = c.client.create_vqp().unwrap();
    vqp.connect(gid).unwrap();
    let mut g = cr.benchmark_group("connect/sim-mem");
    g.bench_function("warm (DCCache hit)", |b| {
        b.iter(|| vqp.connect(gid).unwrap())
    });
    g.bench_function("cold (one meta READ)", |b| {
        b.iter(|| cold_connect(&vqp, &c.client, gid))
    });
    let (ea, eb) = rc_endpoints(&c);
    g.sample_size(20);
    g.bench_function("rc baseline (create x2 + TCP QPN exchange + RTS)", |b| {
        b.iter_batched(
            || (),
            |_| rc_connect_over_tcp(&ea, &eb).unwrap(),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Connects per second on `threads` threads, each with its own engine and
/// VQP, `per` connects each; `cold` invalidates before every connect.
fn connect_rate(c: &Cluster, threads: usize, per: usize, cold: bool) -> f64 {
    let gid = c.server.gid();
    let engines: Vec<Engine<SimNic>> = (0..threads).map(|_| c.engine()).collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        for e in &engines {
            s.spawn(move || {
                let vqp = e.create_vqp().unwrap();
                for _ in 0..per {
                    if cold {
                        e.invalidate(&gid);
                    }
                    vqp.connect(gid).unwrap();
                }
            });
        }
    });
    (threads * per) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median wall time of `f` over `n` runs, and the median modeled control-path
/// nanoseconds it charged to `nics`.
fn timed(n: usize, nics: &[&SimNic], mut f: impl FnMut()) -> (Duration, f64) {
    let mut wall = Vec::with_capacity(n);
    let mut modeled = Vec::with_capacity(n);
    for _ in 0..n {
        let before: u64 = nics.iter().map(|x| x.counters().modeled_control_ns).sum();
        let t = Instant::now();
        f();
        wall.push(t.elapsed().as_nanos() as f64);
        let after: u64 = nics.iter().map(|x| x.counters().modeled_control_ns).sum();
        modeled.push((after - before) as f64);
    }
    (Duration::from_nanos(median(wall) as u64), median(modeled))
}

fn figures() {
    println!("\n== control plane figures (sim:mem, software time measured on this machine)");
    let c = Cluster::new(SimConfig::default());
    for threads in [1, 2] {
        println!(
            "connects/s on {threads} thread(s): warm {:>12.0}  cold {:>10.0}",
            connect_rate(&c, threads, 200_000, false),
            connect_rate(&c, threads, 20_000, true)
        );
    }
    let gid = c.server.gid();
    let vqp = c.client.create_vqp().unwrap();
    vqp.connect(gid).unwrap();
    let (warm, _) = timed(20_001, &[], || vqp.connect(gid).unwrap());
    let (cold, _) = timed(5_001, &[], || cold_connect(&vqp, &c.client, gid));
    let (ea, eb) = rc_endpoints(&c);
    let (rc, _) = timed(201, &[], || {
        rc_connect_over_tcp(&ea, &eb).unwrap();
    });
    println!("p50 warm connect {warm:?}, cold connect {cold:?}, RC baseline {rc:?}");
    println!(
        "RC baseline / cold connect = {:.0}x, / warm connect = {:.0}x (measured side by side)",
        rc.as_secs_f64() / cold.as_secs_f64(),
        rc.as_secs_f64() / warm.as_secs_f64()
    );

    // Under the cx4 model: completions are delayed in real time (so the cold
    // connect's wall time includes the modeled READ), and control-path calls
    // charge their modeled cost to the counters instead of sleeping.
    let m = LatencyModel::cx4();
    let c = Cluster::new(SimConfig {
        latency: Some(m),
        ..SimConfig::default()
    });
    let gid = c.server.gid();
    let vqp = c.client.create_vqp().unwrap();
    vqp.connect(gid).unwrap();
    let nics = [c.client.nic(), c.server.nic()];
    let (warm_m, warm_c) = timed(2_001, &nics, || vqp.connect(gid).unwrap());
    let (cold_m, cold_c) = timed(1_001, &nics, || cold_connect(&vqp, &c.client, gid));
    let (ea, eb) = rc_endpoints(&c);
    let (rc_sw, rc_c) = timed(101, &nics, || {
        rc_connect_over_tcp(&ea, &eb).unwrap();
    });
    let total = |d: Duration, ns: f64| d.as_secs_f64() * 1e6 + ns / 1e3;
    println!(
        "modeled (cx4): warm connect {:.2} us (measured {warm_m:?} + modeled control {:.0} ns)",
        total(warm_m, warm_c),
        warm_c
    );
    println!(
        "modeled (cx4): cold connect {:.2} us (measured {cold_m:?}, which includes the modeled READ latency, + modeled control {:.0} ns)",
        total(cold_m, cold_c),
        cold_c
    );
    println!(
        "modeled (cx4): RC baseline {:.1} us (measured software {rc_sw:?} + modeled control {:.2} ms); RC / cold = {:.0}x",
        total(rc_sw, rc_c),
        rc_c / 1e6,
        total(rc_sw, rc_c) / total(cold_m, cold_c)
    );

    // Memory: what the DCCache holds per target vs what one RC QP per
    // target pins.
    // Sized for 10,000 (two-choice placement over 8-way buckets, with the
    // cache's own headroom): every target fits.
    let cache = DcCache::new(10_000);
    for i in 0..10_000u32 {
        let mut g = [0u8; 16];
        g[..4].copy_from_slice(&i.to_le_bytes());
        cache.insert(
            DcTarget {
                gid: Gid(g),
                dct_num: i,
                dc_key: i as u64,
            },
            1,
        );
    }
    let bytes = cache.memory_bytes();
    let caps = QpCaps::default();
    // Host memory of one RC QP's work queues with these caps, at the usual
    // mlx5 sizes: 64 B per send WQE, 16 B per receive SGE (plus the NIC's QP
    // context, not counted).
    let rc_host = caps.max_send_wr as usize * 64
        + caps.max_recv_wr as usize * 16 * caps.max_recv_sge as usize;
    println!(
        "DCCache (capacity {}, {} slots) holding {} of 10000 targets: {} bytes ({:.1} B per target held, {:.3} MiB); one RC QP per target would pin >= {} B each ({:.1} MiB for 10000)",
        cache.capacity(),
        cache.slots(),
        cache.len(),
        bytes,
        bytes as f64 / cache.len().max(1) as f64,
        bytes as f64 / (1 << 20) as f64,
        rc_host,
        (rc_host * 10_000) as f64 / (1 << 20) as f64
    );
}

fn data_path(cr: &mut Criterion) {
    let c = Cluster::new(SimConfig::default());
    let gid = c.server.gid();
    let remote = c.server.alloc_mr(1 << 16, Access::ALL).unwrap();
    // Raw provider: a DCI of the client's node aimed at the server's DCT.
    let raw = Side::new(c.client.nic(), 1 << 16);
    let dci = raw.qp(
        QpType::Dci,
        QpCaps {
            max_send_wr: 64,
            ..QpCaps::default()
        },
        None,
        0,
    );
    bring_up(&dci, Access::NONE, None).unwrap();
    let to = Destination::Dc(c.server.local_target().unwrap());
    // VQP: the engine's path (pre-check, wr_id routing, credits).
    let vqp = c.client.create_vqp().unwrap();
    vqp.connect(gid).unwrap();
    let local = c.client.alloc_mr(1 << 16, Access::ALL).unwrap();

    let mut g = cr.benchmark_group("read64/sim-mem");
    g.bench_function("raw provider, sync", |b| {
        let wr = SendWr::read(1, raw.mr.sge(0, 64).unwrap(), remote.remote(0)).to(to);
        let mut wc = [Wc::default()];
        b.iter(|| {
            dci.post_send(std::slice::from_ref(&wr)).unwrap();
            while raw.cq.poll(&mut wc).unwrap() == 0 {}
        })
    });
    g.bench_function("VQP, sync", |b| {
        let mut wc = [Wc::default()];
        // post_send hands the WRs back as written: reused, like the raw WR.
        let mut wr = [SendWr::read(1, local.sge(0, 64).unwrap(), remote.remote(0))];
        b.iter(|| {
            vqp.post_send(&mut wr).unwrap();
            while vqp.poll(&mut wc).unwrap() == 0 {}
        })
    });
    g.throughput(criterion::Throughput::Elements(16));
    g.bench_function("raw provider, 16-WR doorbell", |b| {
        let batch: Vec<SendWr> = (0..16u64)
            .map(|i| {
                SendWr::read(
                    i,
                    raw.mr.sge(64 * i as usize, 64).unwrap(),
                    remote.remote(64 * i as usize),
                )
                .to(to)
                .signaled(i == 15)
            })
            .collect();
        let mut wc = [Wc::default()];
        b.iter(|| {
            dci.post_send(&batch).unwrap();
            while raw.cq.poll(&mut wc).unwrap() == 0 {}
        })
    });
    g.bench_function("VQP, 16-WR doorbell", |b| {
        let mut wc = [Wc::default()];
        let mut batch = vqp_batch(&local, &remote);
        b.iter(|| {
            vqp.post_send(&mut batch).unwrap();
            while vqp.poll(&mut wc).unwrap() == 0 {}
        })
    });
    g.finish();

    // The same four loops interleaved (raw, VQP, raw, VQP...), so that the
    // ratio is not skewed by the machine's load drifting between criterion's
    // back-to-back groups.
    let raw_sync = SendWr::read(1, raw.mr.sge(0, 64).unwrap(), remote.remote(0)).to(to);
    let raw_batch: Vec<SendWr> = (0..16u64)
        .map(|i| {
            SendWr::read(
                i,
                raw.mr.sge(64 * i as usize, 64).unwrap(),
                remote.remote(64 * i as usize),
            )
            .to(to)
            .signaled(i == 15)
        })
        .collect();
    let mut vqp_sync = [SendWr::read(1, local.sge(0, 64).unwrap(), remote.remote(0))];
    let mut vqp_b = vqp_batch(&local, &remote);
    let mut wc = [Wc::default()];
    let time = |ops: u32, f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..ops {
            f();
        }
        t.elapsed().as_nanos() as f64 / f64::from(ops)
    };
    let (mut sync, mut batched) = (Vec::new(), Vec::new());
    let mut ns = [0.0f64; 4];
    for _ in 0..31 {
        let r = time(2000, &mut || {
            dci.post_send(std::slice::from_ref(&raw_sync)).unwrap();
            while raw.cq.poll(&mut wc).unwrap() == 0 {}
        });
        let v = time(2000, &mut || {
            vqp.post_send(&mut vqp_sync).unwrap();
            while vqp.poll(&mut wc).unwrap() == 0 {}
        });
        let rb = time(200, &mut || {
            dci.post_send(&raw_batch).unwrap();
            while raw.cq.poll(&mut wc).unwrap() == 0 {}
        });
        let vb = time(200, &mut || {
            vqp.post_send(&mut vqp_b).unwrap();
            while vqp.poll(&mut wc).unwrap() == 0 {}
        });
        sync.push(v / r);
        batched.push(vb / rb);
        ns = [r, v, rb / 16.0, vb / 16.0];
    }
    println!(
        "\n== 64 B READ, VQP / raw provider, interleaved (median of 31 rounds): sync {:.2}x, 16-WR doorbell {:.2}x (last round: raw {:.0} ns, VQP {:.0} ns per sync op; raw {:.0} ns, VQP {:.0} ns per WR batched)",
        median(sync),
        median(batched),
        ns[0],
        ns[1],
        ns[2],
        ns[3]
    );
}

/// 16 64-byte READs, the last signaled, through the engine's MRs.
fn vqp_batch(local: &krcore_kmod::OwnedMr<SimNic>, remote: &<SimNic as Nic>::Mr) -> [SendWr; 16] {
    std::array::from_fn(|i| {
        SendWr::read(
            i as u64,
            local.sge(64 * i, 64).unwrap(),
            remote.remote(64 * i),
        )
        .signaled(i == 15)
    })
}

fn all(cr: &mut Criterion) {
    connect(cr);
    data_path(cr);
    figures();
}

criterion_group!(benches, all);
criterion_main!(benches);
