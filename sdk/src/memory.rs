//! Local memory regions and the remote-region tokens handed to peers.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use krcore_kmod::daemon::AttachedMr;
use krcore_kmod::{LeaseError, LeaseId, OwnedMr, RemoteGrant};
use krcore_nic::AnyNic;
use krcore_nic::{Access, Gid, MemoryRegion as _, Nic, RemoteAddr, Sge};
use serde::{Deserialize, Serialize};

use crate::error::{DeregisterError, Error, Result};

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
pub struct MemoryRegion<N: Nic = AnyNic> {
    pub(crate) mr: Mr<N>,
    pub(crate) gid: Gid,
}

/// Where a region's registration lives.
pub(crate) enum Mr<N: Nic> {
    /// Registered by this process's engine.
    Local(OwnedMr<N>),
    /// Registered by the node daemon, mapped here (an attached node).
    Attached(Arc<AttachedMr>),
}

impl<N: Nic> Clone for Mr<N> {
    fn clone(&self) -> Self {
        match self {
            Mr::Local(m) => Mr::Local(m.clone()),
            Mr::Attached(m) => Mr::Attached(m.clone()),
        }
    }
}

impl<N: Nic> std::fmt::Debug for Mr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mr::Local(m) => m.fmt(f),
            Mr::Attached(m) => m.fmt(f),
        }
    }
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
        match &self.mr {
            Mr::Local(m) => m.len(),
            Mr::Attached(m) => m.len(),
        }
    }

    /// Always false: a registered region is never empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's first byte as the NIC knows it.
    fn addr(&self) -> u64 {
        match &self.mr {
            Mr::Local(m) => m.addr(),
            Mr::Attached(m) => m.addr(),
        }
    }

    /// The region's remote key.
    fn rkey(&self) -> u32 {
        match &self.mr {
            Mr::Local(m) => m.rkey(),
            Mr::Attached(m) => m.rkey(),
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        match &self.mr {
            Mr::Local(m) => Ok(m.read(offset, buf)?),
            Mr::Attached(m) => Ok(m.read(offset, buf)?),
        }
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        match &self.mr {
            Mr::Local(m) => Ok(m.write(offset, data)?),
            Mr::Attached(m) => Ok(m.write(offset, data)?),
        }
    }

    /// Atomically loads the aligned 8-byte word at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when misaligned or out of range.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        match &self.mr {
            Mr::Local(m) => Ok(m.load_u64(offset)?),
            Mr::Attached(m) => Ok(m.load_u64(offset)?),
        }
    }

    /// Atomically stores the aligned 8-byte word at `offset`.
    ///
    /// # Errors
    /// [`Error::Nic`] when misaligned or out of range.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        match &self.mr {
            Mr::Local(m) => Ok(m.store_u64(offset, value)?),
            Mr::Attached(m) => Ok(m.store_u64(offset, value)?),
        }
    }

    /// Faults `offset..offset+len` in ahead of use, without changing its
    /// bytes. Registered memory on a NIC is pinned, so there this only
    /// checks the range; sim memory (and a daemon's shared memory) is
    /// backed lazily, and the first access to each page would otherwise
    /// pay the kernel's zeroing of it inside whatever operation touched
    /// it, remote WRITEs included. A memory node calls it ahead of the
    /// memory it hands out.
    ///
    /// # Errors
    /// [`Error::Nic`] (or the daemon's range error) when the range is
    /// outside the region.
    pub fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        match &self.mr {
            Mr::Local(m) => Ok(m.prefault(offset, len)?),
            Mr::Attached(m) => Ok(m.prefault(offset, len)?),
        }
    }

    /// An SGE over `offset..offset+len`, for hand-built work requests.
    ///
    /// # Errors
    /// [`Error::Nic`] when the range is outside the region.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        match &self.mr {
            Mr::Local(m) => Ok(m.sge(offset, len)?),
            Mr::Attached(m) => Ok(m.sge(offset, len)?),
        }
    }

    /// The remote address of `offset`, for hand-built work requests.
    pub fn remote_addr(&self, offset: usize) -> RemoteAddr {
        match &self.mr {
            Mr::Local(m) => m.remote(offset),
            Mr::Attached(m) => m.remote(offset),
        }
    }

    /// A lease: a token granting peers `access` to `offset..offset+len`
    /// for `ttl` (see the crate docs' "MR leases"). The token carries a
    /// remote key of the lease's own, which the NIC limits to that range
    /// and access and refuses (`REM_ACCESS_ERR`) once the lease is revoked
    /// or expired, whatever the peer's software does: the engine
    /// deregisters it at expiry by itself, with no message. The token also
    /// carries its expiry (wall clock, so that it travels between
    /// processes): a peer's pre-check refuses it once expired, before the
    /// NIC.
    ///
    /// ```
    /// use std::time::Duration;
    /// use krcore::{Access, Node};
    ///
    /// let node = Node::builder().host_meta().build()?;
    /// let region = node.alloc(4096, Access::ALL)?;
    /// let token = region.lease(0, 64, Access::REMOTE_READ, Duration::from_secs(60))?;
    /// assert!(!token.is_expired());
    /// let region = match region.deregister() {
    ///     Err(refused) => refused.region, // a live lease
    ///     Ok(()) => unreachable!(),
    /// };
    /// assert_eq!(region.revoke_leases(), 1); // the token's key is dead now
    /// region.deregister().map_err(|e| e.reason)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::OutOfRange`]; [`Error::Lease`] when the region was
    /// registered without `access` (or without `LOCAL_WRITE`, for remote
    /// writes and atomics) or the NIC refused the lease's key; on an
    /// attached node (the lease made by the daemon's engine, enforced by
    /// its NIC alike) [`Error::Daemon`] for the daemon's quota of live
    /// leases or its NIC's refusal.
    pub fn lease(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        ttl: Duration,
    ) -> Result<RemoteRegion> {
        Ok(self.lease_with_id(offset, len, access, ttl)?.1)
    }

    /// [`MemoryRegion::lease`], also returning the lease's id (for
    /// [`MemoryRegion::revoke`]).
    ///
    /// # Errors
    /// As [`MemoryRegion::lease`].
    pub fn lease_with_id(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        ttl: Duration,
    ) -> Result<(LeaseId, RemoteRegion)> {
        check(offset, len, self.len() as u64, "local")?;
        let expires =
            unix_ms_now().saturating_add(ttl.as_millis().min(u128::from(u64::MAX - 1)) as u64);
        let (id, rkey, addr) = match &self.mr {
            Mr::Local(mr) => {
                let l = mr.lease(offset, len, access, Instant::now() + ttl)?;
                (l.id, l.rkey, l.grant.addr)
            }
            Mr::Attached(mr) => {
                // The checks an in-process lease makes first, typed alike.
                let has = mr.access();
                let writes =
                    access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
                if len == 0 {
                    return Err(LeaseError::OutOfRange {
                        offset,
                        len,
                        mr_len: self.len() as u64,
                    }
                    .into());
                }
                if !has.contains(access) {
                    return Err(LeaseError::AccessMissing(access).into());
                }
                if writes && !has.contains(Access::LOCAL_WRITE) {
                    return Err(LeaseError::AccessMissing(Access::LOCAL_WRITE).into());
                }
                let l = mr.lease(offset, len, access, ttl)?;
                (LeaseId(l.id), l.rkey, l.addr)
            }
        };
        Ok((
            id,
            RemoteRegion {
                gid: self.gid,
                addr,
                len,
                rkey,
                access,
                expires_unix_ms: expires.min(NEVER - 1),
            },
        ))
    }

    /// Revokes one lease; returns whether it was live. Its key is dead at
    /// the NIC when this returns.
    pub fn revoke(&self, id: LeaseId) -> bool {
        match &self.mr {
            Mr::Local(m) => m.revoke(id),
            // A daemon that cannot be asked is gone, and its keys with it.
            Mr::Attached(m) => m.revoke(id.0).unwrap_or(false),
        }
    }

    /// Revokes every lease of the region; returns how many were live.
    /// Their keys are dead at the NIC when this returns.
    pub fn revoke_leases(&self) -> usize {
        match &self.mr {
            Mr::Local(m) => m.revoke_all(),
            Mr::Attached(m) => m.revoke_all().unwrap_or(0),
        }
    }

    /// Leases live now (0 on an attached node whose daemon cannot be
    /// asked: its keys went with it).
    pub fn live_leases(&self) -> usize {
        match &self.mr {
            Mr::Local(m) => m.live_leases(Instant::now()),
            Mr::Attached(m) => m.live_leases().unwrap_or(0),
        }
    }

    /// Deregisters the region now: peers holding its tokens get
    /// `REM_ACCESS_ERR` from then on.
    ///
    /// # Errors
    /// Refused (the region comes back in the error) while leases are live
    /// ([`krcore_kmod::LeaseError::Live`]: revoke them first) or while other
    /// clones of this handle exist ([`krcore_kmod::LeaseError::Shared`]).
    pub fn deregister(self) -> std::result::Result<(), DeregisterError<N>> {
        let gid = self.gid;
        match self.mr {
            Mr::Local(m) => m
                .deregister(Instant::now())
                .map_err(|(mr, reason)| DeregisterError {
                    region: MemoryRegion {
                        mr: Mr::Local(mr),
                        gid,
                    },
                    reason,
                }),
            // Refused while leases are live, as in-process; the daemon
            // deregisters it when the last handle goes.
            Mr::Attached(m) => match m.live_until() {
                Ok(Some((live, until))) => Err(DeregisterError {
                    reason: LeaseError::Live { live, until },
                    region: MemoryRegion {
                        mr: Mr::Attached(m),
                        gid,
                    },
                }),
                _ => match Arc::try_unwrap(m) {
                    Ok(m) => {
                        drop(m);
                        Ok(())
                    }
                    Err(m) => Err(DeregisterError {
                        reason: LeaseError::Shared {
                            handles: Arc::strong_count(&m) - 1,
                        },
                        region: MemoryRegion {
                            mr: Mr::Attached(m),
                            gid,
                        },
                    }),
                },
            },
        }
    }

    /// A token granting peers `access` to `offset..offset+len` of this
    /// region, under the region's own key: the NIC enforces only the
    /// region's bounds and access flags, and the key works until the
    /// region is deregistered. No lease: it never expires and cannot be
    /// revoked, and does not keep the region registered (see
    /// [`MemoryRegion::lease`] for access that ends).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the range is outside the region.
    pub fn remote_region(&self, offset: u64, len: u64, access: Access) -> Result<RemoteRegion> {
        check(offset, len, self.len() as u64, "local")?;
        Ok(RemoteRegion {
            gid: self.gid,
            addr: self.addr() + offset,
            len,
            rkey: self.rkey(),
            access,
            expires_unix_ms: NEVER,
        })
    }

    /// A token for the whole region with every access it was registered
    /// with (no lease, see [`MemoryRegion::remote_region`]).
    pub fn token(&self) -> RemoteRegion {
        RemoteRegion {
            gid: self.gid,
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
            access: match &self.mr {
                Mr::Local(m) => m.access(),
                Mr::Attached(m) => m.access(),
            },
            expires_unix_ms: NEVER,
        }
    }

    /// The provider's MR handle (`None` on an attached node: the daemon
    /// holds the registration).
    pub fn raw(&self) -> Option<&N::Mr> {
        match &self.mr {
            Mr::Local(m) => Some(m.mr()),
            Mr::Attached(_) => None,
        }
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
    /// When the lease ends, in milliseconds since the Unix epoch (wall
    /// clock: the token travels between processes); `u64::MAX` for a
    /// token without lease. Absent in serialized tokens of older
    /// versions: no lease.
    #[serde(default = "never")]
    pub expires_unix_ms: u64,
}

/// `expires_unix_ms` of a token without lease.
const NEVER: u64 = u64::MAX;

fn never() -> u64 {
    NEVER
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl RemoteRegion {
    /// The remote address `offset` bytes in.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }

    /// Whether the token's lease has ended (never for a token without
    /// lease).
    pub fn is_expired(&self) -> bool {
        self.expires_unix_ms != NEVER && unix_ms_now() >= self.expires_unix_ms
    }

    /// The grant the pre-check enforces for this token: a lease's expiry
    /// moved to this process's monotonic clock (already past for an expired
    /// token); none for a token without lease. Only a lease reads the
    /// clocks (here, and the pre-check at each post while the VQP knows it).
    pub fn grant(&self) -> RemoteGrant {
        let expires_at = (self.expires_unix_ms != NEVER).then(|| {
            Instant::now()
                + Duration::from_millis(self.expires_unix_ms.saturating_sub(unix_ms_now()))
        });
        RemoteGrant {
            addr: self.addr,
            len: self.len,
            access: self.access,
            expires_at,
        }
    }
}
