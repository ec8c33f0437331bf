//! race-store with client PROCESSES on a `/dev/shm` sim fabric: the test
//! binary re-executes itself (`child_entry`, role in `RACE_MP_ROLE`) as
//! client processes that open the fabric directory, find the meta server and
//! the memory nodes by their published records, and run against the table
//! that this (parent) process hosts. Node 0 holds a tiny table (one bucket
//! group per subtable, global depth 0), so subtable splits and directory
//! doublings happen while the processes load it.
//!
//! * `processes_model_check_with_splits`: random get / insert / put / update
//!   / delete / rmw, and batches of them (`Client::batch`), from several
//!   processes. Each process checks its own key
//!   range exactly against a `HashMap` and reports it in a file; shared keys
//!   get values `p<proc>:<seq>` that must be linearizable-plausible (a
//!   process never reads back an older own write, nor an older write of
//!   another process after a newer one); a shared counter is incremented by
//!   `rmw` and must end exactly at the number of increments. The parent then
//!   checks the whole table (`check_table`) against the union of the reports.
//! * `sigkill_mid_insert_leaves_a_usable_table`: a process inserting keys is
//!   killed with SIGKILL (once at a random point of its inserts, once while
//!   it holds the resize lock in the middle of a split); the parent then
//!   reads every acknowledged key, inserts and updates, lets splits proceed
//!   (after the dead client's lease expires) and checks the table.
//!
//! `RACE_MP_OPS` scales the operations per process (default 600).

use krcore::{MetaLocation, Node};
use krcore_nic::sim::SimFabric;
use race_store::client::Op;
use race_store::clock::{Clock, WallClock};
use race_store::layout::dir_header::DirHeader;
use race_store::layout::slot::RemotePtr;
use race_store::layout::subtable::SubtableGeometry;
use race_store::layout::table::DIR_PTR;
use race_store::memory::TableConfig;
use race_store::rdma::{lookup_nodes_on_sim, MemoryNodeHandle, MemoryNodeServer, VqpTransport};
use race_store::remote::{OpResult, RemoteOp, Transport, TransportError};
use race_store::{Client, ClientConfig, Error};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROLE: &str = "RACE_MP_ROLE";
const META_NAME: &str = "race-mp-meta";
const NODES: u8 = 2;
const SHARED_KEYS: u64 = 8;
const COUNTER: &[u8] = b"shared-counter";

fn ops_per_process() -> u64 {
    std::env::var("RACE_MP_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600)
}

fn scratch_dir() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("race-mp-")
            .tempdir_in("/dev/shm")
            .unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// The parent's cluster: the fabric, the meta server, the memory nodes.
struct Cluster {
    fabric: SimFabric,
    _meta: Node,
    _servers: Vec<MemoryNodeHandle>,
}

fn cluster(fabric_dir: &Path) -> Cluster {
    let fabric = SimFabric::open_dir(fabric_dir, true).unwrap();
    let meta = Node::builder()
        .sim_fabric(&fabric)
        .host_meta()
        .build()
        .unwrap();
    let bootstrap = meta.meta_server().unwrap().bootstrap();
    krcore_meta::bootstrap::publish_on_sim(&fabric, META_NAME, &bootstrap).unwrap();
    let table = TableConfig {
        geometry: SubtableGeometry::new(1).unwrap(),
        initial_global_depth: 0,
        max_global_depth: 12,
    };
    let mut servers = Vec::new();
    for id in 0..NODES {
        let node = Node::builder().join(&meta).build().unwrap();
        let s = MemoryNodeServer::start(&node, id, 64 << 20, &table, NODES).unwrap();
        s.publish_on_sim(&fabric).unwrap();
        servers.push(s.spawn(Duration::from_micros(50)));
    }
    Cluster {
        fabric,
        _meta: meta,
        _servers: servers,
    }
}

/// A client on its own compute node of `fabric`, found through the
/// published records only (as a separate process does it).
fn client_on(fabric: &SimFabric) -> Client<VqpTransport<krcore_nic::AnyNic>> {
    let clock: Arc<dyn Clock> = Arc::new(WallClock);
    Client::open(reopen_transport(fabric), clock, ClientConfig::default()).unwrap()
}

fn spawn_child(role: &str, envs: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("child needs {k}"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `p<proc>:<seq>` -> (proc, seq).
fn parse_shared(v: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(v).unwrap_or_else(|_| panic!("shared value {v:?} not text"));
    let (p, q) = s
        .strip_prefix('p')
        .and_then(|r| r.split_once(':'))
        .unwrap_or_else(|| panic!("shared value {s:?} was never written"));
    (p.parse().unwrap(), q.parse().unwrap())
}

/// A batch of 2 to 8 operations on own keys (`Client::batch`, repeated
/// keys included), each reply checked against the reference in submission
/// order.
fn batch_on_own_keys(
    c: &mut Client<VqpTransport<krcore_nic::AnyNic>>,
    reference: &mut HashMap<Vec<u8>, Vec<u8>>,
    me: u64,
    i: u64,
    rng: &mut Rng,
) {
    let n = 2 + rng.next() % 7;
    let items: Vec<(u64, Vec<u8>, Vec<u8>)> = (0..n)
        .map(|j| {
            let y = rng.next();
            let key = format!("p{me}-k{}", (y >> 8) % 150).into_bytes();
            (y % 5, key, format!("b{i}-{j}").into_bytes())
        })
        .collect();
    let ops: Vec<Op<'_>> = items
        .iter()
        .map(|(kind, k, v)| match kind {
            0 => Op::Get(k),
            1 => Op::Insert(k, v),
            2 => Op::Put(k, v),
            3 => Op::Update(k, v),
            _ => Op::Delete(k),
        })
        .collect();
    for (op, reply) in ops.iter().zip(c.batch(&ops)) {
        let key = op.key().to_vec();
        let present = reference.contains_key(&key);
        let want = match *op {
            Op::Get(_) => Ok(reference.get(&key).cloned()),
            Op::Insert(..) if present => Err(Error::KeyExists),
            Op::Update(..) | Op::Delete(_) if !present => Err(Error::NotFound),
            Op::Insert(_, v) | Op::Put(_, v) | Op::Update(_, v) => {
                reference.insert(key, v.to_vec());
                Ok(None)
            }
            Op::Delete(_) => {
                reference.remove(&key);
                Ok(None)
            }
        };
        assert_eq!(reply, want, "batch {i}: {op:?}");
    }
}

/// Child role "model": see the module docs.
fn child_model() {
    let fabric = SimFabric::open_dir(env("MP_FABRIC"), false).unwrap();
    let me: u64 = env("MP_PROC").parse().unwrap();
    let ops: u64 = env("MP_OPS").parse().unwrap();
    let mut c = client_on(&fabric);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (me + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let mut reference: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    // Shared keys: our last own write per key (None = our delete), and per
    // (key, writer) the newest sequence number we have read.
    let mut own_last: HashMap<u64, Option<u64>> = HashMap::new();
    let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
    let mut increments = 0u64;
    for i in 0..ops {
        let x = rng.next();
        match x % 10 {
            0..=5 => {
                // Own key range: exact reference.
                let key = format!("p{me}-k{}", (x >> 8) % 150).into_bytes();
                let val = format!("v{i}-{}", "x".repeat(((x >> 20) % 80) as usize)).into_bytes();
                match (x >> 4) % 7 {
                    0 => assert_eq!(c.get(&key).unwrap(), reference.get(&key).cloned()),
                    6 => batch_on_own_keys(&mut c, &mut reference, me, i, &mut rng),
                    1 => match c.insert(&key, &val) {
                        Ok(()) => assert!(reference.insert(key, val).is_none()),
                        Err(Error::KeyExists) => assert!(reference.contains_key(&key)),
                        Err(e) => panic!("insert: {e}"),
                    },
                    2 => {
                        c.put(&key, &val).unwrap();
                        reference.insert(key, val);
                    }
                    3 => match c.update(&key, &val) {
                        Ok(()) => assert!(reference.insert(key, val).is_some()),
                        Err(Error::NotFound) => assert!(!reference.contains_key(&key)),
                        Err(e) => panic!("update: {e}"),
                    },
                    4 => match c.delete(&key) {
                        Ok(()) => assert!(reference.remove(&key).is_some()),
                        Err(Error::NotFound) => assert!(!reference.contains_key(&key)),
                        Err(e) => panic!("delete: {e}"),
                    },
                    _ => {
                        let before = reference.get(&key).cloned();
                        let got = c
                            .rmw(&key, |cur| {
                                assert_eq!(cur.map(<[u8]>::to_vec), before);
                                let mut v = cur.map_or_else(Vec::new, <[u8]>::to_vec);
                                v.push(b'+');
                                Some(v)
                            })
                            .unwrap();
                        let mut want = before.unwrap_or_default();
                        want.push(b'+');
                        assert_eq!(got.as_deref(), Some(&want[..]));
                        reference.insert(key, want);
                    }
                }
            }
            6..=8 => {
                // Shared keys: writes of all processes race.
                let k = (x >> 8) % SHARED_KEYS;
                let key = format!("shared-{k}").into_bytes();
                match (x >> 4) % 4 {
                    0 | 1 => {
                        c.put(&key, format!("p{me}:{i}").as_bytes()).unwrap();
                        own_last.insert(k, Some(i));
                    }
                    2 => {
                        match c.delete(&key) {
                            Ok(()) | Err(Error::NotFound) => {}
                            Err(e) => panic!("delete shared: {e}"),
                        }
                        own_last.insert(k, None);
                    }
                    _ => {
                        if let Some(v) = c.get(&key).unwrap() {
                            let (p, seq) = parse_shared(&v);
                            if p == me {
                                // Our own value: only our latest write can be
                                // read back after it completed.
                                assert_eq!(own_last.get(&k).copied().flatten(), Some(seq));
                            }
                            let last = seen.entry((k, p)).or_insert(0);
                            assert!(seq >= *last, "key {k}: p{p} went back from {last} to {seq}");
                            *last = seq;
                        }
                    }
                }
            }
            _ => {
                c.rmw(COUNTER, |cur| {
                    let n = cur.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
                    Some((n + 1).to_le_bytes().to_vec())
                })
                .unwrap();
                increments += 1;
            }
        }
    }
    // Final exact check of the own range, then the report.
    for (k, v) in &reference {
        assert_eq!(c.get(k).unwrap().as_ref(), Some(v));
    }
    let s = c.stats();
    let mut f = std::fs::File::create(env("MP_REPORT")).unwrap();
    writeln!(f, "increments {increments}").unwrap();
    writeln!(f, "splits {}", s.splits).unwrap();
    writeln!(f, "doublings {}", s.doublings).unwrap();
    for (k, v) in &reference {
        writeln!(f, "kv {} {}", hex(k), hex(v)).unwrap();
    }
    f.sync_all().unwrap();
}

#[derive(Default)]
struct Report {
    increments: u64,
    splits: u64,
    doublings: u64,
    pairs: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn read_report(path: &Path) -> Report {
    let text = std::fs::read_to_string(path).unwrap();
    let mut r = Report::default();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["increments", n] => r.increments = n.parse().unwrap(),
            ["splits", n] => r.splits = n.parse().unwrap(),
            ["doublings", n] => r.doublings = n.parse().unwrap(),
            ["kv", k, v] => {
                r.pairs.insert(unhex(k), unhex(v));
            }
            _ => panic!("bad report line {line:?}"),
        }
    }
    r
}

fn wait_ok(mut child: Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{what} failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn processes_model_check_with_splits() {
    let dir = scratch_dir();
    let fabric_dir = dir.path().join("fabric");
    let c = cluster(&fabric_dir);
    let procs = 3u64;
    let ops = ops_per_process();
    let reports: Vec<PathBuf> = (0..procs)
        .map(|p| dir.path().join(format!("report-{p}")))
        .collect();
    let children: Vec<Child> = (0..procs)
        .map(|p| {
            spawn_child(
                "model",
                &[
                    ("MP_FABRIC", fabric_dir.display().to_string()),
                    ("MP_PROC", p.to_string()),
                    ("MP_OPS", ops.to_string()),
                    ("MP_REPORT", reports[p as usize].display().to_string()),
                ],
            )
        })
        .collect();
    for (p, child) in children.into_iter().enumerate() {
        wait_ok(child, &format!("client process {p}"));
    }
    let reports: Vec<Report> = reports.iter().map(|p| read_report(p)).collect();

    let mut parent = client_on(&c.fabric);
    let check = parent.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert!(!check.locked && !check.split_logged);
    // The table grew while the processes ran.
    assert!(
        check.global_depth >= 2,
        "global depth {}",
        check.global_depth
    );
    assert!(reports.iter().map(|r| r.splits).sum::<u64>() >= 3);
    assert!(reports.iter().map(|r| r.doublings).sum::<u64>() >= 1);
    // Exact: the table holds the union of the private ranges, the shared
    // keys (values someone wrote) and the counter.
    let increments: u64 = reports.iter().map(|r| r.increments).sum();
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for r in &reports {
        expected.extend(r.pairs.clone());
    }
    let mut shared = 0;
    for (k, v) in &check.pairs {
        if k.as_slice() == COUNTER {
            assert_eq!(u64::from_le_bytes(v[..].try_into().unwrap()), increments);
        } else if k.starts_with(b"shared-") {
            let (p, _) = parse_shared(v);
            assert!(p < procs);
            shared += 1;
        } else {
            assert_eq!(expected.remove(k).as_ref(), Some(v), "key {k:?}");
        }
    }
    assert!(expected.is_empty(), "missing keys: {}", expected.len());
    assert!(shared <= SHARED_KEYS);
    assert_eq!(
        parent.get(COUNTER).unwrap().is_some(),
        increments > 0,
        "counter presence"
    );
}

/// Child role "inserter": inserts `k<i>` = `v<i>` for i = 0, 1, ... and
/// appends `i` to the ack file after each insert returned. With
/// `MP_HANG_LOCKED=1` its transport stops forever (writing `MP_LOCKED`)
/// right after a CAS that took the resize lock: the parent kills it there.
fn child_inserter() {
    let fabric = SimFabric::open_dir(env("MP_FABRIC"), false).unwrap();
    let hang = env("MP_HANG_LOCKED") == "1";
    let transport = HangOnLock {
        inner: reopen_transport(&fabric),
        hang,
        marker: PathBuf::from(env("MP_LOCKED")),
    };
    let clock: Arc<dyn Clock> = Arc::new(WallClock);
    let mut c = Client::open(transport, clock, ClientConfig::default()).unwrap();
    let mut acks = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(env("MP_ACKS"))
        .unwrap();
    for i in 0u64.. {
        let key = format!("k{i}");
        c.insert(key.as_bytes(), format!("v{i}").as_bytes())
            .unwrap();
        acks.write_all(format!("{i}\n").as_bytes()).unwrap();
    }
}

/// A transport on a new compute node of `fabric`.
fn reopen_transport(fabric: &SimFabric) -> VqpTransport<krcore_nic::AnyNic> {
    let b = krcore_meta::bootstrap::lookup_on_sim(fabric, META_NAME).unwrap();
    let node = Node::builder()
        .sim_fabric(fabric)
        .meta(MetaLocation::from_bootstrap(&b).unwrap())
        .build()
        .unwrap();
    let infos = lookup_nodes_on_sim(fabric, NODES).unwrap();
    VqpTransport::connect(&node, &infos).unwrap()
}

/// A transport that, when `hang` is set, never returns from the doorbell
/// whose CAS took the resize lock (the directory header word): the client
/// holds the lock, its split half done, until it is killed.
struct HangOnLock<T> {
    inner: T,
    hang: bool,
    marker: PathBuf,
}

impl<T: Transport> Transport for HangOnLock<T> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let res = self.inner.execute(batch)?;
        if self.hang {
            for (op, r) in batch.iter().zip(&res) {
                if let (RemoteOp::Cas { ptr, expect, new }, OpResult::Cas { old }) = (op, r) {
                    if *ptr == DIR_PTR && *old == *expect && DirHeader::from_raw(*new).is_locked() {
                        std::fs::write(&self.marker, b"locked").unwrap();
                        loop {
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                }
            }
        }
        Ok(res)
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.inner.alloc_block(node, size)
    }

    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

fn acked(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // A line without its newline was being written at the kill: not acked.
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    complete.lines().map(|l| l.parse().unwrap()).collect()
}

/// Waits until `cond` holds while `child` runs (a child that exits first
/// failed).
fn wait_for(child: &mut Child, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !cond() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child exited ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill_and_recover(hang_locked: bool) {
    let dir = scratch_dir();
    let fabric_dir = dir.path().join("fabric");
    let c = cluster(&fabric_dir);
    let acks_path = dir.path().join("acks");
    let marker = dir.path().join("locked");
    let mut child = spawn_child(
        "inserter",
        &[
            ("MP_FABRIC", fabric_dir.display().to_string()),
            ("MP_ACKS", acks_path.display().to_string()),
            ("MP_LOCKED", marker.display().to_string()),
            (
                "MP_HANG_LOCKED",
                if hang_locked { "1" } else { "0" }.to_string(),
            ),
        ],
    );
    if hang_locked {
        wait_for(&mut child, "the child to hold the resize lock", || {
            marker.exists()
        });
    } else {
        // A pseudo-random point in the inserts (splits are frequent on the
        // tiny table: some kills land in one).
        let target = 150 + (std::process::id() as usize % 200);
        wait_for(&mut child, "acknowledged inserts", || {
            acked(&acks_path).len() >= target
        });
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let acks = acked(&acks_path);
    assert!(!acks.is_empty());

    let mut parent = client_on(&c.fabric);
    if hang_locked {
        let check = parent.check_table().unwrap();
        assert!(check.locked, "the dead child held the resize lock");
    }
    // Every acknowledged key is readable with its value, while the dead
    // client's lock may still be leased.
    for &i in &acks {
        assert_eq!(
            parent.get(format!("k{i}").as_bytes()).unwrap(),
            Some(format!("v{i}").into_bytes()),
            "acknowledged key k{i}"
        );
    }
    // New inserts (enough to need more splits, which wait for the lease to
    // expire and take the abandoned split over), updates and deletes work.
    let last = *acks.iter().max().unwrap();
    let fresh: Vec<u64> = (last + 2..last + 2 + 400).collect();
    for &i in &fresh {
        parent
            .insert(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .unwrap();
    }
    for &i in acks.iter().take(50) {
        parent
            .update(format!("k{i}").as_bytes(), format!("u{i}").as_bytes())
            .unwrap();
    }
    // The key the child may have been inserting at the kill: either state,
    // but it must be consistent (present exactly once or absent).
    let maybe = format!("k{}", last + 1).into_bytes();
    let maybe_present = parent.get(&maybe).unwrap().is_some();
    let check = parent.check_table().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
    assert_eq!(check.duplicates, 0);
    assert!(!check.locked && !check.split_logged);
    let pairs: HashMap<Vec<u8>, Vec<u8>> = check.pairs.into_iter().collect();
    let updated: std::collections::HashSet<u64> = acks.iter().take(50).copied().collect();
    for &i in acks.iter().chain(&fresh) {
        let want = if updated.contains(&i) { "u" } else { "v" };
        assert_eq!(
            pairs.get(format!("k{i}").as_bytes()),
            Some(&format!("{want}{i}").into_bytes())
        );
    }
    assert_eq!(
        pairs.len(),
        acks.len() + fresh.len() + usize::from(maybe_present)
    );
    let s = parent.stats();
    assert!(s.splits >= 1, "splits proceeded after the kill");
    if hang_locked {
        assert!(s.takeovers >= 1, "the expired lease was broken");
    }
}

#[test]
fn sigkill_mid_insert_leaves_a_usable_table() {
    kill_and_recover(false);
}

#[test]
fn sigkill_holding_the_resize_lock_mid_split() {
    kill_and_recover(true);
}

/// The entry point of child processes (a no-op in a normal test run).
#[test]
fn child_entry() {
    match std::env::var(ROLE).as_deref() {
        Ok("model") => child_model(),
        Ok("inserter") => child_inserter(),
        _ => {}
    }
}
