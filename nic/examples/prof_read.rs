//! Profiling loop: N 64-byte READs posted and polled one at a time on sim:mem.
use krcore_nic::conformance::{rc_pair, Side};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let f = SimFabric::in_memory();
    let a = SimNic::open(&f, SimConfig::default()).unwrap();
    let b = SimNic::open(&f, SimConfig::default()).unwrap();
    let (sa, sb) = (Side::new(&a, 1 << 16), Side::new(&b, 1 << 16));
    let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
    let wr = SendWr::read(1, sa.mr.sge(0, 64).unwrap(), sb.mr.remote(0));
    let mut wc = [Wc::default()];
    let t = std::time::Instant::now();
    for _ in 0..n {
        qa.post_send(std::slice::from_ref(&wr)).unwrap();
        while sa.cq.poll(&mut wc).unwrap() == 0 {}
    }
    println!(
        "{:.1} ns per READ round trip",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
