//! Store membership carried by two-sided messaging, and the TCP listener
//! through which clients find the meta table and a store's members from
//! the meta server's address alone (no sim fabric name service).
//!
//! A memory node joins a named store with [`Engine::store_join`] (or keeps
//! a membership alive with [`Engine::store_keep_joined`]): a StoreJoin
//! message to the meta server's [`META_PORT`](super::META_PORT), like any
//! registration. The [`MsgMetaHost`] applies it to its `krcore_meta::stores::StoreRegistry` with the GID that
//! messaging received the message from as the member's GID, so a node can
//! join, renew and leave only memberships of its own GID. A client lists
//! the store over TCP ([`krcore_meta::bootstrap::fetch_store_tcp`]) from
//! the listener of [`MsgMetaHost::serve_tcp`], which also answers
//! BootstrapRequest (where the table is).
//!
//! ```text
//! member engine                              meta node's engine
//!   store_join("s", 1, rec) -- message --->  META_PORT: StoreRegistry::join(from.gid)
//!                           <-- Ok(lease) -
//! client (TCP address only)
//!   fetch_bootstrap_tcp ------ TCP ------->  serve_tcp: Bootstrap
//!   fetch_store_tcp("s") ----- TCP ------->  serve_tcp: StoreMembers(list at now)
//! ```
//!
//! Members expire with their lease and are swept with the table's leases
//! (every `lease_sweep_ms`); a list shows live members only, sweep or not.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use krcore_meta::bootstrap::{serve_tcp, TcpBootstrap};
use krcore_meta::registry::Lease;
use krcore_meta::stores::{StoreError, StoreName, RECORD_MAX};
use krcore_meta::wire::{ErrorCode, Message as MetaMessage, Repr, StoreJoinRepr};
use krcore_meta::MetaResult;
use krcore_nic::Nic;

use super::error::EngineError;
use super::meta_lease::{Kept, MetaLease};
use super::meta_msg::MsgMetaHost;
use super::object::Engine;

impl<N: Nic + 'static> MsgMetaHost<N> {
    /// Serves this host over TCP on `addr` (for example `127.0.0.1:0`; see
    /// [`krcore_meta::bootstrap::serve_tcp`]): a BootstrapRequest gets
    /// [`MsgMetaHost::bootstrap`], a StoreList the store's live members at
    /// the host's clock (or `Err(NoSuchStore)`), anything else
    /// `Err(UnexpectedMessage)`. The listener holds the host weakly: once
    /// the host is dropped it answers `Err(Internal)`. Dropping the
    /// returned [`TcpBootstrap`] stops it.
    ///
    /// # Errors
    /// [`krcore_meta::MetaError::Io`] when the address cannot be bound or
    /// the thread not created.
    pub fn serve_tcp(self: &Arc<Self>, addr: impl ToSocketAddrs) -> MetaResult<TcpBootstrap> {
        let host = Arc::downgrade(self);
        serve_tcp(
            addr,
            Arc::new(move |r: &Repr| {
                let Some(h) = host.upgrade() else {
                    return MetaMessage::Err(ErrorCode::Internal);
                };
                match &r.message {
                    MetaMessage::BootstrapRequest => MetaMessage::Bootstrap(h.bootstrap()),
                    MetaMessage::StoreList { store } => {
                        let now_ms = h.now_ms();
                        match h.stores().list_name(store, now_ms) {
                            Ok(members) => MetaMessage::StoreMembers(members),
                            Err(e) => MetaMessage::Err(ErrorCode::from(&e)),
                        }
                    }
                    _ => MetaMessage::Err(ErrorCode::UnexpectedMessage),
                }
            }),
        )
    }
}

/// The code a server would refuse `e` with (a check made before sending).
fn refused(gid: krcore_nic::Gid, e: &StoreError) -> EngineError {
    EngineError::MetaRefused {
        gid,
        code: ErrorCode::from(e),
    }
}

// The client side: a node's store membership calls.
impl<N: Nic> Engine<N> {
    /// Joins `store` as member `id` with `record` for `lease_ms`, or renews
    /// the membership (and replaces its record) when this engine's GID
    /// holds `id` already: a StoreJoin message to the meta server's
    /// [`META_PORT`](super::META_PORT) (see [`Engine::meta_register`] for
    /// the retries and waits). The member's GID is this engine's ([`Engine::gid`]), as the
    /// server sees the sender.
    ///
    /// # Errors
    /// [`EngineError::MetaRefused`] with the code: `BadStoreName`,
    /// `RecordTooLong` (over 64 bytes) or `InvalidLease` (0 ms) checked
    /// before sending; `MemberExists` when another GID holds `id`, live;
    /// `StoreFull`. Otherwise as [`Engine::meta_register`]
    /// ([`EngineError::MetaUnavailable`] when no answer came...).
    pub fn store_join(
        &self,
        store: &str,
        id: u16,
        record: &[u8],
        lease_ms: u64,
    ) -> Result<Lease, EngineError> {
        let name = StoreName::new(store).map_err(|e| refused(self.gid(), &e))?;
        let lease = self.store_join_name(name, id, record, lease_ms)?;
        tracing::info!(store, id, gid = %self.gid(), epoch = lease.epoch, lease_ms, "joined store");
        Ok(lease)
    }

    pub(super) fn store_join_name(
        &self,
        store: StoreName,
        id: u16,
        record: &[u8],
        lease_ms: u64,
    ) -> Result<Lease, EngineError> {
        let gid = self.gid();
        if record.len() > RECORD_MAX {
            return Err(refused(
                gid,
                &StoreError::RecordTooLong { len: record.len() },
            ));
        }
        if lease_ms == 0 {
            return Err(refused(gid, &StoreError::InvalidLease));
        }
        self.meta_call(
            gid,
            MetaMessage::StoreJoin(StoreJoinRepr {
                store,
                id,
                record: record.to_vec(),
                lease_ms,
            }),
        )
    }

    /// Removes member `id` of `store`, held by this engine's GID, returning
    /// the removed membership's expiry (epoch 1).
    ///
    /// # Errors
    /// [`EngineError::MetaRefused`] with `BadStoreName` (checked before
    /// sending), `NoSuchStore`, `NoSuchMember`, or `NotHolder` (another GID
    /// holds it); otherwise as [`Engine::meta_register`].
    pub fn store_leave(&self, store: &str, id: u16) -> Result<Lease, EngineError> {
        let name = StoreName::new(store).map_err(|e| refused(self.gid(), &e))?;
        self.store_leave_name(name, id)
    }

    pub(super) fn store_leave_name(&self, store: StoreName, id: u16) -> Result<Lease, EngineError> {
        let lease = self.meta_call(self.gid(), MetaMessage::StoreLeave { store, id })?;
        tracing::info!(store = %store, id, gid = %self.gid(), "left store");
        Ok(lease)
    }

    /// Joins `store` as member `id` (as [`Engine::store_join`], for
    /// `lease`) and keeps the membership alive: a thread joins again every
    /// third of the lease (at least 1 ms apart; a join by the holder is the
    /// renewal, one after the host swept the member a fresh membership,
    /// counted `lapsed`). A failed re-join (a timeout, or `MemberExists`
    /// when another node took the id after a lapse) is counted and tried
    /// again at the next period.
    ///
    /// Dropping the returned [`MetaLease`] stops the renewals (the member
    /// stays until its lease runs out); [`MetaLease::leave`] stops them and
    /// removes the member at once.
    ///
    /// # Errors
    /// [`EngineError::Config`] for a lease under 1 ms or when the thread
    /// cannot be created; the errors of [`Engine::store_join`] for the
    /// first join (then nothing is kept).
    pub fn store_keep_joined(
        &self,
        store: &str,
        id: u16,
        record: &[u8],
        lease: Duration,
    ) -> Result<MetaLease<N>, EngineError>
    where
        N: 'static,
    {
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        if lease_ms == 0 {
            return Err(EngineError::Config(
                "a kept store membership needs a lease of at least 1 ms".into(),
            ));
        }
        let name = StoreName::new(store).map_err(|e| refused(self.gid(), &e))?;
        let first = self.store_join_name(name, id, record, lease_ms)?;
        tracing::info!(store, id, gid = %self.gid(), epoch = first.epoch, lease_ms, "joined store (kept alive)");
        self.keep(
            vec![Kept::Store {
                store: name,
                id,
                record: record.to_vec(),
            }],
            vec![first],
            lease_ms,
        )
    }
}
