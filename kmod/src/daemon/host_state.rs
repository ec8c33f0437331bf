//! The daemon's state: its configuration and counters, and what it holds
//! per attached process (regions, VQPs and their rings, endpoints, ports),
//! shared by the control threads (`host.rs`, `host_msg.rs`,
//! `host_lease.rs`) and the data thread.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::shared::SharedMap;
use krcore_nic::{Nic, SendWr, Wc};
use parking_lot::{Mutex, RwLock};

use super::wire::{RefuseCode, Reply};
use crate::engine::{Endpoint, Engine, OwnedMr, Port, Vqp};

/// Per-process quotas and the data thread's idle policy.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// VQPs one process may hold.
    pub max_vqps: u32,
    /// Bytes of registered memory one process may hold.
    pub max_mr_bytes: u64,
    /// Regions one process may hold.
    pub max_mrs: u32,
    /// Processes attached at once.
    pub max_clients: usize,
    /// Messaging endpoints one process may hold.
    pub max_endpoints: u32,
    /// Ports one process may hold bound.
    pub max_ports: u32,
    /// Live leases one process may hold (each is a key of the device).
    pub max_leases: u32,
    /// How long a data thread spins without work before it sleeps.
    pub idle_spin: Duration,
    /// Data threads (at least 1): each serves the rings of the processes
    /// placed on it (a process goes to the thread with the fewest at
    /// attach), so the node's doorbells are not all drained by one core.
    /// Each spins while its processes have work, then sleeps.
    pub data_threads: usize,
}

impl Default for DaemonConfig {
    fn default() -> DaemonConfig {
        DaemonConfig {
            max_vqps: 1024,
            max_mr_bytes: 4 << 30,
            max_mrs: 4096,
            max_clients: 1024,
            max_endpoints: 64,
            max_ports: 16,
            max_leases: 1024,
            idle_spin: Duration::from_micros(200),
            data_threads: 1,
        }
    }
}

/// What the daemon has done, for its logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DaemonStats {
    /// Processes attached now.
    pub clients: usize,
    /// VQPs held by attached processes now.
    pub vqps: usize,
    /// Bytes of memory registered for attached processes now.
    pub mr_bytes: u64,
    /// Processes that attached, ever.
    pub attached: u64,
    /// Processes that went (detached, died, or were refused after Hello).
    pub detached: u64,
    /// Doorbells rung for processes.
    pub doorbells: u64,
    /// WRs posted for processes.
    pub wrs: u64,
    /// Doorbells refused (bad ring, bad entry, foreign memory, pre-check).
    pub refused_doorbells: u64,
    /// Completions handed to processes.
    pub completions: u64,
    /// Times a data thread went to sleep.
    pub sleeps: u64,
    /// Control requests refused.
    pub refused_requests: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) attached: AtomicU64,
    pub(super) detached: AtomicU64,
    pub(super) doorbells: AtomicU64,
    pub(super) wrs: AtomicU64,
    pub(super) refused_doorbells: AtomicU64,
    pub(super) completions: AtomicU64,
    pub(super) sleeps: AtomicU64,
    pub(super) refused_requests: AtomicU64,
}

/// One region of a process, as the data thread checks SGEs against it.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

/// What the data thread needs of a process.
pub(super) struct ClientCore {
    pub(super) page: SharedMap,
    pub(super) spans: RwLock<Vec<Span>>,
}

/// Whether `len` bytes at `addr` under `lkey` are in one of `spans`.
pub(super) fn owns(spans: &[Span], addr: u64, len: u32, lkey: u32) -> bool {
    spans.iter().any(|s| {
        s.lkey == lkey
            && addr >= s.addr
            && addr
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= s.addr + s.len)
    })
}

pub(super) struct Serve {
    pub(super) head: u64,
    pub(super) cq_tail: u64,
    pub(super) broken: bool,
    /// WRs of this VQP may be in flight: its completions are polled (an
    /// idle VQP costs the data thread two loads a round, no engine call).
    pub(super) active: bool,
    pub(super) wrs: Vec<SendWr>,
    pub(super) wcs: Vec<Wc>,
}

pub(super) struct VqpSlot<N: Nic> {
    pub(super) handle: u32,
    pub(super) vqp: Vqp<N>,
    pub(super) ring: SharedMap,
    pub(super) core: Arc<ClientCore>,
    /// The ring's SQ tail as last served while the VQP had nothing in
    /// flight ([`QUIET_NEVER`] while it has): the data thread skips the
    /// ring, without taking `serve`, while its tail still equals it. Only
    /// the data thread writes it, after serving under `serve`.
    pub(super) quiet: AtomicU64,
    pub(super) serve: Mutex<Serve>,
}

/// [`VqpSlot::quiet`] of a VQP with WRs in flight (no tail reaches it).
pub(super) const QUIET_NEVER: u64 = u64::MAX;

pub(super) struct MrEntry<N: Nic> {
    /// Dropped with the entry: deregisters the region (once its leases
    /// ended).
    pub(super) mr: OwnedMr<N>,
    pub(super) lkey: u32,
    pub(super) len: u64,
}

pub(super) struct Client<N: Nic> {
    pub(super) core: Arc<ClientCore>,
    pub(super) pid: u32,
    /// The data thread that serves its rings.
    pub(super) thread: usize,
    pub(super) stream: UnixStream,
    pub(super) vqps: RwLock<Vec<Arc<VqpSlot<N>>>>,
    pub(super) mrs: Mutex<Vec<(u32, MrEntry<N>)>>,
    /// Regions the process freed while they were leased: registered until
    /// their leases end (see `prune_retired`).
    pub(super) retired: Mutex<Vec<MrEntry<N>>>,
    pub(super) mr_bytes: AtomicU64,
    pub(super) next_handle: AtomicU32,
    /// Its messaging endpoints (see `host_msg`).
    pub(super) endpoints: Mutex<Vec<EpSlot<N>>>,
    /// Its bound ports (see `host_msg`).
    pub(super) ports: Mutex<Vec<PortSlot<N>>>,
    /// The stores it joined: (name, member id) (see `host_store`).
    pub(super) stores: Mutex<Vec<(String, u16)>>,
}

pub(super) struct Shared<N: Nic> {
    pub(super) engine: Engine<N>,
    pub(super) cfg: DaemonConfig,
    /// One wake-up eventfd per data thread (a process gets its thread's).
    pub(super) wakes: Vec<OwnedFd>,
    pub(super) stop: AtomicBool,
    pub(super) clients: RwLock<Vec<Arc<Client<N>>>>,
    /// Bumped at every change of the clients or their VQPs (the data
    /// thread's snapshot is rebuilt when it moves).
    pub(super) version: AtomicU64,
    pub(super) n: Counters,
    /// Serializes the processes' store calls (see `host_store`).
    pub(super) store_calls: Mutex<()>,
}

/// One endpoint of an attached process.
pub(super) struct EpSlot<N: Nic> {
    pub(super) handle: u32,
    pub(super) ep: Arc<Endpoint<N>>,
}

/// One bound port of an attached process.
pub(super) struct PortSlot<N: Nic> {
    pub(super) handle: u32,
    pub(super) port: Arc<Port<N>>,
}

pub(super) fn refuse(code: RefuseCode, message: impl Into<String>) -> Reply {
    Reply::Refused {
        code,
        message: message.into(),
    }
}

/// Drops the process's retired regions whose leases all ended (their
/// bytes go back to its quota).
pub(super) fn prune_retired<N: Nic>(c: &Client<N>) {
    let now = Instant::now();
    c.retired.lock().retain(|m| {
        let live = m.mr.live_leases(now) > 0;
        if !live {
            c.mr_bytes.fetch_sub(m.len, Ordering::Relaxed);
        }
        live
    });
}

/// An error and its causes on one line.
pub(super) fn error_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cur = c.source();
    }
    line
}
