//! The meta table on a fabric without DC: [`RcMetaHost`].
//!
//! **No deployment runs it any more**: the SDK's `host_meta` and the
//! `krcore-meta` binary host the table with [`super::MsgMetaHost`] in RC
//! fallback mode too (registration as messages over the RC pair, READs
//! over RC pairs with the host engine). It stays for the verbs tests and
//! `krcore_lat` that build their meta node on it (registering nodes by
//! local calls, [`RcMetaHost::table`]) until those move. Its responder
//! still answers meta requests in the [`krcore_meta::wire`] format that
//! arrive on its UD endpoint (through
//! [`MetaTable::handle`](krcore_meta::registry::MetaTable::handle)); the UD
//! RPC client is gone: no code of this workspace sends them any more.
//!
//! A `krcore_meta::LocalMetaHost` serves its table through a DCT and refuses a
//! device without DC. Its table MR lives in a PD of its own, which it does
//! not share, and a one-sided READ must arrive on a QP of the MR's PD (the
//! NIC checks it, and so does `sim`): a handshake responder run *beside* a
//! `LocalMetaHost` could pair RC QPs with clients, but their READs of the table
//! would fail with `REM_ACCESS_ERR`. So this host puts the same table engine
//! ([`krcore_meta::registry::MetaTable`] over an [`MrTable`], the same entry
//! layout, the same seqlock writes) in an MR of the PD of a
//! [`HandshakeResponder`], which pairs an RC QP with every engine that looks
//! the table up.
//!
//! ```text
//! engines (RC fallback)                 RcMetaHost (meta node)
//!   MetaClient: RC QP --- handshake --->  HandshakeResponder (UD QP)
//!               READ bucket ----------->  passive RC QP -> table MR  (same PD)
//!   (UD meta requests, if any) ------->  same UD QP -> MetaTable::handle
//! ```
//!
//! # What the bootstrap says
//!
//! [`RcMetaHost::bootstrap`] is a [`BootstrapRepr`] like a `LocalMetaHost`'s,
//! with one reinterpretation: `server.dct_num` is the responder's UD QPN and
//! `server.dc_key` its qkey (the RC fallback meaning of an entry, see
//! [`super::Engine::local_target`]); `rpc_qpn`/`rpc_qkey` name the same UD
//! QP. [`MetaLocation::from_bootstrap`] reads it unchanged; an engine in RC
//! fallback mode pairs with that endpoint.
//!
//! # CPU
//!
//! Like any responder, the host answers (handshakes, RPCs, and lease sweeps
//! every `lease_sweep_ms`) only from [`RcMetaHost::progress`] or the thread
//! of [`RcMetaHost::spawn_progress`]. Table READs need no host CPU.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use krcore_meta::mr_table::MrTable;
use krcore_meta::registry::MetaTable;
use krcore_meta::wire::BootstrapRepr;
use krcore_meta::MetaConfig;
use krcore_nic::{Access, DcTarget, MemoryRegion, Nic};
use parking_lot::{Mutex, MutexGuard};

use super::config::{HandshakeConfig, MetaLocation};
use super::error::EngineError;
use super::handshake_ud::{HandshakeResponder, MetaHook, ProgressThread};

/// The meta table served over RC fallback (see the module docs).
pub struct RcMetaHost<N: Nic> {
    responder: HandshakeResponder<N>,
    table: Arc<Mutex<MetaTable<MrTable<N::Mr>>>>,
    bootstrap: BootstrapRepr,
}

impl<N: Nic> std::fmt::Debug for RcMetaHost<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcMetaHost")
            .field("bootstrap", &self.bootstrap)
            .field("responder", &self.responder)
            .finish()
    }
}

fn wall_clock() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl<N: Nic> RcMetaHost<N> {
    /// Starts a host on `nic` (any device; DC is not used): a PD, the table
    /// MR (`REMOTE_READ | LOCAL_WRITE`, zeroed), and a handshake responder
    /// in the same PD.
    ///
    /// From `meta` it takes `geometry`, `first_epoch`, `incarnation` and
    /// `lease_sweep_ms` (with `MetaConfig`'s defaults); its `dc_key` is
    /// not used: the responder's `handshake` settings are.
    ///
    /// # Errors
    /// [`EngineError::Config`] for a table larger than memory or a bad
    /// handshake configuration; [`EngineError::Nic`] when the provider
    /// refuses an object.
    pub fn start(
        nic: N,
        meta: MetaConfig,
        handshake: HandshakeConfig,
    ) -> Result<RcMetaHost<N>, EngineError> {
        let geometry = meta.geometry;
        let len = super::meta_msg::table_len(&geometry)?;
        let pd = nic
            .alloc_pd()
            .map_err(EngineError::nic("allocate the meta host's PD"))?;
        let mr = nic
            .alloc_mr(&pd, len, Access::REMOTE_READ | Access::LOCAL_WRITE)
            .map_err(EngineError::nic("register the meta table"))?;
        let first_epoch = meta
            .first_epoch
            .unwrap_or_else(|| u32::try_from(wall_clock().as_secs()).unwrap_or(u32::MAX / 2));
        let incarnation = meta.incarnation.unwrap_or_else(|| {
            (wall_clock().as_nanos() as u64) ^ (u64::from(std::process::id()) << 40)
        });
        let table = MetaTable::with_first_epoch(geometry, MrTable::new(mr.clone()), first_epoch)
            .map_err(|e| EngineError::Config(format!("meta table: {e}")))?;
        let responder = HandshakeResponder::start(nic, pd, handshake)?;
        let ud = responder.target();
        let bootstrap = BootstrapRepr::new(
            geometry,
            mr.remote(0),
            incarnation,
            DcTarget {
                gid: ud.gid,
                dct_num: ud.qpn,
                dc_key: u64::from(ud.qkey),
            },
            ud,
        );
        let table = Arc::new(Mutex::new(table));
        responder.attach_meta(MetaHook {
            table: table.clone(),
            bootstrap,
            started: Instant::now(),
            sweep_every_ms: meta.lease_sweep_ms,
            next_sweep_ms: AtomicU64::new(0),
        })?;
        Ok(RcMetaHost {
            responder,
            table,
            bootstrap,
        })
    }

    /// What clients need to reach the table (see the module docs).
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.bootstrap
    }

    /// The location engines read the table at.
    ///
    /// # Errors
    /// As [`MetaLocation::from_bootstrap`].
    pub fn location(&self) -> Result<MetaLocation, EngineError> {
        MetaLocation::from_bootstrap(&self.bootstrap)
    }

    /// The table engine, for registrations made by the host's process
    /// itself (the only registrations it gets here). Every change is a
    /// seqlock write into the MR clients READ. Hold the guard briefly: the
    /// responder takes it for RPCs and sweeps.
    pub fn table(&self) -> MutexGuard<'_, MetaTable<MrTable<N::Mr>>> {
        self.table.lock()
    }

    /// The registered region holding the table.
    pub fn table_mr(&self) -> N::Mr {
        self.table.lock().memory().mr().clone()
    }

    /// The handshake endpoint (its statistics, its target).
    pub fn responder(&self) -> &HandshakeResponder<N> {
        &self.responder
    }

    /// One non-blocking step: handshakes, RPCs, and a lease sweep when due
    /// (see [`HandshakeResponder::progress`]).
    ///
    /// # Errors
    /// Provider failures of the endpoint.
    pub fn progress(&self) -> Result<usize, EngineError> {
        self.responder.progress()
    }

    /// Runs [`RcMetaHost::progress`] on a thread until the handle drops.
    ///
    /// # Errors
    /// [`EngineError::Config`] when the thread cannot be created.
    pub fn spawn_progress(&self) -> Result<ProgressThread, EngineError> {
        self.responder.spawn_progress()
    }
}
