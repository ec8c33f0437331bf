//! An attached process's messaging: endpoints and ports that live in the
//! daemon's engine, each push, pop and reply one control call (see the
//! module docs of `super`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::Gid;

use super::client::{unexpected, Attached, Conn};
use super::error::DaemonError;
use super::wire::{MsgFailure, RefuseCode, Reply, Request, MAX_MSG_BYTES};
use crate::engine::MsgError;
use crate::msg::RefuseCode as MsgRefuseCode;

impl Conn {
    /// One messaging call: the daemon's answer, its `MsgFailed` as the
    /// in-process endpoint's or port's error, a failed call as
    /// [`MsgError::Daemon`].
    pub(super) fn msg_call(&self, req: &Request) -> Result<Reply, MsgError> {
        match self.call(req) {
            Ok((Reply::MsgFailed(f), _)) => Err(f.into()),
            Ok((reply, _)) => Ok(reply),
            Err(e) => Err(msg_err(e)),
        }
    }

    /// The longest a messaging call waits in the daemon (ms, at least 1):
    /// `wait`, at most half the control bound.
    pub(super) fn cap(&self, wait: Duration) -> u64 {
        let ms = wait.min(self.timeout / 2).as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX).max(1)
    }
}

/// A messaging endpoint of an attached process, living in the daemon's
/// engine (see [`Attached::endpoint`]): pushes go out and replies come
/// back through the control socket, one call each (messaging on this path
/// is for requests such as a store's block allocation, not for bulk data:
/// at most [`MAX_MSG_BYTES`] per message). A call that waits (a push for
/// a credit, a pop for a reply) holds the process's control connection
/// meanwhile, and waits at most half the attachment's control bound.
/// Released (in the daemon) when dropped.
pub struct AttachedEndpoint {
    conn: Arc<Conn>,
    ep: u32,
    id: u32,
}

impl std::fmt::Debug for AttachedEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedEndpoint")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for AttachedEndpoint {
    fn drop(&mut self) {
        let _ = self.conn.call(&Request::DestroyEndpoint { ep: self.ep });
    }
}

/// A control call's failure in messaging's terms.
fn msg_err(e: DaemonError) -> MsgError {
    MsgError::Daemon(Box::new(e))
}

impl From<MsgFailure> for MsgError {
    fn from(f: MsgFailure) -> MsgError {
        match f {
            MsgFailure::Refused { gid, port, code } => match MsgRefuseCode::from_u8(code) {
                Some(code) => MsgError::Refused { gid, port, code },
                None => msg_err(DaemonError::Refused {
                    code: RefuseCode::Engine,
                    message: format!("{gid} port {port}: refusal code {code}"),
                }),
            },
            MsgFailure::TooLarge { len, max } => MsgError::TooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max: usize::try_from(max).unwrap_or(usize::MAX),
            },
            MsgFailure::WouldBlock => MsgError::WouldBlock,
            MsgFailure::Timeout(ns) => MsgError::Timeout(Duration::from_nanos(ns)),
            MsgFailure::Lost {
                gid,
                port,
                seq,
                status,
            } => MsgError::Lost {
                gid,
                port,
                seq,
                status: krcore_nic::WcStatus::from_u8(status),
            },
            MsgFailure::ReplyLost {
                gid,
                vqp,
                seq,
                status,
            } => MsgError::ReplyLost {
                to: crate::engine::Sender { gid, vqp },
                seq,
                status: krcore_nic::WcStatus::from_u8(status),
            },
            MsgFailure::PortInUse { port } => MsgError::PortInUse { port },
            MsgFailure::ReservedPort { port } => MsgError::ReservedPort { port },
            MsgFailure::NoBuffers { wanted, free } => MsgError::NoBuffers { wanted, free },
            MsgFailure::Unsupported(message) => msg_err(DaemonError::Refused {
                code: RefuseCode::Unsupported,
                message,
            }),
            MsgFailure::Other(message) => msg_err(DaemonError::Refused {
                code: RefuseCode::Engine,
                message,
            }),
        }
    }
}

impl Attached {
    /// A messaging endpoint whose channels ask for `window` credits (see
    /// `Engine::endpoint_with_window`), in the daemon's engine.
    ///
    /// # Errors
    /// [`MsgError::Daemon`]: a quota ([`DaemonConfig::max_endpoints`](super::DaemonConfig)),
    /// the engine's refusal, the daemon gone.
    pub fn endpoint(&self, window: u32) -> Result<AttachedEndpoint, MsgError> {
        match self.conn.call(&Request::CreateEndpoint { window }) {
            Ok((Reply::Endpoint { ep, id }, _)) => Ok(AttachedEndpoint {
                conn: self.conn.clone(),
                ep,
                id,
            }),
            Ok(_) => Err(unexpected_msg("a CreateEndpoint")),
            Err(e) => Err(msg_err(e)),
        }
    }
}

/// An answer of the wrong kind to a messaging request.
fn unexpected_msg(what: &str) -> MsgError {
    msg_err(unexpected(what))
}

impl AttachedEndpoint {
    /// The endpoint's id in the daemon's engine (its messages' sender id).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Pushes `data` to `port` at `gid`, waiting up to `wait` for a credit
    /// (`None`: not at all, [`MsgError::WouldBlock`]).
    ///
    /// # Errors
    /// As the in-process endpoint's push ([`MsgError::Refused`],
    /// [`MsgError::TooLarge`] past [`MAX_MSG_BYTES`], [`MsgError::Timeout`],
    /// [`MsgError::Lost`], ...); [`MsgError::Daemon`].
    pub fn push(
        &self,
        gid: Gid,
        port: u16,
        data: &[u8],
        wait: Option<Duration>,
    ) -> Result<(), MsgError> {
        if data.len() > MAX_MSG_BYTES {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: MAX_MSG_BYTES,
            });
        }
        let req = Request::Push {
            ep: self.ep,
            gid,
            port,
            wait_ms: wait.map_or(0, |w| self.conn.cap(w)),
            data: data.to_vec(),
        };
        match self.conn.msg_call(&req)? {
            Reply::Done => Ok(()),
            _ => Err(unexpected_msg("a Push")),
        }
    }

    /// Pops a reply, waiting up to `wait` (`None`: not at all): `Ok(None)`
    /// when none came.
    ///
    /// # Errors
    /// As the in-process endpoint's; [`MsgError::Daemon`].
    pub fn pop_reply(&self, wait: Option<Duration>) -> Result<Option<Received>, MsgError> {
        sliced_pop(&self.conn, wait, |wait_ms| Request::PopReply {
            ep: self.ep,
            wait_ms,
        })
    }

    /// Closes the channel to (`gid`, `port`) if it is idle; whether it was.
    ///
    /// # Errors
    /// As the in-process endpoint's; [`MsgError::Daemon`].
    pub fn close_channel(&self, gid: Gid, port: u16) -> Result<bool, MsgError> {
        let req = Request::CloseChannel {
            ep: self.ep,
            gid,
            port,
        };
        self.flag_call(&req, "a CloseChannel")
    }

    /// Starts opening the channel to (`gid`, `port`) in the daemon without
    /// waiting for the port's answer: `Ok(true)` once it is open
    /// (`Endpoint::open_ahead` in the daemon's engine).
    ///
    /// # Errors
    /// As the engine's `open_ahead` (a refused Open, ...), and
    /// [`MsgError::Daemon`] when the daemon cannot be asked.
    pub fn open_ahead(&self, gid: Gid, port: u16) -> Result<bool, MsgError> {
        let req = Request::OpenAhead {
            ep: self.ep,
            gid,
            port,
        };
        self.flag_call(&req, "an OpenAhead")
    }

    /// Sends `data` without waiting, when it can go (`Endpoint::push_ahead`
    /// in the daemon's engine: on a channel not open yet, its Open carries
    /// it): whether it went. One call, which waits for nothing.
    ///
    /// # Errors
    /// As the engine's `push_ahead` ([`MsgError::Refused`] for a refused
    /// Open, what it carried not delivered; [`MsgError::TooLarge`] past
    /// [`MAX_MSG_BYTES`], ...); [`MsgError::Daemon`].
    pub fn push_ahead(&self, gid: Gid, port: u16, data: &[u8]) -> Result<bool, MsgError> {
        if data.len() > MAX_MSG_BYTES {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: MAX_MSG_BYTES,
            });
        }
        let req = Request::PushAhead {
            ep: self.ep,
            gid,
            port,
            data: data.to_vec(),
        };
        self.flag_call(&req, "a PushAhead")
    }

    /// A channel request answered with a flag (`what` names it in the
    /// error for another answer).
    fn flag_call(&self, req: &Request, what: &'static str) -> Result<bool, MsgError> {
        match self.conn.msg_call(req)? {
            Reply::Flag(b) => Ok(b),
            _ => Err(unexpected_msg(what)),
        }
    }

    /// Credits of the channel to (`gid`, `port`) (`None` before it is
    /// open, or when the daemon cannot be asked).
    pub fn credits(&self, gid: Gid, port: u16) -> Option<u32> {
        let req = Request::Credits {
            ep: self.ep,
            gid,
            port,
        };
        match self.conn.msg_call(&req) {
            Ok(Reply::Credits(c)) => c,
            _ => None,
        }
    }
}

/// The longest one pop call waits in the daemon: a longer wait is made of
/// such calls, so the process's other threads get the control connection
/// between them.
const POP_SLICE: Duration = Duration::from_millis(20);

/// A pop waiting up to `wait` (`None`: not at all), in calls of at most
/// [`POP_SLICE`]: `Ok(None)` when nothing came.
fn sliced_pop(
    conn: &Conn,
    wait: Option<Duration>,
    req: impl Fn(u64) -> Request,
) -> Result<Option<Received>, MsgError> {
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        let left = deadline.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let slice = left.min(POP_SLICE);
        let wait_ms = match slice.as_millis() {
            0 if left.is_zero() => 0,
            ms => u64::try_from(ms).unwrap_or(u64::MAX).max(1),
        };
        match conn.msg_call(&req(wait_ms))? {
            Reply::Message {
                gid,
                vqp,
                port,
                seq,
                data,
            } => {
                return Ok(Some(Received {
                    gid,
                    vqp,
                    port,
                    seq,
                    data,
                }))
            }
            Reply::NoMessage if left <= slice => return Ok(None),
            Reply::NoMessage => {}
            _ => return Err(unexpected_msg("a pop")),
        }
    }
}

/// A port of the node bound by this process (see [`Attached::bind`]):
/// messages pushed to it are popped through the control socket, one call
/// each (a waiting pop in calls of at most 20 ms, so other threads of the
/// process are not held off the connection). Ports are the node's: while
/// this process holds one, another's bind of it is `PortInUse`. Unbound
/// (in the daemon) when dropped or when the process goes.
pub struct AttachedPort {
    conn: Arc<Conn>,
    handle: u32,
    port: u16,
}

impl std::fmt::Debug for AttachedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedPort")
            .field("port", &self.port)
            .finish()
    }
}

impl Drop for AttachedPort {
    fn drop(&mut self) {
        let _ = self.conn.call(&Request::UnbindPort {
            handle: self.handle,
        });
    }
}

impl Attached {
    /// Binds `port` of the node in the daemon's engine for this process
    /// (`reclaiming`: as `Engine::bind_reclaiming`, a full port takes back
    /// the slots of idle channels).
    ///
    /// # Errors
    /// As the engine's bind ([`MsgError::PortInUse`], also when another
    /// process holds it; [`MsgError::ReservedPort`];
    /// [`MsgError::NoBuffers`]; [`MsgError::Unsupported`] in RC fallback
    /// mode); [`MsgError::Daemon`] for a quota
    /// ([`DaemonConfig::max_ports`](super::DaemonConfig)) or the daemon gone.
    pub fn bind(&self, port: u16, reclaiming: bool) -> Result<AttachedPort, MsgError> {
        let req = Request::BindPort {
            port,
            reclaiming: u8::from(reclaiming),
        };
        match self.conn.msg_call(&req)? {
            Reply::Port { handle } => Ok(AttachedPort {
                conn: self.conn.clone(),
                handle,
                port,
            }),
            _ => Err(unexpected_msg("a BindPort")),
        }
    }
}

impl AttachedPort {
    /// The port number.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pops the oldest message, waiting up to `wait` (`None`: not at all):
    /// `Ok(None)` when none came.
    ///
    /// # Errors
    /// As the in-process port's pop; [`MsgError::Daemon`].
    pub fn pop(&self, wait: Option<Duration>) -> Result<Option<Received>, MsgError> {
        sliced_pop(&self.conn, wait, |wait_ms| Request::PopPort {
            handle: self.handle,
            wait_ms,
        })
    }

    /// Replies to the endpoint `vqp` of node `gid` (a popped message's
    /// sender), waiting up to `wait` for a reply credit.
    ///
    /// # Errors
    /// As the in-process port's reply ([`MsgError::TooLarge`] past
    /// [`MAX_MSG_BYTES`], [`MsgError::Timeout`], [`MsgError::ReplyLost`],
    /// [`MsgError::Refused`]); [`MsgError::Daemon`].
    pub fn reply(&self, gid: Gid, vqp: u32, data: &[u8], wait: Duration) -> Result<(), MsgError> {
        if data.len() > MAX_MSG_BYTES {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: MAX_MSG_BYTES,
            });
        }
        let req = Request::ReplyPort {
            handle: self.handle,
            gid,
            vqp,
            wait_ms: self.conn.cap(wait),
            data: data.to_vec(),
        };
        match self.conn.msg_call(&req)? {
            Reply::Done => Ok(()),
            _ => Err(unexpected_msg("a ReplyPort")),
        }
    }

    /// Returns now the credits of every message popped so far; the number
    /// sent back.
    ///
    /// # Errors
    /// As the in-process port's; [`MsgError::Daemon`].
    pub fn return_credits(&self) -> Result<u32, MsgError> {
        match self.conn.msg_call(&Request::ReturnCredits {
            handle: self.handle,
        })? {
            Reply::Count(n) => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
            _ => Err(unexpected_msg("a ReturnCredits")),
        }
    }

    /// Messages received and not popped yet.
    ///
    /// # Errors
    /// [`MsgError::Daemon`].
    pub fn queued(&self) -> Result<usize, MsgError> {
        match self.conn.msg_call(&Request::Queued {
            handle: self.handle,
        })? {
            Reply::Count(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => Err(unexpected_msg("a Queued")),
        }
    }
}

/// A message (or a reply) popped through the daemon, by value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The node that sent it.
    pub gid: Gid,
    /// The sender's id: a message's endpoint (reply to it), a reply's
    /// port VQP.
    pub vqp: u32,
    /// Its port.
    pub port: u16,
    /// The reply's sequence number in the channel.
    pub seq: u64,
    /// The body.
    pub data: Vec<u8>,
}
