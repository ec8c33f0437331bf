//! Linearizability of whole histories: clients run random operations on a
//! few shared keys under the deterministic turnstile (`common/sched.rs`),
//! every invocation and response is stamped in the one order the
//! turnstile lets them happen, and each key's history is then checked
//! against a sequential map (Wing and Gong's search, per key: a map's keys
//! are independent). The targeted tests pin known interleavings; this one
//! looks at every result of every operation, so a reader returning a value
//! that never was the key's, or two inserts both succeeding, fails it
//! whatever interleaving produced it. `RACE_SIM_SEEDS` scales the seeds.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::sched::{checker, run_configured, sim_config};
use common::*;
use race_store::client::Op;
use race_store::hash::KeyHash;
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::LocalTransport;
use race_store::remote::CrashPlan;
use race_store::{Client, ClientConfig, Error};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn seeds(default: u64) -> u64 {
    std::env::var("RACE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An operation of the history: what it asked, and what it returned
/// (values are ids: `0` none, else the id of the write that stored it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Insert(u64),
    Put(u64),
    Update(u64),
    Delete,
    Get,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ret {
    Ok,
    Exists,
    NotFound,
    Value(u64),
    /// Failed when its client died: it took effect before its return, or
    /// never.
    Unknown,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    client: usize,
    key: usize,
    call: Call,
    ret: Ret,
    invoked: u64,
    returned: u64,
    /// For an operation of a batch: the batch (per client) and its place
    /// in it. Operations of one batch on the same key take effect in
    /// submission order.
    batch: Option<(u64, usize)>,
}

fn encode(id: u64) -> Vec<u8> {
    format!("value-{id:016}").into_bytes()
}

fn decode(v: &[u8]) -> u64 {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.strip_prefix("value-"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a value no client wrote: {v:?}"))
}

/// What `call` returns on a key holding `state` (`0`: absent), and the
/// state after it.
fn apply(call: Call, state: u64) -> (Ret, u64) {
    match call {
        Call::Insert(v) if state == 0 => (Ret::Ok, v),
        Call::Insert(_) => (Ret::Exists, state),
        Call::Put(v) => (Ret::Ok, v),
        Call::Update(_) if state == 0 => (Ret::NotFound, 0),
        Call::Update(v) => (Ret::Ok, v),
        Call::Delete if state == 0 => (Ret::NotFound, 0),
        Call::Delete => (Ret::Ok, 0),
        Call::Get => (Ret::Value(state), state),
    }
}

/// Whether `ops` (one key's history, the key absent at first) has a
/// linearization: an order that respects real time (an operation that
/// returned before another was invoked comes first) in which every result
/// is the sequential map's (an operation whose client died may also be
/// left out, or have any result). Depth-first over the operations that may come
/// next, each state (done set, value) tried once.
fn linearizable(ops: &[Event]) -> bool {
    assert!(ops.len() <= 128, "history too long for the search");
    let all = if ops.len() == 128 {
        u128::MAX
    } else {
        (1u128 << ops.len()) - 1
    };
    let mut seen = HashSet::new();
    let mut stack = vec![(0u128, 0u64)];
    while let Some((done, state)) = stack.pop() {
        if done == all {
            return true;
        }
        if !seen.insert((done, state)) {
            continue;
        }
        // The earliest response among the operations left: whatever comes
        // next must have been invoked before it.
        let horizon = (0..ops.len())
            .filter(|i| done & (1u128 << i) == 0)
            .map(|i| ops[i].returned)
            .min()
            .unwrap_or(u64::MAX);
        for (i, e) in ops.iter().enumerate() {
            if done & (1u128 << i) != 0 || e.invoked > horizon {
                continue;
            }
            // An earlier operation of its batch on this key comes first.
            let earlier = |(j, o): (usize, &Event)| {
                done & (1u128 << j) == 0
                    && o.client == e.client
                    && matches!((o.batch, e.batch), (Some((b, p)), Some((c, q))) if b == c && p < q)
            };
            if ops.iter().enumerate().any(earlier) {
                continue;
            }
            let (ret, next) = apply(e.call, state);
            if ret == e.ret || e.ret == Ret::Unknown {
                stack.push((done | (1u128 << i), next));
            }
            if e.ret == Ret::Unknown {
                // Or it never took effect.
                stack.push((done | (1u128 << i), state));
            }
        }
    }
    false
}

/// Four clients, 14 random rounds each, a round a single operation or a
/// batch of two to four (mostly inserts and deletes) on two shared keys
/// (and keys of their own that fill the buckets and split the table in
/// some runs), under one turnstile per seed; every key's history must
/// linearize, a batch's operations on one key in submission order. On the
/// protocol before tentative copies (a copy visible from its CAS), seed 87
/// fails (and, with single operations only, seed 167 did: an insert that
/// returned `KeyExists` had its value read by two gets while it settled).
#[test]
fn random_histories_on_shared_keys_are_linearizable() {
    let runs = seeds(250);
    let t = histories(runs, |_| vec![None; 4], false);
    assert!(
        t.contested * 4 >= t.checked && t.splits * 4 >= runs,
        "{} of {} key histories had overlapping writes, {} of {runs} runs split the table",
        t.contested,
        t.checked,
        t.splits
    );
}

/// As above, with the fourth client dying at a random doorbell (after a
/// random part of its batch ran): what it had in flight took effect before
/// it died or never (a tentative copy it left is never read), and the
/// others' histories still linearize. A fifth client sweeps tentative
/// copies meanwhile (`Client::sweep_tentative`), configured to take a copy
/// seen for more than 2 ticks as dead: it removes live inserters' copies
/// too, which must be safe whoever owns them (their owners search again).
/// After the run a sweep leaves no tentative copy.
#[test]
fn random_histories_with_a_client_dying_are_linearizable() {
    let runs = seeds(250);
    let t = histories(
        runs,
        |seed| {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0xdead);
            let plan = CrashPlan {
                // After `open` (at most 3 doorbells); the turnstile makes every
                // op a doorbell of its own, so the prefix is all or nothing.
                at_doorbell: rng.gen_range(4..120),
                executed_prefix: rng.gen_range(0..2),
            };
            vec![None, None, None, Some(plan)]
        },
        true,
    );
    assert!(
        t.died * 2 >= runs,
        "{} of {runs} runs had a client die",
        t.died
    );
    assert!(
        t.swept * 4 >= runs,
        "the sweeper removed {} copies in {runs} runs",
        t.swept
    );
}

/// What a series of runs covered.
struct Tally {
    checked: usize,
    contested: usize,
    splits: u64,
    died: u64,
    /// Tentative copies the sweeper removed while the others ran.
    swept: u64,
}

/// The sweeper's client id (with `sweeper`, after the four).
const SWEEPER: usize = 4;

/// Runs `runs` seeds of four clients (their crash plans from `crash`) and,
/// with `sweeper`, a fifth that sweeps tentative copies, and checks every
/// shared key's history.
fn histories(runs: u64, crash: impl Fn(u64) -> Vec<Option<CrashPlan>>, sweeper: bool) -> Tally {
    // The shared keys share their buckets in a one-group table, with room
    // for a few more before it splits.
    let g = SubtableGeometry::new(1).unwrap();
    let locs = KeyHash::of(&key(0)).bucket_locs(g);
    let shared: Vec<Vec<u8>> = (0u64..)
        .map(key)
        .filter(|k| KeyHash::of(k).bucket_locs(g) == locs)
        .take(2)
        .collect();
    let shared = Arc::new(shared);
    let mut t = Tally {
        checked: 0,
        contested: 0,
        splits: 0,
        died: 0,
        swept: 0,
    };
    for seed in 0..runs {
        let cluster = tiny_cluster(1, 1, 4 << 20, 6);
        let clock = manual_clock();
        let seq = Arc::new(AtomicU64::new(0));
        let history = Arc::new(Mutex::new(Vec::new()));
        let (sh, sq, hi) = (Arc::clone(&shared), Arc::clone(&seq), Arc::clone(&history));
        let mut plans = crash(seed);
        if sweeper {
            plans.push(None);
        }
        // The sweeper takes a copy seen for more than 2 ticks as dead (grace 3 - max_op 1).
        let config = |id| {
            if id == SWEEPER {
                ClientConfig {
                    max_op_ticks: 1,
                    grace_ticks: 3,
                    ..sim_config()
                }
            } else {
                sim_config()
            }
        };
        let split = run_configured(seed, &cluster, &clock, plans, config, move |id, c| {
            if id == SWEEPER {
                let mut removed = 0;
                for _ in 0..12 {
                    removed += c.sweep_tentative().unwrap().removed;
                }
                return (0, false, removed);
            }
            let mut rng = SmallRng::seed_from_u64(seed * 7 + id as u64);
            for n in 0..14u64 {
                if rng.gen_bool(0.1) {
                    // Keys of this client's own: load on the buckets, which
                    // splits the table in some runs.
                    for j in 0..3 {
                        let own = key(1_000_000 + seed * 1000 + id as u64 * 100 + n * 3 + j);
                        if let Err(e) = c.put(&own, b"filler") {
                            assert!(c.transport().inner().is_dead(), "seed {seed}: {e}");
                            return (c.stats().splits, true, 0);
                        }
                    }
                    continue;
                }
                // A single operation, or a batch of two to four (the
                // same key more than once in some).
                let size = if rng.gen_bool(0.6) {
                    1
                } else {
                    rng.gen_range(2..=4)
                };
                let calls: Vec<(usize, Call)> = (0..size)
                    .map(|j| {
                        let k = rng.gen_range(0..sh.len());
                        let v = 1 + seed * 10_000 + id as u64 * 1000 + n * 10 + j as u64;
                        let call = match rng.gen_range(0..10) {
                            0..=3 => Call::Insert(v),
                            4 => Call::Put(v),
                            5 => Call::Update(v),
                            6 | 7 => Call::Delete,
                            _ => Call::Get,
                        };
                        (k, call)
                    })
                    .collect();
                let values: Vec<Vec<u8>> = calls
                    .iter()
                    .map(|&(_, call)| match call {
                        Call::Insert(v) | Call::Put(v) | Call::Update(v) => encode(v),
                        Call::Delete | Call::Get => Vec::new(),
                    })
                    .collect();
                let invoked = sq.fetch_add(1, Ordering::SeqCst);
                let replies: Vec<Result<Option<Vec<u8>>, Error>> = if size == 1 {
                    let ((k, call), v) = (calls[0], &values[0]);
                    vec![match call {
                        Call::Insert(_) => c.insert(&sh[k], v).map(|()| None),
                        Call::Put(_) => c.put(&sh[k], v).map(|()| None),
                        Call::Update(_) => c.update(&sh[k], v).map(|()| None),
                        Call::Delete => c.delete(&sh[k]).map(|()| None),
                        Call::Get => c.get(&sh[k]),
                    }]
                } else {
                    let ops: Vec<Op<'_>> = calls
                        .iter()
                        .zip(&values)
                        .map(|(&(k, call), v)| match call {
                            Call::Insert(_) => Op::Insert(&sh[k], v),
                            Call::Put(_) => Op::Put(&sh[k], v),
                            Call::Update(_) => Op::Update(&sh[k], v),
                            Call::Delete => Op::Delete(&sh[k]),
                            Call::Get => Op::Get(&sh[k]),
                        })
                        .collect();
                    c.batch(&ops)
                };
                let returned = sq.fetch_add(1, Ordering::SeqCst);
                let dead = c.transport().inner().is_dead();
                for (pos, (&(k, call), r)) in calls.iter().zip(replies).enumerate() {
                    let ret = match (call, r) {
                        (Call::Get, Ok(v)) => Ret::Value(v.as_deref().map_or(0, decode)),
                        (_, Ok(_)) => Ret::Ok,
                        (_, Err(Error::KeyExists)) => Ret::Exists,
                        (_, Err(Error::NotFound)) => Ret::NotFound,
                        (_, Err(Error::Transport(_) | Error::OutcomeUnknown { .. })) if dead => {
                            Ret::Unknown
                        }
                        (_, Err(e)) => panic!("seed {seed}: {call:?} failed: {e}"),
                    };
                    hi.lock().unwrap().push(Event {
                        client: id,
                        key: k,
                        call,
                        ret,
                        invoked,
                        returned,
                        batch: (size > 1).then_some((n, pos)),
                    });
                }
                if dead {
                    return (c.stats().splits, true, 0);
                }
            }
            (c.stats().splits, false, 0)
        });
        t.splits += u64::from(split.iter().map(|s| s.0).sum::<u64>() > 0);
        t.died += u64::from(split.iter().any(|s| s.1));
        t.swept += split.iter().map(|s| s.2).sum::<u64>();
        // A final read of every key, after everything.
        let mut c = checker(&cluster, &clock);
        let mut history = history.lock().unwrap().clone();
        for (k, key) in shared.iter().enumerate() {
            let invoked = seq.fetch_add(1, Ordering::SeqCst);
            let v = c.get(key).unwrap();
            history.push(Event {
                client: usize::MAX,
                key: k,
                call: Call::Get,
                ret: Ret::Value(v.as_deref().map_or(0, decode)),
                invoked,
                returned: seq.fetch_add(1, Ordering::SeqCst),
                batch: None,
            });
        }
        let mut by_key: HashMap<usize, Vec<Event>> = HashMap::new();
        for e in history {
            by_key.entry(e.key).or_default().push(e);
        }
        for (k, ops) in &by_key {
            assert!(
                linearizable(ops),
                "seed {seed}: the history of shared key {k} does not linearize:\n{}",
                ops.iter()
                    .map(|e| format!("{e:?}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            t.checked += 1;
            // Keys that two clients wrote at overlapping times.
            t.contested += usize::from(ops.iter().any(|a| {
                ops.iter().any(|b| {
                    a.client != b.client
                        && a.invoked < b.returned
                        && b.invoked < a.returned
                        && !matches!(a.call, Call::Get)
                        && !matches!(b.call, Call::Get)
                })
            }));
        }
        // The table check, with no problem found.
        let clean = |c: &mut Client<LocalTransport>| {
            let check = c.check_table().unwrap();
            assert!(
                check.problems.is_empty(),
                "seed {seed}: {:?}",
                check.problems
            );
            check
        };
        assert_eq!(clean(&mut c).duplicates, 0, "seed {seed}");
        if sweeper {
            c.sweep_tentative().unwrap();
            assert_eq!(clean(&mut c).tentative_slots, 0, "seed {seed}: swept");
        }
    }
    t
}

/// The checker itself: it accepts a history with a valid order and refuses
/// the one the old insert protocol could produce (a read of a losing
/// insert's value), two winning inserts, a stale read, and a batch's
/// same-key operations taken out of submission order.
#[test]
fn the_checker_tells_good_histories_from_bad() {
    let e = |client, call, ret, invoked, returned| Event {
        client,
        key: 0,
        call,
        ret,
        invoked,
        returned,
        batch: None,
    };
    // B's insert wins; A's overlapping insert fails; a read in between sees
    // B's value: fine.
    let good = [
        e(1, Call::Insert(2), Ret::Ok, 0, 3),
        e(0, Call::Insert(1), Ret::Exists, 1, 6),
        e(2, Call::Get, Ret::Value(2), 4, 5),
    ];
    assert!(linearizable(&good));
    // The same read returning A's value, though A failed: not linearizable.
    let bad = [
        e(1, Call::Insert(2), Ret::Ok, 0, 3),
        e(0, Call::Insert(1), Ret::Exists, 1, 6),
        e(2, Call::Get, Ret::Value(1), 4, 5),
    ];
    assert!(!linearizable(&bad));
    // Two successful inserts with no delete between: not linearizable.
    let twice = [
        e(0, Call::Insert(1), Ret::Ok, 0, 2),
        e(1, Call::Insert(2), Ret::Ok, 1, 3),
    ];
    assert!(!linearizable(&twice));
    // Real time: a get invoked after a put returned sees it.
    let stale = [
        e(0, Call::Put(1), Ret::Ok, 0, 1),
        e(1, Call::Get, Ret::Value(0), 2, 3),
    ];
    assert!(!linearizable(&stale));
    // A batch's operations on one key in submission order: its get after
    // its put sees the put (in the other order it would see nothing).
    let in_batch = |pos, mut ev: Event| {
        ev.batch = Some((7, pos));
        ev
    };
    let reordered = [
        in_batch(0, e(0, Call::Put(1), Ret::Ok, 0, 1)),
        in_batch(1, e(0, Call::Get, Ret::Value(0), 0, 1)),
    ];
    assert!(!linearizable(&reordered));
    let ordered = [
        in_batch(0, e(0, Call::Put(1), Ret::Ok, 0, 1)),
        in_batch(1, e(0, Call::Get, Ret::Value(1), 0, 1)),
    ];
    assert!(linearizable(&ordered));
}
