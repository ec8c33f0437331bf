//! Deterministic multi-client runs (see `common/sched.rs`): each seed is one
//! reproducible interleaving of the clients' round trips, with the manual
//! clock advanced one tick per doorbell. Many seeds explore many
//! interleavings, including the narrow ones that real threads on a small
//! machine rarely produce (racing inserts of one key, splits under every
//! kind of operation, crashes at every point). `RACE_SIM_SEEDS` scales the
//! number of seeds.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use common::sched::{checker, run, sim_config};
use common::*;
use race_store::remote::CrashPlan;
use race_store::Error;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn seeds(default: u64) -> u64 {
    std::env::var("RACE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn racing_inserts_of_one_key_have_exactly_one_winner() {
    use race_store::hash::KeyHash;
    use race_store::layout::subtable::SubtableGeometry;
    // Noise keys that share the contested key's buckets, so that a noise
    // insert between two racers' READs makes them choose different slots.
    let g = SubtableGeometry::new(1).unwrap();
    let locs = KeyHash::of(b"the-key").bucket_locs(g);
    let noise: Vec<Vec<u8>> = (0u64..)
        .map(key)
        .filter(|k| KeyHash::of(k).bucket_locs(g) == locs)
        .take(12)
        .collect();
    let noise = Arc::new(noise);
    let mut raced = 0;
    for seed in 0..seeds(150) {
        let noise = Arc::clone(&noise);
        let cluster = tiny_cluster(1, 1, 4 << 20, 8);
        let clock = manual_clock();
        {
            // The contested key's buckets start with a few noise keys.
            let mut setup = checker(&cluster, &clock);
            for k in noise.iter().take(4) {
                setup.put(k, b"noise").unwrap();
            }
        }
        let results = run(seed, &cluster, &clock, vec![None; 3], move |id, c| {
            // Duplicates need a slot freed between two racers' READs (a
            // noise insert between them takes the earlier racer's slot, whose
            // CAS then fails), hence a delete of a noise key first.
            let mut rng = SmallRng::seed_from_u64(seed * 3 + id as u64);
            if rng.gen_bool(0.8) {
                let _ = c.delete(&noise[rng.gen_range(0..4)]);
            }
            let r = c.insert(b"the-key", format!("from {id}").as_bytes());
            (r, c.stats().dups_removed)
        });
        let winners: Vec<usize> = (0..3).filter(|&i| results[i].0.is_ok()).collect();
        assert_eq!(winners.len(), 1, "seed {seed}: {results:?}");
        for (r, _) in &results {
            assert!(
                matches!(r, Ok(()) | Err(Error::KeyExists)),
                "seed {seed}: {r:?}"
            );
        }
        raced += results.iter().map(|r| r.1).sum::<u64>();
        let mut c = checker(&cluster, &clock);
        let want = format!("from {}", winners[0]).into_bytes();
        assert_eq!(c.get(b"the-key").unwrap(), Some(want), "seed {seed}");
        let check = c.check_table().unwrap();
        assert_eq!(check.duplicates, 0, "seed {seed}");
        assert!(
            check.problems.is_empty(),
            "seed {seed}: {:#?}",
            check.problems
        );
    }
    // The seeds did produce races where copies had to withdraw.
    eprintln!("{raced} racing copies withdrew");
    assert!(raced > 5, "{raced}");
}

#[test]
fn shared_keys_counters_and_growth() {
    for seed in 0..seeds(40) {
        let cluster = tiny_cluster(2, 1, 16 << 20, 12);
        let clock = manual_clock();
        let written: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
        let w = Arc::clone(&written);
        let counts = run(seed, &cluster, &clock, vec![None; 3], move |id, c| {
            let mut rng = SmallRng::seed_from_u64(seed * 10 + id as u64);
            let mut incs = [0u64; 3];
            for n in 0..80u64 {
                let k = key(rng.gen_range(0..4));
                let v = value(id as u64, n, rng.gen_range(1..90));
                match rng.gen_range(0..10) {
                    0..=2 => {
                        let i = rng.gen_range(0..3);
                        c.rmw(format!("ctr{i}").as_bytes(), |old| {
                            let n: u64 =
                                old.map_or(0, |b| String::from_utf8_lossy(b).parse().unwrap());
                            Some((n + 1).to_string().into_bytes())
                        })
                        .unwrap();
                        incs[i] += 1;
                    }
                    3 => {
                        if let Some(got) = c.get(&k).unwrap() {
                            assert!(
                                w.lock().unwrap().contains(&got),
                                "seed {seed}: read {got:?}"
                            );
                        }
                    }
                    4 | 5 => {
                        w.lock().unwrap().insert(v.clone());
                        match c.insert(&k, &v) {
                            Ok(()) | Err(Error::KeyExists) => {}
                            Err(e) => panic!("seed {seed}: {e:?}"),
                        }
                    }
                    6 => {
                        w.lock().unwrap().insert(v.clone());
                        c.put(&k, &v).unwrap();
                    }
                    7 => match c.delete(&k) {
                        Ok(()) | Err(Error::NotFound) => {}
                        Err(e) => panic!("seed {seed}: {e:?}"),
                    },
                    _ => c.put(&key(1000 + id as u64 * 1000 + n), b"grow").unwrap(),
                }
            }
            incs
        });
        let mut c = checker(&cluster, &clock);
        for i in 0..3 {
            let total: u64 = counts.iter().map(|inc| inc[i]).sum();
            let got = c.get(format!("ctr{i}").as_bytes()).unwrap();
            let got: u64 = got.map_or(0, |b| String::from_utf8_lossy(&b).parse().unwrap());
            assert_eq!(got, total, "seed {seed}: counter {i}");
        }
        let check = c.check_table().unwrap();
        assert!(
            check.problems.is_empty(),
            "seed {seed}: {:#?}",
            check.problems
        );
        assert_eq!(check.duplicates, 0, "seed {seed}");
        let written = written.lock().unwrap();
        for (k, v) in &check.pairs {
            if k.starts_with(b"key-0000000") && k.len() == 12 {
                assert!(written.contains(v), "seed {seed}: {k:?}");
            }
        }
        assert!(check.subtables >= 2, "seed {seed}: the table grew");
    }
}

/// Client 0 dies at a random doorbell while clients 1 and 2 keep working;
/// every client owns a key range, so every surviving result is exact.
#[test]
fn a_client_dies_anywhere_while_others_work() {
    let mut takeovers = 0;
    for seed in 0..seeds(60) {
        let cluster = tiny_cluster(2, 1, 16 << 20, 12);
        let clock = manual_clock();
        let mut rng = SmallRng::seed_from_u64(seed);
        let crash = CrashPlan {
            // After `open` (at most 3 doorbells).
            at_doorbell: rng.gen_range(4..300),
            executed_prefix: rng.gen_range(0..3),
        };
        let models = run(
            seed,
            &cluster,
            &clock,
            vec![Some(crash), None, None],
            move |id, c| {
                let mut rng = SmallRng::seed_from_u64(seed * 7 + id as u64);
                let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                let mut uncertain = None;
                for n in 0..80u64 {
                    let k = key(id as u64 * 100_000 + rng.gen_range(0..60));
                    let v = value(id as u64, n, rng.gen_range(1..60));
                    if id == 0 && n % 2 == 0 {
                        // Client 0 mostly grows the table: it dies in splits too.
                        let g = key(900_000 + n);
                        if let Err(e) = c.insert(&g, b"grow") {
                            uncertain = Some((g, b"grow".to_vec()));
                            assert!(
                                matches!(e, Error::Transport(_) | Error::OutcomeUnknown { .. }),
                                "seed {seed}: {e:?}"
                            );
                            break;
                        }
                        model.insert(g, b"grow".to_vec());
                        continue;
                    }
                    let r = match rng.gen_range(0..4) {
                        0 => c.put(&k, &v).map(|()| Some(v.clone())),
                        1 => c.delete(&k).map(|()| None),
                        2 => c.update(&k, &v).map(|()| Some(v.clone())),
                        _ => c.insert(&k, &v).map(|()| Some(v.clone())),
                    };
                    match r {
                        Ok(Some(v)) => {
                            model.insert(k, v);
                        }
                        Ok(None) => {
                            model.remove(&k);
                        }
                        Err(Error::NotFound) | Err(Error::KeyExists) => {}
                        Err(e) => {
                            assert_eq!(id, 0, "seed {seed}: {e:?}");
                            uncertain = Some((k, v));
                            break;
                        }
                    }
                }
                (model, uncertain, c.stats().takeovers)
            },
        );
        // Every lease of the dead client has expired by now.
        clock.advance(10 * sim_config().lease_ticks);
        let mut c = checker(&cluster, &clock);
        for (id, (model, uncertain, t)) in models.iter().enumerate() {
            takeovers += t;
            for (k, v) in model {
                let got = c.get(k).unwrap();
                if uncertain.as_ref().is_some_and(|(uk, _)| uk == k) {
                    continue;
                }
                assert_eq!(got.as_ref(), Some(v), "seed {seed}: client {id} key {k:?}");
            }
            if let Some((k, v)) = uncertain {
                let got = c.get(k).unwrap();
                assert!(
                    got.is_none() || got.as_ref() == Some(v) || got.as_ref() == model.get(k),
                    "seed {seed}: uncertain key {k:?} = {got:?}"
                );
            }
        }
        // Anything the dead client left half done is finished by the next
        // client that needs it; force that for the check.
        c.recover_resize().unwrap();
        let check = c.check_table().unwrap();
        assert!(
            check.problems.is_empty(),
            "seed {seed}: {:#?}",
            check.problems
        );
        assert_eq!(check.duplicates, 0, "seed {seed}");
        assert_eq!(check.frozen_slots, 0, "seed {seed}");
        assert!(!check.locked && !check.split_logged, "seed {seed}");
        takeovers += c.stats().takeovers;
    }
    eprintln!("{takeovers} expired leases broken");
}
