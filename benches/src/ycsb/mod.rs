//! YCSB workload machinery (placeholder, filled in below).
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
pub use measure::{Measurements, Metric, Status};
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
