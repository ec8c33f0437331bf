//! YCSB core-workload machinery for the `krcore-ycsb` driver: generators,
//! workloads, measurements and YCSB-format reports.
//!
//! Everything here is pure: no clock, no sockets, no threads of its own. The
//! only I/O is reading a property file ([`Workload::from_file`]). Randomness
//! always comes from an RNG the caller passes in, so a seeded
//! `rand::rngs::SmallRng` makes every run reproducible.
//!
//! # Layout
//!
//! | module | YCSB counterpart | contents |
//! |---|---|---|
//! | `hash` | `Utils.fnvhash64`, `CoreWorkload.buildKeyName` | [`fnv_hash64`], [`build_key_name`] |
//! | `zipfian` | `ZipfianGenerator`, `ScrambledZipfianGenerator`, `SkewedLatestGenerator` | Gray et al.'s method, constant 0.99 |
//! | `generator` | `UniformLongGenerator`, `DiscreteGenerator`, `CounterGenerator`, `AcknowledgedCounterGenerator` | |
//! | `properties` | `java.util.Properties` | [`Properties`] |
//! | `workload` | `CoreWorkload.init` | [`Workload`], presets A to F |
//! | `ops` | `CoreWorkload.doTransaction`, `nextKeynum` | [`KeySpace`], [`OperationGenerator`] |
//! | `measure` | `DBWrapper`, `OneMeasurementHdrHistogram` | [`Measurements`] |
//! | `report` | `TextMeasurementsExporter`, `Client.exportMeasurements` | [`Report`] |
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use krcore_benches::ycsb::{KeySpace, Measurements, Operation, OperationGenerator, Report, Status, Workload};
//! use rand::{rngs::SmallRng, SeedableRng};
//!
//! let workload = Workload::preset('a')?; // or Workload::from_file("workloads/workloada")?
//! workload.ensure_no_scan()?;            // a hash store cannot run workload E
//! let keys = KeySpace::new(&workload);   // shared by all client threads (Arc)
//!
//! // Load phase: each thread takes keys until none are left.
//! while let Some(k) = keys.next_load_key() {
//!     let _key = workload.key_name(k); // "user6284781860667377211", ...
//!     // insert `_key` with a value of workload.value_size() bytes
//! }
//!
//! // Run phase, per thread: its own generator, RNG and measurements.
//! let mut gen = OperationGenerator::new(&workload)?;
//! let mut rng = SmallRng::seed_from_u64(1);
//! let mut measurements = Measurements::new();
//! for _ in 0..workload.operation_count {
//!     let req = gen.next_request(&mut rng, &keys);
//!     // perform req.op on workload.key_name(req.keynum) and time it
//!     measurements.record(req.op, Status::Ok, Duration::from_micros(3));
//!     if req.op == Operation::Insert {
//!         keys.acknowledge_insert(req.keynum);
//!     }
//! }
//!
//! // Merge the threads' measurements, then print.
//! let mut all = Measurements::new();
//! all.merge(&measurements)?;
//! let report = Report::new(&all, Duration::from_millis(20), workload.operation_count);
//! assert!(report.to_text().starts_with("[OVERALL], RunTime(ms), 20\n"));
//! let _json = report.to_json()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads
//!
//! [`KeySpace`] (atomic counters) is `Sync` and shared. Generators with state
//! ([`ZipfianGenerator`] and those built on it, [`OperationGenerator`]) are
//! per thread, as is [`Measurements`]; merge the latter at the end. Figures
//! made under a latency model must say so: [`Report::with_label`].
//!
//! # Fidelity to YCSB
//!
//! The formulas, constants, defaults and key names are YCSB's (0.17), so a
//! workload file means the same thing here. Where this code departs from the
//! Java, it is on purpose:
//!
//! - **Random stream.** Values are drawn from the caller's RNG, not Java's
//!   `ThreadLocalRandom`, so sequences are not bit-equal to a Java run;
//!   distributions are. Constructors draw nothing. The zipfian family accepts
//!   an exact uniform `u` (`*_from_unit`) for testing.
//! - **Zipfian.** Kept: the incremental zeta when the item count grows, `eta`
//!   recomputed with the construction-time count, no recomputation when the
//!   count shrinks. Changed: a result one past the end (Java, when `u` is within
//!   ulps of 1) is clamped to the last item.
//! - **Scrambled zipfian.** `ITEM_COUNT = 10^10` with `ZETAN = 26.469...`, the
//!   consistent pair of YCSB 0.1 to 0.17 (later `master` has 10^16 with the same
//!   `ZETAN`). The single hash value Java's `Math.abs` leaves negative is reduced
//!   with `rem_euclid`, so every key is in range.
//! - **Uniform** uses `gen_range` (no modulo bias).
//! - **Acknowledged counter.** A mutex-guarded set instead of a 2^20-slot
//!   window with `tryLock`; same `last_value` semantics, no "too many
//!   unacknowledged" failure.
//! - **Key choice** retries like `nextKeynum`, with a bound (10,000 redraws,
//!   then a uniform acceptable key) instead of an unbounded loop.
//! - **Properties.** A line without `=`/`:` is an error; values are trimmed.
//!   `recordcount` must be set and >= 1, proportions must lie in `[0, 1]`,
//!   unknown distributions and orders are errors, and YCSB features not
//!   implemented (`hotspot`, `sequential`, `exponential`, non-constant field
//!   lengths, other workload classes) are [`YcsbError::Unsupported`] rather than
//!   silently different. Scan lengths are not represented.
//! - **Records** are one value of `fieldcount * fieldlength` bytes.
//! - **Report.** Metrics in name order; percentiles 50, 95, 99, 99.9 by
//!   default; `Return=OK` printed for every metric that counts statuses.

mod error;
mod generator;
mod hash;
mod measure;
mod ops;
mod properties;
mod report;
mod workload;
mod zipfian;

pub use error::{Result, YcsbError};
pub use generator::{
    AcknowledgedCounterGenerator, CounterGenerator, DiscreteGenerator, UniformGenerator,
};
pub use hash::{
    build_key_name, fnv1a64, fnv_hash64, InsertOrder, FNV_OFFSET_BASIS_64, FNV_PRIME_64,
};
pub use measure::{Measurements, MeasurementsWire, Metric, MetricWire, Status};
pub use ops::{KeySpace, OperationGenerator, Request};
pub use properties::Properties;
pub use report::{
    java_double, ordinal, MetricReport, PercentileLatency, Report, ReturnCount, DEFAULT_PERCENTILES,
};
pub use workload::{proportion_key, Operation, Proportions, RequestDistribution, Workload};
pub use zipfian::{
    zeta, ScrambledZipfianGenerator, SkewedLatestGenerator, ZipfianGenerator, SCRAMBLED_ITEM_COUNT,
    SCRAMBLED_ZETAN, ZIPFIAN_CONSTANT,
};
