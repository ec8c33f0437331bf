//! Byte formats of the RDMA binding: the record a memory node publishes so
//! clients can reach it ([`NodeInfo`]), and the two-sided block allocation
//! messages ([`AllocRequest`], [`AllocReply`]). All little-endian, parsed with
//! length and magic checks: bytes from the fabric are untrusted.
//!
//! ```text
//! NodeInfo (48 B):  magic "RSNI" u32 | id u8 | pad 3 | gid 16 | base u64 |
//!                   len u64 | rkey u32 | rpc_qpn u32   (rpc qkey: RPC_QKEY)
//! AllocRequest (24 B): magic "RSAQ" u32 | pad u32 | req_id u64 | size u64
//! AllocReply (28 B):   magic "RSAP" u32 | status u32 | req_id u64 | offset u64
//!                      (status 0: ok, 1: out of memory, 2: bad request)
//! ```

use crate::remote::TransportError;
use krcore_nic::Gid;

/// The qkey of every allocation endpoint (servers and clients).
pub const RPC_QKEY: u32 = 0x5ace_a110;

const NODE_MAGIC: u32 = u32::from_le_bytes(*b"RSNI");
const REQ_MAGIC: u32 = u32::from_le_bytes(*b"RSAQ");
const REPLY_MAGIC: u32 = u32::from_le_bytes(*b"RSAP");

/// Bytes of an encoded [`NodeInfo`].
pub const NODE_INFO_LEN: usize = 48;
/// Bytes of an encoded [`AllocRequest`].
pub const ALLOC_REQUEST_LEN: usize = 24;
/// Bytes of an encoded [`AllocReply`].
pub const ALLOC_REPLY_LEN: usize = 28;

/// The little-endian word at `at` (0 when out of range: callers check the
/// length first).
fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The little-endian word at `at` (0 when out of range: callers check the
/// length first).
fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn bad(reason: &'static str) -> TransportError {
    TransportError::BadResponse { reason }
}

/// What a client needs to reach one memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Memory node id (the node field of every `RemotePtr` into it).
    pub id: u8,
    /// The node's GID (its VQP target).
    pub gid: Gid,
    /// Address of the region's first byte in the node's address space.
    pub base: u64,
    /// Region length in bytes.
    pub len: u64,
    /// Remote key of the region.
    pub rkey: u32,
    /// QPN of the node's allocation endpoint (UD, qkey [`RPC_QKEY`]).
    pub rpc_qpn: u32,
    /// Its qkey (always [`RPC_QKEY`] for nodes built by this crate).
    pub rpc_qkey: u32,
}

impl NodeInfo {
    /// The 48-byte record.
    pub fn encode(&self) -> [u8; NODE_INFO_LEN] {
        let mut b = [0u8; NODE_INFO_LEN];
        b[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        b[4] = self.id;
        b[8..24].copy_from_slice(self.gid.as_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[44..48].copy_from_slice(&self.rpc_qpn.to_le_bytes());
        b
    }

    /// Parses a record.
    ///
    /// # Errors
    /// [`TransportError::BadResponse`] for a wrong length or magic, or an
    /// empty region.
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
            gid: Gid(g),
            base: u64_at(b, 24),
            len: u64_at(b, 32),
            rkey: u32_at(b, 40),
            rpc_qpn: u32_at(b, 44),
            rpc_qkey: RPC_QKEY,
        };
        if info.len == 0 || info.base.checked_add(info.len).is_none() {
            return Err(bad("memory node record: empty or wrapping region"));
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
            gid: Gid([7; 16]),
            base: 0x7f00_0000_1000,
            len: 1 << 30,
            rkey: 0x1234,
            rpc_qpn: 0x55,
            rpc_qkey: RPC_QKEY,
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
    }
}
