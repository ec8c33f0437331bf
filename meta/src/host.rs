//! The meta server host: the NIC objects and the loop around the pure
//! [`MetaTable`] engine.
//!
//! ```text
//!             clients (any node)
//!   one-sided READ |            | two-sided UD SEND (Register/Renew/...)
//!                  v            v
//!   DCT + SRQ --> table MR    UD QP --recv CQ--> poll_once(now_ms)
//!   (no CPU)      (MrTable)     ^                   | MetaTable::handle
//!                     ^         |                   v
//!                     +---------|---- SeqlockWrite word stores
//!                               +---- reply: UD SEND to (GRH src GID, src_qp, qkey)
//! ```
//!
//! [`MetaServer::start`] allocates everything; [`MetaServer::poll_once`] is
//! one deterministic engine step (the caller passes the time);
//! [`MetaServer::run`] and [`MetaServer::spawn`] loop it on the server's
//! monotonic clock ([`MetaServer::now_ms`]).
//!
//! # Invariants
//! - The server's CPU touches only two-sided requests; the table is READ by
//!   clients through the DCT with no server involvement.
//! - Every table change is one seqlock write of aligned atomic stores in the
//!   registered table memory (see [`MrTable`]).
//! - Bad input never stops the server: a datagram that is not a meta message
//!   is dropped and counted ([`ServerStats::dropped`]); a malformed meta
//!   message gets an `Err` reply.
//! - Lease times are on the server's clock (ms since [`MetaServer::start`]
//!   under `run`/`spawn`); a sweep runs at most every
//!   [`MetaConfig::lease_sweep_ms`].

use crate::bootstrap;
use crate::engine::MetaTable;
use crate::error::{Ctx, MetaError, MetaResult};
use crate::mr_table::MrTable;
use crate::table::Geometry;
use crate::ud::{Incoming, UdEndpoint};
use crate::wire::{BootstrapRepr, ErrorCode, Message};
use krcore_nic::sim::SimFabric;
use krcore_nic::{
    bring_up, Access, DcTarget, Gid, MemoryRegion, Nic, QpCaps, QpInit, QpType, QueuePair, UdTarget,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default DC key of the server's DCT (ASCII "krmeta").
pub const DEFAULT_DC_KEY: u64 = 0x6174_656d_726b;
/// Default qkey of the server's UD QP (ASCII "KRMT").
pub const DEFAULT_QKEY: u32 = u32::from_le_bytes(*b"KRMT");

/// How to start a [`MetaServer`].
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// Table shape. Default: 1024 buckets of 8 entries (512 KiB).
    pub geometry: Geometry,
    /// DC key of the DCT clients READ the table through.
    pub dc_key: u64,
    /// qkey of the UD QP; clients learn it from the bootstrap.
    pub qkey: u32,
    /// UD receive buffers kept posted: requests arriving while all are in
    /// use are dropped by the NIC (clients retry).
    pub recv_slots: u32,
    /// UD send slots (replies in flight).
    pub send_slots: u32,
    /// Least time between two lease sweeps, in ms (0: every step).
    pub lease_sweep_ms: u64,
    /// Epoch of the first registration. `None`: the wall-clock second at
    /// start, so a restarted server's epochs exceed its predecessor's as
    /// long as it handed out fewer epochs than it ran seconds (and restarts
    /// are a second apart); clients must in any case drop their cache when
    /// the bootstrap's incarnation changes.
    pub first_epoch: Option<u32>,
    /// Incarnation reported in the bootstrap. `None`: derived from the
    /// wall clock and the process id.
    pub incarnation: Option<u64>,
    /// Sleep of [`MetaServer::run`] after an idle spell of polls.
    pub idle_sleep: Duration,
}

impl Default for MetaConfig {
    fn default() -> MetaConfig {
        MetaConfig {
            geometry: Geometry::with_buckets(1024).unwrap_or_else(|_| unreachable!()),
            dc_key: DEFAULT_DC_KEY,
            qkey: DEFAULT_QKEY,
            recv_slots: 256,
            send_slots: 64,
            lease_sweep_ms: 100,
            first_epoch: None,
            incarnation: None,
            idle_sleep: Duration::from_micros(200),
        }
    }
}

/// What a server did (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Meta messages handled (each got a reply, possibly `Err`).
    pub requests: u64,
    /// Requests answered with `Err(Malformed | UnsupportedVersion |
    /// UnexpectedMessage)` (included in `requests`).
    pub malformed: u64,
    /// Datagrams that were not meta messages, or shorter than a GRH:
    /// dropped without a reply.
    pub dropped: u64,
    /// Replies posted.
    pub replies: u64,
    /// Replies not sent for lack of a free send slot (the client retries).
    pub reply_drops: u64,
    /// Receive or send completions with an error status.
    pub nic_errors: u64,
    /// Times the UD QP was found in ERR and brought back up.
    pub recoveries: u64,
    /// Lease sweeps run.
    pub sweeps: u64,
    /// Registrations removed by sweeps.
    pub swept: u64,
}

/// An embeddable meta server over any [`Nic`] with DC.
///
/// Owns the table MR (`REMOTE_READ | LOCAL_WRITE`), a DCT with its SRQ
/// (clients READ the table through it; the SRQ gets no receives: requests go
/// to the UD QP), and a UD endpoint for requests.
pub struct MetaServer<N: Nic> {
    nic: N,
    table: MetaTable<MrTable<N::Mr>>,
    ud: UdEndpoint<N>,
    bootstrap: BootstrapRepr,
    cfg: MetaConfig,
    next_sweep_ms: u64,
    stats: ServerStats,
    started: Instant,
    incoming: Vec<Incoming>,
    published: Vec<(SimFabric, String, Vec<u8>)>,
    // Kept alive for clients' READs; never used after start.
    _dct: N::Qp,
    _srq: N::Srq,
    _dct_cq: N::Cq,
    _pd: N::Pd,
}

impl<N: Nic> std::fmt::Debug for MetaServer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaServer")
            .field("gid", &self.nic.gid())
            .field("bootstrap", &self.bootstrap)
            .field("table", &self.table)
            .field("stats", &self.stats)
            .finish()
    }
}

fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl<N: Nic> MetaServer<N> {
    /// Starts a server on `nic`: allocates the table MR, the DCT + SRQ and
    /// the UD QP, and zeroes the table.
    ///
    /// # Errors
    /// [`MetaError::DcUnsupported`] on a device without DC (nothing is
    /// allocated); [`MetaError::Config`] for slot counts the device cannot
    /// take or a table larger than memory; [`MetaError::Nic`] when the
    /// provider refuses an object.
    pub fn start(nic: N, cfg: MetaConfig) -> MetaResult<MetaServer<N>> {
        if !nic.caps().dc {
            return Err(MetaError::DcUnsupported);
        }
        let geometry = cfg.geometry;
        let len = usize::try_from(geometry.table_len()).map_err(|_| {
            MetaError::Config(format!(
                "a table of {} bytes does not fit in memory",
                geometry.table_len()
            ))
        })?;
        let pd = nic.alloc_pd().ctx("allocate PD")?;
        let mr = nic
            .alloc_mr(&pd, len, Access::REMOTE_READ | Access::LOCAL_WRITE)
            .ctx("register table memory")?;
        let dct_cq = nic.create_cq(1).ctx("create DCT CQ")?;
        let srq = nic.create_srq(&pd, 1, 1).ctx("create DCT SRQ")?;
        let dct = nic
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Dct,
                    caps: QpCaps {
                        max_send_wr: 1,
                        max_recv_wr: 0,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                    },
                    send_cq: &dct_cq,
                    recv_cq: &dct_cq,
                    srq: Some(&srq),
                    dc_key: cfg.dc_key,
                },
            )
            .ctx("create DCT")?;
        bring_up(&dct, Access::REMOTE_READ, None).ctx("bring up DCT")?;
        let ud = UdEndpoint::new(&nic, &pd, cfg.qkey, cfg.recv_slots, cfg.send_slots)?;
        let first_epoch = cfg
            .first_epoch
            .unwrap_or_else(|| u32::try_from(wall_clock().as_secs()).unwrap_or(u32::MAX / 2));
        let incarnation = cfg.incarnation.unwrap_or_else(|| {
            (wall_clock().as_nanos() as u64) ^ (u64::from(std::process::id()) << 40)
        });
        let table = MetaTable::with_first_epoch(geometry, MrTable::new(mr.clone()), first_epoch)?;
        let gid = nic.gid();
        let bootstrap = BootstrapRepr::new(
            geometry,
            mr.remote(0),
            incarnation,
            DcTarget {
                gid,
                dct_num: dct.qpn(),
                dc_key: cfg.dc_key,
            },
            UdTarget {
                gid,
                qpn: ud.qpn(),
                qkey: cfg.qkey,
            },
        );
        Ok(MetaServer {
            nic,
            table,
            ud,
            bootstrap,
            cfg,
            next_sweep_ms: 0,
            stats: ServerStats::default(),
            started: Instant::now(),
            incoming: Vec::new(),
            published: Vec::new(),
            _dct: dct,
            _srq: srq,
            _dct_cq: dct_cq,
            _pd: pd,
        })
    }

    /// What clients need to reach this server (see [`crate::bootstrap`]).
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.bootstrap
    }

    /// The table's geometry.
    pub fn geometry(&self) -> Geometry {
        self.table.geometry()
    }

    /// The device the server runs on.
    pub fn nic(&self) -> &N {
        &self.nic
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &MetaConfig {
        &self.cfg
    }

    /// The table engine (read only).
    pub fn table(&self) -> &MetaTable<MrTable<N::Mr>> {
        &self.table
    }

    /// The registered region holding the table.
    pub fn table_mr(&self) -> &N::Mr {
        self.table().memory().mr()
    }

    /// Byte offset in the table MR of the entry that holds `gid`, if any
    /// (for tests that tamper with an entry).
    pub fn entry_offset(&self, gid: &Gid) -> Option<usize> {
        let g = self.geometry();
        let bucket = g.bucket_of(gid);
        (0..g.slots_per_bucket()).find_map(|slot| {
            let off = g.entry_offset(bucket, slot) as usize;
            let mut got = [0u8; 16];
            self.table_mr().read(off + 8, &mut got).ok()?;
            (got == *gid.as_bytes()).then_some(off)
        })
    }

    /// The table engine, for registrations made by the host itself (its own
    /// node, an embedded server's nodes in the same process, tests; remote
    /// nodes use [`crate::MetaRpc`]). Every change is a seqlock write into
    /// the MR clients READ, exactly as for a request.
    pub fn table_mut(&mut self) -> &mut MetaTable<MrTable<N::Mr>> {
        &mut self.table
    }

    /// Counters of the server (and of its UD endpoint).
    pub fn stats(&self) -> ServerStats {
        let u = self.ud.counters;
        ServerStats {
            nic_errors: u.recv_errors + u.send_errors,
            recoveries: u.recoveries,
            dropped: self.stats.dropped + u.runts,
            reply_drops: self.stats.reply_drops + u.no_credit,
            ..self.stats
        }
    }

    /// The server's clock: ms since [`MetaServer::start`] (monotonic). The
    /// time [`MetaServer::run`] passes to [`MetaServer::poll_once`].
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One engine step at server time `now_ms`: polls up to one batch of
    /// requests from the UD receive CQ, handles each with the table engine
    /// and replies by UD SEND to its sender (GID from the GRH, QPN from the
    /// completion, the configured qkey), re-posts the receive buffers, and
    /// sweeps expired leases when the sweep interval has passed. Returns the
    /// number of receive completions polled (0: idle).
    ///
    /// Deterministic given the completions and `now_ms`; never blocks.
    ///
    /// # Errors
    /// Provider failures only ([`MetaError::Nic`], [`MetaError::Post`]):
    /// a CQ overflow or a refused post. Bad requests are not errors.
    pub fn poll_once(&mut self, now_ms: u64) -> MetaResult<usize> {
        let mut incoming = std::mem::take(&mut self.incoming);
        incoming.clear();
        let polled = self.ud.poll_recv(&mut incoming);
        for m in &incoming {
            self.serve(m, now_ms)?;
        }
        self.incoming = incoming;
        let polled = polled?;
        if now_ms >= self.next_sweep_ms {
            self.sweep(now_ms);
            self.next_sweep_ms = now_ms.saturating_add(self.cfg.lease_sweep_ms);
        }
        Ok(polled)
    }

    fn serve(&mut self, m: &Incoming, now_ms: u64) -> MetaResult<()> {
        let Some(reply) = self.table.handle(m.payload(), now_ms, &self.bootstrap) else {
            self.stats.dropped += 1;
            return Ok(());
        };
        self.stats.requests += 1;
        if let Message::Err(
            ErrorCode::Malformed | ErrorCode::UnsupportedVersion | ErrorCode::UnexpectedMessage,
        ) = reply.message
        {
            self.stats.malformed += 1;
        }
        let dest = UdTarget {
            gid: m.src,
            qpn: m.src_qp,
            qkey: self.cfg.qkey,
        };
        if self.ud.send(dest, &reply)? {
            self.stats.replies += 1;
        }
        Ok(())
    }

    /// Removes every registration whose lease expired by `now_ms`; returns
    /// how many. [`MetaServer::poll_once`] calls it on its own.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        let gone = self.table.sweep(now_ms).len();
        self.stats.sweeps += 1;
        self.stats.swept += gone as u64;
        gone
    }

    /// Runs [`MetaServer::poll_once`] on the server's clock until `stop` is
    /// set: busy for a few idle polls, then sleeping
    /// [`MetaConfig::idle_sleep`] between idle polls. Returns within about
    /// one sleep of `stop` being set.
    ///
    /// # Errors
    /// The first error of [`MetaServer::poll_once`].
    pub fn run(&mut self, stop: &AtomicBool) -> MetaResult<()> {
        const SPIN_POLLS: u32 = 64;
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            if self.poll_once(self.now_ms())? > 0 {
                idle = 0;
            } else if idle < SPIN_POLLS {
                idle += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(self.cfg.idle_sleep);
            }
        }
        Ok(())
    }

    /// Publishes the bootstrap under the well-known `name` on a sim fabric
    /// (see [`bootstrap::publish_on_sim`]). The name is removed again when
    /// the server is dropped, unless another server replaced it meanwhile.
    ///
    /// # Errors
    /// [`MetaError::Nic`] for a bad name or a failed write.
    pub fn publish_on_sim(&mut self, fabric: &SimFabric, name: &str) -> MetaResult<()> {
        bootstrap::publish_on_sim(fabric, name, &self.bootstrap)?;
        let bytes = bootstrap::encode(&self.bootstrap);
        self.published
            .push((fabric.clone(), name.to_string(), bytes));
        Ok(())
    }

    /// Serves the bootstrap over TCP (see [`bootstrap::serve_bootstrap_tcp`]).
    ///
    /// # Errors
    /// [`MetaError::Io`] when the address cannot be bound.
    pub fn serve_bootstrap_tcp(
        &self,
        addr: impl std::net::ToSocketAddrs,
    ) -> MetaResult<bootstrap::TcpBootstrap> {
        bootstrap::serve_bootstrap_tcp(addr, &self.bootstrap)
    }
}

impl<N: Nic> MetaServer<N> {
    /// Runs the server on its own thread (named `krcore-meta`) until the
    /// handle is stopped or dropped.
    ///
    /// # Errors
    /// [`MetaError::Io`] when the thread cannot be created.
    pub fn spawn(mut self) -> MetaResult<MetaServerHandle<N>> {
        let stop = Arc::new(AtomicBool::new(false));
        let bootstrap = self.bootstrap;
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("krcore-meta".into())
            .spawn(move || {
                let r = self.run(&flag);
                (self, r)
            })
            .map_err(|source| MetaError::Io {
                op: "spawn the meta server thread",
                source,
            })?;
        Ok(MetaServerHandle {
            stop,
            thread: Some(thread),
            bootstrap,
        })
    }
}

impl<N: Nic> Drop for MetaServer<N> {
    fn drop(&mut self) {
        for (fabric, name, bytes) in self.published.drain(..) {
            // Leave a successor's publication alone.
            if fabric.lookup(&name).ok().flatten().as_deref() == Some(&bytes[..]) {
                let _ = fabric.unpublish(&name);
            }
        }
    }
}

type Joined<N> = (MetaServer<N>, MetaResult<()>);

/// A [`MetaServer`] running on its own thread. Dropping the handle stops
/// the server and joins the thread.
pub struct MetaServerHandle<N: Nic> {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Joined<N>>>,
    bootstrap: BootstrapRepr,
}

impl<N: Nic> std::fmt::Debug for MetaServerHandle<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaServerHandle")
            .field("bootstrap", &self.bootstrap)
            .field("running", &self.is_running())
            .finish()
    }
}

impl<N: Nic> MetaServerHandle<N> {
    /// The running server's bootstrap.
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.bootstrap
    }

    /// Whether the server thread is still running (it ends on a provider
    /// error; [`MetaServerHandle::stop`] returns that error).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the server, joins its thread and gives the server back.
    ///
    /// # Errors
    /// The error that ended the loop early, or
    /// [`MetaError::ServerPanicked`].
    pub fn stop(mut self) -> MetaResult<MetaServer<N>> {
        match self.join() {
            Some((server, Ok(()))) => Ok(server),
            Some((_, Err(e))) => Err(e),
            None => Err(MetaError::ServerPanicked),
        }
    }

    fn join(&mut self) -> Option<Joined<N>> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl<N: Nic> Drop for MetaServerHandle<N> {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
