//! Two-sided messaging (DC mode over the DCT; RC fallback mode over the RC
//! pairs): a node binds ports and receives; a VQP
//! pushes to a port of its target node and gets the replies (after
//! KRCore's two-sided path and RDMAvisor's vQPN).
//!
//! - [`Node::bind`] returns a [`Port`]: `pop` the messages pushed to it
//!   (per-sender order), `reply` to their senders.
//! - [`Vqp::push`](crate::Vqp::push) sends to a port of the VQP's target node; replies come
//!   back to that VQP ([`Vqp::pop_reply`](crate::Vqp::pop_reply)). (The VQP pushes through its
//!   messaging [`Endpoint`], a VQP of the engine made at the first push:
//!   its id is the immediate data of the messages, [`Sender::vqp`].)
//! - Messages longer than `EngineConfig::msg.inline_max` (8 KiB by
//!   default) travel as a descriptor and are pulled by the receiver with
//!   one READ into a registered buffer ([`Message::region`]).
//!
//! # Flow control: what a slow receiver does to a sender
//!
//! Each (VQP, port) channel has `msg.window` credits. A push takes one; the
//! receiver returns them as its user pops. With no credit:
//! [`Vqp::push`](crate::Vqp::push) blocks (driving the engine) up to `msg.timeout` (5 s by
//! default) and then fails with [`MsgError::Timeout`]; [`Vqp::try_push`](crate::Vqp::try_push)
//! fails at once with [`MsgError::WouldBlock`]. Nothing is ever dropped
//! silently: a message is either accepted (and will be delivered once) or
//! refused with a typed error (`Refused { code: Unbound | Busy }`,
//! `TooLarge`, ...); an accepted message whose SEND then fails on the wire
//! (the target became unreachable) is reported by the VQP's next pushes as
//! [`MsgError::Lost`] with its sequence number (a port's reply, by the
//! port's next replies as [`MsgError::ReplyLost`]).
//!
//! ```
//! use krcore::{MsgError, Node};
//!
//! let server = Node::builder().fabric("sim:mem").host_meta().build()?;
//! let client = Node::builder().join(&server).build()?;
//! let port = server.bind(7)?;
//! let vqp = client.connect(server.gid())?;
//! vqp.push(7, b"ping")?;
//! let m = port.pop()?;
//! assert_eq!(m.to_vec(), b"ping");
//! port.reply(&m, b"pong")?;
//! assert_eq!(vqp.pop_reply()?.to_vec(), b"pong");
//! assert!(matches!(server.bind(7), Err(krcore::Error::Msg(MsgError::PortInUse { .. }))));
//! # Ok::<(), krcore::Error>(())
//! ```
//!
//! Not available in a forked worker ([`MsgError::Unsupported`]). Ports from
//! `krcore_kmod::engine::handshake_msg::FIRST_RESERVED_PORT` on are the engine's
//! ([`MsgError::ReservedPort`]).

use std::time::Duration;

use krcore_kmod::daemon::{AttachedEndpoint, AttachedPort};
use krcore_nic::{Gid, Nic};

use crate::error::{Error, Result};
use crate::node::{Backend, Node};

pub use krcore_kmod::msg::RefuseCode;
pub use krcore_kmod::{Message, MsgConfig, MsgError, MsgStats, Sender};

/// A messaging endpoint (pushes to any node's ports, pops their replies):
/// the engine's own in this process, or, on a node attached to `krcored`
/// ([`Node::attach`]), one living in the daemon's engine, reached through
/// the control socket (one call per push or pop; messages of at most
/// `krcore_kmod::daemon::wire::MAX_MSG_BYTES`). The same calls and errors
/// either way.
pub struct Endpoint<N: Nic> {
    inner: EndpointImpl<N>,
}

// Unboxed: an endpoint is made once and used for many pushes, so its size
// matters less than an indirection per call.
#[allow(clippy::large_enum_variant)]
enum EndpointImpl<N: Nic> {
    Local(krcore_kmod::Endpoint<N>),
    Attached(AttachedEndpoint),
}

impl<N: Nic> std::fmt::Debug for Endpoint<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id())
            .field("attached", &matches!(self.inner, EndpointImpl::Attached(_)))
            .finish()
    }
}

/// How long an attached endpoint's push waits for a credit, and a pop for
/// a reply, when the call names no bound: the engine's default
/// `msg.timeout`.
const ATTACHED_WAIT: Duration = Duration::from_secs(5);

impl<N: Nic> Endpoint<N> {
    pub(crate) fn local(e: krcore_kmod::Endpoint<N>) -> Endpoint<N> {
        Endpoint {
            inner: EndpointImpl::Local(e),
        }
    }

    /// The endpoint's id (its messages' sender id, [`Sender::vqp`]).
    pub fn id(&self) -> u32 {
        match &self.inner {
            EndpointImpl::Local(e) => e.id(),
            EndpointImpl::Attached(e) => e.id(),
        }
    }

    /// Pushes `data` to `port` at node `gid`, waiting up to `msg.timeout`
    /// for a credit (see the [module docs](crate::messaging)).
    ///
    /// # Errors
    /// [`MsgError`]: `Refused`, `TooLarge`, `Timeout`, `Lost`, ...; on an
    /// attached node also `Daemon`.
    pub fn push(&self, gid: Gid, port: u16, data: &[u8]) -> std::result::Result<(), MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.push(gid, port, data),
            EndpointImpl::Attached(e) => e.push(gid, port, data, Some(ATTACHED_WAIT)),
        }
    }

    /// [`Endpoint::push`] waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::push`].
    pub fn push_timeout(
        &self,
        gid: Gid,
        port: u16,
        data: &[u8],
        timeout: Duration,
    ) -> std::result::Result<(), MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.push_timeout(gid, port, data, timeout),
            EndpointImpl::Attached(e) => e.push(gid, port, data, Some(timeout)),
        }
    }

    /// Pushes without waiting for a credit ([`MsgError::WouldBlock`]).
    ///
    /// # Errors
    /// As [`Endpoint::push`].
    pub fn try_push(&self, gid: Gid, port: u16, data: &[u8]) -> std::result::Result<(), MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.try_push(gid, port, data),
            EndpointImpl::Attached(e) => e.push(gid, port, data, None),
        }
    }

    /// Pops the oldest reply, if one is there.
    ///
    /// # Errors
    /// [`MsgError`] of the receive path; on an attached node also `Daemon`.
    pub fn try_pop_reply(&self) -> std::result::Result<Option<Message<N>>, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.try_pop_reply(),
            EndpointImpl::Attached(e) => Ok(e.pop_reply(None)?.map(received)),
        }
    }

    /// Pops the oldest reply, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Endpoint::try_pop_reply`].
    pub fn pop_reply_timeout(
        &self,
        timeout: Duration,
    ) -> std::result::Result<Message<N>, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.pop_reply_timeout(timeout),
            EndpointImpl::Attached(e) => e
                .pop_reply(Some(timeout))?
                .map(received)
                .ok_or(MsgError::Timeout(timeout)),
        }
    }

    /// Pops the oldest reply, waiting up to `msg.timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::pop_reply_timeout`].
    pub fn pop_reply(&self) -> std::result::Result<Message<N>, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.pop_reply(),
            EndpointImpl::Attached(_) => self.pop_reply_timeout(ATTACHED_WAIT),
        }
    }

    /// Closes the channel to (`gid`, `port`) if it is idle (every credit
    /// back, no reply waiting); returns whether it did.
    ///
    /// # Errors
    /// [`MsgError::Refused`] for a channel the port refused with messages
    /// lost; send errors of the Close.
    pub fn close_channel(&self, gid: Gid, port: u16) -> std::result::Result<bool, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.close_channel(gid, port),
            EndpointImpl::Attached(e) => e.close_channel(gid, port),
        }
    }

    /// Starts opening the channel to (`gid`, `port`) without waiting for
    /// the port's node to answer: `Ok(true)` once it is open (a push then
    /// waits for no Open round trip), `Ok(false)` while the Open is out.
    /// For requests sent ahead of need (a memory node's allocation port):
    /// push once this says open. On an attached node the daemon's engine
    /// opens the channel (one call to the daemon, which does not wait for
    /// the port's answer either).
    ///
    /// # Errors
    /// [`MsgError::Refused`] for a refused Open (asked again by the next
    /// call), [`MsgError::NoBuffers`], engine and post errors; on an
    /// attached node also `Daemon`.
    pub fn open_ahead(&self, gid: Gid, port: u16) -> std::result::Result<bool, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.open_ahead(gid, port),
            EndpointImpl::Attached(e) => e.open_ahead(gid, port),
        }
    }

    /// Sends `data` to `port` at `gid` without waiting for anything, when
    /// it can go: `Ok(true)` when it went (on an open channel with a
    /// credit, as a push; on a channel not opened yet, carried by its
    /// Open, so that a request and its answer cost one round trip),
    /// `Ok(false)` when it must be asked again later (the Open is out, no
    /// credit is back, or the message is longer than `msg.inline_max` and
    /// only the Open went). A carried message is delivered at most once;
    /// a refused Open drops it (the error says so) and one never answered
    /// leaves it in doubt: for requests that may be asked again (a memory
    /// node's block allocations, matched to their answers by id). On an
    /// attached node one call to the daemon, which waits for nothing
    /// either.
    ///
    /// # Errors
    /// [`MsgError::Refused`] for a refused Open (its message not
    /// delivered) or a channel refused after it opened; `TooLarge`;
    /// `Lost` for a message lost earlier; `NoBuffers`; on an attached node
    /// also `Daemon`.
    pub fn push_ahead(
        &self,
        gid: Gid,
        port: u16,
        data: &[u8],
    ) -> std::result::Result<bool, MsgError> {
        match &self.inner {
            EndpointImpl::Local(e) => e.push_ahead(gid, port, data),
            EndpointImpl::Attached(e) => e.push_ahead(gid, port, data),
        }
    }

    /// The longest message a push takes (longer: [`MsgError::TooLarge`]):
    /// the engine's `msg.max_message` in this process;
    /// `krcore_kmod::daemon::wire::MAX_MSG_BYTES` (64 KiB) through the node
    /// daemon, whose control frames carry the messages.
    pub fn max_message(&self) -> usize {
        match &self.inner {
            EndpointImpl::Local(e) => e.max_message(),
            EndpointImpl::Attached(_) => krcore_kmod::daemon::wire::MAX_MSG_BYTES,
        }
    }

    /// Credits available now on the channel to (`gid`, `port`) (`None`
    /// before it is open).
    pub fn credits(&self, gid: Gid, port: u16) -> Option<u32> {
        match &self.inner {
            EndpointImpl::Local(e) => e.credits(gid, port),
            EndpointImpl::Attached(e) => e.credits(gid, port),
        }
    }

    /// The engine's endpoint, when it lives in this process (zero-copy
    /// pushes of a region, `push_region`, are there).
    pub fn local_endpoint(&self) -> Option<&krcore_kmod::Endpoint<N>> {
        match &self.inner {
            EndpointImpl::Local(e) => Some(e),
            EndpointImpl::Attached(_) => None,
        }
    }
}

fn received<N: Nic>(r: krcore_kmod::daemon::Received) -> Message<N> {
    Message::from_bytes(
        Sender {
            gid: r.gid,
            vqp: r.vqp,
        },
        r.port,
        r.seq,
        r.data,
    )
}

/// A bound port (see [`Node::bind`]): receives the messages pushed to it,
/// in per-sender order, and replies to their senders. The engine's own in
/// this process, or on a node attached to `krcored` one bound in the
/// daemon's engine and reached through the control socket (one call per
/// pop or reply; a reply of at most
/// `krcore_kmod::daemon::wire::MAX_MSG_BYTES`; ports are the node's, so a
/// port another process on the node holds is `PortInUse`). The same calls
/// and errors either way. Dropping it unbinds the port.
pub struct Port<N: Nic> {
    inner: PortImpl<N>,
}

// Unboxed, as `EndpointImpl`: bound once, popped from many times.
#[allow(clippy::large_enum_variant)]
enum PortImpl<N: Nic> {
    Local(krcore_kmod::Port<N>),
    Attached(AttachedPort),
}

impl<N: Nic> std::fmt::Debug for Port<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            PortImpl::Local(p) => p.fmt(f),
            PortImpl::Attached(p) => p.fmt(f),
        }
    }
}

impl<N: Nic> Port<N> {
    /// The port number.
    pub fn port(&self) -> u16 {
        match &self.inner {
            PortImpl::Local(p) => p.port(),
            PortImpl::Attached(p) => p.port(),
        }
    }

    /// Messages received and not popped yet (0 when the daemon of an
    /// attached node cannot be asked).
    pub fn queued(&self) -> usize {
        match &self.inner {
            PortImpl::Local(p) => p.queued(),
            PortImpl::Attached(p) => p.queued().unwrap_or(0),
        }
    }

    /// The oldest message, if any (non-blocking).
    ///
    /// # Errors
    /// [`MsgError`] of the receive path (see `krcore_kmod::Port::try_pop`);
    /// on an attached node also `Daemon`.
    pub fn try_pop(&self) -> std::result::Result<Option<Message<N>>, MsgError> {
        match &self.inner {
            PortImpl::Local(p) => p.try_pop(),
            PortImpl::Attached(p) => Ok(p.pop(None)?.map(received)),
        }
    }

    /// Pops the oldest message, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Port::try_pop`].
    pub fn pop_timeout(&self, timeout: Duration) -> std::result::Result<Message<N>, MsgError> {
        match &self.inner {
            PortImpl::Local(p) => p.pop_timeout(timeout),
            PortImpl::Attached(p) => p
                .pop(Some(timeout))?
                .map(received)
                .ok_or(MsgError::Timeout(timeout)),
        }
    }

    /// Pops the oldest message, waiting up to `msg.timeout` (5 s on an
    /// attached node).
    ///
    /// # Errors
    /// As [`Port::pop_timeout`].
    pub fn pop(&self) -> std::result::Result<Message<N>, MsgError> {
        match &self.inner {
            PortImpl::Local(p) => p.pop(),
            PortImpl::Attached(_) => self.pop_timeout(ATTACHED_WAIT),
        }
    }

    /// Replies to `to`'s sender, waiting up to `msg.timeout` for a reply
    /// credit.
    ///
    /// # Errors
    /// [`MsgError::TooLarge`], [`MsgError::Timeout`],
    /// [`MsgError::ReplyLost`], [`MsgError::Refused`]; engine and post
    /// errors; on an attached node also `Daemon`.
    pub fn reply(&self, to: &Message<N>, data: &[u8]) -> std::result::Result<(), MsgError> {
        self.reply_to(to.from, data)
    }

    /// Replies to `sender` (see [`Port::reply`]).
    ///
    /// # Errors
    /// As [`Port::reply`].
    pub fn reply_to(&self, sender: Sender, data: &[u8]) -> std::result::Result<(), MsgError> {
        match &self.inner {
            PortImpl::Local(p) => p.reply_to(sender, data),
            PortImpl::Attached(p) => p.reply(sender.gid, sender.vqp, data, ATTACHED_WAIT),
        }
    }

    /// Returns now the credits of every message popped so far (they go
    /// back in batches of half a channel's window otherwise); the credits
    /// sent back.
    ///
    /// # Errors
    /// Engine and post errors (the credits stay pending); on an attached
    /// node also `Daemon`.
    pub fn return_credits(&self) -> std::result::Result<u32, MsgError> {
        match &self.inner {
            PortImpl::Local(p) => p.return_credits(),
            PortImpl::Attached(p) => p.return_credits(),
        }
    }

    /// The engine's port, when it lives in this process.
    pub fn local_port(&self) -> Option<&krcore_kmod::Port<N>> {
        match &self.inner {
            PortImpl::Local(p) => Some(p),
            PortImpl::Attached(_) => None,
        }
    }
}

impl<N: Nic> Node<N> {
    /// Binds `port` on this node (see the [module docs](crate::messaging)). On
    /// an attached node the port is bound in the daemon's engine: ports
    /// are the node's, shared by every process attached to it.
    ///
    /// # Errors
    /// [`crate::Error::Msg`]: `PortInUse`, `ReservedPort`, `NoBuffers`,
    /// `Unsupported` (RC fallback mode, a forked worker); on an attached
    /// node also `Daemon` (a quota, the daemon gone).
    pub fn bind(&self, port: u16) -> Result<Port<N>> {
        self.bind_with(port, false)
    }

    /// [`Node::bind`] for a service that any number of short-lived clients
    /// call over time (a memory node's allocator): when all of the port's
    /// slots are granted, an Open takes back the slot of a channel idle
    /// for `msg.control_idle` (see `krcore_kmod::Engine::bind_reclaiming`).
    ///
    /// # Errors
    /// As [`Node::bind`].
    pub fn bind_reclaiming(&self, port: u16) -> Result<Port<N>> {
        self.bind_with(port, true)
    }

    /// [`Node::bind_reclaiming`] with `slots` receive slots instead of
    /// `msg.port_slots` (see `krcore_kmod::Engine::bind_reclaiming_with`):
    /// a service that many clients reach at once sizes its port for them.
    ///
    /// # Errors
    /// As [`Node::bind`]; [`crate::MsgError::NoBuffers`] (with what is
    /// free) when the node's receive budget is smaller;
    /// [`Error::Unsupported`] on an attached node (its ports have the
    /// daemon's `msg.port_slots`: size them in `krcored`'s configuration).
    pub fn bind_reclaiming_with(&self, port: u16, slots: u32) -> Result<Port<N>> {
        let inner = match self.backend() {
            Backend::Engine(e) => PortImpl::Local(e.bind_reclaiming_with(port, slots)?),
            Backend::Daemon(_) => {
                return Err(Error::Unsupported(
                    "a port's own slot count through the node daemon (its ports have the daemon's msg.port_slots)",
                ))
            }
        };
        Ok(Port { inner })
    }

    fn bind_with(&self, port: u16, reclaiming: bool) -> Result<Port<N>> {
        let inner = match self.backend() {
            Backend::Engine(e) if reclaiming => PortImpl::Local(e.bind_reclaiming(port)?),
            Backend::Engine(e) => PortImpl::Local(e.bind(port)?),
            Backend::Daemon(a) => PortImpl::Attached(a.bind(port, reclaiming)?),
        };
        Ok(Port { inner })
    }

    /// A messaging endpoint of its own (pushes to any node's ports).
    ///
    /// # Errors
    /// [`crate::Error::Msg`].
    pub fn endpoint(&self) -> Result<Endpoint<N>> {
        match self.backend() {
            Backend::Engine(e) => Ok(Endpoint::local(e.endpoint()?)),
            Backend::Daemon(_) => self.endpoint_with_window(MsgConfig::default().window),
        }
    }

    /// An endpoint whose channels ask for `window` credits (1..=
    /// `msg.window`): a request/response client with one request out at a
    /// time wants 1, so its channel can be closed as soon as the answer is
    /// in, and a port admits `msg.port_slots` such clients at once.
    ///
    /// # Errors
    /// [`crate::Error::Msg`] (`Config` for a window out of range).
    pub fn endpoint_with_window(&self, window: u32) -> Result<Endpoint<N>> {
        Ok(match self.backend() {
            Backend::Engine(e) => Endpoint::local(e.endpoint_with_window(window)?),
            Backend::Daemon(a) => Endpoint {
                inner: EndpointImpl::Attached(a.endpoint(window)?),
            },
        })
    }
}
