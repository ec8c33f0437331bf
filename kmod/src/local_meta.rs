//! An embedded meta table: the meta server's table in a registered MR of a
//! node, readable by one-sided READ through that node's DCT, with
//! registrations made by local calls instead of two-sided messages.
//!
//! It stands in for the meta server host (`krcore-meta`'s server, built
//! separately) in tests and single-process programs: clients see exactly the
//! table a real server exposes (same layout, same seqlock writes through
//! [`TableMemory`]), so the engine's lookup path is the real one. Leases are
//! swept only when [`LocalMetaServer::sweep`] is called.

use krcore_meta::engine::{Lease, MetaTable, TableError};
use krcore_meta::entry::EntryRepr;
use krcore_meta::table::{Geometry, TableMemory};
use krcore_meta::wire::BootstrapRepr;
use krcore_nic::{
    bring_up, Access, DcTarget, Gid, MemoryRegion, Nic, QpCaps, QpInit, QpType, QueuePair,
};
use parking_lot::Mutex;

use crate::engine::{EngineError, MetaLocation, DEFAULT_DC_KEY};

/// [`TableMemory`] over a registered MR: every word store is one atomic
/// 8-byte store into the region, in program order, as the seqlock protocol
/// requires.
#[derive(Debug, Clone)]
pub struct MrTableMemory<M: MemoryRegion>(pub M);

impl<M: MemoryRegion> TableMemory for MrTableMemory<M> {
    fn len_bytes(&self) -> usize {
        self.0.len()
    }

    fn load_u64(&self, offset: usize) -> u64 {
        // The engine passes only aligned in-range offsets (TableMemory's
        // contract); anything else reads as 0 instead of panicking.
        self.0.load_u64(offset).unwrap_or(0)
    }

    fn store_u64(&mut self, offset: usize, value: u64) {
        let stored = self.0.store_u64(offset, value);
        debug_assert!(stored.is_ok(), "table store at {offset}: {stored:?}");
    }
}

/// An embedded meta table served by one-sided READ (see the module docs).
pub struct LocalMetaServer<N: Nic> {
    nic: N,
    mr: N::Mr,
    table: Mutex<MetaTable<MrTableMemory<N::Mr>>>,
    location: MetaLocation,
    _cq: N::Cq,
    _srq: N::Srq,
    _dct: N::Qp,
    _pd: N::Pd,
}

impl<N: Nic> std::fmt::Debug for LocalMetaServer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalMetaServer")
            .field("gid", &self.nic.gid())
            .field("location", &self.location)
            .field("table", &*self.table.lock())
            .finish()
    }
}

impl<N: Nic> LocalMetaServer<N> {
    /// Puts an empty table of `geometry` on `nic`, behind a DCT of its own
    /// (`dc_key` [`DEFAULT_DC_KEY`]) that allows remote READs.
    ///
    /// # Errors
    /// [`EngineError::Nic`] when the device refuses a resource.
    pub fn start(nic: N, geometry: Geometry) -> Result<LocalMetaServer<N>, EngineError> {
        let pd = nic
            .alloc_pd()
            .map_err(EngineError::nic("meta: allocate a PD"))?;
        let len = usize::try_from(geometry.table_len())
            .map_err(|_| EngineError::Config("meta table larger than memory".into()))?;
        let mr = nic
            .alloc_mr(&pd, len, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .map_err(EngineError::nic("meta: allocate the table MR"))?;
        let cq = nic
            .create_cq(16)
            .map_err(EngineError::nic("meta: create a CQ"))?;
        let srq = nic
            .create_srq(&pd, 16, 1)
            .map_err(EngineError::nic("meta: create an SRQ"))?;
        let dct = nic
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Dct,
                    caps: QpCaps {
                        max_send_wr: 0,
                        max_recv_wr: 0,
                        max_send_sge: 0,
                        max_recv_sge: 1,
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: Some(&srq),
                    dc_key: DEFAULT_DC_KEY,
                },
            )
            .map_err(EngineError::nic("meta: create the DCT"))?;
        bring_up(&dct, Access::REMOTE_READ, None)
            .map_err(EngineError::nic("meta: bring up the DCT"))?;
        let table = MetaTable::new(geometry, MrTableMemory(mr.clone()))
            .map_err(|e| EngineError::Config(format!("meta table: {e}")))?;
        let location = MetaLocation {
            server: DcTarget {
                gid: nic.gid(),
                dct_num: dct.qpn(),
                dc_key: DEFAULT_DC_KEY,
            },
            table: mr.remote(0),
            geometry,
        };
        Ok(LocalMetaServer {
            nic,
            mr,
            table: Mutex::new(table),
            location,
            _cq: cq,
            _srq: srq,
            _dct: dct,
            _pd: pd,
        })
    }

    /// What a client needs to READ the table.
    pub fn location(&self) -> MetaLocation {
        self.location
    }

    /// The bootstrap reply a server at this location sends.
    pub fn bootstrap(&self, incarnation: u64) -> BootstrapRepr {
        let l = self.location;
        BootstrapRepr::new(l.geometry, l.table, incarnation, l.server)
    }

    /// The node the table lives on.
    pub fn nic(&self) -> &N {
        &self.nic
    }

    /// The table's MR (tests use it to tamper with entries).
    pub fn table_mr(&self) -> &N::Mr {
        &self.mr
    }

    /// Registers (or re-registers, with a new epoch) `target`.
    ///
    /// # Errors
    /// The table's [`TableError`].
    pub fn register(
        &self,
        target: DcTarget,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, TableError> {
        self.table.lock().register(target, 0, lease_ms, now_ms)
    }

    /// Renews the lease of `gid`.
    ///
    /// # Errors
    /// The table's [`TableError`].
    pub fn renew(&self, gid: &Gid, now_ms: u64) -> Result<Lease, TableError> {
        self.table.lock().renew(gid, now_ms)
    }

    /// Removes `gid`.
    ///
    /// # Errors
    /// [`TableError::NotRegistered`].
    pub fn deregister(&self, gid: &Gid) -> Result<EntryRepr, TableError> {
        self.table.lock().deregister(gid)
    }

    /// Removes every registration whose lease expired at `now_ms`.
    pub fn sweep(&self, now_ms: u64) -> Vec<Gid> {
        self.table.lock().sweep(now_ms)
    }

    /// The registration of `gid` held by the table.
    pub fn get(&self, gid: &Gid) -> Option<EntryRepr> {
        self.table.lock().get(gid)
    }

    /// Byte offset in the table MR of the entry holding `gid`, if any.
    pub fn entry_offset(&self, gid: &Gid) -> Option<usize> {
        let g = self.location.geometry;
        let bucket = g.bucket_of(gid);
        (0..g.slots_per_bucket()).find_map(|slot| {
            let off = g.entry_offset(bucket, slot) as usize;
            let mut got = [0u8; 16];
            self.mr.read(off + 8, &mut got).ok()?;
            (got == *gid.as_bytes()).then_some(off)
        })
    }
}
