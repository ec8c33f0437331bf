//! Interleavings built by hand: one client's transport runs other clients'
//! whole operations just before chosen doorbells of its own, so a narrow
//! race happens on every run (the seeded runs of `sim.rs` explore many
//! interleavings; these pin the ones that once went wrong).

mod common;

use common::*;
use race_store::hash::KeyHash;
use race_store::layout::bucket::MainSide;
use race_store::layout::slot::{RemotePtr, Slot};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::LocalTransport;
use race_store::remote::{OpResult, RemoteOp, Transport, TransportError};
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

/// Two inserts of one key race, and the subtable splits while they settle:
/// exactly one of them wins, and its value stays.
///
/// A reads the key's buckets and picks slot S (the first free slot of its
/// left main bucket). Before A's CAS, B inserts the key and wins: it read
/// the buckets while another client held S, so it took a slot of the right
/// main bucket (a higher address), and saw itself alone after its CAS.
/// Then A's CAS on S succeeds: A's copy is the lowest, so A waits for B's
/// to withdraw (it never will: B won). While A waits, the subtable splits.
/// A splitter that kept only the lowest copy of the key dropped B's, and A
/// then saw itself alone and won too: two successful inserts, B's value
/// gone. The splitter keeps every copy; A withdraws.
#[test]
fn a_split_while_racing_inserts_settle_keeps_the_winner() {
    let cluster = tiny_cluster(1, 1, 16 << 20, 8);
    let g = SubtableGeometry::new(1).unwrap();
    let locs = |k: &[u8]| KeyHash::of(k).bucket_locs(g);
    // The contested key: its candidates are the left main bucket, then the
    // right one; the other keys share its buckets.
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
    let clock = manual_clock();
    let mut b = open(&cluster, clock.clone(), manual_config());
    let mut n = open(&cluster, clock.clone(), manual_config());
    let mut step = 0;
    let mut b_won = false;
    let hook = |ops: &[RemoteOp<'_>]| match step {
        // A's CAS on its empty slot (with the re-read of its buckets).
        0 if ops.iter().any(
            |op| matches!(op, RemoteOp::Cas { expect, .. } if *expect == Slot::EMPTY.raw()),
        ) =>
        {
            n.insert(&others[0], b"holds S").unwrap();
            b.insert(&contested, b"from B").unwrap();
            b_won = true;
            n.delete(&others[0]).unwrap();
            step = 1;
        }
        // A's next doorbell: it is settling its copy against B's.
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
