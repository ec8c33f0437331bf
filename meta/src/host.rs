//! A meta table hosted without an engine: [`LocalMetaHost`], the table MR
//! behind a DCT of its own, for processes that register nodes by local
//! calls ([`LocalMetaHost::table_mut`]): test fixtures and benches.
//!
//! ```text
//!             clients (any node)
//!   one-sided READ |
//!                  v
//!   DCT + SRQ --> table MR  <--- SeqlockWrite word stores <--- table_mut()
//!   (no CPU)      (MrTable)                                     (local calls)
//! ```
//!
//! Deployments host the table in an engine instead (`krcore_kmod::MsgMetaHost`,
//! run by the SDK's `host_meta` and the `krcore-meta` binary): the same
//! table, layout and READ path, with Register/Renew/Deregister arriving as
//! two-sided messages. This host has no request endpoint (its bootstrap's
//! RPC target names its DCT, qkey 0): it answers no request at all.
//!
//! # Invariants
//! - The table is READ by clients through the DCT with no server
//!   involvement.
//! - Every table change is one seqlock write of aligned atomic stores in the
//!   registered table memory (see [`MrTable`]).
//! - Lease times are the caller's (`now_ms` of each call); nothing sweeps
//!   unless [`LocalMetaHost::sweep`] is called.

use crate::bootstrap;
use crate::error::{Ctx, MetaError, MetaResult};
use crate::mr_table::MrTable;
use crate::registry::MetaTable;
use crate::table::Geometry;
use crate::wire::BootstrapRepr;
use krcore_nic::sim::SimFabric;
use krcore_nic::{
    bring_up, Access, DcTarget, Gid, MemoryRegion, Nic, QpCaps, QpInit, QpType, QueuePair, UdTarget,
};
use std::time::Duration;

/// Default DC key of the server's DCT (ASCII "krmeta").
pub const DEFAULT_DC_KEY: u64 = 0x6174_656d_726b;

/// How to start a meta table host: a [`LocalMetaHost`], or an engine's
/// (`krcore_kmod::MsgMetaHost`, which takes `geometry`, `lease_sweep_ms`,
/// `first_epoch` and `incarnation`).
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// Table shape. Default: 1024 buckets of 8 entries (512 KiB).
    pub geometry: Geometry,
    /// DC key of the DCT clients READ the table through ([`LocalMetaHost`]
    /// only: an engine uses its own).
    pub dc_key: u64,
    /// Least time between two lease sweeps, in ms (0: every step) of a host
    /// that sweeps on its own (an engine's).
    pub lease_sweep_ms: u64,
    /// Epoch of the first registration. `None`: the wall-clock second at
    /// start, so a restarted server's epochs exceed its predecessor's as
    /// long as it handed out fewer epochs than it ran seconds (and restarts
    /// are a second apart). Engines that follow a restarted server keep
    /// their DCCache: an entry of the old server that the new one's (older
    /// numbered) entry cannot replace is still used, and dropped by its
    /// first error completion if its node moved too.
    pub first_epoch: Option<u32>,
    /// Incarnation reported in the bootstrap. `None`: derived from the
    /// wall clock and the process id.
    pub incarnation: Option<u64>,
}

impl Default for MetaConfig {
    fn default() -> MetaConfig {
        MetaConfig {
            geometry: Geometry::with_buckets(1024).unwrap_or_else(|_| unreachable!()),
            dc_key: DEFAULT_DC_KEY,
            lease_sweep_ms: 100,
            first_epoch: None,
            incarnation: None,
        }
    }
}

/// A meta table in a registered MR behind a DCT of its own, over any
/// [`Nic`] with DC (see the module docs: registrations are local calls).
///
/// Owns the table MR (`REMOTE_READ | LOCAL_WRITE`) and a DCT with its SRQ
/// (clients READ the table through it; the SRQ gets no receives).
pub struct LocalMetaHost<N: Nic> {
    nic: N,
    table: MetaTable<MrTable<N::Mr>>,
    bootstrap: BootstrapRepr,
    cfg: MetaConfig,
    published: Vec<(SimFabric, String, Vec<u8>)>,
    // Kept alive for clients' READs; never used after start.
    _dct: N::Qp,
    _srq: N::Srq,
    _dct_cq: N::Cq,
    _pd: N::Pd,
}

impl<N: Nic> std::fmt::Debug for LocalMetaHost<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalMetaHost")
            .field("gid", &self.nic.gid())
            .field("bootstrap", &self.bootstrap)
            .field("table", &self.table)
            .finish()
    }
}

fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl<N: Nic> LocalMetaHost<N> {
    /// Starts a table host on `nic`: allocates the table MR and the DCT +
    /// SRQ, and zeroes the table.
    ///
    /// # Errors
    /// [`MetaError::DcUnsupported`] on a device without DC (nothing is
    /// allocated); [`MetaError::Config`] for a table larger than memory;
    /// [`MetaError::Nic`] when the provider refuses an object.
    pub fn start(nic: N, cfg: MetaConfig) -> MetaResult<LocalMetaHost<N>> {
        if !nic.caps().dc {
            return Err(MetaError::DcUnsupported);
        }
        let geometry = cfg.geometry;
        let len = usize::try_from(geometry.table_len()).map_err(|_| {
            MetaError::Config(format!(
                "a table of {} bytes does not fit in memory",
                geometry.table_len()
            ))
        })?;
        let pd = nic.alloc_pd().ctx("allocate PD")?;
        let mr = nic
            .alloc_mr(&pd, len, Access::REMOTE_READ | Access::LOCAL_WRITE)
            .ctx("register table memory")?;
        let dct_cq = nic.create_cq(1).ctx("create DCT CQ")?;
        let srq = nic.create_srq(&pd, 1, 1).ctx("create DCT SRQ")?;
        let dct = nic
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Dct,
                    caps: QpCaps {
                        max_send_wr: 1,
                        max_recv_wr: 0,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                    },
                    send_cq: &dct_cq,
                    recv_cq: &dct_cq,
                    srq: Some(&srq),
                    dc_key: cfg.dc_key,
                },
            )
            .ctx("create DCT")?;
        bring_up(&dct, Access::REMOTE_READ, None).ctx("bring up DCT")?;
        let first_epoch = cfg
            .first_epoch
            .unwrap_or_else(|| u32::try_from(wall_clock().as_secs()).unwrap_or(u32::MAX / 2));
        let incarnation = cfg.incarnation.unwrap_or_else(|| {
            (wall_clock().as_nanos() as u64) ^ (u64::from(std::process::id()) << 40)
        });
        let table = MetaTable::with_first_epoch(geometry, MrTable::new(mr.clone()), first_epoch)?;
        let gid = nic.gid();
        let bootstrap = BootstrapRepr::new(
            geometry,
            mr.remote(0),
            incarnation,
            DcTarget {
                gid,
                dct_num: dct.qpn(),
                dc_key: cfg.dc_key,
            },
            // No request endpoint (registrations are local calls): the
            // RPC target names the DCT, with qkey 0 (a bootstrap needs a
            // nonzero QPN there).
            UdTarget {
                gid,
                qpn: dct.qpn(),
                qkey: 0,
            },
        );
        Ok(LocalMetaHost {
            nic,
            table,
            bootstrap,
            cfg,
            published: Vec::new(),
            _dct: dct,
            _srq: srq,
            _dct_cq: dct_cq,
            _pd: pd,
        })
    }

    /// What clients need to READ this table (see [`crate::bootstrap`]).
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.bootstrap
    }

    /// The table's geometry.
    pub fn geometry(&self) -> Geometry {
        self.table.geometry()
    }

    /// The device the server runs on.
    pub fn nic(&self) -> &N {
        &self.nic
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &MetaConfig {
        &self.cfg
    }

    /// The table engine (read only).
    pub fn table(&self) -> &MetaTable<MrTable<N::Mr>> {
        &self.table
    }

    /// The registered region holding the table.
    pub fn table_mr(&self) -> &N::Mr {
        self.table().memory().mr()
    }

    /// Byte offset in the table MR of the entry that holds `gid`, if any
    /// (for tests that tamper with an entry).
    pub fn entry_offset(&self, gid: &Gid) -> Option<usize> {
        let g = self.geometry();
        let bucket = g.bucket_of(gid);
        (0..g.slots_per_bucket()).find_map(|slot| {
            let off = g.entry_offset(bucket, slot) as usize;
            let mut got = [0u8; 16];
            self.table_mr().read(off + 8, &mut got).ok()?;
            (got == *gid.as_bytes()).then_some(off)
        })
    }

    /// The table engine, for registrations (the only way in: this host
    /// answers no request). Every change is a seqlock write into the MR
    /// clients READ.
    pub fn table_mut(&mut self) -> &mut MetaTable<MrTable<N::Mr>> {
        &mut self.table
    }

    /// Removes every registration whose lease expired by `now_ms`; returns
    /// how many.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        self.table.sweep(now_ms).len()
    }

    /// Publishes the bootstrap under the well-known `name` on a sim fabric
    /// (see [`bootstrap::publish_on_sim`]). The name is removed again when
    /// the server is dropped, unless another server replaced it meanwhile.
    ///
    /// # Errors
    /// [`MetaError::Nic`] for a bad name or a failed write.
    pub fn publish_on_sim(&mut self, fabric: &SimFabric, name: &str) -> MetaResult<()> {
        bootstrap::publish_on_sim(fabric, name, &self.bootstrap)?;
        let bytes = bootstrap::encode(&self.bootstrap);
        self.published
            .push((fabric.clone(), name.to_string(), bytes));
        Ok(())
    }

    /// Serves the bootstrap over TCP (see [`bootstrap::serve_bootstrap_tcp`]).
    ///
    /// # Errors
    /// [`MetaError::Io`] when the address cannot be bound.
    pub fn serve_bootstrap_tcp(
        &self,
        addr: impl std::net::ToSocketAddrs,
    ) -> MetaResult<bootstrap::TcpBootstrap> {
        bootstrap::serve_bootstrap_tcp(addr, &self.bootstrap)
    }
}

impl<N: Nic> Drop for LocalMetaHost<N> {
    fn drop(&mut self) {
        for (fabric, name, bytes) in self.published.drain(..) {
            // Leave a successor's publication alone.
            if fabric.lookup(&name).ok().flatten().as_deref() == Some(&bytes[..]) {
                let _ = fabric.unpublish(&name);
            }
        }
    }
}
