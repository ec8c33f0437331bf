//! Clients that die mid-protocol, memory nodes that fail, and memory that
//! runs out: the table must stay consistent and usable by the others.
//!
//! A "dead" client is one whose transport fails from doorbell `k` on
//! ([`FaultInjector`]), after letting a prefix of that doorbell's batch
//! execute; the client is then dropped. Each test first counts the
//! doorbells of the operation, then replays it dying at every one.

mod common;

use std::sync::Arc;

use common::*;
use race_store::clock::{Clock, ManualClock};
use race_store::memory::{LocalCluster, LocalTransport};
use race_store::remote::{CrashPlan, FaultInjector, TransportError};
use race_store::{Client, Error};

type Faulty = Client<FaultInjector<LocalTransport>>;

fn faulty(cluster: &LocalCluster, clock: &Arc<ManualClock>, plan: Option<CrashPlan>) -> Faulty {
    let t = FaultInjector::new(cluster.transport(), plan);
    Client::open(t, clock.clone() as Arc<dyn Clock>, manual_config()).unwrap()
}

/// Fills a fresh 1-group table until the next insert of `key(n)` must split;
/// returns the cluster and `n`.
fn table_about_to_split(clock: &Arc<ManualClock>) -> (LocalCluster, u64) {
    let cluster = tiny_cluster(2, 1, 8 << 20, 8);
    let mut c = open(&cluster, clock.clone(), manual_config());
    for n in 0.. {
        let before = c.stats().splits;
        // Probe with a throwaway client state: insert, and undo if it split.
        c.insert(&key(n), &value(n, 0, 24)).unwrap();
        if c.stats().splits > before {
            // Rebuild a table where key(n) is the one that triggers it.
            let cluster = tiny_cluster(2, 1, 8 << 20, 8);
            let mut d = open(&cluster, clock.clone(), manual_config());
            for i in 0..n {
                d.insert(&key(i), &value(i, 0, 24)).unwrap();
            }
            assert_eq!(d.stats().splits, 0);
            return (cluster, n);
        }
    }
    unreachable!()
}

/// What a survivor must find after client death: every key below `n` with
/// its value, `key(n)` either absent or with `value(n, 0, 24)`; then the
/// survivor grows the table (finishing any abandoned split) and the whole
/// table checks out.
fn survivor_checks(
    cluster: &LocalCluster,
    clock: &Arc<ManualClock>,
    n: u64,
    label: &str,
) -> race_store::client::ClientStats {
    let mut s = open(cluster, clock.clone(), manual_config());
    for i in 0..n {
        assert_eq!(
            s.get(&key(i)).unwrap(),
            Some(value(i, 0, 24)),
            "{label}: key {i}"
        );
    }
    let crashed = s.get(&key(n)).unwrap();
    assert!(
        crashed.is_none() || crashed == Some(value(n, 0, 24)),
        "{label}: the crashed insert left {crashed:?}"
    );
    // Writes to every subtable, including the one that was splitting.
    for i in 0..n {
        s.update(&key(i), &value(i, 1, 24)).unwrap();
    }
    for i in n + 1..n + 300 {
        s.insert(&key(i), &value(i, 1, 24)).unwrap();
    }
    match s.insert(&key(n), &value(n, 1, 24)) {
        Ok(()) => assert!(crashed.is_none(), "{label}"),
        Err(Error::KeyExists) => assert!(crashed.is_some(), "{label}"),
        Err(e) => panic!("{label}: {e:?}"),
    }
    let check = s.check_table().unwrap();
    assert!(check.problems.is_empty(), "{label}: {:#?}", check.problems);
    assert_eq!(check.duplicates, 0, "{label}");
    assert_eq!(check.frozen_slots, 0, "{label}");
    assert!(!check.locked && !check.split_logged, "{label}");
    assert_eq!(check.pairs.len() as u64, n + 300, "{label}");
    s.stats()
}

#[test]
fn client_dies_mid_split_at_every_doorbell() {
    let clock = manual_clock();
    let (_, n) = table_about_to_split(&clock);
    // Count the doorbells of the insert that splits.
    let (cluster, _) = table_about_to_split(&clock);
    let mut probe = faulty(&cluster, &clock, None);
    probe.transport_mut().set_plan(None);
    let before = probe.transport().doorbells();
    probe.insert(&key(n), &value(n, 0, 24)).unwrap();
    let total = probe.transport().doorbells() - before;
    assert!(probe.stats().splits == 1 && total > 8, "{total}");
    drop(probe);

    let mut takeovers = 0;
    for k in 1..=total {
        for prefix in [0, 1, usize::MAX] {
            let label = format!("die at doorbell {k}/{total}, prefix {prefix}");
            let (cluster, n2) = table_about_to_split(&clock);
            assert_eq!(n, n2);
            let mut dying = faulty(&cluster, &clock, None);
            dying.transport_mut().set_plan(Some(CrashPlan {
                at_doorbell: k,
                executed_prefix: prefix,
            }));
            let r = dying.insert(&key(n), &value(n, 0, 24));
            // Before its first atomic the insert cannot have applied; after
            // it (the resize lock, the slot) its outcome is unknown.
            assert!(
                matches!(
                    r,
                    Err(Error::Transport(TransportError::Disconnected))
                        | Err(Error::OutcomeUnknown {
                            op: "insert",
                            source: TransportError::Disconnected
                        })
                ),
                "{label}: {r:?}"
            );
            drop(dying);
            // Let any lease the dead client held expire.
            clock.advance(2 * manual_config().lease_ticks);
            takeovers += survivor_checks(&cluster, &clock, n, &label).takeovers;
        }
    }
    // Most crash points were inside the locked section: the survivor broke
    // the dead client's lease and finished its split.
    assert!(
        takeovers > total,
        "{takeovers} takeovers for {total} crash points"
    );
}

#[test]
fn client_dies_mid_insert_and_mid_update() {
    let clock = manual_clock();
    for op in ["insert", "update", "delete", "put"] {
        // Count doorbells on a quiet table.
        let cluster = tiny_cluster(1, 4, 4 << 20, 6);
        let mut c = faulty(&cluster, &clock, None);
        for i in 0..20 {
            c.insert(&key(i), &value(i, 0, 24)).unwrap();
        }
        let before = c.transport().doorbells();
        run(&mut c, op).unwrap();
        let total = c.transport().doorbells() - before;
        for k in 1..=total {
            for prefix in [0, 1, usize::MAX] {
                let label = format!("{op}: die at {k}/{total}, prefix {prefix}");
                let cluster = tiny_cluster(1, 4, 4 << 20, 6);
                let mut c = faulty(&cluster, &clock, None);
                for i in 0..20 {
                    c.insert(&key(i), &value(i, 0, 24)).unwrap();
                }
                c.transport_mut().set_plan(Some(CrashPlan {
                    at_doorbell: k,
                    executed_prefix: prefix,
                }));
                assert!(run(&mut c, op).is_err(), "{label}");
                drop(c);
                let mut s = open(&cluster, clock.clone(), manual_config());
                for i in 1..20 {
                    assert_eq!(s.get(&key(i)).unwrap(), Some(value(i, 0, 24)), "{label}");
                }
                let k0 = s.get(&key(0)).unwrap();
                let k99 = s.get(&key(99)).unwrap();
                let ok = match op {
                    "insert" => {
                        k0 == Some(value(0, 0, 24))
                            && (k99.is_none() || k99 == Some(value(99, 9, 24)))
                    }
                    "update" | "put" => k0 == Some(value(0, 0, 24)) || k0 == Some(value(0, 9, 24)),
                    _ => k0.is_none() || k0 == Some(value(0, 0, 24)),
                };
                assert!(ok, "{label}: key 0 {k0:?}, key 99 {k99:?}");
                s.put(&key(0), b"after").unwrap();
                s.put(&key(99), b"after").unwrap();
                let check = s.check_table().unwrap();
                assert!(
                    check.problems.is_empty() && check.duplicates == 0,
                    "{label}: {check:?}"
                );
            }
        }
    }
}

fn run(c: &mut Faulty, op: &str) -> Result<(), Error> {
    match op {
        "insert" => c.insert(&key(99), &value(99, 9, 24)),
        "update" => c.update(&key(0), &value(0, 9, 24)),
        "put" => c.put(&key(0), &value(0, 9, 24)),
        _ => c.delete(&key(0)),
    }
}

#[test]
fn node_down_is_a_transport_error_and_recoverable() {
    let cluster = tiny_cluster(2, 2, 8 << 20, 8);
    let mut c = open(&cluster, manual_clock(), manual_config());
    for i in 0..200 {
        c.insert(&key(i), b"v").unwrap();
    }
    cluster.set_node_down(1, true);
    let mut failed = 0;
    for i in 0..200 {
        match c.get(&key(i)) {
            Ok(v) => assert_eq!(v.as_deref(), Some(&b"v"[..])),
            Err(Error::Transport(TransportError::NodeDown { node: 1 })) => failed += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(failed > 0, "some keys live on node 1");
    cluster.set_node_down(0, true);
    assert_eq!(
        c.get(&key(0)),
        Err(Error::Transport(TransportError::NodeDown { node: 0 }))
    );
    assert!(matches!(
        Client::open(cluster.transport(), manual_clock(), manual_config()),
        Err(Error::Transport(TransportError::NodeDown { node: 0 }))
    ));
    cluster.set_node_down(0, false);
    cluster.set_node_down(1, false);
    for i in 0..200 {
        assert_eq!(c.get(&key(i)).unwrap().as_deref(), Some(&b"v"[..]));
    }
}

#[test]
fn out_of_memory_leaves_a_consistent_table() {
    // Small nodes: the table fills up.
    let cluster = tiny_cluster(2, 2, 96 << 10, 10);
    let clock = manual_clock();
    let config = race_store::ClientConfig {
        max_op_ticks: 10,
        grace_ticks: 30,
        ..manual_config()
    };
    let mut c = Client::open(cluster.transport(), clock.clone(), config).unwrap();
    let mut n = 0;
    let err = loop {
        match c.insert(&key(n), &value(n, 0, 100)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100_000);
    };
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert!(n > 50, "{n}");
    // Everything inserted is there, and updates and deletes still work.
    for i in 0..n {
        assert_eq!(c.get(&key(i)).unwrap(), Some(value(i, 0, 100)), "{i}");
    }
    for i in (0..n).step_by(2) {
        c.delete(&key(i)).unwrap();
    }
    // Out-of-place updates need the deleted blocks back: after the grace.
    clock.advance(100);
    for i in (1..n).step_by(2) {
        c.update(&key(i), &value(i, 1, 100)).unwrap();
    }
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert!(!check.locked && !check.split_logged && check.frozen_slots == 0);
    assert_eq!(check.pairs.len() as u64, n / 2);
    // A second client agrees.
    let mut d = open(&cluster, manual_clock(), manual_config());
    for i in 0..n {
        let want = (i % 2 == 1).then(|| value(i, 1, 100));
        assert_eq!(d.get(&key(i)).unwrap(), want);
    }
}
