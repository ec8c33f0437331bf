//! How the engine's serving threads (progress, handshake, responder, meta
//! host) wait between progress calls.
//!
//! A serving thread that polled every few tens of microseconds forever
//! would cost little on one idle host, but a node runs several (messaging,
//! handshake, meta host), and every process of a node has its own: in the
//! Soft-RoCE guest (emulated, 2 vCPUs) five processes' threads waking every
//! 50-100 us took the CPU from the client and from rxe's own packet
//! processing, and a YCSB-C get measured 4.6-8.0x two `ib_read_lat` READs
//! (perftest itself slowed from about 31 to 78-112 us). So an idle thread
//! backs off: the sleep doubles per idle call up to [`IdleWait::MAX_SLEEP`].
//! The price is latency after an idle spell: the first message (a
//! handshake, an allocation, a registration) to a node idle for a while
//! waits up to that sleep; traffic that keeps coming finds the thread
//! polling or spinning.

use std::time::Duration;

/// After a call that handled something, poll again at once; when idle,
/// yield for [`IdleWait::SPIN_POLLS`] calls (a reply often follows within
/// microseconds), then sleep: the configured idle sleep first, doubling per
/// idle call up to [`IdleWait::MAX_SLEEP`] (or the configured sleep, if
/// larger).
pub(crate) struct IdleWait {
    idle: u32,
    sleep: Duration,
    next: Duration,
}

impl IdleWait {
    /// Idle calls answered by a yield before the thread starts sleeping.
    pub(crate) const SPIN_POLLS: u32 = 64;
    /// The longest idle sleep the back-off reaches.
    pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(2);

    pub(crate) fn new(sleep: Duration) -> IdleWait {
        IdleWait {
            idle: 0,
            sleep,
            next: sleep,
        }
    }

    /// Waits after a progress call that handled `handled` items.
    pub(crate) fn after(&mut self, handled: usize) {
        if handled > 0 {
            self.idle = 0;
            self.next = self.sleep;
        } else if self.idle < Self::SPIN_POLLS {
            self.idle += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.next);
            self.next = (self.next * 2).min(Self::MAX_SLEEP.max(self.sleep));
        }
    }

    /// Waits after a failed progress call: `pause` (no spinning on an
    /// error).
    pub(crate) fn after_error(&mut self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_resets_the_idle_count_and_idleness_reaches_the_sleep() {
        let mut w = IdleWait::new(Duration::ZERO);
        for _ in 0..IdleWait::SPIN_POLLS {
            w.after(0);
        }
        assert_eq!(w.idle, IdleWait::SPIN_POLLS);
        w.after(0);
        assert_eq!(w.idle, IdleWait::SPIN_POLLS, "sleeping, no more counting");
        w.after(3);
        assert_eq!(w.idle, 0);
    }

    #[test]
    fn the_sleep_doubles_to_its_cap_and_work_resets_it() {
        let mut w = IdleWait::new(Duration::from_micros(1));
        w.idle = IdleWait::SPIN_POLLS;
        let mut seen = Vec::new();
        for _ in 0..14 {
            seen.push(w.next);
            w.after(0);
        }
        assert_eq!(seen[..3], [1, 2, 4].map(Duration::from_micros));
        assert_eq!(w.next, IdleWait::MAX_SLEEP);
        w.after(1);
        assert_eq!(w.next, Duration::from_micros(1));
        // A configured sleep above the cap is kept.
        let mut w = IdleWait::new(Duration::from_millis(5));
        w.idle = IdleWait::SPIN_POLLS;
        w.after(0);
        assert_eq!(w.next, Duration::from_millis(5));
    }
}
