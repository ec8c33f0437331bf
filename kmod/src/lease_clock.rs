//! A cheap upper bound of the time, for the post path's lease checks.
//!
//! A VQP that knows a grant with an expiry (a leased token) checks it on
//! every post. `Instant::now()` reads `CLOCK_MONOTONIC`, which is a system
//! call wherever the clocksource has no vDSO path (an HPET or ACPI PM
//! clocksource, as in many VMs: about 5.5 µs per read in the Soft-RoCE
//! guest, 7 % of a CAS round trip there). `CLOCK_MONOTONIC_COARSE` is read
//! in the vDSO on every clocksource, but it lags by up to one tick (its
//! resolution, 1-4 ms).
//!
//! [`now_upper_bound`] turns the coarse clock into an instant that is never
//! EARLIER than `Instant::now()` would have been: a lease the bound shows
//! live is live (the fast path may post on it); one it shows expired may
//! not be, so the caller then reads the precise clock (the general path
//! does). Posts within about one tick of a lease's end thus pay the precise
//! read; all others do not.
//!
//! # Why it is an upper bound
//!
//! Once per process, the coarse clock is read (`c0`), then `Instant::now()`
//! (`t0`). The coarse value at any moment `x` is the monotonic time of the
//! last tick: `x - res < coarse(x) <= x`. Let `a` be the moment `c0` was
//! read: `a <= t0` and `c0 > a - res`. Now, at `t`, with `c = coarse(t)`:
//! `t < c + res`, so `t - t0 <= t - a < c + res - c0`, that is
//! `t < t0 + (c - c0) + res`: the bound. (Both clocks are the kernel's
//! one monotonic timeline, which `Instant` reads on Linux; a preemption
//! between the two anchor reads only loosens the bound.) Elsewhere than on
//! Linux the bound is `Instant::now()` itself.

use std::time::Instant;

/// An instant not earlier than `Instant::now()` at the call (see the
/// module docs); on Linux read without a system call.
#[inline]
pub(crate) fn now_upper_bound() -> Instant {
    imp::now_upper_bound()
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use rustix::time::{clock_getres, clock_gettime, ClockId, Timespec};

    /// The anchor: a coarse reading, then the precise instant after it,
    /// and the coarse clock's resolution.
    struct Anchor {
        coarse: Duration,
        instant: Instant,
        res: Duration,
    }

    static ANCHOR: OnceLock<Anchor> = OnceLock::new();

    fn duration(t: Timespec) -> Duration {
        // A monotonic reading is never negative.
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }

    fn coarse() -> Duration {
        duration(clock_gettime(ClockId::MonotonicCoarse))
    }

    #[inline]
    pub(super) fn now_upper_bound() -> Instant {
        let a = ANCHOR.get_or_init(|| {
            let coarse = coarse();
            Anchor {
                coarse,
                instant: Instant::now(),
                res: duration(clock_getres(ClockId::MonotonicCoarse)),
            }
        });
        // (`saturating_sub`: the coarse clock never goes back, but a
        // bound may only err late.)
        a.instant + coarse().saturating_sub(a.coarse) + a.res
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::time::Instant;

    #[inline]
    pub(super) fn now_upper_bound() -> Instant {
        Instant::now()
    }
}

#[cfg(test)]
mod tests {
    use super::now_upper_bound;
    use std::time::{Duration, Instant};

    #[test]
    fn the_bound_is_never_before_the_precise_clock() {
        for _ in 0..20_000 {
            let before = Instant::now();
            let bound = now_upper_bound();
            assert!(bound >= before, "bound {bound:?} before {before:?}");
        }
        // Also across ticks of the coarse clock.
        for _ in 0..20 {
            std::thread::sleep(Duration::from_micros(700));
            let before = Instant::now();
            assert!(now_upper_bound() >= before);
        }
    }
}
