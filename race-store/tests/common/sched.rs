//! A deterministic multi-client harness: every client runs on its own
//! thread, but a seeded [`Turnstile`] lets exactly one remote operation
//! execute at a time, chosen among the clients that are all waiting to run
//! one. The ops of one doorbell run in order, but other clients' ops may run
//! between them, as on a real fabric. Between steps only the chosen client
//! runs, so a run is a pure function of the seed: the interleaving (and the
//! manual clock, advanced one tick per step) is reproducible, and
//! `max_steps` turns a livelock into a failure naming the seed.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use race_store::clock::{Clock, ManualClock};
use race_store::layout::slot::RemotePtr;
use race_store::memory::{LocalCluster, LocalTransport};
use race_store::remote::{CrashPlan, FaultInjector, OpResult, RemoteOp, Transport, TransportError};
use race_store::{Client, ClientConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

struct State {
    rng: SmallRng,
    live: BTreeSet<usize>,
    waiting: BTreeSet<usize>,
    running: Option<usize>,
    steps: u64,
    max_steps: u64,
    aborted: bool,
}

/// The scheduler shared by the clients of one run.
pub struct Turnstile {
    seed: u64,
    state: Mutex<State>,
    cv: Condvar,
    clock: Arc<ManualClock>,
}

impl Turnstile {
    /// A run of `clients` participants (ids `0..clients`).
    pub fn new(seed: u64, clients: usize, clock: Arc<ManualClock>, max_steps: u64) -> Arc<Self> {
        Arc::new(Self {
            seed,
            state: Mutex::new(State {
                rng: SmallRng::seed_from_u64(seed),
                live: (0..clients).collect(),
                waiting: BTreeSet::new(),
                running: None,
                steps: 0,
                max_steps,
                aborted: false,
            }),
            cv: Condvar::new(),
            clock,
        })
    }

    /// Doorbells executed so far.
    pub fn steps(&self) -> u64 {
        self.state.lock().unwrap().steps
    }

    fn pick(&self, s: &mut State) {
        if s.running.is_some() || s.waiting.is_empty() || s.waiting.len() != s.live.len() {
            return;
        }
        let i = s.rng.gen_range(0..s.waiting.len());
        s.running = s.waiting.iter().nth(i).copied();
        s.steps += 1;
        self.clock.advance(1);
        if s.steps > s.max_steps {
            s.aborted = true;
        }
        self.cv.notify_all();
    }

    fn enter(&self, id: usize) {
        let mut s = self.state.lock().unwrap();
        s.waiting.insert(id);
        self.pick(&mut s);
        while s.running != Some(id) && !s.aborted {
            s = self.cv.wait(s).unwrap();
        }
        if s.aborted {
            let (steps, seed) = (s.steps, self.seed);
            drop(s);
            panic!("seed {seed}: no progress after {steps} doorbells (livelock?)");
        }
    }

    fn exit(&self, id: usize) {
        let mut s = self.state.lock().unwrap();
        s.running = None;
        s.waiting.remove(&id);
        self.pick(&mut s);
    }

    /// Participant `id` is done (its transport was dropped).
    fn finish(&self, id: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.live.remove(&id);
        s.waiting.remove(&id);
        if s.running == Some(id) {
            s.running = None;
        }
        self.pick(&mut s);
        self.cv.notify_all();
    }
}

/// A transport whose doorbells wait for their turn.
pub struct Scheduled<T: Transport> {
    inner: T,
    id: usize,
    turnstile: Arc<Turnstile>,
}

impl<T: Transport> Scheduled<T> {
    pub fn new(inner: T, id: usize, turnstile: Arc<Turnstile>) -> Self {
        Self {
            inner,
            id,
            turnstile,
        }
    }

    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    pub fn inner(&self) -> &T {
        &self.inner
    }
}

impl<T: Transport> Transport for Scheduled<T> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let mut out = Vec::with_capacity(batch.len());
        for op in batch {
            self.turnstile.enter(self.id);
            let r = self.inner.execute(std::slice::from_ref(op));
            self.turnstile.exit(self.id);
            out.extend(r?);
        }
        Ok(out)
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.inner.alloc_block(node, size)
    }

    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

impl<T: Transport> Drop for Scheduled<T> {
    fn drop(&mut self) {
        self.turnstile.finish(self.id);
    }
}

/// Leases and deadlines in doorbell ticks: a lease outlives any split, an
/// attempt outlives any wait (so the interleaving alone decides).
pub fn sim_config() -> ClientConfig {
    ClientConfig {
        lease_ticks: 5_000,
        lease_unit_ticks: 1,
        max_op_ticks: 200_000,
        grace_ticks: 500_000,
        max_attempts: 100_000,
        coarse_block_bytes: 2048,
        ..ClientConfig::default()
    }
}

pub type SimClient = Client<Scheduled<FaultInjector<LocalTransport>>>;

/// Runs `clients` closures, one per thread, under one turnstile; returns
/// their results in order.
pub fn run<R: Send + 'static>(
    seed: u64,
    cluster: &LocalCluster,
    clock: &Arc<ManualClock>,
    crash: Vec<Option<CrashPlan>>,
    body: impl Fn(usize, &mut SimClient) -> R + Send + Sync + 'static,
) -> Vec<R> {
    run_configured(seed, cluster, clock, crash, |_| sim_config(), body)
}

/// As [`run`], client `id` opened with `config(id)`.
pub fn run_configured<R: Send + 'static>(
    seed: u64,
    cluster: &LocalCluster,
    clock: &Arc<ManualClock>,
    crash: Vec<Option<CrashPlan>>,
    config: impl Fn(usize) -> ClientConfig,
    body: impl Fn(usize, &mut SimClient) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let turnstile = Turnstile::new(seed, crash.len(), Arc::clone(clock), 2_000_000);
    let body = Arc::new(body);
    let handles: Vec<_> = crash
        .into_iter()
        .enumerate()
        .map(|(id, plan)| {
            let t = Scheduled::new(
                FaultInjector::new(cluster.transport(), plan),
                id,
                Arc::clone(&turnstile),
            );
            let (clock, body, config) = (Arc::clone(clock), Arc::clone(&body), config(id));
            thread::spawn(move || {
                let mut c = Client::open(t, clock as Arc<dyn Clock>, config).unwrap();
                body(id, &mut c)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| panic!("seed {seed}: a client panicked"))
        })
        .collect()
}

pub fn checker(cluster: &LocalCluster, clock: &Arc<ManualClock>) -> Client<LocalTransport> {
    Client::open(cluster.transport(), clock.clone(), sim_config()).unwrap()
}
