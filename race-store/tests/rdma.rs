//! race-store end to end over KRCore on `sim:mem`: a meta server, RDMA
//! memory nodes (node 0 holding a tiny table so splits and directory
//! doublings happen under load), and client threads on their own compute
//! nodes, each connected to every memory node by a metadata lookup.

mod common;

use common::rdma::{cluster, cluster_with, Cluster};
use krcore::Node;
use race_store::client::Op;
use race_store::clock::{Clock, SystemClock};
use race_store::rdma::VqpTransport;
use race_store::{Client, ClientConfig, Error};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

fn client(c: &Cluster, clock: Arc<dyn Clock>) -> Client<VqpTransport<krcore_nic::AnyNic>> {
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &c.infos).unwrap();
    Client::open(t, clock, ClientConfig::default()).unwrap()
}

#[test]
fn model_check_with_splits_over_vqps() {
    let c = cluster(2, 32 << 20, 12);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let threads = 3u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let cl = client(&c, clock.clone());
            s.spawn(move || {
                let mut cl = cl;
                let mut reference: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                let mut x = 0x9e37_79b9u64 ^ t;
                for i in 0..1500u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Disjoint key ranges per thread: exact reference check.
                    let key = format!("t{t}-k{}", x % 300).into_bytes();
                    let val = format!("v{i}-{}", "x".repeat((x % 90) as usize)).into_bytes();
                    match x % 6 {
                        0 | 1 => {
                            cl.put(&key, &val).unwrap();
                            reference.insert(key, val);
                        }
                        2 => match cl.insert(&key, &val) {
                            Ok(()) => assert!(
                                reference.insert(key, val).is_none(),
                                "insert of a present key succeeded"
                            ),
                            Err(Error::KeyExists) => assert!(reference.contains_key(&key)),
                            Err(e) => panic!("insert: {e}"),
                        },
                        3 => match cl.update(&key, &val) {
                            Ok(()) => assert!(
                                reference.insert(key, val).is_some(),
                                "update of an absent key succeeded"
                            ),
                            Err(Error::NotFound) => assert!(!reference.contains_key(&key)),
                            Err(e) => panic!("update: {e}"),
                        },
                        4 => match cl.delete(&key) {
                            Ok(()) => assert!(reference.remove(&key).is_some()),
                            Err(Error::NotFound) => assert!(!reference.contains_key(&key)),
                            Err(e) => panic!("delete: {e}"),
                        },
                        _ => assert_eq!(
                            cl.get(&key).unwrap(),
                            reference.get(&key).cloned(),
                            "get {key:?}"
                        ),
                    }
                }
                for (k, v) in &reference {
                    assert_eq!(cl.get(k).unwrap().as_ref(), Some(v));
                }
                cl.stats()
            });
        }
    });
    let mut check = client(&c, clock);
    let report = check.check_table().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        report.global_depth > 0,
        "the tiny table grew (splits happened)"
    );
}

/// Batches of 8 to 24 operations of every kind over VQPs, which keep two
/// doorbells in flight: waves of 8 or more run as two groups whose
/// doorbells overlap; every reply is exactly the reference's, applied in
/// submission order, by two clients on disjoint keys while the tiny table
/// splits.
#[test]
fn overlapped_batches_over_vqps_against_a_reference() {
    let c = cluster(2, 32 << 20, 12);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let overlapped: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                let mut cl = client(&c, clock.clone());
                s.spawn(move || {
                    let mut reference: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                    let mut x = 0x51ed_270bu64 ^ (t << 32);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for b in 0..150u64 {
                        let n = 8 + next() % 17;
                        let items: Vec<(u64, Vec<u8>, Vec<u8>)> = (0..n)
                            .map(|j| {
                                let r = next();
                                let key = format!("t{t}-k{}", r % 250).into_bytes();
                                let val =
                                    format!("v{b}-{j}-{}", "y".repeat((r >> 20) as usize % 120))
                                        .into_bytes();
                                (r >> 40, key, val)
                            })
                            .collect();
                        let ops: Vec<Op<'_>> = items
                            .iter()
                            .map(|(p, k, v)| match p % 10 {
                                0..=3 => Op::Get(k),
                                4 => Op::Insert(k, v),
                                5 | 6 => Op::Put(k, v),
                                7 | 8 => Op::Update(k, v),
                                _ => Op::Delete(k),
                            })
                            .collect();
                        for (op, reply) in ops.iter().zip(cl.batch(&ops)) {
                            let k = op.key().to_vec();
                            let cur = reference.get(&k).cloned();
                            let want = match *op {
                                Op::Get(_) => Ok(cur),
                                Op::Insert(_, v) if cur.is_none() => {
                                    reference.insert(k, v.to_vec());
                                    Ok(None)
                                }
                                Op::Insert(..) => Err(Error::KeyExists),
                                Op::Put(_, v) => {
                                    reference.insert(k, v.to_vec());
                                    Ok(None)
                                }
                                Op::Update(_, v) if cur.is_some() => {
                                    reference.insert(k, v.to_vec());
                                    Ok(None)
                                }
                                Op::Update(..) => Err(Error::NotFound),
                                Op::Delete(_) if reference.remove(&k).is_some() => Ok(None),
                                Op::Delete(_) => Err(Error::NotFound),
                            };
                            assert_eq!(reply, want, "thread {t} batch {b}: {op:?}");
                        }
                    }
                    for (k, v) in &reference {
                        assert_eq!(cl.get(k).unwrap().as_ref(), Some(v));
                    }
                    cl.stats().overlapped_waves
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(overlapped > 100, "waves run as two groups: {overlapped}");
    let mut check = client(&c, clock);
    let report = check.check_table().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.global_depth > 0, "the tiny table grew");
}

#[test]
fn get_is_two_doorbells_and_connect_creates_no_qp() {
    let c = cluster(1, 16 << 20, 12);
    let node = Node::builder()
        .join(&c.meta)
        .config(krcore::EngineConfig::default().with_pool_size(1))
        .build()
        .unwrap();
    let _first = VqpTransport::connect(&node, &c.infos).unwrap();
    // A second client on the same compute node: its VQP shares the pool's
    // DC initiator and the node's DCCache already knows the memory node.
    let before = node.counters();
    let t = VqpTransport::connect(&node, &c.infos).unwrap();
    let d = node.counters() - before;
    assert_eq!(d.qps_created, 0, "the allocation endpoint is lazy: {d:?}");
    assert!(!t.has_msg_endpoint());
    assert_eq!(d.network_ops(), 0, "connect was a DCCache hit");
    let mut cl = Client::open(t, Arc::new(SystemClock::new()), ClientConfig::default()).unwrap();
    let before = node.counters();
    cl.put(b"key", b"value").unwrap();
    let d = node.counters() - before;
    // The first put allocates a block: a message to the memory node's
    // allocation port, on the node's pool DCI and DCT (this node
    // registered, so its DCT exists): still no QP.
    assert!(cl.transport().has_msg_endpoint());
    assert_eq!(d.qps_created, 0, "the allocation rides on messaging: {d:?}");
    // Two sends: the channel's Open, which carries the request (one round
    // trip for both), and its Close once answered.
    assert_eq!(
        d.sends, 2,
        "the Open carrying the request, the Close: {d:?}"
    );
    let before = node.counters();
    assert_eq!(cl.get(b"key").unwrap().as_deref(), Some(&b"value"[..]));
    let d = node.counters() - before;
    assert_eq!(d.doorbells, 2, "search = 2 round trips: {d:?}");
    // The bucket READs (two combined buckets, or one when both fall in the
    // same group, as in this one-group table), then the KV block.
    assert!((2..=3).contains(&d.reads), "{d:?}");
}

#[test]
fn batches_larger_than_a_vqp_run_as_several_doorbells() {
    use race_store::layout::slot::RemotePtr;
    use race_store::remote::{OpResult, RemoteOp, Transport};
    let c = cluster(1, 16 << 20, 12);
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    let base = 8 << 20;
    let writes: Vec<Vec<u8>> = (0..1000u64).map(|i| i.to_le_bytes().repeat(8)).collect();
    let ops: Vec<RemoteOp<'_>> = writes
        .iter()
        .enumerate()
        .map(|(i, w)| RemoteOp::Write {
            ptr: RemotePtr::new(0, base + 64 * i as u64).unwrap(),
            bytes: w,
        })
        .collect();
    assert!(t
        .execute(&ops)
        .unwrap()
        .iter()
        .all(|r| *r == OpResult::Written));
    let reads: Vec<RemoteOp<'_>> = (0..1000u64)
        .map(|i| RemoteOp::Read {
            ptr: RemotePtr::new(0, base + 64 * i).unwrap(),
            len: 64,
        })
        .collect();
    let got = t.execute(&reads).unwrap();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.read_bytes(), Some(&writes[i][..]));
    }
}

/// A batch over two nodes, cut into doorbells per node: every READ sees
/// the WRITE just before it on its node, across the cuts.
#[test]
fn batches_cut_per_node_keep_each_nodes_order() {
    use race_store::layout::slot::RemotePtr;
    use race_store::remote::{RemoteOp, Transport};
    let c = cluster(2, 16 << 20, 12);
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    let base = 8 << 20;
    let values: Vec<[u8; 8]> = (0..300u64).map(|k| (k + 1).to_le_bytes()).collect();
    // Node 0 gets two ops per step, node 1 one per three steps: the cuts
    // fall at different places for the two nodes.
    let mut ops = Vec::new();
    let mut expect = Vec::new();
    for (k, v) in values.iter().enumerate() {
        let n = u8::from(k % 3 == 2);
        let ptr = RemotePtr::new(n, base + 8 * (k as u64 % 5)).unwrap();
        ops.push(RemoteOp::Write { ptr, bytes: v });
        ops.push(RemoteOp::Read { ptr, len: 8 });
        expect.push((ops.len() - 1, v));
    }
    let got = t.execute(&ops).unwrap();
    assert_eq!(got.len(), ops.len());
    for (i, v) in expect {
        assert_eq!(got[i].read_bytes(), Some(&v[..]), "op {i}");
    }
}

/// A memory node's engine with room for an allocation port of 64 slots
/// only (its receive budget: 128 buffers less 32 control slots, less the
/// memory node's headroom of 32).
fn port_of_64() -> krcore_kmod::EngineConfig {
    let mut cfg = krcore_kmod::EngineConfig::default();
    cfg.recv_depth = 128;
    cfg
}

type Asked = (
    VqpTransport<krcore_nic::AnyNic>,
    race_store::remote::AllocAsk,
);

/// `n` clients on `node`, each with a 4 KiB grant of memory node 0 asked
/// ahead (a channel of its allocation port held while it is out).
fn ask_ahead(node: &Node, c: &Cluster, n: usize) -> Vec<Asked> {
    use race_store::remote::Transport;
    (0..n)
        .map(|i| {
            let mut t = VqpTransport::connect(node, &c.infos).unwrap();
            let ask = t
                .alloc_block_ask(0, 4096, 64)
                .unwrap_or_else(|| panic!("client {i}: not asked"))
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            (t, ask)
        })
        .collect()
}

/// Each client's answer, in order, waited for: 4 KiB each.
fn collect_answers(clients: &mut [Asked]) {
    use race_store::remote::Transport;
    for (i, (t, ask)) in clients.iter_mut().enumerate() {
        let runs = t
            .alloc_block_answer(*ask, true)
            .unwrap_or_else(|e| panic!("client {i}: {e}"))
            .unwrap_or_else(|| panic!("client {i}: no answer"));
        assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), 4096);
    }
}

/// More clients than the engine's default `msg.port_slots` (64) allocate
/// at once, each with a request out (asked ahead, so each holds a channel
/// of the allocation port): the memory node sized its port for them
/// (`ALLOC_PORT_SLOTS`), so every one is granted at once, none refused or
/// reclaimed. Before, the 65th waited about 1 s for the port to reclaim an
/// idle channel (100 YCSB threads: each put's worst case about 1 s).
#[test]
fn more_clients_than_64_allocate_at_once_without_waiting_for_a_slot() {
    let c = cluster_with(
        1,
        64 << 20,
        12,
        race_store::rdma::memory_node_engine(krcore_kmod::EngineConfig::default()),
    );
    assert_eq!(
        c._servers[0].alloc_port_slots(),
        Some(race_store::rdma::ALLOC_PORT_SLOTS)
    );
    // One compute node for all of them (room for their reply windows).
    let mut cfg = krcore_kmod::EngineConfig::default();
    cfg.recv_depth = 1024;
    let node = Node::builder().join(&c.meta).config(cfg).build().unwrap();
    let mut clients = ask_ahead(&node, &c, 100);
    // The asks' channels open as the node's thread gets to their Opens (a
    // loaded machine: a while); all 100 stay open until collected.
    let port_usage = || {
        c.memory[0]
            .engine()
            .unwrap()
            .msg_port_usage(race_store::rdma::ALLOC_PORT)
            .unwrap()
    };
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while port_usage().channels <= 64 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let usage = port_usage();
    assert!(usage.channels > 64, "{usage:?}");
    collect_answers(&mut clients);
    let stats = c.memory[0].engine().unwrap().msg_stats();
    assert_eq!((stats.refused, stats.reclaimed), (0, 0), "{stats:?}");
}

/// Clients that share one compute node (the threads of a deployed client
/// process) each reserve reply windows of its receive budget while their
/// allocation channels are open; past the budget, an allocation waits for
/// another client's channel to close instead of failing. Before, a
/// 100-thread `krcore-ycsb` on one node failed 46% of its inserts ("4
/// receive slots wanted, 0 left unreserved").
#[test]
fn clients_past_their_nodes_receive_budget_wait_for_room() {
    let c = cluster(1, 64 << 20, 12);
    // Room for 8 channels' reply windows (64 buffers less 32 control
    // slots: 32, 4 per channel).
    let mut cfg = krcore_kmod::EngineConfig::default();
    cfg.recv_depth = 64;
    let node = Node::builder().join(&c.meta).config(cfg).build().unwrap();
    let mut clients = ask_ahead(&node, &c, 20);
    // The first ones' answers close their channels: the later requests go
    // out as room comes.
    collect_answers(&mut clients);
}

#[test]
fn clients_that_leave_do_not_fill_the_allocation_port() {
    use race_store::remote::Transport;
    // More short-lived clients than the allocation port has slots (64:
    // the memory node's engine has room for no more), each allocating one
    // block and dropped with its node: each closes its channel when
    // answered.
    let c = cluster_with(1, 64 << 20, 12, port_of_64());
    assert_eq!(c._servers[0].alloc_port_slots(), Some(64));
    for i in 0..80 {
        let node = Node::builder().join(&c.meta).build().unwrap();
        let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
        t.alloc_block(0, 4096)
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
    }
    // Senders that fill the port and leave without a Close (processes
    // that died, or endpoints of a full window whose credits are still
    // owed to them): a client's allocation waits until the full port
    // reclaims an idle one (`msg.control_idle`, 1 s) and succeeds.
    let (gid, port) = (c.infos[0].gid, c.infos[0].alloc_port);
    let hogs: Vec<_> = (0..8)
        .map(|_| {
            let node = Node::builder().join(&c.meta).build().unwrap();
            let ep = node.endpoint().unwrap();
            ep.push(gid, port, b"not an allocation request").unwrap();
            (node, ep)
        })
        .collect();
    let node = Node::builder().join(&c.meta).build().unwrap();
    let ep = node.endpoint().unwrap();
    assert!(
        matches!(
            ep.push(gid, port, b"x"),
            Err(krcore::MsgError::Refused {
                code: krcore::messaging::RefuseCode::Busy,
                ..
            })
        ),
        "the port is full"
    );
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    t.alloc_block(0, 4096).unwrap();
    drop(hogs);
}

#[test]
fn blocks_asked_ahead_are_answered_around_other_allocations() {
    use race_store::remote::Transport;
    let c = cluster(2, 64 << 20, 12);
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    // Two requests sent ahead, then allocations waited for on both nodes
    // (whose waits see the early answers go by and must keep them).
    let a0 = t.alloc_block_ask(0, 4096, 64).unwrap().unwrap();
    let a1 = t.alloc_block_ask(1, 8192, 64).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let s1 = t.alloc_block(1, 4096).unwrap();
    let s0 = t.alloc_block(0, 4096).unwrap();
    let one = |runs: Vec<race_store::remote::BlockRun>, len| {
        assert_eq!(runs.len(), 1, "a new coarse block is one run");
        assert_eq!(runs[0].len, len);
        runs[0].start
    };
    let b1 = one(t.alloc_block_answer(a1, true).unwrap().unwrap(), 8192);
    let b0 = one(t.alloc_block_answer(a0, false).unwrap().unwrap(), 4096);
    assert_eq!((b0.node(), b1.node(), s0.node(), s1.node()), (0, 1, 0, 1));
    // Distinct blocks on each node.
    let apart =
        |x: race_store::layout::slot::RemotePtr, y: race_store::layout::slot::RemotePtr, len| {
            x.offset() + len <= y.offset() || y.offset() + 4096 <= x.offset()
        };
    assert!(apart(b0, s0, 4096));
    assert!(apart(b1, s1, 8192));
    // An ask is answered once.
    assert!(t.alloc_block_answer(a0, false).is_err());
    // The client's writes allocate through asks: a YCSB-like load of
    // puts needs many blocks and keeps every value.
    let mut client =
        Client::open(t, Arc::new(SystemClock::new()), ClientConfig::default()).unwrap();
    for i in 0..3000u32 {
        client
            .put(&i.to_le_bytes(), &[i as u8; 200])
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    for i in (0..3000u32).step_by(7) {
        assert_eq!(
            client.get(&i.to_le_bytes()).unwrap(),
            Some(vec![i as u8; 200])
        );
    }
}

#[test]
fn clients_that_leave_with_a_block_asked_ahead_do_not_fill_the_port() {
    use race_store::remote::Transport;
    // A memory node whose port never reclaims an idle channel: a client
    // that left one open would hold its slot for good.
    let mut cfg = port_of_64();
    cfg.msg.control_idle = Duration::from_secs(3600);
    let c = cluster_with(1, 64 << 20, 4, cfg);
    assert_eq!(c._servers[0].alloc_port_slots(), Some(64));
    let (meta, infos) = (&c.meta, &c.infos);
    // More clients than the port has slots (64), each leaving with a
    // block asked ahead and not collected.
    for i in 0..80 {
        let node = Node::builder().join(meta).build().unwrap();
        let mut t = VqpTransport::connect(&node, infos).unwrap();
        let ask = t.alloc_block_ask(0, 4096, 64).unwrap();
        // Not collected: the client leaves with it.
        let _asked = ask.unwrap_or_else(|e| panic!("client {i}: {e}"));
    }
    let node = Node::builder().join(meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, infos).unwrap();
    t.alloc_block(0, 4096).unwrap();
}

#[test]
fn a_closed_clients_memory_goes_back_to_the_memory_nodes_over_messaging() {
    use race_store::remote::{BlockRun, Transport, TransportError};
    // One memory node: every block given back is on the node the next
    // client refills from (with several, a refill takes new heap on the
    // key's node while another node may still hold given-back blocks).
    let c = cluster(1, 64 << 20, 12);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let pooled = |c: &Cluster| -> (u64, u64) {
        c._servers.iter().fold((0, 0), |(r, u), s| {
            let p = s.stats().pool;
            (r + p.returned, u + p.reused)
        })
    };
    let heap = |c: &Cluster| -> u64 { c._servers.iter().map(|s| s.stats().heap_used).sum() };
    let mut cl = client(&c, clock.clone());
    for i in 0..2000u32 {
        cl.put(&i.to_le_bytes(), &[1; 150]).unwrap();
    }
    for i in 0..2000u32 {
        cl.update(&i.to_le_bytes(), &[2; 150]).unwrap();
    }
    let held = cl.stats().kv_memory;
    let r = cl.close();
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.kept_bytes, 0);
    // Its lease on the node's grants ended with its close.
    assert_eq!(r.leases_ended, 1);
    let live = |c: &Cluster| -> u64 { c._servers.iter().map(|s| s.stats().holders.holders).sum() };
    assert_eq!(live(&c), 0);
    // All it held, and a grant asked ahead if one was still out.
    assert!(r.returned_bytes >= held.held_bytes(), "{r:?} {held:?}");
    assert_eq!(pooled(&c).0, r.returned_bytes);
    // The blocks it retired last are held for the rest of their grace
    // period (the client's clock follows real time: close did not wait).
    let cooling: u64 = c._servers.iter().map(|s| s.stats().pool.cooling).sum();
    assert!(cooling > 0 && cooling <= held.quarantined_bytes);
    std::thread::sleep(Duration::from_micros(ClientConfig::default().grace_ticks) * 2);
    // The next client's updates take that memory, not new heap.
    let before = heap(&c);
    let mut cl = client(&c, clock.clone());
    for i in 0..2000u32 {
        cl.update(&i.to_le_bytes(), &[3; 150]).unwrap();
    }
    assert!(pooled(&c).1 > 0, "nothing reused");
    assert_eq!(heap(&c), before, "new heap taken while blocks were pooled");
    for i in (0..2000u32).step_by(13) {
        assert_eq!(cl.get(&i.to_le_bytes()).unwrap(), Some(vec![3; 150]));
    }
    drop(cl);

    // A run given back twice is refused the second time (the node holds
    // it), and so is one outside the heap handed out.
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    let runs = t.alloc_blocks(0, 4096, 128).unwrap();
    t.return_blocks(0, 128, &runs, Duration::ZERO, true)
        .unwrap();
    assert!(matches!(
        t.return_blocks(0, 128, &runs, Duration::ZERO, true),
        Err(TransportError::Refused { node: 0, .. })
    ));
    let far = BlockRun {
        start: race_store::layout::slot::RemotePtr::new(0, 60 << 20).unwrap(),
        len: 128,
    };
    assert!(matches!(
        t.return_blocks(0, 128, &[far], Duration::ZERO, true),
        Err(TransportError::Refused { node: 0, .. })
    ));

    // A node of an older version that keeps leases but takes no end: the
    // lease stays until it runs out.
    let mut older = c.infos.clone();
    for i in &mut older {
        i.features &= !race_store::rdma::FEATURE_LEASE_END;
    }
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &older).unwrap();
    let before = live(&c);
    let mut cl = Client::open(t, clock.clone(), ClientConfig::default()).unwrap();
    cl.update(&7u32.to_le_bytes(), &[4; 150]).unwrap();
    let r = cl.close();
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.leases_ended, 0);
    assert_eq!(live(&c), before + 1);

    // A node of an older version (no FEATURE_RUNS): allocation still works
    // with coarse blocks, and closing says it could give nothing back.
    let mut old = c.infos.clone();
    for i in &mut old {
        i.features = 0;
    }
    let node = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&node, &old).unwrap();
    let mut cl = Client::open(t, clock, ClientConfig::default()).unwrap();
    cl.update(&7u32.to_le_bytes(), &[4; 150]).unwrap();
    let r = cl.close();
    assert!(
        matches!(
            r.error,
            Some(Error::Transport(TransportError::Unsupported { .. }))
        ),
        "{:?}",
        r.error
    );
    assert!(r.kept_bytes > 0 && r.returned_bytes == 0);
}

/// A client that deletes gives its surplus of free blocks back over
/// messaging while it runs, each message sent ahead and its answer
/// collected by a later write; a give-back the node refuses comes back as
/// `Refused` from the answer.
#[test]
fn a_deleting_client_gives_its_surplus_back_over_messaging_while_it_runs() {
    use race_store::client::FREE_HIGH;
    use race_store::remote::{Transport, TransportError};
    let c = cluster(1, 64 << 20, 14);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let returned =
        |c: &Cluster| -> u64 { c._servers.iter().map(|s| s.stats().pool.returned).sum() };
    let mut cl = client(&c, clock.clone());
    // About 6.5 MiB of blocks of 1,088 B.
    let keys = 6_000u32;
    for i in 0..keys {
        cl.put(&i.to_le_bytes(), &[1; 1000]).unwrap();
    }
    for i in 0..keys {
        cl.delete(&i.to_le_bytes()).unwrap();
    }
    // Past the grace period, writes trim (one message at a time, each
    // collected by a later write).
    std::thread::sleep(Duration::from_micros(ClientConfig::default().grace_ticks) * 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut n = 0u32;
    let held = loop {
        cl.put(b"w", &n.to_le_bytes()).unwrap();
        n += 1;
        let held = cl.stats().kv_memory;
        let done = held.free_bytes <= FREE_HIGH && held.giving_bytes == 0;
        if done || std::time::Instant::now() >= deadline {
            break held;
        }
    };
    assert!(held.free_bytes <= FREE_HIGH, "{held:?} after {n} writes");
    assert!(held.trimmed_bytes > 2 * FREE_HIGH, "{held:?}");
    assert_eq!(returned(&c), held.trimmed_bytes);
    let r = cl.close();
    assert!(r.error.is_none(), "{:?}", r.error);

    // Refused: the same runs given back twice.
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &c.infos).unwrap();
    let runs = t.alloc_blocks(0, 4096, 128).unwrap();
    for second in [false, true] {
        let ask = t
            .return_blocks_ahead(0, 128, &runs, Duration::ZERO)
            .unwrap()
            .unwrap();
        let answer = t.alloc_block_answer(ask, true);
        match second {
            false => assert_eq!(answer.unwrap(), Some(Vec::new())),
            true => assert!(
                matches!(answer, Err(TransportError::Refused { node: 0, .. })),
                "{answer:?}"
            ),
        }
    }
}

/// With `retired_high_bytes = 0` every block a client retires goes to its
/// memory node with the rest of its grace period, and comes back to any
/// client through the node's pool: writers on their own keys and readers
/// of all of them see every value as last written (a block handed out
/// before its grace period ended would be rewritten under a reader).
#[test]
fn retired_blocks_handed_to_the_nodes_come_back_only_after_their_grace() {
    let c = cluster(2, 64 << 20, 14);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let config = ClientConfig {
        retired_high_bytes: 0,
        ..ClientConfig::default()
    };
    let open = |c: &Cluster| {
        let node = Node::builder().join(&c.meta).build().unwrap();
        let t = VqpTransport::connect(&node, &c.infos).unwrap();
        Client::open(t, clock.clone(), config).unwrap()
    };
    let (threads, keys, updates) = (3u64, 200u64, 4_000u64);
    let value = |t: u64, k: u64, n: u64| {
        let mut v = format!("t{t}k{k}n{n}:").into_bytes();
        v.resize(300 + (n % 7) as usize * 100, b'a' + (n % 26) as u8);
        v
    };
    let trimmed: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut cl = open(&c);
                s.spawn(move || {
                    let mut last = vec![0u64; keys as usize];
                    for k in 0..keys {
                        cl.put(format!("t{t}-{k}").as_bytes(), &value(t, k, 0))
                            .unwrap();
                    }
                    let mut x = 0x2545_f491u64 ^ t;
                    for n in 1..=updates {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = x % keys;
                        let key = format!("t{t}-{k}").into_bytes();
                        cl.update(&key, &value(t, k, n)).unwrap();
                        last[k as usize] = n;
                        let r = (x >> 20) % keys;
                        let got = cl.get(format!("t{t}-{r}").as_bytes()).unwrap();
                        assert_eq!(got, Some(value(t, r, last[r as usize])), "t{t} key {r}");
                    }
                    let trimmed = cl.stats().kv_memory.trimmed_bytes;
                    let r = cl.close();
                    assert!(r.error.is_none(), "{:?}", r.error);
                    (last, trimmed)
                })
            })
            .collect();
        let mut trimmed = 0;
        let mut cl = open(&c);
        for (t, h) in handles.into_iter().enumerate() {
            let (last, n) = h.join().unwrap();
            trimmed += n;
            for (k, &v) in last.iter().enumerate() {
                let got = cl.get(format!("t{t}-{k}").as_bytes()).unwrap();
                assert_eq!(got, Some(value(t as u64, k as u64, v)));
            }
        }
        let check = cl.check_table().unwrap();
        assert!(check.problems.is_empty(), "{:#?}", check.problems);
        trimmed
    });
    let reused: u64 = c._servers.iter().map(|s| s.stats().pool.reused).sum();
    assert!(
        trimmed > 0 && reused > 0,
        "trimmed {trimmed}, reused {reused}"
    );
}

/// A served memory node faults its heap in ahead of what it hands out, on
/// its own thread (sim memory is backed lazily: otherwise the first WRITE
/// to each page pays the kernel's zeroing inside a client's operation).
#[test]
fn served_memory_nodes_fault_their_heap_in_ahead_of_the_clients() {
    use race_store::memory::PREFAULT_AHEAD;
    let c = cluster(2, 64 << 20, 12);
    let ahead = |c: &Cluster| -> bool {
        c._servers.iter().all(|s| {
            let st = s.stats();
            st.prefaulted >= (st.heap_used + PREFAULT_AHEAD).min(st.capacity)
        })
    };
    let settle = |c: &Cluster| {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !ahead(c) {
            assert!(std::time::Instant::now() < until, "never caught up");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    settle(&c);
    let heap = |c: &Cluster| -> u64 { c._servers.iter().map(|s| s.stats().heap_used).sum() };
    let before = heap(&c);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let mut cl = client(&c, clock);
    for i in 0..3000u32 {
        cl.put(&i.to_le_bytes(), &[3; 1000]).unwrap();
    }
    let after = heap(&c);
    assert!(after > before + (2 << 20), "new heap: {before} -> {after}");
    settle(&c);
    for i in 0..3000u32 {
        assert_eq!(
            cl.get(&i.to_le_bytes()).unwrap().as_deref(),
            Some(&[3; 1000][..])
        );
    }
}

/// A grant asked ahead waits for nobody: not for the memory node's answer,
/// and not for the Open of the allocation channel either (the node's
/// threads may be asleep after an idle spell). The request goes out once
/// the node answered the Open, and its answer is collected later; one
/// needed before its Open was answered is sent as a plain exchange.
#[test]
fn an_ask_ahead_returns_before_the_memory_node_answers_anything() {
    use race_store::memory::TableConfig;
    use race_store::rdma::MemoryNodeServer;
    use race_store::remote::Transport;
    let meta = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    // The memory node's messaging thread sleeps 1 s once idle, and its
    // serving thread is this test: nobody answers an Open unless the test
    // polls.
    let mut cfg = krcore_kmod::EngineConfig::default();
    cfg.msg.idle_sleep = Duration::from_secs(1);
    let mnode = Node::builder().join(&meta).config(cfg).build().unwrap();
    let table = TableConfig {
        geometry: race_store::layout::subtable::SubtableGeometry::new(1).unwrap(),
        initial_global_depth: 0,
        max_global_depth: 4,
    };
    let mut server = MemoryNodeServer::start(&mnode, 0, 16 << 20, &table, 1).unwrap();
    let granted = || mnode.engine().unwrap().msg_stats().granted;
    let node = Node::builder().join(&meta).build().unwrap();
    let mut t = VqpTransport::connect(&node, &[server.info()]).unwrap();
    let served = |server: &mut MemoryNodeServer<_>, t: &mut VqpTransport<_>, ask| {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            server.poll_once().unwrap();
            if let Some(runs) = t.alloc_block_answer(ask, false).unwrap() {
                return runs;
            }
            assert!(std::time::Instant::now() < until, "never answered");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // Let the node's messaging thread fall asleep.
    std::thread::sleep(Duration::from_millis(300));
    let before = granted();
    let ask = t.alloc_block_ask(0, 8192, 64).unwrap().unwrap();
    assert_eq!(granted(), before, "the ask did not wait for the Open");
    let runs = served(&mut server, &mut t, ask);
    assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), 8192);
    assert_eq!(server.served(), 1);
    // Collected: its channel was closed. Needed at once: the answer waits
    // (the test's thread serves the node meanwhile).
    std::thread::sleep(Duration::from_millis(300));
    let ask = t.alloc_block_ask(0, 4096, 64).unwrap().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let runs = std::thread::scope(|s| {
        let serving = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                server.poll_once().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let runs = t.alloc_block_answer(ask, true);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        serving.join().unwrap();
        runs
    });
    let runs = runs.unwrap().expect("answered");
    assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), 4096);
}

/// An answer that came while its client did not look, for longer than the
/// allocation timeout (a client that asked ahead, then stood idle to the
/// end of a phase and closed), is taken when the client waits for it, not
/// reported as a timeout: before, the wait looked at the clock first and
/// failed at once (a deployed YCSB load's close in the Soft-RoCE guest).
#[test]
fn an_answer_that_came_while_nobody_looked_is_taken_after_the_timeout() {
    let c = cluster(1, 64 << 20, 12);
    let node = Node::builder().join(&c.meta).build().unwrap();
    let mut clients = ask_ahead(&node, &c, 1);
    std::thread::sleep(Duration::from_millis(2_300));
    collect_answers(&mut clients);
}
