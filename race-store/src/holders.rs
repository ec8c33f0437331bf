//! A memory node's book of the clients that hold its grants, so that the
//! memory a client took and never wrote comes back when the client dies.
//!
//! A client carves KV blocks out of the grants a memory node gives it
//! ([`crate::remote::Transport::alloc_blocks`]): up to 4 MiB per size class
//! at a time, asked for ahead. A client that closes gives back what it did
//! not use ([`crate::pool`]); one that crashes (SIGKILL, a lost machine)
//! used to leave all of it allocated for good. With this book the node
//! takes back, once a dead client's lease has ended, every block of its
//! grants that was never written.
//!
//! # How it works
//! * A client names itself with a random 64-bit *holder id* in its grant
//!   and give-back requests. Each request renews the holder's lease on
//!   the node; [`GrantLease`] tells the client the lease's length and its
//!   *generation*, which is new each time the node starts a record for the
//!   holder (the first request, or the first after the record ended).
//! * The node records every grant as *pieces*: `(start, end, block size,
//!   holder)`, which never overlap. A run given back (by any client: a
//!   block another client unlinked and gave back lies in its carver's
//!   piece) is cut out of the pieces it falls in. A piece whose last block
//!   was written is forgotten ([`Holders::prune`]): clients carve a grant
//!   from its start, so it is carved out.
//! * A client that closes ends its lease itself ([`Holders::end`]), after
//!   giving back what it held: its pieces are doomed at once, as below.
//! * A holder not heard from for a whole lease is dead: its record ends and
//!   its pieces become *doomed* ([`Holders::expire`]); the node takes back
//!   every block of them whose first 8 bytes are still zero, a bounded
//!   chunk at a time ([`Holders::next_doomed`]) with its heap lock let go
//!   between chunks, so that a dead client's grants (tens of MiB of small
//!   blocks) do not stall every other client's allocations while the node
//!   reads them. Doomed pieces are cut like live ones: a run given back
//!   meanwhile (another client unlinked a written block and the pool may
//!   hand it out again, first word zeroed) leaves them before the node
//!   reads it, so no block is taken back while someone holds it. The node
//!   zeroes the first word of every block it hands out from its pool, and
//!   new heap is zero, so a zero first word means nobody wrote the block
//!   since it was granted: it was never linked into the table (a slot is
//!   installed only after its block's WRITE completed), and no other
//!   client holds it (another client can only hold a block it unlinked).
//!   Blocks that were written stay allocated, linked or not: telling a
//!   dead client's retired and free blocks from linked ones needs a scan of
//!   the table, which this does not do.
//!
//! # Why a resumed client cannot write memory taken back (the fence)
//! The client counts its lease from when it *sent* a request that was
//! answered, on its own monotonic clock; the node counts from when it
//! *received* the last one. The client carves from a node's grants only
//! while more than a quarter of its lease is left
//! ([`crate::remote::Transport::grant_lease`]: it renews once a quarter
//! is gone, ahead where the transport can, and waits for the renewal
//! when a quarter is left), and drops every grant of the node, with the blocks it
//! released unpublished (their WRITEs may not have run), when the
//! generation changed; its free blocks were written, so it keeps them. So a client the node declared dead stopped carving
//! from the old grants a quarter of a lease before, by its own clock; a
//! block carved before that is written by its operation within
//! `max_op_ticks` (100 ms by default). This is the same kind of timing
//! assumption as the grace period's: it holds unless a client stalls for
//! a quarter of a lease (2.5 s by default) between carving a block and the
//! doorbell that writes it.
//!
//! Plain data, no I/O and no clock: the node calls it under its heap lock
//! with its own microseconds and reads the blocks itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// The default length of a client's lease on a memory node's grants.
pub const DEFAULT_GRANT_LEASE: Duration = Duration::from_secs(10);

/// What a memory node tells a client about its lease with each answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantLease {
    /// The lease's length in milliseconds (at least 1).
    pub lease_ms: u32,
    /// The node's record of this holder: new (higher) each time the node
    /// starts one. Grants of an older generation may have been taken back.
    pub generation: u32,
    /// Collections the node has applied so far
    /// ([`crate::memory::MemoryNode::collect_finish`]): each one may have
    /// taken back any block of the node that no slot linked, so a client
    /// that sees this count change drops every block of the node it holds
    /// (free, retired, uncarved).
    pub collections: u32,
}

/// A recorded grant, or what is left of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Bytes of one block (the grant's size class).
    pub block_bytes: u64,
    /// The holder it was granted to.
    pub holder: u64,
}

impl Piece {
    /// Offsets of its whole blocks, from `start`.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        let b = self.block_bytes.max(1);
        let whole = (self.end.saturating_sub(self.start)) / b;
        (0..whole).map(move |i| self.start + i * b)
    }

    /// The offset of its last whole block, if it has one.
    fn last_block(&self) -> Option<u64> {
        self.blocks().last()
    }
}

#[derive(Clone, Copy, Debug)]
struct Record {
    generation: u32,
    /// The node's microseconds when its last request came.
    last_seen: u64,
}

/// Figures of a node's [`Holders`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderStats {
    /// Holders with a live lease.
    pub holders: u64,
    /// Pieces recorded (grants not known to be carved out).
    pub pieces: u64,
    /// Bytes of ended holders' pieces not looked at yet.
    pub doomed: u64,
    /// Holders whose lease ended, so far: ran out (no word from them for a
    /// lease) or ended at their request (a close: [`Holders::end`]).
    pub ended: u64,
    /// Of those, the leases that ran out: holders that died, or went
    /// silent for a lease, and left what they held (a close ends its
    /// lease itself, and so does a dropped client).
    pub ran_out: u64,
    /// Leases that ran out since the node's last applied collection
    /// ([`Holders::note_collection`]): nonzero when what their holders
    /// left may still be allocated (`race-kv maintain` collects such a
    /// node).
    pub ran_out_since_collection: u64,
    /// Bytes taken back from ended holders, so far.
    pub reclaimed: u64,
}

/// A lease's microseconds: whole milliseconds, 1 ms to `u32::MAX` ms.
fn lease_us(lease: Duration) -> u64 {
    let ms = u64::try_from(lease.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, u64::from(u32::MAX));
    ms * 1000
}

/// The book (see the module docs).
#[derive(Debug)]
pub struct Holders {
    lease_us: u64,
    next_generation: u32,
    records: HashMap<u64, Record>,
    /// Start -> piece; pieces never overlap.
    pieces: BTreeMap<u64, Piece>,
    /// Start -> piece of an ended holder whose blocks the node has not read
    /// yet; these never overlap each other nor `pieces`.
    doomed: BTreeMap<u64, Piece>,
    ended: u64,
    ran_out: u64,
    /// `ran_out` when the last collection was applied.
    ran_out_at_collection: u64,
    reclaimed: u64,
    collections: u32,
}

impl Holders {
    /// An empty book whose leases last `lease` (at least 1 ms).
    pub fn new(lease: Duration) -> Self {
        Holders {
            lease_us: lease_us(lease),
            next_generation: 1,
            records: HashMap::new(),
            pieces: BTreeMap::new(),
            doomed: BTreeMap::new(),
            ended: 0,
            ran_out: 0,
            ran_out_at_collection: 0,
            reclaimed: 0,
            collections: 0,
        }
    }

    /// The lease's length.
    pub fn lease(&self) -> Duration {
        Duration::from_micros(self.lease_us)
    }

    /// Changes the lease's length (at least 1 ms) for every holder.
    pub fn set_lease(&mut self, lease: Duration) {
        self.lease_us = lease_us(lease);
    }

    /// Renews `holder`'s lease at `now`, starting a record (a new
    /// generation) if it has none; the terms to tell it.
    pub fn touch(&mut self, holder: u64, now: u64) -> GrantLease {
        let next = &mut self.next_generation;
        let r = self.records.entry(holder).or_insert_with(|| {
            let generation = *next;
            *next = next.wrapping_add(1).max(1);
            Record {
                generation,
                last_seen: now,
            }
        });
        r.last_seen = r.last_seen.max(now);
        GrantLease {
            lease_ms: u32::try_from(self.lease_us / 1000).unwrap_or(u32::MAX),
            generation: r.generation,
            collections: self.collections,
        }
    }

    /// Holders with a live record.
    pub fn live(&self) -> usize {
        self.records.len()
    }

    /// Microseconds from `now` until the last live record's lease ends (0
    /// with none live): how long a node that renews nothing waits for
    /// every holder to be dead.
    pub fn last_lease_ends_in(&self, now: u64) -> u64 {
        self.records
            .values()
            .map(|r| {
                r.last_seen
                    .saturating_add(self.lease_us)
                    .saturating_sub(now)
            })
            .max()
            .unwrap_or(0)
    }

    /// Collections applied so far ([`GrantLease::collections`]).
    pub fn collections(&self) -> u32 {
        self.collections
    }

    /// Counts a collection that took blocks back.
    pub fn collected(&mut self) {
        self.collections = self.collections.wrapping_add(1);
    }

    /// Records `runs` (`(offset, len)`) of blocks of `block_bytes` granted
    /// to `holder` (which [`Holders::touch`] renewed just before). Runs
    /// overlapping a recorded piece replace that part of it (the node hands
    /// out only memory nobody holds, so this happens only if a piece
    /// outlived its blocks' return).
    pub fn granted(&mut self, holder: u64, block_bytes: u64, runs: &[(u64, u64)]) {
        for &(start, len) in runs {
            let Some(end) = start.checked_add(len).filter(|_| len > 0) else {
                continue;
            };
            self.cut(start, end);
            self.pieces.insert(
                start,
                Piece {
                    start,
                    end,
                    block_bytes,
                    holder,
                },
            );
        }
    }

    /// Runs given back to the node (by any client): no holder's any more.
    pub fn returned(&mut self, runs: &[(u64, u64)]) {
        for &(start, len) in runs {
            if let Some(end) = start.checked_add(len) {
                self.cut(start, end);
            }
        }
    }

    /// Removes `start..end` from every piece, live and doomed.
    fn cut(&mut self, start: u64, end: u64) {
        cut_map(&mut self.pieces, start, end);
        cut_map(&mut self.doomed, start, end);
    }

    /// Forgets `holder`'s pieces whose last block `written` says was
    /// written: carved out, nothing of them will ever be taken back.
    pub fn prune(&mut self, holder: u64, written: impl Fn(u64) -> bool) {
        self.pieces
            .retain(|_, p| p.holder != holder || !p.last_block().is_some_and(&written));
    }

    /// Ends the record of every holder not heard from for a whole lease
    /// at `now`; their pieces become doomed, for the node to take back
    /// what was never written ([`Holders::next_doomed`]). Returns how many
    /// records ended.
    pub fn expire(&mut self, now: u64) -> usize {
        let lease = self.lease_us;
        let dead: HashSet<u64> = self
            .records
            .iter()
            .filter(|(_, r)| now.saturating_sub(r.last_seen) > lease)
            .map(|(&h, _)| h)
            .collect();
        if dead.is_empty() {
            return 0;
        }
        for h in &dead {
            self.records.remove(h);
        }
        self.ended += dead.len() as u64;
        self.ran_out += dead.len() as u64;
        self.doom(|h| dead.contains(&h));
        dead.len()
    }

    /// Moves the pieces of the holders `ended` says ended to the doomed.
    fn doom(&mut self, ended: impl Fn(u64) -> bool) {
        let doomed = &mut self.doomed;
        self.pieces.retain(|&start, p| {
            if ended(p.holder) {
                doomed.insert(start, *p);
                false
            } else {
                true
            }
        });
    }

    /// Ends `holder`'s record at its own request (a client that closed):
    /// its pieces become doomed, as in [`Holders::expire`]. Returns whether
    /// it had a record.
    pub fn end(&mut self, holder: u64) -> bool {
        if self.records.remove(&holder).is_none() {
            return false;
        }
        self.ended += 1;
        self.doom(|h| h == holder);
        true
    }

    /// Takes the next doomed piece off the book, at most `max_blocks`
    /// blocks of it (the rest stays doomed), for the node to read; `None`
    /// when nothing is doomed.
    pub fn next_doomed(&mut self, max_blocks: u64) -> Option<Piece> {
        let (_, p) = self.doomed.pop_first()?;
        let b = p.block_bytes.max(1);
        let whole = p.end.saturating_sub(p.start) / b;
        if whole <= max_blocks.max(1) {
            return Some(p);
        }
        let split = p.start + max_blocks.max(1) * b;
        self.doomed.insert(split, Piece { start: split, ..p });
        Some(Piece { end: split, ..p })
    }

    /// A collection was applied with no lease live: whatever the holders
    /// whose leases ran out before it left is taken back (and no lease can
    /// run out during one: none is live, and none is granted).
    pub fn note_collection(&mut self) {
        self.ran_out_at_collection = self.ran_out;
    }

    /// Counts `bytes` taken back from ended holders (the node's scan).
    pub fn note_reclaimed(&mut self, bytes: u64) {
        self.reclaimed += bytes;
    }

    /// Figures.
    pub fn stats(&self) -> HolderStats {
        HolderStats {
            holders: self.records.len() as u64,
            pieces: self.pieces.len() as u64,
            doomed: self.doomed.values().map(|p| p.end - p.start).sum(),
            ended: self.ended,
            ran_out: self.ran_out,
            ran_out_since_collection: self.ran_out - self.ran_out_at_collection,
            reclaimed: self.reclaimed,
        }
    }
}

/// Removes `start..end` from every piece of `map`, keeping what lies
/// outside it on each piece's own block grid (a part block is dropped: kept
/// allocated, never taken back).
fn cut_map(map: &mut BTreeMap<u64, Piece>, start: u64, end: u64) {
    let hit: Vec<u64> = map
        .range(..end)
        .rev()
        .take_while(|(_, p)| p.end > start)
        .map(|(&s, _)| s)
        .collect();
    for s in hit {
        let Some(p) = map.remove(&s) else {
            continue;
        };
        let b = p.block_bytes.max(1);
        if p.start < start {
            let keep_end = p.start + (start - p.start) / b * b;
            if keep_end > p.start {
                map.insert(p.start, Piece { end: keep_end, ..p });
            }
        }
        if end < p.end {
            let from = p.start + (end - p.start).div_ceil(b) * b;
            if from < p.end {
                map.insert(from, Piece { start: from, ..p });
            }
        }
    }
}

/// The never-written blocks of `piece` as runs `(offset, len)`, adjacent
/// ones merged: `first_word(offset)` reads a block's first 8 bytes.
pub fn unwritten_runs(piece: &Piece, first_word: impl Fn(u64) -> u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for at in piece.blocks() {
        if first_word(at) != 0 {
            continue;
        }
        match out.last_mut() {
            Some((s, len)) if *s + *len == at => *len += piece.block_bytes,
            _ => out.push((at, piece.block_bytes)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(10);

    fn ms(n: u64) -> u64 {
        n * 1000
    }

    /// Ends the leases due at `now` and takes every doomed piece off.
    fn expire_all(h: &mut Holders, now: u64) -> Vec<Piece> {
        h.expire(now);
        std::iter::from_fn(|| h.next_doomed(u64::MAX)).collect()
    }

    #[test]
    fn a_record_starts_a_generation_and_renewals_keep_it() {
        let mut h = Holders::new(LEASE);
        let a = h.touch(7, 0);
        assert_eq!(a.lease_ms, 10);
        assert_eq!(h.touch(7, ms(9)), a, "renewed within the lease");
        let b = h.touch(8, ms(9));
        assert_ne!(a.generation, b.generation);
        // 7 was heard from at 9 ms: alive at 19, dead past it.
        assert_eq!(h.expire(ms(19)), 0);
        assert_eq!(h.stats().holders, 2);
        assert_eq!(h.expire(ms(20)), 2);
        assert_eq!(h.stats().holders, 0);
        assert_eq!(h.stats().ended, 2);
        let again = h.touch(7, ms(21));
        assert!(
            again.generation > b.generation,
            "a new record, a new generation"
        );
    }

    #[test]
    fn a_dead_holder_hands_over_its_pieces_and_only_its() {
        let mut h = Holders::new(LEASE);
        h.touch(1, 0);
        h.granted(1, 128, &[(4096, 1024), (8192, 512)]);
        h.touch(2, ms(5));
        h.granted(2, 64, &[(16384, 640)]);
        let gone = expire_all(&mut h, ms(11));
        assert_eq!(gone.len(), 2);
        assert!(gone.iter().all(|p| p.holder == 1));
        assert_eq!(h.stats().pieces, 1);
        let rest = expire_all(&mut h, ms(16));
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].holder, 2);
    }

    #[test]
    fn a_holder_that_ends_its_lease_hands_over_its_pieces_at_once() {
        let mut h = Holders::new(LEASE);
        h.touch(1, 0);
        h.granted(1, 128, &[(4096, 1024)]);
        h.touch(2, 0);
        h.granted(2, 64, &[(16384, 640)]);
        assert!(h.end(1), "1 had a record");
        assert!(!h.end(1), "and has none now");
        assert!(!h.end(9), "9 never had one");
        let s = h.stats();
        assert_eq!((s.holders, s.pieces, s.doomed, s.ended), (1, 1, 1024, 1));
        assert_eq!((s.ran_out, s.ran_out_since_collection), (0, 0), "an end");
        let gone: Vec<Piece> = std::iter::from_fn(|| h.next_doomed(u64::MAX)).collect();
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].holder, gone[0].start), (1, 4096));
        let again = h.touch(1, ms(1));
        assert!(
            again.generation > 2,
            "a holder back after its end has a new record"
        );
        // 2, silent since 0, runs out; 1 was heard from at 1 ms.
        assert_eq!(h.expire(ms(10) + 1), 1);
        let s = h.stats();
        assert_eq!((s.ended, s.ran_out, s.ran_out_since_collection), (2, 1, 1));
        h.note_collection();
        assert_eq!(h.stats().ran_out_since_collection, 0);
        assert_eq!(h.stats().ran_out, 1);
    }

    #[test]
    fn runs_given_back_are_cut_out_on_the_block_grid() {
        let mut h = Holders::new(LEASE);
        h.touch(1, 0);
        h.granted(1, 128, &[(4096, 1280)]); // 10 blocks
                                            // Another client gives back block 3; a run of another size that
                                            // ends mid-block drops the part block.
        h.returned(&[(4096 + 3 * 128, 128)]);
        h.returned(&[(4096 + 8 * 128, 64)]);
        let mut got = expire_all(&mut h, ms(11));
        got.sort_by_key(|p| p.start);
        let spans: Vec<(u64, u64)> = got.iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(
            spans,
            vec![
                (4096, 4096 + 3 * 128),
                (4096 + 4 * 128, 4096 + 8 * 128),
                (4096 + 9 * 128, 4096 + 10 * 128)
            ]
        );
    }

    #[test]
    fn carved_out_pieces_are_forgotten() {
        let mut h = Holders::new(LEASE);
        h.touch(1, 0);
        h.granted(1, 64, &[(4096, 640), (8192, 640)]);
        let written: HashSet<u64> = [4096 + 9 * 64].into_iter().collect();
        h.prune(1, |at| written.contains(&at));
        assert_eq!(h.stats().pieces, 1);
        assert_eq!(expire_all(&mut h, ms(11))[0].start, 8192);
    }

    #[test]
    fn doomed_pieces_come_off_in_chunks_and_runs_given_back_meanwhile_leave_them() {
        let mut h = Holders::new(LEASE);
        h.touch(1, 0);
        h.granted(1, 64, &[(4096, 64 * 10)]);
        h.touch(2, ms(5));
        h.granted(2, 64, &[(65536, 64 * 4)]);
        assert_eq!(h.expire(ms(11)), 1);
        assert_eq!(h.stats().doomed, 64 * 10);
        assert_eq!(h.stats().pieces, 1, "the live holder's piece stays");
        let first = h.next_doomed(4).unwrap();
        assert_eq!((first.start, first.end), (4096, 4096 + 4 * 64));
        assert_eq!(h.stats().doomed, 64 * 6);
        // Block 5 is given back (another client unlinked it) and block 7
        // granted anew to holder 2 before the node reads them: neither
        // may be taken back.
        h.returned(&[(4096 + 5 * 64, 64)]);
        h.granted(2, 64, &[(4096 + 7 * 64, 64)]);
        let rest: Vec<(u64, u64)> = std::iter::from_fn(|| h.next_doomed(4))
            .map(|p| (p.start, p.end))
            .collect();
        assert_eq!(
            rest,
            vec![
                (4096 + 4 * 64, 4096 + 5 * 64),
                (4096 + 6 * 64, 4096 + 7 * 64),
                (4096 + 8 * 64, 4096 + 10 * 64)
            ]
        );
        assert_eq!(h.stats().doomed, 0);
        assert!(h.next_doomed(4).is_none());
        // Holder 2's later grant is its own, live piece.
        assert_eq!(h.stats().pieces, 2);
    }

    #[test]
    fn unwritten_blocks_come_out_as_merged_runs() {
        let p = Piece {
            start: 0,
            end: 64 * 8 + 10,
            block_bytes: 64,
            holder: 1,
        };
        let written = [1u64, 2, 5];
        let runs = unwritten_runs(&p, |at| u64::from(written.contains(&(at / 64))));
        assert_eq!(runs, vec![(0, 64), (192, 128), (384, 128)]);
    }
}
