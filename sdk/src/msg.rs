//! Two-sided messaging (DC mode over the DCT; RC fallback mode over the RC
//! pairs): a node binds ports and receives; a VQP
//! pushes to a port of its target node and gets the replies (after
//! KRCore's two-sided path and RDMAvisor's vQPN).
//!
//! - [`Node::bind`] returns a [`Port`]: `pop` the messages pushed to it
//!   (per-sender order), `reply` to their senders.
//! - [`Vqp::push`] sends to a port of the VQP's target node; replies come
//!   back to that VQP ([`Vqp::pop_reply`]). (The VQP pushes through its
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
//! [`Vqp::push`] blocks (driving the engine) up to `msg.timeout` (5 s by
//! default) and then fails with [`MsgError::Timeout`]; [`Vqp::try_push`]
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
//! `krcore_kmod::engine::hs_msg::FIRST_RESERVED_PORT` on are the engine's
//! ([`MsgError::ReservedPort`]).

use krcore_nic::Nic;

use crate::error::Result;
use crate::node::Node;

pub use krcore_kmod::msg::RefuseCode;
pub use krcore_kmod::{Endpoint, Message, MsgConfig, MsgError, MsgStats, Port, Sender};

#[cfg(doc)]
use crate::vqp::Vqp;

impl<N: Nic> Node<N> {
    /// Binds `port` on this node (see the [module docs](crate::msg)).
    ///
    /// # Errors
    /// [`crate::Error::Msg`]: `PortInUse`, `NoBuffers`, `Unsupported`.
    pub fn bind(&self, port: u16) -> Result<Port<N>> {
        Ok(self.engine()?.bind(port)?)
    }

    /// A messaging endpoint of its own (pushes to any node's ports).
    ///
    /// # Errors
    /// [`crate::Error::Msg`].
    pub fn endpoint(&self) -> Result<Endpoint<N>> {
        Ok(self.engine()?.endpoint()?)
    }

    /// An endpoint whose channels ask for `window` credits (1..=
    /// `msg.window`): a request/response client with one request out at a
    /// time wants 1, so its channel can be closed as soon as the answer is
    /// in, and a port admits `msg.port_slots` such clients at once.
    ///
    /// # Errors
    /// [`crate::Error::Msg`] (`Config` for a window out of range).
    pub fn endpoint_with_window(&self, window: u32) -> Result<Endpoint<N>> {
        Ok(self.engine()?.endpoint_with_window(window)?)
    }
}
