//! Two-sided messaging on `sim` (no latency model: measured software time):
//! echo latency (push, pop, reply, pop the reply) and one-way throughput
//! (a window of pushes, then their pops) for 64 B, 4 KB and 1 MB messages,
//! copied through the SRQ ("copy": `inline_max` above the size) or sent as
//! a descriptor and pulled with one READ ("zero-copy": `inline_max` 0); a
//! size sweep that prints the measured crossover; and the time from
//! `fork` to the first completed READ in a forked worker (a `/dev/shm`
//! fabric).
//!
//! Every echo runs both sides in the bench thread (no progress threads):
//! the figures are the software cost of the path, free of cross-thread
//! wake-ups, which this machine's load would dominate.
//!
//! Run: `cargo bench -p krcore-benches --bench messaging`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use krcore_kmod::{Endpoint, Engine, EngineConfig, MetaLocation, Port};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::Gid;

const PORT: u16 = 9;
const WINDOW: u32 = 8;

/// A meta server, a receiving engine with a bound port, and a sending
/// engine's endpoint, with messages up to `inline_max` copied inline.
struct Pair {
    _meta: LocalMetaHost<SimNic>,
    _rx: Engine<SimNic>,
    _tx: Engine<SimNic>,
    port: Port<SimNic>,
    ep: Endpoint<SimNic>,
    to: Gid,
}

impl Pair {
    fn new(inline_max: usize) -> Pair {
        let fabric = SimFabric::in_memory();
        let node = || SimNic::open(&fabric, SimConfig::default()).unwrap();
        let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
        let location = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
        let cfg = || {
            let mut c = EngineConfig::default()
                .with_meta(location)
                .with_pool_size(2);
            // Receive slots (and staging rings) as large as the largest
            // inline message: keep their number small.
            c.recv_depth = 48;
            c.vqp_depth = 32;
            c.msg.inline_max = inline_max;
            c.msg.window = WINDOW;
            c.msg.reply_window = WINDOW;
            c.msg.port_slots = 16;
            c.msg.ctl_slots = 16;
            c.msg.max_message = 4 << 20;
            c
        };
        let rx = Engine::start(node(), cfg()).unwrap();
        let tx = Engine::start(node(), cfg()).unwrap();
        for e in [&rx, &tx] {
            meta.table_mut()
                .register(e.local_target().unwrap(), 0, 1 << 40, 0)
                .unwrap();
        }
        let port = rx.bind(PORT).unwrap();
        let ep = tx.endpoint().unwrap();
        let to = rx.gid();
        let p = Pair {
            _meta: meta,
            _rx: rx,
            _tx: tx,
            port,
            ep,
            to,
        };
        // Open the channel: the port answers from its engine's progress,
        // driven here by a helper thread for the Open's round trip only.
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    p._rx.msg_progress().unwrap();
                    std::thread::yield_now();
                }
            });
            p.ep.push(p.to, PORT, &[0u8; 8]).unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let m = p.port.try_pop().unwrap().expect("delivered");
        p.port.reply(&m, b"open").unwrap();
        drop(m);
        p.ep.try_pop_reply().unwrap().expect("delivered");
        p.port.return_credits().unwrap();
        p
    }

    fn echo(&self, data: &[u8]) {
        self.ep.push(self.to, PORT, data).unwrap();
        let m = self.port.try_pop().unwrap().expect("delivered at post");
        self.port.reply(&m, data).unwrap();
        drop(m);
        let r = self.ep.try_pop_reply().unwrap().expect("delivered at post");
        assert_eq!(r.len(), data.len());
    }

    /// `WINDOW` pushes, then their pops (the credits come back with them).
    fn burst(&self, data: &[u8]) {
        for _ in 0..WINDOW {
            self.ep.try_push(self.to, PORT, data).unwrap();
        }
        for _ in 0..WINDOW {
            let m = self.port.try_pop().unwrap().expect("delivered at post");
            assert_eq!(m.len(), data.len());
        }
        // The whole window back at once (a batch consumer).
        self.port.return_credits().unwrap();
    }
}

const SIZES: [(usize, &str); 3] = [(64, "64B"), (4096, "4KB"), (1 << 20, "1MB")];

fn modes(size: usize) -> [(&'static str, usize); 2] {
    [("copy", size.max(8)), ("zero-copy", 0)]
}

fn echo_latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("msg_echo");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (size, name) in SIZES {
        let data = vec![7u8; size];
        for (mode, inline_max) in modes(size) {
            let p = Pair::new(inline_max);
            g.throughput(Throughput::Bytes(2 * size as u64));
            g.bench_function(format!("{name}/{mode}"), |b| b.iter(|| p.echo(&data)));
        }
    }
    g.finish();
}

fn one_way_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("msg_burst");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (size, name) in SIZES {
        let data = vec![7u8; size];
        for (mode, inline_max) in modes(size) {
            let p = Pair::new(inline_max);
            g.throughput(Throughput::Bytes(u64::from(WINDOW) * size as u64));
            g.bench_function(format!("{name}/{mode}"), |b| b.iter(|| p.burst(&data)));
        }
    }
    g.finish();
}

/// Median echo times of `data` on `a` and `b` over `reps` runs,
/// interleaved (a, b, a, b, ...) so that both see the same load.
fn median_echoes(a: &Pair, b: &Pair, data: &[u8], reps: usize) -> (Duration, Duration) {
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let s = Instant::now();
        a.echo(data);
        ta.push(s.elapsed());
        let s = Instant::now();
        b.echo(data);
        tb.push(s.elapsed());
    }
    ta.sort();
    tb.sort();
    (ta[reps / 2], tb[reps / 2])
}

/// Echo time of copy vs zero-copy across sizes, side by side in one run;
/// prints the table and the crossover: the smallest size from which
/// zero-copy is faster at every larger size measured.
fn crossover(_c: &mut Criterion) {
    let sizes: Vec<usize> = (6..=21).map(|k| 1usize << k).collect(); // 64 B .. 2 MiB
    let copy = Pair::new(2 << 20);
    let zero = Pair::new(0);
    println!("\nmsg crossover (median echo, interleaved; measured software time, no model)");
    println!(
        "{:>9} {:>12} {:>12} {:>7}",
        "size", "copy", "zero-copy", "z/c"
    );
    let mut faster = Vec::new();
    for &size in &sizes {
        let data = vec![3u8; size];
        let reps = if size >= 1 << 19 { 31 } else { 201 };
        let (a, b) = median_echoes(&copy, &zero, &data, reps);
        let ratio = b.as_secs_f64() / a.as_secs_f64();
        println!("{size:>9} {:>12?} {:>12?} {ratio:>7.2}", a, b);
        faster.push(b < a);
    }
    let from = (0..sizes.len()).find(|&i| faster[i..].iter().all(|&f| f));
    match from {
        Some(i) => println!("crossover: zero-copy faster from {} B on", sizes[i]),
        None => println!("crossover: copy faster at 2 MiB"),
    }
}

/// Fork start to the first completed READ in the worker, on a `/dev/shm`
/// fabric, over several forks (median and range printed).
fn fork_to_first_read(_c: &mut Criterion) {
    use krcore::{Access, Node};
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::Builder::new()
        .prefix("krcore-bench-fork-")
        .tempdir_in(base)
        .unwrap();
    let spec = format!("sim:{}/fabric", dir.path().display());
    let server = Node::builder().fabric(&spec).host_meta().build().unwrap();
    let client = Node::builder().join(&server).build().unwrap();
    let region = server.alloc(4096, Access::ALL).unwrap();
    region.write(0, &[5u8; 64]).unwrap();
    let token = region.token();
    client.connect(server.gid()).unwrap(); // warm DCCache
    let buf = client.alloc(4096, Access::LOCAL_WRITE).unwrap();
    let out = client.alloc(64, Access::LOCAL_WRITE).unwrap();
    let (mut total, mut inside) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let start = Instant::now();
        let mut w = client
            .fork(|node| {
                let entered = Instant::now();
                let ok = node
                    .connect(token.gid)
                    .and_then(|v| v.read(&buf, 0, &token, 0, 64)?.wait());
                if ok.is_err() {
                    return 1;
                }
                let _ = out.store_u64(0, start.elapsed().as_nanos() as u64);
                let _ = out.store_u64(8, entered.elapsed().as_nanos() as u64);
                0
            })
            .unwrap();
        assert_eq!(w.wait_timeout(Duration::from_secs(30)).unwrap(), Some(0));
        total.push(Duration::from_nanos(out.load_u64(0).unwrap()));
        inside.push(Duration::from_nanos(out.load_u64(8).unwrap()));
    }
    total.sort();
    inside.sort();
    let n = total.len();
    println!(
        "\nfork -> first completed READ in the worker (15 forks, measured software time): \
         median {:?} (min {:?}, max {:?}); inside the worker (entry -> READ done): \
         median {:?} (min {:?}, max {:?})",
        total[n / 2],
        total[0],
        total[n - 1],
        inside[n / 2],
        inside[0],
        inside[n - 1]
    );
}

criterion_group!(
    benches,
    // First, while the process is small (fork copies its page tables).
    fork_to_first_read,
    echo_latency,
    one_way_throughput,
    crossover
);
criterion_main!(benches);
