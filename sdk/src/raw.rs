//! The VQP under a [`crate::Vqp`]: the engine's, in this process, or the
//! node daemon's, reached through its ring ([`crate::Node::attach`]). The
//! request layer in `vqp.rs` is written once against this.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use krcore_kmod::daemon::{AttachedVqp, DaemonError, PostCode};
use krcore_kmod::{RemoteGrant, Ungranted, VqpError, VqpId, VqpPath};
use krcore_nic::{Gid, Nic, SendWr, Wc};

use crate::error::{Error, Result};

/// What an attached VQP refuses.
const NO_UNGRANTED: &str =
    "Ungranted::Allow through the node daemon (every remote key needs a grant: the pre-check guards the other processes' memory)";

/// A connect the daemon refused: a GID the meta server does not know is
/// the engine's `UnknownNode`, as in process (callers wait for a node to
/// register on it); the rest as the daemon said.
pub(crate) fn connect_error(gid: Gid, e: DaemonError) -> Error {
    match e {
        DaemonError::Refused {
            code: krcore_kmod::daemon::wire::RefuseCode::UnknownNode,
            ..
        } => Error::Engine(krcore_kmod::EngineError::UnknownNode { gid }),
        e => e.into(),
    }
}

/// A VQP of the daemon's engine, with what this process remembers of it.
pub(crate) struct AttachedRaw {
    vqp: AttachedVqp,
    /// The target of the last connect; cleared when a post finds the VQP
    /// disconnected (the daemon's engine drops its target on a remote
    /// access error, as in-process).
    target: Mutex<Option<Gid>>,
    /// Grants the daemon was told of (no control round trip to repeat
    /// one; the daemon's VQP keeps them across connects, as in-process).
    grants: Mutex<Vec<(Gid, u32, RemoteGrant)>>,
    /// Bumped at every grant sent to the daemon (see
    /// [`RawVqp::grants_epoch`]).
    epoch: AtomicU64,
}

/// The VQP a [`crate::Vqp`] posts on.
pub(crate) enum RawVqp<N: Nic> {
    /// The engine's VQP in this process.
    Local(krcore_kmod::Vqp<N>),
    /// The node daemon's.
    Attached(AttachedRaw),
}

impl<N: Nic> std::fmt::Debug for RawVqp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawVqp::Local(v) => v.fmt(f),
            RawVqp::Attached(a) => a.vqp.fmt(f),
        }
    }
}

impl<N: Nic> RawVqp<N> {
    pub(crate) fn attached(vqp: AttachedVqp) -> RawVqp<N> {
        RawVqp::Attached(AttachedRaw {
            vqp,
            target: Mutex::new(None),
            grants: Mutex::new(Vec::new()),
            epoch: AtomicU64::new(0),
        })
    }

    /// An attached VQP the daemon opened connected to `gid` with the grant
    /// over `rkey` known (`Attached::open_vqp`).
    pub(crate) fn attached_open(
        vqp: AttachedVqp,
        gid: Gid,
        rkey: u32,
        grant: RemoteGrant,
    ) -> RawVqp<N> {
        RawVqp::Attached(AttachedRaw {
            vqp,
            target: Mutex::new(Some(gid)),
            grants: Mutex::new(vec![(gid, rkey, grant)]),
            epoch: AtomicU64::new(1),
        })
    }

    /// The VQP's id (its completions' `qp_num`).
    pub(crate) fn id(&self) -> u32 {
        match self {
            RawVqp::Local(v) => v.id().get(),
            RawVqp::Attached(a) => a.vqp.id(),
        }
    }

    fn vqp_id(&self) -> VqpId {
        VqpId::new(self.id()).unwrap_or(VqpId::MAX)
    }

    pub(crate) fn connect(&self, gid: Gid) -> Result<()> {
        match self {
            RawVqp::Local(v) => Ok(v.connect(gid)?),
            RawVqp::Attached(a) => {
                let mut t = a.target.lock();
                *t = None;
                a.vqp.connect(gid).map_err(|e| connect_error(gid, e))?;
                *t = Some(gid);
                Ok(())
            }
        }
    }

    pub(crate) fn target(&self) -> Option<Gid> {
        match self {
            RawVqp::Local(v) => v.target().map(|t| t.target.gid),
            RawVqp::Attached(a) => *a.target.lock(),
        }
    }

    /// How the VQP reaches its target: an attached VQP asks the daemon
    /// (one control call), and reports the daemon's mode when it cannot.
    pub(crate) fn path(&self, rc_fallback: bool) -> VqpPath {
        match self {
            RawVqp::Local(v) => v.path(),
            RawVqp::Attached(a) => a.vqp.path().unwrap_or(if rc_fallback {
                VqpPath::Rc
            } else {
                VqpPath::Dc
            }),
        }
    }

    pub(crate) fn upgrade(&self) -> Result<VqpPath> {
        match self {
            RawVqp::Local(v) => Ok(v.upgrade()?),
            RawVqp::Attached(a) => Ok(a.vqp.upgrade()?),
        }
    }

    pub(crate) fn set_ungranted(&self, rule: Ungranted) -> Result<()> {
        match (self, rule) {
            (RawVqp::Local(v), rule) => {
                v.set_ungranted(rule);
                Ok(())
            }
            (RawVqp::Attached(_), Ungranted::Refuse) => Ok(()),
            (RawVqp::Attached(_), _) => Err(Error::Unsupported(NO_UNGRANTED)),
        }
    }

    /// Counts changes of the VQP's known grants (see
    /// [`krcore_kmod::Vqp::grants_epoch`]; an attached VQP counts the
    /// grants it sent).
    pub(crate) fn grants_epoch(&self) -> u64 {
        match self {
            RawVqp::Local(v) => v.grants_epoch(),
            RawVqp::Attached(a) => a.epoch.load(Ordering::Acquire),
        }
    }

    /// Makes a grant known to the VQP's pre-check.
    ///
    /// # Errors
    /// Attached: [`Error::Daemon`] (the key is another attached process's,
    /// the daemon went).
    pub(crate) fn add_grant(&self, gid: Gid, rkey: u32, grant: RemoteGrant) -> Result<()> {
        match self {
            RawVqp::Local(v) => {
                v.add_grant(gid, rkey, grant);
                Ok(())
            }
            RawVqp::Attached(a) => {
                let mut known = a.grants.lock();
                if known.contains(&(gid, rkey, grant)) {
                    return Ok(());
                }
                a.vqp.add_grant(gid, rkey, grant)?;
                known.push((gid, rkey, grant));
                a.epoch.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
        }
    }

    /// Posts `wrs` as one doorbell.
    ///
    /// # Errors
    /// As [`krcore_kmod::Vqp::post_send`]; attached, a daemon refusal that
    /// has an in-process twin comes as that twin (`NotConnected`, and
    /// [`is_full`] for a full VQP), the others as [`Error::Daemon`].
    #[inline(always)]
    pub(crate) fn post_send(&self, wrs: &mut [SendWr]) -> Result<()> {
        match self {
            RawVqp::Local(v) => Ok(v.post_send(wrs)?),
            RawVqp::Attached(a) => match a.vqp.post(wrs) {
                Ok(()) => Ok(()),
                Err(DaemonError::Post {
                    code: PostCode::NotConnected,
                    ..
                }) => {
                    *a.target.lock() = None;
                    Err(Error::Vqp(VqpError::NotConnected { vqp: self.vqp_id() }))
                }
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Polls up to `out.len()` completions.
    #[inline(always)]
    pub(crate) fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        match self {
            RawVqp::Local(v) => Ok(v.poll(out)?),
            RawVqp::Attached(a) => Ok(a.vqp.poll(out)?),
        }
    }

    /// Between empty polls of one wait (see [`crate::Vqp::idle`]).
    pub(crate) fn idle(&self, cq: &mut krcore_kmod::daemon::CqWait) -> Result<()> {
        match self {
            RawVqp::Local(_) => {
                std::hint::spin_loop();
                Ok(())
            }
            RawVqp::Attached(a) => Ok(a.vqp.idle(cq)?),
        }
    }

    /// The engine's VQP (`None` for an attached one).
    pub(crate) fn local(&self) -> Option<&krcore_kmod::Vqp<N>> {
        match self {
            RawVqp::Local(v) => Some(v),
            RawVqp::Attached(_) => None,
        }
    }
}

/// Whether a post failed only because the VQP is full (poll, then retry).
pub(crate) fn is_full(e: &Error) -> bool {
    matches!(
        e,
        Error::Vqp(VqpError::VqpFull { .. })
            | Error::Daemon(DaemonError::Post {
                code: PostCode::Full,
                ..
            })
    )
}
