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

use super::idhash::IdMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use krcore_nic::{MemoryRegion, Nic};
use parking_lot::Mutex;

use crate::precheck::{LocalMr, LocalMrTable};

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

#[derive(Debug, Default)]
pub(crate) struct MrRegistry {
    map: Mutex<MrSnapshot>,
    generation: AtomicU64,
}

impl MrRegistry {
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current map and its generation.
    pub(crate) fn snapshot(&self) -> (u64, MrSnapshot) {
        let map = self.map.lock();
        (self.generation.load(Ordering::Acquire), map.clone())
    }

    fn update(&self, f: impl FnOnce(&mut IdMap<u32, LocalMr>)) {
        let mut map = self.map.lock();
        f(Arc::make_mut(&mut map.0));
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn insert<M: MemoryRegion>(&self, mr: &M) {
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
    mr: N::Mr,
    registry: Weak<MrRegistry>,
}

impl<N: Nic> Drop for OwnedInner<N> {
    fn drop(&mut self) {
        if let Some(r) = self.registry.upgrade() {
            let lkey = self.mr.lkey();
            r.update(|m| {
                m.remove(&lkey);
            });
        }
    }
}

impl<N: Nic> OwnedMr<N> {
    pub(crate) fn new(mr: N::Mr, registry: &Arc<MrRegistry>) -> OwnedMr<N> {
        registry.insert(&mr);
        OwnedMr {
            inner: Arc::new(OwnedInner {
                mr,
                registry: Arc::downgrade(registry),
            }),
        }
    }

    /// The provider's MR handle.
    pub fn mr(&self) -> &N::Mr {
        &self.inner.mr
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
        &self.inner.mr
    }
}

impl<N: Nic> std::fmt::Debug for OwnedMr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedMr")
            .field("addr", &format_args!("{:#x}", self.inner.mr.addr()))
            .field("len", &self.inner.mr.len())
            .field("lkey", &format_args!("{:#x}", self.inner.mr.lkey()))
            .finish()
    }
}
