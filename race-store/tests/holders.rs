//! A client that dies (here: forgotten without closing, as a SIGKILL leaves
//! it) gets its lease on the memory nodes' grants ended, and the nodes
//! take back every block of its grants it never wrote; what it wrote stays,
//! and a client whose lease ended while it was idle drops what it held
//! instead of writing into memory handed out again (see
//! `race_store::holders`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use race_store::memory::{LocalCluster, LocalTransport};
use race_store::Client;

/// Long against a debug build's stalls under a loaded machine: a client
/// that stalls for half a lease between carving a block and writing it
/// breaks the fence's timing assumption (`race_store::holders`).
const LEASE: Duration = Duration::from_secs(1);

fn reclaimed(cluster: &LocalCluster) -> u64 {
    cluster.stats().iter().map(|s| s.holders.reclaimed).sum()
}

/// Puts version `version` of each key of `keys` (lengths vary with the
/// key and the version), noting it in `model`.
fn write(
    c: &mut Client<LocalTransport>,
    keys: std::iter::StepBy<std::ops::Range<u64>>,
    version: u64,
    model: &mut HashMap<u64, Vec<u8>>,
) {
    for k in keys {
        let v = value(k, version, 40 + ((k + version * 7) as usize % 190));
        c.put(&key(k), &v).unwrap();
        model.insert(k, v);
    }
}

fn reclaim_now(cluster: &LocalCluster) -> u64 {
    (0..cluster.len())
        .filter_map(|i| cluster.node(i))
        .map(|n| n.reclaim_expired())
        .sum()
}

#[test]
fn a_dead_clients_unwritten_grants_come_back_and_an_idle_ones_are_fenced() {
    let cluster = tiny_cluster(2, 64, 64 << 20, 16);
    cluster.set_grant_lease(LEASE);
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let config = system_config();

    // A writes and dies: no close, no drop.
    let mut a = open(&cluster, system_clock(), config);
    write(&mut a, (0..1500).step_by(1), 0, &mut model);
    let a_held = a.stats().kv_memory;
    assert!(a_held.uncarved_bytes > 0, "{a_held:?}");
    std::mem::forget(a);

    // B writes, then idles past its lease too.
    let mut b = open(&cluster, system_clock(), config);
    write(&mut b, (1500..3000).step_by(1), 0, &mut model);
    let b_held = b.stats().kv_memory;
    assert_eq!(b_held.dropped_bytes, 0);
    std::thread::sleep(LEASE + LEASE / 2);

    // Both leases ended: exactly the blocks nobody wrote come back, which
    // are the two clients' uncarved bytes (their free blocks were written).
    let back = reclaim_now(&cluster);
    assert_eq!(back, a_held.uncarved_bytes + b_held.uncarved_bytes);
    assert_eq!(reclaimed(&cluster), back);
    assert!(cluster.stats().iter().all(|s| s.holders.holders == 0));

    // C takes what came back, before B wakes up.
    let reused_before: u64 = cluster.stats().iter().map(|s| s.pool.reused).sum();
    let mut c = open(&cluster, system_clock(), config);
    write(&mut c, (3000..4500).step_by(1), 0, &mut model);
    let reused: u64 = cluster.stats().iter().map(|s| s.pool.reused).sum();
    assert!(
        reused > reused_before,
        "the blocks taken back were handed out again"
    );

    // B's next writes must not use what it held uncarved (C may hold it
    // now): it learns of its new lease and drops the old grants. Its free
    // blocks were written, so no node took them: it keeps them.
    write(&mut b, (1500..3000).step_by(3), 1, &mut model);
    let b_now = b.stats().kv_memory;
    assert_eq!(b_now.dropped_bytes, b_held.uncarved_bytes, "{b_now:?}");
    write(&mut c, (3000..4500).step_by(2), 1, &mut model);

    // Every value written, by the dead client too, reads back; the table
    // checks clean.
    let mut d = open(&cluster, system_clock(), config);
    for (k, v) in &model {
        assert_eq!(d.get(&key(*k)).unwrap().as_deref(), Some(&v[..]), "key {k}");
    }
    let check = d.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert_eq!(check.pairs.len(), model.len());
    drop((b, c, d));
}

/// A client that idles past its lease keeps its free blocks (they were
/// written: the node took back none of them) and reuses them when it
/// writes again, instead of dropping them and asking for new grants: each
/// such pause leaked up to `FREE_HIGH` per (node, class) it used before.
#[test]
fn an_idle_client_keeps_its_written_free_blocks_across_a_new_lease() {
    let cluster = tiny_cluster(1, 64, 64 << 20, 16);
    cluster.set_grant_lease(LEASE);
    let clock = manual_clock();
    // Grace periods of the manual clock: short, so that updated blocks
    // reach the free lists when the test moves the clock.
    let config = race_store::ClientConfig {
        max_op_ticks: 10,
        grace_ticks: 100,
        ..manual_config()
    };
    let mut c = open(&cluster, clock.clone(), config);
    let mut model = HashMap::new();
    // One value length: one size class, whose free blocks serve later
    // writes.
    let mut put = |c: &mut Client<LocalTransport>, keys: std::ops::Range<u64>, step, version| {
        for k in keys.step_by(step) {
            let v = value(k, version, 100);
            c.put(&key(k), &v).unwrap();
            model.insert(k, v);
        }
    };
    for version in 0..4 {
        put(&mut c, 0..500, 1, version);
    }
    clock.advance(1_000);
    // One more write moves the updated blocks past their grace to the free
    // lists.
    put(&mut c, 0..1, 1, 4);
    let before = c.stats().kv_memory;
    assert!(before.free_bytes > 64 << 10, "{before:?}");
    let heap_before = cluster.stats()[0].heap_used;

    std::thread::sleep(LEASE + LEASE / 2);
    let back = reclaim_now(&cluster);
    assert_eq!(back, before.uncarved_bytes, "only what it never carved");

    // Writes again: a new lease, its uncarved runs dropped, its free
    // blocks reused (they cover 300 updates), no new grant.
    put(&mut c, 0..500, 5, 5);
    put(&mut c, 0..500, 2, 6);
    let after = c.stats().kv_memory;
    assert_eq!(after.dropped_bytes, before.uncarved_bytes, "{after:?}");
    assert!(
        after.free_bytes < before.free_bytes,
        "it used its free blocks"
    );
    assert_eq!(cluster.stats()[0].heap_used, heap_before, "no new grant");
    for (k, v) in &model {
        assert_eq!(c.get(&key(*k)).unwrap().as_deref(), Some(&v[..]), "key {k}");
    }
    let check = c.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.pairs.len(), model.len());
}

#[test]
fn a_closed_client_leaves_nothing_to_take_back() {
    let cluster = tiny_cluster(1, 64, 16 << 20, 16);
    cluster.set_grant_lease(LEASE);
    let mut a = open(&cluster, system_clock(), system_config());
    for k in 0..500 {
        a.insert(&key(k), &value(k, 0, 100)).unwrap();
    }
    let report = a.close();
    assert!(report.error.is_none(), "{:?}", report.error);
    assert_eq!(report.leases_ended, 1);
    // Its close ended its lease: no longer a live holder, with no wait.
    let s = cluster.stats()[0].holders;
    assert_eq!((s.holders, s.ended), (0, 1));
    assert_eq!(
        reclaim_now(&cluster),
        0,
        "it gave back what it did not write"
    );
    // The node ends nothing more when the lease would have run out.
    std::thread::sleep(LEASE + LEASE / 2);
    assert_eq!(reclaim_now(&cluster), 0);
    assert_eq!(cluster.stats()[0].holders.ended, 1);
}

/// The same over messaging: memory nodes served on `sim:mem` announce
/// leases, a client names itself in its requests, and the node's upkeep
/// thread takes back what a forgotten client never wrote, with no request
/// from anyone.
#[test]
fn served_memory_nodes_take_back_a_dead_clients_grants_by_themselves() {
    use common::rdma::cluster_leased;
    use krcore::Node;
    use krcore_kmod::EngineConfig;
    use race_store::rdma::{VqpTransport, FEATURE_LEASES};

    let c = cluster_leased(
        2,
        32 << 20,
        12,
        EngineConfig::default(),
        // The fence's timing assumption: the writer never stalls a quarter
        // of a lease between carving a block and writing it. At 300 ms a
        // starved run (nice 19 beside a CI run) lost a key once.
        Some(LEASE),
    );
    assert!(c.infos.iter().all(|i| i.features & FEATURE_LEASES != 0));
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &c.infos).unwrap();
    let mut a = Client::open(t, system_clock(), system_config()).unwrap();
    for k in 0..2000u64 {
        a.put(&key(k), &value(k, 0, 300)).unwrap();
    }
    let held = a.stats().kv_memory;
    let uncarved = held.uncarved_bytes;
    assert!(uncarved > 0, "{held:?}");
    assert!(c._servers.iter().any(|s| s.stats().holders.holders == 1));
    std::mem::forget(a);

    let back = || -> u64 { c._servers.iter().map(|s| s.stats().holders.reclaimed).sum() };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    // Grants asked ahead and answered but not collected come back too.
    while back() < uncarved {
        assert!(
            std::time::Instant::now() < until,
            "took back {} of {uncarved}",
            back()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &c.infos).unwrap();
    let mut b = Client::open(t, system_clock(), system_config()).unwrap();
    for k in 2000..4000u64 {
        b.put(&key(k), &value(k, 0, 300)).unwrap();
    }
    for k in 0..4000u64 {
        assert_eq!(b.get(&key(k)).unwrap(), Some(value(k, 0, 300)), "key {k}");
    }
}

/// Threads write their own keys while some idle past their lease (their
/// grants taken back and handed to others meanwhile) and some die (a new
/// client takes over their keys); a thread takes back ended leases all
/// along. Every acknowledged value reads back and the table checks clean:
/// no client wrote into memory handed out again.
#[test]
fn idlers_and_the_dead_never_write_into_memory_handed_out_again() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const STRESS_LEASE: Duration = Duration::from_millis(600);
    let cluster = tiny_cluster(2, 64, 64 << 20, 16);
    cluster.set_grant_lease(STRESS_LEASE);
    let stop = Arc::new(AtomicBool::new(false));
    let reaper = {
        let (cluster, stop) = (cluster.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                reclaim_now(&cluster);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let cluster = cluster.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
                let mut c = open(&cluster, system_clock(), system_config());
                let (mut idled, mut died, mut dropped) = (0, 0, 0);
                for round in 0..8u64 {
                    for _ in 0..300 {
                        let k = t * 100_000 + rng.gen_range(0..400);
                        let v = value(k, round, rng.gen_range(8..300));
                        c.put(&key(k), &v).unwrap();
                        model.insert(k, v);
                    }
                    match rng.gen_range(0..3) {
                        0 => {
                            idled += 1;
                            std::thread::sleep(STRESS_LEASE + STRESS_LEASE / 2);
                        }
                        1 => {
                            died += 1;
                            dropped += c.stats().kv_memory.dropped_bytes;
                            std::mem::forget(c);
                            c = open(&cluster, system_clock(), system_config());
                        }
                        _ => {}
                    }
                }
                dropped += c.stats().kv_memory.dropped_bytes;
                (model, idled, died, dropped, c)
            })
        })
        .collect();
    let mut model = HashMap::new();
    let (mut idled, mut dropped) = (0, 0);
    let mut clients = Vec::new();
    for w in writers {
        let (m, i, _, d, c) = w.join().unwrap();
        model.extend(m);
        idled += i;
        dropped += d;
        clients.push(c);
    }
    stop.store(true, Ordering::Relaxed);
    reaper.join().unwrap();
    assert!(reclaimed(&cluster) > 0, "nothing was taken back");
    if idled > 0 {
        assert!(dropped > 0, "{idled} idle spells and nothing dropped");
    }
    let mut d = open(&cluster, system_clock(), system_config());
    for (k, v) in &model {
        assert_eq!(d.get(&key(*k)).unwrap().as_deref(), Some(&v[..]), "key {k}");
    }
    let check = d.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.pairs.len(), model.len());
    drop(clients);
}

/// A client that keeps updating from its own free blocks asks no grants:
/// its lease lives on renewals alone, sent ahead and collected later. Over
/// many leases the node never takes it for dead and it never drops what it
/// holds.
#[test]
fn a_writer_that_asks_no_grants_keeps_its_lease_by_renewals() {
    use common::rdma::cluster_leased;
    use krcore::Node;
    use krcore_kmod::EngineConfig;
    use race_store::rdma::VqpTransport;

    let lease = Duration::from_millis(300);
    let c = cluster_leased(1, 32 << 20, 12, EngineConfig::default(), Some(lease));
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &c.infos).unwrap();
    let config = race_store::ClientConfig {
        grace_ticks: 20_000,
        max_op_ticks: 5_000,
        ..system_config()
    };
    let mut a = Client::open(t, system_clock(), config).unwrap();
    for k in 0..200u64 {
        a.put(&key(k), &value(k, 0, 100)).unwrap();
    }
    let start = std::time::Instant::now();
    let mut n = 0u64;
    while start.elapsed() < lease * 8 {
        let k = n % 200;
        a.put(&key(k), &value(k, n, 100)).unwrap();
        n += 1;
    }
    let s = c._servers[0].stats().holders;
    assert_eq!(s.ended, 0, "{s:?}");
    assert_eq!(a.stats().kv_memory.dropped_bytes, 0);
    for k in 0..200u64 {
        assert!(a.get(&key(k)).unwrap().is_some());
    }
}

/// Over messaging a client asks for its next grant ahead. One that stands
/// idle past its lease with such an answer uncollected: the node ends its
/// lease and takes the granted runs back (never written), and another
/// client is handed them. When the idle one writes again it renews its
/// lease first, so the old answer is refused instead of installed: it never
/// writes into the other client's blocks.
#[test]
fn an_idle_clients_grant_asked_ahead_is_not_used_after_its_lease_ended() {
    use common::rdma::cluster_leased;
    use krcore_kmod::EngineConfig;

    let lease = Duration::from_millis(300);
    let c = cluster_leased(1, 32 << 20, 12, EngineConfig::default(), Some(lease));
    let connect = || c.client(system_config());
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut idle = connect();
    for k in 0..300u64 {
        let v = value(k, 0, 300);
        idle.put(&key(k), &v).unwrap();
        model.insert(k, v);
    }
    // Its grants asked ahead come in; then it stands idle past its lease.
    std::thread::sleep(lease * 3);
    let back: u64 = c._servers.iter().map(|s| s.stats().holders.reclaimed).sum();
    assert!(back > 0, "the node took back what it never wrote");
    let mut other = connect();
    for k in 1000..1600u64 {
        let v = value(k, 0, 300);
        other.put(&key(k), &v).unwrap();
        model.insert(k, v);
    }
    for k in 300..900u64 {
        let v = value(k, 1, 300);
        idle.put(&key(k), &v).unwrap();
        model.insert(k, v);
    }
    for (k, v) in &model {
        assert_eq!(
            other.get(&key(*k)).unwrap().as_deref(),
            Some(&v[..]),
            "key {k}"
        );
    }
    let check = other.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    for cl in [idle, other] {
        let r = cl.close();
        assert!(r.error.is_none(), "{:?}", r.error);
    }
}
