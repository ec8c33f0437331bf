//! Messaging for attached processes: each process's endpoints and ports
//! live in the daemon's engine (its DCT receives their messages and
//! replies) and are driven by the process's control thread, one request
//! at a time: a push waits for a credit (a pop for a message) on that
//! thread only, so one process's slow peer stalls no other process.
//! Ports are the node's: a port one process holds is `PortInUse` for the
//! others until it unbinds or goes. Released with the process.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use krcore_nic::Nic;

use super::host_state::{refuse, Client, EpSlot, PortSlot, Shared};
use super::wire::{MsgFailure, RefuseCode, Reply, Request, MAX_RECV_BYTES};
use crate::engine::{Message, MsgError, Sender};

/// The longest a push or a pop waits in the daemon, whatever the process
/// asks (its own control thread waits; this bounds how long a stopped
/// daemon takes to notice the process is gone).
const MAX_WAIT: Duration = Duration::from_secs(60);

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
        MsgError::ReplyLost { to, seq, status } => MsgFailure::ReplyLost {
            gid: to.gid,
            vqp: to.vqp,
            seq: *seq,
            status: *status as u8,
        },
        MsgError::PortInUse { port } => MsgFailure::PortInUse { port: *port },
        MsgError::ReservedPort { port } => MsgFailure::ReservedPort { port: *port },
        MsgError::NoBuffers { wanted, free } => MsgFailure::NoBuffers {
            wanted: *wanted,
            free: *free,
        },
        MsgError::Unsupported { reason } => MsgFailure::Unsupported((*reason).to_string()),
        other => MsgFailure::Other(other.to_string()),
    }
}

/// A messaging failure as the reply that carries it.
fn failed(e: MsgError) -> Reply {
    Reply::MsgFailed(failure(&e))
}

/// A popped message or reply as the process gets it (one longer than
/// [`MAX_RECV_BYTES`] cannot be carried: `TooLarge`, counted as consumed).
fn delivered<N: Nic>(m: Result<Option<Message<N>>, MsgError>) -> Reply {
    match m {
        Ok(None) => Reply::NoMessage,
        Ok(Some(m)) if m.len() > MAX_RECV_BYTES => failed(MsgError::TooLarge {
            len: m.len(),
            max: MAX_RECV_BYTES,
        }),
        Ok(Some(m)) => Reply::Message {
            gid: m.from.gid,
            vqp: m.from.vqp,
            port: m.port,
            seq: m.seq,
            data: m.to_vec(),
        },
        Err(err) => failed(err),
    }
}

/// A pop that waits `wait_ms` (0: not at all); a timeout is no message.
fn pop_within<N: Nic>(
    wait_ms: u64,
    try_pop: impl FnOnce() -> Result<Option<Message<N>>, MsgError>,
    pop_timeout: impl FnOnce(Duration) -> Result<Message<N>, MsgError>,
) -> Reply {
    delivered(match wait_ms {
        0 => try_pop(),
        ms => match pop_timeout(wait(ms)) {
            Ok(m) => Ok(Some(m)),
            Err(MsgError::Timeout(_)) => Ok(None),
            Err(err) => Err(err),
        },
    })
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
    match req {
        Request::CreateEndpoint { window } => {
            if c.endpoints.lock().len() >= s.cfg.max_endpoints as usize {
                return refuse(
                    RefuseCode::Quota,
                    format!(
                        "{} endpoints per process (krcored --max-endpoints)",
                        s.cfg.max_endpoints
                    ),
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
            Some(e) => pop_within(*wait_ms, || e.try_pop_reply(), |d| e.pop_reply_timeout(d)),
        },
        Request::CloseChannel { ep, gid, port } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => match e.close_channel(*gid, *port) {
                Ok(b) => Reply::Flag(b),
                Err(err) => failed(err),
            },
        },
        Request::OpenAhead { ep, gid, port } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => match e.open_ahead(*gid, *port) {
                Ok(b) => Reply::Flag(b),
                Err(err) => failed(err),
            },
        },
        Request::PushAhead {
            ep,
            gid,
            port,
            data,
        } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => match e.push_ahead(*gid, *port, data) {
                Ok(b) => Reply::Flag(b),
                Err(err) => failed(err),
            },
        },
        Request::Credits { ep, gid, port } => match ep_of(*ep) {
            None => unknown(*ep),
            Some(e) => Reply::Credits(e.credits(*gid, *port)),
        },
        _ => handle_port(s, c, req),
    }
}

/// The process's port requests ([`Request::BindPort`] and after).
fn handle_port<N: Nic>(s: &Arc<Shared<N>>, c: &Arc<Client<N>>, req: &Request) -> Reply {
    let port_of = |h: u32| {
        c.ports
            .lock()
            .iter()
            .find(|p| p.handle == h)
            .map(|p| p.port.clone())
    };
    let unknown = |h: u32| {
        refuse(
            RefuseCode::UnknownHandle,
            format!("no port {h} of this process"),
        )
    };
    match req {
        Request::BindPort { port, reclaiming } => {
            if c.ports.lock().len() >= s.cfg.max_ports as usize {
                return refuse(
                    RefuseCode::Quota,
                    format!("{} ports per process", s.cfg.max_ports),
                );
            }
            let bound = match reclaiming {
                0 => s.engine.bind(*port),
                _ => s.engine.bind_reclaiming(*port),
            };
            match bound {
                Ok(p) => {
                    let handle = c.next_handle.fetch_add(1, Ordering::Relaxed);
                    c.ports.lock().push(PortSlot {
                        handle,
                        port: Arc::new(p),
                    });
                    Reply::Port { handle }
                }
                Err(e) => failed(e),
            }
        }
        Request::UnbindPort { handle } => {
            // Dropped outside the list's lock: unbinding takes the
            // engine's port table.
            let gone = {
                let mut ports = c.ports.lock();
                let at = ports.iter().position(|p| p.handle == *handle);
                at.map(|i| ports.swap_remove(i))
            };
            match gone {
                Some(_) => Reply::Done,
                None => unknown(*handle),
            }
        }
        Request::PopPort { handle, wait_ms } => match port_of(*handle) {
            None => unknown(*handle),
            Some(p) => pop_within(*wait_ms, || p.try_pop(), |d| p.pop_timeout(d)),
        },
        Request::ReplyPort {
            handle,
            gid,
            vqp,
            wait_ms,
            data,
        } => match port_of(*handle) {
            None => unknown(*handle),
            Some(p) => {
                let to = Sender {
                    gid: *gid,
                    vqp: *vqp,
                };
                match p.reply_within(to, data, wait(*wait_ms)) {
                    Ok(()) => Reply::Done,
                    Err(e) => failed(e),
                }
            }
        },
        Request::ReturnCredits { handle } => match port_of(*handle) {
            None => unknown(*handle),
            Some(p) => match p.return_credits() {
                Ok(n) => Reply::Count(u64::from(n)),
                Err(e) => failed(e),
            },
        },
        Request::Queued { handle } => match port_of(*handle) {
            None => unknown(*handle),
            Some(p) => Reply::Count(p.queued() as u64),
        },
        _ => refuse(RefuseCode::BadRequest, "not a messaging request"),
    }
}

/// A process's wait, bounded by [`MAX_WAIT`].
fn wait(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_WAIT)
}
