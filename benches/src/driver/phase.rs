//! What the threads of a phase share, below both of their loops (the
//! sequential one in `run`, the batched one in `batched`): the phase's
//! options, the pacer of `-target`, and the per-operation accounting
//! (retries, statuses, the thread's first error).

use super::{BackendError, Found};
use crate::ycsb::{Measurements, Operation, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to run a phase.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Client threads.
    pub threads: usize,
    /// Base RNG seed (thread `i` uses `seed + i`).
    pub seed: u64,
    /// Show a progress bar with live ops/s (only when stderr is a terminal).
    pub progress: bool,
    /// Called once every client thread has its client, just before the
    /// phase's clock starts: a multi-process driver's barrier.
    pub gate: Option<Gate>,
    /// The id of thread 0 among every writer of the run (thread `i` is
    /// `writer + i`): it tags the values written, so that every write of
    /// the run writes different bytes.
    pub writer: u64,
    /// Whether the run phase logs its writes ([`PhaseResult::writes`](super::PhaseResult::writes), for
    /// [`super::verify`]).
    pub log_writes: bool,
    /// Checked before every operation: once set (a signal, or the first
    /// error with `fail_fast`), every thread stops; the phase reports what
    /// was done.
    pub stop: Option<Arc<AtomicBool>>,
    /// Sets `stop` at the first failed operation (a dead memory node ends
    /// the run at once instead of failing every later operation).
    pub fail_fast: bool,
    /// YCSB's `-target`: operations per second of the whole phase (of
    /// this process), each thread paced at its share; `None`: as fast as
    /// the backend goes.
    pub target: Option<f64>,
    /// YCSB's `-s`: a status line on stderr at this interval (YCSB's
    /// format: time, seconds, operations, current ops/s, estimated
    /// completion), and one at the end.
    pub status: Option<Duration>,
    /// Operations each thread keeps in flight ([`super::KvClient::batch`]);
    /// 1: one at a time.
    pub batch: usize,
}

impl RunOptions {
    pub(crate) fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    pub(crate) fn note(&self, status: Status) {
        if self.fail_fast && status == Status::Error {
            if let Some(s) = &self.stop {
                s.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// A barrier hook for [`RunOptions::gate`]; an `Err` aborts the phase with
/// [`PhaseError::Gate`](super::PhaseError::Gate).
#[derive(Clone)]
pub struct Gate(pub Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate(..)")
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: 1,
            seed: 0x5eed,
            progress: true,
            gate: None,
            writer: 0,
            log_writes: false,
            stop: None,
            fail_fast: false,
            target: None,
            status: None,
            batch: 1,
        }
    }
}

/// Paces one thread at `rate` operations per second (YCSB's `-target`):
/// operation `n` starts no earlier than `n / rate` after the phase began.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pacer {
    start: Instant,
    per_op: Option<f64>,
}

impl Pacer {
    pub(crate) fn new(opts: &RunOptions, start: Instant) -> Pacer {
        let threads = opts.threads.max(1) as f64;
        Pacer {
            start,
            per_op: opts
                .target
                .filter(|t| *t > 0.0 && t.is_finite())
                .map(|t| threads / t),
        }
    }

    /// Waits until operation `n` is due.
    pub(crate) fn wait(&self, n: u64) {
        let Some(per_op) = self.per_op else {
            return;
        };
        let due = self.start + Duration::from_secs_f64(n as f64 * per_op);
        loop {
            let now = Instant::now();
            if now >= due {
                return;
            }
            let left = due - now;
            if left > Duration::from_micros(200) {
                std::thread::sleep(left - Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Operations a thread does between two updates of the shared counter
/// (progress bar, status lines).
pub(crate) const COUNT_EVERY: u64 = 64;

/// Adds the store's restarted attempts across one write (`before` and
/// `after` its call) to `op`'s `Retries`, when the backend counts them.
#[inline]
pub(crate) fn count_retries(
    m: &mut Measurements,
    op: Operation,
    before: Option<u64>,
    after: Option<u64>,
) {
    if let (Some(b), Some(a)) = (before, after) {
        m.add_retries(op, a.saturating_sub(b));
    }
}

thread_local! {
    static FIRST_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub(crate) fn status_of(r: Result<Found, BackendError>) -> Status {
    match r {
        Ok(Found::Yes) => Status::Ok,
        Ok(Found::No) => Status::NotFound,
        Err(e) => {
            FIRST_ERROR.with(|f| {
                let mut f = f.borrow_mut();
                if f.is_none() {
                    *f = Some(e.to_string());
                }
            });
            Status::Error
        }
    }
}

/// The first error this thread recorded, cleared.
pub(crate) fn take_first_error() -> Option<String> {
    FIRST_ERROR.with(|f| f.borrow_mut().take())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_spaces_each_threads_operations_by_its_share_of_the_target() {
        let start = Instant::now();
        let opts = RunOptions {
            threads: 4,
            target: Some(1000.0),
            ..RunOptions::default()
        };
        // 4 threads at 1000 ops/s: each thread one op per 4 ms.
        let p = Pacer::new(&opts, start);
        assert_eq!(p.per_op, Some(0.004));
        for bad in [None, Some(0.0), Some(-1.0), Some(f64::INFINITY)] {
            let o = RunOptions {
                target: bad,
                ..RunOptions::default()
            };
            assert_eq!(Pacer::new(&o, start).per_op, None, "{bad:?}: unpaced");
        }
    }
}
