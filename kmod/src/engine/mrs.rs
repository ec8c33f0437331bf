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
//! range, an access and an expiry with a remote key of its own, a
//! sub-region of the MR registered for the lease alone
//! ([`krcore_nic::Nic::register_sub_mr`]), limited by the NIC to the
//! lease's range and access. The lease becomes the [`RemoteGrant`] the
//! peer's pre-check enforces, but the NIC enforces it whatever the peer's
//! software does:
//!
//! - [`OwnedMr::revoke`] (and [`OwnedMr::revoke_all`]) deregisters the
//!   lease's key before it returns: a peer that posts it afterwards gets
//!   `REM_ACCESS_ERR` from the NIC, and no access through it moves data
//!   after the call returned;
//! - expiry needs no message: the engine's lease reaper (a thread started
//!   with the first lease, [`LEASE_REAPER`]) sleeps until the earliest
//!   expiry and deregisters the expired keys then, so a key stops working
//!   at most the reaper's wake-up plus one deregistration after its
//!   expiry ([`LeaseStats::expiry_lag_max`] says how late it was);
//!   [`super::Engine::sweep_leases`] does the same at once.
//!
//! While a lease is live (not expired, not revoked) the MR stays
//! registered: [`OwnedMr::deregister`] refuses with [`LeaseError::Live`];
//! dropping the last handle takes the MR out of the pre-check's table at
//! once (no local post can use it) while the leases' keys hold it
//! registered for peers until the last of them ends.
//!
//! The MR's own rkey ([`OwnedMr::token`]-style use by the SDK, a grant
//! without lease) is not a lease: it works until the MR is deregistered.

use crate::idhash::IdMap;
use crate::sharedqp::MrSnapshot;
use std::any::Any;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use krcore_nic::{Access, MemoryRegion, Nic, NicError};
use parking_lot::{Condvar, Mutex};

use crate::precheck::{LocalMr, RemoteGrant};

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

/// The name of the engine's lease reaper thread (see the module docs).
pub const LEASE_REAPER: &str = "krcore-leases";

/// One live lease: its key's sub-region, deregistered when dropped.
struct BookEntry {
    id: LeaseId,
    expires_at: Instant,
    _key: Box<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct BookState {
    entries: Vec<BookEntry>,
    /// The engine is gone: the reaper ends.
    closed: bool,
    /// The reaper thread was started.
    reaper: bool,
    stats: LeaseStats,
}

/// The engine's live leases, by expiry, and the reaper that ends them.
#[derive(Default)]
struct LeaseBook {
    state: Mutex<BookState>,
    /// Wakes the reaper: a new lease, or the engine closing.
    wake: Condvar,
}

/// What the engine's leases did ([`super::Engine::lease_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Leases live now (their keys registered).
    pub live: usize,
    /// Leases granted.
    pub granted: u64,
    /// Leases ended by revocation.
    pub revoked: u64,
    /// Leases ended by expiry (by the reaper or a sweep).
    pub expired: u64,
    /// The latest an expired lease's key was deregistered after its
    /// expiry (the time from the expiry to the deregistration's return).
    pub expiry_lag_max: Duration,
    /// The sum of those lags, over `expired` leases.
    pub expiry_lag_total: Duration,
}

impl LeaseBook {
    /// Takes out the entries expired at `now`.
    fn take_expired(st: &mut BookState, now: Instant) -> Vec<BookEntry> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < st.entries.len() {
            if st.entries[i].expires_at <= now {
                out.push(st.entries.swap_remove(i));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Deregisters `expired` (outside the lock) and counts the lags.
    fn end_expired(&self, expired: Vec<BookEntry>) {
        if expired.is_empty() {
            return;
        }
        let ends: Vec<Instant> = expired.iter().map(|e| e.expires_at).collect();
        let n = expired.len();
        drop(expired);
        let done = Instant::now();
        let mut st = self.state.lock();
        for t in ends {
            let lag = done.saturating_duration_since(t);
            st.stats.expired += 1;
            st.stats.expiry_lag_total += lag;
            st.stats.expiry_lag_max = st.stats.expiry_lag_max.max(lag);
        }
        st.stats.live = st.entries.len();
        drop(st);
        tracing::debug!(expired = n, "lease keys deregistered at expiry");
    }

    /// Ends the leases expired at `now`; returns how many stay live.
    fn sweep(&self, now: Instant) -> usize {
        let expired = Self::take_expired(&mut self.state.lock(), now);
        self.end_expired(expired);
        self.state.lock().entries.len()
    }

    /// The reaper: until the engine closes, sleeps to the earliest expiry
    /// and ends what expired.
    fn reap(self: Arc<Self>) {
        let mut st = self.state.lock();
        loop {
            if st.closed {
                return;
            }
            let expired = Self::take_expired(&mut st, Instant::now());
            if !expired.is_empty() {
                drop(st);
                self.end_expired(expired);
                st = self.state.lock();
                continue;
            }
            match st.entries.iter().map(|e| e.expires_at).min() {
                Some(t) => {
                    self.wake.wait_until(&mut st, t);
                }
                None => self.wake.wait(&mut st),
            }
        }
    }

    /// Books a lease's key; starts the reaper with the first.
    fn insert(self: &Arc<Self>, entry: BookEntry) {
        let mut st = self.state.lock();
        st.entries.push(entry);
        st.stats.granted += 1;
        st.stats.live = st.entries.len();
        if !st.reaper {
            st.reaper = true;
            let book = self.clone();
            let spawned = std::thread::Builder::new()
                .name(LEASE_REAPER.into())
                .spawn(move || book.reap());
            if let Err(e) = spawned {
                // Sweeps (every registration, `Engine::sweep_leases`) still
                // end expired leases; only their promptness is lost.
                st.reaper = false;
                tracing::warn!(error = %e, "no lease reaper thread: expired leases end at the next sweep");
            }
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Takes the booked leases among `ids` out (revoked); those not booked
    /// (ended already) are skipped.
    fn remove(&self, ids: &[LeaseId]) -> Vec<BookEntry> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        let mut i = 0;
        while i < st.entries.len() {
            if ids.contains(&st.entries[i].id) {
                out.push(st.entries.swap_remove(i));
            } else {
                i += 1;
            }
        }
        st.stats.revoked += out.len() as u64;
        st.stats.live = st.entries.len();
        out
    }

    fn close(&self) {
        let entries = {
            let mut st = self.state.lock();
            st.closed = true;
            std::mem::take(&mut st.entries)
        };
        self.wake.notify_all();
        drop(entries);
    }
}

pub(crate) struct MrRegistry {
    map: Mutex<MrSnapshot>,
    /// Holds the generation (`PostWords::mr_generation`), beside the
    /// other words every post reads.
    words: Arc<PostWords>,
    leases: Arc<LeaseBook>,
    next_lease: AtomicU64,
    /// A forked child's copy (`ForkKit::adopt`): no lease is made or
    /// ended here (a lease's key is a new MR, and the keys are the
    /// parent's objects).
    forked: std::sync::atomic::AtomicBool,
}

impl Drop for MrRegistry {
    fn drop(&mut self) {
        // The engine is gone: its leases end (their keys deregistered).
        self.leases.close();
    }
}

impl std::fmt::Debug for MrRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrRegistry")
            .field("generation", &self.generation())
            .field("live_leases", &self.leases.state.lock().entries.len())
            .finish()
    }
}

impl MrRegistry {
    /// An empty registry keeping its generation in `words`.
    pub(crate) fn new(words: Arc<PostWords>) -> MrRegistry {
        MrRegistry {
            map: Mutex::default(),
            words,
            leases: Arc::default(),
            next_lease: AtomicU64::new(0),
            forked: std::sync::atomic::AtomicBool::new(false),
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

    /// Ends the leases expired by `now`; returns how many stay live. A
    /// forked child ends none (its copies of the keys are the parent's).
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        if self.is_forked() {
            return self.leases.state.lock().entries.len();
        }
        self.leases.sweep(now)
    }

    /// Marks this registry a forked child's (see `forked`).
    pub(crate) fn mark_forked(&self) {
        self.forked.store(true, Ordering::Relaxed);
    }

    fn is_forked(&self) -> bool {
        self.forked.load(Ordering::Relaxed)
    }

    /// The leases' counters.
    pub(crate) fn lease_stats(&self) -> LeaseStats {
        self.leases.state.lock().stats
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
    /// `None` once deregistered (explicitly).
    mr: Option<N::Mr>,
    /// The engine's device, which registers the leases' keys.
    nic: Arc<N>,
    registry: Weak<MrRegistry>,
    leases: Mutex<Leases>,
}

#[derive(Default)]
struct Leases {
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

/// A lease granted ([`OwnedMr::lease`]): its id, its key, and the grant
/// to hand out with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// For [`OwnedMr::revoke`].
    pub id: LeaseId,
    /// The lease's own remote key (void once the lease ends).
    pub rkey: u32,
    /// The range, access and expiry the holder's pre-check enforces (the
    /// NIC enforces range, access and the end).
    pub grant: RemoteGrant,
}

/// Why a lease or a deregistration was refused.
#[derive(Debug, thiserror::Error)]
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
    /// The lease's key could not be registered.
    #[error("registering the lease's key")]
    Register(#[source] NicError),
    /// The engine that registered the MR is gone.
    #[error("the MR's engine is closed")]
    EngineClosed,
    /// Leases are the parent's business in a forked child (a lease's key
    /// is a new MR, which a child does not create).
    #[error("leasing in a forked child")]
    Forked,
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
        // The live leases' keys hold the MR registered for peers until
        // they end (their sub-regions hold it).
        if let Some((live, _)) = self.leases.lock().live_until(Instant::now()) {
            tracing::info!(
                lkey,
                live_leases = live,
                "MR dropped while leased: stays registered until its leases end"
            );
        }
    }
}

impl<N: Nic> OwnedMr<N> {
    pub(crate) fn new(mr: N::Mr, nic: &Arc<N>, registry: &Arc<MrRegistry>) -> OwnedMr<N> {
        registry.insert(&mr);
        OwnedMr {
            inner: Arc::new(OwnedInner {
                mr: Some(mr),
                nic: nic.clone(),
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
    /// `expires_at`: a remote key of the lease's own (a sub-region of the
    /// MR), valid at the NIC for that range and access only, until the
    /// lease is revoked or expires (see the module docs). The MR stays
    /// registered while the lease is live.
    ///
    /// # Errors
    /// [`LeaseError::Forked`] in a forked child,
    /// [`LeaseError::OutOfRange`] (also for an empty range),
    /// [`LeaseError::AccessMissing`] (the MR's own flags must include
    /// `access`, and `LOCAL_WRITE` for a remote write or atomic, as
    /// verbs demands), [`LeaseError::Register`] when the NIC refuses the
    /// key (its table full), [`LeaseError::EngineClosed`].
    pub fn lease(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        expires_at: Instant,
    ) -> Result<Leased, LeaseError> {
        if self.in_child() {
            return Err(LeaseError::Forked);
        }
        let mr = self.mr();
        let mr_len = mr.len() as u64;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > mr_len) {
            return Err(LeaseError::OutOfRange {
                offset,
                len,
                mr_len,
            });
        }
        if !mr.access().contains(access) {
            return Err(LeaseError::AccessMissing(access));
        }
        let writes =
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        let key_access = if writes {
            if !mr.access().contains(Access::LOCAL_WRITE) {
                return Err(LeaseError::AccessMissing(Access::LOCAL_WRITE));
            }
            access | Access::LOCAL_WRITE
        } else {
            access
        };
        let registry = self
            .inner
            .registry
            .upgrade()
            .ok_or(LeaseError::EngineClosed)?;
        // (The range fits the MR, so in usize.)
        let key = self
            .inner
            .nic
            .register_sub_mr(mr, offset as usize, len as usize, key_access)
            .map_err(LeaseError::Register)?;
        let (rkey, addr) = (key.rkey(), key.addr());
        let id = LeaseId(registry.next_lease.fetch_add(1, Ordering::Relaxed) + 1);
        {
            let mut l = self.inner.leases.lock();
            let now = Instant::now();
            l.list.retain(|x| !x.revoked && x.expires_at > now);
            l.list.push(Lease {
                id,
                expires_at,
                revoked: false,
            });
        }
        registry.leases.insert(BookEntry {
            id,
            expires_at,
            _key: Box::new(key),
        });
        tracing::debug!(lease = id.0, rkey, len, "MR leased");
        Ok(Leased {
            id,
            rkey,
            grant: RemoteGrant {
                addr,
                len,
                access,
                expires_at: Some(expires_at),
            },
        })
    }

    /// Leases live at `now` (not expired, not revoked).
    pub fn live_leases(&self, now: Instant) -> usize {
        self.inner
            .leases
            .lock()
            .live_until(now)
            .map_or(0, |(n, _)| n)
    }

    /// Revokes one lease; returns whether it was live. Its key is
    /// deregistered before this returns: a peer that posts it afterwards
    /// gets `REM_ACCESS_ERR` from the NIC, and no access through it moves
    /// data any more. In a forked child nothing is revoked (`false`): the
    /// leases are the parent's.
    pub fn revoke(&self, id: LeaseId) -> bool {
        if self.in_child() {
            return false;
        }
        let now = Instant::now();
        let live = {
            let mut l = self.inner.leases.lock();
            match l.list.iter_mut().find(|x| x.id == id) {
                Some(x) if !x.revoked && x.expires_at > now => {
                    x.revoked = true;
                    true
                }
                _ => false,
            }
        };
        if live {
            self.end_keys(&[id]);
            tracing::info!(lease = id.0, "MR lease revoked");
        }
        live
    }

    /// Revokes every lease; returns how many were live. Their keys are
    /// deregistered before this returns (as [`OwnedMr::revoke`]).
    pub fn revoke_all(&self) -> usize {
        if self.in_child() {
            return 0;
        }
        let now = Instant::now();
        let ids: Vec<LeaseId> = {
            let mut l = self.inner.leases.lock();
            let mut ids = Vec::new();
            for x in &mut l.list {
                if !x.revoked && x.expires_at > now {
                    ids.push(x.id);
                }
                x.revoked = true;
            }
            ids
        };
        self.end_keys(&ids);
        if !ids.is_empty() {
            tracing::info!(revoked = ids.len(), "MR leases revoked");
        }
        ids.len()
    }

    /// In a forked child: the leases are the parent's (revoking one there
    /// would destroy the parent's key, making one would make an MR), so
    /// the child neither makes nor ends any.
    fn in_child(&self) -> bool {
        self.inner.registry.upgrade().is_some_and(|r| r.is_forked())
    }

    /// Deregisters the keys of the leases `ids` (those still booked).
    fn end_keys(&self, ids: &[LeaseId]) {
        if let Some(r) = self.inner.registry.upgrade() {
            // Dropped here, outside the book's lock: each drop returns once
            // the NIC refuses the key.
            drop(r.leases.remove(ids));
        }
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
        // The last handle, and no live lease: dropping deregisters at once
        // (once the expired leases' keys, which hold the MR, are gone).
        if let Some(r) = self.inner.registry.upgrade() {
            r.sweep(now.max(Instant::now()));
        }
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
