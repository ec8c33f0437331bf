//! Latency histograms and return codes per metric, as YCSB's `DBWrapper` and
//! `OneMeasurementHdrHistogram` keep them.
//!
//! Each client thread owns a [`Measurements`] (no locks, no sharing on the
//! hot path) and the driver merges them at the end with
//! [`Measurements::merge`]. Latencies are HdrHistograms in microseconds with 3
//! significant digits, auto-resizing, like YCSB's `new Recorder(3)`. The caller
//! measures time; nothing here reads a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::error::{Result, YcsbError};
use super::workload::Operation;

/// Outcome of one database call, named as YCSB's `Status` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Status {
    /// `Return=OK`.
    #[serde(rename = "OK")]
    Ok,
    /// `Return=ERROR`: the call failed.
    #[serde(rename = "ERROR")]
    Error,
    /// `Return=NOT_FOUND`: the key does not exist.
    #[serde(rename = "NOT_FOUND")]
    NotFound,
}

impl Status {
    /// Every status, in the order reports print them.
    pub const ALL: [Status; 3] = [Status::Ok, Status::Error, Status::NotFound];

    /// YCSB's name for it (`OK`, `ERROR`, `NOT_FOUND`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Error => "ERROR",
            Status::NotFound => "NOT_FOUND",
        }
    }

    /// Whether the call succeeded.
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }

    fn index(self) -> usize {
        match self {
            Status::Ok => 0,
            Status::Error => 1,
            Status::NotFound => 2,
        }
    }
}

/// One metric (e.g. `READ`): a latency histogram in microseconds and a count
/// per return status.
#[derive(Debug, Clone)]
pub struct Metric {
    histogram: Histogram<u64>,
    returns: [u64; 3],
    /// Attempts the store restarted (failed CAS, ...) for this metric's
    /// operations; `None` when the backend does not count them.
    retries: Option<u64>,
}

impl Metric {
    fn new() -> Self {
        Self {
            // 3 significant digits is within hdrhistogram's 0..=5: cannot fail.
            histogram: Histogram::new(3).expect("sigfig 3 is a valid histogram precision"),
            returns: [0; 3],
            retries: None,
        }
    }

    fn record_micros(&mut self, micros: u64) {
        // Auto-resizing up to i64::MAX / 2 us; clamp anything beyond.
        if self.histogram.record(micros).is_err() {
            self.histogram.saturating_record(micros);
        }
    }

    /// The latency histogram (microseconds).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.histogram
    }

    /// Latencies recorded (YCSB's `Operations` line).
    pub fn operations(&self) -> u64 {
        self.histogram.len()
    }

    /// How many calls returned `status`.
    pub fn count(&self, status: Status) -> u64 {
        self.returns[status.index()]
    }

    /// Attempts restarted by the store for these operations (`None`: the
    /// backend does not count them).
    pub fn retries(&self) -> Option<u64> {
        self.retries
    }

    /// Whether any return status was counted.
    pub fn has_returns(&self) -> bool {
        self.returns.iter().any(|&c| c > 0)
    }
}

/// All metrics of one client thread (or the merge of several), by name.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    metrics: BTreeMap<String, Metric>,
}

impl Measurements {
    /// No measurements.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one database call the way YCSB's `DBWrapper` does: the status
    /// is counted under the operation's metric (`READ`); the latency goes to
    /// that metric if the call succeeded and to `<OP>-FAILED` (`READ-FAILED`)
    /// otherwise, so failures do not distort the latency of successes.
    ///
    /// Latency is truncated to whole microseconds, as YCSB's `/ 1000`.
    ///
    /// YCSB measures a read-modify-write three times: the read as `READ`, the
    /// write as `UPDATE` (both through `DBWrapper`) and the whole as
    /// `READ-MODIFY-WRITE` (latency only). A driver reproduces that by
    /// recording `Read` and `Update` for the two calls and the total with
    /// [`Measurements::record_latency`]`(Operation::ReadModifyWrite.metric_name(), ..)`.
    pub fn record(&mut self, op: Operation, status: Status, latency: Duration) {
        let name = op.metric_name();
        let micros = duration_micros(latency);
        if status.is_ok() {
            self.record_latency(name, micros);
        } else {
            self.record_latency(&format!("{name}-FAILED"), micros);
        }
        self.report_status(name, status);
    }

    /// Adds one latency in microseconds to `metric` (YCSB's
    /// `Measurements.measure`).
    pub fn record_latency(&mut self, metric: &str, micros: u64) {
        self.metric_mut(metric).record_micros(micros);
    }

    /// Adds `n` restarted attempts (failed CASes, ...) to `op`'s metric:
    /// the report's `[UPDATE], Retries` line.
    pub fn add_retries(&mut self, op: Operation, n: u64) {
        let m = self.metric_mut(op.metric_name());
        m.retries = Some(m.retries.unwrap_or(0) + n);
    }

    /// Counts one return status under `metric` (YCSB's `reportStatus`).
    pub fn report_status(&mut self, metric: &str, status: Status) {
        self.metric_mut(metric).returns[status.index()] += 1;
    }

    fn metric_mut(&mut self, metric: &str) -> &mut Metric {
        if !self.metrics.contains_key(metric) {
            self.metrics.insert(metric.to_owned(), Metric::new());
        }
        // Just inserted if it was missing.
        self.metrics
            .get_mut(metric)
            .expect("metric present after insert")
    }

    /// Adds every histogram and count of `other` into `self` (e.g. the
    /// measurements of another client thread).
    ///
    /// # Errors
    /// [`YcsbError::Merge`] if hdrhistogram cannot add two histograms (not
    /// expected with auto-resizing histograms); `self` may then hold part of
    /// `other`.
    pub fn merge(&mut self, other: &Measurements) -> Result<()> {
        for (name, theirs) in &other.metrics {
            let ours = self.metric_mut(name);
            ours.histogram
                .add(&theirs.histogram)
                .map_err(|source| YcsbError::Merge {
                    metric: name.clone(),
                    source,
                })?;
            for (mine, their) in ours.returns.iter_mut().zip(theirs.returns) {
                *mine += their;
            }
            if let Some(r) = theirs.retries {
                ours.retries = Some(ours.retries.unwrap_or(0) + r);
            }
        }
        Ok(())
    }

    /// The metric called `name`, if anything was recorded under it.
    pub fn get(&self, name: &str) -> Option<&Metric> {
        self.metrics.get(name)
    }

    /// All metrics, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Metric)> {
        self.metrics.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty()
    }
}

/// One metric in [`MeasurementsWire`]: its name, return counts and the
/// histogram's recorded buckets as `(value, count)` pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricWire {
    /// Metric name (`READ`, `UPDATE-FAILED`, ...).
    pub name: String,
    /// Counts of `OK`, `ERROR`, `NOT_FOUND`.
    pub returns: [u64; 3],
    /// Recorded latencies: each bucket's highest equivalent value (us) and
    /// its count. Re-recording them rebuilds the same buckets, so quantiles,
    /// min and max are those of the original histogram.
    pub buckets: Vec<(u64, u64)>,
    /// Restarted attempts, when the backend counts them.
    #[serde(default)]
    pub retries: Option<u64>,
}

/// [`Measurements`] as plain data, to send from a client process to the
/// driver that merges them (JSON through serde).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasurementsWire {
    /// Every metric, in name order.
    pub metrics: Vec<MetricWire>,
}

impl Measurements {
    /// These measurements as plain data ([`Measurements::from_wire`] undoes it).
    pub fn to_wire(&self) -> MeasurementsWire {
        MeasurementsWire {
            metrics: self
                .metrics
                .iter()
                .map(|(name, m)| MetricWire {
                    name: name.clone(),
                    returns: m.returns,
                    retries: m.retries,
                    buckets: m
                        .histogram
                        .iter_recorded()
                        .map(|v| (v.value_iterated_to(), v.count_at_value()))
                        .collect(),
                })
                .collect(),
        }
    }

    /// Rebuilds measurements sent by [`Measurements::to_wire`].
    ///
    /// # Errors
    /// [`YcsbError::Wire`] for buckets not in strictly increasing value
    /// order (as `to_wire` writes them: anything else is not its output) or
    /// a bucket the histogram refuses.
    pub fn from_wire(wire: &MeasurementsWire) -> Result<Measurements> {
        let mut out = Measurements::new();
        for w in &wire.metrics {
            let m = out.metric_mut(&w.name);
            m.returns = w.returns;
            m.retries = w.retries;
            let mut prev = None;
            for &(value, count) in &w.buckets {
                if prev.is_some_and(|p| value <= p) {
                    return Err(YcsbError::Wire {
                        metric: w.name.clone(),
                        reason: format!("bucket {value} out of order"),
                    });
                }
                prev = Some(value);
                m.histogram
                    .record_n(value, count)
                    .map_err(|e| YcsbError::Wire {
                        metric: w.name.clone(),
                        reason: format!("{e:?}"),
                    })?;
            }
        }
        Ok(out)
    }
}

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_go_to_their_own_histogram() {
        let mut m = Measurements::new();
        m.record(Operation::Read, Status::Ok, Duration::from_nanos(12_999));
        m.record(Operation::Read, Status::NotFound, Duration::from_micros(40));
        m.record(Operation::Read, Status::Error, Duration::from_micros(50));
        let read = m.get("READ").unwrap();
        assert_eq!(read.operations(), 1);
        assert_eq!(
            read.histogram().max(),
            12,
            "truncated to whole microseconds"
        );
        assert_eq!(read.count(Status::Ok), 1);
        assert_eq!(read.count(Status::NotFound), 1);
        assert_eq!(read.count(Status::Error), 1);
        let failed = m.get("READ-FAILED").unwrap();
        assert_eq!(failed.operations(), 2);
        assert!(!failed.has_returns());
        let names: Vec<_> = m.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["READ", "READ-FAILED"]);
    }

    #[test]
    fn extreme_latencies_do_not_panic() {
        let mut m = Measurements::new();
        m.record(Operation::Update, Status::Ok, Duration::MAX);
        m.record(Operation::Update, Status::Ok, Duration::ZERO);
        let u = m.get("UPDATE").unwrap();
        assert_eq!(u.operations(), 2);
        assert_eq!(u.histogram().min(), 0);
    }

    #[test]
    fn wire_round_trip_keeps_histograms_and_counts() {
        let mut m = Measurements::new();
        for i in 0..5000u64 {
            m.record(
                Operation::Read,
                Status::Ok,
                Duration::from_micros(i * 7 % 3001),
            );
        }
        m.record(Operation::Update, Status::Error, Duration::from_millis(40));
        m.record(
            Operation::Update,
            Status::NotFound,
            Duration::from_micros(3),
        );
        m.add_retries(Operation::Update, 3);
        m.add_retries(Operation::Update, 4);
        let json = serde_json::to_string(&m.to_wire()).unwrap();
        let back = Measurements::from_wire(&serde_json::from_str(&json).unwrap()).unwrap();
        let names: Vec<_> = back.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(names, ["READ", "UPDATE", "UPDATE-FAILED"]);
        for (name, a) in m.iter() {
            let b = back.get(name).unwrap();
            assert_eq!(a.operations(), b.operations(), "{name}");
            for q in [0.0, 0.5, 0.95, 0.99, 0.999, 1.0] {
                assert_eq!(
                    a.histogram().value_at_quantile(q),
                    b.histogram().value_at_quantile(q),
                    "{name} q{q}"
                );
            }
            assert_eq!(a.histogram().min(), b.histogram().min());
            assert_eq!(a.histogram().max(), b.histogram().max());
            for s in Status::ALL {
                assert_eq!(a.count(s), b.count(s));
            }
            assert_eq!(a.retries(), b.retries(), "{name}");
        }
        assert_eq!(back.get("UPDATE").unwrap().retries(), Some(7));
        assert_eq!(
            back.get("READ").unwrap().retries(),
            None,
            "not counted: absent"
        );
        // Merged: summed where counted.
        let mut twice = back.clone();
        twice.merge(&back).unwrap();
        assert_eq!(twice.get("UPDATE").unwrap().retries(), Some(14));
        // Older wire data without the field reads as not counted.
        let old: MeasurementsWire = serde_json::from_str(
            r#"{"metrics":[{"name":"READ","returns":[1,0,0],"buckets":[[5,1]]}]}"#,
        )
        .unwrap();
        assert_eq!(
            Measurements::from_wire(&old)
                .unwrap()
                .get("READ")
                .unwrap()
                .retries(),
            None
        );
        let bad = MeasurementsWire {
            metrics: vec![MetricWire {
                name: "READ".into(),
                returns: [0; 3],
                buckets: vec![(40, 1), (12, 1)],
                retries: None,
            }],
        };
        assert!(matches!(
            Measurements::from_wire(&bad),
            Err(YcsbError::Wire { .. })
        ));
    }

    #[test]
    fn histograms_from_several_threads_merge() {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut m = Measurements::new();
                    for i in 0..1000u64 {
                        let status = if i % 100 == 0 {
                            Status::Error
                        } else {
                            Status::Ok
                        };
                        m.record(Operation::Read, status, Duration::from_micros(t * 1000 + i));
                    }
                    m
                })
            })
            .collect();
        let mut merged = Measurements::new();
        for t in threads {
            merged.merge(&t.join().unwrap()).unwrap();
        }
        let mut single = Measurements::new();
        for t in 0..4u64 {
            for i in 0..1000u64 {
                let status = if i % 100 == 0 {
                    Status::Error
                } else {
                    Status::Ok
                };
                single.record(Operation::Read, status, Duration::from_micros(t * 1000 + i));
            }
        }
        for name in ["READ", "READ-FAILED"] {
            let (a, b) = (merged.get(name).unwrap(), single.get(name).unwrap());
            assert_eq!(a.histogram(), b.histogram(), "{name}");
            for s in Status::ALL {
                assert_eq!(a.count(s), b.count(s));
            }
        }
        let read = merged.get("READ").unwrap();
        assert_eq!(read.operations(), 3960);
        assert_eq!(read.count(Status::Ok), 3960);
        assert_eq!(read.count(Status::Error), 40);
        assert_eq!(read.histogram().min(), 1);
        assert_eq!(read.histogram().max(), 3999);
    }
}
