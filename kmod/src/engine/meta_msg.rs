//! Meta registration carried by two-sided messaging: the meta server that
//! deployments run (the SDK's `host_meta`, the `krcore-meta` binary).
//!
//! The meta server becomes a messaging peer: [`MsgMetaHost`] is the meta
//! table hosted by an engine, READ by clients through that engine's DCT (no
//! server CPU), and served for Register/Renew/Deregister/BootstrapRequest
//! on the reserved port [`META_PORT`] of the same DCT/SRQ, with messaging's
//! receive protocol (the sender's VQP id in the immediate, credits, replies
//! to the sender's endpoint). Nodes call [`Engine::meta_register`],
//! [`Engine::meta_renew`], [`Engine::meta_deregister`], or keep a lease
//! alive with [`Engine::meta_keep_registered`] (a thread renewing every
//! third of the lease, re-registering an entry the host swept).
//!
//! RC fallback mode (no DC) works the same over RC pairs: the bootstrap's
//! server entry names the host engine's handshake endpoint; a node's first
//! contact with the meta node is the UD handshake that builds its pair (one
//! for its meta READs, one for messaging), after which Register/Renew/
//! Deregister travel as messages on [`META_PORT`] over the pair and READs
//! of the table arrive on a passive RC QP in the engine's PD.
//!
//! The hosting engine reads its own table: [`MsgMetaHost::start`] makes an
//! engine started without a meta location adopt the host's.
//!
//! ```text
//! node engine                                   meta node's engine
//!   Endpoint (engine's own) --- Open --------->  DCT/SRQ demux: Grant
//!     push Register/Renew/.. (meta wire) ----->  reserved Port META_PORT
//!                                                MsgMetaHost::progress:
//!                                                MetaTable::handle -> Ok/Err
//!     pop_reply <--- reply Ok(lease) | Err ----  Port::reply
//!   lookups: READ bucket via a DCI  -------->   table MR behind the DCT (no CPU)
//! ```
//!
//! # Capacity: any number of nodes over time
//!
//! A node's registration endpoint is a control endpoint (as the upgrade
//! handshake's, see [`super::handshake_msg`]): its channel to [`META_PORT`] asks
//! for `msg.control_window` credits (default 1), and is closed (a Close
//! message, once the request's credit is back) when the call is over, so
//! the host's slots return to it: at most `msg.port_slots / control_window`
//! calls hold a slot at once, any number of nodes register over time. A
//! call whose Open finds every slot granted is refused `Busy` and asks
//! again after a pause, within its retries; then
//! [`MetaFailure::Refused`]. A reply sent after the Close (to a retried
//! request already answered) is counted `orphaned` at the node. A channel
//! never closed (a crashed node) is reclaimed when its slot is needed and
//! it has been idle for `msg.control_idle` (see [`super::handshake_msg`]).
//!
//! # Why here (kmod), not in the meta crate
//!
//! Messaging is the engine's (`kmod` depends on `krcore-meta` for the table
//! layout, not the other way round). Hosting the table in an engine reuses
//! all of messaging, receive demultiplexing, credits, replies, loss reports
//! and malformed-input counting, instead of a second implementation of the
//! protocol in the meta crate; the meta crate keeps the pure parts both
//! sides share (table layout, [`MetaTable`], the request wire format
//! [`krcore_meta::wire`]). The older hosts, `krcore_meta::LocalMetaHost` (DC,
//! requests over UD) and [`super::RcMetaHost`] (RC fallback, requests over
//! its UD handshake endpoint), serve no deployment any more: see their
//! docs.
//!
//! # Invariants (those of a meta server)
//!
//! - The host's CPU touches only two-sided requests: lookups are one-sided
//!   READs of the table MR through the engine's DCT.
//! - Bad input never stops it: bytes that are not a meta request get an
//!   `Err` reply or are dropped, counted ([`MetaHostStats`]); a failed reply
//!   is counted; messaging drops and counts what breaks its own protocol.
//! - Leases are swept by every serving step, at most every
//!   `lease_sweep_ms` (the host's clock: ms since start, or the caller's in
//!   [`MsgMetaHost::progress_at`]).
//!
//! # Who serves
//!
//! [`MsgMetaHost::progress`] (non-blocking; the host calls it) or the thread
//! of [`MsgMetaHost::spawn`]. Nobody serving: clients' calls end with a
//! bounded, typed [`EngineError::MetaUnavailable`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_meta::mr_table::MrTable;
use krcore_meta::registry::{Lease, MetaTable};
use krcore_meta::stores::StoreRegistry;
use krcore_meta::wire::{
    BootstrapRepr, ErrorCode, Message as MetaMessage, MessageType, RegisterRepr, Repr,
};
use krcore_meta::MetaConfig;
use krcore_nic::{Access, DcTarget, Gid, MemoryRegion, Nic, UdTarget};
use parking_lot::{Mutex, MutexGuard};

use super::config::MetaLocation;
use super::error::{EngineError, MetaFailure};
use super::handshake_msg::{busy_pause, ControlPush};
use super::messaging::{MsgError, Port, Worker};
use super::meta::{MetaClient, MetaPolicy};
use super::mrs::OwnedMr;
use super::object::{Engine, EngineInner};
use super::rc::RcHost;

/// The reserved messaging port a [`MsgMetaHost`] serves requests on.
pub const META_PORT: u16 = 0xfffe;

/// Longest the host waits for a reply credit (a client that gave up leaves
/// its replies unpopped; the host must not stall on it).
const REPLY_WAIT: Duration = Duration::from_millis(5);

/// Requests re-sent after a timeout by [`Engine::meta_register`] and the
/// others (each waits `EngineConfig::meta_timeout`).
pub const META_RPC_RETRIES: u32 = 2;

/// Largest meta message (a bootstrap reply is the longest).
const META_MAX: usize = 256;

/// What a [`MsgMetaHost`] did (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetaHostStats {
    /// Requests answered (each got a reply, possibly `Err`).
    pub requests: u64,
    /// Of those, answered with `Err(Malformed | UnsupportedVersion |
    /// UnexpectedMessage)`.
    pub malformed: u64,
    /// Messages that were not meta requests at all: dropped, no reply.
    pub dropped: u64,
    /// Replies that could not be sent (the client stopped popping, or is
    /// gone): counted, the client's call times out.
    pub reply_failures: u64,
    /// Lease sweeps run.
    pub sweeps: u64,
    /// Registrations removed by sweeps.
    pub swept: u64,
    /// Store joins accepted (renewals included).
    pub store_joins: u64,
    /// Store leaves accepted.
    pub store_leaves: u64,
    /// Store members removed by sweeps (their lease ran out).
    pub store_swept: u64,
}

/// The meta table hosted by a DC engine, served over messaging (see the
/// module docs). `Send + Sync`.
pub struct MsgMetaHost<N: Nic> {
    engine: Engine<N>,
    port: Port<N>,
    table: Mutex<MetaTable<MrTable<N::Mr>>>,
    stores: Mutex<StoreRegistry>,
    _mr: OwnedMr<N>,
    bootstrap: BootstrapRepr,
    started: Instant,
    sweep_every_ms: u64,
    next_sweep_ms: AtomicU64,
    stats: Mutex<MetaHostStats>,
}

impl<N: Nic> std::fmt::Debug for MsgMetaHost<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgMetaHost")
            .field("bootstrap", &self.bootstrap)
            .field("stats", &*self.stats.lock())
            .finish()
    }
}

fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl<N: Nic> MsgMetaHost<N> {
    /// Hosts a meta table on `engine`: the table MR (`REMOTE_READ |
    /// LOCAL_WRITE`, zeroed) in the engine's PD, the DCT clients READ it
    /// through (created if not yet; RC fallback mode: the handshake
    /// endpoint their RC pairs are made by), and the reserved port
    /// [`META_PORT`] bound for requests. An engine started without a meta
    /// location reads this table from now on.
    ///
    /// From `meta` it takes `geometry`, `first_epoch`, `incarnation` and
    /// `lease_sweep_ms` (the DCT's key is the engine's `dc_key`; `qkey` and
    /// slot counts are not used: the host makes no UD QP of its own).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] when the port is already served;
    /// [`EngineError::Config`] for a table larger than memory;
    /// [`EngineError::Nic`] when the provider refuses an object.
    pub fn start(engine: &Engine<N>, meta: MetaConfig) -> Result<MsgMetaHost<N>, EngineError> {
        let geometry = meta.geometry;
        let len = table_len(&geometry)?;
        let mr = engine.alloc_mr(len, Access::REMOTE_READ | Access::LOCAL_WRITE)?;
        let first_epoch = meta
            .first_epoch
            .unwrap_or_else(|| u32::try_from(wall_clock().as_secs()).unwrap_or(u32::MAX / 2));
        let incarnation = meta.incarnation.unwrap_or_else(|| {
            (wall_clock().as_nanos() as u64) ^ (u64::from(std::process::id()) << 40)
        });
        let table = MetaTable::with_first_epoch(geometry, MrTable::new((*mr).clone()), first_epoch)
            .map_err(|e| EngineError::Config(format!("meta table: {e}")))?;
        let server = engine.local_target()?;
        // The bootstrap's RPC target names the reserved port, not a UD QP
        // (a messaging host has none): `rpc_qpn` is META_PORT, `rpc_qkey` 0.
        let bootstrap = BootstrapRepr::new(
            geometry,
            mr.remote(0),
            incarnation,
            server,
            UdTarget {
                gid: server.gid,
                qpn: u32::from(META_PORT),
                qkey: 0,
            },
        );
        let location = MetaLocation::from_bootstrap(&bootstrap)?;
        let port = engine.bind_reserved(META_PORT).map_err(|e| match e {
            MsgError::Engine(e) => e,
            MsgError::PortInUse { .. } => EngineError::Unsupported {
                reason: "this engine hosts a meta table already",
            },
            other => EngineError::Config(format!("bind the meta port: {other}")),
        })?;
        // The hosting engine reads its own table (connects to the nodes it
        // names) unless it was started reading another one.
        engine.adopt_meta(location)?;
        Ok(MsgMetaHost {
            engine: engine.clone(),
            port,
            table: Mutex::new(table),
            stores: Mutex::new(StoreRegistry::default()),
            _mr: mr,
            bootstrap,
            started: Instant::now(),
            sweep_every_ms: meta.lease_sweep_ms,
            next_sweep_ms: AtomicU64::new(0),
            stats: Mutex::new(MetaHostStats::default()),
        })
    }

    /// What clients need to reach the table (and the request port: see
    /// [`MsgMetaHost::start`]).
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.bootstrap
    }

    /// The location engines read the table at.
    ///
    /// # Errors
    /// As [`MetaLocation::from_bootstrap`].
    pub fn location(&self) -> Result<MetaLocation, EngineError> {
        MetaLocation::from_bootstrap(&self.bootstrap)
    }

    /// The engine hosting the table.
    pub fn engine(&self) -> &Engine<N> {
        &self.engine
    }

    /// The table engine, for registrations made by the host's process
    /// itself. Hold the guard briefly: serving takes it.
    pub fn table(&self) -> MutexGuard<'_, MetaTable<MrTable<N::Mr>>> {
        self.table.lock()
    }

    /// The membership of named stores, kept beside the table (joined and
    /// left by messages on [`META_PORT`], listed over TCP: see
    /// [`MsgMetaHost::serve_tcp`]). Hold the guard briefly: serving takes
    /// it.
    pub fn stores(&self) -> MutexGuard<'_, StoreRegistry> {
        self.stores.lock()
    }

    /// Statistics.
    pub fn stats(&self) -> MetaHostStats {
        *self.stats.lock()
    }

    /// Milliseconds on the host's clock (since start).
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One non-blocking step at the host's clock (see
    /// [`MsgMetaHost::progress_at`]).
    ///
    /// # Errors
    /// As [`MsgMetaHost::progress_at`].
    pub fn progress(&self) -> Result<usize, EngineError> {
        self.progress_at(self.now_ms())
    }

    /// One non-blocking step at `now_ms`: answers every request queued on
    /// the port, then sweeps expired leases (table entries and store
    /// members) when due. Returns the messages handled.
    ///
    /// StoreJoin and StoreLeave apply to [`MsgMetaHost::stores`] with the
    /// GID messaging received them from (`msg.from.gid`) as the member's:
    /// a node can join or remove only memberships of its own GID.
    ///
    /// # Errors
    /// Provider failures of the receive path (bad input is counted, never
    /// an error).
    pub fn progress_at(&self, now_ms: u64) -> Result<usize, EngineError> {
        let mut handled = 0;
        loop {
            let msg = match self.port.try_pop() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(MsgError::Engine(e)) => return Err(e),
                Err(_) => {
                    self.stats.lock().dropped += 1;
                    continue;
                }
            };
            handled += 1;
            let bytes = msg.to_vec();
            let reply = self.table.lock().handle_with_stores(
                &mut self.stores.lock(),
                msg.from.gid,
                &bytes,
                now_ms,
                &self.bootstrap,
            );
            let Some(reply) = reply else {
                self.stats.lock().dropped += 1;
                continue;
            };
            {
                let mut s = self.stats.lock();
                s.requests += 1;
                if let MetaMessage::Ok(_) = reply.message {
                    match bytes.get(5).copied().and_then(MessageType::from_u8) {
                        Some(MessageType::StoreJoin) => s.store_joins += 1,
                        Some(MessageType::StoreLeave) => s.store_leaves += 1,
                        _ => {}
                    }
                }
                if let MetaMessage::Err(
                    ErrorCode::Malformed
                    | ErrorCode::UnsupportedVersion
                    | ErrorCode::UnexpectedMessage,
                ) = reply.message
                {
                    s.malformed += 1;
                }
            }
            let mut buf = [0u8; META_MAX];
            let sent = reply
                .emit(&mut buf)
                .ok()
                .map(|len| self.port.reply_within(msg.from, &buf[..len], REPLY_WAIT));
            if !matches!(sent, Some(Ok(()))) {
                self.stats.lock().reply_failures += 1;
            }
        }
        if now_ms >= self.next_sweep_ms.load(Ordering::Relaxed) {
            let gone = self.table.lock().sweep(now_ms);
            let members_gone = self.stores.lock().sweep(now_ms);
            for gid in &gone {
                tracing::info!(gid = %gid, now_ms, "meta registration swept: its lease ran out");
            }
            for (store, id, gid) in &members_gone {
                tracing::info!(store = %store, id, gid = %gid, now_ms, "store member swept: its lease ran out");
            }
            let mut s = self.stats.lock();
            s.sweeps += 1;
            s.swept += gone.len() as u64;
            s.store_swept += members_gone.len() as u64;
            self.next_sweep_ms.store(
                now_ms.saturating_add(self.sweep_every_ms),
                Ordering::Relaxed,
            );
        }
        Ok(handled)
    }

    /// Runs [`MsgMetaHost::progress`] on a thread (`krcore-meta`) until
    /// the returned handle is dropped (it stops and joins the thread).
    ///
    /// # Errors
    /// [`EngineError::Config`] when the thread cannot be created.
    pub fn spawn(self: &Arc<Self>, idle_sleep: Duration) -> Result<MetaHostThread, EngineError>
    where
        N: 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, host) = (stop.clone(), Arc::downgrade(self));
        let handle = std::thread::Builder::new()
            .name("krcore-meta".into())
            .spawn(move || {
                let mut wait = super::idle::IdleWait::new(idle_sleep);
                while !flag.load(Ordering::Acquire) {
                    let Some(h) = host.upgrade() else { return };
                    let n = h.progress().unwrap_or(0);
                    drop(h);
                    wait.after(n);
                }
            })
            .map_err(|e| EngineError::Config(format!("spawn the meta host thread: {e}")))?;
        Ok(MetaHostThread {
            _worker: Worker {
                stop,
                handle: Some(handle),
            },
        })
    }
}

/// The thread of [`MsgMetaHost::spawn`]: stopped and joined when dropped.
pub struct MetaHostThread {
    _worker: Worker,
}

impl std::fmt::Debug for MetaHostThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaHostThread").finish()
    }
}

// The client side: an engine's registration calls.
impl<N: Nic> Engine<N> {
    /// Registers `target` (usually [`Engine::local_target`], or the
    /// upgrade entry of [`Engine::handshake_entry`]) with the meta server
    /// this engine reads ([`super::EngineConfig::meta`]), for `lease_ms`:
    /// a message to its [`META_PORT`] (the server is a [`MsgMetaHost`]).
    ///
    /// Each attempt waits `meta_timeout` for the answer; a timed-out
    /// request is sent again ([`META_RPC_RETRIES`] times) with the same
    /// request id. Messaging delivers a request once, but a request a slow
    /// server answers late may have been applied: a repeated Register gets
    /// a newer epoch, a repeated Deregister `NotRegistered`.
    ///
    /// # Errors
    /// [`EngineError::NoMetaServer`]; [`EngineError::MetaRefused`] with
    /// the server's code; [`EngineError::MetaUnavailable`] with
    /// [`MetaFailure::NoAnswer`] when no answer came; engine errors of
    /// messaging (in RC fallback mode also those of the handshake that
    /// builds the pair to the meta node).
    pub fn meta_register(
        &self,
        target: DcTarget,
        lid: u16,
        lease_ms: u64,
    ) -> Result<Lease, EngineError> {
        let lease = self.meta_call(
            target.gid,
            MetaMessage::Register(RegisterRepr {
                target,
                lid,
                lease_ms,
            }),
        )?;
        if lease.replaced_dct != 0 {
            tracing::warn!(
                gid = %target.gid,
                dct = target.dct_num,
                replaced_dct = lease.replaced_dct,
                "replaced another live registration at this GID: a process that restarted here, or \
                 another engine on this port (two engines on one port collide: the other's renewals \
                 are refused from now on; processes share a port through krcored, or each takes a \
                 GID of its own)"
            );
        }
        Ok(lease)
    }

    /// Renews the lease of `target`'s registration (see
    /// [`Engine::meta_register`]).
    ///
    /// # Errors
    /// As [`Engine::meta_register`]; [`EngineError::MetaRefused`] with
    /// [`ErrorCode::Replaced`] when another engine registered at the GID
    /// since (its registration names another DCT).
    pub fn meta_renew(&self, target: &DcTarget) -> Result<Lease, EngineError> {
        self.meta_call(
            target.gid,
            MetaMessage::Renew {
                gid: target.gid,
                dct_num: target.dct_num,
            },
        )
    }

    /// Removes `target`'s registration (see [`Engine::meta_register`]).
    ///
    /// # Errors
    /// As [`Engine::meta_renew`] (a registration of another engine at the
    /// GID stays: [`ErrorCode::Replaced`]).
    pub fn meta_deregister(&self, target: &DcTarget) -> Result<Lease, EngineError> {
        self.meta_call(
            target.gid,
            MetaMessage::Deregister {
                gid: target.gid,
                dct_num: target.dct_num,
            },
        )
    }

    /// One request to the meta server's [`META_PORT`] (errors name `gid`).
    /// A request that fails other than by the server's refusal may have
    /// gone to a server that restarted elsewhere: the engine follows it
    /// (see `meta_follow`) and, when it moved, sends the request once more,
    /// to the new server.
    pub(super) fn meta_call(&self, gid: Gid, message: MetaMessage) -> Result<Lease, EngineError> {
        let before = self.meta_location();
        match self.meta_call_once(gid, message.clone()) {
            Err(e) if may_have_moved(&e) => {
                // Moved by this refresh, or by one made meanwhile (a lookup
                // inside the call, another thread's call).
                let _ = self.refresh_meta();
                if self.meta_location() == before {
                    return Err(e);
                }
                self.meta_call_once(gid, message)
            }
            r => r,
        }
    }

    /// [`Engine::meta_call`] to the server the engine reads now.
    fn meta_call_once(&self, gid: Gid, message: MetaMessage) -> Result<Lease, EngineError> {
        let eng = &self.inner;
        let meta = eng.meta.get().ok_or(EngineError::NoMetaServer { gid })?;
        let location = meta.location();
        let server = location.server.gid;
        // The location names the server's DCT: its requests go there (the
        // server need not be in its own table). Cached with the lowest
        // epoch, as a learned sender (a meta entry replaces it).
        if eng.cache.get(&server).is_none() {
            let _ = eng.cache.insert(location.server, 0);
        }
        let mut client = eng.meta_ep.lock();
        if meta.take_stale_endpoint() {
            // The server moved: the endpoint's channels were the old one's.
            client.take();
        }
        if eng.released.load(Ordering::Acquire) {
            client.take();
            return Err(EngineError::Unsupported {
                reason: "the engine's last handle was dropped",
            });
        }
        if client.is_none() {
            *client = Some(self.control_endpoint().map_err(|e| msg_error(gid, e))?);
        }
        let Some(ep) = client.as_ref() else {
            return Err(EngineError::NoMetaServer { gid });
        };
        let r = meta_exchange(eng, ep, server, gid, message);
        // Done: the host's port gets its slot back (see "Capacity").
        let _ = ep.close_channel(server, META_PORT);
        if eng.released.load(Ordering::Acquire) {
            client.take();
        }
        r
    }
}

/// One request to `server`'s [`META_PORT`] and its answer (see
/// [`Engine::meta_register`]).
fn meta_exchange<N: Nic>(
    eng: &EngineInner<N>,
    ep: &super::messaging::Endpoint<N>,
    server: Gid,
    gid: Gid,
    message: MetaMessage,
) -> Result<Lease, EngineError> {
    {
        let request_id = eng.meta_next_id.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; META_MAX];
        let len = Repr {
            request_id,
            message,
        }
        .emit(&mut buf)
        .map_err(|e| EngineError::Config(format!("a meta request: {e}")))?;
        while let Ok(Some(_)) = ep.try_pop_reply() {}
        let timeout = eng.cfg.meta_timeout;
        let start = Instant::now();
        let mut unsent = 0;
        for attempt in 0..=META_RPC_RETRIES {
            match ControlPush::of(ep.push_timeout(server, META_PORT, &buf[..len], timeout)) {
                ControlPush::Sent => {}
                ControlPush::Retry => {
                    unsent += 1;
                    continue;
                }
                ControlPush::Busy(_) if attempt < META_RPC_RETRIES => {
                    std::thread::sleep(busy_pause(attempt, timeout));
                    continue;
                }
                ControlPush::Busy(e) | ControlPush::Fail(e) => return Err(msg_error(gid, e)),
            }
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                let Ok(Some(m)) = ep.try_pop_reply() else {
                    std::thread::yield_now();
                    continue;
                };
                let reply = m.to_vec();
                match Repr::parse_bytes(&reply) {
                    Ok(r) if r.request_id == request_id && m.from.gid == server => {
                        return match r.message {
                            MetaMessage::Ok(lease) => Ok(lease),
                            MetaMessage::Err(code) => Err(EngineError::MetaRefused { gid, code }),
                            _ => Err(EngineError::MetaRefused {
                                gid,
                                code: ErrorCode::UnexpectedMessage,
                            }),
                        };
                    }
                    // A late answer to an earlier call, or not an answer.
                    _ => {}
                }
            }
        }
        Err(EngineError::MetaUnavailable {
            gid,
            failure: MetaFailure::NoAnswer {
                attempts: META_RPC_RETRIES + 1,
                unsent,
                waited: start.elapsed(),
            },
        })
    }
}

/// The bytes of a meta table of `geometry`, as a length to allocate.
///
/// # Errors
/// [`EngineError::Config`] for a table larger than memory.
pub(crate) fn table_len(geometry: &krcore_meta::table::Geometry) -> Result<usize, EngineError> {
    usize::try_from(geometry.table_len()).map_err(|_| {
        EngineError::Config(format!(
            "a meta table of {} bytes does not fit in memory",
            geometry.table_len()
        ))
    })
}

fn msg_error(gid: Gid, e: MsgError) -> EngineError {
    e.into_engine(gid, super::messaging::Service::MetaRegistration)
}

impl<N: Nic> Engine<N> {
    /// Reads the meta table at `location` from now on, unless the engine
    /// already reads one (set at start by `cfg.meta`, or adopted before).
    /// A [`MsgMetaHost`] makes its engine read its own table this way.
    fn adopt_meta(&self, location: MetaLocation) -> Result<(), EngineError> {
        let eng = &self.inner;
        if eng.meta.get().is_some() {
            return Ok(());
        }
        let client = MetaClient::start(
            &*eng.nic,
            &eng.pd,
            location,
            MetaPolicy {
                retries: eng.cfg.meta_retries,
                backoff: eng.cfg.meta_backoff,
                timeout: eng.cfg.meta_timeout,
            },
            eng.handshake_ud().cloned(),
        )?;
        // A concurrent adopter may have won: either location is this host's.
        let _ = eng.meta.set(client);
        Ok(())
    }
}

/// Whether a failed request may have gone to a meta server that moved:
/// anything but the server's own answer, or the engine's state.
fn may_have_moved(e: &EngineError) -> bool {
    !matches!(
        e,
        EngineError::MetaRefused { .. }
            | EngineError::NoMetaServer { .. }
            | EngineError::Unsupported { .. }
    )
}
