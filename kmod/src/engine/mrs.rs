//! The MRs "owned by this process": registered through the engine, and the
//! only lkeys the pre-check lets through.
//!
//! Writers (register, drop of an [`OwnedMr`]) copy the map and bump a
//! generation under a mutex; the data path never takes that mutex in the
//! steady state: each DCI keeps a snapshot (`Arc`) with its generation and
//! refreshes it only when one atomic load shows the generation moved.
//!
//! Invariant: a snapshot taken at generation `g` holds exactly the MRs
//! registered and not dropped when the generation was `g`. An MR dropped
//! concurrently with a post may still pass that post's pre-check (the race
//! is the caller's: it dropped memory it was posting from).
//!
//! # Leases
//!
//! An MR handed to peers is leased ([`OwnedMr::lease`]): each lease is a
//! range, an access and an expiry, and becomes the [`RemoteGrant`] the
//! peer's pre-check enforces. While a lease is live (not expired, not
//! revoked) the MR stays registered:
//!
//! - [`OwnedMr::deregister`] refuses with [`LeaseError::Live`];
//! - dropping the last handle *defers* deregistration: the MR leaves the
//!   pre-check's table at once (no local post can use it) but stays
//!   registered for peers until its last lease expires (the engine sweeps
//!   such parked MRs on every registration and in `Engine::sweep_leases`).
//!
//! [`OwnedMr::revoke_all`] ends the leases early; a deregistration then
//! invalidates the rkey at the NIC, and a peer that still uses it gets
//! `REM_ACCESS_ERR` (a typed error at its caller); with the pre-check on,
//! a peer whose lease expired never reaches the NIC at all
//! ([`crate::Reason::GrantExpired`]).

use super::idhash::IdMap;
use std::any::Any;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use krcore_nic::{Access, MemoryRegion, Nic};
use parking_lot::Mutex;

use crate::precheck::{LocalMr, LocalMrTable, RemoteGrant};

/// An immutable snapshot of the owned MRs, by lkey.
#[derive(Debug, Clone, Default)]
pub(crate) struct MrSnapshot(Arc<IdMap<u32, LocalMr>>);

impl LocalMrTable for MrSnapshot {
    fn lookup(&self, lkey: u32) -> Option<LocalMr> {
        self.0.get(&lkey).copied()
    }
}

/// Lets every lkey through, covering all memory with every access: the
/// table used when the pre-check is disabled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnyMr;

impl LocalMrTable for AnyMr {
    fn lookup(&self, _lkey: u32) -> Option<LocalMr> {
        Some(LocalMr {
            addr: 0,
            len: u64::MAX,
            access: krcore_nic::Access::ALL,
        })
    }
}

/// The engine-wide words a post on a shared QP reads, alone in one small
/// allocation shared by the engine, its MR registry and every shared QP:
/// a post's fast path then touches no page of the engine's own state or
/// of the registry's (a page touched per operation is dear in an emulated
/// guest, see `krcore_lat`'s docs).
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct PostWords {
    /// The owned-MR registry's generation: bumped (`Release`) after every
    /// change of its map, under the map's lock.
    mr_generation: AtomicU64,
    /// RC fallback mode: the LRU clock of the RC pairs (see
    /// `super::rc`).
    pub(crate) rc_tick: AtomicU64,
}

impl PostWords {
    /// The owned-MR registry's generation (see [`MrRegistry`]).
    #[inline]
    pub(crate) fn mr_generation(&self) -> u64 {
        self.mr_generation.load(Ordering::Acquire)
    }
}

/// An MR whose handles are gone but whose leases are not: registered
/// until `until`.
struct Parked {
    until: Instant,
    _mr: Box<dyn Any + Send + Sync>,
}

pub(crate) struct MrRegistry {
    map: Mutex<MrSnapshot>,
    /// Holds the generation (`PostWords::mr_generation`), beside the
    /// other words every post reads.
    words: Arc<PostWords>,
    parked: Mutex<Vec<Parked>>,
}

impl std::fmt::Debug for MrRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrRegistry")
            .field("generation", &self.generation())
            .field("parked", &self.parked.lock().len())
            .finish()
    }
}

impl MrRegistry {
    /// An empty registry keeping its generation in `words`.
    pub(crate) fn new(words: Arc<PostWords>) -> MrRegistry {
        MrRegistry {
            map: Mutex::default(),
            words,
            parked: Mutex::default(),
        }
    }

    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.words.mr_generation()
    }

    /// The current map and its generation.
    pub(crate) fn snapshot(&self) -> (u64, MrSnapshot) {
        let map = self.map.lock();
        (self.words.mr_generation(), map.clone())
    }

    fn update(&self, f: impl FnOnce(&mut IdMap<u32, LocalMr>)) {
        let mut map = self.map.lock();
        f(Arc::make_mut(&mut map.0));
        self.words.mr_generation.fetch_add(1, Ordering::Release);
    }

    /// Deregisters the parked MRs whose leases have all expired by `now`;
    /// returns how many are still parked.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut p = self.parked.lock();
        let before = p.len();
        p.retain(|m| m.until > now);
        if p.len() < before {
            tracing::info!(
                deregistered = before - p.len(),
                still_parked = p.len(),
                "parked MRs deregistered: their leases expired"
            );
        }
        p.len()
    }

    fn insert<M: MemoryRegion>(&self, mr: &M) {
        self.sweep(Instant::now());
        let local = LocalMr {
            addr: mr.addr(),
            len: mr.len() as u64,
            access: mr.access(),
        };
        self.update(|m| {
            m.insert(mr.lkey(), local);
        });
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().0.len()
    }
}

/// A memory region the engine knows as owned by this process: its lkey
/// passes the pre-check for as long as this handle (or a clone) lives.
///
/// Dereferences to the provider's MR (`sge`, `remote`, `read`, `write`...).
/// Dropping the last clone removes the lkey from the engine's table first,
/// then deregisters the MR (if no other clone of the provider handle lives).
pub struct OwnedMr<N: Nic> {
    inner: Arc<OwnedInner<N>>,
}

struct OwnedInner<N: Nic> {
    /// `None` once deregistered (explicitly) or parked (dropped with live
    /// leases).
    mr: Option<N::Mr>,
    registry: Weak<MrRegistry>,
    leases: Mutex<Leases>,
}

#[derive(Default)]
struct Leases {
    next: u64,
    list: Vec<Lease>,
}

#[derive(Clone, Copy)]
struct Lease {
    id: LeaseId,
    expires_at: Instant,
    revoked: bool,
}

impl Leases {
    /// The latest expiry of the live leases at `now`.
    fn live_until(&self, now: Instant) -> Option<(usize, Instant)> {
        let live = self
            .list
            .iter()
            .filter(|l| !l.revoked && l.expires_at > now);
        live.fold(None, |acc, l| match acc {
            None => Some((1, l.expires_at)),
            Some((n, t)) => Some((n + 1, t.max(l.expires_at))),
        })
    }
}

/// A lease of an MR to peers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// Why a lease or a deregistration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// Leases are live: revoke them first, or let them expire.
    #[error("{live} live lease(s), the last until {until:?}")]
    Live {
        /// Live leases.
        live: usize,
        /// When the last one expires.
        until: Instant,
    },
    /// Other handles of the MR are alive (the engine's, a clone): it
    /// cannot be deregistered from this one.
    #[error("{handles} other handle(s) of the MR are alive")]
    Shared {
        /// Other handles.
        handles: usize,
    },
    /// The leased range is outside the MR.
    #[error("lease {offset}+{len} outside the {mr_len}-byte MR")]
    OutOfRange {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The MR's length.
        mr_len: u64,
    },
    /// The MR does not allow what the lease would grant.
    #[error("the MR was registered without {0:?}")]
    AccessMissing(Access),
}

impl<N: Nic> Drop for OwnedInner<N> {
    fn drop(&mut self) {
        let Some(r) = self.registry.upgrade() else {
            return;
        };
        let Some(mr) = self.mr.take() else {
            return;
        };
        let lkey = mr.lkey();
        r.update(|m| {
            m.remove(&lkey);
        });
        // Deferred deregistration: peers keep their leases.
        if let Some((live, until)) = self.leases.lock().live_until(Instant::now()) {
            tracing::info!(
                lkey,
                live_leases = live,
                "MR dropped while leased: stays registered until its leases expire"
            );
            r.parked.lock().push(Parked {
                until,
                _mr: Box::new(mr),
            });
        }
    }
}

impl<N: Nic> OwnedMr<N> {
    pub(crate) fn new(mr: N::Mr, registry: &Arc<MrRegistry>) -> OwnedMr<N> {
        registry.insert(&mr);
        OwnedMr {
            inner: Arc::new(OwnedInner {
                mr: Some(mr),
                registry: Arc::downgrade(registry),
                leases: Mutex::new(Leases::default()),
            }),
        }
    }

    /// The provider's MR handle.
    pub fn mr(&self) -> &N::Mr {
        self.inner
            .mr
            .as_ref()
            .expect("an OwnedMr handle always holds its MR")
    }

    /// Leases `offset..offset+len` to peers with `access` until
    /// `expires_at`: the grant to hand out (the SDK's region token carries
    /// it). The MR stays registered while the lease is live.
    ///
    /// # Errors
    /// [`LeaseError::OutOfRange`], [`LeaseError::AccessMissing`] (the MR's
    /// own flags must include `access`).
    pub fn lease(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        expires_at: Instant,
    ) -> Result<(LeaseId, RemoteGrant), LeaseError> {
        let mr = self.mr();
        let mr_len = mr.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > mr_len) {
            return Err(LeaseError::OutOfRange {
                offset,
                len,
                mr_len,
            });
        }
        if !mr.access().contains(access) {
            return Err(LeaseError::AccessMissing(access));
        }
        let mut l = self.inner.leases.lock();
        l.next += 1;
        let id = LeaseId(l.next);
        l.list.retain(|x| !x.revoked);
        l.list.push(Lease {
            id,
            expires_at,
            revoked: false,
        });
        Ok((
            id,
            RemoteGrant {
                addr: mr.addr() + offset,
                len,
                access,
                expires_at: Some(expires_at),
            },
        ))
    }

    /// Leases live at `now` (not expired, not revoked).
    pub fn live_leases(&self, now: Instant) -> usize {
        self.inner
            .leases
            .lock()
            .live_until(now)
            .map_or(0, |(n, _)| n)
    }

    /// Revokes one lease; returns whether it was live. The rkey stays
    /// valid at the NIC until the MR is deregistered.
    pub fn revoke(&self, id: LeaseId) -> bool {
        let now = Instant::now();
        let mut l = self.inner.leases.lock();
        match l.list.iter_mut().find(|x| x.id == id) {
            Some(x) if !x.revoked && x.expires_at > now => {
                x.revoked = true;
                tracing::info!(lease = id.0, "MR lease revoked");
                true
            }
            _ => false,
        }
    }

    /// Revokes every lease; returns how many were live.
    pub fn revoke_all(&self) -> usize {
        let now = Instant::now();
        let mut l = self.inner.leases.lock();
        let mut n = 0;
        for x in &mut l.list {
            if !x.revoked && x.expires_at > now {
                n += 1;
            }
            x.revoked = true;
        }
        if n > 0 {
            tracing::info!(revoked = n, "MR leases revoked");
        }
        n
    }

    /// Deregisters the MR now: its rkey stops working at the NIC (peers
    /// get `REM_ACCESS_ERR`) and its lkey at the pre-check.
    ///
    /// # Errors
    /// [`LeaseError::Live`] while leases are live at `now` (revoke them
    /// first); [`LeaseError::Shared`] while other handles of the MR exist.
    /// The handle comes back with the error.
    pub fn deregister(self, now: Instant) -> Result<(), (OwnedMr<N>, LeaseError)> {
        let live = self.inner.leases.lock().live_until(now);
        if let Some((live, until)) = live {
            return Err((self, LeaseError::Live { live, until }));
        }
        let handles = Arc::strong_count(&self.inner) - 1;
        if handles > 0 {
            return Err((self, LeaseError::Shared { handles }));
        }
        // The last handle, and no live lease: dropping deregisters at once.
        drop(self);
        Ok(())
    }
}

impl<N: Nic> Clone for OwnedMr<N> {
    fn clone(&self) -> Self {
        OwnedMr {
            inner: self.inner.clone(),
        }
    }
}

impl<N: Nic> Deref for OwnedMr<N> {
    type Target = N::Mr;
    fn deref(&self) -> &N::Mr {
        self.mr()
    }
}

impl<N: Nic> std::fmt::Debug for OwnedMr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mr = self.mr();
        f.debug_struct("OwnedMr")
            .field("addr", &format_args!("{:#x}", mr.addr()))
            .field("len", &mr.len())
            .field("lkey", &format_args!("{:#x}", mr.lkey()))
            .finish()
    }
}

impl<N: Nic> super::Engine<N> {
    /// Deregisters the MRs whose handles were dropped while leased, once
    /// their leases expired (also done on every registration). Returns how
    /// many stay registered for live leases.
    pub fn sweep_leases(&self) -> usize {
        self.inner.mrs.sweep(Instant::now())
    }
}
