//! A memory node's side of grant leases ([`crate::holders`]): grants and
//! give-backs on behalf of a named holder, and taking back the blocks a
//! dead holder never wrote.

use std::time::Duration;

use super::{MemoryNode, NodeMemory};
use crate::holders::{unwritten_runs, GrantLease};
use crate::remote::TransportError;

/// Bytes of a block a zero first word stands for (see
/// [`crate::holders`]).
const FIRST_WORD: usize = 8;

/// Blocks of ended holders' grants a node reads per hold of its heap lock
/// while taking them back: a dead client's grants can be tens of MiB of
/// 64-byte blocks (64 MiB: 0.1-0.2 s of reading), which held every other
/// client's allocations on the node when read in one go.
pub const TAKEBACK_CHUNK_BLOCKS: u64 = 1024;

impl<M: NodeMemory> MemoryNode<M> {
    /// Sets how long a holder's lease lasts without a request
    /// ([`crate::holders::DEFAULT_GRANT_LEASE`] unless set; at least 1 ms).
    pub fn set_grant_lease(&self, lease: Duration) {
        let mut heap = self.heap.lock();
        heap.holders.set_lease(lease);
        heap.expiry_check_at = 0;
    }

    /// [`MemoryNode::alloc_blocks`] for `holder`, whose lease this renews
    /// (see [`crate::holders`]): the runs are recorded as its until
    /// written, given back, or taken back after its lease ends.
    ///
    /// # Errors
    /// As [`MemoryNode::alloc_blocks`] (the lease is renewed even then).
    pub fn grant(
        &self,
        holder: u64,
        size: u64,
        block_bytes: u64,
    ) -> Result<(Vec<(u64, u64)>, GrantLease), TransportError> {
        let lease = self.renew(holder)?;
        let runs = self.alloc_blocks(size, block_bytes)?;
        self.record_grant(holder, block_bytes, &runs);
        Ok((runs, lease))
    }

    /// Records `runs` of blocks of `block_bytes` (from
    /// [`MemoryNode::alloc_blocks`]) as `holder`'s, whose lease the caller
    /// renewed ([`MemoryNode::renew`]); forgets its carved-out grants.
    pub fn record_grant(&self, holder: u64, block_bytes: u64, runs: &[(u64, u64)]) {
        let mut heap = self.heap.lock();
        heap.holders.prune(holder, |at| self.first_word(at) != 0);
        heap.holders.granted(holder, block_bytes, runs);
    }

    /// Renews `holder`'s lease (starting a record if it has none); also
    /// takes back what holders whose leases ended never wrote, when due.
    ///
    /// # Errors
    /// [`TransportError::NodeDown`]; [`TransportError::Collecting`] while
    /// a collection is under way (it renews nobody: see
    /// [`MemoryNode::collect_begin`]).
    pub fn renew(&self, holder: u64) -> Result<GrantLease, TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        self.reclaim_step();
        let now = self.micros();
        let mut heap = self.heap.lock();
        if heap.collecting(now) {
            return Err(TransportError::Collecting { node: self.id });
        }
        Ok(heap.holders.touch(holder, now))
    }

    /// Collections that took blocks back so far
    /// ([`GrantLease::collections`]).
    pub fn collections(&self) -> u32 {
        self.heap.lock().holders.collections()
    }

    /// Ends `holder`'s lease at its request (it closed): its grants are
    /// doomed at once, as if the lease had run out, and what is left of
    /// them unwritten is taken back as requests come and by the upkeep
    /// thread ([`MemoryNode::reclaim_if_due`]). Nothing if it has no
    /// record.
    pub fn end_lease(&self, holder: u64) {
        let mut heap = self.heap.lock();
        heap.holders.prune(holder, |at| self.first_word(at) != 0);
        heap.holders.end(holder);
    }

    /// [`MemoryNode::give_back`] for `holder`, whose lease this renews.
    ///
    /// # Errors
    /// As [`MemoryNode::give_back`].
    pub fn give_back_as(
        &self,
        holder: u64,
        block_bytes: u64,
        runs: &[(u64, u64)],
        delay: Duration,
    ) -> Result<(u64, GrantLease), TransportError> {
        let lease = self.renew(holder)?;
        self.give_back(block_bytes, runs, delay)
            .map(|taken| (taken, lease))
    }

    /// Ends the lease of every holder not heard from for a whole lease and
    /// takes back the blocks of its grants (and of grants of holders that
    /// ended before and are not read yet) that were never written (see
    /// [`crate::holders`]): they are handed out again at once. Returns the
    /// bytes taken back. The heap lock is let go every
    /// [`TAKEBACK_CHUNK_BLOCKS`] blocks, so other requests go on meanwhile.
    pub fn reclaim_expired(&self) -> u64 {
        self.look_for_ended();
        self.take_back(u64::MAX)
    }

    /// [`MemoryNode::reclaim_expired`], looking for ended leases only if its
    /// time has come (an eighth of a lease, at least 1 ms, after the last
    /// look); the bytes taken back. A serving node's upkeep thread calls it.
    pub fn reclaim_if_due(&self) -> u64 {
        if self.expiry_due() {
            self.look_for_ended();
        }
        self.take_back(u64::MAX)
    }

    /// A request's share of the taking back: the look for ended leases if
    /// due, and one chunk of their blocks, so that a node without an upkeep
    /// thread takes everything back as requests come, and no request waits
    /// for more than a chunk.
    fn reclaim_step(&self) -> u64 {
        if self.expiry_due() {
            self.look_for_ended();
        }
        self.take_back(1)
    }

    fn expiry_due(&self) -> bool {
        let heap = self.heap.lock();
        self.micros() >= heap.expiry_check_at
    }

    /// Ends the records of holders not heard from for a whole lease: their
    /// pieces become doomed.
    fn look_for_ended(&self) {
        let now = self.micros();
        let mut heap = self.heap.lock();
        let lease_us = u64::try_from(heap.holders.lease().as_micros()).unwrap_or(u64::MAX);
        heap.expiry_check_at = now.saturating_add((lease_us / 8).max(1_000));
        heap.holders.expire(now);
    }

    /// Reads up to `chunks` chunks of doomed pieces, one hold of the heap
    /// lock each, and takes back their never-written blocks; the bytes
    /// taken back. Between chunks, runs given back or granted leave the
    /// doomed pieces (the book cuts them), so a block handed out again
    /// meanwhile is never taken back.
    fn take_back(&self, chunks: u64) -> u64 {
        let mut taken = 0;
        for _ in 0..chunks {
            let now = self.micros();
            let mut heap = self.heap.lock();
            let Some(piece) = heap.holders.next_doomed(TAKEBACK_CHUNK_BLOCKS) else {
                break;
            };
            let bounds = (heap.floor, heap.next);
            let mut chunk = 0;
            for run in unwritten_runs(&piece, |at| self.first_word(at)) {
                // One run at a time: a run the pool refuses (it cannot
                // overlap what the pool holds, as the book cuts returned
                // runs out) stays allocated rather than spoiling the rest.
                if let Ok(n) = heap.pool.give(piece.block_bytes, &[run], bounds, now, now) {
                    chunk += n;
                }
            }
            heap.holders.note_reclaimed(chunk);
            taken += chunk;
            // Hand the lock to a waiting request, if any: an unfair release
            // lets this loop take it straight back, and a request then waits
            // for the whole taking back, chunks or not.
            parking_lot::MutexGuard::unlock_fair(heap);
        }
        taken
    }

    /// The first 8 bytes of the block at `at` (0 when out of range: such a
    /// block is not the node's to take back, and the pool refuses it).
    fn first_word(&self, at: u64) -> u64 {
        if at
            .checked_add(FIRST_WORD as u64)
            .is_none_or(|end| end > self.capacity())
        {
            return 0;
        }
        let mut b = [0u8; FIRST_WORD];
        self.mem.read_into(at, &mut b);
        u64::from_le_bytes(b)
    }

    /// Zeroes the first word of every block of `runs`, which nobody holds.
    pub(super) fn zero_first_words(&self, runs: &[(u64, u64)], block_bytes: u64) {
        let b = block_bytes.max(FIRST_WORD as u64);
        for &(start, len) in runs {
            let mut at = start;
            while at + FIRST_WORD as u64 <= start + len && at + FIRST_WORD as u64 <= self.capacity()
            {
                self.mem.write_from(at, &[0u8; FIRST_WORD]);
                at += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::MemoryNode;
    use std::time::Duration;

    const LEASE: Duration = Duration::from_millis(20);

    fn past_lease() {
        std::thread::sleep(LEASE + Duration::from_millis(10));
    }

    #[test]
    fn a_dead_holders_unwritten_blocks_come_back_and_written_ones_stay() {
        let n = MemoryNode::new(1, 1 << 20);
        n.set_grant_lease(LEASE);
        let (runs, lease) = n.grant(7, 16 * 128, 128).unwrap();
        assert_eq!(lease.lease_ms, 20);
        assert_eq!(runs.len(), 1);
        let (start, _) = runs[0];
        // Blocks 0..5 and 9 written; block 9 says nothing of 6..9.
        for b in (0..5).chain([9]) {
            n.write(start + b * 128, b"RKxxxxxx").unwrap();
        }
        assert_eq!(n.reclaim_expired(), 0, "the lease is live");
        past_lease();
        assert_eq!(n.reclaim_expired(), 10 * 128);
        let s = n.stats();
        assert_eq!((s.holders.holders, s.holders.ended), (0, 1));
        assert_eq!(s.holders.reclaimed, 10 * 128);
        assert_eq!(s.pool.pooled, 10 * 128);
        // Handed out again, first in first out: blocks 5..9, then 10..16.
        let (again, _) = n.grant(8, 10 * 128, 128).unwrap();
        assert_eq!(
            again,
            vec![(start + 5 * 128, 4 * 128), (start + 10 * 128, 6 * 128)]
        );
        assert_eq!(
            n.read(start, 8).unwrap(),
            b"RKxxxxxx",
            "a written block stays"
        );
    }

    #[test]
    fn blocks_given_back_are_nobodys_and_come_out_zeroed() {
        let n = MemoryNode::new(1, 1 << 20);
        n.set_grant_lease(LEASE);
        let (runs, _) = n.grant(7, 8 * 64, 64).unwrap();
        let (start, _) = runs[0];
        for b in 0..8 {
            n.write(start + b * 64, &[0xab; 64]).unwrap();
        }
        // Another holder gives back blocks 2 and 3 of holder 7's grant (it
        // unlinked them); they are cut out of 7's piece.
        n.give_back_as(9, 64, &[(start + 2 * 64, 128)], Duration::ZERO)
            .unwrap();
        let (taken, _) = n.grant(9, 128, 64).unwrap();
        assert_eq!(taken, vec![(start + 2 * 64, 128)]);
        for b in [2, 3] {
            let block = n.read(start + b * 64, 64).unwrap();
            assert_eq!(&block[..8], &[0; 8], "first word zeroed");
            assert_eq!(&block[8..], &[0xab; 56][..], "the rest untouched");
        }
        // Holder 9 writes nothing and dies with 7: 7's blocks were all
        // written, so only 9's two blocks come back, though they lie in
        // 7's old grant.
        past_lease();
        assert_eq!(n.reclaim_expired(), 128);
        let s = n.stats();
        assert_eq!(s.holders.ended, 2);
        assert_eq!(s.holders.pieces, 0);
    }

    #[test]
    fn a_dead_holder_is_taken_back_a_chunk_per_request_and_a_block_handed_out_meanwhile_stays_out()
    {
        use super::TAKEBACK_CHUNK_BLOCKS as CHUNK;
        let n = MemoryNode::new(1, 4 << 20);
        n.set_grant_lease(LEASE);
        // Holder 7: five chunks of 64-byte blocks, all written (linked).
        let (runs, _) = n.grant(7, 5 * CHUNK * 64, 64).unwrap();
        let (start, _) = runs[0];
        for b in 0..5 * CHUNK {
            n.write(start + b * 64, b"RKlinked").unwrap();
        }
        past_lease();
        // Holder 9's first request ends 7's record and reads one chunk.
        n.renew(9).unwrap();
        let s = n.stats().holders;
        assert_eq!(s.ended, 1);
        assert_eq!(s.doomed, 4 * CHUNK * 64, "one chunk read, four left");
        // Before the node reads the rest (each request reads one chunk),
        // holder 9 unlinks a block of the last chunk and gives it back; the
        // pool hands it out again with its first word zeroed, to holder 10.
        let late = start + (5 * CHUNK - 5) * 64;
        n.give_back_as(9, 64, &[(late, 64)], Duration::ZERO)
            .unwrap();
        let (again, _) = n.grant(10, 64, 64).unwrap();
        assert_eq!(again, vec![(late, 64)]);
        assert_eq!(n.read(late, 8).unwrap(), [0; 8]);
        assert_eq!(n.stats().holders.doomed, 2 * CHUNK * 64 - 64);
        // The rest is read: every block was written, nothing comes back,
        // and the block holder 10 holds is not taken back under it.
        assert_eq!(n.reclaim_expired(), 0);
        assert_eq!(n.stats().holders.doomed, 0);
        assert_eq!(n.stats().pool.pooled, 0);
        // Holder 10 dies without writing: now it comes back, once.
        past_lease();
        assert_eq!(n.reclaim_expired(), 64);
        assert_eq!(n.stats().pool.pooled, 64);
    }

    #[test]
    fn renewals_keep_a_holder_alive_and_a_new_record_has_a_new_generation() {
        let n = MemoryNode::new(1, 1 << 20);
        n.set_grant_lease(LEASE);
        let (_, first) = n.grant(7, 4096, 64).unwrap();
        for _ in 0..4 {
            std::thread::sleep(LEASE / 3);
            assert_eq!(n.renew(7).unwrap(), first);
        }
        assert_eq!(n.reclaim_expired(), 0);
        past_lease();
        assert_eq!(n.reclaim_expired(), 4096);
        assert!(n.renew(7).unwrap().generation > first.generation);
        n.set_down(true);
        assert!(n.renew(7).is_err());
    }
}
