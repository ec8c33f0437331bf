//! A cheap hasher for maps keyed by small trusted integers (lkeys, VQP ids)
//! on the data path, where SipHash's DoS resistance buys nothing (the keys
//! are chosen by this process's own NIC and engine) and costs tens of
//! nanoseconds per lookup.

use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci-multiplicative hashing: the product's high bits (which
/// hashbrown's control bytes use) mix every input bit; low bits still vary
/// for sequential ids.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Eight bytes per multiply (a GID is two), then the tail bytewise.
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for b in chunks.remainder() {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(K);
        }
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(K);
    }

    /// One multiply, like `write_u64` (the default would run the 8 bytes
    /// through `write`); slices (a GID's bytes) hash their length this way.
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The `BuildHasher` for [`IdHasher`].
pub(crate) type IdBuild = BuildHasherDefault<IdHasher>;

/// A `HashMap` keyed by small trusted integers.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, IdBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_small_ids_spread_over_high_bits() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096u32 {
            let mut h = IdHasher::default();
            h.write_u32(i);
            seen.insert(h.finish() >> 57);
        }
        assert_eq!(seen.len(), 128, "every control-byte value is used");
    }
}
