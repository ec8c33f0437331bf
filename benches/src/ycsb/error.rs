//! The error type of the YCSB machinery.

use std::path::PathBuf;

/// Result alias for the YCSB machinery.
pub type Result<T, E = YcsbError> = std::result::Result<T, E>;

/// Everything that can go wrong while building a workload or a report.
///
/// Bad input (a malformed property file, an impossible value) is always an
/// `Err` of this type, never a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum YcsbError {
    /// A property file could not be read.
    #[error("cannot read YCSB property file {}", path.display())]
    ReadFile {
        /// The file that was being read.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a property file is not `key=value` (or `key:value`).
    #[error("property file line {line}: {reason}: {text:?}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
        /// The offending line.
        text: String,
    },
    /// A property has a value that cannot be used.
    #[error("property {key}={value:?}: {reason}")]
    InvalidValue {
        /// The property name.
        key: String,
        /// The value found.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A property value is legal YCSB but not implemented here.
    #[error("property {key}={value:?} is not supported: {reason}")]
    Unsupported {
        /// The property name.
        key: String,
        /// The value found.
        value: String,
        /// What is supported instead.
        reason: &'static str,
    },
    /// `insertstart + insertcount` exceeds `recordcount` (YCSB exits on this too).
    #[error("insertstart ({start}) + insertcount ({count}) exceeds recordcount ({records})")]
    InsertRange {
        /// `insertstart`.
        start: u64,
        /// `insertcount`.
        count: u64,
        /// `recordcount`.
        records: u64,
    },
    /// Every operation proportion is zero: there is nothing to run.
    #[error("all operation proportions are zero (readproportion, updateproportion, ...)")]
    NoOperations,
    /// No YCSB core workload has this letter.
    #[error("no YCSB core workload {0:?} (the presets are 'a' to 'f')")]
    UnknownPreset(char),
    /// The workload contains scans, which a hash store cannot serve.
    #[error(
        "workload has scanproportion={proportion}: a hash store (RACE hashing) keeps no key order \
         and has no range scan, so YCSB workload E cannot run on it"
    )]
    ScanUnsupported {
        /// The workload's scan proportion.
        proportion: f64,
    },
    /// A generator was asked to draw from an empty range.
    #[error("empty range for {what}: {detail}")]
    EmptyRange {
        /// Which generator.
        what: &'static str,
        /// The bounds given.
        detail: String,
    },
    /// A zipfian constant outside `(0, 1)`, where Gray's method is defined.
    #[error("zipfian constant {0} is outside (0, 1)")]
    ZipfianConstant(f64),
    /// Weights of a discrete distribution that are negative, not finite or all zero.
    #[error("discrete distribution weights are invalid: {0}")]
    Weights(String),
    /// A percentile outside `[0, 100]` or not finite.
    #[error("percentile {0} is outside [0, 100]")]
    Percentile(f64),
    /// Two latency histograms could not be merged.
    #[error("cannot merge latency histograms of {metric}")]
    Merge {
        /// The metric whose histograms were merged.
        metric: String,
        /// The histogram error.
        #[source]
        source: hdrhistogram::AdditionError,
    },
    /// Measurements sent by another process could not be rebuilt.
    #[error("measurements of {metric} from another process: {reason}")]
    Wire {
        /// The metric.
        metric: String,
        /// What the histogram refused.
        reason: String,
    },
}
