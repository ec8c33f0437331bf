//! Byte formats of the RDMA binding: the record a memory node publishes so
//! clients can reach it ([`NodeInfo`]), and the two-sided block allocation
//! messages ([`AllocRequest`], [`AllocReply`]) sent to its [`ALLOC_PORT`].
//! All little-endian, parsed with length and magic checks: bytes from the
//! fabric are untrusted.
//!
//! ```text
//! NodeInfo (48 B):  magic "RSN2" u32 | id u8 | nodes u8 | alloc_port u16 |
//!                   gid 16 | base u64 | len u64 | rkey u32 | reserved u32 (0)
//! AllocRequest (24 B): magic "RSAQ" u32 | pad u32 | req_id u64 | size u64
//! AllocReply (28 B):   magic "RSAP" u32 | status u32 | req_id u64 | offset u64 |
//!                      reserved u32 (0) (status 0: ok, 1: out of memory,
//!                      2: bad request)
//! ```

use crate::remote::TransportError;
use krcore_nic::Gid;

/// The messaging port a memory node serves block allocation on.
pub const ALLOC_PORT: u16 = 0x5ace;

const NODE_MAGIC: u32 = u32::from_le_bytes(*b"RSN2");
const REQ_MAGIC: u32 = u32::from_le_bytes(*b"RSAQ");
const REPLY_MAGIC: u32 = u32::from_le_bytes(*b"RSAP");

/// Bytes of an encoded [`NodeInfo`].
pub const NODE_INFO_LEN: usize = 48;
/// Bytes of an encoded [`AllocRequest`].
pub const ALLOC_REQUEST_LEN: usize = 24;
/// Bytes of an encoded [`AllocReply`].
pub const ALLOC_REPLY_LEN: usize = 28;

// Callers check the length first; out of range reads 0 (the workspace's
// one little-endian helper).
use krcore_nic::le::{read_u32 as u32_at, read_u64 as u64_at};

fn bad(reason: &'static str) -> TransportError {
    TransportError::BadResponse { reason }
}

/// What a client needs to reach one memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Memory node id (the node field of every `RemotePtr` into it).
    pub id: u8,
    /// Memory nodes of the store (ids `0..nodes`), as node 0 formatted it.
    pub nodes: u8,
    /// The node's GID (its VQP target).
    pub gid: Gid,
    /// Address of the region's first byte in the node's address space.
    pub base: u64,
    /// Region length in bytes.
    pub len: u64,
    /// Remote key of the region.
    pub rkey: u32,
    /// The messaging port of its block allocator ([`ALLOC_PORT`] for nodes
    /// built by this crate).
    pub alloc_port: u16,
}

impl NodeInfo {
    /// The 48-byte record.
    pub fn encode(&self) -> [u8; NODE_INFO_LEN] {
        let mut b = [0u8; NODE_INFO_LEN];
        b[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        b[4] = self.id;
        b[5] = self.nodes;
        b[6..8].copy_from_slice(&self.alloc_port.to_le_bytes());
        b[8..24].copy_from_slice(self.gid.as_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Parses a record.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length or magic, an
    /// empty or wrapping region, a node id not below the node count, or
    /// reserved bytes that are not zero.
    pub fn decode(b: &[u8]) -> Result<NodeInfo, TransportError> {
        if b.len() != NODE_INFO_LEN || u32_at(b, 0) != NODE_MAGIC {
            return Err(bad("memory node record: wrong length or magic"));
        }
        let g: [u8; 16] = b
            .get(8..24)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("memory node record: wrong length or magic"))?;
        let info = NodeInfo {
            id: b.get(4).copied().unwrap_or(0),
            nodes: b.get(5).copied().unwrap_or(0),
            alloc_port: u16::from_le_bytes([
                b.get(6).copied().unwrap_or(0),
                b.get(7).copied().unwrap_or(0),
            ]),
            gid: Gid(g),
            base: u64_at(b, 24),
            len: u64_at(b, 32),
            rkey: u32_at(b, 40),
        };
        if info.len == 0 || info.base.checked_add(info.len).is_none() {
            return Err(bad("memory node record: empty or wrapping region"));
        }
        if info.id >= info.nodes {
            return Err(bad("memory node record: id not below the node count"));
        }
        if u32_at(b, 44) != 0 {
            return Err(bad("memory node record: reserved bytes are not zero"));
        }
        Ok(info)
    }
}

/// A request for a coarse block of `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Echoed in the reply.
    pub req_id: u64,
    /// Bytes wanted (64-byte multiple).
    pub size: u64,
}

impl AllocRequest {
    /// The 24-byte message.
    pub fn encode(&self) -> [u8; ALLOC_REQUEST_LEN] {
        let mut b = [0u8; ALLOC_REQUEST_LEN];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length or magic.
    pub fn decode(b: &[u8]) -> Result<AllocRequest, TransportError> {
        if b.len() < ALLOC_REQUEST_LEN || u32_at(b, 0) != REQ_MAGIC {
            return Err(bad("allocation request: wrong length or magic"));
        }
        Ok(AllocRequest {
            req_id: u64_at(b, 8),
            size: u64_at(b, 16),
        })
    }
}

/// The reply: the block's offset in the node's region, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocReply {
    /// The request's id.
    pub req_id: u64,
    /// Offset of the block (`None`: out of memory or bad request).
    pub offset: Option<u64>,
}

impl AllocReply {
    /// The 28-byte message.
    pub fn encode(&self) -> [u8; ALLOC_REPLY_LEN] {
        let mut b = [0u8; ALLOC_REPLY_LEN];
        b[0..4].copy_from_slice(&REPLY_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&u32::from(self.offset.is_none()).to_le_bytes());
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.unwrap_or(0).to_le_bytes());
        b
    }

    /// Parses a message.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length, magic or status.
    pub fn decode(b: &[u8]) -> Result<AllocReply, TransportError> {
        if b.len() < ALLOC_REPLY_LEN || u32_at(b, 0) != REPLY_MAGIC {
            return Err(bad("allocation reply: wrong length or magic"));
        }
        let offset = match u32_at(b, 4) {
            0 => Some(u64_at(b, 16)),
            1 | 2 => None,
            _ => return Err(bad("allocation reply: unknown status")),
        };
        Ok(AllocReply {
            req_id: u64_at(b, 8),
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_garbage() {
        let info = NodeInfo {
            id: 3,
            nodes: 4,
            gid: Gid([7; 16]),
            base: 0x7f00_0000_1000,
            len: 1 << 30,
            rkey: 0x1234,
            alloc_port: ALLOC_PORT,
        };
        assert_eq!(NodeInfo::decode(&info.encode()).unwrap(), info);
        let req = AllocRequest {
            req_id: 9,
            size: 1 << 20,
        };
        assert_eq!(AllocRequest::decode(&req.encode()).unwrap(), req);
        for offset in [Some(4096), None] {
            let r = AllocReply { req_id: 9, offset };
            assert_eq!(AllocReply::decode(&r.encode()).unwrap(), r);
        }
        let mut x = 0x1234_5678u64;
        for len in 0..80 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = NodeInfo::decode(&bytes);
            let _ = AllocRequest::decode(&bytes);
            let _ = AllocReply::decode(&bytes);
        }
        assert!(NodeInfo::decode(&[0u8; NODE_INFO_LEN]).is_err());
        let mut past = info;
        past.id = 4;
        assert!(NodeInfo::decode(&past.encode()).is_err(), "id >= nodes");
    }
}
