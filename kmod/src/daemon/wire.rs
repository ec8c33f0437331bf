//! The control messages between an attached process and the daemon, over
//! the daemon's unix stream socket: each is a frame (`u32` little-endian
//! body length, then the body: a tag byte and the message's fields,
//! little-endian). The process sends [`Request`]s and reads one [`Reply`]
//! each; replies that hand over shared memory carry its descriptors as
//! `SCM_RIGHTS` on the frame's first byte. Decoding is checked: a short,
//! long or unknown frame is a [`WireError`], never a panic.

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
const MAX_TEXT: usize = 512;

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
}

impl RefuseCode {
    fn to_u8(self) -> u8 {
        match self {
            RefuseCode::Version => 1,
            RefuseCode::Quota => 2,
            RefuseCode::UnknownHandle => 3,
            RefuseCode::BadRequest => 4,
            RefuseCode::Engine => 5,
            RefuseCode::Unsupported => 6,
        }
    }

    fn from_u8(v: u8) -> RefuseCode {
        match v {
            1 => RefuseCode::Version,
            2 => RefuseCode::Quota,
            3 => RefuseCode::UnknownHandle,
            4 => RefuseCode::BadRequest,
            6 => RefuseCode::Unsupported,
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
        })
    }
}

struct Out(Vec<u8>);

impl Out {
    fn new(tag: u8) -> Out {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[0; 4]);
        v.push(tag);
        Out(v)
    }
    fn u8(mut self, x: u8) -> Out {
        self.0.push(x);
        self
    }
    fn u32(mut self, x: u32) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn gid(mut self, g: &Gid) -> Out {
        self.0.extend_from_slice(g.as_bytes());
        self
    }
    /// A reason text, cut to [`MAX_TEXT`] bytes at a character boundary.
    fn text(self, t: &str) -> Out {
        let mut end = t.len().min(MAX_TEXT);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&t.as_bytes()[..end])
    }
    fn grant(self, g: &WireGrant) -> Out {
        self.gid(&g.gid)
            .u32(g.rkey)
            .u64(g.addr)
            .u64(g.len)
            .u32(g.access)
            .u64(g.ttl_ms)
    }
    fn u16(mut self, x: u16) -> Out {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    /// Bytes with their length, whole: callers keep data within
    /// [`MAX_MSG_BYTES`] (checked before encoding; a longer frame would be
    /// refused by the other side's [`frame_len`], never cut).
    fn bytes(mut self, b: &[u8]) -> Out {
        self = self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    /// The frame: its length prefix filled in.
    fn done(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

struct In<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    fn take<const K: usize>(&mut self) -> Result<[u8; K], WireError> {
        let end = self.at + K;
        let src = self.buf.get(self.at..end).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        let mut out = [0u8; K];
        out.copy_from_slice(src);
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn gid(&mut self) -> Result<Gid, WireError> {
        Ok(Gid(self.take()?))
    }
    fn grant(&mut self) -> Result<WireGrant, WireError> {
        Ok(WireGrant {
            gid: self.gid()?,
            rkey: self.u32()?,
            addr: self.u64()?,
            len: self.u64()?,
            access: self.u32()?,
            ttl_ms: self.u64()?,
        })
    }
    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        let end = self.at.checked_add(n).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        let s = self.buf.get(self.at..end).ok_or(WireError::Truncated {
            len: self.buf.len(),
        })?;
        self.at = end;
        Ok(s)
    }
    /// A text field of a request (a store's name), whole and UTF-8.
    fn string(&mut self, tag: u8) -> Result<String, WireError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::NotUtf8 { tag })
    }
    fn end<T>(self, tag: u8, v: T) -> Result<T, WireError> {
        match self.buf.len() - self.at {
            0 => Ok(v),
            extra => Err(WireError::Trailing { tag, extra }),
        }
    }
}

/// The body length a request frame's 4-byte prefix announces, checked
/// against [`MAX_FRAME`].
///
/// # Errors
/// [`WireError::TooLong`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    frame_len_within(prefix, MAX_FRAME)
}

/// The body length a frame's prefix announces, checked against `max`
/// ([`MAX_FRAME`] for requests, [`MAX_REPLY_FRAME`] for replies).
///
/// # Errors
/// [`WireError::TooLong`].
pub fn frame_len_within(prefix: [u8; 4], max: usize) -> Result<usize, WireError> {
    match u32::from_le_bytes(prefix) as usize {
        len if len > max => Err(WireError::TooLong { len, max }),
        len => Ok(len),
    }
}

impl Request {
    /// The request in a word (for errors).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "attach",
            Request::AllocMr { .. } => "allocate memory",
            Request::FreeMr { .. } => "free memory",
            Request::CreateVqp => "create a VQP",
            Request::DestroyVqp { .. } => "destroy a VQP",
            Request::Connect { .. } => "connect",
            Request::Grant { .. } => "grant",
            Request::SetUngranted { .. } => "set the ungranted rule",
            Request::Stats => "stats",
            Request::CreateEndpoint { .. } => "create an endpoint",
            Request::DestroyEndpoint { .. } => "destroy an endpoint",
            Request::Push { .. } => "push",
            Request::PopReply { .. } => "pop a reply",
            Request::CloseChannel { .. } => "close a channel",
            Request::Credits { .. } => "credits",
            Request::BindPort { .. } => "bind a port",
            Request::UnbindPort { .. } => "unbind a port",
            Request::PopPort { .. } => "pop a port",
            Request::ReplyPort { .. } => "reply",
            Request::ReturnCredits { .. } => "return credits",
            Request::Queued { .. } => "count queued messages",
            Request::Lease { .. } => "lease",
            Request::Revoke { .. } => "revoke a lease",
            Request::RevokeLeases { .. } => "revoke leases",
            Request::LiveLeases { .. } => "count live leases",
            Request::Upgrade { .. } => "upgrade a VQP",
            Request::Path { .. } => "a VQP's path",
            Request::OpenVqp(_) => "open a VQP",
            Request::StoreJoin { .. } => "join a store",
            Request::StoreLeave { .. } => "leave a store",
        }
    }

    /// The request as one frame.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello { version, pid } => Out::new(1).u32(*version).u32(*pid),
            Request::AllocMr { len, access } => Out::new(2).u64(*len).u32(*access),
            Request::FreeMr { mr } => Out::new(3).u32(*mr),
            Request::CreateVqp => Out::new(4),
            Request::DestroyVqp { vqp } => Out::new(5).u32(*vqp),
            Request::Connect { vqp, gid } => Out::new(6).u32(*vqp).gid(gid),
            Request::Grant { vqp, grant } => Out::new(7).u32(*vqp).grant(grant),
            Request::SetUngranted { vqp, allow } => Out::new(8).u32(*vqp).u8(*allow),
            Request::Stats => Out::new(9),
            Request::CreateEndpoint { window } => Out::new(10).u32(*window),
            Request::DestroyEndpoint { ep } => Out::new(11).u32(*ep),
            Request::Push {
                ep,
                gid,
                port,
                wait_ms,
                data,
            } => Out::new(12)
                .u32(*ep)
                .gid(gid)
                .u16(*port)
                .u64(*wait_ms)
                .bytes(data),
            Request::PopReply { ep, wait_ms } => Out::new(13).u32(*ep).u64(*wait_ms),
            Request::CloseChannel { ep, gid, port } => Out::new(14).u32(*ep).gid(gid).u16(*port),
            Request::Credits { ep, gid, port } => Out::new(15).u32(*ep).gid(gid).u16(*port),
            Request::BindPort { port, reclaiming } => Out::new(16).u16(*port).u8(*reclaiming),
            Request::UnbindPort { handle } => Out::new(17).u32(*handle),
            Request::PopPort { handle, wait_ms } => Out::new(18).u32(*handle).u64(*wait_ms),
            Request::ReplyPort {
                handle,
                gid,
                vqp,
                wait_ms,
                data,
            } => Out::new(19)
                .u32(*handle)
                .gid(gid)
                .u32(*vqp)
                .u64(*wait_ms)
                .bytes(data),
            Request::ReturnCredits { handle } => Out::new(20).u32(*handle),
            Request::Queued { handle } => Out::new(21).u32(*handle),
            Request::Lease {
                mr,
                offset,
                len,
                access,
                ttl_ms,
            } => Out::new(22)
                .u32(*mr)
                .u64(*offset)
                .u64(*len)
                .u32(*access)
                .u64(*ttl_ms),
            Request::Revoke { mr, id } => Out::new(23).u32(*mr).u64(*id),
            Request::RevokeLeases { mr } => Out::new(24).u32(*mr),
            Request::LiveLeases { mr } => Out::new(25).u32(*mr),
            Request::Upgrade { vqp } => Out::new(26).u32(*vqp),
            Request::Path { vqp } => Out::new(27).u32(*vqp),
            Request::OpenVqp(grant) => Out::new(28).grant(grant),
            Request::StoreJoin {
                store,
                id,
                record,
                lease_ms,
            } => Out::new(29)
                .bytes(store.as_bytes())
                .u16(*id)
                .bytes(record)
                .u64(*lease_ms),
            Request::StoreLeave { store, id } => Out::new(30).bytes(store.as_bytes()).u16(*id),
        }
        .done()
    }

    /// Decodes a frame body.
    ///
    /// # Errors
    /// [`WireError`] for anything but exactly one request.
    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut r = In { buf: body, at: 0 };
        let tag = r.u8()?;
        let req = match tag {
            1 => Request::Hello {
                version: r.u32()?,
                pid: r.u32()?,
            },
            2 => Request::AllocMr {
                len: r.u64()?,
                access: r.u32()?,
            },
            3 => Request::FreeMr { mr: r.u32()? },
            4 => Request::CreateVqp,
            5 => Request::DestroyVqp { vqp: r.u32()? },
            6 => Request::Connect {
                vqp: r.u32()?,
                gid: r.gid()?,
            },
            7 => Request::Grant {
                vqp: r.u32()?,
                grant: r.grant()?,
            },
            8 => Request::SetUngranted {
                vqp: r.u32()?,
                allow: r.u8()?,
            },
            9 => Request::Stats,
            10 => Request::CreateEndpoint { window: r.u32()? },
            11 => Request::DestroyEndpoint { ep: r.u32()? },
            12 => Request::Push {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
                wait_ms: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            13 => Request::PopReply {
                ep: r.u32()?,
                wait_ms: r.u64()?,
            },
            14 => Request::CloseChannel {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
            },
            15 => Request::Credits {
                ep: r.u32()?,
                gid: r.gid()?,
                port: r.u16()?,
            },
            16 => Request::BindPort {
                port: r.u16()?,
                reclaiming: r.u8()?,
            },
            17 => Request::UnbindPort { handle: r.u32()? },
            18 => Request::PopPort {
                handle: r.u32()?,
                wait_ms: r.u64()?,
            },
            19 => Request::ReplyPort {
                handle: r.u32()?,
                gid: r.gid()?,
                vqp: r.u32()?,
                wait_ms: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            20 => Request::ReturnCredits { handle: r.u32()? },
            21 => Request::Queued { handle: r.u32()? },
            22 => Request::Lease {
                mr: r.u32()?,
                offset: r.u64()?,
                len: r.u64()?,
                access: r.u32()?,
                ttl_ms: r.u64()?,
            },
            23 => Request::Revoke {
                mr: r.u32()?,
                id: r.u64()?,
            },
            24 => Request::RevokeLeases { mr: r.u32()? },
            25 => Request::LiveLeases { mr: r.u32()? },
            26 => Request::Upgrade { vqp: r.u32()? },
            27 => Request::Path { vqp: r.u32()? },
            28 => Request::OpenVqp(r.grant()?),
            29 => Request::StoreJoin {
                store: r.string(tag)?,
                id: r.u16()?,
                record: r.bytes()?.to_vec(),
                lease_ms: r.u64()?,
            },
            30 => Request::StoreLeave {
                store: r.string(tag)?,
                id: r.u16()?,
            },
            tag => return Err(WireError::UnknownTag { tag }),
        };
        r.end(tag, req)
    }
}

impl Reply {
    /// The reply as one frame.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Welcome {
                version,
                gid,
                mode,
                max_vqps,
                max_mr_bytes,
            } => Out::new(101)
                .u32(*version)
                .gid(gid)
                .u8(*mode)
                .u32(*max_vqps)
                .u64(*max_mr_bytes),
            Reply::Mr {
                mr,
                addr,
                len,
                lkey,
                rkey,
            } => Out::new(102)
                .u32(*mr)
                .u64(*addr)
                .u64(*len)
                .u32(*lkey)
                .u32(*rkey),
            Reply::Vqp { vqp, id } => Out::new(103).u32(*vqp).u32(*id),
            Reply::Done => Out::new(104),
            Reply::Stats(n) => Out::new(106)
                .u64(n.qps_created)
                .u64(n.modeled_control_ns)
                .u64(n.network_ops)
                .u64(n.dcis)
                .u64(n.vqps_created)
                .u64(n.connect_hits)
                .u64(n.connect_misses)
                .u64(n.meta_reads)
                .u64(n.rc_upgrades)
                .u64(n.rc_downgrades)
                .u64(n.rc_upgrade_failures)
                .u32(n.rc_pairs)
                .u32(n.clients),
            Reply::Refused { code, message } => Out::new(105).u8(code.to_u8()).text(message),
            Reply::Endpoint { ep, id } => Out::new(107).u32(*ep).u32(*id),
            Reply::Message {
                gid,
                vqp,
                port,
                seq,
                data,
            } => Out::new(108)
                .gid(gid)
                .u32(*vqp)
                .u16(*port)
                .u64(*seq)
                .bytes(data),
            Reply::NoMessage => Out::new(109),
            Reply::Flag(b) => Out::new(110).u8(u8::from(*b)),
            Reply::Credits(c) => Out::new(111).u8(u8::from(c.is_some())).u32(c.unwrap_or(0)),
            Reply::MsgFailed(f) => {
                let o = Out::new(112);
                match f {
                    MsgFailure::Refused { gid, port, code } => {
                        o.u8(1).gid(gid).u16(*port).u8(*code)
                    }
                    MsgFailure::TooLarge { len, max } => o.u8(2).u64(*len).u64(*max),
                    MsgFailure::WouldBlock => o.u8(3),
                    MsgFailure::Timeout(ns) => o.u8(4).u64(*ns),
                    MsgFailure::Lost {
                        gid,
                        port,
                        seq,
                        status,
                    } => o.u8(5).gid(gid).u16(*port).u64(*seq).u8(*status),
                    MsgFailure::Other(t) => o.u8(6).text(t),
                    MsgFailure::ReplyLost {
                        gid,
                        vqp,
                        seq,
                        status,
                    } => o.u8(7).gid(gid).u32(*vqp).u64(*seq).u8(*status),
                    MsgFailure::PortInUse { port } => o.u8(8).u16(*port),
                    MsgFailure::ReservedPort { port } => o.u8(9).u16(*port),
                    MsgFailure::NoBuffers { wanted, free } => o.u8(10).u32(*wanted).u32(*free),
                    MsgFailure::Unsupported(t) => o.u8(11).text(t),
                }
            }
            Reply::Port { handle } => Out::new(113).u32(*handle),
            Reply::Count(n) => Out::new(114).u64(*n),
            Reply::Leased { id, rkey, addr } => Out::new(115).u64(*id).u32(*rkey).u64(*addr),
            Reply::Path(t) => Out::new(116).u8(*t),
            Reply::MetaRefused { code } => Out::new(117).u16(*code),
        }
        .done()
    }

    /// Decodes a frame body.
    ///
    /// # Errors
    /// [`WireError`] for anything but exactly one reply.
    pub fn decode(body: &[u8]) -> Result<Reply, WireError> {
        let mut r = In { buf: body, at: 0 };
        let tag = r.u8()?;
        let rep = match tag {
            101 => Reply::Welcome {
                version: r.u32()?,
                gid: r.gid()?,
                mode: r.u8()?,
                max_vqps: r.u32()?,
                max_mr_bytes: r.u64()?,
            },
            102 => Reply::Mr {
                mr: r.u32()?,
                addr: r.u64()?,
                len: r.u64()?,
                lkey: r.u32()?,
                rkey: r.u32()?,
            },
            103 => Reply::Vqp {
                vqp: r.u32()?,
                id: r.u32()?,
            },
            104 => Reply::Done,
            106 => Reply::Stats(NodeStats {
                qps_created: r.u64()?,
                modeled_control_ns: r.u64()?,
                network_ops: r.u64()?,
                dcis: r.u64()?,
                vqps_created: r.u64()?,
                connect_hits: r.u64()?,
                connect_misses: r.u64()?,
                meta_reads: r.u64()?,
                rc_upgrades: r.u64()?,
                rc_downgrades: r.u64()?,
                rc_upgrade_failures: r.u64()?,
                rc_pairs: r.u32()?,
                clients: r.u32()?,
            }),
            105 => Reply::Refused {
                code: RefuseCode::from_u8(r.u8()?),
                message: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            107 => Reply::Endpoint {
                ep: r.u32()?,
                id: r.u32()?,
            },
            108 => Reply::Message {
                gid: r.gid()?,
                vqp: r.u32()?,
                port: r.u16()?,
                seq: r.u64()?,
                data: r.bytes()?.to_vec(),
            },
            109 => Reply::NoMessage,
            110 => Reply::Flag(r.u8()? != 0),
            111 => {
                let some = r.u8()? != 0;
                let c = r.u32()?;
                Reply::Credits(some.then_some(c))
            }
            112 => Reply::MsgFailed(match r.u8()? {
                1 => MsgFailure::Refused {
                    gid: r.gid()?,
                    port: r.u16()?,
                    code: r.u8()?,
                },
                2 => MsgFailure::TooLarge {
                    len: r.u64()?,
                    max: r.u64()?,
                },
                3 => MsgFailure::WouldBlock,
                4 => MsgFailure::Timeout(r.u64()?),
                5 => MsgFailure::Lost {
                    gid: r.gid()?,
                    port: r.u16()?,
                    seq: r.u64()?,
                    status: r.u8()?,
                },
                6 => MsgFailure::Other(String::from_utf8_lossy(r.bytes()?).into_owned()),
                7 => MsgFailure::ReplyLost {
                    gid: r.gid()?,
                    vqp: r.u32()?,
                    seq: r.u64()?,
                    status: r.u8()?,
                },
                8 => MsgFailure::PortInUse { port: r.u16()? },
                9 => MsgFailure::ReservedPort { port: r.u16()? },
                10 => MsgFailure::NoBuffers {
                    wanted: r.u32()?,
                    free: r.u32()?,
                },
                11 => MsgFailure::Unsupported(String::from_utf8_lossy(r.bytes()?).into_owned()),
                kind => return Err(WireError::UnknownTag { tag: kind }),
            }),
            113 => Reply::Port { handle: r.u32()? },
            114 => Reply::Count(r.u64()?),
            116 => Reply::Path(r.u8()?),
            117 => Reply::MetaRefused { code: r.u16()? },
            115 => Reply::Leased {
                id: r.u64()?,
                rkey: r.u32()?,
                addr: r.u64()?,
            },
            tag => return Err(WireError::UnknownTag { tag }),
        };
        r.end(tag, rep)
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

/// The control protocol's version: a process and a daemon of different
/// versions refuse each other at `Hello`.
pub const PROTOCOL_VERSION: u32 = 4;
