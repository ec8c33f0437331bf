//! race-store over KRCore on a faulty NIC: two clients, each on its own
//! compute node whose NIC is a `FaultNic<SimNic>` (delayed and reordered
//! completions, WRs failing with `RETRY_EXC_ERR`/`REM_ACCESS_ERR`, QPs
//! forced to ERR, memory node 1 dropped for a stretch of the script), run
//! a seeded script of insert / update / delete / get on a shared key space
//! over a tiny table (so splits happen), against a reference model; about
//! one step in eight is a batch of 8 to 15 of them (`Client::batch`, its
//! waves run as two groups with two doorbells in flight), each reply
//! checked in submission order as the single operation's would be.
//!
//! The model keeps, per key, the set of states the table may be in: an
//! operation that fails with a typed transient error (`Transport`,
//! `Contention`) may or may not have taken effect, so it widens the set; a
//! successful operation must be consistent with the set and narrows it to
//! one state. Checked:
//! - no corrupted or stale value: every `get` returns a state in the set;
//!   `insert`/`update`/`delete` outcomes (`KeyExists`, `NotFound`) agree;
//! - no lost or duplicated operation: the final table (read by a client
//!   without faults, `check_table`) has no problems, no duplicate key, and
//!   every key in a state of its set;
//! - errors are typed (`Corrupt`, `BadTable`, `Layout` never appear);
//! - nothing hangs: every transport wait is bounded;
//! - a failed operation does not poison its client: the same client (its
//!   transport reconnects a VQP whose target an error completion cleared)
//!   goes on with the script.
//!
//! `KRCORE_FAULT_SEEDS` (default 20) and `KRCORE_FAULT_OPS` (steps per
//! seed, default 120) scale the run. The compute nodes' messaging timeout
//! is 300 ms: a block allocation on the dropped memory node fails after
//! that, not after the default 5 s.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use krcore::Node;
use krcore_kmod::EngineConfig;
use krcore_nic::fault::{FaultConfig, FaultNic};
use krcore_nic::sim::{SimConfig, SimNic};
use race_store::client::{Op, Reply};
use race_store::clock::{Clock, ManualClock};
use race_store::rdma::{NodeInfo, VqpTransport};
use race_store::{Client, ClientConfig, Error};

use common::rdma::{cluster, Cluster};

type Fnic = FaultNic<SimNic>;
type FClient = Client<VqpTransport<Fnic>>;

const KEYS: u64 = 48;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A compute node on a faulty NIC.
fn faulty_node(c: &Cluster, cfg: FaultConfig) -> Node<Fnic> {
    let sim = SimNic::open(c.meta.fabric().unwrap(), SimConfig::default()).unwrap();
    let mut cfg_engine = EngineConfig::default().with_meta(c.meta.meta_location().unwrap());
    // A block allocation on the dropped memory node fails after this
    // instead of the default 5 s (the script makes many).
    cfg_engine.msg.timeout = Duration::from_millis(300);
    Node::with_nic(FaultNic::new(sim, cfg), cfg_engine).unwrap()
}

/// Opens a client on `node`, retrying typed setup failures (bounded).
fn open(node: &Node<Fnic>, infos: &[NodeInfo], clock: &Arc<dyn Clock>) -> FClient {
    let mut last = None;
    for _ in 0..50 {
        match VqpTransport::connect(node, infos) {
            Ok(t) => match Client::open(t, clock.clone(), ClientConfig::default()) {
                Ok(c) => return c,
                Err(e) => last = Some(format!("{e:?}")),
            },
            Err(e) => last = Some(format!("{e:?}")),
        }
    }
    panic!("a client could not be opened in 50 attempts: {last:?}");
}

type State = Option<Vec<u8>>;

/// Per key: the states the table may be in.
#[derive(Default)]
struct Model {
    keys: HashMap<Vec<u8>, Vec<State>>,
}

impl Model {
    fn set(&mut self, k: &[u8]) -> &mut Vec<State> {
        self.keys.entry(k.to_vec()).or_insert_with(|| vec![None])
    }
}

fn transient(e: &Error) -> bool {
    match e {
        Error::Transport(_) | Error::OutcomeUnknown { .. } | Error::Contention { .. } => true,
        other => panic!("untyped or corrupt outcome under faults: {other:?}"),
    }
}

/// Whether a failed write may have applied: `Error::Transport` promises it
/// did not (the model keeps only the old states, so a write that applied
/// anyway is caught by a later get).
fn may_have_applied(e: &Error) -> bool {
    !matches!(e, Error::Transport(_))
}

fn add(set: &mut Vec<State>, s: State) {
    if !set.contains(&s) {
        set.push(s);
    }
}

/// Script operation `op` on (`k`, `v`) as a batch operation.
fn batch_op<'a>(op: u64, k: &'a [u8], v: &'a [u8]) -> Op<'a> {
    match op % 5 {
        0 => Op::Get(k),
        2 => Op::Update(k, v),
        3 => Op::Delete(k),
        _ => Op::Insert(k, v),
    }
}

/// Runs one operation alone, its outcome as a batch reply.
fn run_op(cl: &mut FClient, op: u64, k: &[u8], v: &[u8]) -> Reply {
    match batch_op(op, k, v) {
        Op::Get(k) => cl.get(k),
        Op::Insert(k, v) => cl.insert(k, v).map(|()| None),
        Op::Update(k, v) => cl.update(k, v).map(|()| None),
        Op::Delete(k) => cl.delete(k).map(|()| None),
        Op::Put(k, v) => cl.put(k, v).map(|()| None),
    }
}

/// Runs one operation and checks/updates the model. Returns whether it
/// failed with a (typed, transient) error.
fn step(cl: &mut FClient, m: &mut Model, op: u64, k: &[u8], v: &[u8]) -> bool {
    let reply = run_op(cl, op, k, v);
    check(m, op, k, v, reply)
}

/// Checks `reply`, the outcome of operation `op` on (`k`, `v`), against the
/// model and updates it. Returns whether it failed with a (typed,
/// transient) error.
fn check(m: &mut Model, op: u64, k: &[u8], v: &[u8], reply: Reply) -> bool {
    let set = m.set(k);
    let has_some = set.iter().any(Option::is_some);
    let has_none = set.contains(&None);
    let ctx = |what: &str| format!("{what} {:?}: states {set:?}", String::from_utf8_lossy(k));
    match op % 5 {
        0 => match reply {
            Ok(x) => {
                assert!(
                    set.contains(&x),
                    "{}: get returned {x:?}",
                    ctx("stale/corrupt read")
                );
                *set = vec![x];
            }
            Err(e) => return transient(&e),
        },
        1 => match reply {
            Ok(_) => {
                assert!(has_none, "{}", ctx("insert of a present key succeeded"));
                *set = vec![Some(v.to_vec())];
            }
            Err(Error::KeyExists) => {
                assert!(has_some, "{}", ctx("KeyExists for an absent key"));
                set.retain(Option::is_some);
            }
            Err(e) => {
                if has_none && may_have_applied(&e) {
                    add(set, Some(v.to_vec()));
                }
                return transient(&e);
            }
        },
        2 => match reply {
            Ok(_) => {
                assert!(has_some, "{}", ctx("update of an absent key succeeded"));
                *set = vec![Some(v.to_vec())];
            }
            Err(Error::NotFound) => {
                assert!(has_none, "{}", ctx("NotFound for a present key"));
                *set = vec![None];
            }
            Err(e) => {
                if has_some && may_have_applied(&e) {
                    add(set, Some(v.to_vec()));
                }
                return transient(&e);
            }
        },
        3 => match reply {
            Ok(_) => {
                assert!(has_some, "{}", ctx("delete of an absent key succeeded"));
                *set = vec![None];
            }
            Err(Error::NotFound) => {
                assert!(has_none, "{}", ctx("NotFound for a present key"));
                *set = vec![None];
            }
            Err(e) => {
                if may_have_applied(&e) {
                    add(set, None);
                }
                return transient(&e);
            }
        },
        _ => match reply {
            // A second insert flavour keeps the table growing (splits).
            Ok(_) => {
                assert!(has_none, "{}", ctx("insert of a present key succeeded"));
                *set = vec![Some(v.to_vec())];
            }
            Err(Error::KeyExists) => {
                assert!(has_some, "{}", ctx("KeyExists for an absent key"));
                set.retain(Option::is_some);
            }
            Err(e) => {
                if has_none && may_have_applied(&e) {
                    add(set, Some(v.to_vec()));
                }
                return transient(&e);
            }
        },
    }
    false
}

struct Outcome {
    ok_or_typed: u64,
    failed: u64,
    injected: u64,
    global_depth: u8,
    /// Batches run (each of 8 to 15 operations), and waves of them that
    /// ran as two overlapping groups.
    batches: u64,
    overlapped: u64,
}

fn run_seed(seed: u64) -> Outcome {
    let ops = env("KRCORE_FAULT_OPS", 120);
    let c = cluster(2, 16 << 20, 12);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1, 1_000));
    let cfg = |i: u64| FaultConfig {
        fail_ppm: 15_000,
        force_err_ppm: 5_000,
        ..FaultConfig::chaos(seed * 2 + i, 6)
    };
    let nodes = [faulty_node(&c, cfg(0)), faulty_node(&c, cfg(1))];
    let mut clients: Vec<FClient> = nodes.iter().map(|n| open(n, &c.infos, &clock)).collect();
    let mut m = Model::default();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut failed = 0;
    let mut batches = 0;
    let drop_window = (seed % 2 == 0).then_some((ops / 3, ops / 2));
    for i in 0..ops {
        if let Some((from, to)) = drop_window {
            for n in &nodes {
                if i == from {
                    n.engine().unwrap().nic().drop_node(c.infos[1].gid);
                }
                if i == to {
                    n.engine().unwrap().nic().restore_node(c.infos[1].gid);
                }
            }
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let who = (x >> 40) as usize % 2;
        let dropped = drop_window.is_some_and(|(from, to)| (from..to).contains(&i));
        if (x >> 30) % 8 == 0 && !dropped {
            // A batch of 8 to 15 operations from the script: waves of 8 or
            // more run as two groups with their doorbells in flight
            // together (over completions the NIC delays and reorders, WRs
            // it fails and QPs it forces to ERR). Not while memory node 1
            // is dropped: each of a batch's block allocations on it would
            // wait out its messaging timeout (5 s).
            let n = 8 + (x >> 33) % 8;
            let items: Vec<(u64, Vec<u8>, Vec<u8>)> = (0..n)
                .map(|j| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = format!("k{}", (x >> 8) % KEYS).into_bytes();
                    let val =
                        format!("s{seed}-op{i}.{j}-{}", "b".repeat((x % 40) as usize)).into_bytes();
                    (x >> 20, key, val)
                })
                .collect();
            let ops: Vec<Op<'_>> = items.iter().map(|(op, k, v)| batch_op(*op, k, v)).collect();
            let replies = clients[who].batch(&ops);
            assert_eq!(replies.len(), ops.len());
            for ((op, k, v), reply) in items.iter().zip(replies) {
                if check(&mut m, *op, k, v, reply) {
                    failed += 1;
                }
            }
            batches += 1;
            continue;
        }
        let key = format!("k{}", (x >> 8) % KEYS).into_bytes();
        let val = format!("s{seed}-op{i}-{}", "v".repeat((x % 40) as usize)).into_bytes();
        if step(&mut clients[who], &mut m, x >> 20, &key, &val) {
            failed += 1;
        }
    }
    let overlapped: u64 = clients.iter().map(|c| c.stats().overlapped_waves).sum();
    for n in &nodes {
        n.engine().unwrap().nic().restore_node(c.infos[1].gid);
    }
    // A client without faults reads back the whole table.
    let plain = Node::builder().join(&c.meta).build().unwrap();
    let t = VqpTransport::connect(&plain, &c.infos).unwrap();
    let mut checker = Client::open(t, clock.clone(), ClientConfig::default()).unwrap();
    let report = checker.check_table().unwrap();
    assert!(
        report.problems.is_empty(),
        "seed {seed}: {:?}",
        report.problems
    );
    assert_eq!(report.duplicates, 0, "seed {seed}: duplicate keys visible");
    let present: HashMap<_, _> = report.pairs.into_iter().collect();
    for (k, set) in &m.keys {
        let s = present.get(k).cloned();
        assert!(
            set.contains(&s),
            "seed {seed}: key {:?} is {s:?}, model allows {set:?}",
            String::from_utf8_lossy(k)
        );
    }
    for k in present.keys() {
        assert!(
            m.keys.contains_key(k),
            "seed {seed}: key {k:?} never written"
        );
    }
    let injected = nodes
        .iter()
        .map(|n| {
            let s = n.engine().unwrap().nic().stats();
            s.failed_wrs + s.forced_errs + s.dropped_wrs
        })
        .sum();
    Outcome {
        ok_or_typed: ops,
        failed,
        injected,
        global_depth: report.global_depth,
        batches,
        overlapped,
    }
}

#[test]
fn race_store_over_a_faulty_nic_stays_correct() {
    let seeds = env("KRCORE_FAULT_SEEDS", 20);
    let outs: Vec<Outcome> = (0..seeds).map(run_seed).collect();
    let ops: u64 = outs.iter().map(|o| o.ok_or_typed).sum();
    let failed: u64 = outs.iter().map(|o| o.failed).sum();
    let injected: u64 = outs.iter().map(|o| o.injected).sum();
    let split = outs.iter().filter(|o| o.global_depth > 0).count();
    let batches: u64 = outs.iter().map(|o| o.batches).sum();
    let overlapped: u64 = outs.iter().map(|o| o.overlapped).sum();
    eprintln!(
        "{seeds} seeds: {ops} script steps checked ({batches} of them batches), \
         {injected} faults injected, {failed} failed operations survived by their client, \
         {split} seeds with splits, {overlapped} waves overlapped"
    );
    assert!(injected > 0 && failed > 0 && split > 0);
    assert!(
        batches > 0 && overlapped > 0,
        "{batches} batches, {overlapped} overlapped"
    );
}
