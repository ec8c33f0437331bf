//! The load and run phases: client threads, each with its own client,
//! generator, RNG and measurements, merged at the end.

use super::batched::BatchedThread;
use super::phase::{count_retries, status_of, take_first_error, Pacer, COUNT_EVERY};
pub use super::phase::{Gate, RunOptions};
use super::verify::{fill_value, version_tag, WriteRecord};
use super::{Backend, BackendError, Closed, Found, KvClient};
use crate::ycsb::{
    KeySpace, Measurements, Operation, OperationGenerator, Report, Status, Workload, YcsbError,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `t` as YCSB's status lines print it: `YYYY-MM-DD HH:MM:SS:mmm` (UTC).
pub fn ycsb_timestamp(t: std::time::SystemTime) -> String {
    let d = t
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}:{:03}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// One status line (YCSB's `-s` format, without the per-operation
/// brackets): `done` operations of `total` after `elapsed`, `current`
/// ops/s over the last interval.
pub fn status_line(elapsed: Duration, done: u64, total: u64, current: f64) -> String {
    let secs = elapsed.as_secs();
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let eta = if done >= total || rate <= 0.0 {
        String::new()
    } else {
        format!(
            "; est completion in {} seconds",
            ((total - done) as f64 / rate).ceil() as u64
        )
    };
    format!(
        "{} {secs} sec: {done} operations; {current:.1} current ops/sec{eta}",
        ycsb_timestamp(std::time::SystemTime::now())
    )
}

impl RunOptions {
    fn pass_gate(&self) -> Result<(), PhaseError> {
        match &self.gate {
            Some(g) => (g.0)().map_err(PhaseError::Gate),
            None => Ok(()),
        }
    }
}

/// The outcome of one phase.
#[derive(Debug)]
pub struct PhaseResult {
    /// YCSB-format report (labelled when the backend says so).
    pub report: Report,
    /// The merged measurements.
    pub measurements: Measurements,
    /// Wall-clock time of the phase.
    pub runtime: Duration,
    /// Operations attempted.
    pub operations: u64,
    /// Operations that returned an error.
    pub errors: u64,
    /// The first error a client thread saw, for the operator.
    pub first_error: Option<String>,
    /// The run phase's writes, when [`RunOptions::log_writes`] asked.
    pub writes: Vec<WriteRecord>,
    /// What the clients gave back when they closed.
    pub closed: Closed,
}

/// Why a phase could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PhaseError {
    /// The backend failed to give a client.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The workload is not runnable.
    #[error(transparent)]
    Workload(#[from] YcsbError),
    /// A client thread panicked.
    #[error("client thread {0} panicked")]
    Panicked(usize),
    /// The start barrier ([`RunOptions::gate`]) failed.
    #[error("start barrier: {0}")]
    Gate(String),
}

/// `workload` with `records` records (all loaded by this driver) and
/// `operations` run-phase operations.
pub fn sized(mut workload: Workload, records: u64, operations: u64) -> Workload {
    workload.record_count = records;
    workload.insert_start = 0;
    workload.insert_count = records;
    workload.operation_count = operations;
    workload
}

struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(opts: &RunOptions, total: u64, label: &'static str) -> Progress {
        let enabled = opts.progress;
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(every) = opts.status {
            // Status lines instead of the bar (both write stderr).
            let (d, s) = (done.clone(), stop.clone());
            let ticker = std::thread::spawn(move || status_ticker(&d, &s, total, every));
            return Progress {
                done,
                stop,
                ticker: Some(ticker),
            };
        }
        let ticker = (enabled && std::io::stderr().is_terminal() && total >= 100_000).then(|| {
            let (done, stop) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                let bar = indicatif::ProgressBar::new(total);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{prefix} [{bar:40}] {pos}/{len} {msg}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.set_prefix(label);
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let n = done.load(Ordering::Relaxed);
                    bar.set_position(n);
                    bar.set_message(format!(
                        "{:.0} ops/s",
                        n as f64 / start.elapsed().as_secs_f64().max(1e-9)
                    ));
                    std::thread::sleep(Duration::from_millis(200));
                }
                bar.finish_and_clear();
            })
        });
        Progress { done, stop, ticker }
    }

    /// Operations done, once every thread has ended (each adds what it
    /// had not counted yet): the phase's `operations`, which a run
    /// stopped early (SIGINT, `maxexecutiontime`) has fewer of than it
    /// planned. Until 2026-12-08 the planned count was reported, and a
    /// run stopped early printed a throughput of planned operations over
    /// its runtime (2.4e7 ops/s for a run of 328 k).
    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

/// Prints a status line every `every` until `stop`, and one at the end.
fn status_ticker(done: &AtomicU64, stop: &AtomicBool, total: u64, every: Duration) {
    let start = Instant::now();
    let (mut last_n, mut last_t) = (0u64, start);
    let mut next = start + every;
    loop {
        let finished = stop.load(Ordering::Relaxed);
        let now = Instant::now();
        if finished || now >= next {
            let n = done.load(Ordering::Relaxed);
            let current = (n - last_n.min(n)) as f64 / (now - last_t).as_secs_f64().max(1e-9);
            eprintln!("{}", status_line(now - start, n, total, current));
            (last_n, last_t) = (n, now);
            next += every;
        }
        if finished {
            return;
        }
        std::thread::sleep(Duration::from_millis(20).min(next.saturating_duration_since(now)));
    }
}

/// Closes the phase's clients (after its time is taken: a client that
/// gives memory back waits out its grace period first).
fn close_all(clients: Vec<Box<dyn KvClient>>) -> Closed {
    let mut all = Closed::default();
    for c in clients {
        all.add(c.close());
    }
    all
}

fn finish_phase(
    backend: &dyn Backend,
    per_thread: Vec<ThreadResult>,
    runtime: Duration,
    operations: u64,
    closed: Closed,
) -> Result<PhaseResult, PhaseError> {
    let mut all = Measurements::new();
    let mut first_error = None;
    let mut writes = Vec::new();
    for (m, e, w) in per_thread {
        all.merge(&m)?;
        first_error = first_error.or(e);
        writes.extend(w);
    }
    let errors = all
        .iter()
        .filter(|(name, _)| !name.ends_with("-FAILED"))
        .map(|(_, m)| m.count(Status::Error))
        .sum();
    let mut report = Report::new(&all, runtime, operations);
    if let Some(l) = backend.label() {
        report = report.with_label(l);
    }
    Ok(PhaseResult {
        report,
        measurements: all,
        runtime,
        operations,
        errors,
        first_error,
        writes,
        closed,
    })
}

/// What one client thread hands back.
type ThreadResult = (Measurements, Option<String>, Vec<WriteRecord>);

/// The load phase: threads take the workload's record keys until none are
/// left and insert each with a fresh value.
///
/// # Errors
/// A backend that cannot give a client, or a thread that panicked.
pub fn run_load(
    backend: &dyn Backend,
    workload: &Workload,
    keys: &KeySpace,
    opts: &RunOptions,
) -> Result<PhaseResult, PhaseError> {
    let threads = opts.threads.max(1);
    let mut clients: Vec<Box<dyn KvClient>> = (0..threads)
        .map(|_| backend.client())
        .collect::<Result<_, _>>()?;
    opts.pass_gate()?;
    let progress = Progress::start(opts, workload.insert_count, "load");
    let start = Instant::now();
    let results: Vec<Result<ThreadResult, PhaseError>> = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(t, client)| {
                let done = progress.done.clone();
                s.spawn(move || {
                    if opts.batch > 1 {
                        let thread = BatchedThread {
                            workload,
                            keys,
                            opts,
                            pacer: Pacer::new(opts, start),
                            done: &done,
                            batch: opts.batch,
                        };
                        let (m, _) = thread.load(&mut **client);
                        return (t, m, take_first_error());
                    }
                    let mut m = Measurements::new();
                    let mut value = Vec::new();
                    let value_len = workload.value_size() as usize;
                    let mut n = 0u64;
                    let mut key = String::new();
                    let pacer = Pacer::new(opts, start);
                    while let Some(k) = keys.next_load_key() {
                        if opts.stopped() {
                            break;
                        }
                        pacer.wait(n);
                        workload.write_key_name(k, &mut key);
                        fill_value(&mut value, value_len, k, 0);
                        let t0 = Instant::now();
                        let before = client.retries();
                        let r =
                            status_of(client.insert(key.as_bytes(), &value).map(|_| Found::Yes));
                        m.record(Operation::Insert, r, t0.elapsed());
                        count_retries(&mut m, Operation::Insert, before, client.retries());
                        opts.note(r);
                        n += 1;
                        if n % COUNT_EVERY == 0 {
                            done.fetch_add(COUNT_EVERY, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(n % COUNT_EVERY, Ordering::Relaxed);
                    (t, m, take_first_error())
                })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .map(|(_, m, e)| (m, e, Vec::new()))
                    .map_err(|_| PhaseError::Panicked(i))
            })
            .collect()
    });
    let runtime = start.elapsed();
    let done = progress.done();
    progress.finish();
    let closed = close_all(clients);
    let per_thread = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    finish_phase(backend, per_thread, runtime, done, closed)
}

/// The run phase: `workload.operation_count` operations split over the
/// threads, each drawn from the workload's mix and key distribution.
///
/// # Errors
/// A workload with a scan (a hash store has none), a backend that cannot
/// give a client, or a thread that panicked.
pub fn run_phase(
    backend: &dyn Backend,
    workload: &Workload,
    keys: &KeySpace,
    opts: &RunOptions,
) -> Result<PhaseResult, PhaseError> {
    workload.ensure_no_scan()?;
    let threads = opts.threads.max(1);
    let mut clients: Vec<Box<dyn KvClient>> = (0..threads)
        .map(|_| backend.client())
        .collect::<Result<_, _>>()?;
    let gens: Vec<OperationGenerator> = (0..threads)
        .map(|_| OperationGenerator::new(workload))
        .collect::<Result<_, _>>()?;
    let total = workload.operation_count;
    opts.pass_gate()?;
    let progress = Progress::start(opts, total, "run");
    let start = Instant::now();
    let results: Vec<Result<ThreadResult, PhaseError>> = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter_mut()
            .zip(gens)
            .enumerate()
            .map(|(t, (client, mut gen))| {
                let done = progress.done.clone();
                let share = total / threads as u64 + u64::from((t as u64) < total % threads as u64);
                let seed = opts.seed.wrapping_add(t as u64);
                let writer = opts.writer + t as u64;
                let log = opts.log_writes;
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed);
                    if opts.batch > 1 {
                        let thread = BatchedThread {
                            workload,
                            keys,
                            opts,
                            pacer: Pacer::new(opts, start),
                            done: &done,
                            batch: opts.batch,
                        };
                        let (m, writes) =
                            thread.run(&mut **client, &mut gen, &mut rng, share, writer, log);
                        return (m, take_first_error(), writes);
                    }
                    let mut m = Measurements::new();
                    let mut writes = Vec::new();
                    let mut logged = |keynum: u64, version: u64, t0: Instant, r: &Status| {
                        if log {
                            writes.push(WriteRecord::new(keynum, version, t0, *r));
                        }
                    };
                    let (mut value, mut out) = (Vec::new(), Vec::new());
                    let value_len = workload.value_size() as usize;
                    let pacer = Pacer::new(opts, start);
                    let mut n = 0u64;
                    let mut key = String::new();
                    for i in 0..share {
                        if opts.stopped() {
                            break;
                        }
                        pacer.wait(i);
                        let req = gen.next_request(&mut rng, keys);
                        workload.write_key_name(req.keynum, &mut key);
                        let t0 = Instant::now();
                        match req.op {
                            Operation::Read => {
                                let r = status_of(client.read(key.as_bytes(), &mut out));
                                m.record(Operation::Read, r, t0.elapsed());
                                opts.note(r);
                            }
                            Operation::Update => {
                                let version = version_tag(writer, i);
                                fill_value(&mut value, value_len, req.keynum, version);
                                let before = client.retries();
                                let r = status_of(client.update(key.as_bytes(), &value));
                                m.record(Operation::Update, r, t0.elapsed());
                                count_retries(&mut m, Operation::Update, before, client.retries());
                                opts.note(r);
                                logged(req.keynum, version, t0, &r);
                            }
                            Operation::Insert => {
                                fill_value(&mut value, value_len, req.keynum, 0);
                                let before = client.retries();
                                let r = status_of(
                                    client.insert(key.as_bytes(), &value).map(|_| Found::Yes),
                                );
                                m.record(Operation::Insert, r, t0.elapsed());
                                count_retries(&mut m, Operation::Insert, before, client.retries());
                                opts.note(r);
                                logged(req.keynum, 0, t0, &r);
                                // Acknowledged whether or not it succeeded,
                                // as YCSB does in a `finally`.
                                keys.acknowledge_insert(req.keynum);
                            }
                            Operation::ReadModifyWrite => {
                                // YCSB measures the read, the write, and the whole.
                                let r = client.read(key.as_bytes(), &mut out);
                                let rs = status_of(r);
                                m.record(Operation::Read, rs, t0.elapsed());
                                let t1 = Instant::now();
                                let version = version_tag(writer, i);
                                fill_value(&mut value, value_len, req.keynum, version);
                                let before = client.retries();
                                let w = client.update(key.as_bytes(), &value);
                                let ws = status_of(w);
                                m.record(Operation::Update, ws, t1.elapsed());
                                count_retries(&mut m, Operation::Update, before, client.retries());
                                logged(req.keynum, version, t1, &ws);
                                let whole = if rs.is_ok() && ws.is_ok() {
                                    Status::Ok
                                } else {
                                    Status::Error
                                };
                                m.record(Operation::ReadModifyWrite, whole, t0.elapsed());
                                opts.note(whole);
                            }
                            Operation::Scan => {
                                // Refused by ensure_no_scan above; counted if reached.
                                m.record(Operation::Scan, Status::Error, t0.elapsed());
                            }
                        }
                        n += 1;
                        if n % COUNT_EVERY == 0 {
                            done.fetch_add(COUNT_EVERY, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(n % COUNT_EVERY, Ordering::Relaxed);
                    (m, take_first_error(), writes)
                })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(i, h)| h.join().map_err(|_| PhaseError::Panicked(i)))
            .collect()
    });
    let runtime = start.elapsed();
    let done = progress.done();
    progress.finish();
    let closed = close_all(clients);
    let per_thread = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    finish_phase(backend, per_thread, runtime, done, closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::MapBackend;

    #[test]
    fn status_lines_use_ycsbs_time_format() {
        let at = |secs: u64, ms: u64| {
            ycsb_timestamp(std::time::UNIX_EPOCH + Duration::from_millis(secs * 1000 + ms))
        };
        assert_eq!(at(0, 0), "1970-01-01 00:00:00:000");
        // A leap day, and the last millisecond of a year.
        assert_eq!(at(951_782_400 + 3_723, 45), "2000-02-29 01:02:03:045");
        assert_eq!(at(1_798_761_599, 999), "2026-12-31 23:59:59:999");
        let line = status_line(Duration::from_secs(10), 1000, 4000, 123.45);
        let (stamp, rest) = line.split_at(23);
        assert_eq!(stamp.len(), 23, "{line}");
        assert_eq!(
            rest,
            " 10 sec: 1000 operations; 123.5 current ops/sec; est completion in 30 seconds"
        );
        let done = status_line(Duration::from_secs(40), 4000, 4000, 100.0);
        assert!(
            done.ends_with(" 40 sec: 4000 operations; 100.0 current ops/sec"),
            "{done}"
        );
    }

    /// The run phase's operations as the workload counts them: each RMW is
    /// also measured once as READ and once as UPDATE.
    fn measured(run: &PhaseResult) -> u64 {
        let ops: u64 = ["READ", "UPDATE", "INSERT"]
            .iter()
            .filter_map(|n| run.measurements.get(n))
            .map(|m| m.operations())
            .sum();
        let rmw = run
            .measurements
            .get("READ-MODIFY-WRITE")
            .map_or(0, |m| m.operations());
        ops - rmw
    }

    #[test]
    fn map_backend_runs_every_workload_but_e() {
        for w in ['a', 'b', 'c', 'd', 'f'] {
            let workload = sized(Workload::preset(w).unwrap(), 500, 2000);
            let backend = MapBackend::new();
            let keys = KeySpace::new(&workload);
            let opts = RunOptions {
                threads: 2,
                progress: false,
                ..RunOptions::default()
            };
            let load = run_load(&backend, &workload, &keys, &opts).unwrap();
            assert_eq!(load.errors, 0);
            assert_eq!(backend.len(), 500, "workload {w}: every record loaded");
            let run = run_phase(&backend, &workload, &keys, &opts).unwrap();
            assert_eq!(run.errors, 0, "workload {w}");
            assert_eq!(
                measured(&run),
                2000,
                "workload {w}: every operation measured"
            );
            let text = run.report.to_text();
            assert!(text.contains("[OVERALL], Throughput(ops/sec), "), "{text}");
        }
        let e = Workload::preset('e').unwrap();
        let keys = KeySpace::new(&e);
        let err = run_phase(&MapBackend::new(), &e, &keys, &RunOptions::default()).unwrap_err();
        assert!(err.to_string().to_lowercase().contains("scan"), "{err}");
    }

    #[test]
    fn batched_threads_measure_every_operation_and_load_every_record() {
        for w in ['a', 'd', 'f'] {
            let workload = sized(Workload::preset(w).unwrap(), 300, 1000);
            let backend = MapBackend::new();
            let keys = KeySpace::new(&workload);
            let opts = RunOptions {
                threads: 2,
                progress: false,
                batch: 7,
                ..RunOptions::default()
            };
            let load = run_load(&backend, &workload, &keys, &opts).unwrap();
            assert_eq!(load.errors, 0);
            assert_eq!(backend.len(), 300, "workload {w}: every record loaded");
            assert_eq!(load.measurements.get("INSERT").unwrap().operations(), 300);
            let run = run_phase(&backend, &workload, &keys, &opts).unwrap();
            assert_eq!(run.errors, 0, "workload {w}");
            assert_eq!(measured(&run), 1000, "workload {w}");
        }
    }

    /// A phase stopped early reports the operations it did, and a
    /// throughput of those (before: the planned count, over the runtime).
    #[test]
    fn a_stopped_phase_reports_the_operations_it_did() {
        for batch in [1, 8] {
            let workload = sized(Workload::preset('a').unwrap(), 300, 1 << 40);
            let backend = MapBackend::new();
            let keys = KeySpace::new(&workload);
            let stop = Arc::new(AtomicBool::new(false));
            let opts = RunOptions {
                threads: 2,
                progress: false,
                batch,
                stop: Some(stop.clone()),
                ..RunOptions::default()
            };
            run_load(&backend, &workload, &keys, &opts).unwrap();
            let stopper = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    stop.store(true, Ordering::Relaxed);
                })
            };
            let run = run_phase(&backend, &workload, &keys, &opts).unwrap();
            stopper.join().unwrap();
            assert!(
                run.operations > 0 && run.operations < 1 << 40,
                "batch {batch}: {}",
                run.operations
            );
            assert_eq!(run.operations, measured(&run), "batch {batch}");
            assert_eq!(run.report.operations, run.operations);
            let ms = run.report.runtime_ms.max(1) as f64;
            let expect = run.operations as f64 * 1000.0 / ms;
            let got = run.report.throughput_ops_sec.unwrap_or(expect);
            assert!(
                (got - expect).abs() <= expect * 1e-9,
                "batch {batch}: {got} against {expect}"
            );
        }
    }

    #[test]
    fn values_differ_per_version() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        fill_value(&mut a, 100, 7, 1);
        fill_value(&mut b, 100, 7, 2);
        assert_eq!(a.len(), 100);
        assert_ne!(a, b);
    }
}
