//! The control messages and their fields (see the module docs of `wire`).

use krcore_nic::Gid;

/// Largest request frame body the daemon accepts from a process.
pub const MAX_FRAME: usize = MAX_MSG_BYTES + 128;
/// Largest reply frame body a process accepts from its daemon (a message
/// popped for it is as long as a peer's engine sends: up to
/// [`MAX_RECV_BYTES`]).
pub const MAX_REPLY_FRAME: usize = MAX_RECV_BYTES + 128;
/// Largest message an attached process pushes, or sends as a port's
/// reply, through the daemon (a longer one is
/// [`crate::MsgError::TooLarge`]): the daemon reads each process's
/// requests whole, so they are kept small.
pub const MAX_MSG_BYTES: usize = 64 * 1024;
/// Largest message the daemon hands to a process (popped from its port or
/// its endpoint's replies): the engine's default `msg.max_message`, so
/// whatever a peer with default settings sends arrives. A longer one is
/// [`crate::MsgError::TooLarge`] at the pop.
pub const MAX_RECV_BYTES: usize = 16 << 20;
/// Longest reason text a refusal carries (cut at a character boundary).
pub(super) const MAX_TEXT: usize = 512;

/// Why a frame did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The body ended inside a field.
    #[error("control message truncated: {len} bytes")]
    Truncated {
        /// Bytes of the body.
        len: usize,
    },
    /// Bytes left after the message's last field.
    #[error("control message of tag {tag} has {extra} bytes past its end")]
    Trailing {
        /// The tag.
        tag: u8,
        /// Extra bytes.
        extra: usize,
    },
    /// No such message.
    #[error("unknown control message tag {tag}")]
    UnknownTag {
        /// The tag.
        tag: u8,
    },
    /// A text field (a store's name) that is not UTF-8.
    #[error("control message of tag {tag} has a text field that is not UTF-8")]
    NotUtf8 {
        /// The tag.
        tag: u8,
    },
    /// A frame longer than its direction allows ([`MAX_FRAME`],
    /// [`MAX_REPLY_FRAME`]).
    #[error("control frame of {len} bytes (at most {max})")]
    TooLong {
        /// Its announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// A process's control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message: the process's protocol version and pid.
    Hello {
        /// [`super::PROTOCOL_VERSION`] of the process's library.
        version: u32,
        /// The process's pid (for the daemon's logs and stats).
        pid: u32,
    },
    /// Registered memory shared with the process.
    AllocMr {
        /// Bytes.
        len: u64,
        /// Access flags (`krcore_nic::Access` bits).
        access: u32,
    },
    /// Releases a region.
    FreeMr {
        /// Its handle.
        mr: u32,
    },
    /// A VQP and its ring.
    CreateVqp,
    /// Releases a VQP (in-flight WRs are discarded, as in-process).
    DestroyVqp {
        /// Its handle.
        vqp: u32,
    },
    /// Connects a VQP to a node (a metadata lookup in the daemon).
    Connect {
        /// The VQP.
        vqp: u32,
        /// The target node.
        gid: Gid,
    },
    /// Makes a remote grant known to a VQP's pre-check.
    Grant {
        /// The VQP.
        vqp: u32,
        /// The grant.
        grant: WireGrant,
    },
    /// The pre-check's rule for keys no grant covers: allow (1) or refuse (0).
    SetUngranted {
        /// The VQP.
        vqp: u32,
        /// 1: allow.
        allow: u8,
    },
    /// The node's counters ([`NodeStats`]).
    Stats,
    /// A messaging endpoint of the process, in the daemon's engine.
    CreateEndpoint {
        /// Credits its channels ask for (1..=`msg.window`).
        window: u32,
    },
    /// Releases an endpoint.
    DestroyEndpoint {
        /// Its handle.
        ep: u32,
    },
    /// Pushes a message from an endpoint to a port.
    Push {
        /// The endpoint.
        ep: u32,
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
        /// Milliseconds to wait for a credit: 0 fails at once
        /// (`WouldBlock`).
        wait_ms: u64,
        /// The message (at most [`MAX_MSG_BYTES`]).
        data: Vec<u8>,
    },
    /// Pops a reply of an endpoint, waiting up to `wait_ms` (0: not at all).
    PopReply {
        /// The endpoint.
        ep: u32,
        /// Milliseconds to wait.
        wait_ms: u64,
    },
    /// Closes an endpoint's channel to a port if it is idle.
    CloseChannel {
        /// The endpoint.
        ep: u32,
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
    },
    /// Starts opening an endpoint's channel to a port without waiting
    /// for the port's answer (`Endpoint::open_ahead`): answered
    /// [`Reply::Flag`], whether it is open.
    OpenAhead {
        /// The endpoint.
        ep: u32,
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
    },
    /// Sends a message without waiting (`Endpoint::push_ahead`): on a
    /// channel not open yet, carried by its Open: answered
    /// [`Reply::Flag`], whether it went.
    PushAhead {
        /// The endpoint.
        ep: u32,
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
        /// The message.
        data: Vec<u8>,
    },
    /// The credits of an endpoint's channel to a port.
    Credits {
        /// The endpoint.
        ep: u32,
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
    },
    /// Binds a port of the node for the process (ports are node-wide: one
    /// process holds a port at a time).
    BindPort {
        /// The port.
        port: u16,
        /// 1: take back the slots of idle channels when the port is full
        /// (`Engine::bind_reclaiming`).
        reclaiming: u8,
    },
    /// Unbinds a port of the process.
    UnbindPort {
        /// Its handle.
        handle: u32,
    },
    /// Pops the oldest message pushed to a port, waiting up to `wait_ms`
    /// (0: not at all).
    PopPort {
        /// The port's handle.
        handle: u32,
        /// Milliseconds to wait.
        wait_ms: u64,
    },
    /// Replies from a port to a sender.
    ReplyPort {
        /// The port's handle.
        handle: u32,
        /// The sender's node.
        gid: Gid,
        /// The sender's endpoint id.
        vqp: u32,
        /// Milliseconds to wait for a reply credit.
        wait_ms: u64,
        /// The reply (at most [`MAX_MSG_BYTES`]).
        data: Vec<u8>,
    },
    /// Returns now the credits of every message a port popped.
    ReturnCredits {
        /// The port's handle.
        handle: u32,
    },
    /// Messages a port received and did not pop yet.
    Queued {
        /// The port's handle.
        handle: u32,
    },
    /// A lease on a range of one of the process's regions: a remote key of
    /// its own, valid at the NIC for that range and access until it is
    /// revoked or expires (`OwnedMr::lease` in the daemon's engine).
    Lease {
        /// The region.
        mr: u32,
        /// First byte, from the region's start.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Access bits.
        access: u32,
        /// Milliseconds until it expires.
        ttl_ms: u64,
    },
    /// Revokes one lease of a region.
    Revoke {
        /// The region.
        mr: u32,
        /// The lease's id.
        id: u64,
    },
    /// Revokes every lease of a region.
    RevokeLeases {
        /// The region.
        mr: u32,
    },
    /// Leases of a region live now.
    LiveLeases {
        /// The region.
        mr: u32,
    },
    /// The upgrade hint: moves a VQP to an RC pair with its target now
    /// (`Vqp::upgrade` in the daemon's engine; the pair is node-wide).
    Upgrade {
        /// The VQP.
        vqp: u32,
    },
    /// How a VQP reaches its target now.
    Path {
        /// The VQP.
        vqp: u32,
    },
    /// A VQP connected to the grant's node with the grant known
    /// (`CreateVqp`, `Connect` and `Grant` in one call; refused whole, with
    /// nothing created, when any part fails).
    OpenVqp(WireGrant),
    /// Joins the store `store` as member `id` with `record` for
    /// `lease_ms`, or renews the membership (`Engine::store_join` in the
    /// daemon's engine: the member's GID is the node's). The daemon leaves
    /// the stores a process joined when the process goes.
    StoreJoin {
        /// The store's name.
        store: String,
        /// The member id.
        id: u16,
        /// The member's record (at most 64 bytes: the meta server checks).
        record: Vec<u8>,
        /// Milliseconds of the membership's lease.
        lease_ms: u64,
    },
    /// Leaves the store `store` (member `id`, joined by this process).
    StoreLeave {
        /// The store's name.
        store: String,
        /// The member id.
        id: u16,
    },
}

/// A remote grant as a control message carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireGrant {
    /// The node the grant is on.
    pub gid: Gid,
    /// Its remote key.
    pub rkey: u32,
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Access bits.
    pub access: u32,
    /// Milliseconds left until it expires, `u64::MAX` for never.
    pub ttl_ms: u64,
}

/// A messaging failure carried back to the attached process: the variants
/// of [`crate::MsgError`] a caller acts on keep their fields; any other is
/// [`MsgFailure::Other`] with its words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MsgFailure {
    /// `MsgError::Refused`.
    Refused {
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
        /// `crate::msg::RefuseCode` on the wire.
        code: u8,
    },
    /// `MsgError::TooLarge`.
    TooLarge {
        /// Bytes given.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// `MsgError::WouldBlock`.
    WouldBlock,
    /// `MsgError::Timeout`, after this many nanoseconds.
    Timeout(u64),
    /// `MsgError::Lost`.
    Lost {
        /// The node.
        gid: Gid,
        /// The port.
        port: u16,
        /// The message's sequence number.
        seq: u64,
        /// Its completion status (`WcStatus as u8`).
        status: u8,
    },
    /// `MsgError::ReplyLost`.
    ReplyLost {
        /// The endpoint's node.
        gid: Gid,
        /// The endpoint's id.
        vqp: u32,
        /// The reply's sequence number.
        seq: u64,
        /// Its completion status (`WcStatus as u8`).
        status: u8,
    },
    /// `MsgError::PortInUse`.
    PortInUse {
        /// The port.
        port: u16,
    },
    /// `MsgError::ReservedPort`.
    ReservedPort {
        /// The port.
        port: u16,
    },
    /// `MsgError::NoBuffers`.
    NoBuffers {
        /// Slots asked for.
        wanted: u32,
        /// Slots left.
        free: u32,
    },
    /// `MsgError::Unsupported`, its reason in words.
    Unsupported(String),
    /// Anything else, in words.
    Other(String),
}

/// What the node daemon's engine and NIC have done, node-wide (every
/// attached process together): what a process reads to see that its
/// connects created no QP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// QPs the node's NIC created, ever.
    pub qps_created: u64,
    /// Modeled control-path time the NIC charged, ever (ns; 0 without a
    /// latency model).
    pub modeled_control_ns: u64,
    /// One-sided and two-sided operations the NIC carried.
    pub network_ops: u64,
    /// DCIs (or RC pairs' QPs in RC fallback mode) of the engine's pool.
    pub dcis: u64,
    /// VQPs the engine created, ever.
    pub vqps_created: u64,
    /// Connects answered from the DCCache.
    pub connect_hits: u64,
    /// Connects that read the meta table.
    pub connect_misses: u64,
    /// READs of the meta table.
    pub meta_reads: u64,
    /// DC -> RC upgrades, downgrades and failed upgrades, ever.
    pub rc_upgrades: u64,
    /// See `rc_upgrades`.
    pub rc_downgrades: u64,
    /// See `rc_upgrades`.
    pub rc_upgrade_failures: u64,
    /// RC pairs open now.
    pub rc_pairs: u32,
    /// Processes attached now.
    pub clients: u32,
}

/// The daemon's reply to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// To `Hello`: the daemon's version, node and quotas; carries the
    /// daemon's wake-up eventfd and the process's client page.
    Welcome {
        /// The daemon's protocol version.
        version: u32,
        /// The node's GID.
        gid: Gid,
        /// The engine's mode (0: DC, 1: RC fallback).
        mode: u8,
        /// The process's quota of VQPs.
        max_vqps: u32,
        /// Its quota of registered bytes.
        max_mr_bytes: u64,
    },
    /// To `AllocMr`; carries the region's file.
    Mr {
        /// Handle.
        mr: u32,
        /// The region's address as the NIC knows it (SGEs name it).
        addr: u64,
        /// Bytes.
        len: u64,
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// To `CreateVqp` and `OpenVqp`; carries the ring's file.
    Vqp {
        /// Handle.
        vqp: u32,
        /// The VQP's id in the engine (its completions' `qp_num`).
        id: u32,
    },
    /// Done.
    Done,
    /// To `Stats`.
    Stats(NodeStats),
    /// To `CreateEndpoint`.
    Endpoint {
        /// Handle.
        ep: u32,
        /// The endpoint's id in the engine (its messages' sender id).
        id: u32,
    },
    /// To `PopReply` (a reply) and `PopPort` (a message).
    Message {
        /// Its sender.
        gid: Gid,
        /// The sender's id: its endpoint's for a message popped from a
        /// port, the replying port's VQP for a reply.
        vqp: u32,
        /// The port that replied.
        port: u16,
        /// Its sequence number in the channel.
        seq: u64,
        /// The body.
        data: Vec<u8>,
    },
    /// To `PopReply`: none came in time.
    NoMessage,
    /// To `CloseChannel`: whether it was closed.
    Flag(bool),
    /// To `Credits`: `None` before the channel is open.
    Credits(Option<u32>),
    /// A messaging request failed (nothing was sent).
    MsgFailed(MsgFailure),
    /// To `BindPort`.
    Port {
        /// Handle.
        handle: u32,
    },
    /// To `ReturnCredits`, `Queued`, `RevokeLeases` and `LiveLeases`.
    Count(u64),
    /// To `Upgrade` and `Path`: 0 DC, 1 RC.
    Path(u8),
    /// To `Lease`.
    Leased {
        /// The lease's id (for `Revoke`).
        id: u64,
        /// Its remote key.
        rkey: u32,
        /// The leased range's first byte as the NIC knows it.
        addr: u64,
    },
    /// To `StoreJoin` and `StoreLeave`: the meta server refused, with its
    /// code (`krcore_meta::wire::ErrorCode::to_u16`).
    MetaRefused {
        /// The meta server's error code.
        code: u16,
    },
    /// Refused; nothing changed.
    Refused {
        /// Why, in a word ([`RefuseCode`]).
        code: RefuseCode,
        /// The daemon's one-line reason.
        message: String,
    },
}

/// Why the daemon refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefuseCode {
    /// Another protocol version.
    Version,
    /// A per-process quota is reached.
    Quota,
    /// No such handle of this process.
    UnknownHandle,
    /// The request does not make sense (first message not `Hello`, ...).
    BadRequest,
    /// The engine or the NIC refused (the message says why).
    Engine,
    /// Not supported by this daemon or its provider.
    Unsupported,
    /// A connect named a GID the meta server has no registration for
    /// (the engine's `UnknownNode`: not registered yet, or gone).
    UnknownNode,
}

impl RefuseCode {
    pub(super) fn to_u8(self) -> u8 {
        match self {
            RefuseCode::Version => 1,
            RefuseCode::Quota => 2,
            RefuseCode::UnknownHandle => 3,
            RefuseCode::BadRequest => 4,
            RefuseCode::Engine => 5,
            RefuseCode::Unsupported => 6,
            RefuseCode::UnknownNode => 7,
        }
    }

    pub(super) fn from_u8(v: u8) -> RefuseCode {
        match v {
            1 => RefuseCode::Version,
            2 => RefuseCode::Quota,
            3 => RefuseCode::UnknownHandle,
            4 => RefuseCode::BadRequest,
            6 => RefuseCode::Unsupported,
            7 => RefuseCode::UnknownNode,
            _ => RefuseCode::Engine,
        }
    }
}

impl std::fmt::Display for RefuseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefuseCode::Version => "version",
            RefuseCode::Quota => "quota",
            RefuseCode::UnknownHandle => "unknown handle",
            RefuseCode::BadRequest => "bad request",
            RefuseCode::Engine => "engine",
            RefuseCode::Unsupported => "unsupported",
            RefuseCode::UnknownNode => "unknown node",
        })
    }
}

/// The control protocol's version: a process and a daemon of different
/// versions refuse each other at `Hello`.
pub const PROTOCOL_VERSION: u32 = 7;
