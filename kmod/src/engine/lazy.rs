//! [`Lazy`]: an engine resource (the DCT + SRQ + receive CQ, the upgrade's
//! handshake endpoint) created on first need, exactly once, with a typed
//! error when creation fails.
//!
//! # Protocol
//!
//! The value sits in a [`OnceLock`]; creation runs under a mutex of the
//! resource's own, which is taken only while the value is absent:
//!
//! - A reader that finds the value (`OnceLock::get`, one acquire load) never
//!   takes the mutex: the steady state costs what a field access costs.
//! - A reader that finds it absent takes the mutex, looks again (another
//!   thread may have created it meanwhile), and only then creates it. The
//!   mutex serializes creators, so the resource is created at most once;
//!   the `OnceLock` publishes it (release on set, acquire on get), so every
//!   thread sees the fully built value.
//! - A failed creation stores nothing and returns the error: the next call
//!   tries again (provider refusals can be transient: a full fabric).
//!
//! `creations` counts successful creations (1 at most, by the above; the
//! concurrency test in `tests/engine_lazy.rs` checks it through the NIC's
//! counters too).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// A resource created on first need (see the module docs).
pub(crate) struct Lazy<T> {
    cell: OnceLock<T>,
    init: Mutex<()>,
    creations: AtomicU32,
}

impl<T> Lazy<T> {
    /// Not created yet.
    pub(crate) fn new() -> Lazy<T> {
        Lazy {
            cell: OnceLock::new(),
            init: Mutex::new(()),
            creations: AtomicU32::new(0),
        }
    }

    /// Created already (an eager start).
    pub(crate) fn ready(value: T) -> Lazy<T> {
        let lazy = Lazy::new();
        let _ = lazy.cell.set(value);
        lazy.creations.store(1, Ordering::Relaxed);
        lazy
    }

    /// The value if it was created; never creates it.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        self.cell.get()
    }

    /// The value, created by `create` if it does not exist yet. Concurrent
    /// callers wait for one creator; `create` runs at most once per
    /// successful creation (see the module docs).
    ///
    /// # Errors
    /// `create`'s error; nothing is stored then.
    pub(crate) fn get_or_try_init<E>(
        &self,
        create: impl FnOnce() -> Result<T, E>,
    ) -> Result<&T, E> {
        if let Some(v) = self.cell.get() {
            return Ok(v);
        }
        let _creating = self.init.lock();
        if let Some(v) = self.cell.get() {
            return Ok(v);
        }
        let v = create()?;
        self.creations.fetch_add(1, Ordering::Relaxed);
        // Under `init`, with the cell seen empty: this set is the only one.
        Ok(self.cell.get_or_init(|| v))
    }

    /// Successful creations so far (0 or 1).
    pub(crate) fn creations(&self) -> u32 {
        self.creations.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    #[test]
    fn many_first_users_create_once_and_see_the_same_value() {
        for _ in 0..50 {
            let lazy = Arc::new(Lazy::<Box<usize>>::new());
            let calls = Arc::new(AtomicUsize::new(0));
            let n = 8;
            let barrier = Arc::new(Barrier::new(n));
            let seen: Vec<usize> = (0..n)
                .map(|i| {
                    let (lazy, calls, barrier) = (lazy.clone(), calls.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let v = lazy
                            .get_or_try_init(|| {
                                calls.fetch_add(1, Ordering::Relaxed);
                                Ok::<_, ()>(Box::new(1000 + i))
                            })
                            .unwrap();
                        **v
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert_eq!(calls.load(Ordering::Relaxed), 1);
            assert_eq!(lazy.creations(), 1);
            assert!(seen.iter().all(|v| *v == seen[0]), "{seen:?}");
            assert!((1000..1000 + n).contains(&seen[0]));
        }
    }

    #[test]
    fn a_failed_creation_stores_nothing_and_the_next_call_retries() {
        let lazy = Lazy::<u32>::new();
        assert_eq!(lazy.get_or_try_init(|| Err("refused")), Err("refused"));
        assert!(lazy.get().is_none());
        assert_eq!(lazy.creations(), 0);
        assert_eq!(lazy.get_or_try_init(|| Ok::<_, &str>(7)), Ok(&7));
        assert_eq!(lazy.get_or_try_init(|| Ok::<_, &str>(8)), Ok(&7));
        assert_eq!(lazy.creations(), 1);
        let ready = Lazy::ready(3u8);
        assert_eq!((ready.get(), ready.creations()), (Some(&3), 1));
    }
}
