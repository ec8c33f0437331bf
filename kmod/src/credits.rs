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
//! posts from 0. A ring of `depth` entries remembers each outstanding WR's
//! [`PhysWrId`] and signaled flag, so that a completion can be matched and the
//! WRs it covers (including other VQPs' unsignaled WRs) reported back.
//!
//! # Invariants
//!
//! - `head <= covered.max(head) <= tail` and `tail - head <= depth`:
//!   `head..tail` are the outstanding WRs, oldest first. `free = depth -
//!   (tail - head)`.
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

use crate::wrid::PhysWrId;

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

/// The credit account of one physical send queue.
#[derive(Clone)]
pub struct SendQueueCredits {
    /// A power of two at least `depth` long (indexing is a mask, not a
    /// division); only `depth` entries are ever outstanding.
    ring: Box<[PostedWr]>,
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

impl fmt::Debug for SendQueueCredits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueueCredits")
            .field("depth", &self.depth())
            .field("head", &self.head)
            .field("tail", &self.tail)
            .field("unsignaled_tail", &self.unsignaled_tail())
            .finish()
    }
}

impl SendQueueCredits {
    /// The account of an empty queue of `depth` slots.
    ///
    /// # Panics
    /// If `depth` is 0 (a configuration bug).
    pub fn new(depth: u32) -> SendQueueCredits {
        assert!(depth > 0, "a send queue needs at least one slot");
        let empty = PostedWr {
            wr_id: PhysWrId::from_raw(0),
            signaled: false,
        };
        SendQueueCredits {
            ring: vec![empty; (depth as usize).next_power_of_two()].into_boxed_slice(),
            depth,
            head: 0,
            tail: 0,
            covered: 0,
            signaled_posted: 0,
            signaled_done: 0,
        }
    }

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
    pub fn view(&self) -> QueueView {
        QueueView {
            depth: self.depth(),
            free: self.free(),
            unsignaled_tail: self.unsignaled_tail(),
        }
    }

    #[inline]
    fn index(&self, seq: u64) -> usize {
        (seq as usize) & (self.ring.len() - 1)
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
        if n > self.free() as usize {
            return Err(CreditError::WouldOverrun {
                requested: n,
                free: self.free(),
            });
        }
        let first = self.tail;
        for wr in wrs {
            let i = self.index(self.tail);
            self.ring[i] = wr;
            self.tail += 1;
            if wr.signaled {
                self.covered = self.tail;
                self.signaled_posted += 1;
            }
        }
        // An iterator that lies about its length must not break the account.
        assert_eq!(self.tail - first, n as u64, "ExactSizeIterator lied");
        Ok(first..self.tail)
    }

    /// [`SendQueueCredits::post`] for WRs exactly as they go to the NIC.
    ///
    /// # Errors
    /// As [`SendQueueCredits::post`].
    #[inline]
    pub fn post_wrs(&mut self, wrs: &[SendWr]) -> Result<Range<u64>, CreditError> {
        // `post` over a slice, without the iterator's length check.
        let n = wrs.len();
        if n > self.free() as usize {
            return Err(CreditError::WouldOverrun {
                requested: n,
                free: self.free(),
            });
        }
        let first = self.tail;
        let mask = self.ring.len() - 1;
        for (i, wr) in wrs.iter().enumerate() {
            let seq = first + i as u64;
            let posted = PostedWr::of(wr);
            self.ring[(seq as usize) & mask] = posted;
            if posted.signaled {
                self.covered = seq + 1;
                self.signaled_posted += 1;
            }
        }
        self.tail = first + n as u64;
        Ok(first..self.tail)
    }

    /// The record of an outstanding sequence.
    pub fn get(&self, seq: u64) -> Option<PostedWr> {
        (self.head..self.tail)
            .contains(&seq)
            .then(|| self.ring[self.index(seq)])
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
            if self.ring[self.index(newest)].wr_id == wr_id {
                return Some(newest);
            }
        }
        (self.head..self.tail).find(|&s| self.ring[self.index(s)].wr_id == wr_id)
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
    pub fn complete(&mut self, seq: u64, status: WcStatus) -> Result<Retired<'_>, CreditError> {
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
        let signaled = self.ring[self.index(seq)].signaled;
        if status.is_ok() && !signaled {
            return Err(CreditError::UnsignaledSuccess { seq });
        }
        // The usual case: the newest signaled WR, the only one outstanding
        // (no scan needed). Otherwise look for an earlier signaled WR.
        let only_newest = seq + 1 == self.covered && self.signaled_posted - self.signaled_done == 1;
        if !only_newest {
            if let Some(pending) = (self.head..seq).find(|&s| self.ring[self.index(s)].signaled) {
                return Err(CreditError::OutOfOrder { seq, pending });
            }
        }
        // No signaled WR before `seq` is outstanding: at most `seq` itself
        // is credited as signaled.
        self.signaled_done += u64::from(signaled);
        let from = self.head;
        self.head = seq + 1;
        Ok(Retired {
            ring: &self.ring,
            next: from,
            end: seq + 1,
        })
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
    ) -> Result<Retired<'_>, CreditError> {
        let seq = self
            .locate(wr_id)
            .ok_or(CreditError::UnknownWrId { wr_id })?;
        self.complete(seq, status)
    }

    /// Credits every outstanding WR: the QP was reset (RESET discards
    /// outstanding work without completions). The returned WRs were not all
    /// executed; recovery decides which to re-post.
    pub fn reset(&mut self) -> Retired<'_> {
        let from = self.head;
        self.head = self.tail;
        self.signaled_done = self.signaled_posted;
        Retired {
            ring: &self.ring,
            next: from,
            end: self.tail,
        }
    }
}

/// WRs credited by one completion, oldest first, with their sequences.
#[derive(Debug)]
pub struct Retired<'a> {
    ring: &'a [PostedWr],
    next: u64,
    end: u64,
}

impl Iterator for Retired<'_> {
    type Item = (u64, PostedWr);

    fn next(&mut self) -> Option<(u64, PostedWr)> {
        if self.next == self.end {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        Some((seq, self.ring[(seq as usize) & (self.ring.len() - 1)]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Retired<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrid::VqpId;
    use std::collections::VecDeque;

    fn wr(vqp: u32, seq: u64, signaled: bool) -> PostedWr {
        PostedWr {
            wr_id: PhysWrId::new(VqpId::new(vqp).unwrap(), seq),
            signaled,
        }
    }

    #[test]
    fn post_and_credit_through_a_signaled_completion() {
        let mut q = SendQueueCredits::new(8);
        let seqs = q
            .post([
                wr(1, 0, false),
                wr(2, 0, false),
                wr(1, 1, true),
                wr(2, 1, false),
            ])
            .unwrap();
        assert_eq!(seqs, 0..4);
        assert_eq!(q.free(), 4);
        assert_eq!(q.unsignaled_tail(), 1);
        assert_eq!(q.reclaimable(), 3);
        let done: Vec<_> = q.complete(2, WcStatus::Success).unwrap().collect();
        // The unsignaled WRs of both VQPs before it are known complete.
        assert_eq!(
            done,
            vec![
                (0, wr(1, 0, false)),
                (1, wr(2, 0, false)),
                (2, wr(1, 1, true))
            ]
        );
        assert_eq!(q.free(), 7);
        assert_eq!(q.unsignaled_tail(), 1);
        assert_eq!(q.reclaimable(), 0);
        assert_eq!(
            q.view(),
            QueueView {
                depth: 8,
                free: 7,
                unsignaled_tail: 1
            }
        );
    }

    #[test]
    fn overrun_is_refused_whole() {
        let mut q = SendQueueCredits::new(4);
        q.post([wr(1, 0, true), wr(1, 1, true), wr(1, 2, true)])
            .unwrap();
        let err = q.post([wr(1, 3, true), wr(1, 4, true)]).unwrap_err();
        assert_eq!(
            err,
            CreditError::WouldOverrun {
                requested: 2,
                free: 1
            }
        );
        assert_eq!(q.next_seq(), 3);
        assert_eq!(q.post([wr(1, 3, true)]).unwrap(), 3..4);
        assert_eq!(q.free(), 0);
        assert_eq!(q.post([]).unwrap(), 4..4);
    }

    #[test]
    fn double_credit_and_unposted_are_refused() {
        let mut q = SendQueueCredits::new(4);
        q.post([wr(1, 0, true), wr(1, 1, true)]).unwrap();
        q.complete(0, WcStatus::Success).unwrap();
        assert_eq!(
            q.complete(0, WcStatus::Success).unwrap_err(),
            CreditError::AlreadyCredited { seq: 0, head: 1 }
        );
        assert_eq!(
            q.complete(2, WcStatus::Success).unwrap_err(),
            CreditError::NotPosted { seq: 2, tail: 2 }
        );
        assert_eq!(q.free(), 3);
    }

    #[test]
    fn success_on_unsignaled_is_impossible() {
        let mut q = SendQueueCredits::new(4);
        q.post([wr(1, 0, false), wr(1, 1, true)]).unwrap();
        assert_eq!(
            q.complete(0, WcStatus::Success).unwrap_err(),
            CreditError::UnsignaledSuccess { seq: 0 }
        );
        assert_eq!(q.outstanding(), 2);
    }

    #[test]
    fn completion_may_not_overtake_a_signaled_wr() {
        let mut q = SendQueueCredits::new(4);
        q.post([wr(1, 0, true), wr(2, 0, true)]).unwrap();
        assert_eq!(
            q.complete(1, WcStatus::Success).unwrap_err(),
            CreditError::OutOfOrder { seq: 1, pending: 0 }
        );
        assert_eq!(
            q.complete(1, WcStatus::WrFlushErr).unwrap_err(),
            CreditError::OutOfOrder { seq: 1, pending: 0 }
        );
        assert_eq!(q.outstanding(), 2);
    }

    #[test]
    fn error_completion_of_an_unsignaled_wr_credits_through_it() {
        let mut q = SendQueueCredits::new(8);
        q.post([
            wr(1, 0, false),
            wr(2, 0, false),
            wr(3, 0, false),
            wr(1, 1, true),
        ])
        .unwrap();
        // WR 1 (VQP 2) failed: 0 succeeded silently, 1 reports the error.
        let done: Vec<_> = q
            .complete(1, WcStatus::RemAccessErr)
            .unwrap()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(done, vec![0, 1]);
        // Then the rest is flushed, each with its own completion.
        assert_eq!(q.complete(2, WcStatus::WrFlushErr).unwrap().len(), 1);
        assert_eq!(q.complete(3, WcStatus::WrFlushErr).unwrap().len(), 1);
        assert_eq!(q.free(), 8);
        assert_eq!(q.unsignaled_tail(), 0);
    }

    #[test]
    fn complete_by_wr_id() {
        let mut q = SendQueueCredits::new(4);
        let wrs = [wr(1, 0, false), wr(2, 7, true)];
        q.post(wrs).unwrap();
        assert_eq!(q.locate(wrs[1].wr_id), Some(1));
        assert_eq!(
            q.complete_wr_id(wrs[1].wr_id, WcStatus::Success)
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            q.complete_wr_id(wrs[1].wr_id, WcStatus::Success)
                .unwrap_err(),
            CreditError::UnknownWrId {
                wr_id: wrs[1].wr_id
            }
        );
    }

    #[test]
    fn post_wrs_reads_the_nic_view() {
        use krcore_nic::{RemoteAddr, Sge};
        let mut q = SendQueueCredits::new(4);
        let id = PhysWrId::new(VqpId::new(3).unwrap(), 9);
        let w = SendWr::read(id.raw(), Sge::default(), RemoteAddr::default());
        q.post_wrs(&[w.signaled(false), w]).unwrap();
        assert_eq!(
            q.get(0),
            Some(PostedWr {
                wr_id: id,
                signaled: false
            })
        );
        assert_eq!(
            q.get(1),
            Some(PostedWr {
                wr_id: id,
                signaled: true
            })
        );
        assert_eq!(q.get(2), None);
    }

    #[test]
    fn reset_credits_everything() {
        let mut q = SendQueueCredits::new(4);
        q.post([wr(1, 0, false), wr(1, 1, false)]).unwrap();
        assert_eq!(q.unsignaled_tail(), 2);
        assert_eq!(q.reset().map(|(s, _)| s).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(q.free(), 4);
        assert_eq!(q.unsignaled_tail(), 0);
        assert_eq!(q.next_seq(), 2);
    }

    /// Random posts and in-order completions against a `VecDeque` reference,
    /// over many laps of the ring.
    #[test]
    fn model_against_a_reference_queue() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let depth = 16;
        let mut q = SendQueueCredits::new(depth);
        let mut reference: VecDeque<(u64, PostedWr)> = VecDeque::new();
        let mut seq = 0;
        for _ in 0..20_000 {
            if next() % 2 == 0 {
                let n = (next() % 6) as usize;
                let batch: Vec<PostedWr> = (0..n)
                    .map(|i| wr((next() % 4) as u32 + 1, seq + i as u64, next() % 3 == 0))
                    .collect();
                match q.post(batch.iter().copied()) {
                    Ok(r) => {
                        assert!(n <= depth as usize - reference.len());
                        for (i, w) in batch.into_iter().enumerate() {
                            reference.push_back((r.start + i as u64, w));
                        }
                        seq += n as u64;
                    }
                    Err(CreditError::WouldOverrun { requested, free }) => {
                        assert_eq!(requested, n);
                        assert_eq!(free as usize, depth as usize - reference.len());
                        assert!(n > free as usize);
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            } else if let Some(pos) = reference.iter().position(|(_, w)| w.signaled) {
                // The NIC completes the oldest signaled WR.
                let (s, _) = reference[pos];
                let got: Vec<_> = q.complete(s, WcStatus::Success).unwrap().collect();
                let want: Vec<_> = reference.drain(..=pos).collect();
                assert_eq!(got, want);
            }
            let tail_run = reference
                .iter()
                .rev()
                .take_while(|(_, w)| !w.signaled)
                .count();
            assert_eq!(q.outstanding() as usize, reference.len());
            assert_eq!(q.unsignaled_tail() as usize, tail_run);
            assert_eq!(q.reclaimable() as usize, reference.len() - tail_run);
        }
        assert!(seq > 4 * depth as u64, "the ring wrapped several times");
    }
}
