//! Tests of workload parsing, defaults, presets and errors.

use super::*;

/// YCSB's own `workloads/workloada` settings, comments included.
const WORKLOAD_A: &str = "\
# Yahoo! Cloud System Benchmark
# Workload A: Update heavy workload
#   Application example: Session store recording recent actions
#
#   Read/update ratio: 50/50
#   Default data size: 1 KB records (10 fields, 100 bytes each, plus key)
#   Request distribution: zipfian

recordcount=1000
operationcount=1000
workload=site.ycsb.workloads.CoreWorkload

readallfields=true

readproportion=0.5
updateproportion=0.5
scanproportion=0
insertproportion=0

requestdistribution=zipfian
";

#[test]
fn parses_ycsb_workload_file() {
    let w = Workload::parse(WORKLOAD_A).unwrap();
    assert_eq!(w, Workload::preset('a').unwrap());
    assert_eq!(w.record_count, 1000);
    assert_eq!(w.operation_count, 1000);
    assert_eq!(w.proportions.read, 0.5);
    assert_eq!(w.proportions.update, 0.5);
    assert_eq!(w.request_distribution, RequestDistribution::Zipfian);
    assert_eq!(w.field_count, 10);
    assert_eq!(w.field_length, 100);
    assert_eq!(w.value_size(), 1000);
    assert_eq!(w.insert_order, InsertOrder::Hashed);
    assert_eq!(w.load_range(), 0..1000);
    assert_eq!(w.key_name(0), "user6284781860667377211");
}

#[test]
fn ycsb_defaults_apply() {
    let w = Workload::parse("recordcount=10").unwrap();
    assert_eq!(w.proportions, Proportions::default());
    assert_eq!(w.proportions.read, 0.95);
    assert_eq!(w.proportions.update, 0.05);
    assert_eq!(w.request_distribution, RequestDistribution::Uniform);
    assert_eq!(w.operation_count, 0);
    assert_eq!(w.zero_padding, 1);
    assert_eq!((w.insert_start, w.insert_count), (0, 10));
}

#[test]
fn all_presets() {
    let p = |c| Workload::preset(c).unwrap();
    let mix = |w: &Workload| {
        let x = w.proportions;
        [x.read, x.update, x.insert, x.scan, x.read_modify_write]
    };
    assert_eq!(mix(&p('a')), [0.5, 0.5, 0.0, 0.0, 0.0]);
    assert_eq!(mix(&p('b')), [0.95, 0.05, 0.0, 0.0, 0.0]);
    assert_eq!(mix(&p('c')), [1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(mix(&p('d')), [0.95, 0.0, 0.05, 0.0, 0.0]);
    assert_eq!(mix(&p('e')), [0.0, 0.0, 0.05, 0.95, 0.0]);
    assert_eq!(mix(&p('f')), [0.5, 0.0, 0.0, 0.0, 0.5]);
    assert_eq!(p('d').request_distribution, RequestDistribution::Latest);
    for c in ['a', 'b', 'c', 'e', 'f'] {
        assert_eq!(p(c).request_distribution, RequestDistribution::Zipfian);
    }
    assert_eq!(p('A'), p('a'));
    assert!(matches!(
        Workload::preset('g'),
        Err(YcsbError::UnknownPreset('g'))
    ));
}

#[test]
fn workload_e_is_refused_for_a_hash_store() {
    for c in ['a', 'b', 'c', 'd', 'f'] {
        Workload::preset(c).unwrap().ensure_no_scan().unwrap();
    }
    let err = Workload::preset('e').unwrap().ensure_no_scan().unwrap_err();
    assert!(matches!(err, YcsbError::ScanUnsupported { proportion } if proportion == 0.95));
    let msg = err.to_string();
    assert!(msg.contains("no range scan"), "{msg}");
    assert!(msg.contains("workload E"), "{msg}");
}

#[test]
fn operation_chooser_follows_ycsb_order() {
    let w = Workload::preset('d').unwrap();
    let chooser = w.operation_chooser().unwrap();
    let probs: Vec<_> = chooser.probabilities().map(|(op, p)| (*op, p)).collect();
    assert_eq!(
        probs,
        vec![(Operation::Read, 0.95), (Operation::Insert, 0.05)]
    );
    assert_eq!(*chooser.pick(0.949), Operation::Read);
    assert_eq!(*chooser.pick(0.951), Operation::Insert);
}

#[test]
fn expected_new_keys_like_ycsb() {
    let mut w = Workload::preset('d').unwrap();
    w.operation_count = 1_000_000;
    // (int) (1e6 * 0.05 * 2.0)
    assert_eq!(w.expected_new_keys(), 100_000);
    assert_eq!(Workload::preset('a').unwrap().expected_new_keys(), 0);
}

#[test]
fn ordered_keys_and_padding() {
    let w = Workload::parse("recordcount=100\ninsertorder=ordered\nzeropadding=6").unwrap();
    assert_eq!(w.key_name(42), "user000042");
}

#[test]
fn insert_ranges() {
    let w = Workload::parse("recordcount=100\ninsertstart=40\ninsertcount=60").unwrap();
    assert_eq!(w.load_range(), 40..100);
    let w = Workload::parse("recordcount=100\ninsertstart=40").unwrap();
    assert_eq!(w.insert_count, 60);
    for bad in [
        "recordcount=100\ninsertstart=40\ninsertcount=61",
        "recordcount=100\ninsertstart=101",
        "recordcount=100\ninsertcount=0",
        "recordcount=100\ninsertstart=18446744073709551615\ninsertcount=2",
    ] {
        let err = Workload::parse(bad).unwrap_err();
        assert!(
            matches!(err, YcsbError::InsertRange { .. }),
            "{bad}: {err:?}"
        );
    }
}

/// Each bad file, and the key its error must name.
#[test]
fn bad_values_are_typed_errors() {
    let cases = [
        ("recordcount=abc", "recordcount"),
        ("recordcount=-5", "recordcount"),
        ("recordcount=0", "recordcount"),
        ("operationcount=1000", "recordcount"), // missing recordcount
        ("recordcount=10\noperationcount=1e3", "operationcount"),
        ("recordcount=10\nreadproportion=abc", "readproportion"),
        ("recordcount=10\nreadproportion=1.5", "readproportion"),
        ("recordcount=10\nupdateproportion=-0.1", "updateproportion"),
        ("recordcount=10\ninsertproportion=NaN", "insertproportion"),
        ("recordcount=10\nscanproportion=inf", "scanproportion"),
        (
            "recordcount=10\nreadmodifywriteproportion=",
            "readmodifywriteproportion",
        ),
        (
            "recordcount=10\nrequestdistribution=pareto",
            "requestdistribution",
        ),
        (
            "recordcount=10\nrequestdistribution=Zipfian",
            "requestdistribution",
        ),
        ("recordcount=10\ninsertorder=random", "insertorder"),
        ("recordcount=10\nfieldcount=0", "fieldcount"),
        ("recordcount=10\nfieldlength=0", "fieldlength"),
        (
            "recordcount=10\nfieldcount=4294967296\nfieldlength=4294967296",
            "fieldlength",
        ),
        ("recordcount=10\nzeropadding=100000", "zeropadding"),
    ];
    for (text, key) in cases {
        match Workload::parse(text) {
            Err(YcsbError::InvalidValue { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: expected InvalidValue({key}), got {other:?}"),
        }
    }
}

#[test]
fn unsupported_features_are_named() {
    for (text, key) in [
        (
            "recordcount=10\nrequestdistribution=hotspot",
            "requestdistribution",
        ),
        (
            "recordcount=10\nrequestdistribution=exponential",
            "requestdistribution",
        ),
        (
            "recordcount=10\nrequestdistribution=sequential",
            "requestdistribution",
        ),
        (
            "recordcount=10\nfieldlengthdistribution=zipfian",
            "fieldlengthdistribution",
        ),
        (
            "recordcount=10\nworkload=site.ycsb.workloads.TimeSeriesWorkload",
            "workload",
        ),
    ] {
        match Workload::parse(text) {
            Err(YcsbError::Unsupported { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: expected Unsupported({key}), got {other:?}"),
        }
    }
    // The accepted spellings.
    Workload::parse("recordcount=10\nfieldlengthdistribution=constant").unwrap();
    Workload::parse("recordcount=10\nworkload=com.yahoo.ycsb.workloads.CoreWorkload").unwrap();
}

#[test]
fn other_errors() {
    let zero = "recordcount=10\nreadproportion=0\nupdateproportion=0";
    assert!(matches!(
        Workload::parse(zero),
        Err(YcsbError::NoOperations)
    ));
    assert!(matches!(
        Workload::parse("recordcount=10\nthis is not a property"),
        Err(YcsbError::Syntax { line: 2, .. })
    ));
    assert!(matches!(
        Workload::from_file("/nonexistent/workloada"),
        Err(YcsbError::ReadFile { .. })
    ));
}

#[test]
fn reads_a_property_file_from_disk() {
    let dir = std::env::temp_dir().join(format!("krcore-ycsb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("workloada");
    std::fs::write(&path, WORKLOAD_A).unwrap();
    let w = Workload::from_file(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(w.unwrap(), Workload::preset('a').unwrap());
}

#[test]
fn validate_catches_hand_built_mistakes() {
    let mut w = Workload::preset('a').unwrap();
    w.proportions.read = 2.0;
    assert!(matches!(w.validate(), Err(YcsbError::InvalidValue { .. })));
    let mut w = Workload::preset('a').unwrap();
    w.insert_count = 2000;
    assert!(matches!(w.validate(), Err(YcsbError::InsertRange { .. })));
    let w = Workload::preset('a').unwrap();
    let json = serde_json::to_string(&w).unwrap();
    let back: Workload = serde_json::from_str(&json).unwrap();
    assert_eq!(back, w);
}
