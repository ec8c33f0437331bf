//! Local memory regions and the remote-region tokens handed to peers.

use std::time::{Duration, Instant};

use krcore_kmod::{OwnedMr, RemoteGrant};
use krcore_nic::sim::SimNic;
use krcore_nic::{Access, Gid, MemoryRegion as _, Nic, RemoteAddr, Sge};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Checks `offset..offset+len` inside `0..region_len`.
pub(crate) fn check(offset: u64, len: u64, region_len: u64, which: &'static str) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfRange {
            offset,
            len,
            region_len,
            which,
        }),
    }
}

/// Registered local memory, owned by this process: its lkey passes the
/// pre-check while this handle (or a clone) lives.
///
/// The bytes may be written by the NIC or by peers at any time, so they are
/// only reachable through copying accessors.
pub struct MemoryRegion<N: Nic = SimNic> {
    pub(crate) mr: OwnedMr<N>,
    pub(crate) gid: Gid,
}

impl<N: Nic> Clone for MemoryRegion<N> {
    fn clone(&self) -> Self {
        MemoryRegion {
            mr: self.mr.clone(),
            gid: self.gid,
        }
    }
}

impl<N: Nic> std::fmt::Debug for MemoryRegion<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("node", &self.gid)
            .field("mr", &self.mr)
            .finish()
    }
}

impl<N: Nic> MemoryRegion<N> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Always false: a registered region is never empty.
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        Ok(self.mr.read(offset, buf)?)
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.mr.write(offset, data)?)
    }

    /// Atomically loads the aligned 8-byte word at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when misaligned or out of range.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.mr.load_u64(offset)?)
    }

    /// Atomically stores the aligned 8-byte word at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when misaligned or out of range.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        Ok(self.mr.store_u64(offset, value)?)
    }

    /// An SGE over `offset..offset+len`, for hand-built work requests.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        Ok(self.mr.sge(offset, len)?)
    }

    /// The remote address of `offset`, for hand-built work requests.
    pub fn remote_addr(&self, offset: usize) -> RemoteAddr {
        self.mr.remote(offset)
    }

    /// A token granting peers `access` to `offset..offset+len` of this
    /// region (the region's own access flags still apply at the NIC).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the range is outside the region.
    pub fn remote_region(&self, offset: u64, len: u64, access: Access) -> Result<RemoteRegion> {
        check(offset, len, self.len() as u64, "local")?;
        Ok(RemoteRegion {
            gid: self.gid,
            addr: self.mr.addr() + offset,
            len,
            rkey: self.mr.rkey(),
            access,
        })
    }

    /// A token for the whole region with every access it was registered
    /// with.
    pub fn token(&self) -> RemoteRegion {
        RemoteRegion {
            gid: self.gid,
            addr: self.mr.addr(),
            len: self.len() as u64,
            rkey: self.mr.rkey(),
            access: self.mr.access(),
        }
    }

    /// The provider's MR handle.
    pub fn raw(&self) -> &N::Mr {
        self.mr.mr()
    }
}

/// A remote memory token (Infinity's `RegionToken`): where a peer's region
/// is and what it grants. Plain data, serializable, to hand out over any
/// channel. A VQP that operates on it registers it as a known grant, so the
/// pre-check keeps every operation inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// The node holding the memory.
    pub gid: Gid,
    /// Address of the first byte, in the node's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
    /// Granted access (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`).
    pub access: Access,
}

/// How long a grant derived from a token stays valid at the pre-check
/// (tokens carry no expiry yet: MR leases are a later step).
const GRANT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

impl RemoteRegion {
    /// The remote address `offset` bytes in.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }

    /// The grant the pre-check enforces for this token.
    pub fn grant(&self) -> RemoteGrant {
        RemoteGrant {
            addr: self.addr,
            len: self.len,
            access: self.access,
            expires_at: Instant::now() + GRANT_TTL,
        }
    }
}
