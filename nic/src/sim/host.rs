//! Which node of a host a WR reaches: a host's nodes share its GID (see the
//! fabric's docs), so a WR to the host's GID goes to the live node of the
//! host that has its destination QP number, and a host node skips the QP
//! numbers another live node of its host has. A node picks and publishes a
//! number holding its host's numbering lock ([`NumberingLock`]), so that
//! two processes of a host never pick one number at the same time.

use super::ctl::{self, QpEntry};
use super::fabric::{FabricInner, MAX_NODES};
use super::shm::Segment;
use rustix::fs::{flock, FlockOperation};
use std::fs::File;
use std::sync::Arc;

/// The host-wide lock a node of a host holds while it picks a QP number
/// and publishes its QP: an exclusive `flock` of `host-<id>.qpn.lock` in
/// the fabric's directory, which the kernel drops with a process that dies
/// holding it. Unlocked when dropped.
#[derive(Debug)]
pub(crate) struct NumberingLock(File);

impl NumberingLock {
    /// Waits for host `host`'s numbering lock; `None` for a fabric without
    /// a directory (its hosts live in one process: the node's allocation
    /// lock orders them) or a lock file that cannot be opened (numbers are
    /// then left to the check alone, as before).
    pub(crate) fn take(f: &FabricInner, host: u32) -> Option<NumberingLock> {
        let path = f.dir()?.join(format!("host-{host:08x}.qpn.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok()?;
        flock(&file, FlockOperation::LockExclusive).ok()?;
        Some(NumberingLock(file))
    }
}

impl Drop for NumberingLock {
    fn drop(&mut self) {
        let _ = flock(&self.0, FlockOperation::Unlock);
    }
}

/// The live node on host `host` whose QP `qpn` exists: `(slot, generation,
/// control block)`.
pub(crate) fn node_of(f: &FabricInner, host: u32, qpn: u32) -> Option<(u32, u32, Arc<Segment>)> {
    f.host_nodes(host, MAX_NODES).find_map(|(slot, gen)| {
        let ctl_seg = f.open_segment(&FabricInner::seg_name(slot, gen, "ctl"))?;
        (ctl::valid(&ctl_seg) && QpEntry::by_qpn(&ctl_seg, qpn).is_some())
            .then_some((slot, gen, ctl_seg))
    })
}

/// Whether a live node of host `host` other than slot `except` has a QP
/// numbered `qpn`.
pub(crate) fn has_qpn(f: &FabricInner, host: u32, except: u32, qpn: u32) -> bool {
    f.host_nodes(host, except).any(|(slot, gen)| {
        f.open_segment(&FabricInner::seg_name(slot, gen, "ctl"))
            .is_some_and(|c| QpEntry::by_qpn(&c, qpn).is_some())
    })
}
