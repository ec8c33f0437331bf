//! Tests of the client's block allocator.

use super::*;
use crate::memory::{ClusterConfig, LocalCluster, TableConfig};

/// `nodes` memory nodes of `node_bytes`, a table of one small subtable.
fn small_cluster(nodes: u8, node_bytes: u64) -> LocalCluster {
    LocalCluster::new(ClusterConfig {
        nodes,
        node_bytes,
        table: TableConfig {
            geometry: crate::layout::subtable::SubtableGeometry::new(1).unwrap(),
            initial_global_depth: 0,
            max_global_depth: 4,
        },
    })
    .unwrap()
}

#[test]
fn classes_cover_every_length_with_bounded_waste() {
    for units in 1..=255u8 {
        let c = class_of(units);
        let size = CLASS_UNITS[c];
        assert!(size >= units);
        assert!(u32::from(size) * 4 <= u32::from(units) * 5 + 4, "{units}");
    }
    assert_eq!(class_of(1), 0);
    assert_eq!(class_of(255), CLASS_UNITS.len() - 1);
}

/// A node whose block request failed is skipped for the back-off, then
/// asked again; with every node skipped an allocation fails at once
/// with the node's error (counted: `block_rpcs`, one per request).
#[test]
fn an_unreachable_node_is_skipped_for_its_back_off() {
    let cluster = small_cluster(2, 1 << 20);
    let mut t = cluster.transport();
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(2, 10, 1024).with_backoff(100);
    cluster.set_node_down(1, true);
    // Each allocation below is of a new class: it needs a refill.
    let len = |units: usize| units * LEN_UNIT;
    let p = a.alloc(&mut t, &mut st, 1, len(1), 0).unwrap();
    assert_eq!(
        (p.node(), st.block_rpcs),
        (0, 2),
        "node 1 asked, then node 0"
    );
    let p = a.alloc(&mut t, &mut st, 1, len(2), 50).unwrap();
    assert_eq!((p.node(), st.block_rpcs), (0, 3), "node 1 skipped");
    let p = a.alloc(&mut t, &mut st, 1, len(3), 100).unwrap();
    assert_eq!(
        (p.node(), st.block_rpcs),
        (0, 5),
        "back-off over: asked again"
    );
    cluster.set_node_down(0, true);
    let e = a.alloc(&mut t, &mut st, 1, len(4), 120).unwrap_err();
    assert_eq!(st.block_rpcs, 6, "node 1 skipped, node 0 asked: {e:?}");
    let e = a.alloc(&mut t, &mut st, 0, len(5), 130).unwrap_err();
    assert_eq!(st.block_rpcs, 6, "both skipped: no request");
    assert!(
        matches!(e, Error::Transport(TransportError::NodeDown { .. })),
        "{e:?}"
    );
    cluster.set_node_down(0, false);
    cluster.set_node_down(1, false);
    let p = a.alloc(&mut t, &mut st, 1, len(6), 300).unwrap();
    assert_eq!((p.node(), st.block_rpcs), (1, 7), "both back");
    // Without a back-off every allocation asks the node again.
    let mut b = KvAllocator::new(2, 10, 1024);
    cluster.set_node_down(1, true);
    b.alloc(&mut t, &mut st, 1, len(1), 0).unwrap();
    b.alloc(&mut t, &mut st, 1, len(2), 0).unwrap();
    assert_eq!(st.block_rpcs, 11);
}

#[test]
fn carve_release_retire_reclaim() {
    let cluster = small_cluster(2, 1 << 16);
    let mut t = cluster.transport();
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(2, 10, 1024);
    let p1 = a.alloc(&mut t, &mut st, 1, 64, 0).unwrap();
    let p2 = a.alloc(&mut t, &mut st, 1, 64, 0).unwrap();
    assert_eq!((p1.node(), p2.offset() - p1.offset()), (1, 64));
    assert_eq!(st.block_rpcs, 1);
    assert_eq!(a.stats().coarse_bytes, 1024);
    // Unpublished: reused at once.
    a.release(p2, 64);
    assert_eq!(a.alloc(&mut t, &mut st, 1, 64, 0).unwrap(), p2);
    // Published and unlinked: only after the grace period.
    let fp = core::num::NonZeroU8::new(3).unwrap();
    a.retire(Slot::for_block(fp, 64, p1).unwrap(), 5);
    assert_eq!(a.stats().quarantined_bytes, 64);
    let p3 = a.alloc(&mut t, &mut st, 1, 64, 15).unwrap();
    assert_ne!(p3, p1);
    assert_eq!(a.alloc(&mut t, &mut st, 1, 64, 16).unwrap(), p1);
    assert_eq!(a.stats().quarantined_bytes, 0);
    // A large class gets its own coarse block.
    let big = a.alloc(&mut t, &mut st, 0, 4096, 16).unwrap();
    assert_eq!(big.node(), 0);
    assert_eq!(a.stats().coarse_bytes, 1024 + 4096);
    // A full node falls back to the other one.
    cluster.set_node_down(0, false);
    let mut small = KvAllocator::new(2, 10, 1 << 20);
    let q = small.alloc(&mut t, &mut st, 0, 64, 0);
    assert!(matches!(q, Err(Error::OutOfMemory { .. })));
    cluster.set_node_down(1, true);
    let mut b = KvAllocator::new(2, 10, 1024);
    assert!(matches!(
        b.alloc(&mut t, &mut st, 1, 64, 0),
        Ok(p) if p.node() == 0
    ));
}

/// A transport that answers blocks asked ahead only when told to (or
/// when waited for), counting its requests.
struct Asking {
    inner: crate::memory::LocalTransport,
    asked: Vec<(u64, u8, u64)>,
    ready: bool,
    sync_calls: u64,
    answers_waited: u64,
    /// Every answer waited for times out.
    lost: bool,
    /// Every answer, and every block given back, meets a collection.
    collecting: bool,
    /// Every answer came under a lease that has ended since.
    lease_ended: bool,
}

impl Asking {
    fn new(inner: crate::memory::LocalTransport, ready: bool, lost: bool) -> Asking {
        Asking {
            inner,
            asked: Vec::new(),
            ready,
            sync_calls: 0,
            answers_waited: 0,
            lost,
            collecting: false,
            lease_ended: false,
        }
    }
}

impl Transport for Asking {
    fn execute(
        &mut self,
        batch: &[crate::remote::RemoteOp<'_>],
    ) -> Result<Vec<crate::remote::OpResult>, TransportError> {
        self.inner.execute(batch)
    }
    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        self.sync_calls += 1;
        self.inner.alloc_block(node, size)
    }
    fn alloc_block_ask(
        &mut self,
        node: u8,
        size: u64,
        _block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        let id = self.asked.len() as u64 + 100;
        self.asked.push((id, node, size));
        Some(Ok(AllocAsk(id)))
    }
    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        if !wait && !self.ready {
            return Ok(None);
        }
        self.answers_waited += u64::from(wait);
        if self.collecting {
            return Err(TransportError::Collecting { node: 0 });
        }
        if self.lease_ended {
            return Err(TransportError::LeaseEnded { node: 0 });
        }
        if self.lost {
            return Err(TransportError::Timeout {
                node: 0,
                after: Duration::from_secs(2),
            });
        }
        let &(_, node, size) = self
            .asked
            .iter()
            .find(|a| a.0 == ask.0)
            .ok_or(TransportError::BadResponse { reason: "unknown" })?;
        self.inner
            .alloc_block(node, size)
            .map(|start| Some(vec![BlockRun { start, len: size }]))
    }
    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        if self.collecting {
            return Err(TransportError::Collecting { node });
        }
        self.inner
            .return_blocks(node, block_bytes, runs, delay, wait)
    }
    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

/// An allocator of one node that carved 8 blocks from `t`, with the next
/// grant asked ahead and not answered yet.
fn carved_with_an_ask_out(t: &mut Asking) -> KvAllocator {
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(1, 10, 1024);
    let asked = t.asked.len();
    for _ in 0..8 {
        a.alloc(t, &mut st, 0, LEN_UNIT, 0).unwrap();
    }
    assert_eq!(t.asked.len(), asked + 1, "an ask ahead is out");
    a
}

/// A close that meets a collection (answers of asks and give-backs sent
/// while the node collected, or a node collecting now) keeps what the
/// node did not take and reports no error: a collection is the
/// operator's, not the client's failure, and the node takes what is kept
/// itself. Before, CI's writers beside collections saw `Collecting` as
/// their close's error.
#[test]
fn a_close_that_meets_a_collection_keeps_without_error() {
    let cluster = small_cluster(1, 1 << 20);
    let mut t = Asking::new(cluster.transport(), false, false);
    let mut a = carved_with_an_ask_out(&mut t);
    t.collecting = true;
    let held = a.stats().uncarved_bytes;
    let r = a.give_back(&mut t, 8, None, true);
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!((r.returned_bytes, r.kept_bytes), (0, held), "{r:?}");
    assert_eq!(t.answers_waited, 1, "the ask was answered");
    // Given back when the node is not collecting.
    t.collecting = false;
    let mut b = carved_with_an_ask_out(&mut t);
    let r = b.give_back(&mut t, 8, None, true);
    assert!(r.error.is_none() && r.returned_bytes > 0, "{r:?}");
}

/// A close whose grant asked ahead was answered under a lease that has
/// ended since (the client ended it on a collecting node, and renewed
/// after the collection) reports no error: the node took those runs back
/// when the lease ended, so nothing is lost. Before, a writer's close
/// beside collections (`collect.rs`, over messaging) reported
/// `LeaseEnded` now and then.
#[test]
fn a_close_whose_ask_came_under_an_ended_lease_reports_no_error() {
    let cluster = small_cluster(1, 1 << 20);
    let mut t = Asking::new(cluster.transport(), false, false);
    let mut a = carved_with_an_ask_out(&mut t);
    t.lease_ended = true;
    let r = a.give_back(&mut t, 8, None, true);
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(t.answers_waited, 1, "the ask was answered");
    assert!(r.returned_bytes > 0, "what it held went back: {r:?}");
}

/// A grant asked ahead whose answer timed out (a node too busy to answer
/// in time: 200 client threads on 2 cores) is asked again when it is
/// needed, and the write that needs it succeeds; before, the write failed
/// with the ask's timeout.
#[test]
fn an_ask_that_timed_out_is_asked_again_and_the_write_goes_on() {
    let cluster = small_cluster(1, 64 << 20);
    let mut t = Asking::new(cluster.transport(), false, true);
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(1, 10, 4096);
    let mut blocks = std::collections::HashSet::new();
    for i in 0..1000 {
        let p = a
            .alloc(&mut t, &mut st, 0, LEN_UNIT, 0)
            .unwrap_or_else(|e| panic!("block {i}: {e}"));
        assert!(blocks.insert(p), "block {i} handed out twice");
    }
    assert!(t.answers_waited > 0, "no ask was needed");
    assert!(
        t.sync_calls >= t.answers_waited,
        "each lost ask asked again"
    );
}

/// A client whose every grant asked ahead is needed before its answer
/// came doubles its grants, up to MAX_FAST_REFILL; one whose answers
/// come in time grows by the quarter rule only.
#[test]
fn grants_that_come_too_late_double_the_next_ones() {
    let cluster = small_cluster(1, 64 << 20);
    let sizes = |ready: bool| -> Vec<u64> {
        let mut t = Asking::new(cluster.transport(), ready, false);
        let mut st = TransportStats::default();
        let mut a = KvAllocator::new(1, 10, 4096);
        for _ in 0..200_000 {
            a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap();
        }
        t.asked.iter().map(|x| x.2).collect()
    };
    let late = sizes(false);
    let want: Vec<u64> = (0..11)
        .map(|i| (4096u64 << i).min(MAX_FAST_REFILL))
        .collect();
    assert_eq!(late.get(..11), Some(&want[..]), "{late:?}");
    assert!(late.iter().all(|&s| s <= MAX_FAST_REFILL));
    let in_time = sizes(true);
    assert!(in_time.iter().all(|&s| s <= MAX_REFILL), "{in_time:?}");
}

#[test]
fn the_next_coarse_block_is_asked_for_once_the_current_is_half_carved() {
    let cluster = small_cluster(1, 1 << 20);
    let mut t = Asking::new(cluster.transport(), false, false);
    let mut st = TransportStats::default();
    // Coarse blocks of 1 KiB: 16 blocks of 64 B each.
    let mut a = KvAllocator::new(1, 10, 1024);
    let mut got = Vec::new();
    for i in 0..8 {
        got.push(a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap());
        // The first refill is waited for; the next is asked once half
        // of the block is carved (after the 8th).
        let want = if i < 7 { 0 } else { 1 };
        assert_eq!(t.asked.len(), want, "after {} blocks", i + 1);
    }
    assert_eq!(t.sync_calls, 1);
    for _ in 8..16 {
        got.push(a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap());
    }
    assert_eq!(t.asked.len(), 1, "one ask at a time");
    // The 17th block comes out of the block asked ahead (its answer
    // waited for: it had not come), with no request of its own.
    got.push(a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap());
    assert_eq!((t.sync_calls, t.answers_waited), (1, 1));
    assert_eq!(st.block_rpcs, 2);
    // An answer already there is taken without waiting.
    t.ready = true;
    for _ in 17..40 {
        got.push(a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap());
    }
    assert_eq!((t.sync_calls, t.answers_waited), (1, 1));
    assert!(t.asked.len() >= 2);
    // Every block distinct and whole.
    let mut offs: Vec<u64> = got.iter().map(|p| p.offset()).collect();
    offs.sort_unstable();
    assert!(offs.windows(2).all(|w| w[1] - w[0] >= LEN_UNIT as u64));
    // The refill that waited for the block asked ahead (the 17th)
    // doubled the grants after it: the first ask was 1 KiB, the next
    // ones at least 2 KiB. Answers that were there double nothing.
    let sizes: Vec<u64> = t.asked.iter().map(|a| a.2).collect();
    assert_eq!(sizes.first(), Some(&1024), "{sizes:?}");
    assert!(sizes.iter().skip(1).all(|&s| s >= 2048), "{sizes:?}");
    assert!(sizes.iter().all(|&s| s <= MAX_FAST_REFILL), "{sizes:?}");
    // Every request's block in use, but the one asked and not yet
    // collected.
    let coarse = a.stats().coarse_bytes;
    let asked: u64 = sizes.iter().sum();
    let last = sizes.last().copied().unwrap_or(0);
    assert!(
        coarse == 1024 + asked || coarse == 1024 + asked - last,
        "{coarse} bytes for a first grant of 1024 then {sizes:?}"
    );
}

/// What [`Trimming`] does with a give-back sent ahead.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TrimMode {
    /// Given to the node; answered at the next look.
    Take,
    /// Answered `Refused` at the next look.
    Refuse,
    /// Answered `Timeout` at the next look (unknown outcome).
    Lose,
    /// Not sent: `Unsupported`.
    Cannot,
    /// Answered `Collecting` at the next look (the node took nothing).
    Collecting,
}

/// A transport whose give-backs sent ahead end as `mode` says.
struct Trimming {
    inner: crate::memory::LocalTransport,
    mode: TrimMode,
    out: Vec<(u64, u8, u64, Vec<BlockRun>, Duration)>,
    sent: u64,
}

impl Transport for Trimming {
    fn execute(
        &mut self,
        batch: &[crate::remote::RemoteOp<'_>],
    ) -> Result<Vec<crate::remote::OpResult>, TransportError> {
        self.inner.execute(batch)
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
    fn return_blocks_ahead(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        if self.mode == TrimMode::Cannot {
            return Err(TransportError::Unsupported { what: "test" });
        }
        self.sent += 1;
        self.out
            .push((self.sent, node, block_bytes, runs.to_vec(), delay));
        Ok(Some(AllocAsk(self.sent)))
    }
    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        _wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        let i = self
            .out
            .iter()
            .position(|o| o.0 == ask.0)
            .ok_or(TransportError::BadResponse { reason: "unknown" })?;
        let (_, node, block_bytes, runs, delay) = self.out.remove(i);
        match self.mode {
            TrimMode::Take => self
                .inner
                .return_blocks(node, block_bytes, &runs, delay, true)
                .map(|()| Some(Vec::new())),
            TrimMode::Refuse | TrimMode::Cannot => Err(TransportError::Refused {
                node,
                source: crate::remote::Cause::msg("test"),
            }),
            TrimMode::Lose => Err(TransportError::Timeout {
                node,
                after: Duration::from_secs(1),
            }),
            TrimMode::Collecting => Err(TransportError::Collecting { node }),
        }
    }
    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
}

/// A new lease on a node (the node may have taken back what the client
/// never wrote) drops the uncarved runs, blocks released unpublished
/// among them, and keeps the free blocks, which were written.
#[test]
fn a_new_lease_drops_released_blocks_and_keeps_written_free_ones() {
    let cluster = small_cluster(1, 1 << 20);
    let mut t = cluster.transport();
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(1, 10, 1024);
    let p1 = a.alloc(&mut t, &mut st, 0, 64, 0).unwrap();
    let p2 = a.alloc(&mut t, &mut st, 0, 64, 0).unwrap();
    a.release(p2, 64);
    a.free_one(p1, 0); // written, free (as reclaim makes it)
    let before = a.stats();
    assert_eq!((before.free_bytes, before.uncarved_bytes), (64, 1024 - 64));
    a.drop_node(0);
    let s = a.stats();
    assert_eq!((s.free_bytes, s.uncarved_bytes), (64, 0));
    assert_eq!(s.dropped_bytes, 1024 - 64, "the released block went too");
    assert_eq!(a.take_free(0, 0), Some(p1));
}

/// Free lists past FREE_HIGH are trimmed to FREE_KEEP, one message at a
/// time; blocks the node refused come back, blocks whose answer was lost
/// are dropped (never used again), a transport that cannot take blocks
/// back turns trimming off; nothing is ever in two places.
#[test]
fn free_lists_past_the_high_mark_go_back_and_failures_keep_or_drop() {
    let cluster = small_cluster(1, 64 << 20);
    let mut t = Trimming {
        inner: cluster.transport(),
        mode: TrimMode::Refuse,
        out: Vec::new(),
        sent: 0,
    };
    let mut st = TransportStats::default();
    let grace = 10;
    let mut a = KvAllocator::new(1, grace, 1 << 20);
    let per_mib = (1u64 << 20) / LEN_UNIT as u64;
    // 3 MiB of 64 B blocks freed: 1 MiB over FREE_HIGH.
    let blocks: Vec<RemotePtr> = (0..3 * per_mib)
        .map(|_| a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap())
        .collect();
    for &p in &blocks {
        a.free_one(p, 0); // a written block, free (as reclaim makes it)
    }
    let free = |a: &KvAllocator| a.stats().free_bytes;
    assert_eq!(free(&a), 3 << 20);

    // Refused: sent (2,048 blocks), then back at the front of the list.
    a.trim(&mut t, 1);
    assert_eq!(a.stats().giving_bytes, TRIM_BLOCKS as u64 * 64);
    assert_eq!(free(&a), (3 << 20) - TRIM_BLOCKS as u64 * 64);
    a.trim(&mut t, 2);
    assert_eq!((free(&a), a.stats().giving_bytes), (3 << 20, 0));
    assert_eq!(a.stats().dropped_bytes, 0);
    assert_eq!(
        t.sent, 1,
        "the node is not trimmed again for a grace period"
    );
    let front = a.take_free(0, 0);
    assert_eq!(
        front,
        blocks.first().copied(),
        "the oldest first, as before"
    );
    a.free_one(blocks[0], 0);

    // Lost: dropped, never handed out again.
    t.mode = TrimMode::Lose;
    a.trim(&mut t, 2 + grace);
    a.trim(&mut t, 3 + grace);
    let lost = TRIM_BLOCKS as u64 * 64;
    assert_eq!(a.stats().dropped_bytes, lost);
    assert_eq!(free(&a), (3 << 20) - lost);

    // Taken: trimmed down to FREE_KEEP, a message at a time.
    t.mode = TrimMode::Take;
    for now in 4 + 2 * grace..68 + 2 * grace {
        a.trim(&mut t, now);
    }
    let s = a.stats();
    assert_eq!((s.free_bytes, s.giving_bytes), (FREE_KEEP, 0), "{s:?}");
    assert_eq!(s.trimmed_bytes, (2 << 20) - lost);
    let pool = cluster.stats()[0].pool;
    assert_eq!(pool.returned, s.trimmed_bytes);

    // Cannot: trimming stops; the blocks stay.
    let mut b = KvAllocator::new(1, grace, 1 << 20);
    t.mode = TrimMode::Cannot;
    let mine: Vec<RemotePtr> = (0..3 * per_mib)
        .map(|_| b.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap())
        .collect();
    for &p in &mine {
        b.free_one(p, 0);
    }
    b.trim(&mut t, 1);
    assert_eq!((free(&b), b.stats().dropped_bytes), (3 << 20, 0));
    assert!(!b.trims && b.over.is_empty());
    // Nothing in two places: what the node took is handed to the next
    // client, and none of it is in the first one's free list.
    let mine: std::collections::HashSet<u64> = a
        .arenas
        .iter()
        .flatten()
        .flat_map(|arena| arena.free.iter().map(|p| p.offset()))
        .collect();
    t.mode = TrimMode::Take;
    let mut c = KvAllocator::new(1, grace, 1 << 20);
    for _ in 0..(s.trimmed_bytes / 64) {
        let p = c.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap();
        assert!(!mine.contains(&p.offset()), "{p:?} handed out twice");
    }
    assert!(cluster.stats()[0].pool.reused > 0);
}

/// Free blocks given back while the node collected are still the
/// client's (kept, as refused ones, and no error in a close's report);
/// the collection's end, when the client learns of it, drops them.
#[test]
fn a_give_back_that_meets_a_collection_keeps_the_blocks() {
    let cluster = small_cluster(1, 64 << 20);
    let mut t = Trimming {
        inner: cluster.transport(),
        mode: TrimMode::Collecting,
        out: Vec::new(),
        sent: 0,
    };
    let mut st = TransportStats::default();
    let mut a = KvAllocator::new(1, 10, 1 << 20);
    let per_mib = (1u64 << 20) / LEN_UNIT as u64;
    let blocks: Vec<RemotePtr> = (0..3 * per_mib)
        .map(|_| a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap())
        .collect();
    for p in blocks {
        a.free_one(p, 0);
    }
    a.trim(&mut t, 1);
    assert_eq!(a.stats().giving_bytes, TRIM_BLOCKS as u64 * 64);
    let mut report = ReturnReport::default();
    a.collect_trims(&mut t, true, Some(&mut report));
    assert!(report.error.is_none(), "{report:?}");
    let s = a.stats();
    assert_eq!(
        (s.free_bytes, s.giving_bytes, s.dropped_bytes),
        (3 << 20, 0, 0)
    );
    a.drop_collected(0);
    assert_eq!(a.stats().free_bytes, 0);
}

/// With a real-time clock, retired blocks past the mark go to their
/// nodes, oldest first, with what is left of their grace period; refused
/// ones come back to the front of the retired queue, as retired when the
/// youngest of them was.
#[test]
fn retired_blocks_past_the_high_mark_go_back_with_the_rest_of_their_grace() {
    let cluster = small_cluster(1, 64 << 20);
    let mut t = Trimming {
        inner: cluster.transport(),
        mode: TrimMode::Refuse,
        out: Vec::new(),
        sent: 0,
    };
    let mut st = TransportStats::default();
    let grace = 1_000;
    const HIGH: u64 = 8 << 20;
    let mut a = KvAllocator::new(1, grace, 1 << 20).with_tick(Some(Duration::from_micros(1)), HIGH);
    let fp = core::num::NonZeroU8::new(3).unwrap();
    // 9 MiB of 64 B blocks retired at ticks 0..: 1 MiB over the mark.
    let n = 9 * (1u64 << 20) / 64;
    for i in 0..n {
        let p = a.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap();
        a.retire(Slot::for_block(fp, 64, p).unwrap(), i / 1_000);
    }
    let retired = |a: &KvAllocator| a.stats().quarantined_bytes;
    assert_eq!(retired(&a), 9 << 20);
    let now = n / 1_000;
    a.trim(&mut t, now);
    assert_eq!(t.out.len(), 1, "one (node, class)");
    let (_, _, size, runs, delay) = t.out[0].clone();
    assert_eq!(size, 64);
    assert_eq!(
        runs.iter().map(|r| r.len).sum::<u64>(),
        TRIM_BLOCKS as u64 * 64
    );
    // The oldest 2,048 blocks were retired at ticks 0..=2: the youngest's
    // rest of the grace period.
    assert_eq!(delay, Duration::from_micros(2 + grace + 1 - now));
    assert_eq!(retired(&a), (9 << 20) - TRIM_BLOCKS as u64 * 64);
    // One give-back of retired blocks at a time.
    a.trim(&mut t, now);
    assert_eq!(t.sent, 1);
    // Refused: back at the front, retired at tick 2.
    a.trim(&mut t, now + 1);
    assert_eq!(retired(&a), 9 << 20);
    assert_eq!(a.quarantine.front().map(|r| r.tick), Some(2));
    assert!(a
        .quarantine
        .iter()
        .zip(a.quarantine.iter().skip(1))
        .all(|(x, y)| x.tick <= y.tick));
    // Taken: down to the mark, 2,048 at a time, after the pause.
    t.mode = TrimMode::Take;
    for k in 0..300 {
        a.trim(&mut t, now + 2 + grace + k);
    }
    assert!(retired(&a) <= HIGH, "{:?}", a.stats());
    assert!(a.stats().trimmed_bytes >= 1 << 20, "{:?}", a.stats());
    // What the node holds for the rest of the grace period, then hands out.
    let pool = cluster.stats()[0].pool;
    assert_eq!(pool.returned, a.stats().trimmed_bytes);
    // Without a real-time clock nothing retired goes back while running.
    let mut b = KvAllocator::new(1, grace, 1 << 20).with_tick(None, HIGH);
    for i in 0..n {
        let p = b.alloc(&mut t, &mut st, 0, LEN_UNIT, 0).unwrap();
        b.retire(Slot::for_block(fp, 64, p).unwrap(), i / 1_000);
    }
    let before = t.sent;
    b.trim(&mut t, now);
    assert_eq!(t.sent, before);
}
