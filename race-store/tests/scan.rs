//! `Client::scan`: every pair of a quiescent table once, a scan stopped by
//! its caller, and a scan beside a writer (each pair a value its key had,
//! every key there when no split ran).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;

#[test]
fn a_quiescent_table_scans_to_every_pair_once_across_splits() {
    let cluster = tiny_cluster(2, 4, 64 << 20, 16);
    let mut c = open(&cluster, manual_clock(), manual_config());
    let mut reference = HashMap::new();
    for i in 0..3000u64 {
        let v = value(i, 0, 10 + (i as usize % 300));
        c.insert(&key(i), &v).unwrap();
        reference.insert(key(i), v);
    }
    for i in (0..3000u64).step_by(3) {
        c.delete(&key(i)).unwrap();
        reference.remove(&key(i));
    }
    let mut got = HashMap::new();
    let report = c
        .scan(|k, v| {
            assert!(got.insert(k.to_vec(), v.to_vec()).is_none(), "a key twice");
            true
        })
        .unwrap();
    assert!(report.complete(), "{report:?}");
    assert!(report.subtables > 8, "the table split: {report:?}");
    assert_eq!(report.pairs, reference.len() as u64);
    assert_eq!(got, reference);
}

#[test]
fn the_caller_stops_a_scan() {
    let cluster = tiny_cluster(1, 16, 16 << 20, 8);
    let mut c = open(&cluster, manual_clock(), manual_config());
    for i in 0..100u64 {
        c.insert(&key(i), &value(i, 0, 20)).unwrap();
    }
    let mut n = 0;
    let report = c
        .scan(|_, _| {
            n += 1;
            n < 10
        })
        .unwrap();
    assert!(report.stopped && !report.complete());
    assert_eq!((report.pairs, n), (10, 10));
}

/// A damaged block is read again from its slot, then skipped and counted:
/// the scan says it is not complete.
#[test]
fn a_damaged_block_is_skipped_and_counted() {
    let cluster = tiny_cluster(1, 16, 16 << 20, 8);
    let mut c = open(&cluster, manual_clock(), manual_config());
    for i in 0..50u64 {
        let v = if i == 7 {
            b"needle-needle-needle".to_vec()
        } else {
            value(i, 0, 20)
        };
        c.insert(&key(i), &v).unwrap();
    }
    let node = cluster.node(0).unwrap();
    let heap = node.stats().heap_used;
    let image = node.read(0, heap as usize).unwrap();
    let at = image
        .windows(20)
        .position(|w| w == b"needle-needle-needle")
        .expect("the value's bytes in the node's memory");
    node.write(at as u64, b"X").unwrap();
    let mut got = 0;
    let report = c
        .scan(|k, _| {
            assert_ne!(k, key(7).as_slice());
            got += 1;
            true
        })
        .unwrap();
    assert_eq!(
        (report.pairs, report.skipped, got),
        (49, 1, 49),
        "{report:?}"
    );
    assert!(!report.complete());
}

/// A writer updates every key over and over while another client scans a
/// presized table (no split): each pair handed over is a value its key
/// had, and each key is there once, unless its slot was skipped (counted).
#[test]
fn a_scan_beside_a_writer_sees_each_key_once_with_a_value_it_had() {
    let cluster = race_store::memory::LocalCluster::new(race_store::memory::ClusterConfig {
        nodes: 2,
        node_bytes: 128 << 20,
        table: race_store::memory::TableConfig::default().presized_for(4000, 2),
    })
    .unwrap();
    let keys = 2000u64;
    let mut c = open(&cluster, system_clock(), system_config());
    for i in 0..keys {
        c.insert(&key(i), &value(i, 0, 100)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cluster, stop) = (cluster.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut w = open(&cluster, system_clock(), system_config());
            let mut version = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..keys {
                    w.update(&key(i), &value(i, version, 50 + (version as usize % 200)))
                        .unwrap();
                }
                version += 1;
            }
            version
        })
    };
    let mut scans = 0;
    let mut skipped = 0;
    for _ in 0..5 {
        let mut got: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let report = c
            .scan(|k, v| {
                assert!(got.insert(k.to_vec(), v.to_vec()).is_none(), "a key twice");
                true
            })
            .unwrap();
        assert!(!report.directory_changed, "presized: no split");
        assert_eq!(report.pairs + report.skipped, keys, "{report:?}");
        for (k, v) in &got {
            let i: u64 = std::str::from_utf8(&k[4..]).unwrap().parse().unwrap();
            let prefix = format!("v{i}.");
            assert!(v.starts_with(prefix.as_bytes()), "key {i}: {v:?}");
            let version: u64 = std::str::from_utf8(&v[prefix.len()..])
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                v,
                &value(
                    i,
                    version,
                    if version == 0 {
                        100
                    } else {
                        50 + (version as usize % 200)
                    }
                ),
                "key {i}"
            );
        }
        scans += 1;
        skipped += report.skipped;
    }
    stop.store(true, Ordering::Relaxed);
    let versions = writer.join().unwrap();
    assert!(
        versions > 1,
        "the writer updated every key while the scans ran"
    );
    eprintln!("{scans} scans beside {versions} rounds of updates; {skipped} slots skipped");
}
