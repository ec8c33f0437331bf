//! The engine's messaging calls: binding ports, opening endpoints, and
//! messaging's progress and statistics. Messaging itself (the room
//! `messaging/`) holds the engine as a
//! [`MsgHost`] and does not name the engine object; these calls are the
//! object's, on top.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use krcore_nic::Nic;

use super::messaging::{
    Endpoint, MsgError, MsgHost, MsgNode, MsgStats, Port, PortUsage, FIRST_RESERVED_PORT,
};
use super::object::Engine;

impl<N: Nic> Engine<N> {
    /// Binds `port` on this node: messages pushed to it are received by
    /// the returned [`Port`]. Reserves `msg.port_slots` receive slots.
    ///
    /// # Errors
    /// [`MsgError::PortInUse`]; [`MsgError::NoBuffers`] when the node's
    /// receive slots are all reserved; [`MsgError::Unsupported`] in RC
    /// fallback mode or a forked child; engine errors of the first use
    /// (receive buffers, the port's VQP).
    pub fn bind(&self, port: u16) -> Result<Port<N>, MsgError> {
        if port >= FIRST_RESERVED_PORT {
            return Err(MsgError::ReservedPort { port });
        }
        self.bind_with(port, false, None)
    }

    /// [`Engine::bind`] for a service that any number of short-lived
    /// clients call over time (a memory node's allocator): when all of the
    /// port's `msg.port_slots` are granted, an Open takes back the slot of
    /// a channel idle for `msg.control_idle`, as the engine's reserved
    /// ports do, so clients that died or left without closing their
    /// channel do not keep the port full. A reclaimed sender is told, and
    /// its next push opens the channel again.
    ///
    /// # Errors
    /// As [`Engine::bind`].
    pub fn bind_reclaiming(&self, port: u16) -> Result<Port<N>, MsgError> {
        if port >= FIRST_RESERVED_PORT {
            return Err(MsgError::ReservedPort { port });
        }
        self.bind_with(port, true, None)
    }

    /// [`Engine::bind_reclaiming`] with `slots` receive slots instead of
    /// `msg.port_slots`: a service that many clients reach at once (a
    /// memory node's allocator: one channel per client with a request
    /// out) sizes its port for them, and the engine's other ports keep the
    /// default. The slots come from the node's budget (`recv_depth` less
    /// `msg.ctl_slots` and what is reserved already).
    ///
    /// # Errors
    /// As [`Engine::bind`]; [`MsgError::NoBuffers`] (with what is free)
    /// when the budget has fewer than `slots`; [`MsgError::Config`] for 0.
    pub fn bind_reclaiming_with(&self, port: u16, slots: u32) -> Result<Port<N>, MsgError> {
        if port >= FIRST_RESERVED_PORT {
            return Err(MsgError::ReservedPort { port });
        }
        self.bind_with(port, true, Some(slots))
    }

    /// [`Engine::bind`] without the reserved-port check (the engine's own
    /// services).
    pub(crate) fn bind_reserved(&self, port: u16) -> Result<Port<N>, MsgError> {
        self.bind_with(port, true, None)
    }

    fn bind_with(
        &self,
        port: u16,
        reclaims: bool,
        slots: Option<u32>,
    ) -> Result<Port<N>, MsgError> {
        Port::bind(&self.msg_host(), port, reclaims, slots)
    }

    /// A new messaging endpoint (a VQP of its own): pushes messages to
    /// ports and receives their replies.
    ///
    /// # Errors
    /// As [`Engine::bind`] ([`MsgError::Unsupported`], engine errors).
    pub fn endpoint(&self) -> Result<Endpoint<N>, MsgError> {
        let window = MsgNode::get(&*self.inner)?.cfg.window;
        self.endpoint_windowed(window)
    }

    /// An endpoint of the engine's own control exchanges (handshake, meta
    /// registration): its channels ask for `msg.control_window` credits.
    pub(crate) fn control_endpoint(&self) -> Result<Endpoint<N>, MsgError> {
        Endpoint::control(&self.msg_host())
    }

    /// An endpoint whose channels ask for `window` credits (at most
    /// `msg.window`) instead of `msg.window`. A request/response client
    /// with one request out at a time wants `1`: the port returns each
    /// credit as it pops the request (credits go back in batches of half
    /// a window), so the channel is idle, and
    /// [`Endpoint::close_channel`] frees its slot, once the answer is in;
    /// and a port of `msg.port_slots` slots admits that many such clients
    /// at once.
    ///
    /// # Errors
    /// [`MsgError::Config`] for a window of 0 or above `msg.window`; as
    /// [`Engine::endpoint`].
    pub fn endpoint_with_window(&self, window: u32) -> Result<Endpoint<N>, MsgError> {
        let max = MsgNode::get(&*self.inner)?.cfg.window;
        if window == 0 || window > max {
            return Err(MsgError::Config(format!(
                "an endpoint's window must be 1..={max} (msg.window), not {window}"
            )));
        }
        self.endpoint_windowed(window)
    }

    fn endpoint_windowed(&self, window: u32) -> Result<Endpoint<N>, MsgError> {
        Endpoint::create(&self.msg_host(), window)
    }

    /// This engine as messaging holds it.
    fn msg_host(&self) -> Arc<dyn MsgHost<N>> {
        self.inner.clone()
    }

    /// Handles what arrived for this node's ports and endpoints (they do it
    /// themselves on every call; this is for a host with no other reason to
    /// call in). Returns the receives handled; 0 before messaging is used.
    ///
    /// # Errors
    /// Provider failures of the receive path.
    pub fn msg_progress(&self) -> Result<usize, MsgError> {
        match self.inner.msg.get() {
            Some(m) => m.clone().progress(&*self.inner),
            None => Ok(0),
        }
    }

    /// Messaging statistics (zeros before messaging is used).
    pub fn msg_stats(&self) -> MsgStats {
        self.inner.msg.get().map(|m| m.stats()).unwrap_or_default()
    }

    /// What the port `port` bound on this node (a user's, or a reserved
    /// one of the engine's: [`super::handshake_msg::HANDSHAKE_PORT`], [`super::META_PORT`])
    /// has granted now; `None` when it is not bound.
    pub fn msg_port_usage(&self, port: u16) -> Option<PortUsage> {
        let node = self.inner.msg.get()?;
        let shared = node.ports.read().get(&port).cloned()?;
        Some(shared.usage())
    }

    /// Receive slots not reserved by ports or reply windows (`None` before
    /// messaging is used).
    pub fn msg_unreserved(&self) -> Option<u32> {
        self.inner.msg.get().map(|m| *m.budget.lock())
    }

    /// Whether this engine can bind ports and push messages (not in a
    /// forked child; both modes).
    pub fn msg_supported(&self) -> bool {
        !self.inner.forked.load(Ordering::Relaxed)
    }
}
