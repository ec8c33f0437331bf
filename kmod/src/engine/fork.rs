//! Process sharing for elastic starts (after Swift): a parent prepares a
//! [`ForkKit`] (its own DCIs, made by the parent before the fork), forks,
//! and the child re-arms its inherited engine with it
//! ([`ForkKit::adopt`]): ready to post with a warm DCCache and no control
//! path work at all.
//!
//! # What the child may use, and what it must not touch
//!
//! After `fork` the child is a copy of the parent with one thread (the one
//! that forked): threads (an RC fallback handshake thread, a progress
//! thread) do not survive. Its memory is a private copy, but the sim
//! fabric's segments (QPs, CQs, MRs of a `/dev/shm` fabric) are shared
//! mappings: the parent's QPs and CQs are the very same objects in both
//! processes. So:
//!
//! - **May use**: the engine handle after [`ForkKit::adopt`]: VQPs it
//!   creates then (bound to the kit's DCIs, which the parent never posts
//!   on), `connect` to any target in the inherited DCCache (a hit: no
//!   network), posts and polls on those VQPs, MRs allocated by the parent
//!   before the fork (registered, mapped in both processes: their lkeys
//!   pass the pre-check; the parent and child must agree who writes what),
//!   the DCCache (its private copy, warm).
//! - **Refused with typed errors** (the flag [`ForkKit::adopt`] sets):
//!   DCCache misses (the meta client's VQP and buffer are the parent's:
//!   [`EngineError::Unsupported`]), new MRs (the sim's allocator state is
//!   per process: [`EngineError::Unsupported`]), messaging (the SRQ and its
//!   CQ are the parent's: `MsgError::Unsupported`), the DC -> RC upgrade
//!   (the RC pairs in the inherited pool are the parent's QPs, guarded by
//!   the parent's locks: a child VQP's hint is refused with
//!   [`EngineError::Unsupported`] and the VQP stays on its DCI; a child
//!   starts no background build), MR leases (a lease's key is a new MR:
//!   `LeaseError::Forked`; the child's copies of the parent's leases are
//!   the parent's, which it neither revokes nor sweeps).
//! - **Lazy resources** (see [`super::Engine::start`]): what the parent had
//!   not created before the fork is refused in the child, typed
//!   ([`EngineError::Unsupported`]; a child creates no NIC object): the
//!   DCT ([`super::Engine::local_target`]) and the upgrade's handshake
//!   port ([`super::Engine::handshake_entry`]); a VQP's DC -> RC upgrade
//!   fails anyway and the VQP stays on its DCI. What the parent had
//!   created is the parent's: `local_target` and `handshake_entry` return
//!   the parent's addresses (the same node), and the DCT's SRQ still
//!   belongs to the parent (messaging stays refused). The meta client's
//!   READ buffer and its VQP on the parent's DCI 0 are never used by the
//!   child (its DCCache misses are refused). A parent that wants its
//!   addresses fixed before forking creates them first (`local_target`,
//!   `handshake_entry`) or starts with `EngineConfig::eager_start`.
//! - **Must not touch**: VQPs created before the fork (they post on the
//!   parent's DCIs), the parent's DCIs, CQs, DCT and SRQ; and it must not
//!   return past the fork point or run destructors of inherited objects
//!   (dropping a handle destroys the shared object): end the child with
//!   `_exit` (the SDK's `Node::fork` does).
//! - The kit's DCIs belong to the parent's bookkeeping: the parent drops
//!   its [`ForkKit`] (destroying them) after the child exited.
//!
//! The kit is DC mode only: in RC fallback mode the QPs are RC pairs whose
//! peers know the parent's QPN, and the handshake endpoint is the parent's.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use krcore_nic::Nic;

use super::config::EngineMode;
use super::error::EngineError;
use super::object::Engine;
use super::physqp::PhysQp;

/// DCIs a parent made for a child (see the module docs).
pub struct ForkKit<N: Nic> {
    engine: Engine<N>,
    dcis: Vec<Arc<PhysQp<N>>>,
}

impl<N: Nic> std::fmt::Debug for ForkKit<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkKit")
            .field("dcis", &self.dcis.len())
            .finish()
    }
}

impl<N: Nic> Engine<N> {
    /// Prepares `dcis` DCIs for one forked child (call before `fork`).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in RC fallback mode or in a forked
    /// child; [`EngineError::Config`] for 0 DCIs; [`EngineError::Nic`].
    pub fn prepare_fork(&self, dcis: usize) -> Result<ForkKit<N>, EngineError> {
        self.inner.refuse_in_child("preparing a fork")?;
        if self.mode() != EngineMode::Dc {
            return Err(EngineError::Unsupported {
                reason: "fork kits need DC mode (RC pairs are bound to the parent's QPs)",
            });
        }
        if dcis == 0 {
            return Err(EngineError::Config(
                "a fork kit needs at least 1 DCI".into(),
            ));
        }
        let base = self.inner.cfg.pool_size;
        let dcis = (0..dcis)
            .map(|i| PhysQp::dci(&self.inner, base + i).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ForkKit {
            engine: self.clone(),
            dcis,
        })
    }

    /// Whether this engine was re-armed in a forked child.
    pub fn is_forked_child(&self) -> bool {
        self.inner.forked.load(Ordering::Relaxed)
    }
}

impl<N: Nic> ForkKit<N> {
    /// In the child: re-arms the inherited engine with the kit's DCIs
    /// (VQPs created from now on are bound to them) and marks it a forked
    /// child (see the module docs for what that refuses). Returns the
    /// engine.
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] when the pool's lock was held by
    /// another thread of the parent at the fork (it can never be released
    /// in the child).
    pub fn adopt(&self) -> Result<Engine<N>, EngineError> {
        let inner = &self.engine.inner;
        let Some(mut pool) = inner.pool.try_lock_for(Duration::from_millis(10)) else {
            return Err(EngineError::Unsupported {
                reason: "the DCI pool was locked by another thread at the fork",
            });
        };
        // Every pool index maps to a kit DCI: `create_vqp` never creates a
        // DCI (the allocator belongs to the parent) and never picks one of
        // the parent's.
        let n = inner.cfg.pool_size;
        *pool = (0..n)
            .map(|i| self.dcis[i % self.dcis.len()].clone())
            .collect();
        inner.forked.store(true, Ordering::Relaxed);
        inner.mrs.mark_forked();
        drop(pool);
        Ok(self.engine.clone())
    }
}
