//! Errors specific to the verbs provider (opening a device, pinning memory).
//!
//! Trait methods return [`crate::NicError`]; a [`VerbsError`] reaches them as
//! the `source` of [`crate::NicError::Os`], so callers can still
//! `downcast_ref::<VerbsError>()` it.

use crate::NicError;
use std::io;

/// Why the verbs provider failed where the provider contract has no variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs found no RDMA device at all.
    #[error(
        "no RDMA device found: load a driver (mlx5_ib) or create a Soft-RoCE \
         device (`modprobe rdma_rxe; rdma link add rxe0 type rxe netdev lo`)"
    )]
    NoDevice,
    /// The named device does not exist.
    #[error("no RDMA device named {name:?}; found: {}", found.join(", "))]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The devices that exist.
        found: Vec<String>,
    },
    /// The port asked for is not ACTIVE (no link, or the netdev is down).
    #[error(
        "{device} port {port} is not active (state {state_name}, ibv_port_state {state}); \
         bring the link up or pick another port (`ibv_devinfo` lists them)"
    )]
    PortDown {
        /// The device.
        device: String,
        /// The port asked for (1-based).
        port: u8,
        /// `enum ibv_port_state`.
        state: u32,
        /// Its name (`DOWN`, `INIT`, ...).
        state_name: &'static str,
    },
    /// No port was asked for and none is ACTIVE.
    #[error("{device} has no active port ({}); bring a link up (`ibv_devinfo` shows the states)", ports.join(", "))]
    NoActivePort {
        /// The device.
        device: String,
        /// Each port as `N: STATE`.
        ports: Vec<String>,
    },
    /// The port asked for does not exist.
    #[error("{device} has no port {port} (it has ports 1 to {count})")]
    NoSuchPort {
        /// The device.
        device: String,
        /// The port asked for.
        port: u8,
        /// How many ports the device has.
        count: u8,
    },
    /// No GID index was asked for and none fits the default rule (a RoCE v2
    /// IPv4-mapped entry on Ethernet, index 0 on InfiniBand).
    #[error(
        "{device} port {port} has no usable GID (wanted a RoCE v2 IPv4-mapped entry on \
         Ethernet, index 0 on InfiniBand); found: [{}]; give an address to the netdev or \
         pick an index (gid=N)", found.join("; ")
    )]
    NoUsableGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Every non-empty entry as `INDEX: TYPE GID`.
        found: Vec<String>,
    },
    /// The GID index does not name a usable GID.
    #[error("GID index {index} is unusable ({reason}); the port has {table_len} entries (see `ibv_devinfo -v` or `show_gids`)")]
    BadGidIndex {
        /// The index asked for.
        index: u8,
        /// Entries in the port's GID table.
        table_len: u32,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Pinning memory failed because of the locked-memory limit.
    #[error(
        "{op}: cannot pin {requested} bytes: the locked-memory limit (RLIMIT_MEMLOCK) is \
         {limit} bytes; raise it (`ulimit -l unlimited`, or `memlock` in \
         /etc/security/limits.conf / LimitMEMLOCK= for services)"
    )]
    MemlockLimit {
        /// The call that failed.
        op: &'static str,
        /// Bytes asked for.
        requested: u64,
        /// The soft limit in force.
        limit: u64,
    },
    /// A libibverbs or OS call failed.
    #[error("{op}: {source}")]
    Os {
        /// The call.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl VerbsError {
    pub(crate) fn from_os(op: &'static str, source: io::Error) -> VerbsError {
        VerbsError::Os { op, source }
    }

    /// A failed pinning call: `MemlockLimit` when the errno and the limit
    /// say so, `Os` otherwise.
    pub(crate) fn pinning(op: &'static str, requested: u64, source: io::Error) -> VerbsError {
        let errno = source.raw_os_error();
        if matches!(
            errno,
            Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN)
        ) {
            if let Some(limit) = memlock_limit() {
                return VerbsError::MemlockLimit {
                    op,
                    requested,
                    limit,
                };
            }
        }
        VerbsError::Os { op, source }
    }
}

/// The soft RLIMIT_MEMLOCK, or `None` when unlimited or irrelevant (root
/// with CAP_IPC_LOCK is not bound by it; we approximate that by uid 0).
fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer; getrlimit has no other preconditions.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY && !root).then_some(r.rlim_cur)
}

impl From<VerbsError> for NicError {
    fn from(e: VerbsError) -> NicError {
        let op = match &e {
            VerbsError::Os { op, .. } | VerbsError::MemlockLimit { op, .. } => op,
            _ => "open verbs device",
        };
        let kind = match &e {
            VerbsError::MemlockLimit { .. } => io::ErrorKind::OutOfMemory,
            VerbsError::Os { source, .. } => source.kind(),
            VerbsError::NoDevice | VerbsError::UnknownDevice { .. } => io::ErrorKind::NotFound,
            _ => io::ErrorKind::Other,
        };
        NicError::Os {
            op,
            source: io::Error::new(kind, e),
        }
    }
}
