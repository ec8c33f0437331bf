//! Transport wrappers for tests and benches: [`FaultInjector`] (a client
//! that dies at a chosen doorbell) and [`Delayed`] (a round trip for a
//! transport that has none).

use super::{
    AllocAsk, BlockRun, Completions, OpResult, RemoteOp, Ticket, Transport, TransportError,
};
use crate::collection::{CollectStart, Collected};
use crate::layout::slot::RemotePtr;

/// When a [`FaultInjector`] kills its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    /// The doorbell (1-based, counting `execute` calls) that fails.
    pub at_doorbell: u64,
    /// How many ops of that batch still execute before the failure (a client
    /// that dies after posting part of a batch).
    pub executed_prefix: usize,
}

/// A transport wrapper that makes its client "die": from a chosen doorbell
/// on, every call fails with [`TransportError::Disconnected`], after letting
/// a prefix of that doorbell's batch execute. Like redb's countdown backend,
/// for crash tests: run an operation once to count its doorbells, then replay
/// it crashing at each one.
#[derive(Debug)]
pub struct FaultInjector<T> {
    inner: T,
    plan: Option<CrashPlan>,
    doorbells: u64,
    dead: bool,
}

impl<T: Transport> FaultInjector<T> {
    /// Wraps `inner`; with `plan: None` it never fails.
    pub fn new(inner: T, plan: Option<CrashPlan>) -> Self {
        Self {
            inner,
            plan,
            doorbells: 0,
            dead: false,
        }
    }

    /// Doorbells seen so far (including the failing one).
    pub fn doorbells(&self) -> u64 {
        self.doorbells
    }

    /// Whether the crash has happened.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Sets (or clears) the crash plan; doorbells are counted from now on.
    pub fn set_plan(&mut self, plan: Option<CrashPlan>) {
        self.plan = plan;
        self.doorbells = 0;
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Transport> FaultInjector<T> {
    /// `Err(Disconnected)` once the client is dead.
    fn alive(&self) -> Result<(), TransportError> {
        match self.dead {
            true => Err(TransportError::Disconnected),
            false => Ok(()),
        }
    }

    /// Counts a doorbell; `Err` if the client is (now) dead, after letting
    /// the planned prefix of `batch` execute.
    fn doorbell(&mut self, batch: &[RemoteOp<'_>]) -> Result<(), TransportError> {
        self.alive()?;
        self.doorbells += 1;
        match self.plan {
            Some(plan) if plan.at_doorbell == self.doorbells => {
                self.dead = true;
                let prefix = batch.get(..plan.executed_prefix).unwrap_or(batch);
                if !prefix.is_empty() {
                    // The posted part reaches memory; its results are lost.
                    let _ = self.inner.execute(prefix);
                }
                Err(TransportError::Disconnected)
            }
            _ => Ok(()),
        }
    }
}

impl<T: Transport> Transport for FaultInjector<T> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        self.doorbell(batch)?;
        self.inner.execute(batch)
    }

    fn execute_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        self.doorbell(batch)?;
        self.inner.execute_into(batch, out)
    }

    fn post_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, TransportError> {
        self.doorbell(batch)?;
        self.inner.post_into(batch, out)
    }

    /// A client that died after posting never learns its doorbells'
    /// outcome: [`TransportError::Disconnected`].
    fn complete_into(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        let r = self.inner.complete_into(ticket, batch, out);
        self.alive()?;
        r
    }

    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight()
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.alive()?;
        self.inner.alloc_block(node, size)
    }

    fn alloc_blocks(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        self.alive()?;
        self.inner.alloc_blocks(node, size, block_bytes)
    }

    fn alloc_block_ask(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        if let Err(e) = self.alive() {
            return Some(Err(e));
        }
        self.inner.alloc_block_ask(node, size, block_bytes)
    }

    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        self.alive()?;
        self.inner.alloc_block_answer(ask, wait)
    }

    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        self.alive()?;
        self.inner
            .return_blocks(node, block_bytes, runs, delay, wait)
    }

    fn return_blocks_ahead(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        self.alive()?;
        self.inner
            .return_blocks_ahead(node, block_bytes, runs, delay)
    }

    fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        self.alive()?;
        self.inner.grant_lease(node)
    }

    fn end_grant_leases(&mut self, only: Option<u8>, wait: bool) -> Result<usize, TransportError> {
        self.alive()?;
        self.inner.end_grant_leases(only, wait)
    }

    fn lease_collections(&self, node: u8) -> Option<u32> {
        self.inner.lease_collections(node)
    }

    fn collect_begin(&mut self, node: u8, token: u64) -> Result<CollectStart, TransportError> {
        self.alive()?;
        self.inner.collect_begin(node, token)
    }

    fn collect_live(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        self.alive()?;
        self.inner.collect_live(node, token, runs)
    }

    fn collect_finish(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        self.alive()?;
        self.inner.collect_finish(node, token, apply)
    }

    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

/// A transport wrapper that makes every doorbell take at least `rtt`: half
/// of it before the batch executes (the request on the wire), half after
/// (the response). A stand-in for a network's round trip on a transport
/// that has none ([`crate::memory::LocalTransport`]): clients in threads
/// then overlap as they do across machines, so contention tests and the
/// `contention` example see writers race on a hot key.
#[derive(Debug)]
pub struct Delayed<T> {
    inner: T,
    half: std::time::Duration,
}

impl<T: Transport> Delayed<T> {
    /// Wraps `inner` with a round trip of `rtt`.
    pub fn new(inner: T, rtt: std::time::Duration) -> Self {
        Self {
            inner,
            half: rtt / 2,
        }
    }

    fn wait(&self) {
        if !self.half.is_zero() {
            std::thread::sleep(self.half);
        }
    }
}

impl<T: Transport> Transport for Delayed<T> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        self.wait();
        let r = self.inner.execute(batch);
        self.wait();
        r
    }

    fn execute_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        self.wait();
        let r = self.inner.execute_into(batch, out);
        self.wait();
        r
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.inner.alloc_block(node, size)
    }

    fn alloc_blocks(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        self.inner.alloc_blocks(node, size, block_bytes)
    }

    fn alloc_block_ask(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        self.inner.alloc_block_ask(node, size, block_bytes)
    }

    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        self.inner.alloc_block_answer(ask, wait)
    }

    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        self.inner
            .return_blocks(node, block_bytes, runs, delay, wait)
    }

    fn return_blocks_ahead(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        self.inner
            .return_blocks_ahead(node, block_bytes, runs, delay)
    }

    fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        self.inner.grant_lease(node)
    }

    fn end_grant_leases(&mut self, only: Option<u8>, wait: bool) -> Result<usize, TransportError> {
        self.inner.end_grant_leases(only, wait)
    }

    fn lease_collections(&self, node: u8) -> Option<u32> {
        self.inner.lease_collections(node)
    }

    fn collect_begin(&mut self, node: u8, token: u64) -> Result<CollectStart, TransportError> {
        self.inner.collect_begin(node, token)
    }

    fn collect_live(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        self.inner.collect_live(node, token, runs)
    }

    fn collect_finish(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        self.inner.collect_finish(node, token, apply)
    }

    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}
