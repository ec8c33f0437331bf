//! Tests of `credits.rs`.

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
fn resolve_across_the_40_bit_wrap() {
    // An account whose next sequence is just below 2^40.
    let first = (1u64 << crate::wrid::SEQ_BITS) - 2;
    let mut q = SendQueueCredits::new(8);
    (q.head, q.tail, q.covered) = (first, first, first);
    let vqp = VqpId::new(9).unwrap();
    let phys = |seq| PhysWrId::new(vqp, seq);
    let seqs = q
        .post((0..4u32).map(|i| PostedWr {
            wr_id: phys(first + u64::from(i)),
            signaled: true,
        }))
        .unwrap();
    assert_eq!(seqs, first..first + 4);
    // The last two wrapped: their sequence bits are 0 and 1.
    assert_eq!(phys(first + 3).wire_seq(), 1);
    for s in seqs {
        assert_eq!(q.resolve(phys(s)), Some(s));
    }
    // Low bits of a sequence that is not outstanding do not resolve,
    // nor does another VQP's wr_id with the right sequence bits.
    assert_eq!(q.resolve(phys(first + 4)), None);
    assert_eq!(q.resolve(phys(first - 1)), None);
    assert_eq!(
        q.resolve(PhysWrId::new(VqpId::new(8).unwrap(), first + 2)),
        None
    );
    assert_eq!(
        q.complete_range(first, WcStatus::Success),
        Ok(first..first + 1)
    );
    assert_eq!(
        q.complete_range(first + 1, WcStatus::Success),
        Ok(first + 1..first + 2)
    );
    assert_eq!(q.resolve(phys(first)), None);
    assert_eq!(q.resolve(phys(first + 2)), Some(first + 2));
    assert_eq!(q.resolve(phys(first + 3)), Some(first + 3));
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

fn rec(vqp: u32, seq: u64, signaled: bool) -> SendWr {
    use krcore_nic::{RemoteAddr, Sge};
    let id = PhysWrId::new(VqpId::new(vqp).unwrap(), seq);
    SendWr::read(id.raw(), Sge::default(), RemoteAddr::default()).signaled(signaled)
}

/// Staged batches stay contiguous where the ring wraps (in the spare
/// records), and after the commit every record is where its sequence
/// says; completions resolve by their sequence bits.
#[test]
fn staged_batches_wrap_contiguously_and_resolve_by_sequence() {
    let empty = rec(0, 0, false);
    let mut q = SendQueueCredits::with_records(6, 7, empty);
    let mut seq = 0u64;
    for lap in 0..20u64 {
        // Batches of 1..=5 WRs: every start position, every wrap.
        let n = (lap % 5 + 1) as usize;
        let first = q.next_seq();
        assert_eq!(first, seq);
        let staged = q.stage(n).unwrap();
        assert_eq!(staged.len(), n);
        for (i, r) in staged.iter_mut().enumerate() {
            *r = rec(1 + (lap % 3) as u32, first + i as u64, i + 1 == n);
        }
        assert_eq!(q.commit(n), first..first + n as u64);
        for s in first..first + n as u64 {
            assert_eq!(q.record(s).wr_id().wire_seq(), s);
            assert_eq!(q.get(s).map(|r| r.wr_id), Some(q.record(s).wr_id));
        }
        let last = *q.record(first + n as u64 - 1);
        assert_eq!(q.resolve(last.wr_id()), Some(first + n as u64 - 1));
        // Another VQP's id with the same sequence bits matches nothing.
        let other = PhysWrId::new(VqpId::new(9).unwrap(), first + n as u64 - 1);
        assert_eq!(q.resolve(other), None);
        let done = q.complete_range(first + n as u64 - 1, WcStatus::Success);
        assert_eq!(done, Ok(first..first + n as u64));
        // Credited: no longer resolves (a stale completion).
        assert_eq!(q.resolve(last.wr_id()), None);
        seq += n as u64;
    }
    assert!(seq > 4 * 8, "the ring wrapped several times");
}

#[test]
fn staging_never_overwrites_outstanding_records() {
    let mut q = SendQueueCredits::with_records(4, 3, rec(0, 0, false));
    let staged = q.stage(3).unwrap();
    for (i, r) in staged.iter_mut().enumerate() {
        *r = rec(1, i as u64, i == 2);
    }
    q.commit(3);
    assert_eq!(
        q.stage(2).unwrap_err(),
        CreditError::WouldOverrun {
            requested: 2,
            free: 1
        }
    );
    // A staged batch that is not committed is dropped.
    q.stage(1).unwrap()[0] = rec(2, 3, true);
    assert_eq!(q.commit(0), 3..3);
    assert_eq!(q.outstanding(), 3);
    assert_eq!(q.resolve(PhysWrId::new(VqpId::new(2).unwrap(), 3)), None);
    // Reset credits all three; their records stay readable.
    assert_eq!(q.reset_range(), 0..3);
    assert_eq!(q.record(1).wr_id().vqp().get(), 1);
    assert_eq!(q.free(), 4);
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
