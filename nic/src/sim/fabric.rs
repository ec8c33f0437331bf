//! The sim fabric: a registry of nodes and the shared segments they own.
//!
//! Two kinds, one code path:
//! - `sim:mem`: a private in-process fabric; segments are anonymous mappings
//!   kept in a process-local map.
//! - `sim:/path` (or `sim:NAME` for `/dev/shm/NAME`): a directory shared by
//!   processes; every segment is a file in it, mapped shared.
//!
//! The header segment (`fabric`) holds a magic, the layout version, a random
//! fabric id and [`MAX_NODES`] node slots `{state_gen, pid, start_time}`. A
//! node joins by claiming a free, closed or dead slot with a CAS that bumps the
//! slot generation; its GID embeds `(fabric id, slot, generation)`, so a GID
//! of a dead node never reaches the node that reuses the slot. Liveness of a
//! node in another process is its slot state plus its pid and the pid's start
//! time in `/proc` (a crashed process is a dead node, and a recycled pid is
//! not mistaken for it).
//!
//! **Hosts.** A node opened with a host name (`sim:NAME,host=H`) takes the
//! GID of host `H` instead (`(fabric id, HOST_GID, hash of H)`), as every
//! process of a machine sends from its port's GID. Several live processes
//! may share a host, as they share a port; a process restarted on `H` has
//! its predecessor's GID, and peers that cached that GID reach the new
//! process, where the dead one's QP numbers and memory keys fail (a host
//! node numbers its QPs and keys from a base its slot generation gives, as
//! a NIC hands a new process other numbers). The slot records its host in
//! a fourth word, `generation << 32 | host id`. A WR to a host GID goes to
//! the live node of the host that has the destination QP number; QP numbers
//! are unique among a host's live nodes: a node skips numbers another one
//! has when it creates a QP, picking and publishing it under the host's
//! numbering lock (an `flock` in the fabric's directory), so that two
//! processes creating QPs at once never pick one number, as a NIC's own
//! allocator rules it out.

use super::shm::Segment;
use crate::error::{NicError, Result};
use crate::types::Gid;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;

/// Layout version of fabric directories written by this build.
pub const FABRIC_VERSION: u32 = 1;
/// Node slots per fabric.
pub const MAX_NODES: u32 = 1024;

const MAGIC: u64 = u64::from_le_bytes(*b"KRSIMFAB");
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_ID: usize = 16;
const SLOTS: usize = 64;
const SLOT_BYTES: usize = 32;
/// Offset in a slot of its host word (`generation << 32 | host id`; 0: none).
const SLOT_HOST: usize = 24;
/// The slot field of a host node's GID (no slot has this index).
const HOST_GID: u32 = u32::MAX;
const HEADER_BYTES: usize = SLOTS + MAX_NODES as usize * SLOT_BYTES;

/// Slot states (low 8 bits of the slot's state word; generation above).
pub(crate) const SLOT_FREE: u64 = 0;
pub(crate) const SLOT_CLAIMING: u64 = 1;
pub(crate) const SLOT_ALIVE: u64 = 2;
pub(crate) const SLOT_CLOSED: u64 = 3;

enum Kind {
    Mem,
    Dir(PathBuf),
}

pub(crate) struct FabricInner {
    kind: Kind,
    header: Arc<Segment>,
    id: u64,
    /// sim:mem: the registry of segments. Directory fabric: a cache of
    /// mappings of segment files in front of the files themselves.
    segs: RwLock<HashMap<String, Arc<Segment>>>,
    /// sim:mem: published well-known names.
    names: RwLock<HashMap<String, Vec<u8>>>,
    /// Per node slot: the generation and the time (`now_ns`) of the last
    /// check that its process lives ([`FabricInner::slot_alive_within`]),
    /// shared by every QP of this process.
    pid_checked: Box<[(AtomicU64, AtomicU64)]>,
}

fn pid_checks() -> Box<[(AtomicU64, AtomicU64)]> {
    (0..MAX_NODES)
        .map(|_| (AtomicU64::new(u64::MAX), AtomicU64::new(0)))
        .collect()
}

/// A simulated RDMA fabric that nodes ([`super::SimNic`]) join.
#[derive(Clone)]
pub struct SimFabric {
    pub(crate) inner: Arc<FabricInner>,
}

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner.kind {
            Kind::Mem => "sim:mem".to_string(),
            Kind::Dir(p) => format!("sim:{}", p.display()),
        };
        f.debug_struct("SimFabric")
            .field("kind", &kind)
            .field("id", &format_args!("{:016x}", self.inner.id))
            .finish()
    }
}

fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(super::shm::pid() as u64);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() | 1
}

impl SimFabric {
    /// A private in-process fabric (`sim:mem`).
    pub fn in_memory() -> SimFabric {
        let header = Segment::anon(HEADER_BYTES).expect("anonymous mapping for the fabric header");
        let id = random_id();
        init_header(&header, id);
        SimFabric {
            inner: Arc::new(FabricInner {
                kind: Kind::Mem,
                header: Arc::new(header),
                id,
                segs: RwLock::new(HashMap::new()),
                names: RwLock::new(HashMap::new()),
                pid_checked: pid_checks(),
            }),
        }
    }

    /// Opens a directory fabric shared by processes. With `create`, the
    /// directory is created when missing (its parent must exist) and
    /// initialized when empty.
    ///
    /// # Errors
    /// `FabricMissing` when the directory (or, with `create`, its parent) does
    /// not exist; `FabricVersion` when it was made by another layout version;
    /// `Os` for other OS failures.
    pub fn open_dir(path: impl AsRef<Path>, create: bool) -> Result<SimFabric> {
        let path = path.as_ref().to_path_buf();
        if !path.is_dir() {
            let parent_ok = path
                .parent()
                .map(|p| p.as_os_str().is_empty() || p.is_dir());
            if !create || parent_ok != Some(true) {
                return Err(NicError::FabricMissing(path));
            }
            match std::fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(NicError::Os {
                        op: "create fabric directory",
                        source,
                    })
                }
            }
        }
        let hpath = path.join("fabric");
        let header = match Segment::create_file(&hpath, HEADER_BYTES) {
            Ok(seg) => {
                init_header(&seg, random_id());
                seg
            }
            Err(NicError::Os { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                let seg = Segment::open_file(&hpath)?;
                wait_for_header(&seg, &path)?;
                seg
            }
            Err(e) => return Err(e),
        };
        let id = header.word(H_ID).load(Acquire);
        Ok(SimFabric {
            inner: Arc::new(FabricInner {
                kind: Kind::Dir(path),
                header: Arc::new(header),
                id,
                segs: RwLock::new(HashMap::new()),
                names: RwLock::new(HashMap::new()),
                pid_checked: pid_checks(),
            }),
        })
    }

    /// Opens a fabric from a spec: `sim:mem`, `sim:NAME` (a directory
    /// `/dev/shm/NAME`, created if missing) or `sim:/abs/path`, parsed by
    /// [`crate::FabricSpec`]. Device options (`dc=`, `latency=`) are
    /// accepted and concern nodes, not the fabric: see
    /// [`crate::SimSpec::open_node`].
    ///
    /// # Errors
    /// `BadFabricSpec` for a string [`crate::FabricSpec`] refuses or a
    /// `verbs:` spec, and the errors of [`Self::open_dir`].
    pub fn from_spec(spec: &str) -> Result<SimFabric> {
        match crate::spec::FabricSpec::parse(spec)? {
            crate::spec::FabricSpec::Sim(s) => s.open_fabric(),
            crate::spec::FabricSpec::Verbs(_) => Err(NicError::BadFabricSpec(Box::new(
                crate::spec::SpecError::NotSim { spec: spec.into() },
            ))),
        }
    }

    /// The fabric's random id (the first 8 bytes of every GID on it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The directory of a directory fabric.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir()
    }

    /// GIDs of the nodes that are alive now.
    /// (A host's GID once, however many nodes share it.)
    pub fn live_nodes(&self) -> Vec<Gid> {
        let mut gids: Vec<Gid> = Vec::new();
        for slot in 0..MAX_NODES {
            let w = self.inner.slot_state(slot);
            if w & 0xff == SLOT_ALIVE && self.inner.slot_alive(slot, w >> 8) {
                let g = self.inner.slot_gid(slot, (w >> 8) as u32);
                if !gids.contains(&g) {
                    gids.push(g);
                }
            }
        }
        gids
    }

    /// Publishes `value` under a well-known `name` on this fabric (how a
    /// service such as the meta server lets clients find it: the sim's
    /// equivalent of a bootstrap address). Replaces an earlier value.
    ///
    /// # Errors
    /// `InvalidArgument` for a name outside `[A-Za-z0-9._-]{1,64}` or a value
    /// over 64 KiB; `Os` when the file cannot be written.
    pub fn publish(&self, name: &str, value: &[u8]) -> Result<()> {
        check_name(name)?;
        if value.len() > MAX_NAME_VALUE {
            return Err(NicError::InvalidArgument(format!(
                "published value of {} bytes exceeds {MAX_NAME_VALUE}",
                value.len()
            )));
        }
        match &self.inner.kind {
            Kind::Mem => {
                self.inner
                    .names
                    .write()
                    .insert(name.to_string(), value.to_vec());
                Ok(())
            }
            Kind::Dir(p) => {
                let tmp = p.join(format!(".name-{name}.{}", super::shm::pid()));
                let fin = p.join(format!("name-{name}"));
                std::fs::write(&tmp, value)
                    .and_then(|_| std::fs::rename(&tmp, &fin))
                    .map_err(|source| NicError::Os {
                        op: "publish name",
                        source,
                    })
            }
        }
    }

    /// The value published under `name`, if any.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed name; `Os` for a read failure other
    /// than "not found".
    pub fn lookup(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_name(name)?;
        match &self.inner.kind {
            Kind::Mem => Ok(self.inner.names.read().get(name).cloned()),
            Kind::Dir(p) => match std::fs::read(p.join(format!("name-{name}"))) {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(NicError::Os {
                    op: "look up name",
                    source,
                }),
            },
        }
    }

    /// Removes a published name (no error when absent).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed name.
    pub fn unpublish(&self, name: &str) -> Result<()> {
        check_name(name)?;
        match &self.inner.kind {
            Kind::Mem => {
                self.inner.names.write().remove(name);
            }
            Kind::Dir(p) => {
                let _ = std::fs::remove_file(p.join(format!("name-{name}")));
            }
        }
        Ok(())
    }

    /// Frees the slots and removes the segments of nodes whose process died
    /// without closing them. Returns how many were reaped.
    pub fn reap_dead(&self) -> usize {
        let mut n = 0;
        for slot in 0..MAX_NODES {
            let w = self.inner.slot_state(slot);
            let gen = w >> 8;
            if w & 0xff == SLOT_ALIVE && !self.inner.slot_alive(slot, gen) {
                let sw = self.inner.slot_word(slot);
                if sw
                    .compare_exchange(w, (gen << 8) | SLOT_CLOSED, AcqRel, Relaxed)
                    .is_ok()
                {
                    self.inner.remove_node_segments(slot, gen as u32);
                    n += 1;
                }
            }
        }
        n
    }
}

/// Largest value [`SimFabric::publish`] accepts.
pub const MAX_NAME_VALUE: usize = 64 << 10;

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok && !name.starts_with('.') {
        Ok(())
    } else {
        Err(NicError::InvalidArgument(format!(
            "bad published name {name:?}: use [A-Za-z0-9._-]{{1,64}}, not starting with '.'"
        )))
    }
}

fn init_header(seg: &Segment, id: u64) {
    seg.word(H_VERSION).store(FABRIC_VERSION as u64, Relaxed);
    seg.word(H_ID).store(id, Relaxed);
    seg.word(H_MAGIC).store(MAGIC, Release);
}

fn wait_for_header(seg: &Segment, path: &Path) -> Result<()> {
    if seg.len() < SLOTS {
        return Err(NicError::FabricVersion {
            path: path.to_path_buf(),
            found: 0,
            expected: FABRIC_VERSION,
        });
    }
    // Another process may be initializing it right now: wait a bounded time.
    for _ in 0..1000 {
        if seg.word(H_MAGIC).load(Acquire) == MAGIC {
            let v = seg.word(H_VERSION).load(Acquire) as u32;
            if v != FABRIC_VERSION || seg.len() != HEADER_BYTES {
                return Err(NicError::FabricVersion {
                    path: path.to_path_buf(),
                    found: v,
                    expected: FABRIC_VERSION,
                });
            }
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(NicError::FabricVersion {
        path: path.to_path_buf(),
        found: 0,
        expected: FABRIC_VERSION,
    })
}

/// What a GID names (see [`FabricInner::parse_gid`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GidOf {
    /// The node in `(slot, generation)`.
    Node(u32, u32),
    /// A host (its id): the live node of the host with the QP a WR names.
    Host(u32),
}

/// The id of host `name` in GIDs and slots: 32 bits of FNV-1a (stable
/// across builds and processes), never 0. Two names with one id are one
/// host.
pub(crate) fn host_id(name: &str) -> u32 {
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    });
    h.max(1)
}

/// The start time of `pid` in clock ticks since boot (field 22 of
/// `/proc/PID/stat`), or `None` when the process does not exist or is a zombie.
pub(crate) fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `after` starts at field 3 (state); start time is field 22.
    fields.nth(18)?.parse().ok()
}

impl FabricInner {
    /// The directory of a directory fabric.
    pub(crate) fn dir(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Dir(p) => Some(p),
            Kind::Mem => None,
        }
    }

    fn slot_word(&self, slot: u32) -> &std::sync::atomic::AtomicU64 {
        self.header.word(SLOTS + slot as usize * SLOT_BYTES)
    }

    pub(crate) fn slot_state(&self, slot: u32) -> u64 {
        self.slot_word(slot).load(Acquire)
    }

    pub(crate) fn gid(&self, slot: u32, gen: u32) -> Gid {
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&self.id.to_le_bytes());
        g[8..12].copy_from_slice(&slot.to_le_bytes());
        g[12..].copy_from_slice(&gen.to_le_bytes());
        Gid(g)
    }

    /// The GID of host `host` (an id from [`host_id`]) on this fabric.
    pub(crate) fn host_gid(&self, host: u32) -> Gid {
        self.gid(HOST_GID, host)
    }

    /// The GID slot `slot` of generation `gen` answers to: its host's, for a
    /// host node.
    fn slot_gid(&self, slot: u32, gen: u32) -> Gid {
        match self.slot_host(slot, gen) {
            Some(h) => self.host_gid(h),
            None => self.gid(slot, gen),
        }
    }

    /// What a GID of this fabric names: a node, or a host.
    pub(crate) fn parse_gid(&self, gid: &Gid) -> Option<GidOf> {
        let b = gid.as_bytes();
        let id = u64::from_le_bytes(b[..8].try_into().ok()?);
        let slot = u32::from_le_bytes(b[8..12].try_into().ok()?);
        let gen = u32::from_le_bytes(b[12..].try_into().ok()?);
        if id != self.id {
            return None;
        }
        if slot == HOST_GID {
            return Some(GidOf::Host(gen));
        }
        (slot < MAX_NODES).then_some(GidOf::Node(slot, gen))
    }

    fn host_word(&self, slot: u32) -> &std::sync::atomic::AtomicU64 {
        self.header
            .word(SLOTS + slot as usize * SLOT_BYTES + SLOT_HOST)
    }

    /// The host slot `slot` recorded for its generation `gen`, if any (a
    /// host word of an earlier generation is stale).
    fn slot_host(&self, slot: u32, gen: u32) -> Option<u32> {
        let hw = self.host_word(slot).load(Acquire);
        (hw != 0 && hw >> 32 == gen as u64).then_some(hw as u32)
    }

    /// The live nodes on host `host`, but `except`: `(slot, generation)`.
    pub(crate) fn host_nodes(
        &self,
        host: u32,
        except: u32,
    ) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..MAX_NODES)
            .filter(move |&s| s != except)
            .filter_map(move |slot| {
                let w = self.slot_state(slot);
                let gen = (w >> 8) as u32;
                (w & 0xff == SLOT_ALIVE
                    && self.slot_host(slot, gen) == Some(host)
                    && self.slot_alive(slot, w >> 8))
                .then_some((slot, gen))
            })
    }

    /// Whether the node `(slot, gen)` is alive: its slot is ALIVE with that
    /// generation and, when it lives in another process, that process exists
    /// with the recorded start time.
    pub(crate) fn slot_alive(&self, slot: u32, gen: u64) -> bool {
        let w = self.slot_state(slot);
        if w & 0xff != SLOT_ALIVE || w >> 8 != gen {
            return false;
        }
        let base = SLOTS + slot as usize * SLOT_BYTES;
        let pid = self.header.word(base + 8).load(Acquire) as u32;
        if pid == super::shm::pid() {
            return true;
        }
        let start = self.header.word(base + 16).load(Acquire);
        proc_start_time(pid) == Some(start)
    }

    /// As [`FabricInner::slot_alive`], trusting a check of the node's
    /// process that any QP of this process made in the last `interval_ns`
    /// (the slot word is always read: a node that closed, or whose slot was
    /// taken over, is dead at once). A DCI pool taking turns between a few
    /// nodes then reads a node's `/proc/PID/stat` once per interval, not
    /// once per QP and interval.
    pub(crate) fn slot_alive_within(&self, slot: u32, gen: u64, interval_ns: u64) -> bool {
        let w = self.slot_state(slot);
        if w & 0xff != SLOT_ALIVE || w >> 8 != gen {
            return false;
        }
        let Some((g, at)) = self.pid_checked.get(slot as usize) else {
            return self.slot_alive(slot, gen);
        };
        let now = super::shm::now_ns();
        if g.load(Acquire) == gen && now.saturating_sub(at.load(Acquire)) <= interval_ns {
            return true;
        }
        if !self.slot_alive(slot, gen) {
            return false;
        }
        // Two checkers may interleave these stores: a mixed pair at worst
        // makes a check come early (the slot word is compared first).
        at.store(now, Release);
        g.store(gen, Release);
        true
    }

    /// Whether node slot `slot` belongs to this process.
    pub(crate) fn slot_pid_is_self(&self, slot: u32) -> bool {
        let base = SLOTS + slot as usize * SLOT_BYTES;
        self.header.word(base + 8).load(Relaxed) as u32 == super::shm::pid()
    }

    /// Registers an existing segment (caller memory on `sim:mem`) under `name`.
    /// The file of the segment `name` on a directory fabric; `None` on
    /// sim:mem (whose segments are anonymous).
    pub(crate) fn segment_path(&self, name: &str) -> Option<std::path::PathBuf> {
        match &self.kind {
            Kind::Dir(p) => Some(p.join(name)),
            Kind::Mem => None,
        }
    }

    pub(crate) fn insert_segment(&self, name: &str, seg: Arc<Segment>) {
        self.segs.write().insert(name.to_string(), seg);
    }

    /// Claims a slot for a new node in this process, on host `host` (an id
    /// from [`host_id`]) if given; returns `(slot, gen)`.
    ///
    /// # Errors
    /// `Exhausted` when no slot is free.
    pub(crate) fn claim_slot(&self, host: Option<u32>) -> Result<(u32, u32)> {
        let pid = super::shm::pid();
        let start = proc_start_time(pid).unwrap_or(0);
        for slot in 0..MAX_NODES {
            let w = self.slot_state(slot);
            let state = w & 0xff;
            let gen = w >> 8;
            let reusable = match state {
                SLOT_FREE | SLOT_CLOSED => true,
                SLOT_ALIVE => !self.slot_alive(slot, gen),
                _ => false,
            };
            if !reusable {
                continue;
            }
            let new_gen = (gen + 1) & 0xffff_ffff;
            let sw = self.slot_word(slot);
            if sw
                .compare_exchange(w, (new_gen << 8) | SLOT_CLAIMING, AcqRel, Relaxed)
                .is_err()
            {
                continue;
            }
            if state == SLOT_ALIVE {
                // A dead node's leftovers: reclaim them.
                self.remove_node_segments(slot, gen as u32);
            }
            let base = SLOTS + slot as usize * SLOT_BYTES;
            self.header.word(base + 8).store(pid as u64, Relaxed);
            self.header.word(base + 16).store(start, Relaxed);
            // (Seen by readers that see the slot ALIVE: `publish_slot`
            // releases it.)
            let hw = host.map_or(0, |h| (new_gen << 32) | h as u64);
            self.host_word(slot).store(hw, Relaxed);
            return Ok((slot, new_gen as u32));
        }
        Err(NicError::Exhausted("fabric node slots"))
    }

    /// Publishes a claimed slot as alive.
    pub(crate) fn publish_slot(&self, slot: u32, gen: u32) {
        self.slot_word(slot)
            .store(((gen as u64) << 8) | SLOT_ALIVE, Release);
    }

    /// Marks the node closed (remote operations to it fail from now on) and
    /// removes its segments.
    pub(crate) fn close_slot(&self, slot: u32, gen: u32) {
        let sw = self.slot_word(slot);
        let cur = sw.load(Acquire);
        if cur >> 8 == gen as u64 && cur & 0xff != SLOT_CLOSED {
            let _ = sw.compare_exchange(cur, ((gen as u64) << 8) | SLOT_CLOSED, AcqRel, Relaxed);
        }
        self.remove_node_segments(slot, gen);
    }

    /// Marks the node closed without removing anything (as a crash would,
    /// but also seen as dead by processes on the fabric at once).
    pub(crate) fn kill_slot(&self, slot: u32, gen: u32) {
        let sw = self.slot_word(slot);
        let cur = sw.load(Acquire);
        if cur >> 8 == gen as u64 {
            let _ = sw.compare_exchange(cur, ((gen as u64) << 8) | SLOT_CLOSED, AcqRel, Relaxed);
        }
    }

    pub(crate) fn seg_name(slot: u32, gen: u32, what: &str) -> String {
        format!("n{slot}g{gen}-{what}")
    }

    /// Creates a zeroed segment under `name`.
    pub(crate) fn create_segment(&self, name: &str, len: usize) -> Result<Arc<Segment>> {
        let seg = Arc::new(match &self.kind {
            Kind::Mem => Segment::anon(len)?,
            Kind::Dir(p) => {
                let path = p.join(name);
                // A leftover of a reaped node with the same name cannot exist
                // (names carry generations), but a crashed creator may have
                // left a partial file: replace it.
                match Segment::create_file(&path, len) {
                    Err(NicError::Os { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        let _ = std::fs::remove_file(&path);
                        Segment::create_file(&path, len)?
                    }
                    other => other?,
                }
            }
        });
        self.segs.write().insert(name.to_string(), seg.clone());
        Ok(seg)
    }

    /// Opens (maps) the segment `name`, from the process-local cache when
    /// possible. `None` when it does not exist.
    pub(crate) fn open_segment(&self, name: &str) -> Option<Arc<Segment>> {
        if let Some(s) = self.segs.read().get(name) {
            return Some(s.clone());
        }
        match &self.kind {
            Kind::Mem => None,
            Kind::Dir(p) => {
                let seg = Arc::new(Segment::open_file(&p.join(name)).ok()?);
                self.segs.write().insert(name.to_string(), seg.clone());
                Some(seg)
            }
        }
    }

    /// Makes `seg`, the segment `existing`, known under `name` too (a
    /// sub-region's: other processes of a directory fabric open the same
    /// file, a hard link).
    pub(crate) fn link_segment(
        &self,
        existing: &str,
        name: &str,
        seg: &Arc<Segment>,
    ) -> Result<()> {
        if let Kind::Dir(p) = &self.kind {
            let to = p.join(name);
            let _ = std::fs::remove_file(&to);
            std::fs::hard_link(p.join(existing), &to).map_err(|source| NicError::Os {
                op: "link a sub-region's segment",
                source,
            })?;
        }
        self.segs.write().insert(name.to_string(), seg.clone());
        Ok(())
    }

    /// Removes the segment `name` from the fabric. Mappings that exist stay
    /// valid; new opens fail.
    pub(crate) fn remove_segment(&self, name: &str) {
        self.segs.write().remove(name);
        if let Kind::Dir(p) = &self.kind {
            let _ = std::fs::remove_file(p.join(name));
        }
    }

    fn remove_node_segments(&self, slot: u32, gen: u32) {
        let prefix = Self::seg_name(slot, gen, "");
        self.segs.write().retain(|k, _| !k.starts_with(&prefix));
        if let Kind::Dir(p) = &self.kind {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
}
