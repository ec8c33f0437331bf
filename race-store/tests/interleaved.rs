//! Interleavings built by hand: one client's transport runs other clients'
//! whole operations just before chosen doorbells of its own, so a narrow
//! race happens on every run (the seeded runs of `sim.rs` explore many
//! interleavings; these pin the ones that once went wrong).

mod common;

use common::*;
use race_store::clock::Clock;
use race_store::hash::KeyHash;
use race_store::layout::bucket::MainSide;
use race_store::layout::slot::{RemotePtr, Slot};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::LocalTransport;
use race_store::remote::{CrashPlan, FaultInjector, OpResult, RemoteOp, Transport, TransportError};
use race_store::{Client, Error};

/// `inner`, with `hook` called before each doorbell with its ops (block
/// allocation by the trait's defaults: one coarse block per request).
struct Hooked<F> {
    inner: LocalTransport,
    hook: F,
}

impl<F: FnMut(&[RemoteOp<'_>])> Transport for Hooked<F> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        (self.hook)(batch);
        self.inner.execute(batch)
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.inner.alloc_block(node, size)
    }

    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

/// The contested key of a one-group table (its candidates: the left main
/// bucket, then the right one), and 24 other keys of the same buckets.
fn contested_and_neighbours() -> (Vec<u8>, Vec<Vec<u8>>) {
    let g = SubtableGeometry::new(1).unwrap();
    let locs = |k: &[u8]| KeyHash::of(k).bucket_locs(g);
    let contested = (0u64..)
        .map(key)
        .find(|k| {
            let l = locs(k);
            l[0].side == MainSide::Left && l[1].side == MainSide::Right
        })
        .unwrap();
    let others: Vec<Vec<u8>> = (1_000_000u64..)
        .map(key)
        .filter(|k| locs(k) == locs(&contested))
        .take(24)
        .collect();
    (contested, others)
}

/// Whether `ops` is an insert's CAS of an empty slot to its tentative copy.
fn places_a_copy(ops: &[RemoteOp<'_>]) -> bool {
    ops.iter().any(
        |op| matches!(op, RemoteOp::Cas { expect, new, .. } if *expect == Slot::EMPTY.raw() && Slot::from_raw(*new).is_tentative()),
    )
}

/// B inserts `contested` and wins while A's CAS on slot S is on its way:
/// `n` holds S with `neighbour` meanwhile, so B's copy lands above it, and
/// frees S again for A's CAS.
fn b_wins_above(
    n: &mut Client<LocalTransport>,
    b: &mut Client<LocalTransport>,
    contested: &[u8],
    neighbour: &[u8],
) {
    n.insert(neighbour, b"holds S").unwrap();
    b.insert(contested, b"from B").unwrap();
    n.delete(neighbour).unwrap();
}

/// Two inserts of one key race, and the subtable splits while they settle:
/// exactly one of them wins, and its value stays.
///
/// A reads the key's buckets and picks slot S (the first free slot of its
/// left main bucket). Before A's CAS, B inserts the key and wins: it read
/// the buckets while another client held S, so it took a slot of the right
/// main bucket (a higher address), and saw itself alone after its CAS.
/// Then A's CAS on S succeeds, and the subtable splits while A settles.
/// (With copies visible from their CAS, A's, the lowest, waited for B's to
/// withdraw; a splitter that kept only the lowest copy of the key dropped
/// B's, and A then saw itself alone and won too: two successful inserts,
/// B's value gone.) The splitter keeps every copy; A sees B's committed
/// copy and withdraws its tentative one.
#[test]
fn a_split_while_racing_inserts_settle_keeps_the_winner() {
    let cluster = tiny_cluster(1, 1, 16 << 20, 8);
    let (contested, others) = contested_and_neighbours();
    let clock = manual_clock();
    let mut b = open(&cluster, clock.clone(), manual_config());
    let mut n = open(&cluster, clock.clone(), manual_config());
    let mut step = 0;
    let mut b_won = false;
    let hook = |ops: &[RemoteOp<'_>]| match step {
        // A's CAS on its empty slot (with the re-read of its buckets).
        0 if places_a_copy(ops) => {
            b_wins_above(&mut n, &mut b, &contested, &others[0]);
            b_won = true;
            step = 1;
        }
        // A's next doorbell: it is settling its copy against B's (reading
        // B's block).
        1 => {
            for k in &others[1..] {
                n.put(k, b"fills").unwrap();
                if n.stats().splits > 0 {
                    break;
                }
            }
            assert!(n.stats().splits > 0, "the key's subtable split");
            step = 2;
        }
        _ => {}
    };
    let t = Hooked {
        inner: cluster.transport(),
        hook,
    };
    let mut a = Client::open(t, clock.clone(), manual_config()).unwrap();
    let r = a.insert(&contested, b"from A");
    let dups = a.stats().dups_removed;
    drop(a);
    assert!(b_won, "B's insert ran while A's raced");
    assert_eq!(r, Err(Error::KeyExists), "B won the key: A must not");
    assert_eq!(dups, 1, "A withdrew its own copy");
    let mut c = open(&cluster, clock, manual_config());
    assert_eq!(c.get(&contested).unwrap(), Some(b"from B".to_vec()));
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.duplicates, check.frozen_slots), (0, 0));
    assert!(check.subtables >= 2);
}

/// A copy that loses a race is never read, and a delete of the winner
/// cannot make it win.
///
/// As above, B inserts the key and wins while A's CAS is on its way; A's
/// copy lands at a lower address. While A settles, a reader looks the key
/// up, then deletes it. With copies visible from their CAS, the reader
/// returned A's value (the lowest copy) although B's was the key's; and
/// the delete removed both copies, so A saw itself alone and returned
/// success for an insert whose value no one could read (the table was
/// left without the key). A tentative copy is invisible to the reader and
/// to the delete: the reader gets B's value; A sees B's committed copy,
/// withdraws its own and searches again: the key is absent by then (A's
/// insert spans B's and the delete), so A inserts it anew, and its value
/// is the key's.
#[test]
fn a_losing_insert_is_never_read_and_a_delete_cannot_make_it_win() {
    let cluster = tiny_cluster(1, 1, 16 << 20, 8);
    let (contested, others) = contested_and_neighbours();
    let clock = manual_clock();
    let mut b = open(&cluster, clock.clone(), manual_config());
    let mut n = open(&cluster, clock.clone(), manual_config());
    let mut step = 0;
    let mut read = None;
    let hook = |ops: &[RemoteOp<'_>]| match step {
        // A's CAS on its empty slot: B wins meanwhile. A's next doorbell
        // (it settles against B's copy): a reader, then a delete.
        0 if places_a_copy(ops) => {
            b_wins_above(&mut n, &mut b, &contested, &others[0]);
            step = 1;
        }
        1 => {
            read = Some(n.get(&contested).unwrap());
            n.delete(&contested).unwrap();
            step = 2;
        }
        _ => {}
    };
    let t = Hooked {
        inner: cluster.transport(),
        hook,
    };
    let mut a = Client::open(t, clock.clone(), manual_config()).unwrap();
    let r = a.insert(&contested, b"from A");
    drop(a);
    assert_eq!(
        read,
        Some(Some(b"from B".to_vec())),
        "a reader sees the winner, never the racing copy"
    );
    assert_eq!(r, Ok(()), "A inserted the key after the delete");
    let mut c = open(&cluster, clock, manual_config());
    assert_eq!(c.get(&contested).unwrap(), Some(b"from A".to_vec()));
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.duplicates, check.tentative_slots), (0, 0));
    assert_eq!(check.pairs.len(), 1, "{:?}", check.pairs);
}

/// A client inserts `key` and dies at the doorbell that would commit its
/// copy, after inserting `neighbour` (if any): its tentative copy stays.
fn dies_placing(
    cluster: &race_store::memory::LocalCluster,
    clock: &std::sync::Arc<race_store::clock::ManualClock>,
    key: &[u8],
    neighbour: Option<&[u8]>,
) {
    let mut dead = Client::open(
        FaultInjector::new(cluster.transport(), None),
        clock.clone(),
        manual_config(),
    )
    .unwrap();
    if let Some(n) = neighbour {
        dead.insert(n, b"neighbour").unwrap();
    }
    // Doorbells of the insert: WRITE + buckets, tentative CAS + re-read,
    // commit (counted from the plan on).
    dead.transport_mut().set_plan(Some(CrashPlan {
        at_doorbell: 3,
        executed_prefix: 0,
    }));
    let r = dead.insert(key, b"dead");
    assert!(
        matches!(r, Err(Error::OutcomeUnknown { .. } | Error::Transport(_))),
        "{r:?}"
    );
}

/// An inserter that dies after placing its tentative copy, before it
/// commits: the copy is not the key's (readers and the table check do not
/// see it), and the next insert of the key removes it and wins, waiting
/// out the time an owner may take to commit if the dead copy is in the
/// way (at a lower address).
#[test]
fn a_dead_inserters_tentative_copy_is_invisible_and_removed() {
    let (contested, others) = contested_and_neighbours();
    {
        for warm in [false, true] {
            let cluster = tiny_cluster(1, 1, 16 << 20, 8);
            let clock = manual_clock();
            // `warm`: a neighbour takes the first slot of the left bucket
            // first, so that the dead copy lands in the right one, above
            // the next inserter's; cold, the dead copy takes the left
            // bucket's first slot, below it.
            let neighbour = warm.then_some(&others[0][..]);
            dies_placing(&cluster, &clock, &contested, neighbour);
            let mut c = open(&cluster, clock.clone(), manual_config());
            assert_eq!(c.get(&contested).unwrap(), None);
            let check = c.check_table().unwrap();
            assert_eq!(check.tentative_slots, 1, "the dead copy is in place");
            assert!(!check.pairs.iter().any(|(k, _)| *k == contested));
            let t0 = clock.now();
            c.insert(&contested, b"alive").unwrap();
            assert_eq!(c.stats().rivals_removed, 1, "the dead copy was removed");
            // Cold, the dead copy is the lower one: waited out (the manual
            // clock advances only by the inserter's backoffs and pauses);
            // warm, it is above the new copy: removed at once.
            let waited = clock.now() - t0;
            let cfg = manual_config();
            if warm {
                assert!(waited < cfg.max_op_ticks, "{waited}");
            } else {
                assert!(waited >= cfg.grace_ticks - cfg.max_op_ticks, "{waited}");
            }
            assert_eq!(c.get(&contested).unwrap(), Some(b"alive".to_vec()));
            let check = c.check_table().unwrap();
            assert!(check.problems.is_empty(), "{:#?}", check.problems);
            assert_eq!((check.duplicates, check.tentative_slots), (0, 0));
        }
    }
}

/// A sweep removes the tentative copy a dead inserter left, once it has
/// waited out the time an owner may take to commit, and touches nothing
/// else: committed keys stay, a table without tentative copies is read
/// and left at once, and the next insert of the key has nothing to wait
/// for.
#[test]
fn a_sweep_removes_what_dead_inserters_left_and_nothing_else() {
    let (contested, others) = contested_and_neighbours();
    let cluster = tiny_cluster(1, 1, 16 << 20, 8);
    let clock = manual_clock();
    let cfg = manual_config();
    let mut c = open(&cluster, clock.clone(), manual_config());
    for k in &others[1..4] {
        c.insert(k, b"committed").unwrap();
    }
    // Cold: the dead copy takes the first slot of the left bucket.
    dies_placing(&cluster, &clock, &contested, None);
    assert_eq!(c.check_table().unwrap().tentative_slots, 1);

    let t0 = clock.now();
    let report = c.sweep_tentative().unwrap();
    assert_eq!(
        (
            report.tentative,
            report.removed,
            report.changed,
            report.splitting
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
    assert!(report.subtables >= 1);
    assert!(
        report.waited_ticks > cfg.grace_ticks - cfg.max_op_ticks,
        "{report:?}"
    );
    assert!(clock.now() - t0 >= report.waited_ticks);
    assert!(
        c.stats().kv_memory.quarantined_bytes > 0,
        "the sweeper retired the dead copy's block"
    );
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.tentative_slots, check.duplicates), (0, 0));
    let mut keys: Vec<_> = check.pairs.iter().map(|(k, _)| k.clone()).collect();
    keys.sort();
    let mut want = others[1..4].to_vec();
    want.sort();
    assert_eq!(keys, want, "committed keys stay");

    // Nothing left: read and left at once.
    let t1 = clock.now();
    let again = c.sweep_tentative().unwrap();
    assert_eq!(
        (again.tentative, again.removed, again.waited_ticks),
        (0, 0, 0)
    );
    assert_eq!(clock.now(), t1, "no wait without tentative copies");

    // The key's next insert has no dead copy in its way.
    let t2 = clock.now();
    c.insert(&contested, b"alive").unwrap();
    assert!(clock.now() - t2 < cfg.max_op_ticks);
    assert_eq!(c.stats().rivals_removed, 0);
    assert_eq!(c.get(&contested).unwrap(), Some(b"alive".to_vec()));
}

/// A copy that changes while the sweep waits is not the sweep's: here an
/// insert of the key removes the dead copy (it lies above the insert's
/// own) and commits between the sweep's read and its CAS. The sweep's CAS
/// fails and it retires nothing (the insert retired the block); the key
/// keeps the insert's value.
#[test]
fn a_sweep_leaves_a_copy_that_changed_while_it_waited() {
    let (contested, others) = contested_and_neighbours();
    let cluster = tiny_cluster(1, 1, 16 << 20, 8);
    let clock = manual_clock();
    // Warm: a neighbour holds the left bucket's first slot, so the dead
    // copy lands in the right bucket, above the next inserter's.
    dies_placing(&cluster, &clock, &contested, Some(&others[0]));
    let mut b = open(&cluster, clock.clone(), manual_config());
    let mut ran = false;
    let hook = |ops: &[RemoteOp<'_>]| {
        let sweeps = ops.iter().any(|op| {
            matches!(op, RemoteOp::Cas { expect, new, .. }
                if Slot::from_raw(*expect).is_tentative() && *new == Slot::EMPTY.raw())
        });
        if sweeps && !ran {
            b.insert(&contested, b"alive").unwrap();
            ran = true;
        }
    };
    let t = Hooked {
        inner: cluster.transport(),
        hook,
    };
    let mut sweeper = Client::open(t, clock.clone(), manual_config()).unwrap();
    let report = sweeper.sweep_tentative().unwrap();
    let retired = sweeper.stats().kv_memory.quarantined_bytes;
    drop(sweeper);
    assert_eq!(retired, 0, "the sweep retired nothing: the insert did");
    assert!(ran, "the insert ran before the sweep's CAS");
    assert_eq!(
        (report.tentative, report.removed, report.changed),
        (1, 0, 1),
        "{report:?}"
    );
    assert_eq!(
        b.stats().rivals_removed,
        1,
        "the insert removed the dead copy"
    );
    assert_eq!(b.get(&contested).unwrap(), Some(b"alive".to_vec()));
    let check = b.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!((check.tentative_slots, check.duplicates), (0, 0));
}
