//! Profiling loop: 16 64-byte READs per doorbell (last signaled) on sim:mem.
use krcore_nic::conformance::{rc_pair, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let b = SimNic::open(&f, SimConfig::default()).unwrap();
    let (sa, sb) = (Side::new(&a, 1 << 16), Side::new(&b, 1 << 16));
    let (qa, _qb) = rc_pair(
        &sa,
        &sb,
        QpCaps {
            max_send_wr: 64,
            ..QpCaps::default()
        },
    );
    let batch: Vec<SendWr> = (0..16u64)
        .map(|i| {
            SendWr::read(
                i,
                sa.mr.sge(64 * i as usize, 64).unwrap(),
                sb.mr.remote(64 * i as usize),
            )
            .signaled(i == 15)
        })
        .collect();
    let mut wc = [Wc::default()];
    let t = std::time::Instant::now();
    for _ in 0..n {
        qa.post_send(&batch).unwrap();
        while sa.cq.poll(&mut wc).unwrap() == 0 {}
    }
    println!(
        "{:.1} ns per WR (16-WR doorbells)",
        t.elapsed().as_nanos() as f64 / (16 * n) as f64
    );
}
