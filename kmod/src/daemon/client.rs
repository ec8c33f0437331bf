//! The attached process's side: a connection to the daemon, regions
//! mapped from the daemon's shared files, VQPs whose doorbells are ring
//! writes (no system call while the daemon is busy).

use super::error::DaemonError;
use super::host::wake;
use super::ring::PostCode;
use super::ring::{
    decode_cqe, encode_sqe, read_verdict, ring_doorbell, sleep_unless, sqe_slots, this_cpu, word,
    CQ_CAP, CQ_HEAD, CQ_TAIL, PAGE_BYTES, PAGE_DATA_CPU, PAGE_SLEEPING, RING_BYTES, SQ_CAP, SQ_CPU,
    SQ_HEAD, SQ_TAIL,
};
use super::sock::{self, RecvError};
use super::wire::PROTOCOL_VERSION;
use super::wire::{NodeStats, RefuseCode, Reply, Request, WireGrant, MAX_REPLY_FRAME};
use crate::precheck::RemoteGrant;
use krcore_nic::shared::SharedMap;
use krcore_nic::{Access, Gid, RemoteAddr, SendWr, Sge, Wc};
use parking_lot::Mutex;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a doorbell waits for the daemon to take it.
pub const DOORBELL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a waiting doorbell looks whether the daemon is still there.
const LIVENESS_EVERY: Duration = Duration::from_millis(1);
/// How long a wait for the daemon spins (yielding) before its thread
/// sleeps on the ring's futex: a doorbell or a completion is usually a
/// few microseconds away, but on a node with more waiting threads than
/// cores, spinning takes the CPU the daemon's data thread needs.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The pacing of one wait for the daemon: spin (the clock read only every
/// 256 spins), then yield, then sleep on the ring's futex in slices of
/// [`LIVENESS_EVERY`], probing whether the daemon is alive between them.
/// A wait on the CPU of the daemon's data thread does not spin: the data
/// thread runs only once this one yields (spinning there cost each
/// doorbell this spin and the data thread's idle one: 31 us per
/// synchronous READ, against about 1 us on two CPUs, 2026-12-07).
struct Waiter {
    spins: u32,
    colocated: bool,
    start: Option<Instant>,
    probed: Option<Instant>,
}

impl Waiter {
    /// A wait for the data thread whose CPU `page` says.
    fn new(page: &SharedMap) -> Waiter {
        let data_cpu = word(page, PAGE_DATA_CPU).load(Ordering::Relaxed);
        Waiter {
            spins: 0,
            colocated: data_cpu != 0 && data_cpu == this_cpu(),
            start: None,
            probed: None,
        }
    }

    /// One empty look: `false` while the caller should just look again.
    fn spin(&mut self) -> bool {
        if self.colocated {
            return true;
        }
        self.spins = self.spins.wrapping_add(1);
        if self.spins % 256 != 0 {
            std::hint::spin_loop();
            return false;
        }
        true
    }

    fn elapsed(&mut self) -> Duration {
        self.start.get_or_insert_with(Instant::now).elapsed()
    }

    /// Whether a liveness probe is due (one per [`LIVENESS_EVERY`]).
    fn probe_due(&mut self) -> bool {
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let last = *self.probed.get_or_insert(start);
        if now.duration_since(last) >= LIVENESS_EVERY {
            self.probed = Some(now);
            return true;
        }
        false
    }

    /// Between looks: yield while the wait is young, then sleep until the
    /// daemon notifies the ring (or a slice passes) unless `done()`.
    fn rest(&mut self, ring: &SharedMap, done: impl Fn() -> bool) {
        if self.elapsed() < SPIN_BEFORE_SLEEP {
            std::thread::yield_now();
        } else {
            sleep_unless(ring, done, LIVENESS_EVERY);
        }
    }
}
/// One wait for completions of an attached VQP, across its empty polls
/// ([`AttachedVqp::idle`]): a new one (`CqWait::default()`) per wait.
#[derive(Default)]
pub struct CqWait(Option<Waiter>);

impl std::fmt::Debug for CqWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqWait").finish_non_exhaustive()
    }
}

/// How long a control call (attach, allocate, create a VQP, connect, ...)
/// waits for the daemon's answer. A connect may read the meta server
/// (bounded by the daemon's own meta timeout, 1 s by default, with
/// retries), so this is generous.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(15);

pub(super) struct Conn {
    sock: Mutex<UnixStream>,
    /// A second handle on the socket for liveness polls (no lock).
    probe: UnixStream,
    wake: OwnedFd,
    page: SharedMap,
    gid: Gid,
    rc_fallback: bool,
    path: PathBuf,
    gone: AtomicBool,
    /// How long a control call waits for its answer.
    pub(super) timeout: Duration,
}

impl Conn {
    pub(super) fn call(&self, req: &Request) -> Result<(Reply, Vec<OwnedFd>), DaemonError> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(DaemonError::Gone {
                what: "an earlier call",
            });
        }
        let sock = self.sock.lock();
        let sent = sock::send(&sock, &req.encode(), &[]);
        let got = sent
            .map_err(|_| RecvError::Closed)
            .and_then(|()| sock::recv(&sock, MAX_REPLY_FRAME));
        match got {
            Ok((body, fds)) => match Reply::decode(&body)? {
                Reply::Refused { code, message } => Err(DaemonError::Refused { code, message }),
                r => Ok((r, fds)),
            },
            Err(RecvError::Wire(e)) => Err(e.into()),
            Err(e) => {
                self.gone.store(true, Ordering::Relaxed);
                Err(
                    unanswered(&e, req.name(), self.timeout).unwrap_or(DaemonError::Gone {
                        what: "the control socket closed",
                    }),
                )
            }
        }
    }

    /// Whether the daemon closed the socket (checked without blocking).
    fn closed(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.gone.load(Ordering::Relaxed) {
            return true;
        }
        let mut fds = [PollFd::new(&self.probe, PollFlags::RDHUP)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let hup = poll(&mut fds, Some(&zero)).is_ok()
            && fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR);
        if hup {
            self.gone.store(true, Ordering::Relaxed);
        }
        hup
    }
}

/// A read that ran into the socket's timeout (`after`) as
/// [`DaemonError::Unanswered`]; `None` for any other failure.
fn unanswered(e: &RecvError, what: &'static str, after: Duration) -> Option<DaemonError> {
    match e {
        RecvError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Some(DaemonError::Unanswered { what, after })
        }
        _ => None,
    }
}

fn one_file(fds: Vec<OwnedFd>, what: &'static str) -> Result<File, DaemonError> {
    fds.into_iter()
        .next()
        .map(File::from)
        .ok_or(DaemonError::MissingFd { what })
}

/// A process's attachment to its node's daemon (see the module docs of
/// [`super`]). Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Attached {
    pub(super) conn: Arc<Conn>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("socket", &self.conn.path)
            .field("gid", &self.conn.gid)
            .finish()
    }
}

impl Attached {
    /// Attaches to the daemon listening at `path`.
    ///
    /// # Errors
    /// [`DaemonError::NoDaemon`] when nothing listens there;
    /// [`DaemonError::Version`] for a daemon of another protocol;
    /// [`DaemonError::Refused`] (quota) when it serves too many processes;
    /// [`DaemonError::Unanswered`] when it does not answer within
    /// [`CONTROL_TIMEOUT`].
    pub fn attach(path: impl AsRef<Path>) -> Result<Attached, DaemonError> {
        Attached::attach_timeout(path, CONTROL_TIMEOUT)
    }

    /// [`Attached::attach`] whose control calls (this one and every later
    /// one) wait at most `timeout` for the daemon's answer; past it the
    /// call fails with [`DaemonError::Unanswered`] and the attachment is
    /// given up (every later call fails [`DaemonError::Gone`]).
    ///
    /// # Errors
    /// As [`Attached::attach`].
    pub fn attach_timeout(
        path: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<Attached, DaemonError> {
        let path = path.as_ref();
        let sock = UnixStream::connect(path).map_err(|source| DaemonError::NoDaemon {
            path: path.to_path_buf(),
            source,
        })?;
        let gone = |_| DaemonError::Gone {
            what: "the socket failed during attach",
        };
        // Every answer is waited for a bounded time: a stuck daemon is a
        // typed error, not a hang.
        sock.set_read_timeout(Some(timeout)).map_err(gone)?;
        let probe = sock.try_clone().map_err(gone)?;
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        };
        sock::send(&sock, &hello.encode(), &[]).map_err(gone)?;
        let (body, fds) = match sock::recv(&sock, MAX_REPLY_FRAME) {
            Ok(x) => x,
            Err(RecvError::Wire(e)) => return Err(e.into()),
            Err(e) => {
                return Err(
                    unanswered(&e, "attach", timeout).unwrap_or(DaemonError::Gone {
                        what: "the daemon closed the socket during attach",
                    }),
                )
            }
        };
        let (gid, mode) = match Reply::decode(&body)? {
            Reply::Welcome { gid, mode, .. } => (gid, mode),
            Reply::Refused {
                code: RefuseCode::Version,
                message,
            } => return Err(DaemonError::Version { message }),
            Reply::Refused { code, message } => return Err(DaemonError::Refused { code, message }),
            _ => {
                return Err(DaemonError::Refused {
                    code: RefuseCode::BadRequest,
                    message: "the daemon answered Hello with something else".into(),
                })
            }
        };
        let mut fds = fds.into_iter();
        let wake = fds.next().ok_or(DaemonError::MissingFd {
            what: "the wake-up eventfd",
        })?;
        let page_file = fds.next().map(File::from).ok_or(DaemonError::MissingFd {
            what: "the client page",
        })?;
        let page = SharedMap::map(&page_file, PAGE_BYTES).map_err(DaemonError::Map)?;
        Ok(Attached {
            conn: Arc::new(Conn {
                sock: Mutex::new(sock),
                probe,
                wake,
                page,
                gid,
                rc_fallback: mode != 0,
                path: path.to_path_buf(),
                gone: AtomicBool::new(false),
                timeout,
            }),
        })
    }

    /// The node's GID (the daemon's NIC port).
    pub fn gid(&self) -> Gid {
        self.conn.gid
    }

    /// Whether the daemon's engine runs in RC fallback mode (no DC).
    pub fn rc_fallback(&self) -> bool {
        self.conn.rc_fallback
    }

    /// The node's counters, node-wide (every attached process together):
    /// QPs its NIC created, the modeled control time, the engine's
    /// DCCache hits and misses.
    ///
    /// # Errors
    /// [`DaemonError::Gone`] and the other control-call failures.
    pub fn node_stats(&self) -> Result<NodeStats, DaemonError> {
        match self.conn.call(&Request::Stats)?.0 {
            Reply::Stats(n) => Ok(n),
            _ => Err(unexpected("Stats")),
        }
    }

    /// `len` zeroed bytes registered by the daemon and mapped here: what
    /// the NIC moves lands in this process's mapping, no copy.
    ///
    /// # Errors
    /// [`DaemonError::Refused`]: quota, or the NIC's refusal.
    pub fn alloc(&self, len: usize, access: Access) -> Result<AttachedMr, DaemonError> {
        let (reply, fds) = self.conn.call(&Request::AllocMr {
            len: len as u64,
            access: access.0,
        })?;
        let Reply::Mr {
            mr,
            addr,
            len: got,
            lkey,
            rkey,
        } = reply
        else {
            return Err(unexpected("AllocMr"));
        };
        let file = one_file(fds, "the region's file")?;
        let map = SharedMap::map(&file, got as usize).map_err(DaemonError::Map)?;
        Ok(AttachedMr {
            handle: mr,
            addr,
            lkey,
            rkey,
            access,
            map,
            conn: self.conn.clone(),
            expiries: Mutex::new(Vec::new()),
        })
    }

    /// A VQP of the daemon's engine, with its ring mapped here.
    ///
    /// # Errors
    /// [`DaemonError::Refused`]: quota, or the engine's refusal.
    pub fn create_vqp(&self) -> Result<AttachedVqp, DaemonError> {
        self.vqp_of(self.conn.call(&Request::CreateVqp)?, "CreateVqp")
    }

    /// A VQP connected to `gid` with the grant over `rkey` known to its
    /// pre-check: [`Attached::create_vqp`], [`AttachedVqp::connect`] and
    /// [`AttachedVqp::add_grant`] in one control call (what a client that
    /// joins and reaches its memory nodes at once wants: one round trip
    /// per node instead of three). Nothing is left in the daemon when it
    /// fails.
    ///
    /// # Errors
    /// As the three calls.
    pub fn open_vqp(
        &self,
        gid: Gid,
        rkey: u32,
        grant: RemoteGrant,
    ) -> Result<AttachedVqp, DaemonError> {
        let req = Request::OpenVqp(wire_grant(gid, rkey, &grant));
        self.vqp_of(self.conn.call(&req)?, "OpenVqp")
    }

    fn vqp_of(
        &self,
        (reply, fds): (Reply, Vec<OwnedFd>),
        what: &str,
    ) -> Result<AttachedVqp, DaemonError> {
        let Reply::Vqp { vqp, id } = reply else {
            return Err(unexpected(what));
        };
        let file = one_file(fds, "the VQP's ring")?;
        let ring = SharedMap::map(&file, RING_BYTES).map_err(DaemonError::Map)?;
        Ok(AttachedVqp {
            handle: vqp,
            id,
            ring,
            conn: self.conn.clone(),
            tail: Mutex::new(0),
            head: Mutex::new(0),
        })
    }
}

/// A grant as the wire carries it (its expiry as milliseconds left,
/// `u64::MAX` for never).
fn wire_grant(gid: Gid, rkey: u32, grant: &RemoteGrant) -> WireGrant {
    WireGrant {
        gid,
        rkey,
        addr: grant.addr,
        len: grant.len,
        access: grant.access.0,
        ttl_ms: grant.expires_at.map_or(u64::MAX, |t| {
            t.saturating_duration_since(Instant::now()).as_millis() as u64
        }),
    }
}

fn path_of(t: u8) -> crate::engine::VqpPath {
    match t {
        0 => crate::engine::VqpPath::Dc,
        _ => crate::engine::VqpPath::Rc,
    }
}

pub(super) fn unexpected(what: &str) -> DaemonError {
    DaemonError::Refused {
        code: RefuseCode::BadRequest,
        message: format!("the daemon answered {what} with another reply"),
    }
}

/// Memory the daemon registered for this process (see [`Attached::alloc`]).
/// Released when dropped.
pub struct AttachedMr {
    handle: u32,
    addr: u64,
    lkey: u32,
    rkey: u32,
    access: Access,
    map: SharedMap,
    conn: Arc<Conn>,
    /// The expiries of the leases this handle made and did not revoke
    /// (pruned as they pass): what `live_until` reports.
    expiries: Mutex<Vec<(u64, Instant)>>,
}

impl std::fmt::Debug for AttachedMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedMr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .finish()
    }
}

impl AttachedMr {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The local key SGEs carry.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key peers use.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The region's first byte as the NIC knows it.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The access the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DaemonError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(DaemonError::OutOfRange {
                offset,
                len,
                size: self.len(),
            }),
        }
    }

    /// An SGE over `offset..offset+len`.
    ///
    /// # Errors
    /// [`DaemonError::OutOfRange`].
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge, DaemonError> {
        self.check(offset, len as usize)?;
        Ok(Sge {
            addr: self.addr + offset as u64,
            length: len,
            lkey: self.lkey,
        })
    }

    /// The remote address of `offset` (for a peer).
    pub fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + offset as u64,
            rkey: self.rkey,
        }
    }

    /// A grant over the whole region with its remote access.
    pub fn grant(&self) -> RemoteGrant {
        RemoteGrant {
            addr: self.addr,
            len: self.len() as u64,
            access: Access(self.access.0 & !Access::LOCAL_WRITE.0),
            expires_at: None,
        }
    }

    /// Copies bytes out.
    ///
    /// # Errors
    /// [`DaemonError::OutOfRange`].
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), DaemonError> {
        self.check(offset, buf.len())?;
        self.map.read(offset, buf).map_err(DaemonError::Map)
    }

    /// Copies bytes in.
    ///
    /// # Errors
    /// [`DaemonError::OutOfRange`].
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), DaemonError> {
        self.check(offset, data.len())?;
        self.map.write(offset, data).map_err(DaemonError::Map)
    }

    /// The 8 bytes at `offset` (8-aligned), atomically.
    ///
    /// # Errors
    /// [`DaemonError::OutOfRange`] or a misaligned offset ([`DaemonError::Map`]).
    pub fn load_u64(&self, offset: usize) -> Result<u64, DaemonError> {
        self.check(offset, 8)?;
        Ok(self
            .map
            .word(offset)
            .map_err(DaemonError::Map)?
            .load(Ordering::Acquire))
    }

    /// Stores 8 bytes at `offset` (8-aligned), atomically.
    ///
    /// # Errors
    /// As [`AttachedMr::load_u64`].
    pub fn store_u64(&self, offset: usize, v: u64) -> Result<(), DaemonError> {
        self.check(offset, 8)?;
        self.map
            .word(offset)
            .map_err(DaemonError::Map)?
            .store(v, Ordering::Release);
        Ok(())
    }

    /// Faults `offset..offset + len` in ahead of use, without changing it
    /// (the shared file's pages: the daemon's mapping finds them in too).
    ///
    /// # Errors
    /// [`DaemonError::OutOfRange`].
    pub fn prefault(&self, offset: usize, len: usize) -> Result<(), DaemonError> {
        self.check(offset, len)?;
        self.map.prefault(offset, len).map_err(DaemonError::Map)
    }
}

/// A lease the daemon made on an attached region ([`AttachedMr::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachedLease {
    /// For [`AttachedMr::revoke`].
    pub id: u64,
    /// The lease's own remote key.
    pub rkey: u32,
    /// The leased range's first byte as the NIC knows it.
    pub addr: u64,
}

impl AttachedMr {
    /// A lease on `len` bytes at `offset` with `access`, for `ttl`: a
    /// remote key of its own that the daemon's NIC honours for that range
    /// and access until it is revoked or expires (its engine deregisters
    /// the key then). The range and access are the caller's to check
    /// first (the SDK does).
    ///
    /// # Errors
    /// [`DaemonError::Refused`]: a quota
    /// ([`DaemonConfig::max_leases`](super::DaemonConfig)), the engine's or
    /// the NIC's refusal; the daemon gone.
    pub fn lease(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        ttl: Duration,
    ) -> Result<AttachedLease, DaemonError> {
        let req = Request::Lease {
            mr: self.handle,
            offset,
            len,
            access: access.0,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        };
        match self.conn.call(&req)? {
            (Reply::Leased { id, rkey, addr }, _) => {
                let now = Instant::now();
                let mut ex = self.expiries.lock();
                ex.retain(|&(_, at)| at > now);
                ex.push((id, now.checked_add(ttl).unwrap_or(now)));
                Ok(AttachedLease { id, rkey, addr })
            }
            _ => Err(unexpected("a Lease")),
        }
    }

    /// Leases live now (as the daemon counts them) and, when any, the
    /// latest expiry among those this process made and did not revoke.
    ///
    /// # Errors
    /// The daemon gone or refusing.
    pub fn live_until(&self) -> Result<Option<(usize, Instant)>, DaemonError> {
        let live = self.live_leases()?;
        let now = Instant::now();
        let last = self
            .expiries
            .lock()
            .iter()
            .map(|&(_, at)| at)
            .filter(|&at| at > now)
            .max()
            .unwrap_or(now);
        Ok((live > 0).then_some((live, last)))
    }

    /// Revokes one lease; whether it was live. Its key is dead at the NIC
    /// when this returns.
    ///
    /// # Errors
    /// The daemon gone or refusing.
    pub fn revoke(&self, id: u64) -> Result<bool, DaemonError> {
        match self.conn.call(&Request::Revoke {
            mr: self.handle,
            id,
        })? {
            (Reply::Flag(b), _) => Ok(b),
            _ => Err(unexpected("a Revoke")),
        }
    }

    /// Revokes every lease of the region; how many were live.
    ///
    /// # Errors
    /// The daemon gone or refusing.
    pub fn revoke_all(&self) -> Result<usize, DaemonError> {
        match self.conn.call(&Request::RevokeLeases { mr: self.handle })? {
            (Reply::Count(n), _) => {
                self.expiries.lock().clear();
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            }
            _ => Err(unexpected("a RevokeLeases")),
        }
    }

    /// Leases of the region live now.
    ///
    /// # Errors
    /// The daemon gone or refusing.
    pub fn live_leases(&self) -> Result<usize, DaemonError> {
        match self.conn.call(&Request::LiveLeases { mr: self.handle })? {
            (Reply::Count(n), _) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => Err(unexpected("a LiveLeases")),
        }
    }
}

impl Drop for AttachedMr {
    fn drop(&mut self) {
        let _ = self.conn.call(&Request::FreeMr { mr: self.handle });
    }
}

/// A VQP of the daemon's engine (see [`Attached::create_vqp`]): `post` is
/// one doorbell through the ring, `poll` reads the completion ring.
/// Released when dropped (WRs in flight are discarded, as in-process).
pub struct AttachedVqp {
    handle: u32,
    id: u32,
    ring: SharedMap,
    conn: Arc<Conn>,
    /// Submission tail (entries published).
    tail: Mutex<u64>,
    /// Completion head (entries taken).
    head: Mutex<u64>,
}

impl std::fmt::Debug for AttachedVqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedVqp").field("id", &self.id).finish()
    }
}

impl AttachedVqp {
    /// The VQP's id in the daemon's engine (its completions' `qp_num`).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Connects to `gid` (a metadata lookup in the daemon, usually a hit
    /// in its node-wide DCCache).
    ///
    /// # Errors
    /// [`DaemonError::Refused`] with the engine's reason.
    pub fn connect(&self, gid: Gid) -> Result<(), DaemonError> {
        self.conn
            .call(&Request::Connect {
                vqp: self.handle,
                gid,
            })
            .map(drop)
    }

    /// Makes a grant over `rkey` on `gid` known to the VQP's pre-check.
    ///
    /// # Errors
    /// [`DaemonError::Refused`]: the key is another attached process's.
    pub fn add_grant(&self, gid: Gid, rkey: u32, grant: RemoteGrant) -> Result<(), DaemonError> {
        self.conn
            .call(&Request::Grant {
                vqp: self.handle,
                grant: wire_grant(gid, rkey, &grant),
            })
            .map(drop)
    }

    /// The upgrade hint: the daemon's engine moves this VQP to an RC pair
    /// with its target now (one handshake at most, on this process's
    /// control thread in the daemon; the pair is node-wide, so it serves
    /// every process's VQPs to that target). The transport after the call.
    ///
    /// # Errors
    /// [`DaemonError::Refused`]: `Unsupported` (RC fallback mode), the
    /// engine's failure (not connected, the target refused); the daemon
    /// gone.
    pub fn upgrade(&self) -> Result<crate::engine::VqpPath, DaemonError> {
        match self.conn.call(&Request::Upgrade { vqp: self.handle })? {
            (Reply::Path(t), _) => Ok(path_of(t)),
            _ => Err(unexpected("an Upgrade")),
        }
    }

    /// How the VQP reaches its target now (DC, or an RC pair the daemon's
    /// engine upgraded it to, or RC fallback mode).
    ///
    /// # Errors
    /// The daemon gone or refusing.
    pub fn path(&self) -> Result<crate::engine::VqpPath, DaemonError> {
        match self.conn.call(&Request::Path { vqp: self.handle })? {
            (Reply::Path(t), _) => Ok(path_of(t)),
            _ => Err(unexpected("a Path")),
        }
    }

    /// Posts `wrs` as one doorbell: returns when the daemon has posted
    /// them (or refused them all, typed), as an in-process post does.
    ///
    /// # Errors
    /// [`DaemonError::BatchSize`], [`DaemonError::Encode`] (nothing
    /// published); [`DaemonError::Post`] (the daemon's refusal: foreign
    /// memory, the pre-check, not connected); [`DaemonError::Gone`],
    /// [`DaemonError::Timeout`].
    pub fn post(&self, wrs: &[SendWr]) -> Result<(), DaemonError> {
        if wrs.is_empty() || wrs.len() > SQ_CAP {
            return Err(DaemonError::BatchSize {
                len: wrs.len(),
                max: SQ_CAP,
            });
        }
        // Entries with a continuation take two slots: count them before
        // anything is written. Nothing is published before the tail moves,
        // so an entry that fails to encode leaves the ring as it was.
        let slots: usize = wrs.iter().map(sqe_slots).sum();
        if slots > SQ_CAP {
            return Err(DaemonError::BatchSize {
                len: wrs.len(),
                max: SQ_CAP,
            });
        }
        let mut tail = self.tail.lock();
        let mut at = *tail;
        for (i, wr) in wrs.iter().enumerate() {
            at = at.wrapping_add(encode_sqe(&self.ring, at, i, wr)?);
        }
        let seq = at;
        // Published by the tail's store below.
        word(&self.ring, SQ_CPU).store(this_cpu(), Ordering::Relaxed);
        word(&self.ring, SQ_TAIL).store(seq, Ordering::SeqCst);
        ring_doorbell(&self.conn.page, self.handle);
        if word(&self.conn.page, PAGE_SLEEPING).load(Ordering::SeqCst) != 0 {
            wake(&self.conn.wake);
        }
        let res = self.wait_taken(seq);
        // Whatever happened, these entries are spent: the next doorbell
        // starts past them.
        *tail = seq;
        res?;
        let v = read_verdict(&self.ring);
        match PostCode::from_u64(v.code) {
            PostCode::Posted => Ok(()),
            code => Err(DaemonError::Post {
                code,
                index: v.index as usize,
                message: v.message,
            }),
        }
    }

    fn wait_taken(&self, seq: u64) -> Result<(), DaemonError> {
        let head = word(&self.ring, SQ_HEAD);
        let mut w = Waiter::new(&self.conn.page);
        while head.load(Ordering::Acquire) != seq {
            if !w.spin() {
                continue;
            }
            if w.probe_due() {
                if self.conn.closed() {
                    return Err(DaemonError::Gone {
                        what: "the control socket closed while a doorbell waited",
                    });
                }
                if w.elapsed() >= DOORBELL_TIMEOUT {
                    return Err(DaemonError::Timeout(DOORBELL_TIMEOUT));
                }
                // The daemon may have gone to sleep before it saw us.
                wake(&self.conn.wake);
            }
            w.rest(&self.ring, || head.load(Ordering::Acquire) == seq);
        }
        Ok(())
    }

    /// Takes up to `out.len()` completions, oldest first.
    ///
    /// # Errors
    /// [`DaemonError::RingCorrupt`]; [`DaemonError::Gone`] when nothing is
    /// there and the daemon has gone.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize, DaemonError> {
        let mut head = self.head.lock();
        let tail = word(&self.ring, CQ_TAIL).load(Ordering::Acquire);
        let avail = tail.wrapping_sub(*head);
        if avail > CQ_CAP as u64 {
            return Err(DaemonError::RingCorrupt { tail, head: *head });
        }
        let k = (avail as usize).min(out.len());
        for (i, wc) in out[..k].iter_mut().enumerate() {
            *wc = decode_cqe(&self.ring, head.wrapping_add(i as u64), self.id);
        }
        *head = head.wrapping_add(k as u64);
        word(&self.ring, CQ_HEAD).store(*head, Ordering::Release);
        if k == 0 && self.conn.gone.load(Ordering::Relaxed) {
            return Err(DaemonError::Gone {
                what: "the daemon went with WRs in flight",
            });
        }
        Ok(k)
    }

    /// Between polls of this VQP that found nothing (one wait, `cq`
    /// carried across its polls): a short spin, then yields while the
    /// wait is young (50 us), then sleeps until the daemon writes a
    /// completion into the ring (or 1 ms passes). A process thread that
    /// spun instead would keep the CPU from the data thread that serves
    /// it, with many threads on few cores. The caller bounds the wait.
    ///
    /// # Errors
    /// [`DaemonError::Gone`] when the control socket closed.
    pub fn idle(&self, cq: &mut CqWait) -> Result<(), DaemonError> {
        self.idle_within(cq, None)
    }

    /// [`AttachedVqp::idle`], failing with [`DaemonError::Timeout`] once
    /// the wait is older than `timeout` (looked at when the spin ends).
    fn idle_within(&self, cq: &mut CqWait, timeout: Option<Duration>) -> Result<(), DaemonError> {
        let w = cq.0.get_or_insert_with(|| Waiter::new(&self.conn.page));
        if !w.spin() {
            return Ok(());
        }
        if let Some(t) = timeout.filter(|t| w.elapsed() >= *t) {
            return Err(DaemonError::Timeout(t));
        }
        if w.probe_due() && self.conn.closed() {
            return Err(DaemonError::Gone {
                what: "the daemon went with WRs in flight",
            });
        }
        let taken = *self.head.lock();
        let tail = word(&self.ring, CQ_TAIL);
        w.rest(&self.ring, || tail.load(Ordering::Acquire) != taken);
        Ok(())
    }

    /// Polls until `n` completions came or `timeout` passed (checking the
    /// daemon is alive meanwhile).
    ///
    /// # Errors
    /// As [`AttachedVqp::poll`]; [`DaemonError::Timeout`].
    pub fn wait(&self, n: usize, timeout: Duration) -> Result<Vec<Wc>, DaemonError> {
        let mut got = Vec::with_capacity(n);
        let mut buf = [Wc::default(); 16];
        let mut cq = CqWait::default();
        while got.len() < n {
            let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                self.idle_within(&mut cq, Some(timeout))?;
            }
        }
        Ok(got)
    }

    /// The ring's file-backed mapping, for tests that play a misbehaving
    /// process (writing garbage into its own ring).
    #[doc(hidden)]
    pub fn ring_for_tests(&self) -> &SharedMap {
        &self.ring
    }

    /// Marks this VQP's doorbell on the process's page, as a post does
    /// after it moves the tail: for tests that move the tail themselves.
    #[doc(hidden)]
    pub fn mark_doorbell_for_tests(&self) {
        ring_doorbell(&self.conn.page, self.handle);
    }
}

impl Drop for AttachedVqp {
    fn drop(&mut self) {
        let _ = self.conn.call(&Request::DestroyVqp { vqp: self.handle });
    }
}

// The probe handle and the wake fd are only read through shared
// references; the socket handle is behind its mutex.
const _: fn() = || {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Attached>();
    is_send_sync::<AttachedMr>();
    is_send_sync::<AttachedVqp>();
};
