//! The daemon's side: one engine, a unix socket for control, a data thread
//! that drains every attached process's VQP rings.
//!
//! Threads: one accepts connections; one per attached process answers its
//! control requests (blocking on its socket: a slow or silent process
//! holds only its own thread); [`DaemonConfig::data_threads`] data threads
//! (one by default), each serving the rings of the processes placed on it
//! (at attach, on the thread with the fewest) in turn, busy while any of
//! them has work or WRs in flight, then, after
//! [`DaemonConfig::idle_spin`] without work, raising the idle flag in its
//! processes' pages, looking once more, and sleeping on its eventfd (a
//! process that publishes entries while the flag is up writes it).
//!
//! Trust boundary: a process names local memory by the lkey and address
//! the daemon gave it; the data thread checks every SGE against that
//! process's own regions before the engine sees it (another process's
//! lkey, or a range past the region, fails the doorbell, typed). Remote
//! keys pass the engine's pre-check with the VQP's grants; a grant that
//! names a region of another process on this node is refused, and the
//! pre-check cannot be switched off through the daemon. A ring's words
//! are the process's to break: indices that run past the ring, entries
//! that do not decode, a completion queue never drained, fail or stall
//! that VQP only.

use super::host_data::data_loop;
use super::host_state::*;
use super::ring::{PAGE_BYTES, RING_BYTES, SQ_CAP};
use super::sock::{self, RecvError};
use super::wire::PROTOCOL_VERSION;
use super::wire::{NodeStats, RefuseCode, Reply, Request, WireGrant, MAX_FRAME};
use crate::engine::{Engine, EngineMode};
use crate::precheck::{RemoteGrant, Ungranted};
use krcore_nic::shared::SharedMap;
use krcore_nic::{Access, MemoryRegion, Nic, Wc};
use parking_lot::{Mutex, RwLock};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most data threads a daemon runs ([`DaemonConfig::data_threads`] is
/// clamped to it).
pub const MAX_DATA_THREADS: usize = 64;

/// The node daemon: an engine serving attached processes (see the module
/// docs). Dropping it stops it ([`Daemon::shutdown`]).
pub struct Daemon<N: Nic> {
    shared: Arc<Shared<N>>,
    /// The listening socket (shut down to stop the accept thread).
    listener: UnixListener,
    path: PathBuf,
    threads: Vec<JoinHandle<()>>,
}

impl<N: Nic> std::fmt::Debug for Daemon<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("socket", &self.path)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The socket path is taken by a live daemon.
    #[error("{path}: a daemon already listens there")]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// The socket or the eventfd could not be made.
    #[error("{op} {path}")]
    Io {
        /// What failed.
        op: &'static str,
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl<N: Nic> Daemon<N> {
    /// Serves `engine` on a unix socket at `path` (a stale socket file of a
    /// dead daemon is replaced; a live one is refused).
    ///
    /// # Errors
    /// [`StartError`].
    pub fn start(
        engine: Engine<N>,
        path: &Path,
        cfg: DaemonConfig,
    ) -> Result<Daemon<N>, StartError> {
        let io = |op| {
            move |source| StartError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(StartError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(io("remove the stale socket"))?;
        }
        let listener = UnixListener::bind(path).map_err(io("bind the socket"))?;
        let threads_n = cfg.data_threads.clamp(1, MAX_DATA_THREADS);
        let mut wakes = Vec::with_capacity(threads_n);
        for _ in 0..threads_n {
            let wake = rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .map_err(|e| io("make the wake-up eventfd for")(e.into()))?;
            wakes.push(wake);
        }
        let shared = Arc::new(Shared {
            engine,
            cfg,
            wakes,
            stop: AtomicBool::new(false),
            clients: RwLock::new(Vec::new()),
            version: AtomicU64::new(0),
            n: Counters::default(),
            store_calls: Mutex::new(()),
        });
        let mut threads = Vec::new();
        for t in 0..threads_n {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("krcored-data-{t}"))
                    .spawn(move || data_loop(&s, t))
                    .map_err(io("spawn a data thread for"))?,
            );
        }
        let accept = listener.try_clone().map_err(io("clone the socket"))?;
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("krcored-accept".into())
                .spawn(move || accept_loop(&s, accept))
                .map_err(io("spawn the accept thread for"))?,
        );
        tracing::info!(socket = %path.display(), gid = %shared.engine.gid(), "node daemon serving");
        Ok(Daemon {
            shared,
            listener,
            path: path.to_path_buf(),
            threads,
        })
    }

    /// The engine the daemon hosts.
    pub fn engine(&self) -> &Engine<N> {
        &self.shared.engine
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many attached processes each data thread serves, by thread.
    pub fn clients_per_thread(&self) -> Vec<usize> {
        let clients = self.shared.clients.read();
        (0..self.shared.wakes.len())
            .map(|t| clients.iter().filter(|c| c.thread == t).count())
            .collect()
    }

    /// What the daemon has done so far.
    pub fn stats(&self) -> DaemonStats {
        let s = &self.shared;
        let clients = s.clients.read();
        let n = &s.n;
        DaemonStats {
            clients: clients.len(),
            vqps: clients.iter().map(|c| c.vqps.read().len()).sum(),
            mr_bytes: clients
                .iter()
                .map(|c| c.mr_bytes.load(Ordering::Relaxed))
                .sum(),
            attached: n.attached.load(Ordering::Relaxed),
            detached: n.detached.load(Ordering::Relaxed),
            doorbells: n.doorbells.load(Ordering::Relaxed),
            wrs: n.wrs.load(Ordering::Relaxed),
            refused_doorbells: n.refused_doorbells.load(Ordering::Relaxed),
            completions: n.completions.load(Ordering::Relaxed),
            sleeps: n.sleeps.load(Ordering::Relaxed),
            refused_requests: n.refused_requests.load(Ordering::Relaxed),
        }
    }

    /// Stops serving: attached processes see their socket close (their
    /// next operation fails, typed), their resources are released, the
    /// socket file is removed.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Unblock the accept thread (shutting a listening socket down
        // makes a blocked accept fail) and the data thread.
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Both);
        for w in &self.shared.wakes {
            wake(w);
        }
        for c in self.shared.clients.read().iter() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl<N: Nic> Drop for Daemon<N> {
    fn drop(&mut self) {
        self.stop_now();
    }
}

pub(crate) fn wake(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn accept_loop<N: Nic>(s: &Arc<Shared<N>>, listener: UnixListener) {
    for stream in listener.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let s2 = s.clone();
        let spawned = std::thread::Builder::new()
            .name("krcored-client".into())
            .spawn(move || serve_client(&s2, stream));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot serve an attaching process: no thread");
        }
    }
}

fn send_reply(stream: &UnixStream, reply: &Reply, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    sock::send(stream, &reply.encode(), fds).is_ok()
}

/// One attached process: Hello, then requests until its socket closes;
/// then everything it held is released.
fn serve_client<N: Nic>(s: &Arc<Shared<N>>, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let pid = match sock::recv(&stream, MAX_FRAME).map(|(b, _)| Request::decode(&b)) {
        Ok(Ok(Request::Hello { version, pid })) if version == PROTOCOL_VERSION => pid,
        Ok(Ok(Request::Hello { version, .. })) => {
            send_reply(
                &stream,
                &refuse(
                    RefuseCode::Version,
                    format!("daemon speaks protocol {PROTOCOL_VERSION}, the process {version}"),
                ),
                &[],
            );
            return;
        }
        _ => {
            send_reply(
                &stream,
                &refuse(RefuseCode::BadRequest, "the first message must be Hello"),
                &[],
            );
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    if s.clients.read().len() >= s.cfg.max_clients {
        s.n.refused_requests.fetch_add(1, Ordering::Relaxed);
        send_reply(
            &stream,
            &refuse(
                RefuseCode::Quota,
                format!("{} processes attached already", s.cfg.max_clients),
            ),
            &[],
        );
        return;
    }
    let (page, page_file) = match SharedMap::create("krcored-page", PAGE_BYTES) {
        Ok(p) => p,
        Err(e) => {
            send_reply(
                &stream,
                &refuse(RefuseCode::Engine, format!("client page: {e}")),
                &[],
            );
            return;
        }
    };
    let Ok(sock2) = stream.try_clone() else {
        return;
    };
    // Placed on the data thread with the fewest processes, and listed
    // under the same lock (concurrent attaches spread evenly).
    let mut clients = s.clients.write();
    let thread = (0..s.wakes.len())
        .min_by_key(|&t| clients.iter().filter(|c| c.thread == t).count())
        .unwrap_or(0);
    let Some(wake_fd) = s.wakes.get(thread) else {
        return;
    };
    let client = Arc::new(Client {
        core: Arc::new(ClientCore {
            page,
            spans: RwLock::new(Vec::new()),
        }),
        pid,
        thread,
        stream: sock2,
        vqps: RwLock::new(Vec::new()),
        mrs: Mutex::new(Vec::new()),
        retired: Mutex::new(Vec::new()),
        mr_bytes: AtomicU64::new(0),
        next_handle: AtomicU32::new(1),
        endpoints: Mutex::new(Vec::new()),
        ports: Mutex::new(Vec::new()),
        stores: Mutex::new(Vec::new()),
    });
    let welcome = Reply::Welcome {
        version: PROTOCOL_VERSION,
        gid: s.engine.gid(),
        mode: u8::from(s.engine.mode() != EngineMode::Dc),
        max_vqps: s.cfg.max_vqps,
        max_mr_bytes: s.cfg.max_mr_bytes,
    };
    clients.push(client.clone());
    drop(clients);
    s.version.fetch_add(1, Ordering::Release);
    if !send_reply(&stream, &welcome, &[wake_fd.as_fd(), page_file.as_fd()]) {
        s.clients.write().retain(|c| !Arc::ptr_eq(c, &client));
        s.version.fetch_add(1, Ordering::Release);
        return;
    }
    s.n.attached.fetch_add(1, Ordering::Relaxed);
    tracing::info!(pid, "process attached");
    loop {
        let req = match sock::recv(&stream, MAX_FRAME) {
            Ok((body, _)) => Request::decode(&body),
            Err(RecvError::Wire(e)) => Err(e),
            Err(_) => break,
        };
        let (reply, file) = match req {
            Ok(r) => handle(s, &client, r),
            Err(e) => (refuse(RefuseCode::BadRequest, e.to_string()), None),
        };
        if matches!(reply, Reply::Refused { .. }) {
            s.n.refused_requests.fetch_add(1, Ordering::Relaxed);
        }
        let fds: Vec<_> = file.iter().map(|f| f.as_fd()).collect();
        if !send_reply(&stream, &reply, &fds) {
            break;
        }
    }
    // Gone: the stores it joined (left at once: a dead memory node's
    // membership does not wait for its lease), its ports (unbound: the
    // next process may bind them), its endpoints and VQPs (in-flight WRs
    // discarded), then its memory.
    super::host_store::leave_all(s, &client);
    s.clients.write().retain(|c| !Arc::ptr_eq(c, &client));
    s.version.fetch_add(1, Ordering::Release);
    client.ports.lock().clear();
    client.endpoints.lock().clear();
    // Its leases end with it: nobody is left to revoke them.
    for (_, m) in client.mrs.lock().iter() {
        m.mr.revoke_all();
    }
    for m in client.retired.lock().drain(..) {
        m.mr.revoke_all();
    }
    client.vqps.write().clear();
    client.core.spans.write().clear();
    client.mrs.lock().clear();
    s.n.detached.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        pid = client.pid,
        "process detached, its VQPs and memory released"
    );
}

fn handle<N: Nic>(
    s: &Arc<Shared<N>>,
    c: &Arc<Client<N>>,
    req: Request,
) -> (Reply, Option<std::fs::File>) {
    let vqp_of = |h: u32| c.vqps.read().iter().find(|v| v.handle == h).cloned();
    let unknown = |what: &str, h: u32| {
        refuse(
            RefuseCode::UnknownHandle,
            format!("no {what} {h} of this process"),
        )
    };
    match req {
        msg @ (Request::CreateEndpoint { .. }
        | Request::DestroyEndpoint { .. }
        | Request::Push { .. }
        | Request::PopReply { .. }
        | Request::CloseChannel { .. }
        | Request::OpenAhead { .. }
        | Request::PushAhead { .. }
        | Request::Credits { .. }
        | Request::BindPort { .. }
        | Request::UnbindPort { .. }
        | Request::PopPort { .. }
        | Request::ReplyPort { .. }
        | Request::ReturnCredits { .. }
        | Request::Queued { .. }) => (super::host_msg::handle(s, c, &msg), None),
        lease @ (Request::Lease { .. }
        | Request::Revoke { .. }
        | Request::RevokeLeases { .. }
        | Request::LiveLeases { .. }) => (super::host_lease::handle(s, c, &lease), None),
        st @ (Request::StoreJoin { .. } | Request::StoreLeave { .. }) => {
            (super::host_store::handle(s, c, &st), None)
        }
        Request::Hello { .. } => (refuse(RefuseCode::BadRequest, "Hello twice"), None),
        Request::AllocMr { len, access } => {
            prune_retired(c);
            let used = c.mr_bytes.load(Ordering::Relaxed);
            if c.mrs.lock().len() >= s.cfg.max_mrs as usize
                || used.saturating_add(len) > s.cfg.max_mr_bytes
            {
                return (
                    refuse(
                        RefuseCode::Quota,
                        format!(
                            "{len} more bytes: the process holds {used} of {} bytes in at most {} regions",
                            s.cfg.max_mr_bytes, s.cfg.max_mrs
                        ),
                    ),
                    None,
                );
            }
            let Ok(ulen) = usize::try_from(len) else {
                return (refuse(RefuseCode::BadRequest, "length"), None);
            };
            let e = &s.engine;
            match e.nic().alloc_shared_mr(e.pd(), ulen, Access(access & Access::ALL.0)) {
                Ok((mr, file)) => {
                    let handle = c.next_handle.fetch_add(1, Ordering::Relaxed);
                    let span = Span {
                        lkey: mr.lkey(),
                        rkey: mr.rkey(),
                        addr: mr.addr(),
                        len,
                    };
                    let owned = e.register_mr(mr);
                    c.mrs.lock().push((handle, MrEntry {
                            mr: owned,
                            lkey: span.lkey,
                            len,
                        }));
                    c.core.spans.write().push(span);
                    c.mr_bytes.fetch_add(len, Ordering::Relaxed);
                    (
                        Reply::Mr {
                            mr: handle,
                            addr: span.addr,
                            len,
                            lkey: span.lkey,
                            rkey: span.rkey,
                        },
                        Some(file),
                    )
                }
                Err(e) => (refuse(RefuseCode::Engine, format!("register {len} bytes: {e}")), None),
            }
        }
        Request::FreeMr { mr } => {
            let mut mrs = c.mrs.lock();
            let Some(at) = mrs.iter().position(|(h, _)| *h == mr) else {
                return (unknown("region", mr), None);
            };
            let (_, entry) = mrs.remove(at);
            drop(mrs);
            // Its span first: no doorbell names the keys once they die.
            c.core.spans.write().retain(|sp| sp.lkey != entry.lkey);
            if entry.mr.live_leases(Instant::now()) > 0 {
                // Leased: it stays registered for the leases' holders
                // until they end (as an in-process MR dropped while
                // leased), counted in the process's quotas meanwhile.
                c.retired.lock().push(entry);
            } else {
                c.mr_bytes.fetch_sub(entry.len, Ordering::Relaxed);
            }
            prune_retired(c);
            (Reply::Done, None)
        }
        Request::CreateVqp => match create_vqp(s, c) {
            Ok((slot, file)) => (
                Reply::Vqp {
                    vqp: slot.handle,
                    id: slot.vqp.id().get(),
                },
                Some(file),
            ),
            Err(refused) => (refused, None),
        },
        Request::OpenVqp(g) => {
            let (slot, file) = match create_vqp(s, c) {
                Ok(x) => x,
                Err(refused) => return (refused, None),
            };
            let opened = match slot.vqp.connect(g.gid) {
                Ok(()) => grant(s, c, &slot, &g),
                Err(e) => connect_refusal(&e),
            };
            if matches!(opened, Reply::Refused { .. }) {
                // Nothing is left behind: the VQP goes with the refusal.
                c.vqps.write().retain(|x| !Arc::ptr_eq(x, &slot));
                s.version.fetch_add(1, Ordering::Release);
                return (opened, None);
            }
            (
                Reply::Vqp {
                    vqp: slot.handle,
                    id: slot.vqp.id().get(),
                },
                Some(file),
            )
        }
        Request::DestroyVqp { vqp } => {
            let mut v = c.vqps.write();
            let before = v.len();
            v.retain(|x| x.handle != vqp);
            if v.len() == before {
                return (unknown("VQP", vqp), None);
            }
            drop(v);
            s.version.fetch_add(1, Ordering::Release);
            (Reply::Done, None)
        }
        Request::Connect { vqp, gid } => match vqp_of(vqp) {
            None => (unknown("VQP", vqp), None),
            Some(v) => match v.vqp.connect(gid) {
                Ok(()) => (Reply::Done, None),
                Err(e) => (connect_refusal(&e), None),
            },
        },
        Request::Grant { vqp, grant: g } => match vqp_of(vqp) {
            None => (unknown("VQP", vqp), None),
            Some(v) => (grant(s, c, &v, &g), None),
        },
        Request::Stats => (Reply::Stats(node_stats(s)), None),
        Request::SetUngranted { vqp, allow } => match vqp_of(vqp) {
            None => (unknown("VQP", vqp), None),
            Some(_) if allow != 0 => (
                refuse(
                    RefuseCode::Unsupported,
                    "through the node daemon every remote key needs a grant (the pre-check guards the other processes' memory)",
                ),
                None,
            ),
            Some(v) => {
                v.vqp.set_ungranted(Ungranted::Refuse);
                (Reply::Done, None)
            }
        },
        Request::Upgrade { vqp } => match vqp_of(vqp) {
            None => (unknown("VQP", vqp), None),
            Some(v) => match v.vqp.upgrade() {
                Ok(t) => (Reply::Path(path_code(t)), None),
                Err(e @ crate::engine::EngineError::Unsupported { .. }) => {
                    (refuse(RefuseCode::Unsupported, e.to_string()), None)
                }
                Err(e) => (refuse(RefuseCode::Engine, error_line(&e)), None),
            },
        },
        Request::Path { vqp } => match vqp_of(vqp) {
            None => (unknown("VQP", vqp), None),
            Some(v) => (Reply::Path(path_code(v.vqp.path())), None),
        },
    }
}

fn path_code(t: crate::engine::VqpPath) -> u8 {
    u8::from(t != crate::engine::VqpPath::Dc)
}

/// A VQP of the engine and its ring for process `c` (refused past its
/// quota).
fn create_vqp<N: Nic>(
    s: &Shared<N>,
    c: &Arc<Client<N>>,
) -> Result<(Arc<VqpSlot<N>>, std::fs::File), Reply> {
    if c.vqps.read().len() >= s.cfg.max_vqps as usize {
        return Err(refuse(
            RefuseCode::Quota,
            format!("the process holds {} VQPs already", s.cfg.max_vqps),
        ));
    }
    let vqp = s
        .engine
        .create_vqp()
        .map_err(|e| refuse(RefuseCode::Engine, format!("create a VQP: {e}")))?;
    let (map, file) = SharedMap::create("krcored-vqp", RING_BYTES)
        .map_err(|e| refuse(RefuseCode::Engine, format!("VQP ring: {e}")))?;
    let slot = Arc::new(VqpSlot {
        handle: c.next_handle.fetch_add(1, Ordering::Relaxed),
        vqp,
        ring: map,
        core: c.core.clone(),
        // Looked at every round until first served: a doorbell marked
        // before this thread's list had the VQP is taken with no ring to
        // look at.
        quiet: AtomicU64::new(QUIET_NEVER),
        serve: Mutex::new(Serve {
            head: 0,
            cq_tail: 0,
            broken: false,
            active: false,
            wrs: Vec::with_capacity(SQ_CAP),
            wcs: vec![Wc::default(); 32],
        }),
    });
    c.vqps.write().push(slot.clone());
    s.version.fetch_add(1, Ordering::Release);
    Ok((slot, file))
}

/// Makes a grant known to a VQP of process `c`. On this node only the
/// process's own regions: not another attached process's memory (regions
/// or leases), nor the daemon engine's own buffers (messaging staging,
/// the meta table), whose keys a process could learn or guess.
fn grant<N: Nic>(s: &Shared<N>, c: &Client<N>, v: &VqpSlot<N>, g: &WireGrant) -> Reply {
    let WireGrant {
        gid,
        rkey,
        addr,
        len,
        access,
        ttl_ms,
    } = *g;
    if gid == s.engine.gid() && !own_rkey(c, rkey) {
        return refuse(
            RefuseCode::BadRequest,
            format!(
                "rkey {rkey:#x} on this node is not this process's memory \
                 (only its own regions can be granted here)"
            ),
        );
    }
    let expires_at = (ttl_ms != u64::MAX)
        .then(|| Instant::now().checked_add(Duration::from_millis(ttl_ms)))
        .flatten();
    v.vqp.add_grant(
        gid,
        rkey,
        RemoteGrant {
            addr,
            len,
            access: Access(access & Access::ALL.0),
            expires_at,
        },
    );
    Reply::Done
}

/// The node's counters, for [`Request::Stats`].
fn node_stats<N: Nic>(s: &Shared<N>) -> NodeStats {
    let c = s.engine.nic().counters();
    let e = s.engine.stats();
    NodeStats {
        qps_created: c.qps_created,
        modeled_control_ns: c.modeled_control_ns,
        network_ops: c.network_ops(),
        dcis: e.dcis as u64,
        vqps_created: e.vqps_created,
        connect_hits: e.connect_hits,
        connect_misses: e.connect_misses,
        meta_reads: e.meta.reads,
        rc_upgrades: e.rc_upgrades,
        rc_downgrades: e.rc_downgrades,
        rc_upgrade_failures: e.rc_upgrade_failures,
        rc_pairs: e.rc.pairs as u32,
        clients: s.clients.read().len() as u32,
    }
}

/// A connect's refusal: [`RefuseCode::UnknownNode`] for a GID the meta
/// server does not know (the process may wait for its registration, as
/// in process), the engine's reason otherwise.
fn connect_refusal(e: &crate::engine::EngineError) -> Reply {
    let code = match e {
        crate::engine::EngineError::UnknownNode { .. } => RefuseCode::UnknownNode,
        _ => RefuseCode::Engine,
    };
    refuse(code, error_line(e))
}

/// Whether `rkey` is the key of one of the process's own regions.
fn own_rkey<N: Nic>(me: &Client<N>, rkey: u32) -> bool {
    me.core.spans.read().iter().any(|sp| sp.rkey == rkey)
}
