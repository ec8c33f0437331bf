//! A small deterministic cluster on a `sim:mem` fabric: one meta node holding
//! the meta table ([`LocalMetaServer`]), memory nodes running an engine and
//! registered in the table, and client engines.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use krcore_kmod::{Engine, EngineConfig, LocalMetaServer, OwnedMr, RemoteGrant, Vqp};
use krcore_meta::table::Geometry;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, MemoryRegion, Nic, Wc};

/// How long a test waits for completions before failing.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Cluster {
    pub fabric: SimFabric,
    pub meta: LocalMetaServer<SimNic>,
}

/// A node whose memory peers reach: an engine (for its DCT) and one MR.
pub struct MemNode {
    pub engine: Engine<SimNic>,
    pub mr: OwnedMr<SimNic>,
}

impl MemNode {
    pub fn gid(&self) -> krcore_nic::Gid {
        self.engine.gid()
    }

    /// A grant over `off..off+len` of the node's MR.
    pub fn grant(&self, off: u64, len: u64, access: Access) -> RemoteGrant {
        RemoteGrant {
            addr: self.mr.addr() + off,
            len,
            access,
            expires_at: Instant::now() + Duration::from_secs(3600),
        }
    }
}

impl Cluster {
    pub fn new() -> Cluster {
        let fabric = SimFabric::in_memory();
        let nic = SimNic::open(&fabric, SimConfig::default()).expect("meta node");
        let meta = LocalMetaServer::start(nic, Geometry::with_buckets(64).unwrap()).expect("meta");
        Cluster { fabric, meta }
    }

    pub fn nic(&self) -> SimNic {
        SimNic::open(&self.fabric, SimConfig::default()).expect("open a node")
    }

    /// An engine on a new node, pointed at the meta table.
    pub fn engine(&self, cfg: EngineConfig) -> Engine<SimNic> {
        Engine::start(self.nic(), cfg.with_meta(self.meta.location())).expect("engine")
    }

    /// A memory node with an `len`-byte MR (every access), registered in the
    /// meta table with a long lease.
    pub fn memory_node(&self, len: usize) -> MemNode {
        let engine = self.engine(EngineConfig::default().with_pool_size(1));
        let mr = engine.alloc_mr(len, Access::ALL).expect("MR");
        self.meta
            .register(engine.local_target(), 1 << 40, 0)
            .expect("register");
        MemNode { engine, mr }
    }
}

/// Polls `vqp` until `n` completions arrived (bounded by [`WAIT`]).
pub fn wait_wcs(vqp: &Vqp<SimNic>, n: usize) -> Vec<Wc> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 16];
    while got.len() < n {
        let k = vqp.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        assert!(
            start.elapsed() < WAIT,
            "{} of {n} completions after {WAIT:?}: {got:?}",
            got.len()
        );
    }
    got
}

/// Asserts `vqp` has no completion to deliver right now.
pub fn assert_quiet(vqp: &Vqp<SimNic>) {
    let mut buf = [Wc::default(); 4];
    let k = vqp.poll(&mut buf).expect("poll");
    assert_eq!(k, 0, "unexpected completions {:?}", &buf[..k]);
}

/// The difference of the counters of `nic` across `f`.
pub fn counted<R>(nic: &SimNic, f: impl FnOnce() -> R) -> (R, krcore_nic::Counters) {
    let before = nic.counters();
    let r = f();
    (r, nic.counters() - before)
}

/// The default configuration changed by `f`.
pub fn config(f: impl FnOnce(&mut EngineConfig)) -> EngineConfig {
    let mut c = EngineConfig::default();
    f(&mut c);
    c
}
