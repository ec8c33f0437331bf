//! The server-side table engine: registrations, renewals, deregistrations and
//! lease sweeps over a table image, with no I/O and no clock.
//!
//! [`MetaTable`] is the only writer of its table memory. It keeps a shadow of
//! every slot (version, entry, lease length) so it never has to read back what
//! it wrote, and it writes each change as one [`SeqlockWrite`] through
//! [`TableMemory`], which the host maps to atomic stores into registered RDMA
//! memory. Every call that depends on time takes `now_ms`, the server's clock
//! in milliseconds, from the host.
//!
//! # Invariants
//! - A GID occupies at most one slot, always in bucket `bucket_of(gid)`.
//! - Epochs come from one table-wide counter that only grows, so each
//!   (re-)registration of any GID gets an epoch greater than every earlier one
//!   (see [`MetaTable::with_first_epoch`] to keep this across server restarts).
//! - A registration is live while `now_ms < lease_expiry_ms`; a lease never
//!   moves backwards on renewal.
//! - The memory image always equals the shadow once a write completes: every
//!   stable slot parses to the shadow's entry (or to empty).

use crate::entry::{EntryRepr, ENTRY_LEN};
use crate::table::{Geometry, SeqlockWrite, TableMemory};
use krcore_nic::{DcTarget, Gid};
use std::collections::BTreeSet;

/// Why a table operation was refused. The table is unchanged when one is
/// returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// The table memory is smaller than the geometry needs.
    #[error("table memory of {have} bytes is smaller than the {need} bytes the geometry needs")]
    MemoryTooSmall {
        /// Bytes the geometry needs.
        need: u64,
        /// Bytes the memory has.
        have: usize,
    },
    /// Every slot of the GID's bucket holds another GID.
    #[error("bucket {bucket} is full ({slots} slots): cannot register {gid}")]
    BucketFull {
        /// The GID being registered.
        gid: Gid,
        /// Its bucket.
        bucket: u32,
        /// Slots in the bucket.
        slots: u32,
    },
    /// The GID has no registration.
    #[error("{gid} is not registered")]
    NotRegistered {
        /// The GID.
        gid: Gid,
    },
    /// The GID's lease expired before the renewal; it must register again
    /// (and will get a new epoch).
    #[error("lease of {gid} expired at {expired_at_ms} ms")]
    LeaseExpired {
        /// The GID.
        gid: Gid,
        /// When its lease expired (server clock, ms).
        expired_at_ms: u64,
    },
    /// A lease of 0 ms was asked for.
    #[error("a lease must last at least 1 ms")]
    InvalidLease,
    /// The epoch counter reached `u32::MAX`.
    #[error("epoch counter exhausted")]
    EpochExhausted,
    /// The GID's registration names another DCT than the renewal's or
    /// deregistration's: another engine registered at the GID since (a
    /// second engine on the port, or a restart). The registration is not
    /// the sender's to renew or remove.
    #[error("{gid} is registered by another engine now (DCT {holder:#x}, not {asked:#x})")]
    Replaced {
        /// The GID.
        gid: Gid,
        /// The DCT number the request named.
        asked: u32,
        /// The DCT number the registration holds.
        holder: u32,
    },
}

/// What a successful registration or renewal grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The registration's epoch (unchanged by a renewal).
    pub epoch: u32,
    /// When the lease ends (server clock, ms).
    pub lease_expiry_ms: u64,
    /// A registration only: the DCT number of another registration at the
    /// GID whose lease had not run out, which this one replaced (a process
    /// restarted at the GID, or a second engine on the port); 0 when there
    /// was none (and in renewals and other answers).
    pub replaced_dct: u32,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    entry: EntryRepr,
    lease_ms: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    version: u64,
    live: Option<Live>,
}

/// The meta server's table: a table image in `M` plus its shadow.
///
/// `M` is any [`TableMemory`]: a `Vec<u8>` (the default, see
/// [`MetaTable::with_vec`]), a `&mut [u8]`, or the host's registered memory.
pub struct MetaTable<M: TableMemory = Vec<u8>> {
    geometry: Geometry,
    mem: M,
    slots: Vec<Slot>,
    /// (lease expiry, slot index) of every live slot, for sweeps.
    expiries: BTreeSet<(u64, usize)>,
    live: usize,
    last_epoch: u32,
}

/// Summarises the table (geometry, counts, epoch) without dumping its memory.
impl<M: TableMemory> std::fmt::Debug for MetaTable<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaTable")
            .field("geometry", &self.geometry)
            .field("memory_len", &self.mem.len_bytes())
            .field("live", &self.live)
            .field("last_epoch", &self.last_epoch)
            .field("next_expiry_ms", &self.next_expiry_ms())
            .finish()
    }
}

impl MetaTable<Vec<u8>> {
    /// A table with its own zeroed image of `geometry.table_len()` bytes.
    ///
    /// # Panics
    /// If the table does not fit in memory addressable by `usize`.
    pub fn with_vec(geometry: Geometry) -> MetaTable<Vec<u8>> {
        let len = usize::try_from(geometry.table_len()).expect("table larger than usize");
        match MetaTable::new(geometry, vec![0u8; len]) {
            Ok(t) => t,
            Err(e) => unreachable!("a vector of table_len bytes is large enough: {e}"),
        }
    }
}

impl<M: TableMemory> MetaTable<M> {
    /// A table over `mem`, whose first `geometry.table_len()` bytes are zeroed
    /// (every slot never written). Epochs start at 1.
    ///
    /// # Errors
    /// [`TableError::MemoryTooSmall`].
    pub fn new(geometry: Geometry, mem: M) -> Result<MetaTable<M>, TableError> {
        MetaTable::with_first_epoch(geometry, mem, 1)
    }

    /// Like [`MetaTable::new`], but the first registration gets `first_epoch`
    /// (0 is taken as 1). A host that restarts the server should pass a value
    /// above every epoch the previous instance handed out (for example the
    /// wall-clock seconds at start), so clients that cached an entry from the
    /// previous instance still see the epoch change.
    ///
    /// # Errors
    /// [`TableError::MemoryTooSmall`].
    pub fn with_first_epoch(
        geometry: Geometry,
        mut mem: M,
        first_epoch: u32,
    ) -> Result<MetaTable<M>, TableError> {
        let need = geometry.table_len();
        let have = mem.len_bytes();
        if (have as u64) < need {
            return Err(TableError::MemoryTooSmall { need, have });
        }
        for off in (0..need as usize).step_by(8) {
            mem.store_u64(off, 0);
        }
        Ok(MetaTable {
            geometry,
            mem,
            slots: vec![Slot::default(); geometry.n_slots() as usize],
            expiries: BTreeSet::new(),
            live: 0,
            last_epoch: first_epoch.max(1) - 1,
        })
    }

    /// The table's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The table memory (read only: the engine is its only writer).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Gives the table memory back.
    pub fn into_memory(self) -> M {
        self.mem
    }

    /// Number of registrations held (live or expired but not yet swept).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table holds no registration.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The registration of `gid`, from the shadow (no memory read), whether or
    /// not its lease has expired.
    pub fn get(&self, gid: &Gid) -> Option<EntryRepr> {
        self.find(gid)
            .and_then(|i| self.slots[i].live)
            .map(|l| l.entry)
    }

    /// The earliest lease expiry in the table: when the host should call
    /// [`MetaTable::sweep`] next.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.expiries.first().map(|&(t, _)| t)
    }

    /// Registers `target` (or re-registers it: same slot, new epoch, new
    /// fields) with a lease of `lease_ms` from `now_ms`. A live
    /// registration of the GID with another DCT is replaced (the newest
    /// engine at a GID wins: a process restarted at its GID must be
    /// reachable at once, and the table cannot tell a restart from a
    /// second engine): the lease names it in [`Lease::replaced_dct`], and
    /// the replaced engine's renewals are refused from then on
    /// ([`TableError::Replaced`]).
    ///
    /// # Errors
    /// [`TableError::InvalidLease`] for `lease_ms == 0`,
    /// [`TableError::EpochExhausted`], [`TableError::BucketFull`].
    pub fn register(
        &mut self,
        target: DcTarget,
        lid: u16,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, TableError> {
        if lease_ms == 0 {
            return Err(TableError::InvalidLease);
        }
        let epoch = self
            .last_epoch
            .checked_add(1)
            .ok_or(TableError::EpochExhausted)?;
        let gid = target.gid;
        let idx = match self.find(&gid) {
            Some(i) => i,
            None => self.free_slot(&gid)?,
        };
        let replaced_dct = match self.slots[idx].live {
            Some(old)
                if old.entry.dct_num != target.dct_num && now_ms < old.entry.lease_expiry_ms =>
            {
                old.entry.dct_num
            }
            _ => 0,
        };
        self.last_epoch = epoch;
        let entry = EntryRepr {
            gid,
            dct_num: target.dct_num,
            dc_key: target.dc_key,
            lid,
            epoch,
            lease_expiry_ms: now_ms.saturating_add(lease_ms),
        };
        self.put(idx, Live { entry, lease_ms });
        Ok(Lease {
            epoch,
            lease_expiry_ms: entry.lease_expiry_ms,
            replaced_dct,
        })
    }

    /// Extends the lease of `gid`, registered with DCT `dct_num`, to
    /// `now_ms` plus the lease length it registered with (never shortening
    /// it). Rewrites the entry only when the expiry changes.
    ///
    /// # Errors
    /// [`TableError::NotRegistered`]; [`TableError::Replaced`] when the
    /// registration names another DCT; [`TableError::LeaseExpired`] when
    /// `now_ms >= lease_expiry_ms` (the entry stays until the next sweep).
    pub fn renew(&mut self, gid: &Gid, dct_num: u32, now_ms: u64) -> Result<Lease, TableError> {
        let (idx, mut live) = self.held_slot(gid, dct_num)?;
        let old = live.entry.lease_expiry_ms;
        if now_ms >= old {
            return Err(TableError::LeaseExpired {
                gid: *gid,
                expired_at_ms: old,
            });
        }
        let new = now_ms.saturating_add(live.lease_ms).max(old);
        if new != old {
            live.entry.lease_expiry_ms = new;
            self.put(idx, live);
        }
        Ok(Lease {
            epoch: live.entry.epoch,
            lease_expiry_ms: new,
            replaced_dct: 0,
        })
    }

    /// Removes the registration of `gid` with DCT `dct_num` (live or
    /// expired), returning it.
    ///
    /// # Errors
    /// [`TableError::NotRegistered`]; [`TableError::Replaced`] when the
    /// registration names another DCT (it stays).
    pub fn deregister(&mut self, gid: &Gid, dct_num: u32) -> Result<EntryRepr, TableError> {
        let (idx, live) = self.held_slot(gid, dct_num)?;
        self.clear(idx);
        Ok(live.entry)
    }

    /// Removes every registration whose lease expired (`lease_expiry_ms <=
    /// now_ms`), returning their GIDs in expiry order.
    pub fn sweep(&mut self, now_ms: u64) -> Vec<Gid> {
        let mut gone = Vec::new();
        while let Some(&(t, idx)) = self.expiries.first() {
            if t > now_ms {
                break;
            }
            if let Some(live) = self.slots[idx].live {
                gone.push(live.entry.gid);
            }
            self.clear(idx);
        }
        gone
    }

    /// Index of the slot holding `gid`, if any.
    fn find(&self, gid: &Gid) -> Option<usize> {
        self.bucket_slots(gid)
            .find(|&i| self.slots[i].live.is_some_and(|l| l.entry.gid == *gid))
    }

    /// The slot of `gid`'s registration, which must name DCT `dct_num`.
    fn held_slot(&self, gid: &Gid, dct_num: u32) -> Result<(usize, Live), TableError> {
        let (i, l) = self
            .find(gid)
            .and_then(|i| self.slots[i].live.map(|l| (i, l)))
            .ok_or(TableError::NotRegistered { gid: *gid })?;
        if l.entry.dct_num != dct_num {
            return Err(TableError::Replaced {
                gid: *gid,
                asked: dct_num,
                holder: l.entry.dct_num,
            });
        }
        Ok((i, l))
    }

    fn free_slot(&self, gid: &Gid) -> Result<usize, TableError> {
        self.bucket_slots(gid)
            .find(|&i| self.slots[i].live.is_none())
            .ok_or(TableError::BucketFull {
                gid: *gid,
                bucket: self.geometry.bucket_of(gid),
                slots: self.geometry.slots_per_bucket(),
            })
    }

    fn bucket_slots(&self, gid: &Gid) -> std::ops::Range<usize> {
        let spb = self.geometry.slots_per_bucket() as usize;
        let first = self.geometry.bucket_of(gid) as usize * spb;
        first..first + spb
    }

    fn offset(idx: usize) -> usize {
        idx * ENTRY_LEN
    }

    /// Writes `live` into slot `idx` (seqlock write) and updates the shadow.
    fn put(&mut self, idx: usize, live: Live) {
        let slot = &mut self.slots[idx];
        let w = SeqlockWrite::for_entry(Self::offset(idx), slot.version, &live.entry);
        w.apply(&mut self.mem);
        slot.version = w.new_version();
        match slot.live.replace(live) {
            Some(old) => {
                self.expiries.remove(&(old.entry.lease_expiry_ms, idx));
            }
            None => self.live += 1,
        }
        self.expiries.insert((live.entry.lease_expiry_ms, idx));
    }

    /// Empties slot `idx` (seqlock write) and updates the shadow.
    fn clear(&mut self, idx: usize) {
        let slot = &mut self.slots[idx];
        let w = SeqlockWrite::for_empty(Self::offset(idx), slot.version);
        w.apply(&mut self.mem);
        slot.version = w.new_version();
        if let Some(old) = slot.live.take() {
            self.expiries.remove(&(old.entry.lease_expiry_ms, idx));
            self.live -= 1;
        }
    }
}
