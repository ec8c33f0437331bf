//! A small deterministic cluster on a `sim:mem` fabric: one meta node running
//! the meta server (not polled: nodes register by local calls into its
//! table), memory nodes running an engine and registered in the table, and
//! client engines.
#![allow(dead_code)]

pub mod fallback;

use std::time::{Duration, Instant};

use krcore_kmod::{Engine, EngineConfig, MetaLocation, OwnedMr, RemoteGrant, Ungranted, Vqp};
use krcore_meta::entry::EntryRepr;
use krcore_meta::registry::{Lease, TableError};
use krcore_meta::table::Geometry;
use krcore_meta::{LocalMetaHost, MetaConfig};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, MemoryRegion, Nic, Wc};
use krcore_nic::{DcTarget, Gid};
use parking_lot::Mutex;

/// How long a test waits for completions before failing.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Cluster {
    pub fabric: SimFabric,
    pub meta: Mutex<LocalMetaHost<SimNic>>,
    pub location: MetaLocation,
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
            expires_at: None,
        }
    }
}

impl Cluster {
    pub fn new() -> Cluster {
        let fabric = SimFabric::in_memory();
        let nic = SimNic::open(&fabric, SimConfig::default()).expect("meta node");
        let cfg = MetaConfig {
            geometry: Geometry::with_buckets(64).unwrap(),
            ..MetaConfig::default()
        };
        let meta = LocalMetaHost::start(nic, cfg).expect("meta");
        let location = MetaLocation::from_bootstrap(&meta.bootstrap()).expect("location");
        Cluster {
            fabric,
            meta: Mutex::new(meta),
            location,
        }
    }

    /// Registers `target` in the table at time `now_ms`.
    pub fn register(
        &self,
        target: DcTarget,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, TableError> {
        self.meta
            .lock()
            .table_mut()
            .register(target, 0, lease_ms, now_ms)
    }

    /// Removes `gid`'s registration from the table, whichever DCT it names.
    pub fn deregister(&self, gid: &Gid) -> Result<EntryRepr, TableError> {
        let mut meta = self.meta.lock();
        let t = meta.table_mut();
        let dct = t.get(gid).map_or(0, |e| e.dct_num);
        t.deregister(gid, dct)
    }

    /// Sweeps leases expired at `now_ms`.
    pub fn sweep(&self, now_ms: u64) -> Vec<Gid> {
        self.meta.lock().table_mut().sweep(now_ms)
    }

    /// The meta node's NIC.
    pub fn meta_nic(&self) -> SimNic {
        self.meta.lock().nic().clone()
    }

    /// The table MR and the offset of `gid`'s entry in it.
    pub fn entry(&self, gid: &Gid) -> (<SimNic as krcore_nic::Nic>::Mr, usize) {
        let m = self.meta.lock();
        (m.table_mr().clone(), m.entry_offset(gid).expect("entry"))
    }

    pub fn nic(&self) -> SimNic {
        SimNic::open(&self.fabric, SimConfig::default()).expect("open a node")
    }

    /// An engine on a new node, pointed at the meta table. Its VQPs opt out
    /// of the grant rule ([`Ungranted::Allow`]): these tests post rkeys by
    /// hand, as raw verbs users do. `engine_lease.rs` tests the rule, on
    /// engines from [`Cluster::engine_granted`].
    pub fn engine(&self, mut cfg: EngineConfig) -> Engine<SimNic> {
        cfg.ungranted = Ungranted::Allow;
        self.engine_granted(cfg)
    }

    /// An engine on a new node, pointed at the meta table, with `cfg` as
    /// given (the grant rule its default: refuse).
    pub fn engine_granted(&self, cfg: EngineConfig) -> Engine<SimNic> {
        Engine::start(self.nic(), cfg.with_meta(self.location)).expect("engine")
    }

    /// A memory node with an `len`-byte MR (every access), registered in the
    /// meta table with a long lease.
    pub fn memory_node(&self, len: usize) -> MemNode {
        let engine = self.engine(EngineConfig::default().with_pool_size(1));
        let mr = engine.alloc_mr(len, Access::ALL).expect("MR");
        self.register(engine.local_target().unwrap(), 1 << 40, 0)
            .expect("register");
        MemNode { engine, mr }
    }

    /// A memory node that serves DC -> RC upgrades: an engine with `cfg`, a
    /// `len`-byte MR (every access), and both its DCT and its upgrade entry
    /// registered in the meta table with a long lease.
    #[allow(dead_code)] // not every test binary upgrades
    pub fn upgradable_node(&self, cfg: EngineConfig, len: usize) -> MemNode {
        let engine = self.engine(cfg);
        let mr = engine.alloc_mr(len, Access::ALL).expect("MR");
        self.register(engine.local_target().unwrap(), 1 << 40, 0)
            .expect("register");
        self.register(
            engine.handshake_entry().unwrap().expect("entry"),
            1 << 40,
            0,
        )
        .expect("register the upgrade entry");
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
