//! Profiling loop: connects on sim:mem as the `control_plane` bench makes
//! them: cold (the DCCache entry invalidated first, so one meta READ each,
//! the default) or `warm` (a DCCache hit).
//!
//! `prof_connect [n] [cold|warm]`
//!
//! The measured loop is the non-inlined `connect_loop`, so that
//! `valgrind --tool=callgrind --toggle-collect='*connect_loop*'` counts its
//! instructions only; divide by `n` for instructions per connect (a count
//! that does not depend on the machine's load, unlike the bench's time).
use krcore_kmod::{Engine, EngineConfig, MetaLocation};
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::*;

#[inline(never)]
fn connect_loop(
    vqp: &krcore_kmod::Vqp<SimNic>,
    engine: &Engine<SimNic>,
    gid: Gid,
    n: usize,
    cold: bool,
) {
    for _ in 0..n {
        if cold {
            engine.invalidate(&gid);
        }
        vqp.connect(gid).unwrap();
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20000);
    let cold = std::env::args().nth(2).as_deref() != Some("warm");
    let fabric = SimFabric::in_memory();
    let node = || SimNic::open(&fabric, SimConfig::default()).unwrap();
    let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
    let location = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
    let ecfg = || {
        EngineConfig::default()
            .with_meta(location)
            .with_pool_size(2)
            .with_ungranted(krcore_kmod::Ungranted::Allow)
    };
    let server = Engine::start(node(), ecfg()).unwrap();
    meta.table_mut()
        .register(server.local_target().unwrap(), 0, 1 << 40, 0)
        .unwrap();
    let client = Engine::start(node(), ecfg()).unwrap();
    let gid = server.gid();
    let vqp = client.create_vqp().unwrap();
    vqp.connect(gid).unwrap();
    connect_loop(&vqp, &client, gid, n, cold);
}
