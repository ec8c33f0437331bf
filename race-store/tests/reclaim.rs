//! The reclamation guarantee, shown on purpose-built races: a KV block is
//! reused only after the grace period, and an attempt that outlives its
//! deadline restarts, so a block reused under a slow client is never
//! mistaken for the one it read (not even when reuse brings the exact same
//! slot word back: ABA).

mod common;

use std::sync::Arc;

use common::*;
use race_store::clock::{Clock, ManualClock};
use race_store::hash::KeyHash;
use race_store::layout::slot::{RemotePtr, Slot};
use race_store::memory::{LocalCluster, LocalTransport};
use race_store::remote::{OpResult, RemoteOp, Transport, TransportError};
use race_store::{Client, ClientConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Runs a hook before a given doorbell of its client: the other clients'
/// work that happens "while this one is slow".
struct Hooked {
    inner: LocalTransport,
    doorbells: u64,
    at: u64,
    hook: Option<Box<dyn FnOnce() + Send>>,
}

impl Transport for Hooked {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        self.doorbells += 1;
        if self.doorbells == self.at {
            if let Some(hook) = self.hook.take() {
                hook();
            }
        }
        self.inner.execute(batch)
    }
    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.inner.alloc_block(node, size)
    }
    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

fn config() -> ClientConfig {
    ClientConfig {
        max_op_ticks: 100,
        grace_ticks: 250,
        ..manual_config()
    }
}

/// The slot words of a key in the (single, one-group) subtable.
fn slot_words(cluster: &LocalCluster, key: &[u8]) -> Vec<u64> {
    let node = cluster.node(0).unwrap();
    let base = race_store::layout::table::node0_heap_start(4).unwrap();
    let img = node.read(base, 192).unwrap();
    let fp = KeyHash::of(key).fingerprint();
    img.chunks(64)
        .flat_map(|b| b[8..].chunks(8))
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .filter(|&w| Slot::from_raw(w).matches(fp))
        .collect()
}

fn counter(v: Option<&[u8]>) -> u64 {
    v.map_or(0, |b| String::from_utf8_lossy(b).parse().unwrap())
}

fn incr(v: Option<&[u8]>) -> Option<Vec<u8>> {
    Some((counter(v) + 1).to_string().into_bytes())
}

#[test]
fn aba_after_reuse_is_caught_by_the_attempt_deadline() {
    let cluster = tiny_cluster(1, 1, 1 << 20, 4);
    let clock = Arc::new(ManualClock::new(0, 1));
    let b = Arc::new(std::sync::Mutex::new(
        Client::open(cluster.transport(), clock.clone(), config()).unwrap(),
    ));
    b.lock().unwrap().insert(b"ctr", b"10").unwrap();
    // A's rmw: doorbell 1 reads the buckets, doorbell 2 the block; while A
    // is stalled before doorbell 2, B increments twice with a grace period
    // in between, so that its second increment reuses the first block: the
    // slot word A read is back, over a newer value.
    let (b2, c2) = (Arc::clone(&b), Arc::clone(&clock));
    let hooked = Hooked {
        inner: cluster.transport(),
        doorbells: 0,
        at: 0,
        hook: Some(Box::new(move || {
            let mut b = b2.lock().unwrap();
            b.rmw(b"ctr", incr).unwrap();
            c2.advance(300);
            b.rmw(b"ctr", incr).unwrap();
        })),
    };
    let mut a = Client::open(hooked, clock.clone() as Arc<dyn Clock>, config()).unwrap();
    a.transport_mut().at = a.transport().doorbells + 2;
    let retries = a.stats().retries;
    assert_eq!(a.rmw(b"ctr", incr).unwrap(), Some(b"13".to_vec()));
    assert_eq!(slot_words(&cluster, b"ctr").len(), 1);
    assert!(a.stats().retries > retries, "the stale attempt restarted");
    // That B's two increments reinstall the very word A had read is shown
    // by `aba_is_real_without_a_stall_check`.
    let mut probe = Client::open(cluster.transport(), clock.clone(), config()).unwrap();
    assert_eq!(probe.get(b"ctr").unwrap(), Some(b"13".to_vec()));
}

#[test]
fn aba_is_real_without_a_stall_check() {
    // The same schedule as above, observed from the memory: B's second
    // increment reinstalls the exact slot word of the first value.
    let cluster = tiny_cluster(1, 1, 1 << 20, 4);
    let clock = Arc::new(ManualClock::new(0, 1));
    let mut b = Client::open(cluster.transport(), clock.clone(), config()).unwrap();
    b.insert(b"ctr", b"10").unwrap();
    let first = slot_words(&cluster, b"ctr");
    b.rmw(b"ctr", incr).unwrap();
    assert_ne!(slot_words(&cluster, b"ctr"), first);
    clock.advance(300);
    b.rmw(b"ctr", incr).unwrap();
    assert_eq!(
        slot_words(&cluster, b"ctr"),
        first,
        "same word, newer value"
    );
    assert_eq!(b.get(b"ctr").unwrap(), Some(b"12".to_vec()));
}

#[test]
fn reader_of_a_reused_block_restarts_instead_of_missing() {
    let cluster = tiny_cluster(1, 1, 1 << 20, 4);
    let clock = Arc::new(ManualClock::new(0, 1));
    let b = Arc::new(std::sync::Mutex::new(
        Client::open(cluster.transport(), clock.clone(), config()).unwrap(),
    ));
    b.lock().unwrap().insert(b"k", b"old").unwrap();
    // While A is between its bucket READ and its block READ, B deletes "k",
    // waits out the grace period and reuses the block for another key: A's
    // block READ finds another key's block. Skipping it as a fingerprint
    // collision would report "k" absent though "k" was there when A began;
    // the deadline makes A restart instead (and then see the truth).
    let (b2, c2) = (Arc::clone(&b), Arc::clone(&clock));
    let hooked = Hooked {
        inner: cluster.transport(),
        doorbells: 0,
        at: 0,
        hook: Some(Box::new(move || {
            let mut b = b2.lock().unwrap();
            b.update(b"k", b"new").unwrap();
            c2.advance(300);
            b.insert(b"other", b"xyz").unwrap();
        })),
    };
    let mut a = Client::open(hooked, clock.clone() as Arc<dyn Clock>, config()).unwrap();
    a.transport_mut().at = a.transport().doorbells + 2;
    assert_eq!(a.get(b"k").unwrap(), Some(b"new".to_vec()));
    assert!(a.stats().retries > 0);
}

#[test]
fn attempts_past_their_deadline_restart_and_complete() {
    // Every doorbell may take longer than an attempt is allowed: operations
    // restart until one attempt fits, and results stay exact.
    struct Slow {
        inner: LocalTransport,
        clock: Arc<ManualClock>,
        rng: SmallRng,
    }
    impl Transport for Slow {
        fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
            // A quarter of the doorbells stall longer than an attempt.
            let stall = if self.rng.gen_bool(0.25) {
                150
            } else {
                self.rng.gen_range(0..20)
            };
            self.clock.advance(stall);
            self.inner.execute(batch)
        }
        fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
            self.inner.alloc_block(node, size)
        }
        fn nodes(&self) -> u8 {
            self.inner.nodes()
        }
    }
    let cluster = tiny_cluster(2, 1, 16 << 20, 10);
    let clock = Arc::new(ManualClock::new(0, 1));
    let slow = Slow {
        inner: cluster.transport(),
        clock: clock.clone(),
        rng: SmallRng::seed_from_u64(7),
    };
    let mut c = Client::open(slow, clock.clone() as Arc<dyn Clock>, config()).unwrap();
    let mut model = std::collections::HashMap::new();
    for i in 0..600u64 {
        let k = key(i % 150);
        match i % 5 {
            0 | 1 => {
                c.put(&k, &value(i, 0, (i % 90) as usize)).unwrap();
                model.insert(k, value(i, 0, (i % 90) as usize));
            }
            2 => assert_eq!(c.get(&k).unwrap(), model.get(&k).cloned()),
            3 => {
                let r = c.rmw(&k, |v| v.map(|v| [v, b"!"].concat()));
                assert_eq!(r.unwrap(), model.get(&k).map(|v| [&v[..], b"!"].concat()));
                if let Some(v) = model.get_mut(&k) {
                    v.push(b'!');
                }
            }
            _ => {
                if model.remove(&k).is_some() {
                    c.delete(&k).unwrap();
                }
            }
        }
    }
    assert!(c.stats().retries > 50, "{:?}", c.stats());
    assert!(c.stats().splits >= 2, "{:?}", c.stats());
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    let mut expect: Vec<_> = model.into_iter().collect();
    expect.sort();
    assert_eq!(check.pairs, expect);
}
