//! Uniform, discrete and counter generators (`site.ycsb.generator`).
//!
//! The zipfian family lives in [`super::zipfian`]. Generators that draw take
//! the caller's RNG; the counters are shared between client threads (`&self`,
//! atomics) and draw nothing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rand::Rng;

use super::error::{Result, YcsbError};

/// YCSB's `UniformLongGenerator`: integers uniform in `lb..=ub`.
///
/// YCSB computes `Math.abs(nextLong()) % interval + lb`, which has a slight
/// modulo bias; this uses `Rng::gen_range`, which has none. (The random stream
/// differs from Java's anyway.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniformGenerator {
    lb: u64,
    ub: u64,
}

impl UniformGenerator {
    /// Integers uniform in `lb..=ub`.
    ///
    /// # Errors
    /// [`YcsbError::EmptyRange`] if `ub < lb`.
    pub fn new(lb: u64, ub: u64) -> Result<Self> {
        if ub < lb {
            return Err(YcsbError::EmptyRange {
                what: "uniform",
                detail: format!("lb {lb}, ub {ub}"),
            });
        }
        Ok(Self { lb, ub })
    }

    /// Next value in `lb..=ub`.
    pub fn next_value<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        rng.gen_range(self.lb..=self.ub)
    }
}

/// YCSB's `DiscreteGenerator`: picks one of several values with given weights.
///
/// Weights need not sum to 1; each is divided by their sum, as in YCSB. The
/// draw walks the values in insertion order subtracting normalized weights from
/// a uniform `u`, so an exact `u` gives a predictable value
/// ([`DiscreteGenerator::pick`]).
#[derive(Debug, Clone)]
pub struct DiscreteGenerator<T> {
    /// Values with weight > 0, in insertion order, with their weights.
    values: Vec<(f64, T)>,
    sum: f64,
}

impl<T> DiscreteGenerator<T> {
    /// A generator over `(weight, value)` pairs. Zero weights are dropped
    /// (YCSB's `CoreWorkload` only adds proportions `> 0`).
    ///
    /// # Errors
    /// [`YcsbError::Weights`] if a weight is negative or not finite, or if no
    /// weight is positive.
    pub fn new(weighted: impl IntoIterator<Item = (f64, T)>) -> Result<Self> {
        let mut values = Vec::new();
        let mut sum = 0.0;
        for (w, v) in weighted {
            if !w.is_finite() || w < 0.0 {
                return Err(YcsbError::Weights(format!("weight {w}")));
            }
            if w > 0.0 {
                sum += w;
                values.push((w, v));
            }
        }
        if values.is_empty() || !sum.is_finite() {
            return Err(YcsbError::Weights("no positive weight".into()));
        }
        Ok(Self { values, sum })
    }

    /// Next value, using one uniform draw from `rng`.
    pub fn next_value<R: Rng + ?Sized>(&self, rng: &mut R) -> &T {
        self.pick(rng.gen())
    }

    /// The value selected by the uniform draw `u` in `[0, 1)`.
    ///
    /// Java throws if rounding lets `u` run past the last value; here the last
    /// value is returned.
    pub fn pick(&self, u: f64) -> &T {
        let mut val = u;
        for (w, v) in &self.values {
            let pw = w / self.sum;
            if val < pw {
                return v;
            }
            val -= pw;
        }
        // `new` guarantees at least one value.
        match self.values.last() {
            Some((_, v)) => v,
            None => unreachable!("DiscreteGenerator::new rejects an empty set"),
        }
    }

    /// The values with positive weight and their normalized probabilities.
    pub fn probabilities(&self) -> impl Iterator<Item = (&T, f64)> + '_ {
        self.values.iter().map(move |(w, v)| (v, w / self.sum))
    }
}

/// YCSB's `CounterGenerator`: hands out `start, start + 1, ...` to any number of
/// threads (one atomic `fetch_add` each).
///
/// The load phase uses it for the keys to insert.
#[derive(Debug)]
pub struct CounterGenerator {
    next: AtomicU64,
}

impl CounterGenerator {
    /// A counter whose first value is `start`.
    pub fn new(start: u64) -> Self {
        Self {
            next: AtomicU64::new(start),
        }
    }

    /// The next value (each value is returned exactly once).
    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The last value handed out (Java: `counter - 1`), or `None` if the
    /// counter started at 0 and has handed out nothing.
    pub fn last_value(&self) -> Option<u64> {
        self.next.load(Ordering::Relaxed).checked_sub(1)
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: a counter whose
/// [`last_value`](AcknowledgedCounterGenerator::last_value) only advances over
/// values that were *acknowledged*, without gaps.
///
/// The run phase hands out insert keys with
/// [`next_value`](AcknowledgedCounterGenerator::next_value); the driver calls
/// [`acknowledge`](AcknowledgedCounterGenerator::acknowledge) once the insert
/// has finished (successfully or not, like YCSB's `finally`). Reads then only
/// choose keys up to `last_value`, so they never ask for a key whose insert is
/// still in flight; the "latest" distribution centres on it.
///
/// Implementation: the counter is an atomic; acknowledgements above the
/// contiguous limit wait in a mutex-protected set (YCSB uses a fixed 2^20-slot
/// window and a `tryLock`). The mutex is taken once per insert only; the limit
/// is read lock-free. Outstanding acknowledgements are bounded by the number of
/// inserts in flight, i.e. by the number of client threads.
#[derive(Debug)]
pub struct AcknowledgedCounterGenerator {
    next: AtomicU64,
    /// One past the highest value below which everything is acknowledged.
    limit: AtomicU64,
    pending: Mutex<BTreeSet<u64>>,
}

impl AcknowledgedCounterGenerator {
    /// A counter whose first value is `start`; values below `start` count as
    /// acknowledged (so `last_value` is `start - 1`).
    pub fn new(start: u64) -> Self {
        Self {
            next: AtomicU64::new(start),
            limit: AtomicU64::new(start),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    /// The next value to insert.
    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `value` as done. Acknowledging a value twice, or one below the
    /// limit, has no effect.
    pub fn acknowledge(&self, value: u64) {
        // A panic cannot happen while the lock is held, but never turn a
        // poisoned lock into one.
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut limit = self.limit.load(Ordering::Acquire);
        if value < limit {
            return;
        }
        pending.insert(value);
        while pending.remove(&limit) {
            limit += 1;
        }
        self.limit.store(limit, Ordering::Release);
    }

    /// The highest value such that it and every value below it are
    /// acknowledged (Java `lastValue()`), or `None` if that is "below 0".
    pub fn last_value(&self) -> Option<u64> {
        self.limit.load(Ordering::Acquire).checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use std::sync::Arc;

    #[test]
    fn uniform_covers_its_range_only() {
        let gen = UniformGenerator::new(10, 19).unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = gen.next_value(&mut rng);
            assert!((10..=19).contains(&v));
            seen[(v - 10) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
        assert!(UniformGenerator::new(5, 4).is_err());
        assert_eq!(UniformGenerator::new(7, 7).unwrap().next_value(&mut rng), 7);
    }

    #[test]
    fn discrete_walks_weights_in_order() {
        let gen = DiscreteGenerator::new([(0.5, "READ"), (0.0, "SCAN"), (0.5, "UPDATE")]).unwrap();
        assert_eq!(*gen.pick(0.0), "READ");
        assert_eq!(*gen.pick(0.4999), "READ");
        assert_eq!(*gen.pick(0.5), "UPDATE");
        assert_eq!(*gen.pick(0.9999), "UPDATE");
        // Weights are normalized by their sum, as in YCSB.
        let gen = DiscreteGenerator::new([(1.0, 'a'), (3.0, 'b')]).unwrap();
        assert_eq!(*gen.pick(0.24), 'a');
        assert_eq!(*gen.pick(0.26), 'b');
        // Rounding past the end falls back to the last value, never panics.
        assert_eq!(*gen.pick(1.5), 'b');
        let probs: Vec<_> = gen.probabilities().map(|(v, p)| (*v, p)).collect();
        assert_eq!(probs, vec![('a', 0.25), ('b', 0.75)]);
    }

    #[test]
    fn discrete_frequencies_match_weights() {
        let gen = DiscreteGenerator::new([(0.95, 0u8), (0.05, 1u8)]).unwrap();
        let mut rng = SmallRng::seed_from_u64(5);
        let ones = (0..100_000)
            .filter(|_| *gen.next_value(&mut rng) == 1)
            .count();
        assert!((4_500..5_500).contains(&ones), "{ones}");
    }

    #[test]
    fn discrete_rejects_bad_weights() {
        assert!(DiscreteGenerator::<u8>::new([]).is_err());
        assert!(DiscreteGenerator::new([(0.0, 1)]).is_err());
        assert!(DiscreteGenerator::new([(-0.1, 1), (1.0, 2)]).is_err());
        assert!(DiscreteGenerator::new([(f64::NAN, 1)]).is_err());
        assert!(DiscreteGenerator::new([(f64::INFINITY, 1)]).is_err());
        assert!(DiscreteGenerator::new([(f64::MAX, 1), (f64::MAX, 2)]).is_err());
    }

    #[test]
    fn counter_counts() {
        let c = CounterGenerator::new(0);
        assert_eq!(c.last_value(), None);
        assert_eq!(c.next_value(), 0);
        assert_eq!(c.next_value(), 1);
        assert_eq!(c.last_value(), Some(1));
        assert_eq!(CounterGenerator::new(100).last_value(), Some(99));
    }

    #[test]
    fn acknowledged_counter_waits_for_gaps() {
        let c = AcknowledgedCounterGenerator::new(1000);
        assert_eq!(c.last_value(), Some(999));
        let (a, b, d) = (c.next_value(), c.next_value(), c.next_value());
        assert_eq!((a, b, d), (1000, 1001, 1002));
        c.acknowledge(b);
        c.acknowledge(d);
        assert_eq!(c.last_value(), Some(999), "1000 is still in flight");
        c.acknowledge(a);
        assert_eq!(c.last_value(), Some(1002));
        c.acknowledge(a); // twice: no effect
        c.acknowledge(5); // below the limit: no effect
        assert_eq!(c.last_value(), Some(1002));
        assert_eq!(AcknowledgedCounterGenerator::new(0).last_value(), None);
    }

    #[test]
    fn acknowledged_counter_from_many_threads() {
        let c = Arc::new(AcknowledgedCounterGenerator::new(10));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let v = c.next_value();
                        c.acknowledge(v);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.last_value(), Some(10 + 4000 - 1));
    }
}
