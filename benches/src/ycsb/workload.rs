//! The YCSB core workload: its parameters, the presets A to F, and parsing
//! from property files (YCSB's `CoreWorkload.init`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{Result, YcsbError};
use super::generator::DiscreteGenerator;
use super::hash::{build_key_name, write_key_name, InsertOrder};
use super::properties::Properties;

/// One kind of YCSB transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Operation {
    /// Read one record.
    Read,
    /// Overwrite one record.
    Update,
    /// Insert a new record (run phase: the next key after the loaded ones).
    Insert,
    /// Range scan from a key. A hash store cannot serve it.
    Scan,
    /// Read a record, then write it back.
    ReadModifyWrite,
}

impl Operation {
    /// All operations, in YCSB's order (the order `CoreWorkload` adds them to
    /// its operation chooser).
    pub const ALL: [Operation; 5] = [
        Operation::Read,
        Operation::Update,
        Operation::Insert,
        Operation::Scan,
        Operation::ReadModifyWrite,
    ];

    /// The name YCSB prints for it in its measurements (`[READ]`, ...,
    /// `[READ-MODIFY-WRITE]`).
    pub fn metric_name(self) -> &'static str {
        match self {
            Operation::Read => "READ",
            Operation::Update => "UPDATE",
            Operation::Insert => "INSERT",
            Operation::Scan => "SCAN",
            Operation::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

/// How keys are chosen for reads, updates, scans and read-modify-writes
/// (`requestdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestDistribution {
    /// Uniform over the loaded keys (YCSB's default).
    Uniform,
    /// Scrambled zipfian, constant 0.99 (workloads A, B, C, E, F).
    Zipfian,
    /// Skewed towards the most recent inserts (workload D).
    Latest,
}

/// The mix of operations (`readproportion`, ...). They need not sum to 1:
/// like YCSB, each is divided by their sum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Proportions {
    /// `readproportion` (YCSB default 0.95).
    pub read: f64,
    /// `updateproportion` (YCSB default 0.05).
    pub update: f64,
    /// `insertproportion` (default 0).
    pub insert: f64,
    /// `scanproportion` (default 0).
    pub scan: f64,
    /// `readmodifywriteproportion` (default 0).
    pub read_modify_write: f64,
}

impl Proportions {
    /// The proportion of `op`.
    pub fn of(&self, op: Operation) -> f64 {
        match op {
            Operation::Read => self.read,
            Operation::Update => self.update,
            Operation::Insert => self.insert,
            Operation::Scan => self.scan,
            Operation::ReadModifyWrite => self.read_modify_write,
        }
    }
}

impl Default for Proportions {
    fn default() -> Self {
        Self {
            read: 0.95,
            update: 0.05,
            insert: 0.0,
            scan: 0.0,
            read_modify_write: 0.0,
        }
    }
}

/// A YCSB core workload.
///
/// A record is stored as one value of `field_count * field_length` bytes
/// ([`Workload::value_size`]): the hash store has no fields, so an update
/// rewrites the whole value (YCSB's default `writeallfields=false` writes one
/// field).
///
/// Fields are public for inspection and tweaking; [`Workload::validate`]
/// checks a hand-built one, and everything that builds generators from a
/// workload calls it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// `recordcount`: records loaded, keys `0..recordcount` (must be >= 1).
    pub record_count: u64,
    /// `operationcount`: operations in the run phase (YCSB default 0, which
    /// the driver may read as "until a time limit").
    pub operation_count: u64,
    /// The operation mix.
    pub proportions: Proportions,
    /// `requestdistribution`.
    pub request_distribution: RequestDistribution,
    /// `fieldcount` (default 10).
    pub field_count: u64,
    /// `fieldlength` in bytes (default 100; only the `constant` field length
    /// distribution is supported).
    pub field_length: u64,
    /// `insertorder` (default hashed).
    pub insert_order: InsertOrder,
    /// `zeropadding` (default 1).
    pub zero_padding: usize,
    /// `insertstart`: first key this client loads (default 0).
    pub insert_start: u64,
    /// `insertcount`: keys this client loads (default `recordcount - insertstart`).
    pub insert_count: u64,
}

/// Largest `zeropadding` accepted (keys stay short enough for a KV block).
const MAX_ZERO_PADDING: usize = 256;

impl Workload {
    /// The most keys a store holds after this workload's load and run
    /// phases: `recordcount` plus the run's inserts (`operationcount *
    /// insertproportion`, rounded up). What an embedded store's table is
    /// presized for.
    pub fn key_count_bound(&self) -> u64 {
        let inserts = (self.operation_count as f64 * self.proportions.insert).ceil();
        self.record_count.saturating_add(inserts as u64)
    }

    /// One of YCSB's core workloads, `'a'` to `'f'` (either case), with the
    /// settings of YCSB's `workloads/workload[a-f]` files (1000 records, 1000
    /// operations).
    ///
    /// Workload E (95% scans) is represented, but a hash store cannot run it:
    /// see [`Workload::ensure_no_scan`].
    ///
    /// # Errors
    /// [`YcsbError::UnknownPreset`] for any other letter.
    pub fn preset(letter: char) -> Result<Self> {
        Self::from_properties(&Self::preset_properties(letter)?)
    }

    /// The properties of YCSB's core workload `letter` (the files under
    /// `workloads/`), to override before building it.
    ///
    /// # Errors
    /// [`YcsbError::UnknownPreset`] for a letter other than a-f.
    pub fn preset_properties(letter: char) -> Result<Properties> {
        let mix = match letter.to_ascii_lowercase() {
            'a' => {
                "readproportion=0.5\nupdateproportion=0.5\nscanproportion=0\ninsertproportion=0\n\
                    requestdistribution=zipfian"
            }
            'b' => {
                "readproportion=0.95\nupdateproportion=0.05\nscanproportion=0\ninsertproportion=0\n\
                    requestdistribution=zipfian"
            }
            'c' => {
                "readproportion=1\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\n\
                    requestdistribution=zipfian"
            }
            'd' => {
                "readproportion=0.95\nupdateproportion=0\nscanproportion=0\ninsertproportion=0.05\n\
                    requestdistribution=latest"
            }
            'e' => {
                "readproportion=0\nupdateproportion=0\nscanproportion=0.95\ninsertproportion=0.05\n\
                    requestdistribution=zipfian\nmaxscanlength=100\nscanlengthdistribution=uniform"
            }
            'f' => {
                "readproportion=0.5\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\n\
                    readmodifywriteproportion=0.5\nrequestdistribution=zipfian"
            }
            _ => return Err(YcsbError::UnknownPreset(letter)),
        };
        let text = format!(
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\n\
             readallfields=true\n{mix}\n"
        );
        Properties::parse(&text)
    }

    /// Parses the text of a YCSB property file.
    ///
    /// # Errors
    /// As [`Properties::parse`] and [`Workload::from_properties`].
    pub fn parse(text: &str) -> Result<Self> {
        Self::from_properties(&Properties::parse(text)?)
    }

    /// Reads a YCSB property file (e.g. YCSB's own `workloads/workloada`).
    ///
    /// # Errors
    /// As [`Properties::from_file`] and [`Workload::from_properties`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_properties(&Properties::from_file(path)?)
    }

    /// Builds a workload from properties, with YCSB's defaults for those not
    /// set. Properties this crate does not use (`readallfields`,
    /// `maxscanlength`, `table`, database settings, ...) are ignored, as YCSB
    /// ignores what a workload does not read.
    ///
    /// # Errors
    /// - [`YcsbError::InvalidValue`]: a number that does not parse or is out
    ///   of range (proportions must lie in `[0, 1]`, `recordcount` and
    ///   `fieldcount` must be >= 1, ...), an unknown distribution or order;
    /// - [`YcsbError::Unsupported`]: a YCSB feature not implemented here
    ///   (`hotspot`/`sequential`/`exponential` request distributions, a
    ///   non-constant field length distribution, another workload class);
    /// - [`YcsbError::NoOperations`], [`YcsbError::InsertRange`]: see
    ///   [`Workload::validate`].
    pub fn from_properties(p: &Properties) -> Result<Self> {
        if let Some(class) = p.get("workload") {
            if !matches!(
                class,
                "site.ycsb.workloads.CoreWorkload" | "com.yahoo.ycsb.workloads.CoreWorkload"
            ) {
                return Err(unsupported(
                    "workload",
                    class,
                    "only the core workload (CoreWorkload)",
                ));
            }
        }
        if let Some(dist) = p.get("fieldlengthdistribution") {
            if dist != "constant" {
                return Err(unsupported(
                    "fieldlengthdistribution",
                    dist,
                    "only constant field lengths",
                ));
            }
        }
        let record_count = get_u64(p, "recordcount")?.unwrap_or(0);
        if record_count == 0 {
            return Err(invalid(
                "recordcount",
                p.get("recordcount").unwrap_or(""),
                "must be at least 1 (YCSB reads 0 or a missing count as 2^31-1 records; set it)",
            ));
        }
        let defaults = Proportions::default();
        let proportions = Proportions {
            read: get_proportion(p, "readproportion")?.unwrap_or(defaults.read),
            update: get_proportion(p, "updateproportion")?.unwrap_or(defaults.update),
            insert: get_proportion(p, "insertproportion")?.unwrap_or(defaults.insert),
            scan: get_proportion(p, "scanproportion")?.unwrap_or(defaults.scan),
            read_modify_write: get_proportion(p, "readmodifywriteproportion")?
                .unwrap_or(defaults.read_modify_write),
        };
        let request_distribution = match p.get("requestdistribution") {
            None | Some("uniform") => RequestDistribution::Uniform,
            Some("zipfian") => RequestDistribution::Zipfian,
            Some("latest") => RequestDistribution::Latest,
            Some(other @ ("hotspot" | "sequential" | "exponential")) => {
                return Err(unsupported(
                    "requestdistribution",
                    other,
                    "use uniform, zipfian or latest",
                ))
            }
            Some(other) => {
                return Err(invalid(
                    "requestdistribution",
                    other,
                    "expected uniform, zipfian or latest",
                ))
            }
        };
        let insert_order = match p.get("insertorder") {
            None | Some("hashed") => InsertOrder::Hashed,
            Some("ordered") => InsertOrder::Ordered,
            Some(other) => return Err(invalid("insertorder", other, "expected hashed or ordered")),
        };
        let field_count = get_u64(p, "fieldcount")?.unwrap_or(10);
        let field_length = get_u64(p, "fieldlength")?.unwrap_or(100);
        let zero_padding = get_u64(p, "zeropadding")?.unwrap_or(1);
        let zero_padding = usize::try_from(zero_padding)
            .ok()
            .filter(|&z| z <= MAX_ZERO_PADDING)
            .ok_or_else(|| {
                invalid(
                    "zeropadding",
                    p.get("zeropadding").unwrap_or(""),
                    &format!("at most {MAX_ZERO_PADDING}"),
                )
            })?;
        let insert_start = get_u64(p, "insertstart")?.unwrap_or(0);
        let insert_count = match get_u64(p, "insertcount")? {
            Some(n) => n,
            None => record_count
                .checked_sub(insert_start)
                .ok_or(YcsbError::InsertRange {
                    start: insert_start,
                    count: 0,
                    records: record_count,
                })?,
        };
        let workload = Self {
            record_count,
            operation_count: get_u64(p, "operationcount")?.unwrap_or(0),
            proportions,
            request_distribution,
            field_count,
            field_length,
            insert_order,
            zero_padding,
            insert_start,
            insert_count,
        };
        workload.validate()?;
        Ok(workload)
    }

    /// Checks a workload's consistency.
    ///
    /// # Errors
    /// - [`YcsbError::InvalidValue`] for a count of zero where at least one is
    ///   needed, a proportion outside `[0, 1]` or a value size that overflows;
    /// - [`YcsbError::NoOperations`] if every proportion is zero;
    /// - [`YcsbError::InsertRange`] if `insertstart + insertcount` exceeds
    ///   `recordcount` (or `insertcount` is 0).
    pub fn validate(&self) -> Result<()> {
        if self.record_count == 0 {
            return Err(invalid("recordcount", "0", "must be at least 1"));
        }
        if self.field_count == 0 {
            return Err(invalid("fieldcount", "0", "must be at least 1"));
        }
        if self.field_length == 0 {
            return Err(invalid("fieldlength", "0", "must be at least 1"));
        }
        if self.field_count.checked_mul(self.field_length).is_none() {
            return Err(invalid(
                "fieldlength",
                &self.field_length.to_string(),
                "fieldcount * fieldlength overflows",
            ));
        }
        for op in Operation::ALL {
            let v = self.proportions.of(op);
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(
                    proportion_key(op),
                    &v.to_string(),
                    "must lie in [0, 1]",
                ));
            }
        }
        if Operation::ALL
            .iter()
            .all(|&op| self.proportions.of(op) == 0.0)
        {
            return Err(YcsbError::NoOperations);
        }
        let end = self.insert_start.checked_add(self.insert_count);
        if self.insert_count == 0 || end.is_none_or(|end| end > self.record_count) {
            return Err(YcsbError::InsertRange {
                start: self.insert_start,
                count: self.insert_count,
                records: self.record_count,
            });
        }
        if self.zero_padding > MAX_ZERO_PADDING {
            return Err(invalid(
                "zeropadding",
                &self.zero_padding.to_string(),
                "at most 256",
            ));
        }
        Ok(())
    }

    /// Fails with [`YcsbError::ScanUnsupported`] if the workload has scans.
    ///
    /// A hash store keeps no key order, so it cannot serve YCSB's range scans
    /// (workload E); drivers over the RACE store call this before running.
    ///
    /// # Errors
    /// [`YcsbError::ScanUnsupported`] when `scanproportion > 0`.
    pub fn ensure_no_scan(&self) -> Result<()> {
        if self.proportions.scan > 0.0 {
            Err(YcsbError::ScanUnsupported {
                proportion: self.proportions.scan,
            })
        } else {
            Ok(())
        }
    }

    /// Bytes of one record's value: `fieldcount * fieldlength` (saturating;
    /// [`Workload::validate`] rejects an overflow).
    pub fn value_size(&self) -> u64 {
        self.field_count.saturating_mul(self.field_length)
    }

    /// The key name of key number `keynum` (YCSB's `buildKeyName`).
    pub fn key_name(&self, keynum: u64) -> String {
        build_key_name(keynum, self.insert_order, self.zero_padding)
    }

    /// [`Workload::key_name`] into `key`, reusing its storage.
    pub fn write_key_name(&self, keynum: u64, key: &mut String) {
        write_key_name(key, keynum, self.insert_order, self.zero_padding)
    }

    /// The key numbers this client loads: `insertstart..insertstart + insertcount`.
    pub fn load_range(&self) -> std::ops::Range<u64> {
        self.insert_start..self.insert_start.saturating_add(self.insert_count)
    }

    /// Inserts expected during the run, which YCSB adds to the zipfian key
    /// space up front: `(int) (operationcount * insertproportion * 2.0)`.
    pub fn expected_new_keys(&self) -> u64 {
        // `as` saturates (and maps NaN to 0); a valid proportion is finite.
        (self.operation_count as f64 * self.proportions.insert * 2.0) as u64
    }

    /// YCSB's operation chooser: a discrete distribution over the operations
    /// with a positive proportion, in YCSB's order.
    ///
    /// # Errors
    /// [`YcsbError::Weights`] if the proportions are unusable (all zero or not
    /// finite); [`Workload::validate`] reports those first.
    pub fn operation_chooser(&self) -> Result<DiscreteGenerator<Operation>> {
        DiscreteGenerator::new(Operation::ALL.map(|op| (self.proportions.of(op), op)))
    }
}

/// The property name of an operation's proportion.
pub fn proportion_key(op: Operation) -> &'static str {
    match op {
        Operation::Read => "readproportion",
        Operation::Update => "updateproportion",
        Operation::Insert => "insertproportion",
        Operation::Scan => "scanproportion",
        Operation::ReadModifyWrite => "readmodifywriteproportion",
    }
}

fn invalid(key: &str, value: &str, reason: &str) -> YcsbError {
    YcsbError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

fn unsupported(key: &str, value: &str, reason: &'static str) -> YcsbError {
    YcsbError::Unsupported {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    }
}

fn get_u64(p: &Properties, key: &str) -> Result<Option<u64>> {
    p.get(key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|e| invalid(key, v, &format!("expected a non-negative integer ({e})")))
        })
        .transpose()
}

fn get_proportion(p: &Properties, key: &str) -> Result<Option<f64>> {
    p.get(key)
        .map(|v| match v.parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
            Ok(_) => Err(invalid(key, v, "must lie in [0, 1]")),
            Err(e) => Err(invalid(key, v, &format!("expected a number ({e})"))),
        })
        .transpose()
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
