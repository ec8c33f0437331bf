//! The RC handshake: the byte layout of its messages, as a checked view
//! ([`HandshakePacket`]) and a parsed value ([`HandshakeRepr`]).
//!
//! On a device without DC (Soft-RoCE, non-ConnectX NICs) the engine runs in
//! RC fallback mode: a VQP's physical QP is an RC QP shared by every VQP of
//! the node that talks to the same target, made by a two-sided handshake
//! between the two nodes' control planes over UD (the engine's host drives
//! it; see `engine::handshake_ud`). In DC mode the same messages make the RC
//! pairs of the DC -> RC upgrade, carried by two-sided messaging instead of
//! UD (`engine::handshake_msg`: a reserved port; replies over messaging's reply
//! path; `reply_qkey` is then 0 and unused). This module is the pure part:
//! no I/O.
//!
//! # Protocol
//!
//! ```text
//! initiator                                           responder (target)
//!   RC QP: RESET -> INIT
//!   Request{nonce, gid, qpn, reply_qkey} --- UD --->  (gid, qpn) known with this nonce?
//!                                                       yes: answer again (a retry)
//!                                                       older nonce: reset its QP
//!                                                       none: create an RC QP
//!                                                     its QP -> RTR/RTS against (gid, qpn)
//!            <--- UD --- Accept{nonce, gid, qpn}  or  Reject{nonce, code}
//!   RC QP -> RTR/RTS against (gid, qpn)
//!   ... one-sided traffic, no responder CPU ...
//!   Close{nonce, gid, qpn} --- UD --->                destroys its QP (best effort)
//! ```
//!
//! - The initiator retries a Request with the same nonce after a timeout,
//!   a bounded number of times; a responder that already accepted that
//!   nonce answers with the same QP (retries are idempotent).
//! - Nonces grow per initiator: a Request for a known `(gid, qpn)` with a
//!   newer nonce is a re-handshake (the initiator reset its QP after an
//!   error: the responder resets and re-arms its end too); an older nonce is
//!   a stale duplicate and is ignored.
//! - Replies go to the Request's `gid` (the initiator names its port; on
//!   RoCE v2 over IPv4 a receive carries an IPv4 header where a GRH would
//!   hold the source GID), at the UD QPN its completion reports, with the
//!   Request's `reply_qkey`.
//! - The responder's end of a pair is passive: it never posts; it exists so
//!   that the initiator's one-sided WRs reach the responder's memory.
//!
//! # Layout (little-endian, [`HANDSHAKE_LEN`] bytes)
//!
//! ```text
//!  0..4   magic "KRHS"            [`MAGIC`]
//!  4      version                 [`VERSION`]
//!  5      type                    1 Request, 2 Accept, 3 Reject, 4 Close
//!  6..8   reject code             (Reject: 1 Resources, 2 UnsupportedVersion,
//!                                 3 Malformed, 4 Full; 0 otherwise)
//!  8..16  nonce                   chosen by the initiator, echoed
//! 16..32  gid                     the sender's port GID (Request, Close:
//!                                 the initiator's; Accept: the responder's)
//! 32..36  qpn                     the sender's RC QP number (0 in Reject)
//! 36..40  reply qkey              (Request; 0 otherwise)
//! ```
//!
//! Remote bytes are untrusted: [`HandshakePacket::new_checked`] validates the
//! length and magic once; the accessors cannot panic afterwards, and
//! [`HandshakeRepr::parse`] never panics on any bytes.

use std::ops::Range;

use krcore_nic::Gid;

/// The first four bytes of every handshake message (ASCII "KRHS").
pub const MAGIC: u32 = u32::from_le_bytes(*b"KRHS");
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Length of every handshake message.
pub const HANDSHAKE_LEN: usize = 40;

/// Byte ranges of the fields.
pub mod field {
    use std::ops::Range;
    /// Magic.
    pub const MAGIC: Range<usize> = 0..4;
    /// Version.
    pub const VERSION: usize = 4;
    /// Message type.
    pub const TYPE: usize = 5;
    /// Reject code.
    pub const CODE: Range<usize> = 6..8;
    /// Nonce.
    pub const NONCE: Range<usize> = 8..16;
    /// Sender's GID.
    pub const GID: Range<usize> = 16..32;
    /// Sender's RC QPN.
    pub const QPN: Range<usize> = 32..36;
    /// The qkey to answer a Request with.
    pub const REPLY_QKEY: Range<usize> = 36..40;
}

/// Why bytes are not a handshake message this build understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeWireError {
    /// Shorter than [`HANDSHAKE_LEN`].
    #[error("handshake message of {len} bytes, {HANDSHAKE_LEN} needed")]
    Truncated {
        /// Bytes given.
        len: usize,
    },
    /// Not a handshake message.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// Another protocol version.
    #[error("handshake version {0}, this build speaks {VERSION}")]
    UnsupportedVersion(u8),
    /// An unknown message type.
    #[error("unknown handshake message type {0}")]
    UnknownType(u8),
}

/// Why a responder refused a Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectCode {
    /// The responder could not create or bring up its end of the pair.
    Resources,
    /// The Request's version is not the responder's.
    UnsupportedVersion,
    /// The Request could not be parsed.
    Malformed,
    /// The responder holds `passive_cap` passive QPs and is configured to
    /// refuse new pairs rather than evict its least recently used one
    /// (`HandshakeConfig::refuse_when_full`).
    Full,
    /// A code this build does not know (0: the Reject carried none).
    Unknown(u16),
}

impl RejectCode {
    /// The code on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            RejectCode::Resources => 1,
            RejectCode::UnsupportedVersion => 2,
            RejectCode::Malformed => 3,
            RejectCode::Full => 4,
            RejectCode::Unknown(c) => c,
        }
    }

    /// From the code on the wire (0 is not a code).
    pub fn from_u16(c: u16) -> Option<RejectCode> {
        Some(match c {
            0 => return None,
            1 => RejectCode::Resources,
            2 => RejectCode::UnsupportedVersion,
            3 => RejectCode::Malformed,
            4 => RejectCode::Full,
            c => RejectCode::Unknown(c),
        })
    }
}

impl std::fmt::Display for RejectCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectCode::Resources => write!(f, "no resources for an RC QP"),
            RejectCode::UnsupportedVersion => write!(f, "unsupported handshake version"),
            RejectCode::Malformed => write!(f, "malformed request"),
            RejectCode::Full => write!(f, "the responder's passive QPs are at their cap"),
            RejectCode::Unknown(c) => write!(f, "unknown reject code {c}"),
        }
    }
}

/// A checked view over a handshake message.
#[derive(Debug, Clone, Copy)]
pub struct HandshakePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HandshakePacket<T> {
    /// A view after checking the length and the magic.
    ///
    /// # Errors
    /// [`HandshakeWireError::Truncated`], [`HandshakeWireError::BadMagic`].
    pub fn new_checked(buffer: T) -> Result<HandshakePacket<T>, HandshakeWireError> {
        crate::wire::check(
            buffer.as_ref(),
            (HANDSHAKE_LEN, field::MAGIC, MAGIC),
            |len| HandshakeWireError::Truncated { len },
            HandshakeWireError::BadMagic,
        )?;
        Ok(HandshakePacket { buffer })
    }

    fn bytes<const K: usize>(&self, r: Range<usize>) -> [u8; K] {
        crate::wire::array(self.buffer.as_ref(), r)
    }

    /// Magic.
    pub fn magic(&self) -> u32 {
        u32::from_le_bytes(self.bytes(field::MAGIC))
    }

    /// Version byte.
    pub fn version(&self) -> u8 {
        self.bytes::<1>(field::VERSION..field::VERSION + 1)[0]
    }

    /// Type byte.
    pub fn msg_type(&self) -> u8 {
        self.bytes::<1>(field::TYPE..field::TYPE + 1)[0]
    }

    /// Reject code (0 outside a Reject).
    pub fn code(&self) -> u16 {
        u16::from_le_bytes(self.bytes(field::CODE))
    }

    /// Nonce.
    pub fn nonce(&self) -> u64 {
        u64::from_le_bytes(self.bytes(field::NONCE))
    }

    /// Sender's GID.
    pub fn gid(&self) -> Gid {
        Gid(self.bytes(field::GID))
    }

    /// Sender's RC QPN.
    pub fn qpn(&self) -> u32 {
        u32::from_le_bytes(self.bytes(field::QPN))
    }

    /// Reply qkey (Requests).
    pub fn reply_qkey(&self) -> u32 {
        u32::from_le_bytes(self.bytes(field::REPLY_QKEY))
    }
}

/// A handshake message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeMessage {
    /// Initiator -> responder: pair with my RC QP `qpn` on port `gid`;
    /// answer with qkey `reply_qkey`.
    Request {
        /// The initiator's GID.
        gid: Gid,
        /// The initiator's RC QP (in INIT).
        qpn: u32,
        /// The qkey of the initiator's UD QP.
        reply_qkey: u32,
    },
    /// Responder -> initiator: my end is QP `qpn` on port `gid`, in RTS.
    Accept {
        /// The responder's GID.
        gid: Gid,
        /// The responder's RC QP.
        qpn: u32,
    },
    /// Responder -> initiator: refused.
    Reject {
        /// Why.
        code: RejectCode,
    },
    /// Initiator -> responder: I destroyed my RC QP `qpn`; destroy yours.
    Close {
        /// The initiator's GID.
        gid: Gid,
        /// The initiator's RC QP.
        qpn: u32,
    },
}

/// A parsed handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandshakeRepr {
    /// The initiator's nonce for this pairing (echoed in replies).
    pub nonce: u64,
    /// The body.
    pub message: HandshakeMessage,
}

impl HandshakeRepr {
    /// Parses a checked packet.
    ///
    /// # Errors
    /// [`HandshakeWireError::UnsupportedVersion`],
    /// [`HandshakeWireError::UnknownType`].
    pub fn parse<T: AsRef<[u8]>>(
        p: &HandshakePacket<T>,
    ) -> Result<HandshakeRepr, HandshakeWireError> {
        if p.version() != VERSION {
            return Err(HandshakeWireError::UnsupportedVersion(p.version()));
        }
        let message = match p.msg_type() {
            1 => HandshakeMessage::Request {
                gid: p.gid(),
                qpn: p.qpn(),
                reply_qkey: p.reply_qkey(),
            },
            2 => HandshakeMessage::Accept {
                gid: p.gid(),
                qpn: p.qpn(),
            },
            3 => HandshakeMessage::Reject {
                code: RejectCode::from_u16(p.code()).unwrap_or(RejectCode::Unknown(0)),
            },
            4 => HandshakeMessage::Close {
                gid: p.gid(),
                qpn: p.qpn(),
            },
            t => return Err(HandshakeWireError::UnknownType(t)),
        };
        Ok(HandshakeRepr {
            nonce: p.nonce(),
            message,
        })
    }

    /// Checks and parses raw bytes.
    ///
    /// # Errors
    /// Any [`HandshakeWireError`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<HandshakeRepr, HandshakeWireError> {
        HandshakeRepr::parse(&HandshakePacket::new_checked(bytes)?)
    }

    /// The message's bytes.
    pub fn emit(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[field::MAGIC].copy_from_slice(&MAGIC.to_le_bytes());
        b[field::VERSION] = VERSION;
        b[field::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        let (ty, gid, qpn, code, qkey) = match self.message {
            HandshakeMessage::Request {
                gid,
                qpn,
                reply_qkey,
            } => (1, gid, qpn, 0, reply_qkey),
            HandshakeMessage::Accept { gid, qpn } => (2, gid, qpn, 0, 0),
            HandshakeMessage::Reject { code } => (3, Gid::default(), 0, code.to_u16(), 0),
            HandshakeMessage::Close { gid, qpn } => (4, gid, qpn, 0, 0),
        };
        b[field::TYPE] = ty;
        b[field::CODE].copy_from_slice(&code.to_le_bytes());
        b[field::GID].copy_from_slice(gid.as_bytes());
        b[field::QPN].copy_from_slice(&qpn.to_le_bytes());
        b[field::REPLY_QKEY].copy_from_slice(&qkey.to_le_bytes());
        b
    }

    /// Whether `bytes` start like a handshake message (its magic), to route
    /// datagrams of several protocols arriving on one UD QP.
    pub fn is_handshake(bytes: &[u8]) -> bool {
        bytes.get(field::MAGIC) == Some(&MAGIC.to_le_bytes()[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> [HandshakeRepr; 5] {
        let gid = Gid([7; 16]);
        [
            HandshakeRepr {
                nonce: 1,
                message: HandshakeMessage::Request {
                    gid,
                    qpn: 0x1234,
                    reply_qkey: 0xdead_beef,
                },
            },
            HandshakeRepr {
                nonce: u64::MAX,
                message: HandshakeMessage::Accept { gid, qpn: 9 },
            },
            HandshakeRepr {
                nonce: 3,
                message: HandshakeMessage::Reject {
                    code: RejectCode::Resources,
                },
            },
            HandshakeRepr {
                nonce: 4,
                message: HandshakeMessage::Reject {
                    code: RejectCode::Unknown(77),
                },
            },
            HandshakeRepr {
                nonce: 5,
                message: HandshakeMessage::Close { gid, qpn: 10 },
            },
        ]
    }

    #[test]
    fn emit_parse_round_trip() {
        for r in all() {
            let bytes = r.emit();
            assert!(HandshakeRepr::is_handshake(&bytes));
            assert_eq!(HandshakeRepr::parse_bytes(&bytes), Ok(r));
            // Trailing bytes (a UD slot longer than the message) are ignored.
            let mut long = bytes.to_vec();
            long.extend_from_slice(&[0xff; 24]);
            assert_eq!(HandshakeRepr::parse_bytes(&long), Ok(r));
        }
    }

    #[test]
    fn the_layout_is_fixed() {
        let b = all()[0].emit();
        assert_eq!(&b[0..4], b"KRHS");
        assert_eq!(b[4], VERSION);
        assert_eq!(b[5], 1);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 1);
        assert_eq!(&b[16..32], &[7; 16]);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 0x1234);
        assert_eq!(
            u32::from_le_bytes(b[36..40].try_into().unwrap()),
            0xdead_beef
        );
    }

    #[test]
    fn bad_input_is_typed_never_a_panic() {
        let good = all()[1].emit();
        for len in 0..HANDSHAKE_LEN {
            assert_eq!(
                HandshakeRepr::parse_bytes(&good[..len]),
                Err(HandshakeWireError::Truncated { len })
            );
        }
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            HandshakeRepr::parse_bytes(&b),
            Err(HandshakeWireError::BadMagic(_))
        ));
        assert!(!HandshakeRepr::is_handshake(&b));
        let mut b = good;
        b[4] = 9;
        assert_eq!(
            HandshakeRepr::parse_bytes(&b),
            Err(HandshakeWireError::UnsupportedVersion(9))
        );
        let mut b = good;
        b[5] = 0;
        assert_eq!(
            HandshakeRepr::parse_bytes(&b),
            Err(HandshakeWireError::UnknownType(0))
        );
        // Every byte value in every position: parse returns, never panics.
        for i in 0..HANDSHAKE_LEN {
            for v in [0u8, 1, 2, 3, 4, 5, 0x7f, 0xff] {
                let mut b = good;
                b[i] = v;
                let _ = HandshakeRepr::parse_bytes(&b);
            }
        }
    }

    #[test]
    fn reject_codes_round_trip() {
        for c in [
            RejectCode::Resources,
            RejectCode::UnsupportedVersion,
            RejectCode::Malformed,
            RejectCode::Full,
            RejectCode::Unknown(999),
        ] {
            assert_eq!(RejectCode::from_u16(c.to_u16()), Some(c));
        }
        assert_eq!(RejectCode::from_u16(0), None);
    }
}
