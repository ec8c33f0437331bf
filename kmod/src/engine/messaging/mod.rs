//! Two-sided messaging over the node's SRQ: bound [`Port`]s that receive,
//! [`Endpoint`]s (a VQP each) that push and get replies. The protocol,
//! header layout and credit accounts are the pure [`crate::msg`]; this is
//! the host.
//!
//! # Both modes
//!
//! DC mode: messages are SENDs from a DCI to the receiver's DCT, whose SRQ
//! holds the receive buffers. RC fallback mode (no DC: Soft-RoCE): the same
//! SENDs travel over the per-target RC pairs (a VQP's connect binds it to
//! its target's pair, made by the UD handshake); the passive ends of peers'
//! pairs share the receiving node's SRQ and receive CQ (made at start), so
//! the receive side below is the same code. Message sends are signaled in
//! RC mode, so that an endpoint or port talking to several nodes can move
//! its VQP from one pair to the next (a VQP moves only with nothing in
//! flight). The address an Open carries for answers is the node's
//! [`Engine::local_target`] (DC: the DCT; RC: the handshake endpoint).
//!
//! ```text
//! MsgNode<N>  (per engine, made by the first bind/endpoint)
//!   |- receive buffers: recv_depth slots of HEADER_LEN + inline_max bytes,
//!   |  posted on the DCT's SRQ; re-posted as soon as a slot is handled
//!   |- receive lock (try-lock): one thread at a time drains the receive CQ
//!   |  and demultiplexes: port messages -> that port's ring (by the port
//!   |  number in the header), answers and replies -> the endpoint's (by the
//!   |  VQP id in the header), Open -> Grant/Refuse sent at once
//!   |- budget: receive slots not reserved (ports' slots, reply windows)
//!   `- Grant/Refuse: sent from a VQP made for each (Opens are rare)
//! Port<N>      ring + channels (own lock); a VQP for replies, credit
//!              returns, releases and descriptor READs (own lock)
//! Endpoint<N>  a VQP; channels, reply ring (own lock); send staging
//! ```
//!
//! # Buffers and flow control (no receive-not-ready, no drop)
//!
//! The SRQ holds `recv_depth` buffers. `ctl_slots` of them are kept for
//! control messages (handled, and re-posted, by whoever polls next). The
//! rest is a budget from which [`Engine::bind`] reserves the port's
//! `port_slots`, and each channel an endpoint opens reserves its
//! `reply_window`. A port grants a channel at most the slots it has not
//! granted yet; a channel sends a data message only with a credit, which
//! comes back after the receiving user popped it. So the data messages that
//! can be in flight to this node never exceed its reservations: a slow
//! receiver slows its senders (their pushes block or say
//! [`MsgError::WouldBlock`]), and nothing is dropped. A message that cannot
//! be delivered (unbound port, the port's slots all granted, too large) is
//! a typed error at the sender. One case is reported late: messages a
//! sender pushed while the port it had a channel to was being unbound are
//! not delivered; the receiver counts them ([`MsgStats::orphaned`]) and
//! answers with a Refuse, so the sender's next push to that port fails with
//! [`MsgError::Refused`] (`Unbound`) and `Ok` pushes since the unbind are
//! the ones lost. Dropping a [`Port`] discards what its ring still holds.
//!
//! A SEND that fails is not silent either. A data message an endpoint
//! pushed (`Ok`) whose unsignaled SEND completes in error (the failing WR,
//! or one the NIC flushed behind it) is reported to its sender: the
//! endpoint's next pushes return [`MsgError::Lost`] with its seq and
//! status, one each, and its credit is back in the channel (message SENDs
//! carry a tag in their wr_id; the error completions are filed per VQP by
//! whoever polls). A popped message whose credit return or Release cannot
//! be sent is delivered anyway; those are owed and sent again by the next
//! pop ([`MsgStats::credits_deferred`], [`MsgStats::releases_deferred`]);
//! a Credit the NIC fails after its post is made up by the next one, which
//! carries the channel's cumulative total (and a control send first polls
//! its VQP, so that it is not flushed behind that failure), and a push
//! that waits for a credit sends its channel's Open again after 50 ms
//! (doubling to 500 ms): the port answers a repeated Open with the same
//! grant and the total again ([`MsgStats::credits_asked`]; a port's reply
//! that waits for a reply credit repeats the channel's Grant, and the
//! endpoint sends its reply credits' total again at its next pop),
//! and a descriptor whose sender cannot be reached stays queued (a typed
//! error; the next pop pulls it). A port's replies are tagged the same way:
//! its next replies return [`MsgError::ReplyLost`] for each lost one.
//!
//! A channel holds its window of the port's slots until its sender closes
//! it ([`Endpoint::close_channel`](super::Endpoint::close_channel): a
//! Close, sent only when the channel is idle, every credit back and no
//! reply waiting; the port returns the window to its ungranted slots,
//! [`MsgStats::closed`]) or the port is unbound. The engine's own control
//! endpoints (handshake, meta registration) ask for `control_window` (1)
//! credits and close after each exchange; their reserved ports also
//! reclaim, when full, a channel idle for `control_idle`
//! ([`MsgStats::reclaimed`]; its sender is told with a Refuse
//! `Reclaimed`), so the number of initiators over time is unbounded (see
//! [`crate::engine::handshake_msg`]). [`Engine::msg_port_usage`] shows a port's grants.
//!
//! Control messages are bounded per channel (one Open, then at most one
//! Credit per half window and one Release per descriptor); `ctl_slots` is
//! sized for the expected number of concurrently opening senders. The
//! receive CQ is drained by every call into messaging (push, pop, reply,
//! [`Engine::msg_progress`]): a node whose users never call in leaves
//! control messages queued (senders then wait, bounded by their timeouts).
//!
//! # Opens that carry a message
//!
//! An Open may carry its channel's first message (inline, seq 0, one
//! credit of the grant: [`crate::msg::Carried`]), so that a request and
//! its reply cost one round trip: the engine's handshake endpoint's pushes
//! (its Requests are idempotent: a carried push that times out leaves its
//! message in doubt, delivered at most once, perhaps later by the repeated
//! Open), and [`Endpoint::push_ahead`] on a closed channel (for requests
//! matched to their answers by id: a memory node's block allocations).
//! The port's node sends the Grant and the port's VQP the carried
//! message's Credit and reply, on different DCIs: the Credit (and the
//! reply) may come before the Grant, and is applied when the Grant comes.
//! An *only* message is an Open carrying the channel's
//! only message from a sender id outside the VQP ids: nobody waits for its
//! answer, the port forgets the channel when the message is popped, and a
//! port that cannot take it counts it `orphaned` (the engine's notices:
//! the handshake's Close).
//!
//! A Refuse of a channel that was open, with credits out (a message
//! orphaned at an unbound port, or after a reclaim), makes the sender's
//! next push fail with [`MsgError::Refused`] once, even if the port was
//! bound again meanwhile; one with no credit out (an idle channel
//! reclaimed) lost nothing: the next push simply reopens.
//!
//! # Ordering
//!
//! A channel's data messages go from one VQP (one DCI) to one DCT, so they
//! arrive in order; the receive CQ is drained by one thread at a time, so
//! they enter the port's ring in order. The ring is FIFO: per-sender order
//! is kept (checked: [`MsgStats::out_of_order`]). A polled receive is never
//! dropped on the way: its body is copied out of the slot first, and a slot
//! whose re-post the SRQ refuses (a full-looking SRQ for a moment) waits for
//! the next drain ([`MsgStats::reposts_deferred`]) while its message is
//! delivered; dropping it would let the channel's next message overtake it. Replies of a port go
//! through the port's one VQP: per-channel order again.
//!
//! # Zero copy
//!
//! A message longer than `inline_max` travels as a descriptor: the sender
//! copies it into a registered staging buffer (none with
//! [`Endpoint::push_region`]: the caller's own MR is the buffer), the
//! receiver READs it into a registered landing buffer at pop time (one
//! READ, no SRQ bounce), then sends Release so the sender reuses the buffer.
//!
//! # The engine's own services
//!
//! Ports from [`FIRST_RESERVED_PORT`] on are the engine's
//! ([`Engine::bind`] refuses them: [`MsgError::ReservedPort`]). The DC ->
//! RC upgrade's handshake is carried on [`crate::engine::handshake_msg::HANDSHAKE_PORT`]
//! (see [`crate::engine::handshake_msg`]). They take inline messages only: a descriptor
//! sent there is dropped and counted ([`MsgStats::malformed`]).
//!
//! # Reaching a sender registered nowhere
//!
//! An Open names its sender's DCT (`dct_num`, `dc_key` in the header): the
//! receiver answers there even when the sender has no meta entry (a compute
//! node), by caching it with the lowest epoch (`learn_sender`): any meta
//! entry for that GID replaces it; it replaces a cached entry only when
//! that one names another DCT for the GID (the sender restarted).
//!
//! # Not supported (typed errors)
//!
//! A forked child ([`MsgError::Unsupported`]: the parent owns the SRQ).
//! RC fallback mode's own handshake stays on UD (it builds the first pair
//! to a node: messaging needs the pair); registration with the meta host
//! then travels as messages over that pair (see [`crate::engine::meta_msg`]).
//!
//! # Files
//!
//! `types.rs` (the vocabulary: errors, statistics, senders, messages),
//! `state.rs` (the state of ports and endpoints the host shares with their
//! handles), `node.rs` (the host and [`MsgHost`]), `send.rs` (sends, READs,
//! staging and landing buffers), `endpoint.rs`, `port.rs`. The engine's
//! calls that make ports and endpoints are `super::messaging_api` (on top
//! of the engine object, which this room does not name).

mod endpoint;
mod node;
mod port;
mod send;
mod state;
mod types;

pub use endpoint::Endpoint;
pub use port::{Port, PortUsage};
pub use types::{Message, MsgError, MsgStats, Sender, FIRST_RESERVED_PORT, HANDSHAKE_PORT};

pub(crate) use node::{MsgHost, MsgNode};
pub(crate) use types::{Service, Worker};
