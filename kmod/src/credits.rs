//! Send-queue credits of one physical QP, as a pure state machine.
//!
//! A physical QP has `depth` (`max_send_wr`) send-queue slots. The NIC frees a
//! slot only when a *signaled* completion at or after it is polled; unsignaled
//! WRs therefore hold their slots until a later signaled WR completes, and
//! posting into a full queue fails. Many VQPs share the QP, so the engine keeps
//! its own account, [`SendQueueCredits`], and consults it before every post
//! (the capacity part of the pre-check) instead of letting the NIC refuse.
//!
//! Every posted WR gets a *physical sequence*, a `u64` counting the QP's
//! posts from 0. A ring of records remembers each outstanding WR's
//! [`PhysWrId`] and signaled flag ([`Posted`]), so that a completion can be
//! matched and the WRs it covers (including other VQPs' unsignaled WRs)
//! reported back. The record is generic: [`PostedWr`] holds just these two;
//! the engine keeps the whole [`SendWr`] as posted, so that the record is
//! also what the doorbell rings on and what recovery re-posts
//! ([`SendQueueCredits::stage`] then [`SendQueueCredits::commit`]), and
//! gives each WR the physical wr_id `(VQP, physical sequence)`, so that a
//! completion finds its record without a scan
//! ([`SendQueueCredits::resolve`]).
//!
//! # Invariants
//!
//! - `head <= covered.max(head) <= tail` and `tail - head <= depth`:
//!   `head..tail` are the outstanding WRs, oldest first. `free = depth -
//!   (tail - head)`. The record of sequence `s` is at `s mod L` (`L` a
//!   power of two at least `depth`); staging writes only records of free
//!   slots, so an outstanding record is never overwritten.
//! - A completion at sequence `s` credits exactly `head..=s`, once:
//!   completing `s < head` ([`CreditError::AlreadyCredited`]) or `s >= tail`
//!   ([`CreditError::NotPosted`]) is refused and changes nothing, so credits
//!   are never counted twice nor past what was posted.
//! - Completions arrive in send-queue order (as on hardware): a successful
//!   completion is only possible for a signaled WR, and no signaled WR before
//!   `s` may still be outstanding (its completion would have come first).
//!   Either violation is a typed error that changes nothing.
//! - The *unsignaled tail* is the run of outstanding WRs after the newest
//!   signaled one: WRs that no pending completion will free. The pre-check
//!   keeps it at most `max_unsignaled < depth`, so a full queue always holds
//!   a signaled WR and polling always makes progress.

use std::fmt;
use std::ops::Range;

use krcore_nic::{SendWr, WcStatus};

use crate::wrid::{PhysWrId, SEQ_MASK};

/// Errors of the credit engine. Each one means the caller's view of the queue
/// is inconsistent with the NIC's; none of them changes the engine's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// Posting `requested` WRs would overrun the `free` slots.
    #[error("posting {requested} WRs would overrun the send queue ({free} credits free)")]
    WouldOverrun {
        /// WRs in the post.
        requested: usize,
        /// Credits free.
        free: u32,
    },
    /// A completion for a sequence that was already credited.
    #[error(
        "completion for sequence {seq} which was already credited (oldest outstanding: {head})"
    )]
    AlreadyCredited {
        /// The completed sequence.
        seq: u64,
        /// Oldest outstanding sequence.
        head: u64,
    },
    /// A completion for a sequence that was never posted.
    #[error("completion for sequence {seq} which was never posted (next sequence: {tail})")]
    NotPosted {
        /// The completed sequence.
        seq: u64,
        /// Next sequence to be posted.
        tail: u64,
    },
    /// A successful completion for an unsignaled WR.
    #[error("successful completion for unsignaled WR at sequence {seq}")]
    UnsignaledSuccess {
        /// The completed sequence.
        seq: u64,
    },
    /// A completion that overtakes an earlier signaled WR still outstanding.
    #[error("completion for sequence {seq} overtakes signaled WR {pending} still outstanding")]
    OutOfOrder {
        /// The completed sequence.
        seq: u64,
        /// The earlier signaled WR.
        pending: u64,
    },
    /// A completion whose wr_id matches no outstanding WR.
    #[error("completion for {wr_id:?} matches no outstanding WR")]
    UnknownWrId {
        /// The completion's wr_id.
        wr_id: PhysWrId,
    },
}

/// What the account needs to know of one posted WR: its physical wr_id and
/// whether it was posted signaled. The account is generic over the record
/// it keeps per WR: [`PostedWr`] (just these two), or, in the engine, the
/// whole [`SendWr`] as posted (the one record per WR that also serves as
/// the doorbell's memory and recovery's copy, see [`SendQueueCredits::stage`]).
pub trait Posted {
    /// The physical wr_id it was posted with.
    fn wr_id(&self) -> PhysWrId;
    /// Whether it was posted signaled (after the pre-check's forcing).
    fn signaled(&self) -> bool;
}

/// What the engine remembers about one posted WR.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PostedWr {
    /// The physical wr_id it was posted with.
    pub wr_id: PhysWrId,
    /// Whether it was posted signaled (after the pre-check's forcing).
    pub signaled: bool,
}

impl PostedWr {
    /// The record of a WR as it goes to the NIC (its `wr_id` already physical).
    pub fn of(wr: &SendWr) -> PostedWr {
        PostedWr {
            wr_id: PhysWrId::from_raw(wr.wr_id),
            signaled: wr.is_signaled(),
        }
    }
}

impl Posted for PostedWr {
    #[inline]
    fn wr_id(&self) -> PhysWrId {
        self.wr_id
    }
    #[inline]
    fn signaled(&self) -> bool {
        self.signaled
    }
}

impl Posted for SendWr {
    #[inline]
    fn wr_id(&self) -> PhysWrId {
        PhysWrId::from_raw(self.wr_id)
    }
    #[inline]
    fn signaled(&self) -> bool {
        self.is_signaled()
    }
}

/// A snapshot of a physical send queue, the input of the pre-check.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QueueView {
    /// Send-queue depth (`max_send_wr`).
    pub depth: u32,
    /// Slots free now.
    pub free: u32,
    /// Outstanding WRs after the newest signaled one (see the module docs).
    pub unsignaled_tail: u32,
}

/// The credit account of one physical send queue, keeping one record `R`
/// per outstanding WR (see [`Posted`]).
#[derive(Clone)]
pub struct SendQueueCredits<R = PostedWr> {
    /// `L + spare` records: sequence `s` lives at `s mod L` (`L`: a power
    /// of two at least `depth`; indexing is a mask, not a division); only
    /// `depth` are ever outstanding. The `spare` records past `L` let a
    /// staged batch stay contiguous where the ring wraps
    /// ([`SendQueueCredits::stage`]).
    ring: Box<[R]>,
    /// `L - 1`.
    mask: usize,
    depth: u32,
    /// Oldest outstanding sequence.
    head: u64,
    /// Next sequence to post.
    tail: u64,
    /// One past the newest signaled sequence ever posted (0: none).
    covered: u64,
    /// Signaled WRs ever posted, and ever credited: their difference is
    /// the signaled WRs outstanding (lets the usual completion, of the
    /// newest signaled WR, skip the scan for an earlier one).
    signaled_posted: u64,
    signaled_done: u64,
}

impl<R> fmt::Debug for SendQueueCredits<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueueCredits")
            .field("depth", &self.depth)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .field("covered", &self.covered)
            .finish()
    }
}

impl SendQueueCredits<PostedWr> {
    /// The account of an empty queue of `depth` slots.
    ///
    /// # Panics
    /// If `depth` is 0 (a configuration bug).
    pub fn new(depth: u32) -> SendQueueCredits {
        let empty = PostedWr {
            wr_id: PhysWrId::from_raw(0),
            signaled: false,
        };
        SendQueueCredits::with_records(depth, 0, empty)
    }

    /// Records a doorbell of WRs, all or nothing, and returns their sequences.
    ///
    /// # Errors
    /// [`CreditError::WouldOverrun`] when more WRs than free credits are given;
    /// nothing is recorded then.
    pub fn post<I>(&mut self, wrs: I) -> Result<Range<u64>, CreditError>
    where
        I: IntoIterator<Item = PostedWr>,
        I::IntoIter: ExactSizeIterator,
    {
        let wrs = wrs.into_iter();
        let n = wrs.len();
        self.check_room(n)?;
        let first = self.tail;
        let mut written = 0u64;
        for wr in wrs {
            // Never past the announced length (a lying iterator).
            if written == n as u64 {
                break;
            }
            let i = self.index(first + written);
            self.ring[i] = wr;
            written += 1;
        }
        // An iterator that lies about its length must not break the account.
        assert_eq!(written, n as u64, "ExactSizeIterator lied");
        Ok(self.account(n))
    }

    /// [`SendQueueCredits::post`] for WRs exactly as they go to the NIC.
    ///
    /// # Errors
    /// As [`SendQueueCredits::post`].
    #[inline]
    pub fn post_wrs(&mut self, wrs: &[SendWr]) -> Result<Range<u64>, CreditError> {
        self.check_room(wrs.len())?;
        let first = self.tail;
        for (i, wr) in wrs.iter().enumerate() {
            let at = self.index(first + i as u64);
            self.ring[at] = PostedWr::of(wr);
        }
        Ok(self.account(wrs.len()))
    }
}

impl<R: Posted + Clone> SendQueueCredits<R> {
    /// The account of an empty queue of `depth` slots, its records
    /// initialized to `empty`, with `spare` extra records for staging
    /// batches of up to `spare + 1` WRs contiguously
    /// ([`SendQueueCredits::stage`]).
    ///
    /// # Panics
    /// If `depth` is 0 (a configuration bug).
    pub fn with_records(depth: u32, spare: u32, empty: R) -> SendQueueCredits<R> {
        assert!(depth > 0, "a send queue needs at least one slot");
        let len = (depth as usize).next_power_of_two();
        SendQueueCredits {
            ring: vec![empty; len + spare as usize].into_boxed_slice(),
            mask: len - 1,
            depth,
            head: 0,
            tail: 0,
            covered: 0,
            signaled_posted: 0,
            signaled_done: 0,
        }
    }
}

impl<R: Posted> SendQueueCredits<R> {
    /// Send-queue depth.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// WRs posted and not yet credited.
    pub fn outstanding(&self) -> u32 {
        (self.tail - self.head) as u32
    }

    /// Credits (slots) free.
    pub fn free(&self) -> u32 {
        self.depth() - self.outstanding()
    }

    /// Outstanding WRs after the newest signaled one: no pending completion
    /// will free them.
    pub fn unsignaled_tail(&self) -> u32 {
        (self.tail - self.covered.max(self.head)) as u32
    }

    /// Slots that polling can reclaim: outstanding WRs covered by a signaled
    /// WR.
    pub fn reclaimable(&self) -> u32 {
        self.outstanding() - self.unsignaled_tail()
    }

    /// The oldest outstanding sequence.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The sequence the next posted WR gets.
    pub fn next_seq(&self) -> u64 {
        self.tail
    }

    /// The snapshot the pre-check takes.
    #[inline]
    pub fn view(&self) -> QueueView {
        let outstanding = (self.tail - self.head) as u32;
        QueueView {
            depth: self.depth,
            free: self.depth - outstanding,
            unsignaled_tail: (self.tail - self.covered.max(self.head)) as u32,
        }
    }

    #[inline]
    fn index(&self, seq: u64) -> usize {
        (seq as usize) & self.mask
    }

    #[inline]
    fn check_room(&self, n: usize) -> Result<(), CreditError> {
        if n > self.free() as usize {
            return Err(CreditError::WouldOverrun {
                requested: n,
                free: self.free(),
            });
        }
        Ok(())
    }

    /// Counts the `n` records written at `tail..` as posted.
    #[inline]
    fn account(&mut self, n: usize) -> Range<u64> {
        let first = self.tail;
        for seq in first..first + n as u64 {
            if self.ring[(seq as usize) & self.mask].signaled() {
                self.covered = seq + 1;
                self.signaled_posted += 1;
            }
        }
        self.tail = first + n as u64;
        first..self.tail
    }

    /// The record of an outstanding sequence.
    pub fn get(&self, seq: u64) -> Option<R>
    where
        R: Clone,
    {
        (self.head..self.tail)
            .contains(&seq)
            .then(|| self.ring[self.index(seq)].clone())
    }

    /// The record kept for `seq`, outstanding or not: meaningful for the
    /// last `depth` sequences posted (e.g. those a completion just
    /// retired, [`SendQueueCredits::complete_range`]).
    #[inline]
    pub fn record(&self, seq: u64) -> &R {
        &self.ring[self.index(seq)]
    }

    /// Stages `n` WRs for posting: the records of sequences `tail..tail+n`,
    /// as ONE contiguous slice (past the ring's end, into the spare
    /// records, where it wraps), for the caller to fill and hand to the NIC
    /// as one doorbell. Nothing is posted until
    /// [`SendQueueCredits::commit`]; staging again overwrites.
    ///
    /// # Errors
    /// [`CreditError::WouldOverrun`] when fewer than `n` credits are free
    /// (the records of outstanding WRs are never overwritten), or the batch
    /// is longer than the spare records allow.
    #[inline]
    pub fn stage(&mut self, n: usize) -> Result<&mut [R], CreditError> {
        self.check_room(n)?;
        let at = self.index(self.tail);
        if at + n > self.ring.len() {
            return Err(CreditError::WouldOverrun {
                requested: n,
                free: (self.ring.len() - at) as u32,
            });
        }
        Ok(&mut self.ring[at..at + n])
    }

    /// Counts the first `n` staged records ([`SendQueueCredits::stage`])
    /// as posted (the NIC took them) and returns their sequences. Staged
    /// records past `n` are dropped.
    ///
    /// # Panics
    /// If `n` exceeds the free credits (more than was staged).
    #[inline]
    pub fn commit(&mut self, n: usize) -> Range<u64>
    where
        R: Clone,
    {
        assert!(n <= self.free() as usize, "commit past the staged records");
        let at = self.index(self.tail);
        let len = self.mask + 1;
        if at + n > len {
            // Staged past the ring's end: move that part to where the mask
            // finds it (those slots hold no outstanding WR: `n <= free`).
            let (front, back) = self.ring.split_at_mut(len);
            front[..at + n - len].clone_from_slice(&back[..at + n - len]);
        }
        self.account(n)
    }

    /// Every record, the spare ones included: an account made with no
    /// spare records has exactly `L` (a power of two), so that the record
    /// of sequence `s` is at `s & (len - 1)` of this slice. Only the
    /// records of free sequences (`tail..tail + free`) may be written,
    /// before [`SendQueueCredits::commit_placed`].
    #[inline(always)]
    pub(crate) fn ring_mut(&mut self) -> &mut [R] {
        &mut self.ring
    }

    /// Counts the first `n` records written in place
    /// ([`SendQueueCredits::ring_mut`], from the next sequence on) as
    /// posted.
    ///
    /// # Panics
    /// If `n` exceeds the free credits.
    #[inline]
    pub(crate) fn commit_placed(&mut self, n: usize) -> Range<u64> {
        assert!(n <= self.free() as usize, "commit past the free credits");
        self.account(n)
    }

    /// [`SendQueueCredits::commit_placed`] of `n` records written in place
    /// whose signaled ones the caller counted: `signaled` of them, the
    /// newest at index `newest`. The caller checked that `n` credits are
    /// free (checked again in debug builds only).
    #[inline]
    pub(crate) fn commit_placed_counted(
        &mut self,
        n: usize,
        signaled: u32,
        newest: Option<usize>,
    ) -> Range<u64> {
        debug_assert!(n <= self.free() as usize, "commit past the free credits");
        let first = self.tail;
        debug_assert_eq!(
            (first..first + n as u64)
                .filter(|&s| self.ring[self.index(s)].signaled())
                .count(),
            signaled as usize
        );
        if let Some(i) = newest {
            self.covered = first + i as u64 + 1;
        }
        self.signaled_posted += u64::from(signaled);
        self.tail = first + n as u64;
        first..self.tail
    }

    /// The sequence of the oldest outstanding WR posted with `wr_id` (the one
    /// a completion with that wr_id is for, since completions come in order).
    ///
    /// Physical wr_ids of outstanding WRs are unique (the engine's are:
    /// (VQP, sequence)), so the usual answer, the newest signaled WR when it
    /// is the only signaled one outstanding, is tried first, without a scan.
    pub fn locate(&self, wr_id: PhysWrId) -> Option<u64> {
        if self.covered > self.head && self.signaled_posted - self.signaled_done == 1 {
            let newest = self.covered - 1;
            if self.ring[self.index(newest)].wr_id() == wr_id {
                return Some(newest);
            }
        }
        (self.head..self.tail).find(|&s| self.ring[self.index(s)].wr_id() == wr_id)
    }

    /// The outstanding sequence of `wr_id` when physical wr_ids carry the
    /// low bits of the QP's own sequence ([`PhysWrId::wire_seq`], as the
    /// engine posts them): O(1), no scan. `None` when no outstanding WR has
    /// exactly that wr_id (a completion of an old incarnation, before a
    /// reset, matches nothing: its sequence is below `head`).
    #[inline]
    pub fn resolve(&self, wr_id: PhysWrId) -> Option<u64> {
        let delta = wr_id.wire_seq().wrapping_sub(self.head) & SEQ_MASK;
        if delta >= self.tail - self.head {
            return None;
        }
        let seq = self.head + delta;
        (self.ring[self.index(seq)].wr_id() == wr_id).then_some(seq)
    }

    /// [`SendQueueCredits::resolve`] then
    /// [`SendQueueCredits::complete_range`] of a SUCCESSFUL completion with
    /// `wr_id`, in one step and only if it completes the oldest
    /// outstanding WR or `any` is set: the sequence credited (with every
    /// outstanding one before it) and its record. `None` when the
    /// completion matches no outstanding signaled WR, is not the oldest
    /// (without `any`), or would overtake an earlier signaled WR; nothing
    /// changes then.
    #[inline(always)]
    pub(crate) fn retire_signaled(&mut self, wr_id: PhysWrId, any: bool) -> Option<(u64, &R)> {
        let head = self.head;
        let delta = wr_id.wire_seq().wrapping_sub(head) & SEQ_MASK;
        if delta >= self.tail - head || (delta != 0 && !any) {
            return None;
        }
        let seq = head + delta;
        let at = self.index(seq);
        let rec = &self.ring[at];
        if rec.wr_id() != wr_id || !rec.signaled() {
            return None;
        }
        // The usual case: the newest signaled WR, the only one outstanding
        // (no scan needed). Otherwise no earlier signaled WR may be
        // outstanding (its completion would have come first).
        let only_newest = seq + 1 == self.covered && self.signaled_posted - self.signaled_done == 1;
        if !only_newest && (head..seq).any(|s| self.ring[self.index(s)].signaled()) {
            return None;
        }
        self.signaled_done += 1;
        self.head = seq + 1;
        Some((seq, &self.ring[at]))
    }

    /// Applies a polled completion at sequence `seq` with `status`: credits
    /// every outstanding WR up to and including `seq`.
    ///
    /// The returned WRs completed, oldest first: all but the last
    /// successfully (they were unsignaled, or their completion would have come
    /// first); the last with `status`. The caller routes each to its VQP.
    ///
    /// # Errors
    /// The [`CreditError`] variants for an impossible completion (see the
    /// module invariants); nothing is credited then.
    pub fn complete(&mut self, seq: u64, status: WcStatus) -> Result<Retired<'_, R>, CreditError> {
        let range = self.complete_range(seq, status)?;
        Ok(Retired {
            ring: &self.ring,
            mask: self.mask,
            next: range.start,
            end: range.end,
        })
    }

    /// [`SendQueueCredits::complete`], returning the credited sequences
    /// (their records stay readable with [`SendQueueCredits::record`] until
    /// the next post).
    ///
    /// # Errors
    /// As [`SendQueueCredits::complete`].
    #[inline(always)]
    pub fn complete_range(
        &mut self,
        seq: u64,
        status: WcStatus,
    ) -> Result<Range<u64>, CreditError> {
        if seq < self.head {
            return Err(CreditError::AlreadyCredited {
                seq,
                head: self.head,
            });
        }
        if seq >= self.tail {
            return Err(CreditError::NotPosted {
                seq,
                tail: self.tail,
            });
        }
        let signaled = self.ring[self.index(seq)].signaled();
        if status.is_ok() && !signaled {
            return Err(CreditError::UnsignaledSuccess { seq });
        }
        // The usual case: the newest signaled WR, the only one outstanding
        // (no scan needed). Otherwise look for an earlier signaled WR.
        let only_newest = seq + 1 == self.covered && self.signaled_posted - self.signaled_done == 1;
        if !only_newest {
            if let Some(pending) = (self.head..seq).find(|&s| self.ring[self.index(s)].signaled()) {
                return Err(CreditError::OutOfOrder { seq, pending });
            }
        }
        // No signaled WR before `seq` is outstanding: at most `seq` itself
        // is credited as signaled.
        self.signaled_done += u64::from(signaled);
        let from = self.head;
        self.head = seq + 1;
        Ok(from..seq + 1)
    }

    /// [`SendQueueCredits::complete`] for a completion identified by its
    /// wr_id, as polled from the CQ.
    ///
    /// # Errors
    /// [`CreditError::UnknownWrId`] when no outstanding WR has `wr_id`, else
    /// as [`SendQueueCredits::complete`].
    pub fn complete_wr_id(
        &mut self,
        wr_id: PhysWrId,
        status: WcStatus,
    ) -> Result<Retired<'_, R>, CreditError> {
        let seq = self
            .locate(wr_id)
            .ok_or(CreditError::UnknownWrId { wr_id })?;
        self.complete(seq, status)
    }

    /// Credits every outstanding WR: the QP was reset (RESET discards
    /// outstanding work without completions). The returned WRs were not all
    /// executed; recovery decides which to re-post.
    pub fn reset(&mut self) -> Retired<'_, R> {
        let range = self.reset_range();
        Retired {
            ring: &self.ring,
            mask: self.mask,
            next: range.start,
            end: range.end,
        }
    }

    /// [`SendQueueCredits::reset`], returning the credited sequences (see
    /// [`SendQueueCredits::record`]).
    pub fn reset_range(&mut self) -> Range<u64> {
        let from = self.head;
        self.head = self.tail;
        self.signaled_done = self.signaled_posted;
        from..self.tail
    }
}

/// WRs credited by one completion, oldest first, with their sequences.
#[derive(Debug)]
pub struct Retired<'a, R = PostedWr> {
    ring: &'a [R],
    mask: usize,
    next: u64,
    end: u64,
}

impl<R: Clone> Iterator for Retired<'_, R> {
    type Item = (u64, R);

    fn next(&mut self) -> Option<(u64, R)> {
        if self.next == self.end {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        Some((seq, self.ring[(seq as usize) & self.mask].clone()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl<R: Clone> ExactSizeIterator for Retired<'_, R> {}

#[cfg(test)]
#[path = "credits_tests.rs"]
mod tests;
