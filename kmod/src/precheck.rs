//! The pre-check (KRCore Algorithm 2) as a pure function.
//!
//! A physical QP is shared by many VQPs, and a single bad WR puts it in ERR
//! and flushes everybody's work. So before a VQP's batch reaches the NIC the
//! engine checks it against what it knows and either rejects it with a typed
//! [`Rejection`] (it never reaches the NIC) or returns a [`Plan`]:
//!
//! - **(b) validity**, per WR, in this order: opcode allowed on the
//!   transport; destination kind matches the transport; payload shape (SGE
//!   count, inline size, inline only for WRITE/SEND); atomics carry one 8-byte
//!   SGE and an 8-byte aligned remote address; every SGE's lkey is one of this
//!   process's MRs ([`LocalMrTable`]), the SGE lies inside it, and the MR
//!   allows local writes when the NIC writes into it (READ, CAS, FAA); the
//!   remote range lies inside a known, unexpired grant with the right access,
//!   *when a grant is known* for that (target, rkey) ([`RemoteGrants`]).
//! - **(a) capacity**: a batch that does not fit in the free credits makes
//!   the caller poll first ([`Plan::credits_short`]).
//! - **(c) signaling**: when posting the batch would leave more than
//!   `max_unsignaled` WRs after the newest signaled one, its last WR is
//!   forced signaled ([`Plan::force_signal`]).
//!
//! Nothing here reads a clock: `now` is an argument.
//!
//! # Why forcing the last WR suffices
//!
//! The *unsignaled tail* (see [`crate::credits`]) is what no pending
//! completion will free. The pre-check keeps it at most `m =
//! min(max_unsignaled, depth - 1)`, and caps a batch at `depth - m` WRs, so a
//! batch that must wait for credits can always get them by polling: the
//! outstanding WRs outside the tail are covered by a signaled WR. Forcing the
//! batch's last WR signaled makes the tail 0; forcing more would only free
//! credits earlier. The rule is exact rather than Algorithm 2's bound
//! (`outstanding unsignaled + batch unsignaled > m`): a batch that already
//! ends in a short unsignaled run after a signaled WR needs no forcing. For a
//! batch with no signaled WR the two agree.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Instant;

use krcore_nic::{
    Access, Destination, Gid, Payload, RemoteAddr, SendFlags, SendWr, WrOp, MAX_INLINE, MAX_SGE,
};

use crate::credits::QueueView;

/// The transport of the physical QP a VQP posts on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum QpKind {
    /// Reliable connected: every opcode, to the connected peer.
    Rc,
    /// DC initiator: every opcode, to the DC target named in each WR.
    Dc,
    /// Unreliable datagram: SEND and SEND_WITH_IMM only.
    Ud,
}

impl QpKind {
    /// Whether the transport carries `op`.
    #[inline]
    pub fn allows(self, op: OpKind) -> bool {
        match self {
            QpKind::Rc | QpKind::Dc => true,
            QpKind::Ud => matches!(op, OpKind::Send | OpKind::SendImm),
        }
    }

    #[inline]
    fn destination_ok(self, dest: &Destination) -> bool {
        matches!(
            (self, dest),
            (QpKind::Rc, Destination::Connected)
                | (QpKind::Dc, Destination::Dc(_))
                | (QpKind::Ud, Destination::Ud(_))
        )
    }
}

/// The opcode of a [`WrOp`], without its operands.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum OpKind {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate.
    WriteImm,
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm,
    /// Compare-and-swap.
    CompareSwap,
    /// Fetch-and-add.
    FetchAdd,
}

impl OpKind {
    /// The kind of `op`.
    #[inline]
    pub fn of(op: &WrOp) -> OpKind {
        match op {
            WrOp::Read { .. } => OpKind::Read,
            WrOp::Write { .. } => OpKind::Write,
            WrOp::WriteImm { .. } => OpKind::WriteImm,
            WrOp::Send => OpKind::Send,
            WrOp::SendImm { .. } => OpKind::SendImm,
            WrOp::CompareSwap { .. } => OpKind::CompareSwap,
            WrOp::FetchAdd { .. } => OpKind::FetchAdd,
        }
    }

    /// Whether the NIC writes into the local SGEs (READ results, atomics'
    /// old values), which needs `LOCAL_WRITE` on their MRs.
    #[inline]
    pub fn writes_locally(self) -> bool {
        matches!(self, OpKind::Read | OpKind::CompareSwap | OpKind::FetchAdd)
    }

    /// Whether inline data is allowed.
    #[inline]
    pub fn allows_inline(self) -> bool {
        matches!(
            self,
            OpKind::Write | OpKind::WriteImm | OpKind::Send | OpKind::SendImm
        )
    }

    /// The remote access a grant must give, for one-sided operations.
    #[inline]
    pub fn remote_access(self) -> Option<Access> {
        match self {
            OpKind::Read => Some(Access::REMOTE_READ),
            OpKind::Write | OpKind::WriteImm => Some(Access::REMOTE_WRITE),
            OpKind::CompareSwap | OpKind::FetchAdd => Some(Access::REMOTE_ATOMIC),
            OpKind::Send | OpKind::SendImm => None,
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A memory region owned by the posting process.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LocalMr {
    /// First byte's virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access flags it was registered with.
    pub access: Access,
}

/// The MRs of the posting process, by lkey. Only MRs this process owns may be
/// listed: an lkey it does not own is rejected, never passed to the NIC.
pub trait LocalMrTable {
    /// The MR with local key `lkey`, if the process owns one.
    fn lookup(&self, lkey: u32) -> Option<LocalMr>;
}

impl LocalMrTable for HashMap<u32, LocalMr> {
    fn lookup(&self, lkey: u32) -> Option<LocalMr> {
        self.get(&lkey).copied()
    }
}

impl LocalMrTable for BTreeMap<u32, LocalMr> {
    fn lookup(&self, lkey: u32) -> Option<LocalMr> {
        self.get(&lkey).copied()
    }
}

/// Remote access a peer granted (an MR lease handed out by its SDK).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RemoteGrant {
    /// First byte's address in the target.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// What the grant allows (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`).
    pub access: Access,
    /// The grant is void from this instant on; `None`: it never expires
    /// (no lease). The engine reads the clock for the pre-check only while
    /// a VQP knows a grant with an expiry.
    pub expires_at: Option<Instant>,
}

/// What the pre-check does with a one-sided WR whose (target, rkey) has
/// no grant the VQP knows.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ungranted {
    /// Refused ([`Reason::NotGranted`]): a VQP reaches only memory it was
    /// granted (a region token, a lease, a grant added by hand).
    #[default]
    Refuse,
    /// Left to the NIC (which refuses a bad rkey with `REM_ACCESS_ERR`,
    /// moving the shared QP to ERR and into recovery): the opt-out for
    /// raw verbs users who pass rkeys by hand.
    Allow,
}

/// Grants known to this process, by (target GID, rkey). Whether an unknown
/// one is refused is [`Precheck::ungranted`]'s; known ones are checked.
pub trait RemoteGrants {
    /// The grant of `rkey` at `target`, if known.
    fn lookup(&self, target: &Gid, rkey: u32) -> Option<RemoteGrant>;
}

impl<S: std::hash::BuildHasher> RemoteGrants for HashMap<(Gid, u32), RemoteGrant, S> {
    fn lookup(&self, target: &Gid, rkey: u32) -> Option<RemoteGrant> {
        self.get(&(*target, rkey)).copied()
    }
}

/// No known grants: remote ranges are left to the NIC.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct NoGrants;

impl RemoteGrants for NoGrants {
    #[inline]
    fn lookup(&self, _target: &Gid, _rkey: u32) -> Option<RemoteGrant> {
        None
    }
}

/// Limits of the physical QP, shared by every VQP posting on it.
///
/// (De)serializable, as the `[policy]` table of an engine's configuration
/// file: any subset of fields, unknown keys refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Most WRs allowed after the newest signaled one (clamped to
    /// `depth - 1`).
    pub max_unsignaled: u32,
    /// Most SGEs per WR (the QP's `max_send_sge`).
    pub max_sge: usize,
    /// Most inline bytes per WR (the QP's inline limit).
    pub max_inline: usize,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            max_unsignaled: 16,
            max_sge: MAX_SGE,
            max_inline: MAX_INLINE,
        }
    }
}

impl Policy {
    /// `max_unsignaled` clamped so that a full queue always holds a signaled
    /// WR.
    #[inline]
    pub fn effective_max_unsignaled(&self, depth: u32) -> u32 {
        self.max_unsignaled.min(depth.saturating_sub(1))
    }

    /// The largest batch a queue of `depth` accepts.
    #[inline]
    pub fn max_batch(&self, depth: u32) -> u32 {
        depth - self.effective_max_unsignaled(depth)
    }
}

/// Why a batch was rejected; the WR at [`Rejection::index`] and those after
/// it were not checked, and nothing of the batch was posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work request {index} rejected: {reason}")]
pub struct Rejection {
    /// Index in the batch of the offending WR (0 for an empty batch).
    pub index: usize,
    /// Why.
    pub reason: Reason,
}

/// The reason of a [`Rejection`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    /// The batch has no WR.
    #[error("empty batch")]
    EmptyBatch,
    /// The batch is longer than the queue can ever take at once.
    #[error("batch of {len} WRs exceeds the limit of {max} for this queue")]
    BatchTooLarge {
        /// WRs in the batch.
        len: usize,
        /// [`Policy::max_batch`].
        max: u32,
    },
    /// The transport does not carry this opcode.
    #[error("{op} is not allowed on {transport:?}")]
    OpNotAllowed {
        /// The opcode.
        op: OpKind,
        /// The transport.
        transport: QpKind,
    },
    /// The destination kind does not match the transport.
    #[error("destination does not match transport {transport:?}")]
    WrongDestination {
        /// The transport.
        transport: QpKind,
    },
    /// More SGEs than the QP takes.
    #[error("{count} SGEs, the QP takes at most {max}")]
    TooManySges {
        /// SGEs in the WR.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More inline bytes than the QP takes.
    #[error("{len} inline bytes, the QP takes at most {max}")]
    InlineTooLarge {
        /// Inline bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Inline data on an opcode that reads into local memory.
    #[error("inline data is not allowed for {op}")]
    InlineNotAllowed {
        /// The opcode.
        op: OpKind,
    },
    /// An atomic without exactly one 8-byte SGE.
    #[error("an atomic needs one 8-byte SGE, got {sges} SGEs of {len} bytes")]
    AtomicSgeLength {
        /// SGEs in the WR.
        sges: usize,
        /// Their total length.
        len: u64,
    },
    /// An atomic at a remote address that is not 8-byte aligned.
    #[error("atomic at remote address {addr:#x} is not 8-byte aligned")]
    AtomicMisaligned {
        /// The remote address.
        addr: u64,
    },
    /// The lkey of an SGE is not an MR of this process.
    #[error("SGE {sge}: lkey {lkey:#x} is not owned by this process")]
    LkeyNotOwned {
        /// Index of the SGE in the WR.
        sge: usize,
        /// The lkey.
        lkey: u32,
    },
    /// An SGE reaches outside its MR.
    #[error("SGE {sge}: {addr:#x}+{length} lies outside its MR {mr_addr:#x}+{mr_len}")]
    SgeOutOfBounds {
        /// Index of the SGE in the WR.
        sge: usize,
        /// SGE address.
        addr: u64,
        /// SGE length.
        length: u32,
        /// MR address.
        mr_addr: u64,
        /// MR length.
        mr_len: u64,
    },
    /// The NIC would write into an MR registered without `LOCAL_WRITE`.
    #[error("SGE {sge}: {op} writes into MR {lkey:#x}, registered without LOCAL_WRITE")]
    LocalWriteMissing {
        /// Index of the SGE in the WR.
        sge: usize,
        /// The lkey.
        lkey: u32,
        /// The opcode.
        op: OpKind,
    },
    /// The known grant for the rkey has expired.
    #[error("grant for rkey {rkey:#x} expired")]
    GrantExpired {
        /// The rkey.
        rkey: u32,
    },
    /// The known grant for the rkey does not allow the operation.
    #[error("grant for rkey {rkey:#x} does not allow {op}")]
    RemoteAccessMissing {
        /// The rkey.
        rkey: u32,
        /// The opcode.
        op: OpKind,
    },
    /// No grant the VQP knows covers the remote key (see [`Ungranted`]).
    #[error("no grant known for rkey {rkey:#x} (remote {addr:#x}): pass a region token, or opt out of the check")]
    NotGranted {
        /// The rkey.
        rkey: u32,
        /// The remote address.
        addr: u64,
    },
    /// The remote range lies outside the known grant.
    #[error("remote {addr:#x}+{len} lies outside the grant {grant_addr:#x}+{grant_len}")]
    RemoteOutOfGrant {
        /// Remote address.
        addr: u64,
        /// Bytes accessed.
        len: u64,
        /// Grant address.
        grant_addr: u64,
        /// Grant length.
        grant_len: u64,
    },
}

/// What the caller must do to post an accepted batch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Plan {
    /// Credits to reclaim (by polling signaled completions) before posting;
    /// 0 when the batch fits now.
    pub credits_short: u32,
    /// The WR to post signaled although it is not (always the batch's last).
    pub force_signal: Option<usize>,
    /// The queue's unsignaled tail once the batch is posted as planned.
    pub unsignaled_after: u32,
}

impl Plan {
    /// Whether the caller must poll before posting.
    pub fn must_reclaim(&self) -> bool {
        self.credits_short > 0
    }

    /// Sets the forced signal flag on `batch` (the batch that was checked).
    pub fn apply(&self, batch: &mut [SendWr]) {
        if let Some(i) = self.force_signal {
            batch[i].flags = batch[i].flags | SendFlags::SIGNALED;
        }
    }
}

/// Everything the pre-check looks at besides the batch.
#[derive(Debug)]
pub struct Precheck<'a, M: ?Sized, G: ?Sized> {
    /// QpKind of the physical QP.
    pub transport: QpKind,
    /// The connected peer of an RC QP (to find grants for WRs to
    /// [`Destination::Connected`]); `None` skips grant checks for them.
    pub peer: Option<Gid>,
    /// The posting process's MRs.
    pub local_mrs: &'a M,
    /// Known remote grants ([`NoGrants`] when none).
    pub grants: &'a G,
    /// What to do with a one-sided WR under no known grant (also a WR to
    /// [`Destination::Connected`] with no `peer`).
    pub ungranted: Ungranted,
    /// The current time, for grant expiry.
    pub now: Instant,
    /// The physical queue ([`crate::SendQueueCredits::view`]).
    pub queue: QueueView,
    /// Limits of the physical QP.
    pub policy: Policy,
}

impl<M: LocalMrTable + ?Sized, G: RemoteGrants + ?Sized> Precheck<'_, M, G> {
    /// Checks `batch`.
    ///
    /// # Errors
    /// A [`Rejection`] naming the first bad WR and why; the batch must not be
    /// posted.
    pub fn check(&self, batch: &[SendWr]) -> Result<Plan, Rejection> {
        self.check_batch(batch, true)
    }

    /// [`Precheck::check`]; `common_path`: accept the common WR in one
    /// straight pass ([`Self::common_wr_ok`]) before the full check (the
    /// tests compare both ways).
    #[inline]
    fn check_batch(&self, batch: &[SendWr], common_path: bool) -> Result<Plan, Rejection> {
        let reject = |index, reason| Rejection { index, reason };
        if batch.is_empty() {
            return Err(reject(0, Reason::EmptyBatch));
        }
        let depth = self.queue.depth;
        let max_batch = self.policy.max_batch(depth);
        if batch.len() > max_batch as usize {
            return Err(reject(
                max_batch as usize,
                Reason::BatchTooLarge {
                    len: batch.len(),
                    max: max_batch,
                },
            ));
        }
        for (index, wr) in batch.iter().enumerate() {
            if !(common_path && self.common_wr_ok(wr)) {
                self.check_wr(wr).map_err(|reason| reject(index, reason))?;
            }
        }
        Ok(self.plan(batch))
    }

    /// The common WR, accepted in one straight pass: a READ or WRITE of
    /// one SGE, or a CAS or FAA of one 8-byte SGE at an 8-byte aligned
    /// remote address ([`common_shape`]), inside an owned MR (which allows
    /// local writes for a READ or an atomic),
    /// to the destination of the transport, with either no grant known for
    /// its (target, rkey) while [`Precheck::ungranted`] allows that, or
    /// a known grant it satisfies
    /// ([`Self::grant_allows`], the very check [`Self::check_remote`]
    /// runs, so the grant is looked up once). `false` for anything else,
    /// which [`Self::check_wr`] then checks in full (so the verdict and the
    /// reason are exactly [`Self::check_wr`]'s: this only accepts what it
    /// would accept).
    #[inline(always)]
    fn common_wr_ok(&self, wr: &SendWr) -> bool {
        let Some((remote, op, sge)) = common_shape(wr, &self.policy) else {
            return false;
        };
        let target = match (self.transport, &wr.dest) {
            (QpKind::Dc, Destination::Dc(t)) => Some(t.gid),
            (QpKind::Rc, Destination::Connected) => self.peer,
            _ => return false,
        };
        let Some(mr) = self.local_mrs.lookup(sge.lkey) else {
            return false;
        };
        if !local_ok(sge, &mr, op) {
            return false;
        }
        let allow = self.ungranted == Ungranted::Allow;
        let Some(t) = target else {
            return allow;
        };
        match self.grants.lookup(&t, remote.rkey) {
            None => allow,
            Some(grant) => self
                .grant_allows(&grant, remote, op, u64::from(sge.length))
                .is_ok(),
        }
    }

    /// Only the capacity and signaling parts, (a) and (c): the batch's
    /// shape limits (non-empty, at most [`Policy::max_batch`]) and the
    /// [`Plan`], with no validity check of any WR. For an engine configured
    /// to skip validation (to show what the check protects against): the
    /// credit account stays exact, but a bad WR reaches the NIC.
    ///
    /// # Errors
    /// [`Reason::EmptyBatch`] and [`Reason::BatchTooLarge`].
    pub fn plan_unvalidated(&self, batch: &[SendWr]) -> Result<Plan, Rejection> {
        if batch.is_empty() {
            return Err(Rejection {
                index: 0,
                reason: Reason::EmptyBatch,
            });
        }
        let max = self.policy.max_batch(self.queue.depth);
        if batch.len() > max as usize {
            return Err(Rejection {
                index: max as usize,
                reason: Reason::BatchTooLarge {
                    len: batch.len(),
                    max,
                },
            });
        }
        Ok(self.plan(batch))
    }

    #[inline]
    fn plan(&self, batch: &[SendWr]) -> Plan {
        plan_batch(self.queue, &self.policy, batch)
    }

    #[inline]
    fn check_wr(&self, wr: &SendWr) -> Result<(), Reason> {
        let op = OpKind::of(&wr.op);
        let transport = self.transport;
        if !transport.allows(op) {
            return Err(Reason::OpNotAllowed { op, transport });
        }
        if !transport.destination_ok(&wr.dest) {
            return Err(Reason::WrongDestination { transport });
        }
        let sges = match &wr.payload {
            Payload::Inline(data) => {
                if !op.allows_inline() {
                    return Err(Reason::InlineNotAllowed { op });
                }
                let (len, max) = (data.as_slice().len(), self.policy.max_inline);
                if len > max {
                    return Err(Reason::InlineTooLarge { len, max });
                }
                &[][..]
            }
            Payload::Local(sg) => {
                let sges = sg.as_slice();
                let (count, max) = (sges.len(), self.policy.max_sge);
                if count > max {
                    return Err(Reason::TooManySges { count, max });
                }
                sges
            }
        };
        if let WrOp::CompareSwap { remote, .. } | WrOp::FetchAdd { remote, .. } = wr.op {
            if sges.len() != 1 || sges[0].length != 8 {
                return Err(Reason::AtomicSgeLength {
                    sges: sges.len(),
                    len: wr.payload.len(),
                });
            }
            if remote.addr % 8 != 0 {
                return Err(Reason::AtomicMisaligned { addr: remote.addr });
            }
        }
        for (i, sge) in sges.iter().enumerate() {
            let mr = self
                .local_mrs
                .lookup(sge.lkey)
                .ok_or(Reason::LkeyNotOwned {
                    sge: i,
                    lkey: sge.lkey,
                })?;
            let inside = sge.addr >= mr.addr
                && match (
                    sge.addr.checked_add(u64::from(sge.length)),
                    mr.addr.checked_add(mr.len),
                ) {
                    (Some(end), Some(mr_end)) => end <= mr_end,
                    _ => false,
                };
            if !inside {
                return Err(Reason::SgeOutOfBounds {
                    sge: i,
                    addr: sge.addr,
                    length: sge.length,
                    mr_addr: mr.addr,
                    mr_len: mr.len,
                });
            }
            if op.writes_locally() && !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(Reason::LocalWriteMissing {
                    sge: i,
                    lkey: sge.lkey,
                    op,
                });
            }
        }
        self.check_remote(wr, op)
    }

    fn check_remote(&self, wr: &SendWr, op: OpKind) -> Result<(), Reason> {
        let (Some(remote), Some(_)) = (wr.op.remote(), op.remote_access()) else {
            return Ok(());
        };
        let target = match wr.dest {
            Destination::Dc(t) => Some(t.gid),
            Destination::Connected => self.peer,
            Destination::Ud(_) => None,
        };
        let Some(grant) = target.and_then(|t| self.grants.lookup(&t, remote.rkey)) else {
            return match self.ungranted {
                Ungranted::Allow => Ok(()),
                Ungranted::Refuse => Err(Reason::NotGranted {
                    rkey: remote.rkey,
                    addr: remote.addr,
                }),
            };
        };
        let len = if wr.op.is_atomic() {
            8
        } else {
            wr.payload.len()
        };
        self.grant_allows(&grant, remote, op, len)
    }

    /// Whether the known `grant` allows `op` on `len` bytes at `remote`:
    /// not expired, the access `op` needs, and the range inside the grant.
    /// `op` must be one-sided (it needs a remote access).
    #[inline(always)]
    fn grant_allows(
        &self,
        grant: &RemoteGrant,
        remote: RemoteAddr,
        op: OpKind,
        len: u64,
    ) -> Result<(), Reason> {
        if op.remote_access().is_none() {
            return Ok(());
        }
        if grant.expires_at.is_some_and(|t| self.now >= t) {
            return Err(Reason::GrantExpired { rkey: remote.rkey });
        }
        grant_covers(grant, remote, op, len)
    }
}

/// The shape of the common WR ([`Precheck::common_wr_ok`]): on a QP that
/// takes SGEs, a READ or WRITE of exactly one SGE, or a CAS or FAA of
/// exactly one 8-byte SGE at an 8-byte aligned remote address (what
/// [`Precheck::check_wr`] demands of an atomic, so that the SGE's length is
/// also the 8 bytes its grant check covers); its remote address, opcode
/// and SGE. `None` for anything else.
#[inline(always)]
pub(crate) fn common_shape<'w>(
    wr: &'w SendWr,
    policy: &Policy,
) -> Option<(RemoteAddr, OpKind, &'w krcore_nic::Sge)> {
    if policy.max_sge == 0 {
        return None;
    }
    common_shape_of(wr)
}

/// [`common_shape`] without the policy's part: for a caller that checked
/// `policy.max_sge > 0` once for a whole batch.
#[inline(always)]
pub(crate) fn common_shape_of(wr: &SendWr) -> Option<(RemoteAddr, OpKind, &krcore_nic::Sge)> {
    let (remote, op) = match wr.op {
        WrOp::Read { remote } => (remote, OpKind::Read),
        WrOp::Write { remote } => (remote, OpKind::Write),
        WrOp::CompareSwap { remote, .. } => return atomic_shape(wr, remote, OpKind::CompareSwap),
        WrOp::FetchAdd { remote, .. } => return atomic_shape(wr, remote, OpKind::FetchAdd),
        _ => return None,
    };
    Some((remote, op, single_sge(wr)?))
}

/// [`common_shape_of`] for an atomic `op` at `remote`: one 8-byte SGE
/// (its grant check covers 8 bytes, the SGE's length), 8-byte aligned
/// remotely (`check_wr`'s own two checks).
#[inline(always)]
fn atomic_shape(
    wr: &SendWr,
    remote: RemoteAddr,
    op: OpKind,
) -> Option<(RemoteAddr, OpKind, &krcore_nic::Sge)> {
    let sge = single_sge(wr)?;
    if sge.length != 8 || remote.addr % 8 != 0 {
        return None;
    }
    Some((remote, op, sge))
}

/// The SGE of a WR with exactly one.
#[inline(always)]
fn single_sge(wr: &SendWr) -> Option<&krcore_nic::Sge> {
    match &wr.payload {
        Payload::Local(sg) => sg.single(),
        Payload::Inline(_) => None,
    }
}

/// What the engine's fast path knows of the grants a batch's WRs fall
/// under (see [`fast_wr_ok`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum FastGrants<'a> {
    /// The VQP knows no grant at all: remote ranges are left to the NIC,
    /// as the full pre-check leaves them with [`NoGrants`].
    None,
    /// The VQP's grant memo for the batch's target (the target was
    /// compared by the caller): every WR must name `rkey`; `grant` is what
    /// the VQP knows for (target, `rkey`) (`None`: no grant known, left to
    /// the NIC), not expired. Built by [`FastGrants::memo`], which checks
    /// the expiry.
    Memo {
        /// The rkey of the memo.
        rkey: u32,
        /// The VQP's grant for it, if any.
        grant: Option<&'a RemoteGrant>,
    },
}

impl<'a> FastGrants<'a> {
    /// The memo of `rkey`, for which the VQP knows `grant` (or none);
    /// `None` when that grant has expired at `now()` (read only for a
    /// grant with an expiry, once per batch): every WR the fast path takes
    /// names `rkey`, so the general path decides the whole batch.
    #[inline(always)]
    pub(crate) fn memo(
        rkey: u32,
        grant: Option<&'a RemoteGrant>,
        now: impl FnOnce() -> Instant,
    ) -> Option<FastGrants<'a>> {
        if let Some(t) = grant.and_then(|g| g.expires_at) {
            if now() >= t {
                return None;
            }
        }
        Some(FastGrants::Memo { rkey, grant })
    }
}

/// The engine's fast path's verdict on one WR (`SharedQp::post_fast`, `crate::sharedqp`):
/// the common shape ([`common_shape_of`]: a READ or WRITE of one SGE, a
/// CAS or FAA of one 8-byte SGE at an aligned remote address), its SGE
/// inside one of the `window`s (MRs the pre-check last looked up, which
/// allow local writes: [`MrWindows::holds`]), and its remote range within what
/// `grants` says ([`FastGrants`]: nothing known, or the memo's grant for
/// its rkey, not expired ([`FastGrants::memo`]), giving the access and
/// range ([`grant_covers`], the pre-check's own)). `true` only for a WR
/// [`Precheck::check_wr`] accepts (destination set by the caller to the
/// transport's, grants as `grants` says); `false` sends the batch to the
/// general path, which decides.
#[inline(always)]
pub(crate) fn fast_wr_ok(wr: &SendWr, window: &MrWindows, grants: &FastGrants<'_>) -> bool {
    let Some((remote, op, sge)) = common_shape_of(wr) else {
        return false;
    };
    if !window.holds(sge) {
        return false;
    }
    match grants {
        FastGrants::None => true,
        FastGrants::Memo { rkey, grant } => {
            if remote.rkey != *rkey {
                return false;
            }
            match grant {
                None => true,
                Some(grant) => grant_covers(grant, remote, op, u64::from(sge.length)).is_ok(),
            }
        }
    }
}

/// One owned MR as the engine's fast path checks SGEs against it: its
/// lkey and bounds. Only an MR that allows local writes (so a READ or an
/// atomic may land in it as well as a WRITE leave it) and whose end does not wrap
/// around has a window: any other is never the fast path's (the general
/// path judges its WRs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrWindow {
    lkey: u32,
    lo: u64,
    hi: u64,
}

impl MrWindow {
    /// A window that holds no SGE (`lo > hi`: an SGE inside would end
    /// before it starts).
    const NONE: MrWindow = MrWindow {
        lkey: 0,
        lo: u64::MAX,
        hi: 0,
    };

    /// The window of `mr`, registered under `lkey`; `None` when its end
    /// wraps around or it does not allow local writes.
    #[inline(always)]
    pub(crate) fn of(lkey: u32, mr: &LocalMr) -> Option<MrWindow> {
        if !mr.access.contains(Access::LOCAL_WRITE) {
            return None;
        }
        Some(MrWindow {
            lkey,
            lo: mr.addr,
            hi: mr.addr.checked_add(mr.len)?,
        })
    }

    /// [`local_ok`] for an SGE of a READ, a WRITE, a CAS or a FAA whose
    /// lkey is this MR's: the same verdict for all (the MR allows local
    /// writes).
    #[inline(always)]
    pub(crate) fn holds(&self, sge: &krcore_nic::Sge) -> bool {
        // `end` cannot wrap: `addr <= hi` and `length < 2^32`, but an MR
        // near the top of the address space could; checked all the same.
        let Some(end) = sge.addr.checked_add(u64::from(sge.length)) else {
            return false;
        };
        sge.lkey == self.lkey && sge.addr >= self.lo && end <= self.hi
    }
}

/// The fast path's MR windows: the last two distinct MRs the pre-check
/// looked up that have one ([`MrWindow::of`]), the most recent first (a
/// VQP's READs land in its buffer's MR and, with the SDK, its atomics in a
/// scratch MR of their own: one window would send every switch between
/// them to the general path).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrWindows {
    recent: MrWindow,
    older: MrWindow,
}

impl MrWindows {
    /// The windows of `w` alone.
    #[inline]
    pub(crate) fn one(w: MrWindow) -> MrWindows {
        MrWindows {
            recent: w,
            older: MrWindow::NONE,
        }
    }

    /// `w` made the most recent (replacing its lkey's window if held; the
    /// older one otherwise goes).
    #[inline]
    pub(crate) fn with(self, w: MrWindow) -> MrWindows {
        let older = if w.lkey == self.recent.lkey {
            self.older
        } else {
            self.recent
        };
        MrWindows { recent: w, older }
    }

    /// [`MrWindow::holds`] by either window.
    #[inline(always)]
    pub(crate) fn holds(&self, sge: &krcore_nic::Sge) -> bool {
        self.recent.holds(sge) || self.older.holds(sge)
    }
}

/// Whether `sge` lies inside `mr` (its MR) and `mr` allows what `op` does
/// to it locally: [`Precheck::check_wr`]'s verdict on one SGE.
#[inline(always)]
pub(crate) fn local_ok(sge: &krcore_nic::Sge, mr: &LocalMr, op: OpKind) -> bool {
    let end = sge.addr.wrapping_add(u64::from(sge.length));
    let mr_end = mr.addr.wrapping_add(mr.len);
    let inside = sge.addr >= mr.addr && end >= sge.addr && mr_end >= mr.addr && end <= mr_end;
    inside && (!op.writes_locally() || mr.access.contains(Access::LOCAL_WRITE))
}

/// Whether the known `grant` gives the access one-sided `op` needs and
/// holds the `len` bytes at `remote` (its expiry is the caller's).
#[inline(always)]
pub(crate) fn grant_covers(
    grant: &RemoteGrant,
    remote: RemoteAddr,
    op: OpKind,
    len: u64,
) -> Result<(), Reason> {
    let Some(needed) = op.remote_access() else {
        return Ok(());
    };
    if !grant.access.contains(needed) {
        return Err(Reason::RemoteAccessMissing {
            rkey: remote.rkey,
            op,
        });
    }
    let inside = remote.addr >= grant.addr
        && match (
            remote.addr.checked_add(len),
            grant.addr.checked_add(grant.len),
        ) {
            (Some(end), Some(grant_end)) => end <= grant_end,
            _ => false,
        };
    if !inside {
        return Err(Reason::RemoteOutOfGrant {
            addr: remote.addr,
            len,
            grant_addr: grant.addr,
            grant_len: grant.len,
        });
    }
    Ok(())
}

/// Parts (a) and (c) of the pre-check for an accepted `batch` (non-empty,
/// at most [`Policy::max_batch`]) on `queue`: credits to reclaim, and the
/// forced signal when the batch would leave too long an unsignaled tail.
#[inline]
pub(crate) fn plan_batch(queue: QueueView, policy: &Policy, batch: &[SendWr]) -> Plan {
    let n = batch.len() as u32;
    let credits_short = n.saturating_sub(queue.free);
    let max = policy.effective_max_unsignaled(queue.depth);
    let run_after = match batch.iter().rposition(SendWr::is_signaled) {
        Some(k) => n - 1 - k as u32,
        None => queue.unsignaled_tail + n,
    };
    if run_after > max {
        Plan {
            credits_short,
            force_signal: Some(batch.len() - 1),
            unsignaled_after: 0,
        }
    } else {
        Plan {
            credits_short,
            force_signal: None,
            unsignaled_after: run_after,
        }
    }
}

#[cfg(test)]
mod tests;
