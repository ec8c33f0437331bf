//! Single-client semantics: every operation, every input error, splits and
//! doublings from a one-subtable table.

mod common;

use common::*;
use race_store::Error;

#[test]
fn crud_on_a_fresh_table() {
    let cluster = tiny_cluster(1, 4, 8 << 20, 10);
    let clock = manual_clock();
    let mut c = open(&cluster, clock, manual_config());
    assert_eq!(c.get(b"a").unwrap(), None);
    c.insert(b"a", b"1").unwrap();
    assert_eq!(c.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(c.insert(b"a", b"2"), Err(Error::KeyExists));
    c.update(b"a", b"3").unwrap();
    assert_eq!(c.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(c.update(b"b", b"3"), Err(Error::NotFound));
    c.put(b"b", b"4").unwrap();
    c.put(b"b", b"5").unwrap();
    assert_eq!(c.get(b"b").unwrap().as_deref(), Some(&b"5"[..]));
    c.delete(b"a").unwrap();
    assert_eq!(c.delete(b"a"), Err(Error::NotFound));
    assert_eq!(c.get(b"a").unwrap(), None);
    let v = c
        .rmw(b"n", |cur| Some(vec![cur.map_or(0, |v| v[0]) + 1]))
        .unwrap();
    assert_eq!(v, Some(vec![1]));
    let v = c
        .rmw(b"n", |cur| Some(vec![cur.map_or(0, |v| v[0]) + 1]))
        .unwrap();
    assert_eq!(v, Some(vec![2]));
    assert_eq!(c.rmw(b"n", |_| None).unwrap(), None);
    assert_eq!(c.get(b"n").unwrap(), None);
    assert_eq!(c.rmw(b"n", |_| None).unwrap(), None);
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.pairs, vec![(b"b".to_vec(), b"5".to_vec())]);
}

#[test]
fn input_errors() {
    let cluster = tiny_cluster(1, 2, 1 << 20, 4);
    let mut c = open(&cluster, manual_clock(), manual_config());
    assert_eq!(c.get(b""), Err(Error::EmptyKey));
    assert_eq!(c.insert(b"", b"x"), Err(Error::EmptyKey));
    assert_eq!(c.put(b"", b"x"), Err(Error::EmptyKey));
    assert_eq!(c.update(b"", b"x"), Err(Error::EmptyKey));
    assert_eq!(c.delete(b""), Err(Error::EmptyKey));
    let max = race_store::layout::kv::max_value_len(1).unwrap();
    let big = vec![7u8; max + 1];
    assert_eq!(
        c.insert(b"k", &big),
        Err(Error::ValueTooLarge { len: max + 1, max })
    );
    assert!(matches!(
        c.put(b"k", &big),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(matches!(
        c.rmw(b"k", |_| Some(vec![0; 20_000])),
        Err(Error::ValueTooLarge { .. })
    ));
    assert_eq!(c.get(b"k").unwrap(), None);
    let long_key = vec![1u8; 20_000];
    assert!(matches!(c.get(&long_key), Err(Error::KeyTooLarge { .. })));
    // The largest value fits.
    let largest = vec![9u8; max];
    c.insert(b"k", &largest).unwrap();
    assert_eq!(c.get(b"k").unwrap(), Some(largest));
}

#[test]
fn grows_from_one_tiny_subtable() {
    let cluster = tiny_cluster(2, 2, 16 << 20, 12);
    let mut c = open(&cluster, manual_clock(), manual_config());
    let n = 3_000;
    for i in 0..n {
        c.insert(&key(i), &value(i, 0, 20)).unwrap();
    }
    for i in 0..n {
        assert_eq!(c.get(&key(i)).unwrap(), Some(value(i, 0, 20)), "{i}");
    }
    for i in (0..n).step_by(3) {
        c.update(&key(i), &value(i, 1, 90)).unwrap();
    }
    for i in (1..n).step_by(3) {
        c.delete(&key(i)).unwrap();
    }
    let stats = c.stats();
    assert!(stats.splits > 20, "{stats:?}");
    assert!(stats.doublings >= 5, "{stats:?}");
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert_eq!(check.frozen_slots, 0);
    assert!(!check.locked && !check.split_logged);
    let expect: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .filter(|i| i % 3 != 1)
        .map(|i| {
            (
                key(i),
                value(i, u64::from(i % 3 == 0), if i % 3 == 0 { 90 } else { 20 }),
            )
        })
        .collect();
    assert_eq!(check.pairs, expect);
    // A second client with a cold cache sees the same table.
    let mut d = open(&cluster, manual_clock(), manual_config());
    for i in (0..n).step_by(7) {
        let want = if i % 3 == 1 {
            None
        } else {
            Some(value(
                i,
                u64::from(i % 3 == 0),
                if i % 3 == 0 { 90 } else { 20 },
            ))
        };
        assert_eq!(d.get(&key(i)).unwrap(), want);
    }
}

/// Splits place each slot by its key, which they READ without the value
/// (the first 128 bytes of the block): keys longer than that take a
/// second READ, and keys of every length keep their values.
#[test]
fn splits_place_keys_of_every_length() {
    let cluster = tiny_cluster(2, 2, 32 << 20, 12);
    let mut c = open(&cluster, manual_clock(), manual_config());
    let long_key = |i: u64| -> Vec<u8> {
        let mut k = key(i);
        // 0..400 bytes of padding: keys on both sides of 120 bytes.
        k.resize(k.len() + (i as usize * 37) % 400, b'.');
        k
    };
    let n: u64 = 2_000;
    for i in 0..n {
        c.insert(&long_key(i), &value(i, 0, 300)).unwrap();
    }
    let stats = c.stats();
    assert!(stats.splits > 10, "{stats:?}");
    assert_eq!(stats.bad_blocks, 0, "{stats:?}");
    for i in 0..n {
        assert_eq!(c.get(&long_key(i)).unwrap(), Some(value(i, 0, 300)), "{i}");
    }
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.pairs.len(), n as usize);
    assert_eq!(check.duplicates, 0);
}

#[test]
fn garbage_in_remote_memory_is_an_error_not_a_panic() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    for seed in 0..40u64 {
        let cluster = tiny_cluster(1, 2, 1 << 20, 6);
        let clock = manual_clock();
        let config = race_store::ClientConfig {
            max_attempts: 200,
            ..manual_config()
        };
        let mut c = race_store::Client::open(cluster.transport(), clock.clone(), config).unwrap();
        for i in 0..40 {
            c.put(&key(i), &value(i, 0, 30)).unwrap();
        }
        // Scribble over the directory, the subtables and the KV heap.
        let node = cluster.node(0).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let used = node.stats().heap_used;
        for _ in 0..rng.gen_range(1..40) {
            let at = rng.gen_range(4096..used) & !7;
            let word: u64 = match rng.gen_range(0..4) {
                0 => rng.gen(),
                1 => rng.gen::<u64>() & 0xFFFF_FFFF_FFFF, // a plausible pointer
                2 => 1,                                   // a frozen empty slot
                _ => u64::MAX,
            };
            node.write(at, &word.to_le_bytes()).unwrap();
        }
        for i in 0..60 {
            let k = key(i % 45);
            let _ = match i % 6 {
                0 => c.get(&k).map(|_| ()),
                1 => c.insert(&k, b"x"),
                2 => c.put(&k, b"y"),
                3 => c.update(&k, b"z"),
                4 => c.delete(&k),
                _ => c.rmw(&k, |v| v.map(<[u8]>::to_vec)).map(|_| ()),
            };
            clock.advance(5_000);
        }
        let _ = c.check_table();
        let _ = race_store::Client::open(cluster.transport(), clock.clone(), config);
    }
}

/// A table presized for its keys holds them without a split; the same
/// load into a one-subtable table splits.
#[test]
fn a_presized_table_holds_its_keys_without_splitting() {
    use race_store::layout::subtable::SubtableGeometry;
    use race_store::memory::{ClusterConfig, LocalCluster, TableConfig};
    let keys = 2_000u64;
    let base = TableConfig {
        geometry: SubtableGeometry::new(16).unwrap(),
        initial_global_depth: 0,
        max_global_depth: 10,
    };
    let presized = base.presized_for(keys, 2);
    // 336 slots per subtable, 168 keys each: 12 subtables, depth 4 (16).
    assert_eq!(presized.initial_global_depth, 4);
    let mut splits = Vec::new();
    for table in [presized, base] {
        let cluster = LocalCluster::new(ClusterConfig {
            nodes: 2,
            node_bytes: 16 << 20,
            table,
        })
        .unwrap();
        let mut c = open(&cluster, manual_clock(), manual_config());
        if table == presized {
            // Spread over both nodes from the start: 8 subtables each.
            assert_eq!(c.check_table().unwrap().subtables_per_node, [8, 8]);
        }
        for i in 0..keys {
            c.insert(&key(i), &value(i, 0, 8)).unwrap();
        }
        assert_eq!(c.get(&key(keys - 1)).unwrap(), Some(value(keys - 1, 0, 8)));
        let check = c.check_table().unwrap();
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        assert_eq!(check.pairs.len() as u64, keys);
        splits.push(c.stats().splits);
    }
    assert_eq!(splits[0], 0, "presized: {splits:?}");
    assert!(splits[1] >= 3, "grown from one subtable: {splits:?}");
}

/// A key whose slot word is copied into a free slot of its bucket (two
/// committed copies, as a broken insert would leave): both checks count
/// one duplicate and report it as a problem, the block is counted once,
/// and a clean table has neither.
#[test]
fn a_key_linked_twice_is_a_duplicate_and_a_problem() {
    use race_store::hash::KeyHash;
    use race_store::layout::slot::Slot;

    // One subtable of one group: 3 buckets of a header and 7 slots.
    let cluster = tiny_cluster(1, 1, 1 << 20, 4);
    let mut c = open(&cluster, manual_clock(), manual_config());
    for k in 0..5 {
        c.insert(&key(k), &value(k, 0, 30)).unwrap();
    }
    let clean = c.check_table_counts().unwrap();
    assert_eq!((clean.keys, clean.duplicates), (5, 0));
    assert!(clean.problems.is_empty(), "{:?}", clean.problems);

    let node = cluster.node(0).unwrap();
    let base = race_store::layout::table::node0_heap_start(4).unwrap();
    let img = node.read(base, 192).unwrap();
    let words: Vec<u64> = img
        .chunks(64)
        .flat_map(|b| b[8..].chunks(8))
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect();
    let fp = KeyHash::of(&key(0)).fingerprint();
    let at: Vec<usize> = (0..words.len())
        .filter(|&i| Slot::from_raw(words[i]).matches(fp))
        .collect();
    assert_eq!(at.len(), 1, "key 0's fingerprint in slots {at:?}");
    let (bucket, word) = (at[0] / 7, words[at[0]]);
    let free = (bucket * 7..bucket * 7 + 7)
        .find(|&i| Slot::from_raw(words[i]).is_empty())
        .expect("5 keys leave a free slot in every bucket");
    let free_addr = base + 64 * bucket as u64 + 8 + 8 * (free % 7) as u64;
    node.write(free_addr, &word.to_le_bytes()).unwrap();

    let full = c.check_table().unwrap();
    let counts = c.check_table_counts().unwrap();
    for check in [&full, &counts] {
        assert_eq!(check.duplicates, 1);
        assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
        assert!(
            check.problems[0].contains("key-00000000")
                && check.problems[0].contains("2 committed copies"),
            "{:?}",
            check.problems
        );
        assert_eq!(check.linked_bytes_per_node, clean.linked_bytes_per_node);
    }
    assert_eq!(counts.keys, 5);
    assert_eq!(full.pairs.len(), 5);
    assert_eq!(
        full.pairs
            .iter()
            .find(|(k, _)| *k == key(0))
            .map(|(_, v)| v.clone()),
        Some(value(0, 0, 30))
    );
}
