//! One client thread of a phase with `--batch B`: it draws up to B
//! requests, runs them as one [`KvClient::batch`] and records each
//! operation with the batch's latency (submission to completion, what a
//! caller of the batch waits).
//!
//! A read-modify-write is a read and an update of its key in the same
//! batch (the store runs them in that order); YCSB's three figures are
//! recorded for it, all three with the batch's latency. The store's
//! restarted attempts of a batch go to `[UPDATE], Retries` when the batch
//! has an update, else to `[INSERT], Retries` when it has an insert.

use super::phase::{count_retries, status_of, Pacer, RunOptions, COUNT_EVERY};
use super::verify::{fill_value, version_tag, WriteRecord};
use super::{BackendError, BatchOp, Found, KvClient};
use crate::ycsb::{KeySpace, Measurements, Operation, OperationGenerator, Status, Workload};
use rand::rngs::SmallRng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a batched thread needs besides its client.
pub(crate) struct BatchedThread<'a> {
    pub(crate) workload: &'a Workload,
    pub(crate) keys: &'a KeySpace,
    pub(crate) opts: &'a RunOptions,
    pub(crate) pacer: Pacer,
    pub(crate) done: &'a AtomicU64,
    pub(crate) batch: usize,
}

/// One drawn request of a batch, with what its write writes.
struct Drawn {
    op: Operation,
    keynum: u64,
    key: String,
    version: u64,
    value: Vec<u8>,
}

impl Default for Drawn {
    fn default() -> Drawn {
        Drawn {
            op: Operation::Read,
            keynum: 0,
            key: String::new(),
            version: 0,
            value: Vec::new(),
        }
    }
}

impl BatchedThread<'_> {
    /// The run phase's `share` operations; returns the measurements and the
    /// logged writes (when `log`).
    pub(crate) fn run(
        &self,
        client: &mut dyn KvClient,
        gen: &mut OperationGenerator,
        rng: &mut SmallRng,
        share: u64,
        writer: u64,
        log: bool,
    ) -> (Measurements, Vec<WriteRecord>) {
        let mut m = Measurements::new();
        let mut writes = Vec::new();
        let value_len = self.workload.value_size() as usize;
        let mut drawn: Vec<Drawn> = Vec::with_capacity(self.batch);
        let mut replies = Vec::with_capacity(2 * self.batch);
        let mut i = 0u64;
        let mut counted = 0u64;
        while i < share && !self.opts.stopped() {
            self.pacer.wait(i);
            let n = (share - i).min(self.batch as u64);
            // The entries (and their value buffers) are reused batch to batch.
            drawn.resize_with(n as usize, Drawn::default);
            for (j, d) in drawn.iter_mut().enumerate() {
                let req = gen.next_request(rng, self.keys);
                d.version = match req.op {
                    Operation::Update | Operation::ReadModifyWrite => {
                        version_tag(writer, i + j as u64)
                    }
                    _ => 0,
                };
                d.value.clear();
                if req.op != Operation::Read {
                    fill_value(&mut d.value, value_len, req.keynum, d.version);
                }
                (d.op, d.keynum) = (req.op, req.keynum);
                self.workload.write_key_name(req.keynum, &mut d.key);
            }
            let ops = batch_ops(&drawn);
            let t0 = Instant::now();
            let before = client.retries();
            client.batch(&ops, &mut replies);
            let took = t0.elapsed();
            let after = client.retries();
            let mut replies = replies.drain(..);
            let mut next = || replies.next().unwrap_or(Err(missing_reply()));
            for d in &drawn {
                match d.op {
                    Operation::Read => {
                        let r = status_of(next());
                        m.record(Operation::Read, r, took);
                        self.opts.note(r);
                    }
                    Operation::Update => {
                        let r = status_of(next());
                        m.record(Operation::Update, r, took);
                        self.opts.note(r);
                        if log {
                            writes.push(WriteRecord::new(d.keynum, d.version, t0, r));
                        }
                    }
                    Operation::Insert => {
                        let r = status_of(next());
                        m.record(Operation::Insert, r, took);
                        self.opts.note(r);
                        if log {
                            writes.push(WriteRecord::new(d.keynum, 0, t0, r));
                        }
                        self.keys.acknowledge_insert(d.keynum);
                    }
                    Operation::ReadModifyWrite => {
                        let rs = status_of(next());
                        m.record(Operation::Read, rs, took);
                        let ws = status_of(next());
                        m.record(Operation::Update, ws, took);
                        if log {
                            writes.push(WriteRecord::new(d.keynum, d.version, t0, ws));
                        }
                        let whole = if rs.is_ok() && ws.is_ok() {
                            Status::Ok
                        } else {
                            Status::Error
                        };
                        m.record(Operation::ReadModifyWrite, whole, took);
                        self.opts.note(whole);
                    }
                    Operation::Scan => m.record(Operation::Scan, Status::Error, took),
                }
            }
            let kind = retries_go_to(&drawn);
            if let Some(op) = kind {
                count_retries(&mut m, op, before, after);
            }
            i += n;
            while i - counted >= COUNT_EVERY {
                self.done.fetch_add(COUNT_EVERY, Ordering::Relaxed);
                counted += COUNT_EVERY;
            }
        }
        self.done.fetch_add(i - counted, Ordering::Relaxed);
        (m, writes)
    }

    /// The load phase's inserts, `batch` keys at a time.
    pub(crate) fn load(&self, client: &mut dyn KvClient) -> (Measurements, u64) {
        let mut m = Measurements::new();
        let value_len = self.workload.value_size() as usize;
        let mut drawn: Vec<Drawn> = Vec::with_capacity(self.batch);
        let mut replies = Vec::with_capacity(self.batch);
        let (mut n, mut counted) = (0u64, 0u64);
        while !self.opts.stopped() {
            self.pacer.wait(n);
            // The entries (and their value buffers) are reused batch to batch.
            drawn.resize_with(self.batch, Drawn::default);
            let mut got = 0;
            for d in drawn.iter_mut() {
                let Some(k) = self.keys.next_load_key() else {
                    break;
                };
                fill_value(&mut d.value, value_len, k, 0);
                (d.op, d.keynum, d.version) = (Operation::Insert, k, 0);
                self.workload.write_key_name(k, &mut d.key);
                got += 1;
            }
            drawn.truncate(got);
            if drawn.is_empty() {
                break;
            }
            let ops = batch_ops(&drawn);
            let t0 = Instant::now();
            let before = client.retries();
            client.batch(&ops, &mut replies);
            let took = t0.elapsed();
            count_retries(&mut m, Operation::Insert, before, client.retries());
            let mut replies = replies.drain(..);
            for _ in &drawn {
                let r = status_of(replies.next().unwrap_or(Err(missing_reply())));
                m.record(Operation::Insert, r, took);
                self.opts.note(r);
            }
            n += drawn.len() as u64;
            while n - counted >= COUNT_EVERY {
                self.done.fetch_add(COUNT_EVERY, Ordering::Relaxed);
                counted += COUNT_EVERY;
            }
        }
        self.done.fetch_add(n - counted, Ordering::Relaxed);
        (m, n)
    }
}

/// The backend's operations of a batch of drawn requests (a
/// read-modify-write is a read then an update of its key).
fn batch_ops(drawn: &[Drawn]) -> Vec<BatchOp<'_>> {
    let mut ops = Vec::with_capacity(drawn.len() + 4);
    for d in drawn {
        let (k, v) = (d.key.as_bytes(), d.value.as_slice());
        match d.op {
            Operation::Read | Operation::Scan => ops.push(BatchOp::Read(k)),
            Operation::Update => ops.push(BatchOp::Update(k, v)),
            Operation::Insert => ops.push(BatchOp::Insert(k, v)),
            Operation::ReadModifyWrite => {
                ops.push(BatchOp::Read(k));
                ops.push(BatchOp::Update(k, v));
            }
        }
    }
    ops
}

/// Which write type a batch's retries are counted on.
fn retries_go_to(drawn: &[Drawn]) -> Option<Operation> {
    let has = |op: Operation| drawn.iter().any(|d| d.op == op);
    if has(Operation::Update) || has(Operation::ReadModifyWrite) {
        Some(Operation::Update)
    } else if has(Operation::Insert) {
        Some(Operation::Insert)
    } else {
        None
    }
}

fn missing_reply() -> BackendError {
    BackendError::Store {
        backend: "driver",
        message: "the backend returned fewer replies than the batch has operations".into(),
    }
}

/// The default [`KvClient::batch`]: one operation after the other.
pub(crate) fn one_by_one<C: KvClient + ?Sized>(
    client: &mut C,
    ops: &[BatchOp<'_>],
    out: &mut Vec<Result<Found, BackendError>>,
) {
    out.clear();
    let mut buf = Vec::new();
    for op in ops {
        out.push(match *op {
            BatchOp::Read(k) => client.read(k, &mut buf),
            BatchOp::Insert(k, v) => client.insert(k, v).map(|()| Found::Yes),
            BatchOp::Update(k, v) => client.update(k, v),
        });
    }
}
