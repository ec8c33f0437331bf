//! Registrations kept alive: [`Engine::meta_keep_registered`] (DC
//! targets) and the renewal thread behind it and behind a store membership
//! ([`MetaLease`]): renewals every third of the lease, a registration the
//! host swept (or a restarted host never knew) registered again, one that
//! another engine replaced left to it.

use std::sync::Arc;
use std::time::Duration;

use krcore_meta::registry::Lease;
use krcore_meta::stores::StoreName;
use krcore_meta::wire::ErrorCode;
use krcore_nic::{DcTarget, Nic};
use parking_lot::Mutex;

use super::error::EngineError;
use super::object::Engine;

impl<N: Nic> Engine<N> {
    /// Registers `targets` with the meta server over messaging (as
    /// [`Engine::meta_register`], each for `lease`), and keeps them
    /// registered: a thread renews them every third of the lease (at least
    /// 1 ms apart), so a renewal can fail twice before the lease runs out;
    /// after a failure, every ninth of the lease until renewals work again.
    /// A renewal refused `NotRegistered` or `LeaseExpired` (the host swept
    /// the entry: it was down, restarted, or this process stalled past the
    /// lease) registers that target again (a new epoch). A renewal that
    /// fails otherwise (the host is down: a bounded timeout) is counted and
    /// tried again at the next period.
    ///
    /// Dropping the returned [`MetaLease`] stops the renewals (and joins
    /// the thread, within a few ms): the entries stay until their lease
    /// runs out. [`MetaLease::deregister`] removes them at once.
    ///
    /// # Errors
    /// [`EngineError::Config`] for an empty `targets` or a lease under 1
    /// ms, or when the thread cannot be created; the errors of
    /// [`Engine::meta_register`] for the first registration (then nothing
    /// is kept; targets registered before the failing one stay until their
    /// lease runs out).
    pub fn meta_keep_registered(
        &self,
        targets: &[DcTarget],
        lid: u16,
        lease: Duration,
    ) -> Result<MetaLease<N>, EngineError>
    where
        N: 'static,
    {
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        if targets.is_empty() || lease_ms == 0 {
            return Err(EngineError::Config(
                "a kept registration needs a target and a lease of at least 1 ms".into(),
            ));
        }
        let mut leases = Vec::with_capacity(targets.len());
        for t in targets {
            let lease = self.meta_register(*t, lid, lease_ms)?;
            tracing::info!(gid = %t.gid, dct = t.dct_num, epoch = lease.epoch, lease_ms, "registered in the meta table (kept alive)");
            leases.push(lease);
        }
        let kept = targets
            .iter()
            .map(|&target| Kept::Dc { target, lid })
            .collect();
        self.keep(kept, leases, lease_ms)
    }

    /// Keeps `kept`, registered once already (`first`), alive from a
    /// renewal thread every third of `lease_ms` (see
    /// [`Engine::meta_keep_registered`]).
    pub(super) fn keep(
        &self,
        kept: Vec<Kept>,
        first: Vec<Lease>,
        lease_ms: u64,
    ) -> Result<MetaLease<N>, EngineError>
    where
        N: 'static,
    {
        let shared = Arc::new(KeepShared {
            stop: Mutex::new(false),
            wake: parking_lot::Condvar::new(),
            stats: Mutex::new(MetaLeaseStats {
                registrations: kept.len() as u64,
                ..MetaLeaseStats::default()
            }),
        });
        let period = Duration::from_millis((lease_ms / 3).max(1));
        let epochs: Vec<u32> = first.iter().map(|l| l.epoch).collect();
        let (engine, state, kept_owned) = (self.clone(), shared.clone(), kept.clone());
        let handle = std::thread::Builder::new()
            .name("krcore-meta-lease".into())
            .spawn(move || keep_alive(&engine, &state, &kept_owned, epochs, lease_ms, period))
            .map_err(|e| EngineError::Config(format!("spawn the lease renewal thread: {e}")))?;
        Ok(MetaLease {
            engine: self.clone(),
            kept,
            first,
            period,
            shared,
            handle: Some(handle),
        })
    }
}

/// One registration a [`MetaLease`] keeps alive.
#[derive(Debug, Clone)]
pub(super) enum Kept {
    /// A DC target in the meta table: renewed, registered again if swept.
    Dc {
        /// The target.
        target: DcTarget,
        /// Its LID.
        lid: u16,
    },
    /// A store membership: joined again (a join by the holder is the
    /// renewal; one after a sweep is a fresh membership).
    Store {
        /// The store.
        store: StoreName,
        /// The member id.
        id: u16,
        /// The member's record.
        record: Vec<u8>,
    },
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::Dc { target, .. } => write!(f, "registration of {}", target.gid),
            Kept::Store { store, id, .. } => write!(f, "membership {id} of store {store}"),
        }
    }
}

/// What a [`MetaLease`]'s thread did (totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetaLeaseStats {
    /// Registrations sent (the first ones included) that were accepted.
    pub registrations: u64,
    /// Renewals the host accepted.
    pub renewals: u64,
    /// Renewals refused `NotRegistered` / `LeaseExpired`, after which the
    /// target was registered again (for a store membership: a re-join that
    /// got a new epoch, the host having swept the member).
    pub lapsed: u64,
    /// Renewals or re-registrations that failed (timeout, refusal): tried
    /// again at the next period.
    pub failures: u64,
    /// Renewals refused because another engine registered at the GID since
    /// ([`ErrorCode::Replaced`]: a second engine on the port). The target
    /// is not registered again while the other's registration stands (the
    /// newest engine at a GID is the one peers reach); renewals go on, and
    /// once the other's registration is gone (it deregistered, or its
    /// lease ran out) the target is registered again.
    pub replaced: u64,
}

struct KeepShared {
    stop: Mutex<bool>,
    wake: parking_lot::Condvar,
    stats: Mutex<MetaLeaseStats>,
}

/// Registrations kept alive by a renewal thread (see
/// [`Engine::meta_keep_registered`] for DC targets,
/// [`Engine::store_keep_joined`] for a store membership). Dropping it stops
/// the renewals.
pub struct MetaLease<N: Nic> {
    engine: Engine<N>,
    kept: Vec<Kept>,
    first: Vec<Lease>,
    period: Duration,
    shared: Arc<KeepShared>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl<N: Nic> std::fmt::Debug for MetaLease<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaLease")
            .field("kept", &self.kept)
            .field("period", &self.period)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<N: Nic> MetaLease<N> {
    /// The leases of the first registrations (or the join), in `targets`
    /// order.
    pub fn first_leases(&self) -> &[Lease] {
        &self.first
    }

    /// How often the thread renews.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The thread's counters.
    pub fn stats(&self) -> MetaLeaseStats {
        *self.shared.stats.lock()
    }

    fn stop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }

    /// Stops the renewals and removes every target's registration (a
    /// store membership: leaves the store).
    ///
    /// # Errors
    /// The first error of [`Engine::meta_deregister`] or
    /// [`Engine::store_leave`] (the other registrations are still tried).
    pub fn deregister(mut self) -> Result<(), EngineError> {
        self.stop();
        let mut first = Ok(());
        for k in &self.kept {
            let r = match k {
                Kept::Dc { target, .. } => self.engine.meta_deregister(target).map(|_| ()),
                Kept::Store { store, id, .. } => {
                    self.engine.store_leave_name(*store, *id).map(|_| ())
                }
            };
            // A registration another engine replaced is not this one's to
            // remove: this one's is gone already.
            if let Err(e) = r.or_else(|e| if replaced(&e) { Ok(()) } else { Err(e) }) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// [`MetaLease::deregister`], named for a store membership: stops the
    /// renewals and leaves the store.
    ///
    /// # Errors
    /// As [`MetaLease::deregister`].
    pub fn leave(self) -> Result<(), EngineError> {
        self.deregister()
    }
}

impl<N: Nic> Drop for MetaLease<N> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The renewal loop of a [`MetaLease`].
fn keep_alive<N: Nic>(
    engine: &Engine<N>,
    shared: &KeepShared,
    kept: &[Kept],
    mut epochs: Vec<u32>,
    lease_ms: u64,
    period: Duration,
) {
    // Consecutive failures of each kept registration (for the events).
    let mut streaks = vec![0u64; kept.len()];
    loop {
        {
            // After a failed renewal the next comes three times sooner: a
            // lease survives more lost renewals, and a node is back in a
            // restarted server's table sooner (see `meta_follow`).
            let wait = if streaks.iter().any(|s| *s > 0) {
                period / 3
            } else {
                period
            };
            let mut stop = shared.stop.lock();
            if !*stop {
                let _ = shared.wake.wait_for(&mut stop, wait);
            }
            if *stop {
                return;
            }
        }
        for ((k, epoch), streak) in kept.iter().zip(epochs.iter_mut()).zip(streaks.iter_mut()) {
            // (A renewal sent to a server that restarted elsewhere follows
            // it inside `meta_call`; the new table then answers
            // NotRegistered and the target is registered again.)
            let r = renew(engine, k, epoch, lease_ms);
            match &r {
                Err(e) if replaced(e) => {
                    if streak.saturating_add(1).is_power_of_two() {
                        tracing::error!(registration = %k, refusals = *streak + 1, "another engine registered at this GID over this one: peers reach it, not this process; two engines on one port collide (share the port through krcored, or give each process a GID of its own); registering again once its registration is gone");
                    }
                }
                Ok(false) => {
                    tracing::warn!(registration = %k, failures = *streak, "meta lease lapsed (swept by the host): registered again");
                }
                Ok(true) if *streak > 0 => {
                    tracing::info!(registration = %k, failures = *streak, "meta lease renewals work again");
                }
                Ok(true) => {}
                // The first failure of a streak, then every power of two.
                Err(e) if streak.saturating_add(1).is_power_of_two() => {
                    tracing::warn!(registration = %k, failures = *streak + 1, reason = %e, "meta lease renewal failed");
                }
                Err(_) => {}
            }
            *streak = if r.is_ok() {
                0
            } else {
                streak.saturating_add(1)
            };
            let mut s = shared.stats.lock();
            match r {
                Ok(true) => s.renewals += 1,
                Ok(false) => {
                    s.lapsed += 1;
                    s.registrations += 1;
                }
                Err(e) if replaced(&e) => s.replaced += 1,
                Err(_) => s.failures += 1,
            }
        }
    }
}

/// Whether the meta server refused a renewal or deregistration because
/// another engine's registration holds the GID now.
fn replaced(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::MetaRefused {
            code: ErrorCode::Replaced,
            ..
        }
    )
}

/// One renewal of `k`: `Ok(true)` renewed, `Ok(false)` registered (or
/// joined) again after the host swept it (or a restarted host never knew
/// it).
fn renew<N: Nic>(
    engine: &Engine<N>,
    k: &Kept,
    epoch: &mut u32,
    lease_ms: u64,
) -> Result<bool, EngineError> {
    match k {
        Kept::Dc { target, lid } => match engine.meta_renew(target) {
            Ok(_) => Ok(true),
            Err(EngineError::MetaRefused {
                code: ErrorCode::NotRegistered | ErrorCode::LeaseExpired,
                ..
            }) => engine.meta_register(*target, *lid, lease_ms).map(|_| false),
            Err(e) => Err(e),
        },
        Kept::Store { store, id, record } => engine
            .store_join_name(*store, *id, record, lease_ms)
            .map(|l| std::mem::replace(epoch, l.epoch) == l.epoch),
    }
}
