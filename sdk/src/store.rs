//! A node's membership in a named store (`race_store::deploy`'s memory
//! nodes), kept alive by renewals, on either host: an engine of the
//! process's own ([`krcore_kmod::MetaLease`]) or the node daemon's (the
//! daemon joins for the process; this side renews).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use krcore_kmod::daemon::DaemonError;
use krcore_kmod::{EngineError, MetaLease};
use krcore_nic::{Gid, Nic};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::node::{Backend, Node};

/// A membership [`Node::store_keep_joined`] keeps: renewed every third
/// of its lease until [`StoreMembership::leave`] or the drop (which stops
/// the renewals and leaves the membership to expire; on an attached node
/// the daemon leaves it at once when the process goes).
pub struct StoreMembership<N: Nic = krcore_nic::AnyNic> {
    inner: Kept<N>,
}

enum Kept<N: Nic> {
    Engine(MetaLease<N>),
    Daemon(DaemonKept<N>),
}

struct DaemonKept<N: Nic> {
    node: Node<N>,
    store: String,
    id: u16,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl<N: Nic> std::fmt::Debug for StoreMembership<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Kept::Engine(l) => f.debug_tuple("StoreMembership").field(l).finish(),
            Kept::Daemon(d) => f
                .debug_struct("StoreMembership")
                .field("store", &d.store)
                .field("id", &d.id)
                .field("via", &"node daemon")
                .finish(),
        }
    }
}

impl<N: Nic + 'static> Node<N> {
    /// Joins `store` as member `id` with `record` (at most 64 bytes) for
    /// `lease`, and keeps the membership: renewed every third of `lease`
    /// until [`StoreMembership::leave`]. The member's GID is this node's.
    /// On an attached node the daemon's engine joins (and refuses a member
    /// another process of the node holds).
    ///
    /// # Errors
    /// [`Error::Engine`] with [`EngineError::MetaRefused`] and the meta
    /// server's code (`BadStoreName`, `RecordTooLong`, `MemberExists`,
    /// `StoreFull`, ...) on either host; [`EngineError::Config`] for a
    /// zero lease; [`Error::Daemon`] when the daemon refuses or is gone;
    /// otherwise the engine's errors (the meta server did not answer).
    pub fn store_keep_joined(
        &self,
        store: &str,
        id: u16,
        record: &[u8],
        lease: Duration,
    ) -> Result<StoreMembership<N>> {
        let inner = match self.backend() {
            Backend::Engine(e) => Kept::Engine(e.store_keep_joined(store, id, record, lease)?),
            Backend::Daemon(a) => {
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                if lease_ms == 0 {
                    return Err(EngineError::Config(
                        "a store membership's lease must be at least 1 ms".into(),
                    )
                    .into());
                }
                a.store_join(store, id, record, lease_ms)
                    .map_err(|e| from_daemon(a.gid(), e))?;
                let stop = Arc::new((Mutex::new(false), Condvar::new()));
                let period = (lease / 3).max(Duration::from_millis(1));
                let (node, name, rec, flag) = (
                    self.clone(),
                    store.to_string(),
                    record.to_vec(),
                    stop.clone(),
                );
                let thread = std::thread::Builder::new()
                    .name("krcore-store-lease".into())
                    .spawn(move || renew(&node, &name, id, &rec, lease_ms, period, &flag))
                    .map_err(|e| {
                        EngineError::Config(format!("spawn the store renewal thread: {e}"))
                    })?;
                Kept::Daemon(DaemonKept {
                    node: self.clone(),
                    store: store.to_string(),
                    id,
                    stop,
                    thread: Some(thread),
                })
            }
        };
        Ok(StoreMembership { inner })
    }
}

impl<N: Nic> StoreMembership<N> {
    /// Stops the renewals and leaves the store.
    ///
    /// # Errors
    /// As [`Node::store_keep_joined`] (the meta server refused or did not
    /// answer; the renewals are stopped anyway).
    pub fn leave(self) -> Result<()> {
        match self.inner {
            Kept::Engine(l) => Ok(l.leave()?),
            Kept::Daemon(mut d) => {
                d.stop_renewals();
                match d.node.backend() {
                    Backend::Daemon(a) => a
                        .store_leave(&d.store, d.id)
                        .map_err(|e| from_daemon(a.gid(), e)),
                    Backend::Engine(_) => Ok(()),
                }
            }
        }
    }
}

impl<N: Nic> DaemonKept<N> {
    fn stop_renewals(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<N: Nic> Drop for DaemonKept<N> {
    fn drop(&mut self) {
        self.stop_renewals();
    }
}

/// The renewal loop of a membership kept through the daemon: joins again
/// every `period` until stopped (a failure is logged; the next period
/// tries again).
fn renew<N: Nic>(
    node: &Node<N>,
    store: &str,
    id: u16,
    record: &[u8],
    lease_ms: u64,
    period: Duration,
    stop: &(Mutex<bool>, Condvar),
) {
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, period);
            }
            if *stopped {
                return;
            }
        }
        if let Backend::Daemon(a) = node.backend() {
            if let Err(e) = a.store_join(store, id, record, lease_ms) {
                tracing::warn!(store, id, reason = %e, "renewing a store membership through the node daemon failed");
            }
        }
    }
}

/// The meta server's refusal is the engine's typed error on either host.
fn from_daemon(gid: Gid, e: DaemonError) -> Error {
    match e {
        DaemonError::MetaRefused { code } => EngineError::MetaRefused { gid, code }.into(),
        e => e.into(),
    }
}
