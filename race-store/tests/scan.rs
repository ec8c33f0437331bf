//! `Client::scan`: every pair of a quiescent table once, a scan stopped by
//! its caller, and a scan beside a writer (each pair a value its key had,
//! every key there when no split ran).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use race_store::memory::{LocalCluster, LocalTransport};
use race_store::Client;

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

/// A cluster of one node whose key 7 (of 50) has the value
/// "needle-needle-needle", a client of it, and in the node's memory the
/// offsets of key 7's slot word (the one word whose pointer, node 0: the
/// offset alone, is the start of the 64-byte-aligned block holding the
/// value) and of the value.
fn needle_table() -> (LocalCluster, Client<LocalTransport>, u64, u64) {
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
        .expect("the value's bytes in the node's memory") as u64;
    let word = |o: usize| u64::from_le_bytes(image[o..o + 8].try_into().unwrap());
    let slots: Vec<usize> = (0..image.len() / 8)
        .map(|i| i * 8)
        .filter(|&o| {
            let w = word(o);
            let (ptr, len) = (w & ((1 << 48) - 1), (w >> 48) & 0xff);
            w >> 56 != 0 && len != 0 && ptr % 64 == 0 && ptr <= at && at + 20 <= ptr + len * 64
        })
        .collect();
    let words: Vec<String> = slots
        .iter()
        .map(|&o| format!("{o}: {:#x}", word(o)))
        .collect();
    assert_eq!(
        slots.len(),
        1,
        "one slot points at the block (value at {at}): {words:?}"
    );
    (cluster, c, slots[0] as u64, at)
}

/// Scans `c`, which must miss key 7 and say so.
fn scan_without_key_7(c: &mut Client<LocalTransport>) {
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

/// A damaged block is read again from its slot, then skipped and counted:
/// the scan says it is not complete.
#[test]
fn a_damaged_block_is_skipped_and_counted() {
    let (cluster, mut c, _, value_at) = needle_table();
    cluster.node(0).unwrap().write(value_at, b"X").unwrap();
    scan_without_key_7(&mut c);
}

/// Garbage in a slot (a word with no fingerprint) hides whatever pair it
/// held: the scan counts it as skipped and says it is not complete.
#[test]
fn a_malformed_slot_word_is_skipped_and_counted() {
    let (cluster, mut c, slot, _) = needle_table();
    // Clear the fingerprint byte (the word's most significant, stored last).
    cluster.node(0).unwrap().write(slot + 7, &[0]).unwrap();
    scan_without_key_7(&mut c);
}

/// A well-formed slot word whose pointer leads past its node's memory:
/// the scan skips and counts it instead of failing on the refused READ.
#[test]
fn a_slot_pointing_out_of_its_nodes_memory_is_skipped_and_counted() {
    let (cluster, mut c, slot, _) = needle_table();
    // Offset 2^39 (bytes 0..5 of the word hold the 40-bit offset).
    let node = cluster.node(0).unwrap();
    node.write(slot, &[0, 0, 0, 0, 0x80]).unwrap();
    scan_without_key_7(&mut c);
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

/// Keys in the table from the start of [`split_under_scan`]'s scan.
const OLD: u64 = 1000;

/// A scan of a table of [`OLD`] keys, during which (once it has handed
/// over a hundred pairs) another client inserts 3,000 keys, which splits
/// the table many times, and then, with `update`, updates the old keys:
/// the report and every value handed over per key.
fn split_under_scan(
    update: bool,
) -> (
    race_store::client::ScanReport,
    HashMap<Vec<u8>, Vec<Vec<u8>>>,
) {
    let cluster = tiny_cluster(2, 4, 64 << 20, 16);
    let mut c = open(&cluster, manual_clock(), manual_config());
    for i in 0..OLD {
        c.insert(&key(i), &value(i, 0, 40)).unwrap();
    }
    let mut w = open(&cluster, manual_clock(), manual_config());
    let mut seen: HashMap<Vec<u8>, Vec<Vec<u8>>> = HashMap::new();
    let mut handed = 0;
    let report = c
        .scan(|k, v| {
            handed += 1;
            if handed == 100 {
                for i in OLD..OLD + 3000 {
                    w.insert(&key(i), &value(i, 0, 40)).unwrap();
                }
                for i in (0..OLD).filter(|_| update) {
                    w.update(&key(i), &value(i, 1, 60)).unwrap();
                }
            }
            seen.entry(k.to_vec()).or_default().push(v.to_vec());
            true
        })
        .unwrap();
    assert_eq!(report.pairs, handed);
    assert!(report.complete(), "{report:?}");
    assert!(report.rescanned > 0, "the table split: {report:?}");
    for (k, values) in &seen {
        let i: u64 = std::str::from_utf8(&k[4..]).unwrap().parse().unwrap();
        if i >= OLD {
            assert!(values.iter().all(|v| *v == value(i, 0, 40)), "key {i}");
        }
    }
    (report, seen)
}

/// Another client splits the table while a scan runs, and updates the
/// keys that were there: the scan reads the split subtables again, hands
/// over every key that was there from the start with a value it had, and
/// says it is complete. Before, such a scan only said the directory had
/// changed.
#[test]
fn a_scan_reads_subtables_that_split_under_it_again() {
    let (_, seen) = split_under_scan(true);
    for i in 0..OLD {
        let values = seen
            .get(&key(i))
            .unwrap_or_else(|| panic!("key {i} missing"));
        assert!(values.len() <= 2, "key {i} {} times", values.len());
        for v in values {
            assert!(
                *v == value(i, 0, 40) || *v == value(i, 1, 60),
                "key {i}: a value it never had"
            );
        }
        // The later read's value last: never the old one after the new.
        assert!(
            !(values.len() == 2 && values[0] == value(i, 1, 60) && values[1] == value(i, 0, 40)),
            "key {i}: an older value after a newer one"
        );
    }
}

/// Splits under a scan with no key changed meanwhile: the halves read
/// again pass over the slots that still hold what was handed over, so
/// every key is handed over once.
#[test]
fn a_split_under_a_scan_hands_no_unchanged_key_over_twice() {
    let (report, seen) = split_under_scan(false);
    assert!(
        seen.values().all(|v| v.len() == 1),
        "a key twice: {report:?}"
    );
    assert!((0..OLD).all(|i| seen.contains_key(&key(i))));
}
