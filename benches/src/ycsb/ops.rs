//! Turning a [`Workload`] into a stream of requests (YCSB's
//! `CoreWorkload.doInsert` / `doTransaction` without the database calls).
//!
//! Threading: one [`KeySpace`] is shared by all client threads (in an `Arc`);
//! each thread owns an [`OperationGenerator`] and its own RNG. Nothing here
//! reads a clock or does I/O.

use rand::Rng;

use super::error::Result;
use super::generator::{
    AcknowledgedCounterGenerator, CounterGenerator, DiscreteGenerator, UniformGenerator,
};
use super::workload::{Operation, RequestDistribution, Workload};
use super::zipfian::{ScrambledZipfianGenerator, SkewedLatestGenerator};

/// Redraws allowed when a key chooser lands above the last acknowledged
/// insert, before falling back to a uniform key (see
/// [`OperationGenerator::next_keynum`]).
const MAX_REDRAWS: u32 = 10_000;

/// Key counters shared by all client threads of one run.
#[derive(Debug)]
pub struct KeySpace {
    /// Load phase: `insertstart, insertstart + 1, ...` (YCSB `keysequence`).
    load: CounterGenerator,
    load_end: u64,
    /// Run phase inserts: `recordcount, recordcount + 1, ...`
    /// (YCSB `transactioninsertkeysequence`).
    inserts: AcknowledgedCounterGenerator,
}

impl KeySpace {
    /// The key space of a workload: keys `0..recordcount` loaded (this client
    /// loads [`Workload::load_range`]), run-phase inserts from `recordcount` up.
    pub fn new(workload: &Workload) -> Self {
        let range = workload.load_range();
        Self {
            load: CounterGenerator::new(range.start),
            load_end: range.end,
            inserts: AcknowledgedCounterGenerator::new(workload.record_count),
        }
    }

    /// The next key number to load, or `None` once this client's load range
    /// is exhausted. Each key is handed to exactly one thread.
    pub fn next_load_key(&self) -> Option<u64> {
        let k = self.load.next_value();
        (k < self.load_end).then_some(k)
    }

    /// The next key number to insert during the run. Call
    /// [`KeySpace::acknowledge_insert`] when the insert has finished, whether
    /// it succeeded or not (YCSB does so in a `finally`).
    pub fn next_insert_key(&self) -> u64 {
        self.inserts.next_value()
    }

    /// Makes an inserted key available to reads.
    pub fn acknowledge_insert(&self, keynum: u64) {
        self.inserts.acknowledge(keynum);
    }

    /// The highest key number that reads may choose: every key up to it was
    /// loaded or acknowledged.
    pub fn last_key(&self) -> u64 {
        // `Workload::validate` makes `recordcount >= 1`, so this is `Some`.
        self.inserts.last_value().unwrap_or(0)
    }
}

/// What one transaction should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The operation.
    pub op: Operation,
    /// Its key number (name it with [`Workload::key_name`]). For
    /// [`Operation::Insert`] it comes from [`KeySpace::next_insert_key`] and
    /// must be acknowledged.
    pub keynum: u64,
}

#[derive(Debug, Clone)]
enum KeyChooser {
    Uniform(UniformGenerator),
    Zipfian(ScrambledZipfianGenerator),
    Latest(SkewedLatestGenerator),
}

/// Per-thread generator of run-phase requests.
#[derive(Debug, Clone)]
pub struct OperationGenerator {
    ops: DiscreteGenerator<Operation>,
    keys: KeyChooser,
    /// Fallback for a chooser that keeps landing on keys not inserted yet.
    fallback_lb: u64,
}

impl OperationGenerator {
    /// The generator YCSB's `CoreWorkload.init` would build:
    ///
    /// - uniform: `insertstart ..= insertstart + insertcount - 1`;
    /// - zipfian: scrambled zipfian over `insertstart ..= insertstart +
    ///   insertcount + expected_new_keys` (room for the run's inserts, so that
    ///   inserts do not reshuffle which keys are hot);
    /// - latest: skewed latest over the loaded keys, following inserts.
    ///
    /// # Errors
    /// Whatever [`Workload::validate`] reports.
    pub fn new(workload: &Workload) -> Result<Self> {
        workload.validate()?;
        let start = workload.insert_start;
        // validate(): insert_count >= 1 and start + insert_count <= recordcount.
        let last_loaded = start + workload.insert_count - 1;
        let keys = match workload.request_distribution {
            RequestDistribution::Uniform => {
                KeyChooser::Uniform(UniformGenerator::new(start, last_loaded)?)
            }
            RequestDistribution::Zipfian => {
                let max = (last_loaded + 1).saturating_add(workload.expected_new_keys());
                KeyChooser::Zipfian(ScrambledZipfianGenerator::new(start, max)?)
            }
            RequestDistribution::Latest => {
                KeyChooser::Latest(SkewedLatestGenerator::new(workload.record_count - 1))
            }
        };
        Ok(Self {
            ops: workload.operation_chooser()?,
            keys,
            fallback_lb: start,
        })
    }

    /// The next request (YCSB's `doTransaction`): an operation from the mix
    /// and its key. Insert keys come from `keys` and must be acknowledged.
    pub fn next_request<R: Rng + ?Sized>(&mut self, rng: &mut R, keys: &KeySpace) -> Request {
        let op = *self.ops.next_value(rng);
        let keynum = match op {
            Operation::Insert => keys.next_insert_key(),
            _ => self.next_keynum(rng, keys),
        };
        Request { op, keynum }
    }

    /// The key of a read, update, scan or read-modify-write (YCSB's
    /// `nextKeynum`): draws until the key is at most [`KeySpace::last_key`],
    /// so no request targets an insert still in flight.
    ///
    /// Termination: every loaded key is acceptable and each has a positive
    /// probability, so redraws are rare (YCSB loops without bound). After
    /// 10,000 redraws in a row, which a valid workload does not reach, a
    /// uniform key among the acceptable ones is returned instead of looping on.
    pub fn next_keynum<R: Rng + ?Sized>(&mut self, rng: &mut R, keys: &KeySpace) -> u64 {
        let last = keys.last_key();
        for _ in 0..MAX_REDRAWS {
            let k = match &mut self.keys {
                KeyChooser::Uniform(g) => g.next_value(rng),
                KeyChooser::Zipfian(g) => g.next_value(rng),
                KeyChooser::Latest(g) => g.next_value(rng, last),
            };
            if k <= last {
                return k;
            }
        }
        rng.gen_range(self.fallback_lb.min(last)..=last)
    }

    /// The operation mix this generator draws from.
    pub fn operations(&self) -> &DiscreteGenerator<Operation> {
        &self.ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn mix(workload: &Workload, n: u32) -> [u32; 5] {
        let keys = KeySpace::new(workload);
        let mut gen = OperationGenerator::new(workload).unwrap();
        let mut rng = SmallRng::seed_from_u64(17);
        let mut counts = [0u32; 5];
        for _ in 0..n {
            let r = gen.next_request(&mut rng, &keys);
            let i = Operation::ALL.iter().position(|&o| o == r.op).unwrap();
            counts[i] += 1;
            if r.op == Operation::Insert {
                assert!(r.keynum >= workload.record_count);
                keys.acknowledge_insert(r.keynum);
            } else {
                assert!(r.keynum <= keys.last_key());
            }
        }
        counts
    }

    #[test]
    fn presets_produce_their_mix() {
        let n = 20_000;
        let close = |count: u32, p: f64| (f64::from(count) / f64::from(n) - p).abs() < 0.015;
        let a = mix(&Workload::preset('a').unwrap(), n);
        assert!(
            close(a[0], 0.5) && close(a[1], 0.5) && a[2] + a[3] + a[4] == 0,
            "{a:?}"
        );
        let b = mix(&Workload::preset('b').unwrap(), n);
        assert!(close(b[0], 0.95) && close(b[1], 0.05), "{b:?}");
        let c = mix(&Workload::preset('c').unwrap(), n);
        assert_eq!(c[0], n);
        let d = mix(&Workload::preset('d').unwrap(), n);
        assert!(close(d[0], 0.95) && close(d[2], 0.05), "{d:?}");
        let f = mix(&Workload::preset('f').unwrap(), n);
        assert!(close(f[0], 0.5) && close(f[4], 0.5), "{f:?}");
        let e = mix(&Workload::preset('e').unwrap(), n);
        assert!(close(e[3], 0.95) && close(e[2], 0.05), "{e:?}");
    }

    #[test]
    fn zipfian_reads_stay_on_loaded_keys() {
        // Workload with inserts: the zipfian key space is larger than what is
        // loaded, and reads must still only hit keys that exist.
        let mut w = Workload::preset('a').unwrap();
        w.proportions.insert = 0.3;
        w.operation_count = 10_000;
        let keys = KeySpace::new(&w);
        let mut gen = OperationGenerator::new(&w).unwrap();
        let mut rng = SmallRng::seed_from_u64(23);
        for _ in 0..10_000 {
            assert!(gen.next_keynum(&mut rng, &keys) < w.record_count);
        }
    }

    #[test]
    fn latest_follows_acknowledged_inserts() {
        let w = Workload::preset('d').unwrap();
        let keys = KeySpace::new(&w);
        let mut gen = OperationGenerator::new(&w).unwrap();
        let mut rng = SmallRng::seed_from_u64(29);
        assert_eq!(keys.last_key(), 999);
        let first = keys.next_insert_key();
        let second = keys.next_insert_key();
        assert_eq!((first, second), (1000, 1001));
        keys.acknowledge_insert(second);
        // 1000 is still in flight: nothing above 999 may be read.
        for _ in 0..2000 {
            assert!(gen.next_keynum(&mut rng, &keys) <= 999);
        }
        keys.acknowledge_insert(first);
        assert_eq!(keys.last_key(), 1001);
        let hits = (0..5000)
            .filter(|_| gen.next_keynum(&mut rng, &keys) == 1001)
            .count();
        assert!(hits > 500, "the newest key is the hottest: {hits}");
    }

    #[test]
    fn load_keys_are_handed_out_once() {
        let mut w = Workload::preset('a').unwrap();
        w.insert_start = 100;
        w.insert_count = 50;
        let keys = KeySpace::new(&w);
        let loaded: Vec<u64> = std::iter::from_fn(|| keys.next_load_key()).collect();
        assert_eq!(loaded, (100..150).collect::<Vec<_>>());
        assert_eq!(keys.next_load_key(), None);
    }

    #[test]
    fn uniform_covers_load_range() {
        let mut w = Workload::preset('c').unwrap();
        w.request_distribution = RequestDistribution::Uniform;
        w.record_count = 10;
        w.insert_count = 10;
        let keys = KeySpace::new(&w);
        let mut gen = OperationGenerator::new(&w).unwrap();
        let mut rng = SmallRng::seed_from_u64(31);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[gen.next_keynum(&mut rng, &keys) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn invalid_workload_is_rejected() {
        let mut w = Workload::preset('a').unwrap();
        w.record_count = 0;
        assert!(OperationGenerator::new(&w).is_err());
    }
}
