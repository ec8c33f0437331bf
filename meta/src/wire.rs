//! Two-sided messages between clients and the meta server: registration,
//! renewal, deregistration, bootstrap, store membership, and their replies.
//!
//! Every message is a 16-byte header and a payload, little-endian. Every
//! payload has a fixed size for its type except `StoreMembers`'s (8 bytes
//! and 96 per member). A receive buffer may be longer than the message
//! (bytes past `HEADER_LEN + payload_len` are ignored).
//!
//! # Sizes and transports
//! Every request, and every reply but `StoreMembers`, fits in
//! [`MAX_MESSAGE_LEN`] bytes: size receive buffers of the messaging and UD
//! transports by it. `StoreMembers` (up to [`MAX_STORE_MEMBERS_LEN`] bytes)
//! travels only over TCP ([`crate::bootstrap::fetch_store_tcp`]), whose
//! reader takes the length from the header.
//!
//! ```text
//! header   0..4  magic u32 = MAGIC ("KRMT")   4 version u8 = WIRE_VERSION
//!          5     type u8                      6..8 payload_len u16
//!          8..16 request_id u64 (echoed in the reply)
//!
//! Register (type 1, 40 B)  0..16 gid  16..20 dct_num u32  20..22 lid u16
//!                          22..24 reserved (0)  24..32 dc_key u64  32..40 lease_ms u64
//! Renew (2, 24 B)          0..16 gid  16..20 dct_num u32  20..24 reserved (0)
//! Deregister (3, 24 B)     0..16 gid  16..20 dct_num u32  20..24 reserved (0)
//! BootstrapRequest (4, 0 B)
//! Ok (0x81, 16 B)          0..4 epoch u32 (!= 0)  4..8 replaced_dct u32
//!                          8..16 lease_expiry_ms u64
//! Err (0x82, 8 B)          0..2 code u16 (!= 0)  2..8 reserved (0)
//! Bootstrap (0x83, 80 B)   0..2 layout_version u16  2..4 entry_len u16
//!                          4..8 slots_per_bucket u32  8..12 n_buckets u32
//!                          12..16 table rkey u32  16..24 table addr u64
//!                          24..32 table_len u64  32..40 incarnation u64
//!                          40..56 server gid  56..60 server dct_num u32
//!                          60..64 rpc qpn u32 (!= 0)  64..72 server dc_key u64
//!                          72..76 rpc qkey u32  76..80 reserved (0)
//!
//! store name (32 B): 1..=32 bytes of [A-Za-z0-9._-], then NUL bytes
//! record (64 B): record_len (<= 64) bytes, then zero bytes
//!
//! StoreJoin (5, 112 B)     0..32 store name  32..34 id u16  34..36 record_len u16
//!                          36..40 reserved (0)  40..48 lease_ms u64  48..112 record
//! StoreLeave (6, 40 B)     0..32 store name  32..34 id u16  34..40 reserved (0)
//! StoreList (7, 32 B)      0..32 store name
//! StoreMembers (0x84, 8 + 96 * count B)
//!                          0..2 count u16 (<= 255)  2..4 entry_len u16 (= 96)
//!                          4..8 reserved (0), then count entries of 96 B:
//!   entry                  0..2 id u16  2..4 record_len u16  4..8 reserved (0)
//!                          8..24 gid  24..32 lease_expiry_ms u64  32..96 record
//! ```
//!
//! A Renew or Deregister names the DCT number its sender registered: the
//! server refuses it (`Err(Replaced)`) when the GID's registration is now
//! another DCT's (another engine registered at the GID since), so an
//! engine never renews or removes another's registration. An `Ok` answering
//! a Register that replaced another DCT's registration whose lease had not
//! run out names that DCT in `replaced_dct` (0 otherwise, and in every
//! other `Ok`): a process restarted at the GID, or a second engine on the
//! port.
//!
//! A StoreJoin answers `Ok(lease)` (the membership's epoch and expiry),
//! a StoreLeave `Ok` with the removed member's expiry (epoch 1), a StoreList
//! `StoreMembers` (ids ascending) or `Err(NoSuchStore)`.
//!
//! Version history: 1 had a 72-byte Bootstrap without the RPC address
//! (bytes 60..64 reserved); 2 adds the server's UD QPN and qkey, where
//! clients send Register/Renew/Deregister/BootstrapRequest; 3 adds store
//! membership (StoreJoin, StoreLeave, StoreList, StoreMembers and their
//! error codes), and over TCP a request precedes the reply (a v2 server
//! answered every connection with its Bootstrap); 4 adds the DCT number to
//! Renew and Deregister, `replaced_dct` to Ok, and the code `Replaced`.
//!
//! Parsing checks, in order: the buffer holds a header, the magic, the
//! version, the type, the payload length for that type, the buffer holds the
//! payload, reserved bytes are zero, and per-type value rules. It never
//! panics, whatever the bytes.

use crate::entry::ENTRY_LEN;
use crate::le::{get_gid, get_u16, get_u32, get_u64, put};
use crate::registry::Lease;
use crate::stores::{StoreMember, StoreName, MAX_MEMBERS, RECORD_MAX, STORE_NAME_MAX};
use crate::table::{Geometry, GeometryError};
use crate::LAYOUT_VERSION;
use krcore_nic::{DcTarget, Gid, RemoteAddr, UdTarget};

/// First four bytes of every message: ASCII "KRMT" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"KRMT");
/// Version of this message format.
pub const WIRE_VERSION: u8 = 4;
/// Bytes of the header.
pub const HEADER_LEN: usize = 16;
/// Bytes of the longest message but `StoreMembers` (a StoreJoin): every
/// request and every reply sent over messaging or UD fits; size receive
/// buffers by it.
pub const MAX_MESSAGE_LEN: usize = HEADER_LEN + STORE_JOIN_LEN;
/// Bytes of the longest `StoreMembers` reply ([`MAX_MEMBERS`] members),
/// which travels only over TCP.
pub const MAX_STORE_MEMBERS_LEN: usize =
    HEADER_LEN + STORE_MEMBERS_HEAD_LEN + STORE_ENTRY_LEN * MAX_MEMBERS;
/// Bytes of one member entry of a `StoreMembers` reply.
pub const STORE_ENTRY_LEN: usize = 96;

const REGISTER_LEN: usize = 40;
const GID_DCT_LEN: usize = 24;
const OK_LEN: usize = 16;
const ERR_LEN: usize = 8;
const BOOTSTRAP_LEN: usize = 80;
const STORE_JOIN_LEN: usize = 112;
const STORE_LEAVE_LEN: usize = 40;
const STORE_LIST_LEN: usize = STORE_NAME_MAX;
const STORE_MEMBERS_HEAD_LEN: usize = 8;
/// Entries a StoreMembers payload can hold at all (its u16 length).
const MEMBERS_EMIT_MAX: usize = (u16::MAX as usize - STORE_MEMBERS_HEAD_LEN) / STORE_ENTRY_LEN;

/// Named byte ranges of the header.
pub mod field {
    use core::ops::Range;

    /// Magic number.
    pub const MAGIC: Range<usize> = 0..4;
    /// Format version.
    pub const VERSION: usize = 4;
    /// Message type.
    pub const TYPE: usize = 5;
    /// Payload length in bytes.
    pub const PAYLOAD_LEN: Range<usize> = 6..8;
    /// Request id, echoed in the reply.
    pub const REQUEST_ID: Range<usize> = 8..16;
}

/// Why bytes are not a valid message, or a message does not fit a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the header, or than header plus payload.
    #[error("message truncated: {len} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The magic number is wrong: not a meta message.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The format version is not [`WIRE_VERSION`].
    #[error("unsupported message version {0}")]
    UnsupportedVersion(u8),
    /// The type byte names no message.
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    /// The payload length does not match the message type.
    #[error("{msg_type:?} payload must be {expected} bytes, header says {got}")]
    PayloadLength {
        /// The message type.
        msg_type: MessageType,
        /// Its payload length.
        expected: usize,
        /// The header's payload length.
        got: usize,
    },
    /// A reserved field is not zero.
    #[error("{0:?}: reserved bytes are not zero")]
    ReservedNotZero(MessageType),
    /// A store name field is not 1..=32 bytes of `[A-Za-z0-9._-]` followed
    /// by NUL bytes.
    #[error("{0:?}: bad store name")]
    BadStoreName(MessageType),
    /// A record length is over 64 bytes.
    #[error("{0:?}: record longer than 64 bytes")]
    RecordTooLong(MessageType),
    /// A field value breaks a rule of its message.
    #[error("malformed {msg_type:?}: {what}")]
    Malformed {
        /// The message type.
        msg_type: MessageType,
        /// Which rule.
        what: &'static str,
    },
    /// The output buffer is too small for the message being emitted.
    #[error("buffer of {have} bytes cannot hold a {need}-byte message")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// The message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Client -> server: register a node.
    Register = 1,
    /// Client -> server: renew a node's lease.
    Renew = 2,
    /// Client -> server: remove a node.
    Deregister = 3,
    /// Client -> server: where is the table?
    BootstrapRequest = 4,
    /// Member -> server: join a store (or renew a membership).
    StoreJoin = 5,
    /// Member -> server: leave a store.
    StoreLeave = 6,
    /// Client -> server (TCP only): the members of a store?
    StoreList = 7,
    /// Server -> client: success, with the lease.
    Ok = 0x81,
    /// Server -> client: failure, with a code.
    Err = 0x82,
    /// Server -> client: the table's location and shape.
    Bootstrap = 0x83,
    /// Server -> client (TCP only): a store's live members.
    StoreMembers = 0x84,
}

impl MessageType {
    /// From the type byte.
    pub fn from_u8(v: u8) -> Option<MessageType> {
        Some(match v {
            1 => MessageType::Register,
            2 => MessageType::Renew,
            3 => MessageType::Deregister,
            4 => MessageType::BootstrapRequest,
            5 => MessageType::StoreJoin,
            6 => MessageType::StoreLeave,
            7 => MessageType::StoreList,
            0x81 => MessageType::Ok,
            0x82 => MessageType::Err,
            0x83 => MessageType::Bootstrap,
            0x84 => MessageType::StoreMembers,
            _ => return None,
        })
    }

    /// The payload length of this type (for `StoreMembers`, whose length
    /// depends on its count, that of an empty list).
    pub fn payload_len(self) -> usize {
        match self {
            MessageType::Register => REGISTER_LEN,
            MessageType::Renew | MessageType::Deregister => GID_DCT_LEN,
            MessageType::BootstrapRequest => 0,
            MessageType::StoreJoin => STORE_JOIN_LEN,
            MessageType::StoreLeave => STORE_LEAVE_LEN,
            MessageType::StoreList => STORE_LIST_LEN,
            MessageType::Ok => OK_LEN,
            MessageType::Err => ERR_LEN,
            MessageType::Bootstrap => BOOTSTRAP_LEN,
            MessageType::StoreMembers => STORE_MEMBERS_HEAD_LEN,
        }
    }

    /// Whether clients send it (replies are sent by the server).
    pub fn is_request(self) -> bool {
        (self as u8) < 0x80
    }
}

/// Why the server refused a request (the code of an `Err` reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request could not be parsed.
    Malformed,
    /// The request's format version is not supported.
    UnsupportedVersion,
    /// A reply type was sent as a request.
    UnexpectedMessage,
    /// The GID's bucket is full.
    BucketFull,
    /// The GID is not registered.
    NotRegistered,
    /// The GID's lease expired; register again.
    LeaseExpired,
    /// A lease of 0 ms was asked for.
    InvalidLease,
    /// The server ran out of epochs.
    EpochExhausted,
    /// The GID's registration is another DCT's than the Renew's or
    /// Deregister's: another engine registered at the GID since.
    Replaced,
    /// The store member id is held, live, by another GID.
    MemberExists,
    /// The store has no live member.
    NoSuchStore,
    /// The store name is not 1..=32 bytes of `[A-Za-z0-9._-]`.
    BadStoreName,
    /// The store has 255 members, or the server its maximum of stores.
    StoreFull,
    /// A member record is longer than 64 bytes.
    RecordTooLong,
    /// The store has no member with this id.
    NoSuchMember,
    /// The member is held by another GID than the sender.
    NotHolder,
    /// Any other server-side failure.
    Internal,
    /// A code this build does not know (a newer server); never 0.
    Unknown(u16),
}

impl ErrorCode {
    /// The code on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::Malformed => 1,
            ErrorCode::UnsupportedVersion => 2,
            ErrorCode::UnexpectedMessage => 3,
            ErrorCode::BucketFull => 16,
            ErrorCode::NotRegistered => 17,
            ErrorCode::LeaseExpired => 18,
            ErrorCode::InvalidLease => 19,
            ErrorCode::EpochExhausted => 20,
            ErrorCode::Replaced => 21,
            ErrorCode::MemberExists => 32,
            ErrorCode::NoSuchStore => 33,
            ErrorCode::BadStoreName => 34,
            ErrorCode::StoreFull => 35,
            ErrorCode::RecordTooLong => 36,
            ErrorCode::NoSuchMember => 37,
            ErrorCode::NotHolder => 38,
            ErrorCode::Internal => 255,
            ErrorCode::Unknown(c) => c,
        }
    }

    /// From the code on the wire (unknown codes are kept; 0 is not a code).
    pub fn from_u16(c: u16) -> Option<ErrorCode> {
        Some(match c {
            0 => return None,
            1 => ErrorCode::Malformed,
            2 => ErrorCode::UnsupportedVersion,
            3 => ErrorCode::UnexpectedMessage,
            16 => ErrorCode::BucketFull,
            17 => ErrorCode::NotRegistered,
            18 => ErrorCode::LeaseExpired,
            19 => ErrorCode::InvalidLease,
            20 => ErrorCode::EpochExhausted,
            21 => ErrorCode::Replaced,
            32 => ErrorCode::MemberExists,
            33 => ErrorCode::NoSuchStore,
            34 => ErrorCode::BadStoreName,
            35 => ErrorCode::StoreFull,
            36 => ErrorCode::RecordTooLong,
            37 => ErrorCode::NoSuchMember,
            38 => ErrorCode::NotHolder,
            255 => ErrorCode::Internal,
            c => ErrorCode::Unknown(c),
        })
    }
}

/// A checked view over a message's header (and payload).
///
/// Once [`Packet::new_checked`] has accepted a buffer, no accessor can panic.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds a header and the payload length
    /// the header announces.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// The check of [`Packet::new_checked`].
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated {
                len,
                need: HEADER_LEN,
            });
        }
        let need = HEADER_LEN + self.payload_len();
        if len < need {
            return Err(WireError::Truncated { len, need });
        }
        Ok(())
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The magic number.
    pub fn magic(&self) -> u32 {
        get_u32(self.b(), field::MAGIC)
    }

    /// The format version.
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }

    /// The raw type byte.
    pub fn msg_type(&self) -> u8 {
        self.b()[field::TYPE]
    }

    /// The payload length from the header.
    pub fn payload_len(&self) -> usize {
        get_u16(self.b(), field::PAYLOAD_LEN) as usize
    }

    /// The request id.
    pub fn request_id(&self) -> u64 {
        get_u64(self.b(), field::REQUEST_ID)
    }

    /// The payload: exactly `payload_len()` bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len()]
    }
}

/// The body of a Register request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegisterRepr {
    /// The node's DC target (GID, DCT number, DC key).
    pub target: DcTarget,
    /// The node's LID.
    pub lid: u16,
    /// Lease length asked for (ms, > 0 to be accepted by the server).
    pub lease_ms: u64,
}

/// The body of a Bootstrap reply: everything a client that knows only the
/// server's address needs to READ the table.
///
/// Parsing checks only the format; [`BootstrapRepr::geometry`] checks that
/// the layout is one this build can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BootstrapRepr {
    /// [`LAYOUT_VERSION`] of the server's table.
    pub layout_version: u16,
    /// Entry size in bytes ([`ENTRY_LEN`]).
    pub entry_len: u16,
    /// Entries per bucket.
    pub slots_per_bucket: u32,
    /// Number of buckets.
    pub n_buckets: u32,
    /// Remote address and rkey of the table's first byte.
    pub table: RemoteAddr,
    /// Table length in bytes (`n_buckets * slots_per_bucket * entry_len`).
    pub table_len: u64,
    /// Changes every time the server starts: a client that sees a new value
    /// must drop every entry it cached from the old table.
    pub incarnation: u64,
    /// The DC target through which clients READ the table (`dct_num` and
    /// `dc_key` of the server's DCT; `gid` is also the GID of the RPC QP).
    pub server: DcTarget,
    /// QP number of the server's UD QP, where clients send requests
    /// (Register, Renew, Deregister, BootstrapRequest). Never 0.
    pub rpc_qpn: u32,
    /// Queue key of the server's UD QP: a client's UD QP must use it, since
    /// replies are sent with it too.
    pub rpc_qkey: u32,
}

/// Why a bootstrap reply describes a table this build cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Another table layout version.
    #[error("table layout version {found}, this build reads {LAYOUT_VERSION}")]
    LayoutVersion {
        /// The server's layout version.
        found: u16,
    },
    /// Another entry size.
    #[error("entry size {found}, this build reads {ENTRY_LEN}")]
    EntryLen {
        /// The server's entry size.
        found: u16,
    },
    /// The bucket counts are out of range.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// The table length does not match the geometry.
    #[error("table length {found} does not match the geometry's {expected}")]
    TableLen {
        /// The server's table length.
        found: u64,
        /// What the geometry implies.
        expected: u64,
    },
}

impl BootstrapRepr {
    /// The reply a server with `geometry`, registered at `table`, READ
    /// through the DCT `server`, taking requests on the UD QP `rpc` (whose
    /// GID must be `server.gid`: only its QPN and qkey are sent), sends.
    pub fn new(
        geometry: Geometry,
        table: RemoteAddr,
        incarnation: u64,
        server: DcTarget,
        rpc: UdTarget,
    ) -> BootstrapRepr {
        debug_assert_eq!(rpc.gid, server.gid, "the RPC QP lives on the server's port");
        BootstrapRepr {
            layout_version: LAYOUT_VERSION,
            entry_len: ENTRY_LEN as u16,
            slots_per_bucket: geometry.slots_per_bucket(),
            n_buckets: geometry.n_buckets(),
            table,
            table_len: geometry.table_len(),
            incarnation,
            server,
            rpc_qpn: rpc.qpn,
            rpc_qkey: rpc.qkey,
        }
    }

    /// Where to send requests: the server's UD QP.
    pub fn rpc_target(&self) -> UdTarget {
        UdTarget {
            gid: self.server.gid,
            qpn: self.rpc_qpn,
            qkey: self.rpc_qkey,
        }
    }

    /// The table geometry, after checking the layout is readable by this build.
    ///
    /// # Errors
    /// [`BootstrapError`].
    pub fn geometry(&self) -> Result<Geometry, BootstrapError> {
        if self.layout_version != LAYOUT_VERSION {
            return Err(BootstrapError::LayoutVersion {
                found: self.layout_version,
            });
        }
        if self.entry_len as usize != ENTRY_LEN {
            return Err(BootstrapError::EntryLen {
                found: self.entry_len,
            });
        }
        let g = Geometry::new(self.n_buckets, self.slots_per_bucket)?;
        if g.table_len() != self.table_len {
            return Err(BootstrapError::TableLen {
                found: self.table_len,
                expected: g.table_len(),
            });
        }
        Ok(g)
    }
}

/// The body of a StoreJoin request. The member's GID is not in it: the
/// server takes the sender's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreJoinRepr {
    /// The store.
    pub store: StoreName,
    /// The member id.
    pub id: u16,
    /// The member's opaque record (at most [`RECORD_MAX`] bytes to parse).
    pub record: Vec<u8>,
    /// Lease length asked for (ms, > 0 to be accepted by the server).
    pub lease_ms: u64,
}

/// A parsed message body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message {
    /// Register (or re-register) a node.
    Register(RegisterRepr),
    /// Renew a node's lease.
    Renew {
        /// The node.
        gid: Gid,
        /// The DCT number it registered (refused when the GID's
        /// registration is another's).
        dct_num: u32,
    },
    /// Remove a node.
    Deregister {
        /// The node.
        gid: Gid,
        /// The DCT number it registered (refused when the GID's
        /// registration is another's).
        dct_num: u32,
    },
    /// Ask for the table's location.
    BootstrapRequest,
    /// Join a store, or renew a membership.
    StoreJoin(StoreJoinRepr),
    /// Leave a store.
    StoreLeave {
        /// The store.
        store: StoreName,
        /// The member id.
        id: u16,
    },
    /// Ask for a store's live members (TCP only).
    StoreList {
        /// The store.
        store: StoreName,
    },
    /// Success: the registration's epoch and lease expiry (for Deregister, those
    /// of the removed registration).
    Ok(Lease),
    /// Failure.
    Err(ErrorCode),
    /// The table's location and shape.
    Bootstrap(BootstrapRepr),
    /// A store's live members (TCP only; at most [`MAX_MEMBERS`] to parse).
    StoreMembers(Vec<StoreMember>),
}

impl Message {
    /// The type of this message.
    pub fn msg_type(&self) -> MessageType {
        match self {
            Message::Register(_) => MessageType::Register,
            Message::Renew { .. } => MessageType::Renew,
            Message::Deregister { .. } => MessageType::Deregister,
            Message::BootstrapRequest => MessageType::BootstrapRequest,
            Message::StoreJoin(_) => MessageType::StoreJoin,
            Message::StoreLeave { .. } => MessageType::StoreLeave,
            Message::StoreList { .. } => MessageType::StoreList,
            Message::Ok(_) => MessageType::Ok,
            Message::Err(_) => MessageType::Err,
            Message::Bootstrap(_) => MessageType::Bootstrap,
            Message::StoreMembers(_) => MessageType::StoreMembers,
        }
    }

    /// Bytes of the payload as emitted.
    pub fn payload_len(&self) -> usize {
        match self {
            Message::StoreMembers(ms) => {
                STORE_MEMBERS_HEAD_LEN + STORE_ENTRY_LEN * ms.len().min(MEMBERS_EMIT_MAX)
            }
            m => m.msg_type().payload_len(),
        }
    }
}

/// A parsed message: its request id and body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Chosen by the client, echoed by the server's reply.
    pub request_id: u64,
    /// The body.
    pub message: Message,
}

fn zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// A 32-byte NUL-padded store name field.
fn get_name(b: &[u8], t: MessageType) -> Result<StoreName, WireError> {
    let n = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    if !zero(&b[n..]) {
        return Err(WireError::BadStoreName(t));
    }
    StoreName::from_bytes(&b[..n]).map_err(|_| WireError::BadStoreName(t))
}

/// A record of `len` bytes in a 64-byte zero-padded field.
fn get_record(b: &[u8], len: u16, t: MessageType) -> Result<Vec<u8>, WireError> {
    let len = len as usize;
    if len > RECORD_MAX {
        return Err(WireError::RecordTooLong(t));
    }
    if !zero(&b[len..]) {
        return Err(WireError::ReservedNotZero(t));
    }
    Ok(b[..len].to_vec())
}

/// Writes a record field: its length (saturated; over 64 parse rejects) and
/// its first 64 bytes.
fn put_record(len_field: &mut [u8], field: &mut [u8], record: &[u8]) {
    let len = u16::try_from(record.len()).unwrap_or(u16::MAX);
    len_field.copy_from_slice(&len.to_le_bytes());
    let n = record.len().min(RECORD_MAX);
    field[..n].copy_from_slice(&record[..n]);
}

fn parse_members(p: &[u8]) -> Result<Vec<StoreMember>, WireError> {
    let t = MessageType::StoreMembers;
    let malformed = |what| WireError::Malformed { msg_type: t, what };
    let count = get_u16(p, 0..2) as usize;
    if !zero(&p[4..8]) {
        return Err(WireError::ReservedNotZero(t));
    }
    if get_u16(p, 2..4) as usize != STORE_ENTRY_LEN {
        return Err(malformed("entry length is not 96"));
    }
    if count > MAX_MEMBERS {
        return Err(malformed("more than 255 members"));
    }
    let expected = STORE_MEMBERS_HEAD_LEN + STORE_ENTRY_LEN * count;
    if p.len() != expected {
        return Err(WireError::PayloadLength {
            msg_type: t,
            expected,
            got: p.len(),
        });
    }
    p[STORE_MEMBERS_HEAD_LEN..]
        .chunks_exact(STORE_ENTRY_LEN)
        .map(|e| {
            if !zero(&e[4..8]) {
                return Err(WireError::ReservedNotZero(t));
            }
            Ok(StoreMember {
                id: get_u16(e, 0..2),
                gid: get_gid(e, 8..24),
                lease_expiry_ms: get_u64(e, 24..32),
                record: get_record(&e[32..96], get_u16(e, 2..4), t)?,
            })
        })
        .collect()
}

impl Repr {
    /// Parses a message, checking everything listed in the module docs.
    ///
    /// # Errors
    /// [`WireError`], never a panic.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, WireError> {
        packet.check_len()?;
        if packet.magic() != MAGIC {
            return Err(WireError::BadMagic(packet.magic()));
        }
        if packet.version() != WIRE_VERSION {
            return Err(WireError::UnsupportedVersion(packet.version()));
        }
        let t = MessageType::from_u8(packet.msg_type())
            .ok_or(WireError::UnknownType(packet.msg_type()))?;
        let variable = t == MessageType::StoreMembers;
        if (variable && packet.payload_len() < t.payload_len())
            || (!variable && packet.payload_len() != t.payload_len())
        {
            return Err(WireError::PayloadLength {
                msg_type: t,
                expected: t.payload_len(),
                got: packet.payload_len(),
            });
        }
        let p = packet.payload();
        let malformed = |what| WireError::Malformed { msg_type: t, what };
        let message = match t {
            MessageType::Register => {
                if !zero(&p[22..24]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                Message::Register(RegisterRepr {
                    target: DcTarget {
                        gid: get_gid(p, 0..16),
                        dct_num: get_u32(p, 16..20),
                        dc_key: get_u64(p, 24..32),
                    },
                    lid: get_u16(p, 20..22),
                    lease_ms: get_u64(p, 32..40),
                })
            }
            MessageType::Renew | MessageType::Deregister => {
                if !zero(&p[20..24]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                let (gid, dct_num) = (get_gid(p, 0..16), get_u32(p, 16..20));
                if t == MessageType::Renew {
                    Message::Renew { gid, dct_num }
                } else {
                    Message::Deregister { gid, dct_num }
                }
            }
            MessageType::BootstrapRequest => Message::BootstrapRequest,
            MessageType::StoreJoin => {
                if !zero(&p[36..40]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                Message::StoreJoin(StoreJoinRepr {
                    store: get_name(&p[0..32], t)?,
                    id: get_u16(p, 32..34),
                    lease_ms: get_u64(p, 40..48),
                    record: get_record(&p[48..112], get_u16(p, 34..36), t)?,
                })
            }
            MessageType::StoreLeave => {
                if !zero(&p[34..40]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                Message::StoreLeave {
                    store: get_name(&p[0..32], t)?,
                    id: get_u16(p, 32..34),
                }
            }
            MessageType::StoreList => Message::StoreList {
                store: get_name(&p[0..32], t)?,
            },
            MessageType::StoreMembers => Message::StoreMembers(parse_members(p)?),
            MessageType::Ok => {
                let epoch = get_u32(p, 0..4);
                if epoch == 0 {
                    return Err(malformed("epoch 0"));
                }
                Message::Ok(Lease {
                    epoch,
                    lease_expiry_ms: get_u64(p, 8..16),
                    replaced_dct: get_u32(p, 4..8),
                })
            }
            MessageType::Err => {
                if !zero(&p[2..8]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                let code = ErrorCode::from_u16(get_u16(p, 0..2)).ok_or(malformed("code 0"))?;
                Message::Err(code)
            }
            MessageType::Bootstrap => {
                if !zero(&p[76..80]) {
                    return Err(WireError::ReservedNotZero(t));
                }
                let rpc_qpn = get_u32(p, 60..64);
                if rpc_qpn == 0 {
                    return Err(malformed("rpc qpn 0"));
                }
                Message::Bootstrap(BootstrapRepr {
                    layout_version: get_u16(p, 0..2),
                    entry_len: get_u16(p, 2..4),
                    slots_per_bucket: get_u32(p, 4..8),
                    n_buckets: get_u32(p, 8..12),
                    table: RemoteAddr {
                        rkey: get_u32(p, 12..16),
                        addr: get_u64(p, 16..24),
                    },
                    table_len: get_u64(p, 24..32),
                    incarnation: get_u64(p, 32..40),
                    server: DcTarget {
                        gid: get_gid(p, 40..56),
                        dct_num: get_u32(p, 56..60),
                        dc_key: get_u64(p, 64..72),
                    },
                    rpc_qpn,
                    rpc_qkey: get_u32(p, 72..76),
                })
            }
        };
        Ok(Repr {
            request_id: packet.request_id(),
            message,
        })
    }

    /// Parses a message from bytes (see [`Repr::parse`]).
    ///
    /// # Errors
    /// [`WireError`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<Repr, WireError> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    /// Bytes of the emitted message.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.message.payload_len()
    }

    /// Writes the message at the start of `buf`, returning its length. Bytes of
    /// `buf` past the message are untouched.
    ///
    /// Emitting a value that breaks a parse rule (an `Ok` with epoch 0, an
    /// `ErrorCode::Unknown(0)`, a `Bootstrap` with RPC QPN 0, a record over
    /// 64 bytes, a `StoreMembers` of more than 255 members) produces bytes
    /// that [`Repr::parse`] rejects (of a `StoreMembers` too long for its
    /// u16 length, only the first entries are written, under the true count).
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let t = self.message.msg_type();
        let payload_len = self.message.payload_len();
        let (h, rest) = buf.split_at_mut(HEADER_LEN);
        put(h, field::MAGIC, &MAGIC.to_le_bytes());
        h[field::VERSION] = WIRE_VERSION;
        h[field::TYPE] = t as u8;
        put(h, field::PAYLOAD_LEN, &(payload_len as u16).to_le_bytes());
        put(h, field::REQUEST_ID, &self.request_id.to_le_bytes());
        let p = &mut rest[..payload_len];
        p.fill(0);
        match &self.message {
            Message::Register(r) => {
                put(p, 0..16, r.target.gid.as_bytes());
                put(p, 16..20, &r.target.dct_num.to_le_bytes());
                put(p, 20..22, &r.lid.to_le_bytes());
                put(p, 24..32, &r.target.dc_key.to_le_bytes());
                put(p, 32..40, &r.lease_ms.to_le_bytes());
            }
            Message::Renew { gid, dct_num } | Message::Deregister { gid, dct_num } => {
                put(p, 0..16, gid.as_bytes());
                put(p, 16..20, &dct_num.to_le_bytes());
            }
            Message::BootstrapRequest => {}
            Message::StoreJoin(j) => {
                put(p, 0..32, j.store.padded());
                put(p, 32..34, &j.id.to_le_bytes());
                put(p, 40..48, &j.lease_ms.to_le_bytes());
                let (len_field, record) = p.split_at_mut(36);
                put_record(&mut len_field[34..36], &mut record[12..76], &j.record);
            }
            Message::StoreLeave { store, id } => {
                put(p, 0..32, store.padded());
                put(p, 32..34, &id.to_le_bytes());
            }
            Message::StoreList { store } => put(p, 0..32, store.padded()),
            Message::StoreMembers(ms) => {
                let count = u16::try_from(ms.len()).unwrap_or(u16::MAX);
                put(p, 0..2, &count.to_le_bytes());
                put(p, 2..4, &(STORE_ENTRY_LEN as u16).to_le_bytes());
                let entries = p[STORE_MEMBERS_HEAD_LEN..].chunks_exact_mut(STORE_ENTRY_LEN);
                for (e, m) in entries.zip(ms) {
                    put(e, 0..2, &m.id.to_le_bytes());
                    put(e, 8..24, m.gid.as_bytes());
                    put(e, 24..32, &m.lease_expiry_ms.to_le_bytes());
                    let (head, record) = e.split_at_mut(32);
                    put_record(&mut head[2..4], record, &m.record);
                }
            }
            Message::Ok(l) => {
                put(p, 0..4, &l.epoch.to_le_bytes());
                put(p, 4..8, &l.replaced_dct.to_le_bytes());
                put(p, 8..16, &l.lease_expiry_ms.to_le_bytes());
            }
            Message::Err(c) => put(p, 0..2, &c.to_u16().to_le_bytes()),
            Message::Bootstrap(b) => {
                put(p, 0..2, &b.layout_version.to_le_bytes());
                put(p, 2..4, &b.entry_len.to_le_bytes());
                put(p, 4..8, &b.slots_per_bucket.to_le_bytes());
                put(p, 8..12, &b.n_buckets.to_le_bytes());
                put(p, 12..16, &b.table.rkey.to_le_bytes());
                put(p, 16..24, &b.table.addr.to_le_bytes());
                put(p, 24..32, &b.table_len.to_le_bytes());
                put(p, 32..40, &b.incarnation.to_le_bytes());
                put(p, 40..56, b.server.gid.as_bytes());
                put(p, 56..60, &b.server.dct_num.to_le_bytes());
                put(p, 60..64, &b.rpc_qpn.to_le_bytes());
                put(p, 64..72, &b.server.dc_key.to_le_bytes());
                put(p, 72..76, &b.rpc_qkey.to_le_bytes());
            }
        }
        Ok(len)
    }

    /// The emitted message as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        match self.emit(&mut v) {
            Ok(_) => v,
            Err(e) => unreachable!("buffer_len() bytes always fit: {e}"),
        }
    }
}
