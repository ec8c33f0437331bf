//! One shared physical QP: a DC initiator of the pool (DC mode) or the RC
//! QP of one (node, target) pair (RC fallback mode). Its send CQ, and behind
//! ONE lock (this QP's, never the engine's) its credit account, the VQPs
//! bound to it and its snapshot of the owned MRs. The pre-check, credits,
//! wr_id routing and recovery below are the same code for both transports;
//! only the destination, the pre-check's transport and how the QP is brought
//! back after an error differ ([`Link`]).
//!
//! # Locking
//!
//! ONE lock per physical QP, and nothing else on the data path: the state of
//! every VQP bound to the QP (count of WRs in flight, completion ring,
//! target, grants: [`VqpState`]) lives in the QP's state, in a table by VQP
//! id ([`VqpTable`]), beside the QP's records of its WRs. A post takes the
//! QP's lock once;
//! so does a poll (pop the VQP's ring; when that is not enough, drain the
//! CQ, routing each completion to its VQP's ring, and pop again). Nothing
//! here takes an engine-wide lock. RC fallback mode: a VQP's binding lock
//! (see [`super::vqp`]) is taken before a QP's lock, never after. (RC
//! recovery sends a handshake through the engine's handshake endpoint,
//! whose locks are leaves.)
//!
//! # The common case inline
//!
//! A post of READs/WRITEs of one SGE (or CASes/FAAs of one 8-byte SGE at
//! an aligned remote address) in one of the two MRs the pre-check last
//! looked up, on a DCI or an RC pair with room, is checked inline
//! ([`SharedQp::post_fast`]) and goes straight to the doorbell; anything
//! else takes the general path. A poll that reads this VQP's own success
//! retiring only this VQP's WRs is applied inline without routing
//! ([`crate::sharedqp::Poller::own`]); anything else is routed in full.
//!
//! # The protocol and its invariants
//!
//! The account of the send queue (one record per WR), the VQPs' states,
//! the routing of completions and the plan of a recovery are the pure
//! core [`SharedQp`] (`crate::sharedqp`, with the invariants): this host
//! holds it under the QP's lock, rings its doorbells on the NIC, polls
//! the CQ into it, and performs a recovery's NIC steps (reset, bring up,
//! for an RC pair the re-handshake with its target: the responder resets
//! and re-arms its end, see [`crate::handshake`]). If an RC target does
//! not answer, the pair is closed and every outstanding WR is reported
//! `WR_FLUSH_ERR` to its owner: its QP is destroyed and every later post
//! re-acquires a pair (and fails, typed, while the target is gone).
//!
//! - A closed RC pair (`qp` is `None`: evicted, or lost) accepts no post:
//!   posts see [`PostFail::Stale`] and re-bind their VQP. An RC pair only
//!   carries WRs of VQPs attached to it and connected to its target.

mod poll;
mod post;
mod qp;
mod recover;

pub(crate) use qp::{create_qp, PhysQp, PostFail, RcLink};
