//! Profiling loop: N 64-byte READs through one VQP (post + poll) on sim:mem.
use krcore_kmod::{Engine, EngineConfig, MetaLocation};
use krcore_meta::{MetaConfig, MetaServer};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let batch: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let f = SimFabric::in_memory();
    let node = || SimNic::open(&f, SimConfig::default()).unwrap();
    let mut meta = MetaServer::start(node(), MetaConfig::default()).unwrap();
    let loc = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
    let server = Engine::start(
        node(),
        EngineConfig::default().with_meta(loc).with_pool_size(1),
    )
    .unwrap();
    meta.table_mut()
        .register(server.local_target(), 0, 1 << 40, 0)
        .unwrap();
    let client = Engine::start(
        node(),
        EngineConfig::default().with_meta(loc).with_pool_size(1),
    )
    .unwrap();
    let remote = server.alloc_mr(1 << 16, Access::ALL).unwrap();
    let local = client.alloc_mr(1 << 16, Access::ALL).unwrap();
    let vqp = client.create_vqp().unwrap();
    vqp.connect(server.gid()).unwrap();
    let mut wc = [Wc::default()];
    let t = std::time::Instant::now();
    for _ in 0..n {
        let mut wrs: Vec<SendWr> = (0..batch)
            .map(|i| {
                SendWr::read(
                    i as u64,
                    local.sge(64 * i, 64).unwrap(),
                    remote.remote(64 * i),
                )
                .signaled(i + 1 == batch)
            })
            .collect();
        vqp.post_send(&mut wrs).unwrap();
        while vqp.poll(&mut wc).unwrap() == 0 {}
    }
    println!(
        "{:.1} ns per WR (batch {batch})",
        t.elapsed().as_nanos() as f64 / (n as f64 * batch as f64)
    );
}
