//! Time, as the caller provides it.
//!
//! The client never reads a system clock itself: it asks the [`Clock`] it
//! was given. Time is measured in *ticks* whose length the caller chooses
//! (microseconds for [`SystemClock`]); every duration in
//! [`crate::client::ClientConfig`] is in the same ticks. Clients that share a
//! table must share a time base: their clocks may disagree by at most the
//! margin the configuration leaves (see the timing assumptions in
//! [`crate::client`]).
//!
//! * [`SystemClock`]: monotonic microseconds since the clock was created;
//!   backoff yields, then sleeps a little.
//! * [`ManualClock`]: a counter the test advances; its backoff advances it
//!   too, so that a client waiting for an expired lease makes progress in a
//!   single-threaded, deterministic test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of time for the client (see the module docs).
pub trait Clock: Send + Sync {
    /// The current time in ticks. Must never go backwards.
    fn now(&self) -> u64;

    /// Called when the client waits for another client (a resize in
    /// progress, a contended word) before it retries; `attempt` counts the
    /// retries of the current operation. The default only hints a spin.
    fn backoff(&self, attempt: u32) {
        let _ = attempt;
        core::hint::spin_loop();
    }

    /// The real time one tick stands for, if the clock follows real time
    /// (`None`, the default: a clock of its own, as in tests). A closing
    /// client with a real-time clock tells the memory nodes how long to
    /// hold the blocks it retired last; without, it waits their grace
    /// period out itself (see [`crate::Client::close`]).
    fn tick(&self) -> Option<Duration> {
        None
    }

    /// Waits about `ticks` (a writer backing off after a lost CAS,
    /// [`crate::ConflictPolicy::Backoff`]). The default spins on
    /// [`Clock::now`].
    fn pause(&self, ticks: u64) {
        let until = self.now().saturating_add(ticks);
        while self.now() < until {
            core::hint::spin_loop();
        }
    }
}

/// Waits `us` microseconds: a sleep for long waits (its wake-up latency,
/// some 50 us, is small against them), a spin on `Instant` for short ones.
fn pause_micros(us: u64) {
    if us == 0 {
        return;
    }
    let d = Duration::from_micros(us);
    if us >= 200 {
        std::thread::sleep(d);
        return;
    }
    let start = Instant::now();
    while start.elapsed() < d {
        core::hint::spin_loop();
    }
}

/// Monotonic microseconds since creation (`Instant`-based).
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// A clock starting at tick 0 now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        // Whole seconds and the microseconds of the last one: no 128-bit
        // arithmetic on this per-operation path.
        let d = self.start.elapsed();
        d.as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()))
    }

    fn backoff(&self, attempt: u32) {
        if attempt < 4 {
            std::thread::yield_now();
        } else {
            let us = 1u64 << attempt.min(10);
            std::thread::sleep(Duration::from_micros(us));
        }
    }

    fn pause(&self, ticks: u64) {
        pause_micros(ticks);
    }

    fn tick(&self) -> Option<Duration> {
        Some(Duration::from_micros(1))
    }
}

/// Microseconds since [`WALL_EPOCH_UNIX_SECS`] (2024-01-01T00:00:00Z): the
/// same ticks in every process of a machine (and across NTP-synchronized
/// machines, up to their skew, which the lease margins must cover). For
/// clients in different processes, whose leases and deadlines must compare;
/// [`SystemClock`] counts from its own creation. Never goes backwards within
/// a process (a wall-clock step back holds the clock until real time catches
/// up).
///
/// Why not the Unix epoch: the directory header stores a lease expiry in 39
/// bits of [`crate::ClientConfig::lease_unit_ticks`] (milliseconds by
/// default), about 17 years; counted from 1970 it would not fit. From 2024
/// it fits until 2041.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallClock;

/// The origin of [`WallClock`] ticks, in seconds since the Unix epoch.
pub const WALL_EPOCH_UNIX_SECS: u64 = 1_704_067_200;

static WALL_LAST: AtomicU64 = AtomicU64::new(0);

impl Clock for WallClock {
    fn now(&self) -> u64 {
        let epoch = std::time::UNIX_EPOCH + Duration::from_secs(WALL_EPOCH_UNIX_SECS);
        let t = std::time::SystemTime::now()
            .duration_since(epoch)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        WALL_LAST.fetch_max(t, Ordering::Relaxed).max(t)
    }

    fn backoff(&self, attempt: u32) {
        SystemClock::new().backoff(attempt);
    }

    fn pause(&self, ticks: u64) {
        pause_micros(ticks);
    }

    fn tick(&self) -> Option<Duration> {
        Some(Duration::from_micros(1))
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    backoff_ticks: u64,
}

impl ManualClock {
    /// A clock at tick `start` whose backoff advances it by `backoff_ticks`.
    pub fn new(start: u64, backoff_ticks: u64) -> Self {
        Self {
            now: AtomicU64::new(start),
            backoff_ticks,
        }
    }

    /// Moves time forward by `ticks`; returns the new time.
    pub fn advance(&self, ticks: u64) -> u64 {
        self.now
            .fetch_add(ticks, Ordering::SeqCst)
            .saturating_add(ticks)
    }

    /// Sets the time (never backwards: the larger of now and `tick`).
    pub fn set(&self, tick: u64) {
        self.now.fetch_max(tick, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn backoff(&self, _attempt: u32) {
        self.advance(self.backoff_ticks);
        std::thread::yield_now();
    }

    fn pause(&self, ticks: u64) {
        self.advance(ticks);
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_forward_only() {
        let c = ManualClock::new(10, 3);
        assert_eq!(c.now(), 10);
        assert_eq!(c.advance(5), 15);
        c.set(12);
        assert_eq!(c.now(), 15);
        c.set(20);
        assert_eq!(c.now(), 20);
        c.backoff(1);
        assert_eq!(c.now(), 23);
    }

    #[test]
    fn wall_clock_leases_fit_the_directory_header() {
        use crate::layout::dir_header::DirHeader;
        let cfg = crate::ClientConfig::default();
        let now = WallClock.now();
        let expiry = (now + cfg.lease_ticks) / cfg.lease_unit_ticks;
        let h = DirHeader::locked(3, 1, expiry).unwrap();
        assert_eq!(h.lease_expiry(), expiry);
        assert!(WallClock.now() >= now);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        c.backoff(0);
        c.backoff(5);
        assert!(c.now() >= a);
    }
}
