//! The end-of-run report in YCSB's text format, and as JSON.
//!
//! A [`Report`] holds the figures (not the histograms), so the text and the
//! JSON are two renderings of the same numbers. The text is what YCSB's
//! `TextMeasurementsExporter` writes:
//!
//! ```text
//! [OVERALL], RunTime(ms), 1234
//! [OVERALL], Throughput(ops/sec), 82.6580226904376
//! [READ], Operations, 100
//! [READ], AverageLatency(us), 50.5
//! [READ], MinLatency(us), 1
//! [READ], MaxLatency(us), 100
//! [READ], 50thPercentileLatency(us), 50
//! [READ], 95thPercentileLatency(us), 95
//! [READ], 99thPercentileLatency(us), 99
//! [READ], 99.9PercentileLatency(us), 100
//! [READ], Return=OK, 100
//! ```
//!
//! Numbers are printed as Java prints them (`long`s plainly, `double`s with
//! `Double.toString`: `50.5`, `1000.0`, `1.0E7`). YCSB prints percentiles 95
//! and 99 by default; we add 50 and 99.9 ([`DEFAULT_PERCENTILES`]), with YCSB's
//! own naming for them (`hdrhistogram.percentiles=50,95,99,99.9`). Metrics are
//! printed in name order (YCSB's order is that of a hash map).
//!
//! A report made under a latency model carries a label, and the label is part
//! of every line's metric name: `[READ (modeled (cx4))], Operations, 100`. A
//! parser that splits on `", "` still sees three fields, and modeled figures
//! can never be mistaken for measured ones.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{Result, YcsbError};
use super::measure::{Measurements, Metric, Status};

/// Percentiles reported by default: YCSB's 95 and 99, plus 50 and 99.9.
pub const DEFAULT_PERCENTILES: [f64; 4] = [50.0, 95.0, 99.0, 99.9];

/// The figures of one run, ready to print as YCSB text or JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Set when the figures do not come from plain measurement, e.g.
    /// `"modeled (cx4)"`; printed on every line.
    pub label: Option<String>,
    /// `[OVERALL], RunTime(ms)`.
    pub runtime_ms: u64,
    /// Operations done (YCSB's `opsDone`: one per transaction, failed or not).
    pub operations: u64,
    /// `[OVERALL], Throughput(ops/sec)`: `1000 * operations / runtime_ms`;
    /// `None` when the runtime is 0 ms (YCSB would print `Infinity`).
    pub throughput_ops_sec: Option<f64>,
    /// One entry per metric, in name order.
    pub metrics: Vec<MetricReport>,
}

/// The figures of one metric (`[READ]`, `[READ-FAILED]`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricReport {
    /// Metric name, e.g. `READ`.
    pub name: String,
    /// `Operations`: latencies recorded.
    pub operations: u64,
    /// `AverageLatency(us)`.
    pub average_latency_us: f64,
    /// `MinLatency(us)`.
    pub min_latency_us: u64,
    /// `MaxLatency(us)`.
    pub max_latency_us: u64,
    /// `<p>PercentileLatency(us)` lines, in the order requested.
    pub percentiles: Vec<PercentileLatency>,
    /// `Return=<STATUS>` counts. Empty when the metric counts no statuses
    /// (`-FAILED` metrics); otherwise `OK` always, others when nonzero.
    pub returns: Vec<ReturnCount>,
    /// `Retries`: attempts the store restarted (failed CAS, ...) for these
    /// operations; absent when the backend does not count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u64>,
}

/// One percentile of a latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PercentileLatency {
    /// The percentile, in `[0, 100]`.
    pub percentile: f64,
    /// Latency at that percentile, microseconds.
    pub latency_us: u64,
}

/// How many calls returned one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReturnCount {
    /// The status.
    pub status: Status,
    /// Its count.
    pub count: u64,
}

impl Report {
    /// Summarizes `measurements` for a run of `operations` transactions that
    /// took `runtime` (truncated to whole milliseconds), with the
    /// [`DEFAULT_PERCENTILES`].
    pub fn new(measurements: &Measurements, runtime: Duration, operations: u64) -> Self {
        Self::build(measurements, runtime, operations, &DEFAULT_PERCENTILES)
    }

    /// Like [`Report::new`] with chosen percentiles (YCSB's
    /// `hdrhistogram.percentiles`).
    ///
    /// # Errors
    /// [`YcsbError::Percentile`] for a percentile outside `[0, 100]`.
    pub fn with_percentiles(
        measurements: &Measurements,
        runtime: Duration,
        operations: u64,
        percentiles: &[f64],
    ) -> Result<Self> {
        if let Some(&bad) = percentiles.iter().find(|p| !(0.0..=100.0).contains(*p)) {
            return Err(YcsbError::Percentile(bad));
        }
        Ok(Self::build(measurements, runtime, operations, percentiles))
    }

    fn build(
        measurements: &Measurements,
        runtime: Duration,
        operations: u64,
        percentiles: &[f64],
    ) -> Self {
        let runtime_ms = u64::try_from(runtime.as_millis()).unwrap_or(u64::MAX);
        let metrics = measurements
            .iter()
            .map(|(name, metric)| MetricReport::new(name, metric, percentiles))
            .collect();
        let mut report = Self {
            label: None,
            runtime_ms,
            operations,
            throughput_ops_sec: None,
            metrics,
        };
        let throughput = report.throughput();
        report.throughput_ops_sec = throughput.is_finite().then_some(throughput);
        report
    }

    /// Marks the figures, e.g. `"modeled (cx4)"` for figures made under a
    /// latency model. The label appears on every printed line.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// YCSB's throughput, `1000.0 * operations / runtime_ms` (a Java double:
    /// `Infinity` or `NaN` when the runtime is 0).
    pub fn throughput(&self) -> f64 {
        1000.0 * self.operations as f64 / self.runtime_ms as f64
    }

    /// The metric called `name`.
    pub fn metric(&self, name: &str) -> Option<&MetricReport> {
        self.metrics.iter().find(|m| m.name == name)
    }

    /// The report as pretty-printed JSON, with the same figures as the text.
    ///
    /// # Errors
    /// Only if serde_json fails to write, which these types do not cause.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// The text report (same as `to_string()`), one line per figure.
    pub fn to_text(&self) -> String {
        self.to_string()
    }

    fn group(&self, name: &str) -> String {
        match &self.label {
            Some(label) => format!("[{name} ({label})]"),
            None => format!("[{name}]"),
        }
    }
}

impl MetricReport {
    fn new(name: &str, metric: &Metric, percentiles: &[f64]) -> Self {
        let h = metric.histogram();
        let empty = h.is_empty();
        let returns = if metric.has_returns() {
            Status::ALL
                .iter()
                .map(|&status| ReturnCount {
                    status,
                    count: metric.count(status),
                })
                .filter(|r| r.status.is_ok() || r.count > 0)
                .collect()
        } else {
            Vec::new()
        };
        Self {
            name: name.to_owned(),
            operations: h.len(),
            // hdrhistogram gives 0 for an empty histogram, as Java's does.
            average_latency_us: h.mean(),
            min_latency_us: if empty { 0 } else { h.min() },
            max_latency_us: if empty { 0 } else { h.max() },
            percentiles: percentiles
                .iter()
                .map(|&percentile| PercentileLatency {
                    percentile,
                    latency_us: if empty {
                        0
                    } else {
                        h.value_at_percentile(percentile)
                    },
                })
                .collect(),
            returns,
            retries: metric.retries(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let overall = self.group("OVERALL");
        writeln!(f, "{overall}, RunTime(ms), {}", self.runtime_ms)?;
        writeln!(
            f,
            "{overall}, Throughput(ops/sec), {}",
            java_double(self.throughput())
        )?;
        for m in &self.metrics {
            let g = self.group(&m.name);
            writeln!(f, "{g}, Operations, {}", m.operations)?;
            writeln!(
                f,
                "{g}, AverageLatency(us), {}",
                java_double(m.average_latency_us)
            )?;
            writeln!(f, "{g}, MinLatency(us), {}", m.min_latency_us)?;
            writeln!(f, "{g}, MaxLatency(us), {}", m.max_latency_us)?;
            for p in &m.percentiles {
                writeln!(
                    f,
                    "{g}, {}PercentileLatency(us), {}",
                    ordinal(p.percentile),
                    p.latency_us
                )?;
            }
            for r in &m.returns {
                writeln!(f, "{g}, Return={}, {}", r.status.name(), r.count)?;
            }
            if let Some(n) = m.retries {
                writeln!(f, "{g}, Retries, {n}")?;
            }
        }
        Ok(())
    }
}

/// Java's `Double.toString` for a double (JDK 19 and later, which print the
/// shortest decimal that reads back to the same double, as Rust does).
pub fn java_double(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let magnitude = x.abs();
    if magnitude == 0.0 || (1e-3..1e7).contains(&magnitude) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Computerized scientific notation: `d.dddE[-]n`.
        let s = format!("{x:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        if mantissa.contains('.') {
            format!("{mantissa}E{exponent}")
        } else {
            format!("{mantissa}.0E{exponent}")
        }
    }
}

/// YCSB's `OneMeasurementHdrHistogram.ordinal`: `50` -> `50th`, `1` -> `1st`,
/// `99.9` -> `99.9`.
pub fn ordinal(percentile: f64) -> String {
    if percentile.fract() == 0.0 && percentile.abs() < 1e15 {
        let j = percentile as i64;
        let suffix = match (j % 100, j % 10) {
            (11..=13, _) => "th",
            (_, 1) => "st",
            (_, 2) => "nd",
            (_, 3) => "rd",
            _ => "th",
        };
        format!("{j}{suffix}")
    } else {
        java_double(percentile)
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
