//! Leases for attached processes: a lease on a process's region is made
//! by the daemon's engine (`OwnedMr::lease`: a key of the device's own
//! over the range, deregistered when revoked or at expiry), so the NIC
//! enforces it as in-process. Each live lease holds a key of the device:
//! a process holds at most `DaemonConfig::max_leases`. A region the
//! process frees while leased stays registered until its leases end
//! (`Client::retired`, counted in the process's quotas); a process that
//! goes has all its leases revoked (see `host`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::{Access, Nic};

use super::host_state::{prune_retired, refuse, Client, Shared};
use super::wire::{RefuseCode, Reply, Request};
use crate::engine::LeaseId;
use crate::engine::OwnedMr;

/// The process's lease requests ([`Request::Lease`] and after).
pub(super) fn handle<N: Nic>(s: &Arc<Shared<N>>, c: &Arc<Client<N>>, req: &Request) -> Reply {
    let mr_of = |h: u32| -> Option<OwnedMr<N>> {
        c.mrs
            .lock()
            .iter()
            .find(|(handle, _)| *handle == h)
            .map(|(_, e)| e.mr.clone())
    };
    let unknown = |h: u32| {
        refuse(
            RefuseCode::UnknownHandle,
            format!("no region {h} of this process"),
        )
    };
    match req {
        Request::Lease {
            mr,
            offset,
            len,
            access,
            ttl_ms,
        } => {
            let Some(m) = mr_of(*mr) else {
                return unknown(*mr);
            };
            prune_retired(c);
            let now = Instant::now();
            let live: usize = c
                .mrs
                .lock()
                .iter()
                .map(|(_, e)| e.mr.live_leases(now))
                .sum::<usize>()
                + c.retired
                    .lock()
                    .iter()
                    .map(|e| e.mr.live_leases(now))
                    .sum::<usize>();
            if live >= s.cfg.max_leases as usize {
                return refuse(
                    RefuseCode::Quota,
                    format!("{} live leases per process", s.cfg.max_leases),
                );
            }
            let Some(expires_at) = now.checked_add(Duration::from_millis(*ttl_ms)) else {
                return refuse(
                    RefuseCode::BadRequest,
                    format!("a lease of {ttl_ms} ms ends past the clock's range"),
                );
            };
            match m.lease(*offset, *len, Access(*access), expires_at) {
                Ok(l) => Reply::Leased {
                    id: l.id.0,
                    rkey: l.rkey,
                    addr: l.grant.addr,
                },
                Err(e) => refuse(RefuseCode::Engine, format!("lease: {e}")),
            }
        }
        Request::Revoke { mr, id } => match mr_of(*mr) {
            None => unknown(*mr),
            Some(m) => Reply::Flag(m.revoke(LeaseId(*id))),
        },
        Request::RevokeLeases { mr } => match mr_of(*mr) {
            None => unknown(*mr),
            Some(m) => Reply::Count(m.revoke_all() as u64),
        },
        Request::LiveLeases { mr } => match mr_of(*mr) {
            None => unknown(*mr),
            Some(m) => Reply::Count(m.live_leases(Instant::now()) as u64),
        },
        _ => refuse(RefuseCode::BadRequest, "not a lease request"),
    }
}
