//! The protocol of one shared physical QP, pure: the send queue's account
//! with ONE record per WR, the VQPs bound to the QP, the pre-check's
//! per-QP memos, the routing of completions to VQPs and the plan of a
//! recovery after an error. [`SharedQp`] is the state; its methods take
//! inputs (a batch, a completion, the MR generation, a clock) and say or
//! do what follows from them. It makes no NIC call and reads no clock:
//! the host (`crate::engine`'s `PhysQp`, one per DCI or RC pair) holds
//! it under the QP's one lock, polls the CQ and feeds each completion in,
//! and hands a post its doorbell (`ring`: the function that gives the
//! staged WRs to the NIC, called at most once, while the records are
//! staged and before they are committed, so that no completion can come
//! back for an unrecorded WR) and its clock (`now`, called only when a
//! grant with an expiry must be checked). The same core runs under loom
//! (`loom-tests/tests/shared_qp.rs`, `upgrade_switch.rs`) and in the
//! deterministic scenario tests below (`tests`), with a model NIC.
//!
//! # One record per WR
//!
//! Each WR on the QP has ONE record (`Rec`: its physical wr_id, whether
//! it was posted signaled, the user's wr_id and signal flag), at its
//! physical sequence (the QP's own count of posted WRs) in the account
//! `credits`. Two ways to post:
//!
//! - A VQP alone on the QP (every outstanding WR its own,
//!   `SharedQp::sole`, or none outstanding) posts in place: each WR gets
//!   its record only, the caller's WRs carry the physical wr_ids
//!   `(vqp, sequence)` (and the forced signal) to the NIC and get their
//!   own back right after the doorbell. No copy of the WR is kept: no
//!   recovery can re-post it (see `Rec::KEPT`).
//! - Otherwise the batch is copied into `SharedQp::copies` (at the same
//!   indices as the records, contiguous even where the ring wraps), the
//!   doorbell rings on the copies themselves, and recovery may re-post
//!   them.
//!
//! Either way the post commits what the NIC took: no per-VQP table, and
//! the caller's WRs are left as they were (but `dest`). A completion finds
//! its record by the sequence bits of its wr_id
//! ([`SendQueueCredits::resolve`](crate::credits::SendQueueCredits::resolve), O(1)), which also detects a completion
//! of an old incarnation (its sequence is below every outstanding one).
//!
//! # Invariants
//!
//! - Every WR on the QP was recorded in `credits` (in posting order, its
//!   record holding its user's wr_id and flag) and counted in its VQP's
//!   `outstanding` in the same `&mut` call that rang its doorbell.
//! - A completion retires, in order, every physical WR up to its own
//!   ([`SendQueueCredits::complete_range`](crate::credits::SendQueueCredits::complete_range)); each leaves its VQP's count
//!   once, and the completed one is delivered to its VQP's ring (or the
//!   poller's buffer, [`Sink`]) when the user signaled it or it failed.
//!   The earlier ones were unsignaled (or their completion would have come
//!   first), so their users did not ask for a completion either: the core
//!   only adds signals.
//! - After an error completion the QP is in ERR (`needs_recovery`). The
//!   failing WR's completion goes to its owner (the "guilty" VQP); the
//!   flush completions of the later WRs are not routed. The host resets
//!   the QP; [`SharedQp::reset`] then reports the guilty VQP's later WRs
//!   as `WR_FLUSH_ERR` (as its own QP would) and hands back every other
//!   VQP's outstanding WRs in their original order (they never executed:
//!   the NIC flushes, it does not execute, what follows a failed WR);
//!   once the host has brought the QP back, [`SharedQp::repost`] posts
//!   them again under NEW physical sequences (same user wr_ids), the last
//!   one forced signaled, or [`SharedQp::flush_all`] reports them flushed
//!   when the QP could not come back. Completions of the old incarnation
//!   that a CQ still returns after the reset (a delayed CQE) thus match no
//!   outstanding WR: they are counted stale and never start another
//!   recovery. Innocent VQPs see only their own results, each exactly
//!   once, in order. A dead target (`RETRY_EXC_ERR`) is the failing WR's
//!   typed status for its VQP, whose target is cleared and whose DCCache
//!   entry is invalidated.
//! - A VQP's state leaves the QP only with none of its WRs in flight there
//!   ([`SharedQp::detach_drained`]; a dropped VQP's WRs complete as
//!   orphans, [`SharedQp::detach`]), so a record always belongs to the
//!   VQP's current attachment.

mod recover;
mod route;
mod stage;
mod state;
#[cfg(test)]
mod tests;
mod vqps;

pub use recover::Reposts;
pub use route::Sink;
pub(crate) use state::MrSnapshot;
pub use state::{DciStats, Doorbell, QpShape, QpStats, Refusal, SharedQp};
pub use vqps::VqpState;
