//! [`TableMemory`] over a registered memory region: the table lives in the
//! MR that clients READ, and every engine write lands there directly.

use crate::table::TableMemory;
use krcore_nic::MemoryRegion;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The meta table's memory: a registered region, written one aligned word at
/// a time with the region's atomic [`MemoryRegion::store_u64`] (release
/// ordering), so a [`crate::table::SeqlockWrite`] becomes visible to a remote
/// READ store by store, in order, and a READ racing it sees the old entry,
/// the new one, or a torn one it can detect.
///
/// Invariants: the engine only stores whole 8-byte words at 8-byte aligned
/// offsets inside `len_bytes()` (the [`TableMemory`] contract). A store or
/// load the region refuses (outside it, which the contract rules out) does
/// not panic: it is skipped (a load yields 0) and counted in
/// [`MrTable::faults`], which a healthy server keeps at 0.
pub struct MrTable<R: MemoryRegion> {
    mr: R,
    faults: AtomicU64,
}

impl<R: MemoryRegion> std::fmt::Debug for MrTable<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrTable")
            .field("addr", &format_args!("{:#x}", self.mr.addr()))
            .field("len", &self.mr.len())
            .field("rkey", &format_args!("{:#x}", self.mr.rkey()))
            .field("faults", &self.faults())
            .finish()
    }
}

impl<R: MemoryRegion> MrTable<R> {
    /// The table memory over all of `mr`.
    pub fn new(mr: R) -> MrTable<R> {
        MrTable {
            mr,
            faults: AtomicU64::new(0),
        }
    }

    /// The region.
    pub fn mr(&self) -> &R {
        &self.mr
    }

    /// Loads and stores the region refused (0 unless the contract was broken).
    pub fn faults(&self) -> u64 {
        self.faults.load(Relaxed)
    }

    fn fault(&self) {
        self.faults.fetch_add(1, Relaxed);
    }
}

impl<R: MemoryRegion> TableMemory for MrTable<R> {
    fn len_bytes(&self) -> usize {
        self.mr.len()
    }

    fn load_u64(&self, offset: usize) -> u64 {
        // The region's words are native-endian; the image is little-endian.
        match self.mr.load_u64(offset) {
            Ok(w) => u64::from_le(w),
            Err(_) => {
                self.fault();
                0
            }
        }
    }

    fn store_u64(&mut self, offset: usize, value: u64) {
        if self.mr.store_u64(offset, value.to_le()).is_err() {
            self.fault();
        }
    }

    fn read_words(&self, offset: usize, buf: &mut [u8]) {
        // One copy out of the region instead of a load per word. The image
        // is little-endian, as the region stores it.
        if self.mr.read(offset, buf).is_err() {
            self.fault();
            buf.fill(0);
        }
    }
}
