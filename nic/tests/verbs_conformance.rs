//! The provider conformance suite on a real verbs device (Soft-RoCE in CI).
//!
//! Every test is `#[ignore]`: it needs a device. Run them inside the
//! Soft-RoCE guest (see `ci/verbs.sh`):
//!
//! ```text
//! KRCORE_TEST_DEVICE=rxe0 KRCORE_TEST_GID_INDEX=1 \
//!   cargo test -p krcore-nic --features verbs --test verbs_conformance -- --ignored --test-threads=1
//! ```
//!
//! `KRCORE_TEST_GID_INDEX` defaults to `SOFTROCE_GID_INDEX` (set in the
//! guest), else 0. Each test opens the device twice: two contexts are two
//! nodes with the same GID.
#![cfg(feature = "verbs")]

use krcore_nic::conformance as suite;
use krcore_nic::verbs::VerbsNic;
use krcore_nic::Nic;

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
            fn $name() {
                let (a, b) = pair();
                suite::$name(&a, &b);
            }
        )*
    };
}

conformance!(
    rc_read_write,
    rc_atomics,
    rc_send_recv,
    srq_shared,
    ud_datagrams,
    rnr,
    send_credits,
    state_machine,
    doorbell_batching,
    sub_regions,
);

/// The suite's `error_completions`, with rxe's one quirk: its user-space
/// provider checks atomic alignment while building the WQE and refuses the
/// post with EINVAL (the sim, like mlx5, completes it with `REM_INV_REQ`).
/// The verbs provider reports what the device did rather than fabricate a
/// completion. (A responder QP that enters ERR after a NAK, as on any real
/// RC connection, is handled by the suite itself.)
#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn error_completions() {
    let (a, b) = pair();
    let quirks = suite::Quirks {
        misaligned_atomic_refused_at_post: a.name().starts_with("rxe"),
    };
    suite::error_completions_with(&a, &b, quirks);
}

#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn cq_overflow() {
    let (a, b) = pair();
    suite::cq_overflow(&a, &b);
}

#[test]
#[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
fn dc_ops() {
    let (a, b) = pair();
    if !(a.caps().dc && b.caps().dc) {
        eprintln!("verbs: {} has no DC; dc_ops skipped", device().0);
        return;
    }
    suite::dc_ops(&a, &b);
}

/// Behaviour of the verbs provider beyond the shared suite.
mod specific {
    use super::*;
    use krcore_nic::conformance::{poll_n, poll_one, rc_pair, Side, WAIT};
    use krcore_nic::verbs::VerbsError;
    use krcore_nic::*;

    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn open_errors_are_typed() {
        let (name, _) = device();
        match VerbsNic::open("no-such-rdma-dev", 0) {
            Err(VerbsError::UnknownDevice { name: n, found }) => {
                assert_eq!(n, "no-such-rdma-dev");
                assert!(found.contains(&name), "{found:?} lists {name}");
            }
            other => panic!("expected UnknownDevice, got {other:?}"),
        }
        let e = VerbsNic::open(&name, 250).unwrap_err();
        assert!(
            matches!(e, VerbsError::BadGidIndex { index: 250, .. }),
            "{e}"
        );
        // Converted into the provider error, the typed error stays reachable.
        let n: NicError = VerbsError::NoDevice.into();
        let NicError::Os { source, .. } = &n else {
            panic!("{n:?}")
        };
        assert!(source
            .get_ref()
            .and_then(|e| e.downcast_ref::<VerbsError>())
            .is_some());
    }

    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn dc_is_unsupported_without_dc() {
        let a = open();
        if a.name().starts_with("rxe") {
            assert!(!a.caps().dc, "Soft-RoCE has no DC");
        }
        if a.caps().dc {
            eprintln!("verbs: {} has DC; nothing to check here", a.name());
            return;
        }
        let s = Side::new(&a, 4096);
        let srq = a.create_srq(&s.pd, 8, 1).unwrap();
        for (t, srq) in [(QpType::Dci, None), (QpType::Dct, Some(&srq))] {
            let r = a.create_qp(
                &s.pd,
                &QpInit {
                    qp_type: t,
                    caps: QpCaps::default(),
                    send_cq: &s.cq,
                    recv_cq: &s.cq,
                    srq,
                    dc_key: 7,
                },
            );
            assert!(matches!(r, Err(NicError::Unsupported(_))), "{t:?}: {r:?}");
        }
        assert_eq!(a.counters().qps_created, 0);
    }

    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn flushed_receives_keep_their_wr_ids() {
        let (a, b) = pair();
        let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
        let (qa, qb) = rc_pair(&sa, &sb, QpCaps::default());
        qb.post_recv(&[
            RecvWr::new(100, sb.mr.sge(0, 64).unwrap()),
            RecvWr::new(101, sb.mr.sge(64, 64).unwrap()),
            RecvWr::new(102, sb.mr.sge(128, 64).unwrap()),
        ])
        .unwrap();
        // One receive consumed normally, on a CQ that also gets qb's sends.
        qa.post_send(&[SendWr::send(1, sa.mr.sge(0, 8).unwrap(), Some(5))])
            .unwrap();
        assert_eq!(poll_one(&sa.cq).wr_id, 1);
        let wc = poll_one(&sb.cq);
        assert_eq!(
            (wc.wr_id, wc.imm, wc.status),
            (100, Some(5), WcStatus::Success)
        );
        qb.post_send(&[SendWr::read(7, sb.mr.sge(512, 8).unwrap(), sa.mr.remote(0))])
            .unwrap();
        assert_eq!(poll_one(&sb.cq).wr_id, 7);
        qb.modify(Transition::Err).unwrap();
        let mut got: Vec<(u64, WcStatus)> = poll_n(&sb.cq, 2)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        got.sort_by_key(|g| g.0);
        assert_eq!(
            got,
            vec![(101, WcStatus::WrFlushErr), (102, WcStatus::WrFlushErr)]
        );
    }

    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn caller_memory_and_counters() {
        let (a, b) = pair();
        let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
        let before = a.counters();
        let mut buf = vec![0u8; 8192].into_boxed_slice();
        // SAFETY: `buf` outlives `mr` (dropped at the end of this scope, after
        // it) and is only read through the MR's copying accessors meanwhile.
        let mr =
            unsafe { a.register_mr(&sa.pd, buf.as_mut_ptr(), buf.len(), Access::ALL) }.unwrap();
        let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
        sb.mr.write(0, b"into caller memory").unwrap();
        qa.post_send(&[SendWr::read(1, mr.sge(4000, 18).unwrap(), sb.mr.remote(0))])
            .unwrap();
        assert_eq!(poll_one(&sa.cq).status, WcStatus::Success);
        let mut got = [0u8; 18];
        mr.read(4000, &mut got).unwrap();
        assert_eq!(&got, b"into caller memory");
        let bad = SendWr::read(2, mr.sge(0, 8).unwrap(), sb.mr.remote(4090));
        qa.post_send(&[bad]).unwrap();
        assert_eq!(poll_one(&sa.cq).status, WcStatus::RemAccessErr);
        let d = a.counters() - before;
        assert_eq!(d.qps_created, 1, "{d:?}");
        assert_eq!(d.mrs_registered, 1);
        assert_eq!((d.reads, d.bytes_read, d.doorbells), (2, 26, 2));
        assert_eq!(d.error_completions, 1);
        assert!(d.state_changes >= 3, "INIT, RTR, RTS: {d:?}");
        drop(qa);
        assert_eq!((a.counters() - before).qps_destroyed, 1);
        drop(mr);
        drop(buf);
    }

    /// An RC pair on two devices with a 4-deep send queue (credits run out
    /// all the time), an 8-byte word and a 64-byte buffer on `sa`'s MR, and
    /// a counter at offset 0 of `sb`'s.
    struct Shallow {
        sa: Side<VerbsNic>,
        sb: Side<VerbsNic>,
        qa: <VerbsNic as Nic>::Qp,
        /// The peer QP, only kept alive.
        _qb: <VerbsNic as Nic>::Qp,
        word: Sge,
        data: Sge,
        counter: RemoteAddr,
    }

    impl Shallow {
        fn new() -> Shallow {
            let (a, b) = pair();
            let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
            let caps = QpCaps {
                max_send_wr: 4,
                ..QpCaps::default()
            };
            let (qa, qb) = rc_pair(&sa, &sb, caps);
            let (word, data) = (sa.mr.sge(64, 8).unwrap(), sa.mr.sge(128, 64).unwrap());
            let counter = sb.mr.remote(0);
            Shallow {
                sa,
                sb,
                qa,
                _qb: qb,
                word,
                data,
                counter,
            }
        }
    }

    /// The send ring is written by the posting thread and read by another,
    /// polling thread without the QP's send lock. One poster (single WRs
    /// and two-WR chains, every third WR unsignaled, a 4-deep send queue so
    /// that credits run out all the time) and one poller on another thread.
    /// Reference check: every signaled WR completes exactly once, in order,
    /// with its own `wr_id` and opcode; every FAA landed once.
    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn send_ring_across_threads() {
        use std::time::Instant;
        const N: u64 = 1200;
        let f = Shallow::new();
        // WR `i`: FAA, READ or WRITE by `i % 3`; WRITEs (i % 3 == 2) are
        // unsignaled except the last one, so that it frees the queue.
        let wr = |i: u64| {
            let w = match i % 3 {
                0 => SendWr::faa(i, f.word, f.counter, 1),
                1 => SendWr::read(i, f.data, f.sb.mr.remote(256)),
                _ => SendWr::write(i, f.data, f.sb.mr.remote(512)),
            };
            w.signaled(i % 3 != 2 || i == N - 1)
        };
        let op = |i: u64| match i % 3 {
            0 => WcOpcode::FetchAdd,
            1 => WcOpcode::RdmaRead,
            _ => WcOpcode::RdmaWrite,
        };
        let signaled: Vec<u64> = (0..N).filter(|&i| wr(i).is_signaled()).collect();
        std::thread::scope(|s| {
            let poller = s.spawn(|| {
                let start = Instant::now();
                let mut got = Vec::new();
                let mut wc = [Wc::default(); 4];
                while got.len() < signaled.len() {
                    let n = f.sa.cq.poll(&mut wc).expect("poll");
                    for w in &wc[..n] {
                        assert_eq!(w.status, WcStatus::Success, "{w:?}");
                        assert_eq!(w.opcode, op(w.wr_id), "{w:?}");
                        got.push(w.wr_id);
                    }
                    assert!(start.elapsed() < WAIT * 6, "{} completions", got.len());
                }
                got
            });
            let start = Instant::now();
            let mut i = 0;
            while i < N {
                // Every seventh post is a two-WR chain (one doorbell).
                let chain: Vec<SendWr> = if i % 7 == 0 && i + 1 < N {
                    vec![wr(i), wr(i + 1)]
                } else {
                    vec![wr(i)]
                };
                match f.qa.post_send(&chain) {
                    Ok(()) => i += chain.len() as u64,
                    Err(PostError {
                        index,
                        kind: PostErrorKind::QueueFull { .. },
                    }) => {
                        i += index as u64;
                        assert!(start.elapsed() < WAIT * 6, "no credits at {i}");
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("post {i}: {e}"),
                }
            }
            assert_eq!(poller.join().expect("poller"), signaled);
        });
        let mut v = [0u8; 8];
        f.sb.mr.read(0, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), N.div_ceil(3), "every FAA once");
    }

    /// Two threads poll ONE CQ while a third posts to a 4-deep send queue
    /// (credits run out all the time, so every freed slot is reused at
    /// once): the case where a completion one poller had taken from the
    /// device could be dropped because the other poller's later completion
    /// freed (and the poster reused) its slot. Reference check: every
    /// signaled WR completes exactly once, with its own `wr_id` and opcode,
    /// each poller sees them in order, and every FAA landed once.
    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn two_pollers_one_cq() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Instant;
        const N: u64 = 1500;
        let f = Shallow::new();
        // WR `i`: FAA or READ by parity; every fifth unsignaled (not the
        // last), so that completions also free the slots before them.
        let wr = |i: u64| {
            let w = if i % 2 == 0 {
                SendWr::faa(i, f.word, f.counter, 1)
            } else {
                SendWr::read(i, f.data, f.sb.mr.remote(256))
            };
            w.signaled(i % 5 != 4 || i == N - 1)
        };
        let op = |i: u64| {
            if i % 2 == 0 {
                WcOpcode::FetchAdd
            } else {
                WcOpcode::RdmaRead
            }
        };
        let signaled: Vec<u64> = (0..N).filter(|&i| wr(i).is_signaled()).collect();
        let total = AtomicUsize::new(0);
        let start = Instant::now();
        let per_poller: Vec<Vec<u64>> = std::thread::scope(|s| {
            let pollers: Vec<_> = (0..2)
                .map(|_| {
                    let (sa, total, signaled) = (&f.sa, &total, &signaled);
                    s.spawn(move || {
                        let mut got = Vec::new();
                        let mut wc = [Wc::default(); 2];
                        while total.load(Ordering::Acquire) < signaled.len() {
                            let n = sa.cq.poll(&mut wc).expect("poll");
                            for w in &wc[..n] {
                                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                                assert_eq!(w.opcode, op(w.wr_id), "{w:?}");
                                got.push(w.wr_id);
                            }
                            total.fetch_add(n, Ordering::AcqRel);
                            assert!(
                                start.elapsed() < WAIT * 6,
                                "{} of {} completions",
                                total.load(Ordering::Acquire),
                                signaled.len()
                            );
                        }
                        got
                    })
                })
                .collect();
            let mut i = 0;
            while i < N {
                match f.qa.post_send(&[wr(i)]) {
                    Ok(()) => i += 1,
                    Err(PostError {
                        kind: PostErrorKind::QueueFull { .. },
                        ..
                    }) => {
                        assert!(start.elapsed() < WAIT * 6, "no credits at {i}");
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("post {i}: {e}"),
                }
            }
            pollers
                .into_iter()
                .map(|p| p.join().expect("poller"))
                .collect()
        });
        for got in &per_poller {
            assert!(got.windows(2).all(|w| w[0] < w[1]), "in order per poller");
        }
        let mut all: Vec<u64> = per_poller.concat();
        all.sort_unstable();
        assert_eq!(all, signaled, "every signaled WR exactly once");
        assert_eq!(f.qa.send_credits(), 4, "every credit back");
        let mut v = [0u8; 8];
        f.sb.mr.read(0, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), N.div_ceil(2), "every FAA once");
    }

    /// The threads of this process: `(tid, comm)`.
    fn threads() -> Vec<(u32, String)> {
        let mut v: Vec<(u32, String)> = std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(|e| {
                let e = e.ok()?;
                let tid = e.file_name().to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
                Some((tid, comm.trim_end().to_string()))
            })
            .collect();
        v.sort();
        v
    }

    /// The provider starts no thread: opening two contexts, making a CQ,
    /// QPs, connecting and polling (empty and not) leaves the process's
    /// threads as they were. Robust to other test threads running at the
    /// same time: a thread the provider started would be new and either
    /// carry a `krcore` name or inherit this thread's name (an unnamed
    /// thread inherits its creator's `comm`), while threads of other tests
    /// carry their own tests' names.
    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn opening_a_device_starts_no_thread() {
        let me = std::fs::read_to_string("/proc/thread-self/comm")
            .expect("/proc/thread-self/comm")
            .trim_end()
            .to_string();
        let before = threads();
        assert!(before.iter().any(|t| t.1 == me), "{me:?} in {before:?}");
        let (a, b) = pair();
        let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
        let (qa, _qb) = rc_pair(&sa, &sb, QpCaps::default());
        let mut wc = [Wc::default(); 4];
        for _ in 0..10_000 {
            assert_eq!(sa.cq.poll(&mut wc).unwrap(), 0);
        }
        qa.post_send(&[SendWr::read(1, sa.mr.sge(0, 8).unwrap(), sb.mr.remote(0))])
            .unwrap();
        assert_eq!(poll_one(&sa.cq).wr_id, 1);
        a.read_async_events();
        let after = threads();
        let new: Vec<&(u32, String)> = after.iter().filter(|t| !before.contains(t)).collect();
        let ours: Vec<&&(u32, String)> = new
            .iter()
            .filter(|t| t.1 == me || t.1.starts_with("krcore"))
            .collect();
        assert!(
            ours.is_empty(),
            "the provider started threads {ours:?} (all new: {new:?})"
        );
        assert!(
            !after.iter().any(|t| t.1.starts_with("krcore-verbs")),
            "{after:?}"
        );
    }

    /// `read_async_events` reads the overflow event at once: after it has
    /// read the device's `IBV_EVENT_CQ_ERR`, the overflowed CQ's very first
    /// poll that finds nothing left to return reports `CqOverflow` (no
    /// empty poll in between, so no periodic read was needed).
    #[test]
    #[ignore = "needs an RDMA device: set KRCORE_TEST_DEVICE (ci/verbs.sh runs it on Soft-RoCE)"]
    fn read_async_events_reports_overflow_at_once() {
        use std::time::{Duration, Instant};
        let (a, b) = pair();
        let (sa, sb) = (Side::new(&a, 4096), Side::new(&b, 4096));
        assert_eq!(a.read_async_events(), 0, "nothing queued on a new context");
        let (small, depth, _qa, _qb) = krcore_nic::conformance::overflowing_cq(&sa, &sb);
        // Without polling (no periodic read), until the event is read.
        let start = Instant::now();
        let mut events = 0;
        while events == 0 {
            assert!(start.elapsed() < WAIT, "no async event after overflow");
            std::thread::sleep(Duration::from_millis(1));
            events += a.read_async_events();
        }
        let mut wc = vec![Wc::default(); depth as usize * 2];
        let mut got = 0;
        loop {
            match small.poll(&mut wc) {
                Ok(0) => panic!("an empty poll after the overflow event was read ({got} polled)"),
                Ok(n) => got += n,
                Err(NicError::CqOverflow { .. }) => break,
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert!(got < depth as usize * 2, "overflow lost completions");
        assert!(small.poll(&mut wc).is_err(), "overflow is sticky");
    }
}

// ---------------------------------------------------------------------------
// Device selection

/// The device and GID index from `KRCORE_TEST_DEVICE` and
/// `KRCORE_TEST_GID_INDEX` (default: `SOFTROCE_GID_INDEX`, else 0).
///
/// # Panics
/// When `KRCORE_TEST_DEVICE` is unset: these tests are `#[ignore]`d and
/// only run on request, so a missing device is a setup error to report.
pub fn device() -> (String, u8) {
    let name = std::env::var("KRCORE_TEST_DEVICE").unwrap_or_else(|_| {
        panic!(
            "KRCORE_TEST_DEVICE is not set: name an RDMA device (e.g. rxe0), \
             or run ci/verbs.sh, which runs these tests on Soft-RoCE"
        )
    });
    let idx = std::env::var("KRCORE_TEST_GID_INDEX")
        .or_else(|_| std::env::var("SOFTROCE_GID_INDEX"))
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u8>()
                .unwrap_or_else(|_| panic!("bad GID index {s:?}"))
        })
        .unwrap_or(0);
    (name, idx)
}

/// Opens the test device once.
pub fn open() -> VerbsNic {
    let (name, idx) = device();
    VerbsNic::open(&name, idx).unwrap_or_else(|e| panic!("open {name} (GID index {idx}): {e}"))
}

/// Two contexts of the test device: two nodes.
pub fn pair() -> (VerbsNic, VerbsNic) {
    (open(), open())
}
