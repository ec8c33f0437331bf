//! Which node of a host a WR reaches: a host's nodes share its GID (see the
//! fabric's docs), so a WR to the host's GID goes to the live node of the
//! host that has its destination QP number, and a host node skips the QP
//! numbers another live node of its host has.

use super::ctl::{self, QpEntry};
use super::fabric::{FabricInner, MAX_NODES};
use super::shm::Segment;
use std::sync::Arc;

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
