//! Tests of the YCSB text format and the JSON rendering.

use std::time::Duration;

use super::*;
use crate::ycsb::workload::Operation;

/// READ: 100 successes of 1..=100 us, 2 errors of 500 us; UPDATE: 3 successes.
fn sample() -> Measurements {
    let mut m = Measurements::new();
    for us in 1..=100 {
        m.record(Operation::Read, Status::Ok, Duration::from_micros(us));
    }
    for _ in 0..2 {
        m.record(Operation::Read, Status::Error, Duration::from_micros(500));
    }
    for us in [7, 8, 9] {
        m.record(Operation::Update, Status::Ok, Duration::from_micros(us));
    }
    m
}

const EXPECTED: &str = "\
[OVERALL], RunTime(ms), 1234
[OVERALL], Throughput(ops/sec), 82.6580226904376
[READ], Operations, 100
[READ], AverageLatency(us), 50.5
[READ], MinLatency(us), 1
[READ], MaxLatency(us), 100
[READ], 50thPercentileLatency(us), 50
[READ], 95thPercentileLatency(us), 95
[READ], 99thPercentileLatency(us), 99
[READ], 99.9PercentileLatency(us), 100
[READ], Return=OK, 100
[READ], Return=ERROR, 2
[READ-FAILED], Operations, 2
[READ-FAILED], AverageLatency(us), 500.0
[READ-FAILED], MinLatency(us), 500
[READ-FAILED], MaxLatency(us), 500
[READ-FAILED], 50thPercentileLatency(us), 500
[READ-FAILED], 95thPercentileLatency(us), 500
[READ-FAILED], 99thPercentileLatency(us), 500
[READ-FAILED], 99.9PercentileLatency(us), 500
[UPDATE], Operations, 3
[UPDATE], AverageLatency(us), 8.0
[UPDATE], MinLatency(us), 7
[UPDATE], MaxLatency(us), 9
[UPDATE], 50thPercentileLatency(us), 8
[UPDATE], 95thPercentileLatency(us), 9
[UPDATE], 99thPercentileLatency(us), 9
[UPDATE], 99.9PercentileLatency(us), 9
[UPDATE], Return=OK, 3
";

#[test]
fn renders_ycsb_text_exactly() {
    // `operations` is the driver's transaction count (YCSB's opsDone), not a
    // sum over the metrics; 102 pins the throughput formula.
    let report = Report::new(&sample(), Duration::from_micros(1_234_999), 102);
    assert_eq!(report.runtime_ms, 1234, "milliseconds are truncated");
    assert_eq!(report.to_text(), EXPECTED);
}

#[test]
fn label_is_on_every_line() {
    let report =
        Report::new(&sample(), Duration::from_millis(1234), 102).with_label("modeled (cx4)");
    let text = report.to_text();
    assert_eq!(text.lines().count(), EXPECTED.lines().count());
    for line in text.lines() {
        assert!(line.contains(" (modeled (cx4))], "), "{line}");
        // Still three comma-separated fields for YCSB parsers.
        assert_eq!(line.split(", ").count(), 3, "{line}");
    }
    assert!(text.starts_with("[OVERALL (modeled (cx4))], RunTime(ms), 1234\n"));
    assert!(text.contains("[READ (modeled (cx4))], 99thPercentileLatency(us), 99\n"));
    // Same lines as the unlabeled report once the label is removed.
    assert_eq!(text.replace(" (modeled (cx4))]", "]"), EXPECTED);
}

#[test]
fn json_carries_the_same_figures() {
    let report =
        Report::new(&sample(), Duration::from_millis(1234), 102).with_label("modeled (cx4)");
    let json = report.to_json().unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["label"], "modeled (cx4)");
    assert_eq!(v["runtime_ms"], 1234);
    assert_eq!(v["operations"], 102);
    assert_eq!(v["throughput_ops_sec"], 82.6580226904376);
    let read = &v["metrics"][0];
    assert_eq!(read["name"], "READ");
    assert_eq!(read["operations"], 100);
    assert_eq!(read["average_latency_us"], 50.5);
    assert_eq!(read["min_latency_us"], 1);
    assert_eq!(read["max_latency_us"], 100);
    assert_eq!(read["percentiles"][2]["percentile"], 99.0);
    assert_eq!(read["percentiles"][2]["latency_us"], 99);
    assert_eq!(read["returns"][0]["status"], "OK");
    assert_eq!(read["returns"][1]["status"], "ERROR");
    assert_eq!(read["returns"][1]["count"], 2);
    assert_eq!(v["metrics"][1]["returns"].as_array().unwrap().len(), 0);
    // Round trip, and every JSON figure is on its text line.
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    let text = back.to_text();
    for m in &back.metrics {
        let g = format!("[{} (modeled (cx4))]", m.name);
        assert!(text.contains(&format!("{g}, Operations, {}\n", m.operations)));
        for p in &m.percentiles {
            let line = format!(
                "{g}, {}PercentileLatency(us), {}\n",
                ordinal(p.percentile),
                p.latency_us
            );
            assert!(text.contains(&line), "{line}");
        }
    }
}

#[test]
fn zero_runtime_and_empty_measurements() {
    let report = Report::new(&Measurements::new(), Duration::ZERO, 5);
    assert_eq!(report.throughput_ops_sec, None);
    assert_eq!(
        report.to_text(),
        "[OVERALL], RunTime(ms), 0\n[OVERALL], Throughput(ops/sec), Infinity\n"
    );
    let report = Report::new(&Measurements::new(), Duration::ZERO, 0);
    assert!(report.to_text().ends_with("Throughput(ops/sec), NaN\n"));
    assert!(report
        .to_json()
        .unwrap()
        .contains("\"throughput_ops_sec\": null"));
}

#[test]
fn metric_with_only_failures() {
    let mut m = Measurements::new();
    m.record(Operation::Insert, Status::Error, Duration::from_micros(10));
    let report = Report::new(&m, Duration::from_millis(10), 1);
    let insert = report.metric("INSERT").unwrap();
    assert_eq!(insert.operations, 0);
    assert_eq!((insert.min_latency_us, insert.max_latency_us), (0, 0));
    assert_eq!(insert.average_latency_us, 0.0);
    let text = report.to_text();
    assert!(text.contains("[INSERT], AverageLatency(us), 0.0\n"));
    assert!(text.contains("[INSERT], Return=OK, 0\n"));
    assert!(text.contains("[INSERT], Return=ERROR, 1\n"));
    assert!(text.contains("[INSERT-FAILED], Operations, 1\n"));
    assert!(!text.contains("NOT_FOUND"));
}

#[test]
fn custom_percentiles() {
    let report = Report::with_percentiles(
        &sample(),
        Duration::from_millis(1),
        1,
        &[1.0, 2.0, 3.0, 11.0, 99.99],
    )
    .unwrap();
    let text = report.to_text();
    for name in ["1st", "2nd", "3rd", "11th", "99.99"] {
        assert!(
            text.contains(&format!("[READ], {name}PercentileLatency(us), ")),
            "{name}"
        );
    }
    for bad in [-1.0, 100.5, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Report::with_percentiles(&sample(), Duration::ZERO, 0, &[50.0, bad]),
            Err(YcsbError::Percentile(_))
        ));
    }
}

#[test]
fn java_double_formatting() {
    let cases: [(f64, &str); 14] = [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (50.5, "50.5"),
        (1000.0, "1000.0"),
        (428.57142857142856, "428.57142857142856"),
        (0.001, "0.001"),
        (0.0001, "1.0E-4"),
        (0.00012345, "1.2345E-4"),
        (9_999_999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (12_345_678.9, "1.23456789E7"),
        (-2.5e10, "-2.5E10"),
        (f64::INFINITY, "Infinity"),
        (f64::NAN, "NaN"),
    ];
    for (x, s) in cases {
        assert_eq!(java_double(x), s, "{x}");
    }
}

#[test]
fn ordinals_like_ycsb() {
    let cases = [
        (0.0, "0th"),
        (1.0, "1st"),
        (2.0, "2nd"),
        (3.0, "3rd"),
        (4.0, "4th"),
        (11.0, "11th"),
        (12.0, "12th"),
        (13.0, "13th"),
        (21.0, "21st"),
        (50.0, "50th"),
        (95.0, "95th"),
        (99.0, "99th"),
        (100.0, "100th"),
        (99.9, "99.9"),
        (99.99, "99.99"),
    ];
    for (p, s) in cases {
        assert_eq!(ordinal(p), s, "{p}");
    }
}
