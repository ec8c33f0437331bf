//! Store membership for attached processes: a memory node attached to the
//! daemon joins its store through the daemon's engine
//! (`Engine::store_join`: the member's GID is the node's, as for a memory
//! node with an engine of its own). The process renews by joining again
//! (`krcore::Node::store_keep_joined` does, every third of the lease).
//!
//! Every attached process shares the node's GID, so the meta server cannot
//! tell them apart: the daemon does. A process leaves only what it joined,
//! and a membership another process of the node holds is refused (the
//! meta server would take the join as that member's renewal and replace
//! its record). The daemon leaves what a process joined when the process
//! goes, so a dead memory node's membership ends at once, not at its
//! lease's expiry. Store calls are serialized node-wide (they are rare:
//! a join and its renewals per memory node).

use std::sync::Arc;

use krcore_nic::Nic;

use super::host_state::{refuse, Client, Shared};
use super::wire::{RefuseCode, Reply, Request};
use crate::engine::EngineError;

/// Store memberships one process may hold.
pub(super) const MAX_STORES: usize = 16;

/// The process's store requests ([`Request::StoreJoin`], [`Request::StoreLeave`]).
pub(super) fn handle<N: Nic>(s: &Arc<Shared<N>>, c: &Arc<Client<N>>, req: &Request) -> Reply {
    let _serial = s.store_calls.lock();
    match req {
        Request::StoreJoin {
            store,
            id,
            record,
            lease_ms,
        } => {
            let mine = holds(c, store, *id);
            if !mine {
                if let Some(pid) = holder(s, store, *id) {
                    return refuse(
                        RefuseCode::BadRequest,
                        format!(
                            "member {id} of store {store} is held by process {pid} of this node"
                        ),
                    );
                }
                if c.stores.lock().len() >= MAX_STORES {
                    return refuse(
                        RefuseCode::Quota,
                        format!("{MAX_STORES} store memberships per process"),
                    );
                }
            }
            match s.engine.store_join(store, *id, record, *lease_ms) {
                Ok(_) => {
                    if !mine {
                        c.stores.lock().push((store.clone(), *id));
                    }
                    Reply::Done
                }
                Err(e) => refused(e),
            }
        }
        Request::StoreLeave { store, id } => {
            if !holds(c, store, *id) {
                return refuse(
                    RefuseCode::UnknownHandle,
                    format!("this process did not join store {store} as member {id}"),
                );
            }
            let left = s.engine.store_leave(store, *id);
            c.stores.lock().retain(|(n, i)| !(n == store && i == id));
            match left {
                Ok(_) => Reply::Done,
                Err(e) => refused(e),
            }
        }
        _ => refuse(RefuseCode::BadRequest, "not a store request"),
    }
}

/// The process went: leaves every store it joined (best effort: a failure
/// is logged, and the membership then ends at its lease's expiry).
pub(super) fn leave_all<N: Nic>(s: &Shared<N>, c: &Client<N>) {
    let _serial = s.store_calls.lock();
    for (store, id) in c.stores.lock().drain(..) {
        match s.engine.store_leave(&store, id) {
            Ok(_) => tracing::info!(
                pid = c.pid,
                store,
                id,
                "left the store of a process that went"
            ),
            Err(e) => {
                tracing::warn!(pid = c.pid, store, id, reason = %e, "leaving the store of a process that went failed (its lease will expire)")
            }
        }
    }
}

fn holds<N: Nic>(c: &Client<N>, store: &str, id: u16) -> bool {
    c.stores.lock().iter().any(|(n, i)| n == store && *i == id)
}

/// The pid of another attached process holding `store`'s member `id`.
fn holder<N: Nic>(s: &Shared<N>, store: &str, id: u16) -> Option<u32> {
    s.clients
        .read()
        .iter()
        .find(|c| holds(c, store, id))
        .map(|c| c.pid)
}

/// The meta server's refusal keeps its code; anything else is the
/// engine's words.
fn refused(e: EngineError) -> Reply {
    match e {
        EngineError::MetaRefused { code, .. } => Reply::MetaRefused {
            code: code.to_u16(),
        },
        e => refuse(RefuseCode::Engine, e.to_string()),
    }
}
