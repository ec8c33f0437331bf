//! The RC fallback counterpart of [`super::Cluster`]: a fabric of sim
//! devices without DC (`SimConfig { dc: false }`, like Soft-RoCE), the meta
//! table on an `RcMetaHost` (answering from its own thread), and engines
//! that answer handshakes from their own threads.

use krcore_kmod::{Engine, EngineConfig, MetaLocation, ProgressThread, RcMetaHost};
use krcore_meta::table::Geometry;
use krcore_meta::MetaConfig;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::Access;

use super::MemNode;

/// A fabric of devices without DC, with a fallback meta host.
pub struct Fabric {
    pub fabric: SimFabric,
    pub meta: RcMetaHost<SimNic>,
    pub location: MetaLocation,
    /// The meta host's device (to kill it).
    pub meta_nic: SimNic,
    _meta_thread: ProgressThread,
}

pub fn no_dc() -> SimConfig {
    SimConfig {
        dc: false,
        ..SimConfig::default()
    }
}

impl Fabric {
    pub fn new() -> Fabric {
        let fabric = SimFabric::in_memory();
        let nic = SimNic::open(&fabric, no_dc()).unwrap();
        let meta = RcMetaHost::start(
            nic.clone(),
            MetaConfig {
                geometry: Geometry::with_buckets(64).unwrap(),
                ..MetaConfig::default()
            },
            Default::default(),
        )
        .unwrap();
        let location = meta.location().unwrap();
        let thread = meta.spawn_progress().unwrap();
        Fabric {
            fabric,
            meta,
            location,
            meta_nic: nic,
            _meta_thread: thread,
        }
    }

    pub fn nic(&self) -> SimNic {
        SimNic::open(&self.fabric, no_dc()).unwrap()
    }

    /// An engine on a new node configured by `cfg`, reading the meta table.
    /// Its VQPs opt out of the grant rule, as `Cluster::engine`'s.
    pub fn engine(&self, mut cfg: EngineConfig) -> Engine<SimNic> {
        cfg.ungranted = krcore_kmod::Ungranted::Allow;
        Engine::start(self.nic(), cfg.with_meta(self.location)).unwrap()
    }

    /// A memory node registered (by a local call) in the meta table.
    pub fn memory_node(&self, len: usize) -> MemNode {
        let engine = self.engine(EngineConfig::default().with_handshake_thread(true));
        let mr = engine.alloc_mr(len, Access::ALL).unwrap();
        self.meta
            .table()
            .register(engine.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        MemNode { engine, mr }
    }

    /// A client engine answering handshakes from its own thread.
    pub fn client(&self) -> Engine<SimNic> {
        self.engine(EngineConfig::default().with_handshake_thread(true))
    }
}
