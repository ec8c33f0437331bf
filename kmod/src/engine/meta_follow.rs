//! Following a restarted meta server.
//!
//! A restarted `krcore-meta` has a new table (empty, another rkey), a new
//! DCT (in RC fallback mode a new handshake endpoint) and a new
//! incarnation. An engine that kept the old location would fail every
//! lookup and every lease renewal until its process restarted. An engine
//! given a [`MetaSource`] (how to fetch the bootstrap again; the SDK sets
//! one for `NodeBuilder::meta_addr`, the server's TCP bootstrap) follows
//! the server instead: [`Engine::refresh_meta`] fetches the bootstrap and,
//! when it names another server, moves the meta client there (its next
//! READs go to the new table), drops the registration endpoint and the
//! DCCache entry of the old server (the next request opens a channel to
//! the new one), and in RC fallback mode closes the pair with the old node.
//!
//! # Who refreshes
//!
//! - A request over messaging (Register, Renew, Deregister, a store's Join
//!   or Leave) that fails other than by the server's refusal: when the
//!   server moved, the request is sent again, to the new one. So the lease
//!   threads ([`Engine::meta_keep_registered`],
//!   [`Engine::store_keep_joined`]) follow at their next renewal: the new
//!   table does not know the entry (`NotRegistered`), so the target is
//!   registered again, and a store membership joins again; and so do the
//!   renewals a node daemon makes for its attached processes. A node is
//!   back in the new table within a renewal period plus the failed
//!   request's timeout.
//! - A lookup (DCCache miss) whose READ fails: after a refresh that moved
//!   the client, the lookup READs the new table once more (the entry may
//!   not be there yet: its node re-registers within its own period).
//!
//! Fetches are at most one per [`REFRESH_EVERY`](super::REFRESH_EVERY)
//! (calls in between return [`MetaRefresh::Recent`]), so a dead server
//! costs one bootstrap fetch per interval, not one per failed lookup.
//!
//! # What stays
//!
//! DCCache entries read from the old table stay: peers did not move with
//! the meta server, and a restarted server's epochs start from the
//! wall-clock second (`krcore_meta::MetaConfig::first_epoch`), above its
//! predecessor's, so newer entries still replace them. An entry that went
//! stale meanwhile (its node restarted as well) is dropped by its first
//! error completion, as always. VQPs keep their targets: the data path
//! does not notice the meta server's restart.
//!
//! The new table must have the old one's shape ([`EngineError::MetaReshaped`]
//! otherwise: the lookup buffers are sized for it).

use krcore_nic::Nic;

use super::config::{EngineMode, MetaLocation};
use super::error::EngineError;
use super::meta::{MetaRefresh, MetaSource};
use super::object::{Engine, EngineInner};
use super::rc::RcHost;

impl<N: Nic> Engine<N> {
    /// Makes the engine follow its meta server through restarts, fetching
    /// the bootstrap with `source` when the server stops answering (see
    /// the module docs). Replaces an earlier source; no effect on an
    /// engine that reads no meta server.
    pub fn set_meta_source(&self, source: MetaSource) {
        if let Some(client) = self.inner.meta.get() {
            client.set_source(source);
        }
    }

    /// Fetches the bootstrap from the [`MetaSource`] and, when it names
    /// another server than the one the engine reads, moves there (see the
    /// module docs). At most one fetch per [`REFRESH_EVERY`](super::REFRESH_EVERY).
    ///
    /// # Errors
    /// [`EngineError::MetaSource`] when the fetch fails (the server is
    /// still down: the engine keeps its location);
    /// [`EngineError::Bootstrap`] for a table layout this build cannot
    /// read; [`EngineError::MetaReshaped`] for a table of another shape;
    /// RC fallback mode: [`EngineError::NotAFallbackNode`] for a DC server,
    /// [`EngineError::Nic`] when the meta QP cannot be reset.
    pub fn refresh_meta(&self) -> Result<MetaRefresh, EngineError> {
        self.inner.refresh_meta()
    }
}

impl<N: Nic> EngineInner<N> {
    /// [`Engine::refresh_meta`].
    pub(super) fn refresh_meta(&self) -> Result<MetaRefresh, EngineError> {
        let eng = self;
        let Some(client) = eng.meta.get() else {
            return Ok(MetaRefresh::NoSource);
        };
        let source = match client.source_for_refresh() {
            Ok(source) => source,
            Err(why) => return Ok(why),
        };
        let bootstrap = source().map_err(EngineError::MetaSource)?;
        let to = MetaLocation::from_bootstrap(&bootstrap)?;
        let from = client.location();
        if !client.relocate(to)? {
            return Ok(MetaRefresh::Same);
        }
        // The registration endpoint's channels and the cached target were
        // the old server's: the next request opens a channel to the new
        // one (and, on its GID, caches the new target).
        client.mark_endpoint_stale();
        if to.server.gid == from.server.gid {
            eng.cache.invalidate(&from.server.gid);
        }
        if eng.mode() == EngineMode::RcFallback {
            // The messaging pair with the old node (on the new one's GID):
            // closed now rather than by its first failed WR.
            if let (Some(pool), Ok(peer)) =
                (eng.rc_pool(), super::pairing::handshake_target(&to.server))
            {
                pool.forget_restarted(eng, peer);
            }
        }
        tracing::warn!(
            from_gid = %from.server.gid,
            to_gid = %to.server.gid,
            incarnation = bootstrap.incarnation,
            "the meta server moved (restarted): reading its new table"
        );
        Ok(MetaRefresh::Moved { from, to })
    }
}
