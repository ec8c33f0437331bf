//! How the engine's serving threads (progress, handshake, responder, meta
//! host) wait between progress calls.

use std::time::Duration;

/// After a call that handled something, poll again at once; when idle,
/// yield for [`IdleWait::SPIN_POLLS`] calls (a reply often follows within
/// microseconds), then sleep the configured idle sleep per call.
pub(crate) struct IdleWait {
    idle: u32,
    sleep: Duration,
}

impl IdleWait {
    /// Idle calls answered by a yield before the thread starts sleeping.
    pub(crate) const SPIN_POLLS: u32 = 64;

    pub(crate) fn new(sleep: Duration) -> IdleWait {
        IdleWait { idle: 0, sleep }
    }

    /// Waits after a progress call that handled `handled` items.
    pub(crate) fn after(&mut self, handled: usize) {
        if handled > 0 {
            self.idle = 0;
        } else if self.idle < Self::SPIN_POLLS {
            self.idle += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
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
}
