//! The client side: [`MetaClient`] (a checked bootstrap: where the table
//! is) and [`lookup_once`] (one READ of a bucket through a DC initiator).
//!
//! Lookups by READ belong to the engine (kmod), which reads the table
//! through its own DC initiators and cache; [`lookup_once`] is the
//! one-READ primitive it and the tests share. Registration is the
//! engine's too: two-sided messages to the server's reserved port
//! (`krcore_kmod::Engine::meta_register`).

use crate::bootstrap;
use crate::entry::{EntryRepr, ENTRY_LEN};
use crate::error::MetaResult;
use crate::table::{find_in_bucket, Geometry, MAX_SLOTS_PER_BUCKET};
use crate::wire::{BootstrapError, BootstrapRepr};
use krcore_nic::sim::SimFabric;
use krcore_nic::{
    CompletionQueue, Destination, Gid, MemoryRegion, Nic, NicError, PostError, QueuePair,
    RemoteAddr, SendWr, Wc, WcStatus,
};
use std::time::{Duration, Instant};

/// A meta server as a client sees it: its bootstrap, checked once.
///
/// Invariant: the bootstrap's table layout is readable by this build
/// (`geometry()` succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaClient {
    bootstrap: BootstrapRepr,
    geometry: Geometry,
}

impl MetaClient {
    /// A client of the server `bootstrap` describes.
    ///
    /// # Errors
    /// [`crate::MetaError::Bootstrap`] when this build cannot read its table.
    pub fn new(bootstrap: BootstrapRepr) -> MetaResult<MetaClient> {
        Ok(MetaClient {
            geometry: bootstrap.geometry()?,
            bootstrap,
        })
    }

    /// A client of the server published under `name` on `fabric`.
    ///
    /// # Errors
    /// See [`bootstrap::lookup_on_sim`].
    pub fn from_sim(fabric: &SimFabric, name: &str) -> MetaResult<MetaClient> {
        MetaClient::new(bootstrap::lookup_on_sim(fabric, name)?)
    }

    /// A client of the server whose TCP bootstrap listens on `addr`.
    ///
    /// # Errors
    /// See [`bootstrap::fetch_bootstrap_tcp`].
    pub fn from_tcp(
        addr: impl std::net::ToSocketAddrs,
        timeout: Duration,
    ) -> MetaResult<MetaClient> {
        MetaClient::new(bootstrap::fetch_bootstrap_tcp(addr, timeout)?)
    }

    /// The server's bootstrap.
    pub fn bootstrap(&self) -> &BootstrapRepr {
        &self.bootstrap
    }

    /// The table's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Where the bucket of `gid` is, and how many bytes one READ of it
    /// takes.
    pub fn bucket_of(&self, gid: &Gid) -> (RemoteAddr, usize) {
        let g = self.geometry;
        let off = g.bucket_offset(g.bucket_of(gid));
        (self.bootstrap.table.offset(off), g.bucket_len())
    }
}

/// `wr_id` of the READ [`lookup_once`] posts.
pub const LOOKUP_WR_ID: u64 = u64::from_le_bytes(*b"KRMTlook");
/// How long [`lookup_once`] waits for its completion.
pub const LOOKUP_WAIT: Duration = Duration::from_secs(5);

/// Why [`lookup_once`] has no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The READ completed but the bucket gave no answer:
    /// [`crate::table::LookupError::Torn`] (retry) or `Corrupt`.
    #[error(transparent)]
    Bucket(#[from] crate::table::LookupError),
    /// The bootstrap describes a table this build cannot read.
    #[error("bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// The scratch region cannot hold one bucket.
    #[error("scratch region of {have} bytes cannot hold a {need}-byte bucket")]
    ScratchTooSmall {
        /// Bytes of one bucket.
        need: usize,
        /// Bytes of the scratch region.
        have: usize,
    },
    /// A provider call failed.
    #[error("lookup: {0}")]
    Nic(#[from] NicError),
    /// The READ was refused at post time (QP not in RTS, queue full).
    #[error("lookup READ refused: {0}")]
    Post(#[from] PostError),
    /// The READ completed with an error: the server is dead
    /// (`RETRY_EXC_ERR`), its table moved (`REM_ACCESS_ERR`), or the QP was
    /// already in ERR (`WR_FLUSH_ERR`). The DCI is in ERR now and needs a
    /// reset before its next use.
    #[error("lookup READ completed with {0:?}")]
    Completion(WcStatus),
    /// No completion within [`LOOKUP_WAIT`].
    #[error("lookup READ did not complete within {0:?}")]
    Timeout(Duration),
    /// The CQ returned another work request's completion (the CQ must be
    /// dedicated to the lookup while it runs).
    #[error("unexpected completion of wr_id {:#x} on the lookup CQ", .0.wr_id)]
    UnexpectedCompletion(Wc),
}

impl LookupError {
    /// Whether the bucket was being written while it was read: READ again.
    pub fn is_torn(&self) -> bool {
        matches!(
            self,
            LookupError::Bucket(crate::table::LookupError::Torn { .. })
        )
    }

    /// Whether another READ may succeed: a torn bucket always, a checksum
    /// mismatch a bounded number of times (see
    /// [`crate::table::LookupError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, LookupError::Bucket(e) if e.is_retryable())
    }
}

/// Looks `gid` up with exactly one READ: the bucket `bootstrap` places it
/// in, read through the DC initiator `qp` into the start of `scratch`, then
/// parsed with [`find_in_bucket`].
///
/// Preconditions: `qp` is a DCI in RTS with a free send slot; `cq` is its
/// send CQ with nothing else outstanding; `scratch` is a local region with
/// `LOCAL_WRITE` of at least one bucket. The READ is signaled; its
/// completion is polled here (at most [`LOOKUP_WAIT`]).
///
/// Returns `Ok(Some(entry))` when a stable entry holds `gid`, `Ok(None)`
/// when every slot is stable and none does.
///
/// # Errors
/// [`LookupError`]; [`LookupError::is_torn`] says the READ raced a write
/// and may simply be repeated.
pub fn lookup_once<N: Nic>(
    qp: &N::Qp,
    cq: &N::Cq,
    scratch: &N::Mr,
    bootstrap: &BootstrapRepr,
    gid: &Gid,
) -> Result<Option<EntryRepr>, LookupError> {
    let g = bootstrap.geometry()?;
    let len = g.bucket_len();
    if scratch.len() < len {
        return Err(LookupError::ScratchTooSmall {
            need: len,
            have: scratch.len(),
        });
    }
    let remote = bootstrap.table.offset(g.bucket_offset(g.bucket_of(gid)));
    let wr = SendWr::read(LOOKUP_WR_ID, scratch.sge(0, len as u32)?, remote)
        .to(Destination::Dc(bootstrap.server));
    qp.post_send(&[wr])?;
    let start = Instant::now();
    let mut wc = [Wc::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            break;
        }
        if start.elapsed() >= LOOKUP_WAIT {
            return Err(LookupError::Timeout(LOOKUP_WAIT));
        }
        std::hint::spin_loop();
    }
    let wc = wc[0];
    if wc.wr_id != LOOKUP_WR_ID {
        return Err(LookupError::UnexpectedCompletion(wc));
    }
    if wc.status != WcStatus::Success {
        return Err(LookupError::Completion(wc.status));
    }
    let mut buf = [0u8; MAX_SLOTS_PER_BUCKET as usize * ENTRY_LEN];
    scratch.read(0, &mut buf[..len])?;
    Ok(find_in_bucket(&buf[..len], gid)?)
}
