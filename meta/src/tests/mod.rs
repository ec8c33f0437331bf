//! Unit tests of the meta layer (kept out of the modules to keep files small).

mod entry;
mod mr_table;
mod registry;
mod requests;
mod stores;
mod table;
mod torn;
mod wire;

use krcore_nic::Gid;

/// A GID whose 16 bytes are derived from `n`.
pub(crate) fn gid(n: u64) -> Gid {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
    g[8..].copy_from_slice(&n.to_le_bytes());
    Gid(g)
}
