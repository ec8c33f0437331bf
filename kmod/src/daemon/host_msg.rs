//! Messaging for attached processes: each process's endpoints live in the
//! daemon's engine (its DCT receives their replies) and are driven by the
//! process's control thread, one request at a time: a push waits for a
//! credit on that thread only, so one process's slow receiver stalls no
//! other process. Released with the process.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use krcore_nic::Nic;

use super::host::{refuse, Client, Shared};
use super::wire::{MsgFailure, RefuseCode, Reply, Request, MAX_MSG_BYTES};
use crate::engine::Endpoint;
use crate::MsgError;

/// The longest a push or a pop waits in the daemon, whatever the process
/// asks (its own control thread waits; this bounds how long a stopped
/// daemon takes to notice the process is gone).
const MAX_WAIT: Duration = Duration::from_secs(60);

/// One endpoint of an attached process.
pub(super) struct EpSlot<N: Nic> {
    pub(super) handle: u32,
    pub(super) ep: Arc<Endpoint<N>>,
}

/// A messaging failure as the process's library rebuilds it.
pub(crate) fn failure(e: &MsgError) -> MsgFailure {
    match e {
        MsgError::Refused { gid, port, code } => MsgFailure::Refused {
            gid: *gid,
            port: *port,
            code: code.to_u8(),
        },
        MsgError::TooLarge { len, max } => MsgFailure::TooLarge {
            len: *len as u64,
            max: *max as u64,
        },
        MsgError::WouldBlock => MsgFailure::WouldBlock,
        MsgError::Timeout(d) => {
            MsgFailure::Timeout(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        }
        MsgError::Lost {
            gid,
            port,
            seq,
            status,
        } => MsgFailure::Lost {
            gid: *gid,
            port: *port,
            seq: *seq,
            status: *status as u8,
        },
        other => MsgFailure::Other(other.to_string()),
    }
}

/// The process's messaging requests (see [`Request::CreateEndpoint`] and
/// after; any other is refused as a bad request).
pub(super) fn handle<N: Nic>(s: &Arc<Shared<N>>, c: &Arc<Client<N>>, req: &Request) -> Reply {
    let ep_of = |h: u32| {
        c.endpoints
            .lock()
            .iter()
            .find(|e| e.handle == h)
            .map(|e| e.ep.clone())
    };
    let unknown = |h: u32| {
        refuse(
            RefuseCode::UnknownHandle,
            format!("no endpoint {h} of this process"),
        )
    };
    let failed = |e: MsgError| Reply::MsgFailed(failure(&e));
    match req {
        Request::CreateEndpoint { window } => {
            if c.endpoints.lock().len() >= s.cfg.max_endpoints as usize {
                return refuse(
                    RefuseCode::Quota,
                    format!("{} endpoints per process", s.cfg.max_endpoints),
                );
            }
            match s.engine.endpoint_with_window(*window) {
                Ok(ep) => {
                    let handle = c.next_handle.fetch_add(1, Ordering::Relaxed);
                    let id = ep.id();
                    c.endpoints.lock().push(EpSlot {
                        handle,
                        ep: Arc::new(ep),
                    });
                    Reply::Endpoint { ep: handle, id }
                }
                Err(e) => refuse(RefuseCode::Engine, e.to_string()),
            }
        }
        Request::DestroyEndpoint { ep } => {
            let mut eps = c.endpoints.lock();
            let before = eps.len();
            eps.retain(|e| e.handle != *ep);
            if eps.len() == before {
                unknown(*ep)
            } else {
                Reply::Done
            }
        }
        Request::Push {
            ep,
            gid,
            port,
            wait_ms,
            data,
        } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => {
                let r = match wait_ms {
                    0 => e.try_push(*gid, *port, data),
                    ms => e.push_timeout(*gid, *port, data, wait(*ms)),
                };
                match r {
                    Ok(()) => Reply::Done,
                    Err(err) => failed(err),
                }
            }
        },
        Request::PopReply { ep, wait_ms } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => {
                let r = match wait_ms {
                    0 => e.try_pop_reply(),
                    ms => match e.pop_reply_timeout(wait(*ms)) {
                        Ok(m) => Ok(Some(m)),
                        Err(MsgError::Timeout(_)) => Ok(None),
                        Err(err) => Err(err),
                    },
                };
                match r {
                    Ok(None) => Reply::NoMessage,
                    Ok(Some(m)) if m.len() > MAX_MSG_BYTES => failed(MsgError::TooLarge {
                        len: m.len(),
                        max: MAX_MSG_BYTES,
                    }),
                    Ok(Some(m)) => Reply::Message {
                        gid: m.from.gid,
                        port: m.port,
                        seq: m.seq,
                        data: m.to_vec(),
                    },
                    Err(err) => failed(err),
                }
            }
        },
        Request::CloseChannel { ep, gid, port } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => match e.close_channel(*gid, *port) {
                Ok(b) => Reply::Flag(b),
                Err(err) => failed(err),
            },
        },
        Request::Credits { ep, gid, port } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => Reply::Credits(e.credits(*gid, *port)),
        },
        _ => refuse(RefuseCode::BadRequest, "not a messaging request"),
    }
}

/// A process's wait, bounded by [`MAX_WAIT`].
fn wait(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_WAIT)
}
